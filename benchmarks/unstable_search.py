"""Unstable search: PPO under a noisy backend, with the snapshot cache off and in replay mode (issue 6).

From a finished `searchrl demo` run directory this reruns the demo's PPO stage per (mode, seed) over
a noisy search backend, `searchrl.search.faults.FaultInjectingBackend` around the run's BM25 index:

- per query, with probability `--fault-rate` (default 0.3) the results are perturbed: dropped (a
  random subset kept in rank order, from none to all but one hit) and/or shuffled. The two are drawn
  independently at `p = 1 - sqrt(1 - fault_rate)` each, so a query is perturbed with probability
  exactly `fault_rate`;
- per batched call (one call carries every row's query of that turn), `--error-rate` (default 0.05)
  raises `SearchUnavailable` (the environment retries it once) and `--timeout-rate` (default 0.05)
  raises `SearchTimeout` at once (not retried). Each becomes a failed-tool observation.

The modes are `searchrl.search.cache.CachedBackend`'s:

- `off`: every search goes to the noisy backend; its fault RNG is seeded from the run's seed, so each
  seed sees a different (reproducible) draw of the noise, as separate real runs would;
- `replay`: every search is answered from a snapshot recorded before training and the backend is
  never called. The snapshot is recorded through the same noisy backend (its own fault seed), so
  it freezes ONE draw of the drops and shuffles; errors and timeouts met while recording are retried
  until the query is stored. It holds (1) every query of the expert demonstrations
  (`RUN/sft/expert.jsonl.gz`) and (2) every query of `--record-passes` sampled rollouts of the warm
  start (at the training temperature, seeds disjoint from the training seeds) over the first
  `--record-questions` training questions. A query the snapshot lacks gets no documents (an empty
  result, counted as a cache miss): `CachedBackend` in replay mode raises `CacheMiss` for the whole
  batch when one query misses, which would fail every row's search of that turn, so this script
  looks queries up one by one (`PerQueryReplay`).

In both modes the circuit breaker's pause is 0 s (`breaker_reset_s=0`): a pause measured in
wall-clock seconds would make the fault sequence depend on the machine's speed instead of the seed.

Reported: per-seed training reward curves (`objective/scores`), the reward variance across seeds per
step and of the final reward (the mean over the last `--final-window` steps), the final test exact
match per seed and mode (greedy, on the demo's test questions, over the CLEAN index in both modes, as
the demo measures it: the test split is only measured), tool failure rates per step (all failed
statuses, and search-backend failures alone), the injected fault counts, and the cache hits / misses
and backend calls of replay runs. One JSON, one PNG.

    .venv/bin/python benchmarks/unstable_search.py --run runs/demo --json runs/unstable.json \\
        --plot runs/unstable.png [--seeds 0 1 2] [--episodes N] [--fault-rate 0.3] [--jobs 6]

Runs go under `--work-dir` (default `RUN/experiments/unstable_search/`); finished runs with the same
settings are reused (`--fresh` reruns), the snapshot too. `--jobs N` runs N (mode, seed) runs at once.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import sqlite3
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from _experiment_common import (  # noqa: E402
    DemoRun,
    add_run_arguments,
    curve,
    load_backend,
    load_demo_run,
    parse_set,
    ppo_args,
    pyplot,
    read_metrics,
    run_jobs,
    save_figure,
    set_threads,
    threads_per_job,
    train_from_warm_start,
    warm_start_id,
    worker_main,
    write_json,
)

from searchrl.search.base import Hit, SearchError  # noqa: E402
from searchrl.search.cache import CachedBackend, CacheMiss  # noqa: E402
from searchrl.search.faults import FaultInjectingBackend  # noqa: E402

MODES = ("off", "replay")
# Statuses of a failed search call that the backend caused (the rest are the policy's: malformed,
# over budget, invalid arguments, ...).
BACKEND_STATUSES = ("timeout", "unavailable", "error", "circuit_open")
# The fault RNG of a training run: seeded from the run's seed so seeds see different noise. The
# recording uses a seed outside that range, and its sampling seeds are disjoint from PPO's.
FAULT_SEED_BASE = 1000
RECORD_FAULT_SEED = 999_983
RECORD_SAMPLING_SEED = 7_777_777
ENV_CHANGES = {"breaker_reset_s": 0.0}


def perturb_rate(fault_rate: float) -> float:
    """The per-kind rate p with P(dropped or shuffled) = 1 - (1 - p)^2 = fault_rate."""
    return 1.0 - math.sqrt(1.0 - fault_rate)


def noisy_backend(base: Any, seed: int, faults: dict[str, float]) -> FaultInjectingBackend:
    p = perturb_rate(faults["fault_rate"])
    return FaultInjectingBackend(
        base,
        seed=seed,
        drop_rate=p,
        shuffle_rate=p,
        error_rate=faults["error_rate"],
        timeout_rate=faults["timeout_rate"],
        timeout_s=0.0,  # an injected timeout fails at once: no wall-clock wait, same outcome
    )


class PerQueryReplay:
    """Replay mode, one query at a time: a recorded query gets its snapshot, a miss gets no documents.

    `CachedBackend(mode="replay")` raises `CacheMiss` for a whole batch when any query misses; the
    environment sends every row's query of a turn in one batch, so one new query would fail them all.
    Here each distinct query is looked up alone (SQLite lookups, no backend) and the misses are
    counted in `missed`.
    """

    def __init__(self, cached: CachedBackend) -> None:
        if cached.mode != "replay":
            raise ValueError(f"PerQueryReplay needs a CachedBackend in replay mode, got mode={cached.mode!r}")
        self.cached = cached
        self.missed = 0
        self.served = 0

    @property
    def fingerprint(self) -> str:
        return self.cached.fingerprint

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        found: dict[str, list[Hit]] = {}
        for query in dict.fromkeys(queries):
            try:
                found[query] = self.cached.search([query], k)[0]
                self.served += 1
            except CacheMiss:
                found[query] = []
                self.missed += 1
        return [list(found[q]) for q in queries]


def search_queries(trajectories: Sequence[Any], default_k: int) -> list[tuple[str, int]]:
    """Every (query, k) the trajectories sent to the search tool, in order, without repeats."""
    out: dict[tuple[str, int], None] = {}
    for traj in trajectories:
        for call in traj.tool_calls:
            query = call.arguments.get("query") if call.name == "search" else None
            if isinstance(query, str) and query.strip():
                k = call.arguments.get("k", default_k)
                out[(query, int(k) if isinstance(k, int) else default_k)] = None
    return list(out)


def snapshot_entries(path: Path) -> int:
    with sqlite3.connect(f"file:{path}?mode=ro", uri=True) as conn:
        return int(conn.execute("SELECT COUNT(*) FROM results").fetchone()[0])


# ---------------------------------------------------------------------------------------------------
# the snapshot: recorded once, before any training run
# ---------------------------------------------------------------------------------------------------
def record_snapshot(run: DemoRun, spec: dict[str, Any]) -> dict[str, Any]:
    """Record the replay snapshot (see the module docstring); returns what went into it."""
    from searchrl.common.trajectory import read_trajectories
    from searchrl.env.environment import SearchEnvironment
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.rollout.generator import GenerationConfig, HFGenerator

    t0 = time.perf_counter()
    path = Path(spec["path"])
    for stale in (path, path.with_name(path.name + "-wal"), path.with_name(path.name + "-shm")):
        stale.unlink(missing_ok=True)
    args = ppo_args(run, "unused", spec["seed"], None)
    env_config = dataclasses.replace(args.env_config(), **ENV_CHANGES)
    base = load_backend(run)
    noisy = noisy_backend(base, RECORD_FAULT_SEED, spec["faults"])
    cache = CachedBackend(noisy, path, mode="read_write")
    tok = load_tokenizer(run.policy_dir)
    policy = load_policy(run.policy_dir)
    gen = HFGenerator(
        policy,
        tok,
        GenerationConfig(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens_per_turn=args.max_new_tokens_per_turn,
            max_episode_tokens=args.max_episode_tokens,
        ),
    )
    rows = run.train_rows[: spec["record_questions"]]
    batch = int(args.per_device_train_batch_size * args.gradient_accumulation_steps)
    rollout_queries: list[tuple[str, int]] = []
    for p in range(spec["record_passes"]):
        for start in range(0, len(rows), batch):
            chunk = rows[start : start + batch]
            sampling = gen.config.sampling(seed=RECORD_SAMPLING_SEED + 100_003 * p + start)
            envs = [SearchEnvironment(cache, env_config, tokenizer=tok) for _ in chunk]
            trajs = gen.rollout(envs, chunk, sampling).trajectories
            rollout_queries += search_queries(trajs, env_config.topk)
    expert_queries = (
        search_queries(read_trajectories(run.expert_path), env_config.topk)
        if run.expert_path.exists()
        else []
    )
    # Store every query seen, retrying the batches an injected error or timeout failed while recording
    # (a query already stored is answered from the snapshot, with no backend call).
    wanted = list(dict.fromkeys(rollout_queries + expert_queries))
    retries = 0
    by_k: dict[int, list[str]] = {}
    for query, k in wanted:
        by_k.setdefault(k, []).append(query)
    for k, queries in by_k.items():
        for start in range(0, len(queries), 32):
            chunk = queries[start : start + 32]
            for _attempt in range(100):
                try:
                    cache.search(chunk, k)
                    break
                except SearchError:
                    retries += 1
            else:
                raise RuntimeError(
                    f"recording: 100 attempts failed for {len(chunk)} queries; lower the error rates"
                )
    cache.close()
    return {
        "path": str(path),
        "populated_by": (
            f"the {len(expert_queries)} distinct queries of the expert demonstrations "
            f"plus {spec['record_passes']} sampled rollout pass(es) of the warm start (temperature "
            f"{args.temperature:g}) over the first {len(rows)} training questions, recorded through the noisy "
            f"backend (fault seed {RECORD_FAULT_SEED}); failed batches retried until stored"
        ),
        "entries": snapshot_entries(path),
        "expert_queries": len(expert_queries),
        "rollout_queries": len(rollout_queries),
        "record_questions": len(rows),
        "record_passes": spec["record_passes"],
        "failed_batches_retried": retries,
        "faults_while_recording": dict(noisy.counters),
        "wall_seconds": round(time.perf_counter() - t0, 2),
    }


# ---------------------------------------------------------------------------------------------------
# one (mode, seed) = one PPO run
# ---------------------------------------------------------------------------------------------------
def step_counters(read: Any) -> Any:
    """A transformers callback that records, after each logged step, how the backend counters moved."""
    from transformers import TrainerCallback

    class StepCounters(TrainerCallback):
        def __init__(self) -> None:
            self.previous = read()
            self.rows: list[dict[str, float]] = []

        def on_log(self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any) -> None:
            now = read()
            self.rows.append({"step": int(state.global_step), **{k: now[k] - self.previous[k] for k in now}})
            self.previous = now

    return StepCounters()


def run_one(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one (mode, seed) from the warm start over the noisy backend, then measure it on the test split."""
    from searchrl.env.environment import SearchEnvironment
    from searchrl.evaluation import HEADLINE_METRICS
    from searchrl.evaluation.loop import evaluate_with_ppo_limits
    from searchrl.rewards.combine import default_rubric

    run = load_demo_run(spec["run"], spec["overrides"])
    args = ppo_args(
        run,
        Path(spec["out_dir"]),
        spec["seed"],
        spec["episodes"],
        keep_guard=spec["keep_guard"],
        save_trajectories=spec["save_trajectories"],
    )
    base = load_backend(run)
    noisy = noisy_backend(base, FAULT_SEED_BASE + spec["seed"], spec["faults"])
    replay: PerQueryReplay | None = None
    if spec["mode"] == "off":
        backend: Any = CachedBackend(noisy, spec["snapshot"], mode="off")
    else:
        replay = PerQueryReplay(CachedBackend(noisy, spec["snapshot"], mode="replay"))
        backend = replay

    def counters() -> dict[str, float]:
        out = {f"backend/{k}": float(v) for k, v in noisy.counters.items()}
        if replay is not None:
            out["cache/hits"], out["cache/misses"] = float(replay.served), float(replay.missed)
        return out

    per_step = step_counters(counters)
    trainer = train_from_warm_start(run, args, backend, None, env_changes=ENV_CHANGES, callbacks=[per_step])
    during_training = counters()

    # The final measurement: greedy, the demo's test questions, the clean index (as the demo measures).
    env_config = run.config.environment.env_config()
    tok = trainer.tokenizer
    result = evaluate_with_ppo_limits(
        trainer.policy,
        tok,
        run.test_rows[: spec["test_questions"]],
        lambda: SearchEnvironment(base, env_config, tokenizer=tok),
        args,
        rubric=default_rubric(),
        seed=run.config.seed,
    )
    return {
        "steps": trainer.global_step,
        "episodes": trainer.episode,
        "final_test": {k: result.summary[k] for k in HEADLINE_METRICS if k in result.summary},
        "final_test_ci95": {
            k: result.summary["ci95"][k] for k in HEADLINE_METRICS if k in result.summary["ci95"]
        },
        "counters": during_training,
        "per_step_counters": per_step.rows,
    }


