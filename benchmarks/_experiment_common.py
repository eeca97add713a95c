"""What the two issue-6 experiments share: a finished demo run, PPO from its warm start, parallel jobs, I/O.

`benchmarks/kl_sweep.py` and `benchmarks/unstable_search.py` both take a finished `searchrl demo` run
directory and rerun its PPO stage (7 in `searchrl.demo.pipeline`) several times with one thing changed:
the KL coefficient, or the search backend. Everything else comes from the run itself, so the runs differ
only in what the experiment varies:

- `load_demo_run(RUN)`: the run's `DemoConfig` (`demo_config.yaml`), its train / dev / test rows cut to
  the demo's sizes, its BM25 index and its SFT warm start (`sft/policy`, tokenizer included), each
  checked with a message that says how to produce what is missing;
- `ppo_args(...)`: the demo's `PPOConfig` with the run-level changes an experiment makes (seed,
  episodes, `--set` overrides, no progress bar, checkpoints only at the end, the collapse guard off
  unless asked: the guard rolls back exactly the drift these experiments want to see);
- `train_from_warm_start(...)`: one `PPOTrainer` built as the demo builds it (same rubric, same
  environment config, critic from the SFT backbone);
- `run_jobs(...)`: one job per PPO run, in this process or in `--jobs N` worker processes (the same
  script run with `--worker SPEC.json`, each with `threads // N` torch threads). A job that finished
  with the same spec is reused, so a killed sweep continues where it stopped;
- `read_metrics`, `read_evals` (through the run reader, `searchrl.run.reader.RunReader`), `clean_json`,
  `save_figure`: the trainer's own logs in, one finite JSON and one PNG out.

Nothing here changes the library; the experiments only compose its public pieces.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.config import load_config
from searchrl.common.io import atomic_write_json, read_jsonl
from searchrl.demo.configs import DemoConfig
from searchrl.ppo.config import PPOConfig
from searchrl.run.reader import RunReader
from searchrl.run.writer import METRICS_FILE

# A job's completion marker: written last, so a directory without it holds an unfinished run.
RESULT_FILE = "result.json"
SPEC_FILE = "spec.json"


@dataclass
class DemoRun:
    """A finished demo run directory, opened: its config, its rows and where its warm start lives."""

    run_dir: Path
    config: DemoConfig
    train_rows: list[dict]
    dev_rows: list[dict]
    test_rows: list[dict]

    @property
    def policy_dir(self) -> Path:
        return self.run_dir / "sft" / "policy"

    @property
    def index_dir(self) -> Path:
        return self.run_dir / "index"

    @property
    def expert_path(self) -> Path:
        return self.run_dir / "sft" / "expert.jsonl.gz"


def demo_overrides(overrides: dict[str, Any]) -> dict[str, Any]:
    """PPOConfig field overrides as the demo config's dotted keys: each under the part that declares it.

    `{"kl_coef": 0.1, "max_turns": 3}` -> `{"ppo.kl_coef": 0.1, "environment.max_turns": 3}`.
    """
    demo = DemoConfig()
    parts = {
        name: {f.name for f in dataclasses.fields(getattr(demo, name))}
        for name in ("ppo", "environment", "generation")
    }
    out = {}
    for key, value in overrides.items():
        home = next((name for name, fields in parts.items() if key in fields), None)
        if home is None:
            raise ValueError(f"{key}: not a field of the demo's PPO stage (ppo, environment or generation)")
        out[f"{home}.{key}"] = value
    return out


def load_demo_run(run_dir: str | os.PathLike, overrides: dict[str, Any] | None = None) -> DemoRun:
    """Open a finished `searchrl demo` run; `overrides` are PPOConfig fields (`{"eval_steps": 2}`).

    The rows are cut exactly as the demo cut them (`train_questions`, `test_questions`), so PPO here
    trains on the demo's training questions and measures on the demo's hidden test questions.
    """
    run = Path(run_dir)
    how = f"run `searchrl demo --out {run}` (or `--smoke` for a toy run) first"
    if not run.is_dir():
        raise FileNotFoundError(f"--run {run}: no such directory; {how}")
    needed = ("demo_config.yaml", "data/train.jsonl", "data/dev.jsonl", "data/test.jsonl", "index/meta.json",
              "sft/policy/config.json")  # fmt: skip
    missing = [rel for rel in needed if not (run / rel).exists()]
    if missing:
        raise FileNotFoundError(
            f"--run {run} is not a finished demo run: missing {missing}; {how} and point --run at its "
            "output directory"
        )
    config = load_config(DemoConfig, run / "demo_config.yaml", demo_overrides(overrides or {}))
    data = run / "data"
    train = list(read_jsonl(data / "train.jsonl"))[: config.train_questions]
    test = list(read_jsonl(data / "test.jsonl"))[: config.test_questions]
    dev = list(read_jsonl(data / "dev.jsonl"))
    if not train or not test:
        raise ValueError(f"--run {run}: the train or test split is empty; rerun the demo")
    return DemoRun(run, config, train, dev, test)


def parse_set(pairs: Sequence[str]) -> dict[str, Any]:
    """`--set FIELD=VALUE` pairs (PPOConfig fields, values parsed as YAML), checked against PPOConfig."""
    from searchrl.ppo.commands import parse_set_options

    overrides = parse_set_options(list(pairs))
    if not overrides:
        return overrides
    checked = load_config(PPOConfig, None, overrides)  # an unknown field or a bad value fails here, named
    # The values as the config reads them: YAML takes `1e-3` for a string, PPOConfig's float field does not.
    return {key: getattr(checked, key) for key in overrides}


def ppo_args(
    run: DemoRun,
    output_dir: str | os.PathLike,
    seed: int,
    episodes: int | None,
    keep_guard: bool = False,
    save_trajectories: bool = False,
    **changes: Any,
) -> PPOConfig:
    """The demo's PPO stage settings for one experiment run (what the demo's `train_ppo` passes, plus `changes`).

    Checkpoints are written only at the end (`save_steps` past the last step): nothing reads the
    intermediate ones, and each costs a policy, a critic and two optimizer states on disk. The demo's
    `eval_on_start` is off unless `changes` turns it on: each experiment chooses its own evaluation
    points (the KL sweep measures step 0 itself, on the test rows).
    """
    base = run.config.ppo_config()
    total = int(episodes) if episodes is not None else base.total_episodes
    if total is not None and total < 1:
        raise ValueError(f"--episodes {episodes}: must be >= 1")
    args = dataclasses.replace(
        base,
        output_dir=str(output_dir),
        seed=int(seed),
        progress_bar=False,
        total_episodes=total,
        save_steps=10**9,
        save_trajectories=save_trajectories,
        collapse_guard=base.collapse_guard and keep_guard,
        **{"eval_on_start": False, **changes},
    )
    return args


def set_threads(threads: int) -> None:
    import torch

    torch.set_num_threads(max(1, int(threads)))


def train_from_warm_start(
    run: DemoRun,
    args: PPOConfig,
    backend: Any,
    eval_rows: list[dict] | None = None,
    env_changes: dict[str, Any] | None = None,
    callbacks: list[Any] | None = None,
    before_train: Callable[[Any], None] | None = None,
) -> Any:
    """Build the demo's `PPOTrainer` from the SFT warm start over `backend` and train it; returns the trainer.

    `env_changes` replaces `EnvConfig` fields of the demo's environment (`args.env_config()`), and
    `before_train(trainer)` runs once the trainer exists (the KL sweep measures step 0 there).
    """
    import torch

    from searchrl.env.environment import SearchEnvironment
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.ppo.trainer import PPOTrainer
    from searchrl.rewards.combine import default_rubric

    torch.manual_seed(args.seed)
    tok = load_tokenizer(run.policy_dir)
    policy = load_policy(run.policy_dir)
    env_config = dataclasses.replace(args.env_config(), **(env_changes or {}))

    def env_factory() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tok)

    trainer = PPOTrainer(
        args,
        tok,
        policy,
        None,
        None,
        run.train_rows,
        reward_funcs=default_rubric(),
        environment=env_factory,
        eval_dataset=eval_rows or None,
        callbacks=callbacks,
    )
    if before_train is not None:
        before_train(trainer)
    trainer.train()
    return trainer


def load_backend(run: DemoRun) -> Any:
    """The run's BM25 index, warmed up (the numba scorer compiles on first use, before any deadline)."""
    from searchrl.search.index import load_index

    backend = load_index(run.index_dir)
    backend.search(["warm up"], 1)
    return backend


