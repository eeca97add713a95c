"""The run directory and its manifest: everything needed to reproduce or audit a run.

`runs/<name>/` holds `config.yaml`, `manifest.json`, `metrics.jsonl`, `trajectories/*.jsonl.gz`,
`checkpoints/step-N/`, `eval/*.json` and `report.html`. The manifest records the versions of every
library that shapes the numbers, the git commit, seeds, padding side, generation config, a hash of
the chat template and the search index fingerprint: the facts the seeds say a reproducible RL run
must pin.

`RunDir` is the writer's view (creating it creates the folders): atomic checkpoints and their pruning,
metrics lines, `eval/step-N.json`, step trajectories, text samples, and resume's truncation, the same for
every trainer. `Cadence` decides when a trainer logs, evaluates, saves and writes samples, and
`BestCheckpoint` keeps the best dev evaluation's checkpoint: PPO and GRPO both use them, so their run
directories have one shape. `RunReader` is the read-only view that
`searchrl view`, `audit`, `report` and `eval` share: given a path it finds what it is (a demo directory,
a PPO or GRPO run directory, or one trajectories file), the run's config class (from `manifest.json`'s
`trainer`), its trajectory sources, eval files, checkpoints, data, index and tokenizer, and refuses
anything else with a `RunTargetError` that says what a valid target is. It never writes.
"""

from __future__ import annotations

import dataclasses
import gzip
import hashlib
import importlib
import importlib.metadata
import json
import math
import os
import platform
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Any, Literal

import yaml

from searchrl.common.config import load_config
from searchrl.common.io import append_jsonl, atomic_write_json, atomic_write_text
from searchrl.common.trajectory import write_trajectories

TRACKED_PACKAGES = (
    "torch",
    "transformers",
    "trl",
    "accelerate",
    "datasets",
    "peft",
    "tokenizers",
    "bm25s",
    "faiss-cpu",
    "sentence-transformers",
    "numpy",
    "searchrl",
)