# ---------------------------------------------------------------------------------------------------
# summary and plot
# ---------------------------------------------------------------------------------------------------
def _variance(values: Sequence[float]) -> float:
    """Sample variance across seeds (ddof=1); 0 with a single seed."""
    return float(np.var(values, ddof=1)) if len(values) > 1 else 0.0


def _run_summary(spec: dict[str, Any], result: dict[str, Any], final_window: int) -> dict[str, Any]:
    rows = read_metrics(spec["out_dir"])
    calls = [float(r.get("tools/calls", 0.0)) for r in rows]
    backend_failures = [sum(float(r.get(f"tools/failures/{s}", 0.0)) for s in BACKEND_STATUSES) for r in rows]
    scores = curve(rows, "objective/scores")
    window = [s for s in scores[-final_window:] if s is not None]
    counters = result["counters"]
    out: dict[str, Any] = {
        "reward_curve": {"step": [int(r["step"]) for r in rows], "score": scores},
        "tool_failure_rate": curve(rows, "tools/failure_rate"),
        "search_failure_rate": [f / c if c else 0.0 for f, c in zip(backend_failures, calls, strict=True)],
        "tool_calls_per_episode": curve(rows, "tools/calls_per_episode"),
        "final_reward": float(np.mean(window)) if window else None,
        "final_test": result["final_test"],
        "final_test_ci95": result["final_test_ci95"],
        "tool_calls": sum(calls),
        "tool_failures": sum(float(r.get("tools/failures", 0.0)) for r in rows),
        "backend_failures": sum(backend_failures),
        "injected": {k.split("/", 1)[1]: v for k, v in counters.items() if k.startswith("backend/")},
        "backend_calls_during_training": counters["backend/calls"],
        "per_step_counters": result["per_step_counters"],
        "steps": result["steps"],
        "wall_seconds": result.get("wall_seconds"),
        "run_dir": spec["out_dir"],
    }
    if "cache/hits" in counters:
        looked_up = counters["cache/hits"] + counters["cache/misses"]
        out["cache"] = {
            "hits": counters["cache/hits"],
            "misses": counters["cache/misses"],
            "hit_rate": counters["cache/hits"] / looked_up if looked_up else 0.0,
        }
    return out


