"""What a run offers to read: its metrics as kept, its trajectory sources and its evaluation files.

`kept_metrics` applies the collapse guard's rollbacks to the lines of a `metrics.jsonl`
(`read_metric_lines`): what `RunReader.metrics` gives every reader. `TrajectorySource` is one set of
trajectories (a training run's steps, or one evaluation's file), what the viewer offers and the audit reads. `EvalFile` is one evaluation JSON with its trajectories beside it (the
writer's one suffix, `eval_trajectories_path`) and how pages name it; `eval_folder` lists a folder of them,
a demo's in the order its layout lists them. `RunReader` builds both; nothing here writes.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from searchrl.run.layout import SPLIT_LABELS, DemoEvaluation
from searchrl.run.writer import (
    AUDIT_SUFFIX,
    eval_stem,
    eval_trajectories_path,
    is_trajectory_file,
    step_name,
    step_of,
)

SourceKind = Literal["training", "evaluation"]


def step_sort_key(path: Path) -> tuple[int, str]:
    """Files in step order (`step_of`), names without a step first, then by name."""
    step = step_of(path.name)
    return (-1 if step is None else step, path.name)


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
        return sorted(found, key=step_sort_key)


@dataclass(frozen=True)
class EvalFile:
    """One evaluation JSON of a run or a demo, with its trajectories file when one was written beside it."""

    path: Path
    data: dict[str, Any]
    trajectories: Path | None
    label: str
    split: str | None = None
    stage: str | None = None  # the demo's stage ("sft", "ppo") whose policy a demo's evaluation measures
    variant: str | None = None  # e.g. "closed-book" for a demo's closed-book evaluation

    @property
    def name(self) -> str:
        return self.path.name

    @property
    def stem(self) -> str:
        return eval_stem(self.path)

    @property
    def step(self) -> int | None:
        step = self.data.get("step")
        return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else None

    @property
    def is_step_file(self) -> bool:
        """A trainer's periodic dev evaluation, `eval/step-N.json` (what the trainers' comparison draws)."""
        step = step_of(self.stem)
        return step is not None and self.stem == step_name(step)


def read_json(path: Path) -> dict[str, Any] | None:
    """A JSON object file, or None when it is missing, unreadable or not an object."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _trajectories_beside(path: Path) -> Path | None:
    beside = eval_trajectories_path(path)
    return beside if beside.is_file() else None


def _plain_eval_file(path: Path, data: dict[str, Any]) -> EvalFile:
    """A run's evaluation: `searchrl eval`'s `<split>-<checkpoint>.json` or the trainer's `step-N.json` (dev)."""
    stem = eval_stem(path)
    split = data.get("split")
    if split is None and stem.startswith("step-") and step_of(stem) is not None:
        split = "dev"  # RUN/eval/step-N.json: the trainer's periodic evaluation on dev
    checkpoint = data.get("checkpoint") or (step_name(int(data["step"])) if "step" in data else stem)
    label = f"{checkpoint} · {SPLIT_LABELS.get(split or '', split or 'evaluation')}"
    return EvalFile(path, data, _trajectories_beside(path), label, split)


def eval_folder(
    folder: Path, demo_root: Path | None = None, listed: Sequence[DemoEvaluation] = ()
) -> list[EvalFile]:
    """The evaluations in `folder`: first those a demo's layout lists (`listed`, paths relative to
    `demo_root`), in its order and with its labels, then every other `*.json` by name (audit results aside)."""
    out: list[EvalFile] = []
    seen: set[Path] = set()
    for ev in listed:
        path = (demo_root or folder) / ev.file
        data = read_json(path) if path.is_file() else None
        if data is None:
            continue
        seen.add(path)
        split = data.get("split") or ev.split
        out.append(EvalFile(path, data, _trajectories_beside(path), ev.label, split, ev.stage, ev.variant))
    if not folder.is_dir():
        return out
    for path in sorted(folder.glob("*.json")):
        if path.name.endswith(AUDIT_SUFFIX) or path in seen:
            continue  # `searchrl audit FILE` writes its result beside the file; it is not an evaluation
        data = read_json(path)
        if data is not None:
            out.append(_plain_eval_file(path, data))
    return out


def read_metric_lines(path: Path) -> list[dict[str, Any]]:
    """Every line of a `metrics.jsonl` as written (a line that does not parse, such as a killed run's last,
    is skipped); `RunReader.metrics` is what the run kept."""
    if not path.is_file():
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


def kept_metrics(lines: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The lines a run kept, one per step: a collapse-guard rollback (a line with `guard/rollback`, written
    by `ppo/guard.py`) undoes the steps after the checkpoint it went back to (`guard/rolled_back_to_step`);
    their lines go, the rollback line's own included, and the steps redone after it stand."""
    kept: list[dict[str, Any]] = []
    for line in lines:
        if not line.get("guard/rollback"):
            kept.append(line)
            continue
        back_to = line.get("guard/rolled_back_to_step")
        if not isinstance(back_to, int | float):
            back_to = _line_step(line, 1) - 1
        kept = [k for k in kept if _line_step(k, 0) <= back_to]
    return kept


def _line_step(line: dict[str, Any], default: int) -> int:
    step = line.get("step")
    return int(step) if isinstance(step, int | float) and not isinstance(step, bool) else default