def package_versions(names: tuple[str, ...] = TRACKED_PACKAGES) -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for name in names:
        try:
            out[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            out[name] = None
    return out


def git_commit(cwd: str | Path | None = None) -> str | None:
    """The commit of the searchrl checkout (with `-dirty` when the tree has changes), if it is one."""
    root = Path(cwd) if cwd else Path(__file__).resolve().parents[2]
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=root, capture_output=True, text=True, timeout=5, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return sha + ("-dirty" if dirty else "")


def sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def build_manifest(
    *,
    seeds: dict[str, int],
    tokenizer: Any = None,
    generation_config: dict | None = None,
    index_fingerprint: str | None = None,
    config: Any = None,
    extra: dict | None = None,
) -> dict[str, Any]:
    """The run's `manifest.json`: versions, commit, seeds, tokenizer facts, and `config`'s class as a dotted
    path (`config_class`), by which `RunReader.config_class` reloads `config.yaml` without knowing the trainers."""
    manifest: dict[str, Any] = {
        "created_unix": time.time(),
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "versions": package_versions(),
        "git_commit": git_commit(),
        "seeds": seeds,
        "generation_config": generation_config or {},
        "index_fingerprint": index_fingerprint,
    }
    if config is not None:
        manifest["config_class"] = f"{type(config).__module__}.{type(config).__qualname__}"
    if tokenizer is not None:
        manifest["padding_side"] = getattr(tokenizer, "padding_side", None)
        manifest["pad_token_id"] = getattr(tokenizer, "pad_token_id", None)
        manifest["eos_token_id"] = getattr(tokenizer, "eos_token_id", None)
        manifest["chat_template_sha256"] = sha256_text(getattr(tokenizer, "chat_template", None))
    try:
        import torch

        manifest["torch_threads"] = torch.get_num_threads()
        manifest["cuda_available"] = torch.cuda.is_available()
    except ImportError:  # pragma: no cover - torch is a hard dependency
        pass
    manifest.update(extra or {})
    return manifest


def config_class_at(path: str, where: Path | str) -> type:
    """The config dataclass a dotted path (`searchrl.ppo.config.PPOConfig`) names; only searchrl's own."""
    module_name, _, name = str(path).rpartition(".")
    if not module_name.startswith("searchrl."):
        raise RunTargetError(f"{where}: config_class {path!r} is not a searchrl config class")
    try:
        cls = getattr(importlib.import_module(module_name), name)
    except (ImportError, AttributeError) as e:
        raise RunTargetError(f"{where}: config_class {path!r} cannot be imported ({e})") from e
    if not (isinstance(cls, type) and dataclasses.is_dataclass(cls)):
        raise RunTargetError(f"{where}: config_class {path!r} is not a config dataclass")
    return cls


def recorded_path_candidates(path: str | Path, near: str | Path) -> list[Path]:
    """Where a path a run recorded may be on this machine, in order: the path itself when absolute; else
    against the working directory, then against each folder above `near` (the file or folder that recorded
    it: a relative path was written from wherever the run was started, often a folder above the run)."""
    given = Path(path).expanduser()
    if given.is_absolute():
        return [given]
    return [Path.cwd() / given, *(folder / given for folder in Path(near).resolve().parents)]


def step_of_name(name: str) -> int:
    """`step-12.json` / `step-000012.jsonl.gz` / `step-12` -> 12; -1 for anything else."""
    digits = name.removeprefix("step-").split(".")[0]
    return int(digits) if name.startswith("step-") and digits.isdigit() else -1


def _step_of_line(line: str) -> int:
    """A JSONL line's `step` (0 without one); a torn or blank line counts as later than any step (dropped)."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return 1 << 62


class RunDir:
    """Paths of one run directory; creating it creates the folders."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        for sub in ("trajectories", "checkpoints", "eval"):
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    config = property(lambda self: self.root / "config.yaml")
    manifest = property(lambda self: self.root / "manifest.json")
    metrics = property(lambda self: self.root / "metrics.jsonl")
    report = property(lambda self: self.root / "report.html")
    best_checkpoint = property(lambda self: self.root / "best_checkpoint.json")
    checkpoints = property(lambda self: self.root / "checkpoints")
    trajectories = property(lambda self: self.root / "trajectories")
    eval = property(lambda self: self.root / "eval")

    samples = property(lambda self: self.root / "samples.jsonl")

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.manifest, manifest)

    def log_metrics(self, line: dict[str, Any]) -> None:
        """One `metrics.jsonl` line (the caller decides when: `Cadence.should_log`)."""
        append_jsonl(self.metrics, line)

    def step_trajectories(self, step: int) -> Path:
        return self.trajectories / f"step-{step:06d}.jsonl.gz"

    def write_step_trajectories(self, step: int, trajectories: Sequence[Any]) -> Path:
        """`trajectories/step-00000N.jsonl.gz`: the episodes a training step learned from."""
        path = self.step_trajectories(step)
        write_trajectories(path, list(trajectories))
        return path

    def write_samples(self, step: int, trajectories: Sequence[Any], tokenizer: Any, n: int = 4) -> None:
        """A few of a step's episodes as text in `samples.jsonl` (question, golds, the decoded episode after
        the prompt, answer, reward): what TRL's `num_sample_generations` shows, readable without the viewer."""
        for t in list(trajectories)[:n]:
            episode = tokenizer.decode(t.input_ids[t.prompt_length :], skip_special_tokens=False)
            row = {"step": step, "id": t.id, "question": t.question, "golds": t.golds,
                   "episode": episode, "answer": t.answer, "reward": t.reward}  # fmt: skip
            append_jsonl(self.samples, row)

    def write_eval(self, step: int, record: dict[str, Any]) -> Path:
        """`eval/step-N.json`, the same shape for every trainer: `{"step": N, "episode", "time/train_s",
        "time/elapsed_s", "eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"}`."""
        path = self.eval / f"step-{step}.json"
        atomic_write_json(path, {"step": step, **record})
        return path

    def truncate_after(self, step: int) -> None:
        """Resume's clean-up, the same for every trainer: drop what a killed run wrote after `step`.

        Metric and sample lines with a later `step`, `eval/step-M.json`, `trajectories/step-M.jsonl.gz` with
        M > step, and later checkpoints left incomplete (killed while saving). `step=-1` drops every line
        (a run resumed at step 0 starts over, its step-0 evaluation included). Rewrites are atomic.
        """
        for log in (self.metrics, self.samples):
            if log.exists():
                kept = [
                    line
                    for line in log.read_text(encoding="utf-8").splitlines()
                    if _step_of_line(line) <= step
                ]
                atomic_write_text(log, "".join(f"{line}\n" for line in kept))
        for path in [*self.eval.glob("step-*.json"), *self.trajectories.glob("step-*.jsonl.gz")]:
            if step_of_name(path.name) > step:
                path.unlink()
        for path in self.checkpoints.glob("step-*"):
            if step_of_name(path.name) > step and not (path / "trainer_state.json").exists():
                shutil.rmtree(path, ignore_errors=True)

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / f"step-{step}"

    def write_checkpoint(self, step: int, fill: Callable[[Path], None]) -> Path:
        """Write checkpoint `step-N` atomically, the same for every trainer.

        `fill(folder)` writes everything into a temporary `.tmp-step-N`, its `trainer_state.json` last (the
        file that marks a checkpoint complete); the folder is then renamed into place, replacing an older
        `step-N`. A run killed while saving leaves only the temporary folder, which the next save clears.
        """
        final = self.checkpoint_dir(step)
        tmp = final.with_name(f".tmp-{final.name}")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir(parents=True)
        fill(tmp)
        if final.exists():
            shutil.rmtree(final)
        os.replace(tmp, final)
        return final

    def complete_checkpoints(self) -> list[Path]:
        """Checkpoints whose `trainer_state.json` exists, oldest first."""
        done = [p for p in self.checkpoints.glob("step-*") if (p / "trainer_state.json").exists()]
        return sorted(done, key=lambda p: step_of_name(p.name))

    def prune_checkpoints(self, limit: int | None, protected: set[Path | None]) -> None:
        """Keep the newest `limit` complete checkpoints (`save_total_limit`; None or 0 keeps all), never
        deleting one in `protected` (the newest, a rollback target, the best)."""
        if not limit:
            return
        done = self.complete_checkpoints()
        for old in done[: max(0, len(done) - limit)]:
            if old not in protected:
                shutil.rmtree(old, ignore_errors=True)

    def latest_checkpoint(self) -> Path | None:
        """The newest complete checkpoint (one whose `trainer_state.json` exists), or None."""
        done = self.complete_checkpoints()
        return done[-1] if done else None