def _mode_summary(runs: dict[str, dict[str, Any]]) -> dict[str, Any]:
    seeds = list(runs)
    n_steps = min(len(r["reward_curve"]["score"]) for r in runs.values())
    steps = runs[seeds[0]]["reward_curve"]["step"][:n_steps]
    per_step = [[runs[s]["reward_curve"]["score"][i] for s in seeds] for i in range(n_steps)]
    finals = [runs[s]["final_reward"] for s in seeds]
    em = [runs[s]["final_test"]["exact_match"] for s in seeds]
    calls = sum(r["tool_calls"] for r in runs.values())
    failures = sum(r["backend_failures"] for r in runs.values())
    tool_failures = sum(r["tool_failures"] for r in runs.values())
    out: dict[str, Any] = {
        "seeds": [int(s) for s in seeds],
        "steps": steps,
        "reward_mean_per_step": [float(np.mean(v)) for v in per_step],
        "reward_variance_per_step": [_variance(v) for v in per_step],
        "final_reward_per_seed": dict(zip(seeds, finals, strict=True)),
        "final_reward_mean": float(np.mean(finals)),
        "final_reward_variance": _variance(finals),
        "final_test_exact_match_per_seed": dict(zip(seeds, em, strict=True)),
        "final_test_exact_match_mean": float(np.mean(em)),
        "final_test_exact_match_variance": _variance(em),
        "tool_failure_rate": tool_failures / calls if calls else 0.0,
        "search_failure_rate": failures / calls if calls else 0.0,
        "tool_calls": calls,
        "injected": {
            k: sum(r["injected"].get(k, 0.0) for r in runs.values())
            for k in ("calls", "timeouts", "errors", "dropped", "shuffled")
        },
        "backend_calls_during_training": sum(r["backend_calls_during_training"] for r in runs.values()),
    }
    if all("cache" in r for r in runs.values()):
        hits = sum(r["cache"]["hits"] for r in runs.values())
        misses = sum(r["cache"]["misses"] for r in runs.values())
        out["cache"] = {
            "hits": hits,
            "misses": misses,
            "hit_rate": hits / (hits + misses) if hits + misses else 0.0,
        }
    return out


