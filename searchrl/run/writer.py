"""Writing a run directory: its file names, step names, eval files and metric names, and when to write them.

`runs/<name>/` holds `config.yaml`, `manifest.json`, `metrics.jsonl`, `samples.jsonl`,
`trajectories/step-00000N.jsonl.gz`, `checkpoints/step-N/`, `eval/<name>.json` (with its trajectories beside it
as `<name>.trajectories.jsonl.gz`), `best_checkpoint.json` and `report.html`. This module is the one owner of
those names: the reader (`searchrl.run.reader`) reads what these functions name, and every writer of an
evaluation (`searchrl eval`, the benchmark suite, the demos) goes through `write_evaluation`.

- Step names: `step_name` makes `step-N` (zero-padded for trajectory files, so they sort by name) and
  `step_of` reads the step back out of any name that carries one.
- Metric names: TRL's GRPO logs `reward`, `kl` and `entropy` where PPO logs `objective/scores`,
  `objective/kl` and `objective/entropy_per_token`. `RunDir.log_metrics` writes PPO's name beside TRL's
  (`METRIC_ALIASES`), once, when the line is written, so every reader finds one name.
- `RunDir` is the writer's view (creating it creates the folders): atomic checkpoints and their pruning,
  metrics lines, `eval/step-N.json`, step trajectories, text samples, and resume's truncation, the same for
  every trainer. `Cadence` decides when a trainer logs, evaluates, saves and writes samples, and
  `BestCheckpoint` keeps the best dev evaluation's checkpoint: PPO and GRPO both use them, so their run
  directories have one shape.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.io import append_jsonl, atomic_write_json, atomic_write_text
from searchrl.common.trajectory import write_trajectories

# -- names ------------------------------------------------------------------------------------------------

CONFIG_FILE = "config.yaml"
MANIFEST_FILE = "manifest.json"
METRICS_FILE = "metrics.jsonl"
SAMPLES_FILE = "samples.jsonl"
REPORT_FILE = "report.html"
AUDIT_FILE = "audit.json"
SUMMARY_FILE = "summary.json"
BEST_CHECKPOINT_FILE = "best_checkpoint.json"
TRAINER_STATE_FILE = "trainer_state.json"  # written last into a checkpoint: it marks the checkpoint complete
TRAJECTORIES_DIR = "trajectories"
CHECKPOINTS_DIR = "checkpoints"
EVAL_DIR = "eval"
RUN_SUBFOLDERS: tuple[str, ...] = (TRAJECTORIES_DIR, EVAL_DIR, CHECKPOINTS_DIR)

# The one suffix of the trajectories written beside an evaluation's JSON (`eval/<name>.json`).
EVAL_TRAJECTORIES_SUFFIX = ".trajectories.jsonl.gz"
TRAJECTORY_SUFFIXES: tuple[str, ...] = (EVAL_TRAJECTORIES_SUFFIX, ".jsonl.gz", ".jsonl")
AUDIT_SUFFIX = ".audit.json"  # `searchrl audit FILE` writes its result beside the file

_STEP_IN_NAME = re.compile(r"(?:^|[-_.])step-(\d+)(?=$|[-_.])")


def step_name(step: int, digits: int = 0) -> str:
    """`step-N`, zero-padded to `digits` (trajectory files: `step-000012`, so a listing sorts by step)."""
    return f"step-{step:0{digits}d}"


def step_of(name: str | Path) -> int | None:
    """The step a name carries (`step-12`, `step-000012.jsonl.gz`, `test-step-2.json` -> 12, 12, 2), else None."""
    match = _STEP_IN_NAME.search(Path(name).name)
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


def eval_stem(json_path: str | Path) -> str:
    """An eval JSON's name without `.json` (`eval/sft-test.json` -> `sft-test`)."""
    name = Path(json_path).name
    return name[: -len(".json")] if name.endswith(".json") else name


def eval_trajectories_path(json_path: str | Path) -> Path:
    """Where the trajectories of an eval JSON live: `<name>.trajectories.jsonl.gz` beside it."""
    path = Path(json_path)
    return path.with_name(eval_stem(path) + EVAL_TRAJECTORIES_SUFFIX)