# ---------------------------------------------------------------------------------------------------
# logs in
# ---------------------------------------------------------------------------------------------------
def read_metrics(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """`metrics.jsonl` of a PPO run, one row per step (`RunReader.metrics`: the steps a collapse-guard
    rollback undid count once, as redone)."""
    path = Path(run_dir) / METRICS_FILE
    if not path.exists():
        raise FileNotFoundError(f"{path}: the PPO run wrote no metrics (did it fail? see its log.txt)")
    return RunReader(run_dir).metrics()


def read_evals(run_dir: str | os.PathLike) -> list[dict[str, Any]]:
    """The trainer's own evaluation files (`eval/step-N.json`), by step."""
    return [data for _, data in sorted(RunReader(run_dir).step_evaluations().items())]


def curve(rows: list[dict[str, Any]], key: str) -> list[float | None]:
    """One metric over the rows (None where a row lacks it)."""
    return [float(r[key]) if isinstance(r.get(key), int | float) else None for r in rows]


def clean_json(value: Any) -> Any:
    """A JSON-safe copy: NaN and infinities become None (so `json` never writes NaN), tuples become lists."""
    if isinstance(value, dict):
        return {str(k): clean_json(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean_json(v) for v in value]
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if hasattr(value, "item") and callable(value.item):  # numpy / torch scalars
        return clean_json(value.item())
    return value


def write_json(path: str | os.PathLike, payload: dict[str, Any]) -> None:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_json(path, clean_json(payload))


def save_figure(fig: Any, path: str | os.PathLike, suptitle: str | None = None) -> None:
    """Write the figure to `path` atomically and close it; `suptitle` goes above the panels, laid out to fit."""
    try:
        if suptitle is not None:
            fig.tight_layout(rect=(0, 0, 1, 0.95))
            fig.suptitle(suptitle, fontsize=11)
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(path.name + ".tmp.png")
        fig.savefig(tmp, dpi=110, bbox_inches="tight")
        os.replace(tmp, path)
    finally:
        pyplot().close(fig)


def pyplot() -> Any:
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt

    return plt


# ---------------------------------------------------------------------------------------------------
# jobs: one PPO run each, in process or in worker processes
# ---------------------------------------------------------------------------------------------------
def finished_result(out_dir: Path, spec: dict[str, Any]) -> dict[str, Any] | None:
    """The result of a job already finished with exactly this spec, else None."""
    result, saved = out_dir / RESULT_FILE, out_dir / SPEC_FILE
    if not result.exists() or not saved.exists():
        return None
    if json.loads(saved.read_text(encoding="utf-8")) != spec:
        return None
    return json.loads(result.read_text(encoding="utf-8"))


def run_job_here(worker: Callable[[dict[str, Any]], dict[str, Any]], spec: dict[str, Any]) -> dict[str, Any]:
    """Run one job in this process, from an empty directory; its result is written last."""
    out = Path(spec["out_dir"])
    if out.exists():
        shutil.rmtree(out)  # an unfinished run: PPOTrainer would append to its metrics, start clean
    out.mkdir(parents=True)
    write_json(out / SPEC_FILE, spec)
    set_threads(spec["threads"])
    t0 = time.perf_counter()
    result = worker(spec)
    result["wall_seconds"] = round(time.perf_counter() - t0, 2)
    write_json(out / RESULT_FILE, result)
    return result


def run_jobs(
    specs: list[dict[str, Any]],
    worker: Callable[[dict[str, Any]], dict[str, Any]],
    script: str | os.PathLike,
    jobs: int,
    reuse: bool = True,
    log: Callable[[str], None] = print,
) -> list[dict[str, Any]]:
    """Run every job (one PPO run per spec), `jobs` at a time; results in the order of `specs`.

    `jobs == 1` runs them one after another in this process. `jobs > 1` starts `python SCRIPT --worker
    SPEC.json` per job (a fresh interpreter each, so no torch state is shared or forked) and waits for
    them; a worker's output goes to `OUT_DIR/log.txt` and a failure names that file.
    """
    if jobs < 1:
        raise ValueError(f"--jobs {jobs}: must be >= 1")
    results: list[dict[str, Any] | None] = [None] * len(specs)
    todo = []
    for i, spec in enumerate(specs):
        done = finished_result(Path(spec["out_dir"]), clean_json(spec)) if reuse else None
        if done is not None:
            log(f"reusing {spec['out_dir']} (finished with the same settings)")
            results[i] = done
        else:
            todo.append(i)
    if jobs == 1:
        for i in todo:
            log(f"running {specs[i]['name']} -> {specs[i]['out_dir']}")
            results[i] = run_job_here(worker, clean_json(specs[i]))
    else:

        def launch(i: int) -> dict[str, Any]:
            spec = clean_json(specs[i])
            out = Path(spec["out_dir"])
            out.mkdir(parents=True, exist_ok=True)
            spec_path = out.parent / f"{out.name}.spec.json"
            write_json(spec_path, spec)
            log_path = out.parent / f"{out.name}.log.txt"
            log(f"running {spec['name']} in a worker -> {out} (log {log_path})")
            with open(log_path, "w", encoding="utf-8") as fh:
                proc = subprocess.run(
                    [sys.executable, str(script), "--worker", str(spec_path)],
                    stdout=fh,
                    stderr=subprocess.STDOUT,
                    check=False,
                )
            if proc.returncode != 0:
                tail = log_path.read_text(encoding="utf-8", errors="replace")[-2000:]
                raise RuntimeError(f"job {spec['name']} failed (exit {proc.returncode}); {log_path}:\n{tail}")
            return json.loads((out / RESULT_FILE).read_text(encoding="utf-8"))

        with ThreadPoolExecutor(max_workers=jobs) as pool:
            for i, result in zip(todo, pool.map(launch, todo), strict=True):
                results[i] = result
    return [r for r in results if r is not None]


def worker_main(argv: Sequence[str], worker: Callable[[dict[str, Any]], dict[str, Any]]) -> bool:
    """If `argv` is `--worker SPEC.json`, run that job here and return True (the script then exits)."""
    if len(argv) == 2 and argv[0] == "--worker":
        spec = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
        run_job_here(worker, spec)
        return True
    return False


def threads_per_job(total: int, jobs: int) -> int:
    return max(1, int(total) // max(1, int(jobs)))


def warm_start_id(run: DemoRun) -> str:
    """A hash of the warm start's weights and the demo config: a rerun demo invalidates reused jobs."""
    import hashlib

    digest = hashlib.sha256((run.run_dir / "demo_config.yaml").read_bytes())
    for path in sorted(run.policy_dir.iterdir()):
        if path.is_file():
            digest.update(path.name.encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()[:16]


def add_run_arguments(
    p: argparse.ArgumentParser,
    *,
    experiment: str,
    unit: str,
    plot_help: str,
    guard_help: str,
    fresh_help: str,
) -> None:
    """The options both experiment scripts share, with `unit` ("setting", "run") in their help."""
    p.add_argument("--run", required=True, help="A finished demo run directory (searchrl demo --out RUN).")
    p.add_argument("--json", required=True, help="Where to write the results JSON.")
    p.add_argument("--plot", required=True, help=plot_help)
    p.add_argument(
        "--jobs",
        type=int,
        default=1,
        help=f"{unit.capitalize()}s run at once, each in its own worker process.",
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads in total (default: the demo's num_threads)."
    )
    p.add_argument(
        "--work-dir", default=None, help=f"Where the {unit}s go (default RUN/experiments/{experiment})."
    )
    p.add_argument(
        "--set",
        dest="set_",
        action="append",
        default=[],
        metavar="FIELD=VALUE",
        help=f"Override a PPOConfig field for every {unit} (repeatable).",
    )
    p.add_argument("--keep-guard", action="store_true", help=guard_help)
    p.add_argument(
        "--save-trajectories",
        action="store_true",
        help="Write every step's trajectories (for the audit/viewer).",
    )
    p.add_argument("--fresh", action="store_true", help=fresh_help)  # fmt: skip