def plot(payload: dict[str, Any], path: str | Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    colours = {"off": "tab:red", "replay": "tab:blue"}
    styles = ["-", "--", ":", "-."]
    ax = axes[0][0]
    for mode, runs in payload["runs"].items():
        for i, (seed, r) in enumerate(runs.items()):
            ax.plot(r["reward_curve"]["step"], r["reward_curve"]["score"], color=colours[mode],
                    linestyle=styles[i % len(styles)], marker="o", markersize=3, label=f"{mode}, seed {seed}")  # fmt: skip
    ax.set_title("training reward (objective/scores) per seed", fontsize=10)
    ax.legend(fontsize=7)
    ax = axes[0][1]
    for mode, summary in payload["summary"].items():
        ax.plot(summary["steps"], summary["reward_variance_per_step"], color=colours[mode], marker="o",
                markersize=3, label=f"{mode} (final: {summary['final_reward_variance']:.2g})")  # fmt: skip
    ax.set_title("reward variance across seeds", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1][0]
    seeds = payload["seeds"]
    width = 0.8 / len(payload["runs"])
    for j, (mode, runs) in enumerate(payload["runs"].items()):
        xs = [i + j * width for i in range(len(seeds))]
        ax.bar(xs, [runs[str(s)]["final_test"]["exact_match"] for s in seeds], width=width,
               color=colours[mode], label=mode)  # fmt: skip
    ax.set_xticks([i + width * (len(payload["runs"]) - 1) / 2 for i in range(len(seeds))])
    ax.set_xticklabels([f"seed {s}" for s in seeds])
    ax.set_title("final test exact match (greedy, clean index)", fontsize=10)
    ax.legend(fontsize=8)
    ax = axes[1][1]
    for mode, runs in payload["runs"].items():
        steps = payload["summary"][mode]["steps"]
        rates = [
            float(np.mean([r["tool_failure_rate"][i] or 0.0 for r in runs.values()]))
            for i in range(len(steps))
        ]
        ax.plot(
            steps, rates, color=colours[mode], marker="o", markersize=3, label=f"{mode}: failed tool calls"
        )
        if mode == "replay":
            misses = []
            for i in range(len(steps)):
                per_seed = []
                for r in runs.values():
                    c = r["per_step_counters"][i] if i < len(r["per_step_counters"]) else {}
                    looked = c.get("cache/hits", 0.0) + c.get("cache/misses", 0.0)
                    per_seed.append(c.get("cache/misses", 0.0) / looked if looked else 0.0)
                misses.append(float(np.mean(per_seed)))
            ax.plot(
                steps,
                misses,
                color=colours[mode],
                linestyle="--",
                label="replay: cache misses (no documents)",
            )
    ax.set_title("failure rates per step (mean over seeds)", fontsize=10)
    ax.legend(fontsize=7)
    for row in axes:
        for a in row:
            a.grid(alpha=0.3)
    for a in (axes[0][0], axes[0][1], axes[1][1]):
        a.set_xlabel("PPO step")
        a.xaxis.get_major_locator().set_params(integer=True)
    f = payload["fault_injection"]
    title = (
        f"PPO under a noisy backend ({f['fault_rate']:.0%} of queries dropped/shuffled, errors {f['error_rate']:g} "
        f"+ timeouts {f['timeout_rate']:g} per call): cache off vs replay"
    )
    save_figure(fig, path, suptitle=title)


# ---------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="unstable_search.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    add_run_arguments(
        p,
        experiment="unstable_search",
        unit="run",
        plot_help="Where to write the PNG.",
        guard_help="Keep the demo's collapse guard (off by default: its rollbacks hide noise-driven drops).",
        fresh_help="Record the snapshot and rerun every run even if finished ones exist.",
    )
    p.add_argument(
        "--seeds", nargs="+", type=int, default=[0, 1, 2], help="PPO seeds (each also seeds its noise)."
    )
    p.add_argument("--modes", nargs="+", default=list(MODES), choices=MODES, help="Cache modes to compare.")
    p.add_argument(
        "--episodes", type=int, default=None, help="Training episodes per run (default: the demo's)."
    )
    p.add_argument(
        "--fault-rate", type=float, default=0.3, help="Share of queries with dropped and/or shuffled results."
    )
    p.add_argument(
        "--error-rate",
        type=float,
        default=0.05,
        help="Share of batched calls failing with SearchUnavailable.",
    )
    p.add_argument(
        "--timeout-rate", type=float, default=0.05, help="Share of batched calls failing with SearchTimeout."
    )
    p.add_argument(
        "--record-passes",
        type=int,
        default=1,
        help="Sampled rollout passes of the warm start recorded into the snapshot.",
    )
    p.add_argument(
        "--record-questions",
        type=int,
        default=None,
        help="Training questions per recording pass (default: all).",
    )
    p.add_argument(
        "--test-questions",
        type=int,
        default=None,
        help="Test questions of the final measurement (default: all of the demo's).",
    )
    p.add_argument(
        "--final-window", type=int, default=3, help="The final reward is the mean over this many last steps."
    )
    return p  # fmt: skip