def write_evaluation(
    json_path: str | Path, payload: dict[str, Any], trajectories: Sequence[Any] | None = None
) -> Path:
    """An evaluation's JSON and, when given, its trajectories beside it (`eval_trajectories_path`), both written
    atomically; every writer of an evaluation goes through here. Returns the JSON path."""
    path = Path(json_path)
    atomic_write_json(path, payload)
    if trajectories is not None:
        write_trajectories(eval_trajectories_path(path), list(trajectories))
    return path


# -- metric names -----------------------------------------------------------------------------------------

# TRL's GRPO name -> PPO's name for the same figure (what the report, the audit and the plots read).
METRIC_ALIASES: dict[str, str] = {
    "reward": "objective/scores",
    "kl": "objective/kl",
    "entropy": "objective/entropy_per_token",
}


def with_metric_aliases(line: dict[str, Any]) -> dict[str, Any]:
    """`line` with PPO's name added beside each TRL name it holds (`METRIC_ALIASES`) where PPO's is absent."""
    out = dict(line)
    for trl_name, ppo_name in METRIC_ALIASES.items():
        if trl_name in out and ppo_name not in out:
            out[ppo_name] = out[trl_name]
    return out


def _step_of_line(line: str) -> int:
    """A JSONL line's `step` (0 without one); a torn or blank line counts as later than any step (dropped)."""
    try:
        return int(json.loads(line).get("step", 0))
    except (ValueError, AttributeError, TypeError):
        return 1 << 62


def _is_after(path: Path, step: int) -> bool:
    found = step_of(path.name)
    return found is not None and found > step


# -- the run directory ------------------------------------------------------------------------------------


class RunDir:
    """Paths of one run directory; creating it creates the folders."""

    def __init__(self, root: str | Path):
        self.root = Path(root)
        for sub in RUN_SUBFOLDERS:
            (self.root / sub).mkdir(parents=True, exist_ok=True)

    config = property(lambda self: self.root / CONFIG_FILE)
    manifest = property(lambda self: self.root / MANIFEST_FILE)
    metrics = property(lambda self: self.root / METRICS_FILE)
    report = property(lambda self: self.root / REPORT_FILE)
    best_checkpoint = property(lambda self: self.root / BEST_CHECKPOINT_FILE)
    checkpoints = property(lambda self: self.root / CHECKPOINTS_DIR)
    trajectories = property(lambda self: self.root / TRAJECTORIES_DIR)
    eval = property(lambda self: self.root / EVAL_DIR)

    samples = property(lambda self: self.root / SAMPLES_FILE)

    def write_manifest(self, manifest: dict) -> None:
        atomic_write_json(self.manifest, manifest)

    def log_metrics(self, line: dict[str, Any]) -> None:
        """One `metrics.jsonl` line, with PPO's names beside TRL's (`with_metric_aliases`); the caller decides
        when (`Cadence.should_log`)."""
        append_jsonl(self.metrics, with_metric_aliases(line))

    def step_trajectories(self, step: int) -> Path:
        return self.trajectories / f"{step_name(step, 6)}.jsonl.gz"

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

    def eval_file(self, step: int) -> Path:
        return self.eval / f"{step_name(step)}.json"

    def write_eval(self, step: int, record: dict[str, Any]) -> Path:
        """`eval/step-N.json`, the same shape for every trainer: `{"step": N, "episode", "time/train_s",
        "time/elapsed_s", "eval/exact_match", "eval/f1", "eval/searches_per_question", "eval/reward"}`."""
        return write_evaluation(self.eval_file(step), {"step": step, **record})

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
            if _is_after(path, step):
                path.unlink()
        for path in self.checkpoints.glob("step-*"):
            if _is_after(path, step) and not (path / TRAINER_STATE_FILE).exists():
                shutil.rmtree(path, ignore_errors=True)

    def checkpoint_dir(self, step: int) -> Path:
        return self.checkpoints / step_name(step)

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
        return complete_checkpoints(self.checkpoints)

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


def complete_checkpoints(folder: Path) -> list[Path]:
    """The complete checkpoints (`step-N/` with `trainer_state.json`) in `folder`, oldest first."""
    if not folder.is_dir():
        return []
    done = [p for p in folder.glob("step-*") if (p / TRAINER_STATE_FILE).is_file()]
    return sorted(done, key=lambda p: step_of(p.name) or 0)


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