# -- the training side every trainer shares: when to log, evaluate, save and sample; the best checkpoint ----


@dataclass(frozen=True)
class Cadence:
    """When a trainer logs, evaluates, saves and writes text samples: one rule for PPO and GRPO.

    - a `metrics.jsonl` line every `logging_steps` steps, and always on a step that evaluated (`eval/*`),
      rolled back or tripped the guard (`guard/*`), or ended the run;
    - a dev evaluation every `eval_steps` steps (0: never) and at the last step, so a run ends on a
      measured point;
    - a checkpoint every `save_steps` steps (0: never); trainers also save the last step and each new best;
    - text samples `num_sample_generations` times over the run (TRL's field; 0: never) and at the last step.
    """

    max_steps: int
    logging_steps: int = 1
    eval_steps: int = 0
    save_steps: int = 0
    num_sample_generations: int = 0

    @classmethod
    def of(cls, run: Any, max_steps: int) -> Cadence:
        """The cadence a run config (a `RunSection`) sets, over `max_steps` steps."""
        return cls(max_steps, run.logging_steps, run.eval_steps, run.save_steps, run.num_sample_generations)

    def is_last(self, step: int) -> bool:
        return step >= self.max_steps

    def should_log(self, step: int, metrics: dict[str, Any] | None = None) -> bool:
        if step % max(1, self.logging_steps) == 0 or self.is_last(step):
            return True
        return any(k.startswith(("eval/", "guard/")) for k in metrics or {})

    def should_evaluate(self, step: int) -> bool:
        return bool(self.eval_steps) and (step % self.eval_steps == 0 or self.is_last(step))

    def should_save(self, step: int) -> bool:
        return bool(self.save_steps) and step % self.save_steps == 0

    def should_sample(self, step: int) -> bool:
        if not self.num_sample_generations:
            return False
        every = max(1, self.max_steps // self.num_sample_generations)
        return step % every == 0 or self.is_last(step)


class BestCheckpoint:
    """The best dev evaluation so far by `metric` (a config's `best_metric`, e.g. `eval/reward`) and its
    checkpoint, which pruning never deletes and `RUN/best_checkpoint.json` names (`searchrl eval
    --checkpoint best` reads it). The first of equal values stays the best."""

    def __init__(self, run: RunDir, metric: str | None) -> None:
        self.run = run
        self.metric = metric
        self.best: dict[str, Any] | None = None  # {"step", "metric", "value"}
        self.checkpoint: Path | None = None

    def improves(self, step: int, metrics: dict[str, Any]) -> bool:
        """True (and the best updated) when `metrics` beats the best `metric` so far; record the checkpoint
        saved for `step` with `record`."""
        value = metrics.get(self.metric) if self.metric else None
        if not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if self.best is not None and value <= self.best["value"]:
            return False
        self.best = {"step": step, "metric": self.metric, "value": float(value)}
        return True

    def record(self, checkpoint: Path, write: bool = True) -> None:
        """`checkpoint` holds the best weights; `write` (the main process) names it in best_checkpoint.json."""
        self.checkpoint = checkpoint
        if write and self.best is not None:
            atomic_write_json(self.run.best_checkpoint, {**self.best, "checkpoint": checkpoint.name})

    def restore(self, best: dict[str, Any] | None) -> None:
        """A resumed run takes its checkpoint's best (saved in `trainer_state.json`)."""
        self.best = best
        self.checkpoint = self.run.checkpoint_dir(int(best["step"])) if best is not None else None


# -- reading a run: what a path is, and what it holds --------------------------------------------------

RunKind = Literal["demo", "ppo", "grpo", "trajectories"]
SourceKind = Literal["training", "evaluation"]
TRAINERS: tuple[str, ...] = ("ppo", "grpo")
TRAINER_LABELS: dict[str, str] = {"ppo": "PPO", "grpo": "GRPO"}
# The config class of a run whose manifest predates `config_class`, by its trainer, as a dotted path.
TRAINER_CONFIG_CLASSES: dict[str, str] = {
    "ppo": "searchrl.ppo.config.PPOConfig",
    "grpo": "searchrl.grpo.config.GRPORunConfig",
}
VALID_TARGETS = (
    "a run directory (PPO or GRPO, what `searchrl train` / `searchrl grpo` write: config.yaml, manifest.json, "
    "metrics.jsonl, trajectories/, checkpoints/), a demo directory (what `searchrl demo` writes: summary.json "
    "or demo_config.yaml, and ppo/) or one trajectories file (*.jsonl.gz or *.jsonl, e.g. "
    "RUN/trajectories/step-000001.jsonl.gz or RUN/eval/test-step-2.trajectories.jsonl.gz)"
)
# Any of these makes a folder a run directory (a run that has only just started has config.yaml alone).
RUN_MARKERS: tuple[str, ...] = (
    "config.yaml",
    "manifest.json",
    "metrics.jsonl",
    "trajectories",
    "checkpoints",
)
_RUN_SUBFOLDERS = ("trajectories", "eval", "checkpoints")
TRAJECTORY_SUFFIXES: tuple[str, ...] = (".trajectories.jsonl.gz", ".jsonl.gz", ".jsonl")
# The demo's run directories (folder -> label): PPO always, the GRPO pair with `--compare-grpo`.
DEMO_RUNS: dict[str, str] = {
    "ppo": "PPO",
    "grpo_trl_loop": "GRPO (TRL loop)",
    "grpo_our_rollout": "GRPO (our rollout)",
}
# The demo's evaluations are `eval/<stage>-<split>[-<variant>].json` (sft-test.json, ppo-test.json, ...).
STAGE_LABELS: dict[str, str] = {"sft": "SFT policy", "ppo": "PPO policy"}
SPLIT_LABELS: dict[str, str] = {"test": "hidden test split", "dev": "dev split", "train": "train split"}
_DEMO_EVAL = re.compile(r"^(?P<stage>[a-z0-9_]+?)-(?P<split>test|dev|train)(?:-(?P<variant>.+))?$")
_STEP_IN_NAME = re.compile(r"(?:^|[-_.])step-(\d+)(?=$|[-_.])")
_TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")


class RunTargetError(ValueError):
    """The path is not a demo directory, a run directory or a trajectories file; the message says what is."""


def step_of_path(path: str | Path) -> int | None:
    """The step a file's name carries (`step-000012.jsonl.gz` -> 12, `test-step-2.json` -> 2), else None."""
    match = _STEP_IN_NAME.search(Path(path).name)
    return int(match.group(1)) if match else None


def trajectory_stem(path: str | Path) -> str:
    """A trajectories file's name without its suffix (`test-step-2.trajectories.jsonl.gz` -> `test-step-2`)."""
    name = Path(path).name
    for suffix in TRAJECTORY_SUFFIXES:
        if name.endswith(suffix):
            return name[: -len(suffix)]
    return Path(path).stem


def is_trajectory_file(path: str | Path) -> bool:
    return Path(path).name.endswith((".jsonl.gz", ".jsonl"))


def eval_trajectories_of(json_path: str | Path) -> Path | None:
    """The trajectories written beside an eval JSON: `<stem>.trajectories.jsonl.gz` (`searchrl eval`) or
    `<stem>.jsonl.gz` (the demo), if one exists."""
    path = Path(json_path)
    stem = path.name[: -len(".json")] if path.name.endswith(".json") else path.name
    for suffix in (".trajectories.jsonl.gz", ".jsonl.gz", ".trajectories.jsonl", ".jsonl"):
        candidate = path.with_name(stem + suffix)
        if candidate.is_file():
            return candidate
    return None


@dataclass(frozen=True)
class TrajectorySource:
    """One set of trajectories a target offers: a training run's steps, or one evaluation's file.

    `id` is what the viewer's `?source=` takes. A training source lists its folder on every `files()` call,
    so a live run's new steps appear.
    """

    id: str
    label: str
    kind: SourceKind
    paths: tuple[Path, ...] = ()
    folder: Path | None = None
    trainer: str | None = None

    def files(self) -> list[Path]:
        """The source's files, in step order (training) or as given."""
        if self.folder is None:
            return [p for p in self.paths if p.is_file()]
        if not self.folder.is_dir():
            return []
        found = [p for p in self.folder.iterdir() if p.is_file() and is_trajectory_file(p)]
        return sorted(found, key=lambda p: (step_of_path(p) if step_of_path(p) is not None else -1, p.name))


@dataclass(frozen=True)
class EvalFile:
    """One evaluation JSON of a run or a demo, with its trajectories file when one was written beside it."""

    path: Path
    data: dict[str, Any]
    trajectories: Path | None
    label: str
    split: str | None = None
    stage: str | None = None  # the demo's stage ("sft", "ppo") for its eval/<stage>-test.json files
    variant: str | None = None  # e.g. "closed-book" for eval/sft-test-closed-book.json

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def stem(self) -> str:
        return self.path.name[: -len(".json")] if self.path.name.endswith(".json") else self.path.name

    @property
    def step(self) -> int | None:
        step = self.data.get("step")
        return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as e:
        raise RunTargetError(
            f"{path}: cannot be read as YAML ({type(e).__name__}: {e}); fix or remove it"
        ) from None
    return data if isinstance(data, dict) else {}


def _is_demo(folder: Path) -> bool:
    if not folder.is_dir():
        return False
    return (folder / "demo_config.yaml").is_file() or (
        (folder / "summary.json").is_file() and (folder / "ppo").is_dir()
    )


def _is_run(folder: Path) -> bool:
    return folder.is_dir() and any((folder / marker).exists() for marker in RUN_MARKERS)


def _first_row(path: Path) -> Any:
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rt", encoding="utf-8") as f:
            for line in f:
                if line.strip():
                    return json.loads(line)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise RunTargetError(
            f"{path}: cannot be read as JSON lines ({type(e).__name__}: {e}); pass {VALID_TARGETS}"
        ) from None
    return None


def _has_tokenizer(folder: Path | None) -> bool:
    return folder is not None and folder.is_dir() and any((folder / f).is_file() for f in _TOKENIZER_FILES)


class RunReader:
    """A read-only view of what `searchrl view / audit / report / eval` are pointed at.

    `RunReader(path)` finds the kind of `path`:

    - ``"demo"``: a `searchrl demo` directory. `root` is its PPO run (`ppo/`), `demo_root` the demo folder,
      whose `eval/<stage>-test.json` (+ `.jsonl.gz`) are the hidden-test evaluations of the SFT and PPO
      policies, `summary.json` its summary, `data/` and `index/` its data and search index, `sft/policy`
      the policy PPO started from.
    - ``"ppo"`` / ``"grpo"``: a run directory; the trainer is `manifest.json`'s `trainer` (build_manifest's
      `extra`), else told by `config.yaml`'s fields, else a checkpoint's `trainer_state.json`; a folder
      with none of them (hand-built, as some tests do) reads as PPO. A run that is a demo's `ppo/`
      gets the demo's evaluations, data and index too (`demo_root`).
    - ``"trajectories"``: one `*.jsonl.gz` / `*.jsonl` file of trajectories; when it sits in a run or demo
      (`RUN/trajectories/`, `RUN/eval/`, `DEMO/eval/`), that run is `enclosing` (metrics, tokenizer).

    Anything else raises `RunTargetError` naming what was wrong and `VALID_TARGETS`. Nothing is written.
    """

    def __init__(self, target: str | Path) -> None:
        self.target = Path(target)
        self.kind: RunKind = "trajectories"
        self.root: Path | None = None
        self.demo_root: Path | None = None
        self.trajectories_file: Path | None = None
        self.enclosing: RunReader | None = None
        if not self.target.exists():
            raise RunTargetError(f"{self.target}: no such file or directory; pass {VALID_TARGETS}")
        if self.target.is_file():
            self._open_file(self.target)
        else:
            self._open_dir(self.target)

    # -- what the path is ------------------------------------------------------------------------
    def _open_file(self, path: Path) -> None:
        if not is_trajectory_file(path):
            raise RunTargetError(
                f"{path}: not a trajectories file (*.jsonl.gz or *.jsonl); pass {VALID_TARGETS}"
            )
        row = _first_row(path)
        if row is None:
            raise RunTargetError(f"{path}: the file is empty (no trajectories); pass {VALID_TARGETS}")
        if not isinstance(row, dict) or not {"input_ids", "action_mask", "question"} <= set(row):
            keys = sorted(row)[:8] if isinstance(row, dict) else type(row).__name__
            raise RunTargetError(
                f"{path}: JSON lines, but not trajectories (first row: {keys}; a trajectory row has "
                f"input_ids, action_mask, question, spans, ...); pass {VALID_TARGETS}"
            )
        self.kind = "trajectories"
        self.trajectories_file = path
        parent = path.parent
        for folder in (parent.parent, parent) if parent.name in _RUN_SUBFOLDERS else (parent,):
            if _is_demo(folder) or _is_run(folder):
                self.enclosing = RunReader(folder)
                self.root, self.demo_root = self.enclosing.root, self.enclosing.demo_root
                break

    def _open_dir(self, folder: Path) -> None:
        if _is_demo(folder):
            self.kind = "demo"
            self.demo_root = folder
            self.root = folder / "ppo" if (folder / "ppo").is_dir() else None
            return
        if _is_run(folder):
            self.root = folder
            parent = folder.parent
            if _is_demo(parent) and (parent / "ppo").resolve() == folder.resolve():
                self.demo_root = parent
            self.kind = self._detect_trainer(folder)
            return
        if folder.name in _RUN_SUBFOLDERS and (_is_run(folder.parent) or _is_demo(folder.parent)):
            raise RunTargetError(
                f"{folder}: the {folder.name}/ folder of {folder.parent}, not a run; pass the run directory "
                f"{folder.parent} (or one file in it)"
            )
        if folder.parent.name == "checkpoints" and _is_run(folder.parent.parent):
            raise RunTargetError(
                f"{folder}: a checkpoint of the run {folder.parent.parent}; pass the run directory (searchrl eval "
                f"--run {folder.parent.parent} --checkpoint {folder.name} evaluates this checkpoint)"
            )
        raise RunTargetError(
            f"{folder}: not a run, a demo or a trajectories file: it holds none of "
            f"{', '.join(RUN_MARKERS)} (a run), nor summary.json or demo_config.yaml with ppo/ (a demo). "
            f"Pass {VALID_TARGETS}"
        )

    @staticmethod
    def _detect_trainer(folder: Path) -> Literal["ppo", "grpo"]:
        manifest = _read_json(folder / "manifest.json") or {}
        extra = manifest.get("extra") if isinstance(manifest.get("extra"), dict) else {}
        trainer = manifest.get("trainer", extra.get("trainer"))
        if trainer is not None:
            if trainer not in TRAINERS:
                raise RunTargetError(
                    f"{folder / 'manifest.json'}: trainer {trainer!r} is not one of {list(TRAINERS)}; "
                    f"pass {VALID_TARGETS}"
                )
            return "grpo" if trainer == "grpo" else "ppo"
        config = _read_yaml(folder / "config.yaml")
        if "num_generations" in config or config.get("mode") in ("trl_loop", "our_rollout"):
            return "grpo"
        if config:
            return "ppo"
        checkpoints = folder / "checkpoints"
        states = sorted(checkpoints.glob("step-*/trainer_state.json")) if checkpoints.is_dir() else []
        for state in states:
            if (_read_json(state) or {}).get("trainer") == "grpo":
                return "grpo"
        return "ppo"

    # -- the run -----------------------------------------------------------------------------------
    @property
    def trainer(self) -> str | None:
        """ "ppo" or "grpo": the trainer of `root`, or None when there is no run (a bare file, a demo before PPO)."""
        if self.kind in TRAINERS:
            return self.kind
        if self.enclosing is not None:
            return self.enclosing.trainer
        return "ppo" if self.kind == "demo" and self.root is not None else None

    @property
    def trainer_label(self) -> str:
        """ "PPO", "GRPO", or "training" when the trainer is unknown (x axes: "PPO step")."""
        return TRAINER_LABELS.get(self.trainer or "", "training")

    def describe(self) -> str:
        what = {
            "demo": "demo directory",
            "ppo": "PPO run",
            "grpo": "GRPO run",
            "trajectories": "trajectories file",
        }
        return f"{what[self.kind]} {self.target}"

    def require_run(self, command: str) -> Path:
        """`root`, or a RunTargetError saying why `command` needs a run directory here."""
        if self.root is not None:
            return self.root
        if self.kind == "demo":
            raise RunTargetError(
                f"{self.target}: this demo has no ppo/ run yet (it stopped, or is still running, before the PPO "
                f"stage); {command} needs a run directory: rerun `searchrl demo`, or pass a run directory"
            )
        raise RunTargetError(
            f"{self.target}: {command} needs a run directory or a demo directory, not a single trajectories file "
            f"outside any run; pass {VALID_TARGETS.split(' or one trajectories file')[0]}"
        )

    @cached_property
    def manifest(self) -> dict[str, Any]:
        """`root/manifest.json` ({} when absent or unreadable)."""
        return (_read_json(self.root / "manifest.json") or {}) if self.root is not None else {}

    @property
    def config_path(self) -> Path | None:
        path = self.root / "config.yaml" if self.root is not None else None
        return path if path is not None and path.is_file() else None

    @cached_property
    def raw_config(self) -> dict[str, Any]:
        """`config.yaml` as plain YAML ({} without one): for lookups that must not fail on a partial file."""
        return _read_yaml(self.config_path) if self.config_path is not None else {}

    def config_class(self) -> type:
        """The class of the run's `config.yaml`: the manifest's `config_class`, else its trainer's (`PPOConfig`
        or `GRPORunConfig`). Named by dotted path, so this layer imports no trainer."""
        path = self.manifest.get("config_class") or TRAINER_CONFIG_CLASSES[self.trainer or "ppo"]
        return config_class_at(path, self.root / "manifest.json" if self.root is not None else self.target)

    @cached_property
    def config(self) -> Any:
        """The run's `config.yaml` loaded as its trainer's config class; None when the run has none."""
        if self.config_path is None:
            return None
        return load_config(self.config_class(), self.config_path)

    def metrics(self) -> list[dict[str, Any]]:
        """The rows of `root/metrics.jsonl` (a line that does not parse, such as a killed run's last, is skipped)."""
        path = self.root / "metrics.jsonl" if self.root is not None else None
        if path is None or not path.is_file():
            return []
        rows = []
        for line in path.read_text(encoding="utf-8").splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:
                continue
            if isinstance(row, dict):
                rows.append(row)
        return rows

    def summary(self) -> dict[str, Any] | None:
        """The demo's `summary.json` (or a run's own), if there is one."""
        for folder in (self.demo_root, self.root):
            if folder is not None and (folder / "summary.json").is_file():
                return _read_json(folder / "summary.json")
        return None

    # -- checkpoints and models -------------------------------------------------------------------
    def checkpoints(self) -> list[Path]:
        """Complete checkpoints (`checkpoints/step-N/` with `trainer_state.json`), oldest first."""
        folder = self.root / "checkpoints" if self.root is not None else None
        if folder is None or not folder.is_dir():
            return []
        done = [p for p in folder.glob("step-*") if (p / "trainer_state.json").is_file()]
        return sorted(done, key=lambda p: step_of_path(p) or 0)

    def latest_checkpoint(self) -> Path | None:
        done = self.checkpoints()
        return done[-1] if done else None

    def checkpoint_policy(self, checkpoint: str = "latest") -> tuple[Path, str]:
        """(policy folder, name) of `latest`, `step-N` or `N`; FileNotFoundError listing what exists."""
        root = self.require_run("a checkpoint")
        if checkpoint == "latest":
            found = self.latest_checkpoint()
            if found is None:
                raise FileNotFoundError(
                    f"{root / 'checkpoints'}: no complete checkpoint (a step-N folder with trainer_state.json); "
                    "train first, or pass --model PATH"
                )
            return found / "policy", found.name
        if checkpoint == "best":
            best = root / "best_checkpoint.json"
            if not best.is_file():
                raise FileNotFoundError(
                    f"{best}: no best checkpoint recorded (the run had no dev evaluation, or best_metric: null); "
                    "use latest, initial or step-N"
                )
            checkpoint = str(json.loads(best.read_text(encoding="utf-8"))["checkpoint"])
        name = checkpoint if checkpoint.startswith("step-") else f"step-{checkpoint}"
        folder = root / "checkpoints" / name
        if not (folder / "policy").is_dir():
            available = sorted(p.name for p in (root / "checkpoints").glob("step-*"))
            raise FileNotFoundError(
                f"{folder}/policy not found; checkpoints here: {available or 'none'} (use step-N, latest, best or initial)"
            )
        return folder / "policy", name

    def recorded_initial_policy(self) -> Path | None:
        """The policy the run started from, as recorded: the config's `policy_model_path` (relative to wherever
        training ran, when it was given so), else the demo's `sft/policy`; None when the run names none."""
        path = self.raw_config.get("policy_model_path")
        if path:
            return Path(path)
        if self.demo_root is not None and (self.demo_root / "sft" / "policy").is_dir():
            return self.demo_root / "sft" / "policy"
        return None

    def initial_policy(self) -> Path | None:
        """`recorded_initial_policy` on this machine, from any working directory: as recorded (absolute, or
        from the working directory), else against each folder above the run (`recorded_path_candidates`);
        the first model folder (`config.json`) wins. None when the run names none; FileNotFoundError naming
        the recorded path, what was tried and how to fix it when none of those is a model folder."""
        recorded = self.recorded_initial_policy()
        if recorded is None:
            return None
        near = self.root / "config.yaml" if self.root is not None else self.target
        tried = recorded_path_candidates(recorded, near)
        found = next((path for path in tried if (path / "config.json").is_file()), None)
        if found is not None:
            return found
        raise FileNotFoundError(
            f"{near}: the run started from policy_model_path {str(recorded)!r}, which is not a model folder here "
            f"(tried {', '.join(str(p) for p in tried[:6])}). Run from the directory the run was trained in, put "
            "the starting policy back at that path, or pass it with --model DIR"
        )

    def tokenizer_dir(self) -> Path | None:
        """Where the run's tokenizer lives: the newest checkpoint's `policy/` (complete ones first), the
        config's `tokenizer_path` / `policy_model_path`, or the demo's `sft/policy`; None if nowhere."""
        if self.kind == "trajectories":
            return self.enclosing.tokenizer_dir() if self.enclosing is not None else None
        candidates: list[Path] = [p / "policy" for p in reversed(self.checkpoints())]
        if self.root is not None and (self.root / "checkpoints").is_dir():
            others = sorted(
                (self.root / "checkpoints").glob("step-*/policy"), key=lambda p: step_of_path(p.parent) or 0
            )
            candidates += list(reversed(others))
        for key in ("tokenizer_path", "policy_model_path"):
            if self.raw_config.get(key):
                candidates.append(Path(self.raw_config[key]))
        if self.demo_root is not None:
            candidates.append(self.demo_root / "sft" / "policy")
        return next((c for c in candidates if _has_tokenizer(c)), None)

    # -- data and search ---------------------------------------------------------------------------
    @property
    def data_dir(self) -> Path | None:
        """The folder of the run's question files: the config's train/dev file's folder, else the demo's data/."""
        for key in ("dev_file", "train_file"):
            if self.raw_config.get(key):
                return Path(self.raw_config[key]).parent
        if self.demo_root is not None and (self.demo_root / "data").is_dir():
            return self.demo_root / "data"
        return None

    def split_file(self, split: str) -> Path | None:
        """`<split>.jsonl` of the run's data: the config's train_file/dev_file by name, else `data_dir`'s."""
        named = {"train": self.raw_config.get("train_file"), "dev": self.raw_config.get("dev_file")}
        if named.get(split):
            return Path(named[split])
        return self.data_dir / f"{split}.jsonl" if self.data_dir is not None else None

    def question_files(self) -> list[Path]:
        """Every question file the run names or ships (train, dev, and the demo's test), that exists."""
        files = [Path(self.raw_config[k]) for k in ("train_file", "dev_file") if self.raw_config.get(k)]
        if self.data_dir is not None:
            files += [self.data_dir / f"{split}.jsonl" for split in ("train", "dev", "test")]
        seen: list[Path] = []
        for f in files:
            if f.is_file() and f not in seen:
                seen.append(f)
        return seen

    @property
    def index_dir(self) -> Path | None:
        """The run's search index: the config's `index_dir`, else the demo's `index/`."""
        if self.raw_config.get("index_dir"):
            return Path(self.raw_config["index_dir"])
        if self.demo_root is not None and (self.demo_root / "index").is_dir():
            return self.demo_root / "index"
        return None

    # -- what there is to read ------------------------------------------------------------------------
    def sub_runs(self) -> dict[str, Path]:
        """The demo's run directories by label (PPO, and the GRPO pair after `--compare-grpo`); {} otherwise."""
        if self.kind != "demo" or self.demo_root is None:
            return {}
        return {
            label: self.demo_root / folder
            for folder, label in DEMO_RUNS.items()
            if _is_run(self.demo_root / folder)
        }

    def eval_files(self) -> list[EvalFile]:
        """The run's `eval/*.json` (dev step-N.json, `searchrl eval` outputs), then the demo's (hidden test)."""
        if self.kind == "trajectories" and self.enclosing is not None:
            return self.enclosing.eval_files()
        out: list[EvalFile] = []
        if self.root is not None:
            out += self._eval_folder(self.root / "eval", demo=False)
        if self.demo_root is not None:
            out += self._eval_folder(self.demo_root / "eval", demo=True)
        return out

    def _eval_folder(self, folder: Path, demo: bool) -> list[EvalFile]:
        if not folder.is_dir():
            return []
        out = []
        for path in sorted(folder.glob("*.json")):
            if path.name.endswith(".audit.json"):
                continue  # `searchrl audit FILE` writes its result beside the file; it is not an evaluation
            data = _read_json(path)
            if data is None:
                continue
            stem = path.name[: -len(".json")]
            match = _DEMO_EVAL.match(stem) if demo else None
            stage = match.group("stage") if match else None
            variant = match.group("variant") if match else None
            split = data.get("split") or (match.group("split") if match else None)
            if split is None and not demo and step_of_path(path) is not None and stem.startswith("step-"):
                split = "dev"  # RUN/eval/step-N.json: the trainer's periodic evaluation on dev
            if match:
                label = f"{STAGE_LABELS.get(stage or '', stage)} · {SPLIT_LABELS.get(split or '', split)}"
                label += f", {variant.replace('-', ' ')}" if variant else ""
            else:
                checkpoint = data.get("checkpoint") or (f"step-{data['step']}" if "step" in data else stem)
                label = f"{checkpoint} · {SPLIT_LABELS.get(split or '', split or 'evaluation')}"
            out.append(EvalFile(path, data, eval_trajectories_of(path), label, split, stage, variant))
        stages = list(STAGE_LABELS)
        # The demo's evaluations in the order the demo ran them (SFT, then PPO); a run's by file name.
        return sorted(
            out, key=lambda e: (stages.index(e.stage) if e.stage in stages else len(stages), e.name)
        )

    def trajectory_sources(self) -> list[TrajectorySource]:
        """What the viewer offers and the audit reads: training trajectories, then evaluations' files.

        A demo: its PPO run's training steps, the hidden-test evaluations (`eval/sft-test.jsonl.gz`,
        `eval/ppo-test.jsonl.gz`), the PPO run's own eval trajectories, and the GRPO runs' training steps
        when the demo trained them. A run: its training steps and eval trajectories. A file: itself.
        """
        if self.kind == "trajectories":
            assert self.trajectories_file is not None
            known = [e.label for e in self.eval_files() if e.trajectories == self.trajectories_file]
            return [
                TrajectorySource(
                    trajectory_stem(self.trajectories_file),
                    f"{known[0]} ({self.trajectories_file.name})" if known else self.trajectories_file.name,
                    "evaluation" if self.trajectories_file.parent.name == "eval" else "training",
                    paths=(self.trajectories_file,),
                    trainer=self.trainer,
                )
            ]
        sources: list[TrajectorySource] = []
        if self.root is not None:
            sources.append(
                TrajectorySource(
                    "train",
                    f"{self.trainer_label} training ({self._rel(self.root / 'trajectories')}/)",
                    "training",
                    folder=self.root / "trajectories",
                    trainer=self.trainer,
                )
            )
        # The demo's hidden-test evaluations first: they are what the demo is judged by.
        evals = sorted(self.eval_files(), key=lambda e: e.stage is None)
        for e in evals:
            if e.trajectories is None:
                continue
            source_id = (
                e.stem if all(s.id != e.stem for s in sources) else f"{e.path.parent.parent.name}/{e.stem}"
            )
            sources.append(
                TrajectorySource(
                    source_id,
                    f"{e.label} ({self._rel(e.trajectories)})",
                    "evaluation",
                    paths=(e.trajectories,),
                )
            )
        for label, folder in self.sub_runs().items():
            if folder == self.root:
                continue
            sources.append(
                TrajectorySource(
                    f"train:{folder.name}",
                    f"{label} training ({self._rel(folder / 'trajectories')}/)",
                    "training",
                    folder=folder / "trajectories",
                    trainer=RunReader(folder).trainer,
                )
            )
        return sources

    def _rel(self, path: Path) -> str:
        base = self.demo_root or self.root or self.target.parent
        try:
            return str(path.relative_to(base))
        except ValueError:
            return str(path)

    # -- where outputs go ----------------------------------------------------------------------------
    def audit_path(self) -> Path:
        """Default `searchrl audit` output: DEMO/audit.json, RUN/audit.json, or FILE's `<stem>.audit.json`."""
        if self.kind == "trajectories":
            assert self.trajectories_file is not None
            return self.trajectories_file.with_name(trajectory_stem(self.trajectories_file) + ".audit.json")
        return (self.demo_root if self.kind == "demo" else self.root or self.target) / "audit.json"

    def report_path(self) -> Path:
        """Default `searchrl report` output: DEMO/report.html or RUN/report.html."""
        return (self.demo_root if self.kind == "demo" else self.root or self.target) / "report.html"