def _check(a: argparse.Namespace) -> None:
    for name in ("fault_rate", "error_rate", "timeout_rate"):
        value = getattr(a, name)
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"--{name.replace('_', '-')} {value:g}: must be a probability in [0, 1]")
    if a.error_rate + a.timeout_rate > 1.0:
        raise ValueError("--error-rate + --timeout-rate must be <= 1 (they are shares of the same calls)")
    if a.fault_rate >= 1.0:
        raise ValueError("--fault-rate must be < 1 (at 1 every query would be dropped or shuffled)")
    if len(set(a.seeds)) != len(a.seeds) or len(set(a.modes)) != len(a.modes):
        raise ValueError(f"--seeds {a.seeds} / --modes {a.modes}: a value appears twice")
    for flag, value in (("--record-passes", a.record_passes), ("--final-window", a.final_window), ("--jobs", a.jobs),
                        ("--record-questions", a.record_questions), ("--test-questions", a.test_questions)):  # fmt: skip
        if value is not None and value < (0 if flag == "--record-passes" else 1):
            raise ValueError(f"{flag} {value}: must be >= {0 if flag == '--record-passes' else 1}")


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Record the snapshot, run every (mode, seed), write the JSON and the plot; returns the JSON payload."""
    t0 = time.perf_counter()
    a = build_parser().parse_args(argv)
    _check(a)
    overrides = parse_set(a.set_)
    run = load_demo_run(a.run, overrides)
    work = Path(a.work_dir) if a.work_dir else run.run_dir / "experiments" / "unstable_search"
    work.mkdir(parents=True, exist_ok=True)
    threads = a.threads or run.config.num_threads
    faults = {"fault_rate": a.fault_rate, "error_rate": a.error_rate, "timeout_rate": a.timeout_rate}
    ident = warm_start_id(run)
    log = lambda msg: print(f"[unstable_search] {msg}", file=sys.stderr, flush=True)  # noqa: E731

    snapshot_path = work / "snapshot.sqlite"
    snapshot: dict[str, Any] | None = None
    if "replay" in a.modes:
        record_spec = {
            "path": str(snapshot_path), "warm_start": ident, "overrides": overrides, "faults": faults,
            "record_passes": a.record_passes, "seed": run.config.seed,
            "record_questions": min(a.record_questions or len(run.train_rows), len(run.train_rows)),
        }  # fmt: skip
        info_path = work / "snapshot.json"
        if not a.fresh and info_path.exists() and snapshot_path.exists():
            saved = json.loads(info_path.read_text(encoding="utf-8"))
            snapshot = saved["info"] if saved.get("spec") == json.loads(json.dumps(record_spec)) else None
        if snapshot is None:
            log(f"recording the replay snapshot -> {snapshot_path}")
            set_threads(threads)
            snapshot = record_snapshot(run, record_spec)
            write_json(info_path, {"spec": record_spec, "info": snapshot})
        else:
            log(f"reusing the snapshot {snapshot_path} (recorded with the same settings)")

    test_questions = min(a.test_questions or len(run.test_rows), len(run.test_rows))
    jobs = min(a.jobs, len(a.seeds) * len(a.modes))
    specs = [
        {
            "name": f"{mode}/seed-{seed}",
            "out_dir": str(work / f"{mode}-seed-{seed}"),
            "threads": threads_per_job(threads, jobs),
            "run": str(run.run_dir),
            "warm_start": ident,
            "overrides": overrides,
            "mode": mode,
            "seed": seed,
            "episodes": a.episodes,
            "faults": faults,
            "snapshot": str(snapshot_path),
            "snapshot_entries": snapshot["entries"] if snapshot else None,
            "test_questions": test_questions,
            "keep_guard": bool(a.keep_guard),
            "save_trajectories": bool(a.save_trajectories),
        }
        for mode in a.modes
        for seed in a.seeds
    ]
    results = run_jobs(specs, run_one, __file__, jobs, reuse=not a.fresh, log=log)
    runs: dict[str, dict[str, Any]] = {mode: {} for mode in a.modes}
    for spec, result in zip(specs, results, strict=True):
        runs[spec["mode"]][str(spec["seed"])] = _run_summary(spec, result, a.final_window)
    probe = ppo_args(run, "unused", a.seeds[0], a.episodes).finalize(num_train_rows=len(run.train_rows))
    p = perturb_rate(a.fault_rate)
    payload: dict[str, Any] = {
        "experiment": "unstable_search",
        "run": str(run.run_dir),
        "seeds": a.seeds,
        "modes": a.modes,
        "episodes": int(probe.total_episodes),
        "batch_size": int(probe.batch_size),
        "fault_injection": {
            **faults,
            "drop_rate": p,
            "shuffle_rate": p,
            "per_query": "dropped and/or shuffled results, each at drop_rate / shuffle_rate, so P(either) = fault_rate",
            "per_call": "error_rate: SearchUnavailable (retried once by the environment); timeout_rate: SearchTimeout "
            "(not retried); one call carries every row's query of a turn",
            "fault_seed": f"{FAULT_SEED_BASE} + the run's seed (mode off)",
            "breaker_reset_s": ENV_CHANGES["breaker_reset_s"],
        },
        "snapshot": snapshot,
        "replay_miss_policy": "a query the snapshot lacks gets no documents (counted in cache.misses)",
        "final_test": {
            "split": "test",
            "questions": test_questions,
            "how": "evaluate_policy, greedy, on the clean index (no faults) in both modes, as the demo measures",
            "used_for_selection": False,
        },
        "final_reward": f"mean training score (objective/scores) over the last {a.final_window} steps",
        "variance": "sample variance across seeds (ddof=1; 0 with one seed)",
        "collapse_guard": bool(run.config.ppo.collapse_guard and a.keep_guard),
        "ppo_overrides": overrides,
        "runs": runs,
        "summary": {mode: _mode_summary(mode_runs) for mode, mode_runs in runs.items()},
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(a.json, payload)
    plot(payload, a.plot)
    return payload


if __name__ == "__main__":
    if worker_main(sys.argv[1:], run_one):
        sys.exit(0)
    try:
        out = main()
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        print(f"unstable_search.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    print(
        {
            mode: {k: s[k] for k in ("final_reward_variance", "final_test_exact_match_mean")}
            for mode, s in out["summary"].items()
        }
    )
