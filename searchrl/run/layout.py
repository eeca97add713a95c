"""A demo's layout: the stages, run directories and evaluations a demo folder holds, as the demo lists them.

Why: a demo (`searchrl demo`, synthetic or real) is several stages in one folder (a warm start, a PPO run,
maybe GRPO runs, evaluations of each stage's policy on a hidden split, its data and search index). The run
layer reads that folder for `searchrl view / audit / report / eval`, but must not know any demo's folder
names: the demo says them. `DemoLayout` is that record, kept under the `layout` key of the demo's `summary.json`.
The demo writes it when it starts (`write_layout(folder, layout)`, so a running demo can be viewed) and again
with its figures at the end (`write_layout(folder, layout, summary)`); `read_layout` reads it back. Every path
in it is relative to the demo folder.

A `summary.json` without a layout was written by a searchrl older than the layout: `read_layout` refuses it
with a `RunTargetError` that says to rerun the demo.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_json
from searchrl.run.errors import RunTargetError
from searchrl.run.writer import SUMMARY_FILE

LAYOUT_KEY = "layout"
# How a split is named on pages: the demos' evaluation labels and a run's own evaluations.
SPLIT_LABELS: dict[str, str] = {"test": "hidden test split", "dev": "dev split", "train": "train split"}


@dataclass(frozen=True)
class SubRun:
    """One run directory of the demo (PPO, GRPO, ...)."""

    folder: str = field(metadata={"help": "The run directory, relative to the demo folder (e.g. ppo)."})
    label: str = field(metadata={"help": "Its name on pages and in the trainers' comparison (e.g. PPO)."})


@dataclass(frozen=True)
class Stage:
    """One stage whose policy the demo measures (its figures sit under this name in summary.json)."""

    name: str = field(metadata={"help": "The stage's key in summary.json and in its evaluations (e.g. sft)."})
    label: str = field(metadata={"help": "Its policy's name on pages (e.g. SFT policy)."})


@dataclass(frozen=True)
class DemoEvaluation:
    """One evaluation the demo wrote (its trajectories, if any, beside it with the writer's one suffix)."""

    file: str = field(
        metadata={"help": "The eval JSON, relative to the demo folder (e.g. eval/sft-test.json)."}
    )
    label: str = field(metadata={"help": "Its name on pages (e.g. SFT policy · hidden test split)."})
    stage: str = field(metadata={"help": "The stage whose policy it measures (a Stage name)."})
    split: str = field(metadata={"help": "The data split it measures (test, dev, train)."})
    variant: str | None = field(
        default=None, metadata={"help": "What differs from the stage's main evaluation (e.g. closed-book)."}
    )


@dataclass(frozen=True)
class DemoLayout:
    """What a demo folder holds, as the demo lists it; every path relative to the demo folder."""

    sub_runs: tuple[SubRun, ...] = field(
        metadata={
            "help": "The demo's run directories; the first is its main run (what view, audit, eval read)."
        }
    )
    stages: tuple[Stage, ...] = field(default=(), metadata={"help": "The stages whose policies it measures."})
    evaluations: tuple[DemoEvaluation, ...] = field(
        default=(), metadata={"help": "Its evaluations, in the order it ran them."}
    )
    initial_policy: str | None = field(
        default=None, metadata={"help": "The policy the main run started from (e.g. sft/policy)."}
    )
    data: str | None = field(
        default=None, metadata={"help": "The folder of its <split>.jsonl question files."}
    )
    index: str | None = field(default=None, metadata={"help": "Its search index folder."})

    @property
    def main_run(self) -> SubRun | None:
        return self.sub_runs[0] if self.sub_runs else None

    def stage_label(self, name: str) -> str | None:
        return next((s.label for s in self.stages if s.name == name), None)

    def to_dict(self) -> dict[str, Any]:
        """The layout as `summary.json` holds it (JSON: lists, not tuples)."""
        return {k: list(v) if isinstance(v, tuple) else v for k, v in asdict(self).items()}

    @classmethod
    def from_dict(cls, data: Any, where: str) -> DemoLayout:
        """The layout a `summary.json` holds; a `RunTargetError` naming `where` and the fault otherwise."""
        try:
            return cls(
                sub_runs=tuple(SubRun(**r) for r in data["sub_runs"]),
                stages=tuple(Stage(**s) for s in data.get("stages", ())),
                evaluations=tuple(DemoEvaluation(**e) for e in data.get("evaluations", ())),
                initial_policy=data.get("initial_policy"),
                data=data.get("data"),
                index=data.get("index"),
            )
        except (KeyError, TypeError, AttributeError) as e:
            raise RunTargetError(
                f"{where}: its {LAYOUT_KEY!r} cannot be read ({type(e).__name__}: {e}); rerun the demo to write it"
            ) from None


def write_layout(demo_dir: str | Path, layout: DemoLayout, summary: dict[str, Any] | None = None) -> Path:
    """`DEMO/summary.json`: the demo's figures (`summary`; none yet when the demo starts) with its layout."""
    path = Path(demo_dir) / SUMMARY_FILE
    atomic_write_json(path, {**(summary or {}), LAYOUT_KEY: layout.to_dict()})
    return path


def has_layout(demo_dir: str | Path) -> bool:
    """Whether `demo_dir/summary.json` holds a layout (the folder is a demo this searchrl can read)."""
    return LAYOUT_KEY in _summary_of(Path(demo_dir))


def read_layout(demo_dir: str | Path) -> DemoLayout:
    """The layout `demo_dir/summary.json` holds. A `RunTargetError` when there is none: the folder was written
    by a searchrl older than the layout (or is no demo), and rerunning the demo writes one."""
    path = Path(demo_dir) / SUMMARY_FILE
    summary = _summary_of(Path(demo_dir))
    if LAYOUT_KEY not in summary:
        raise RunTargetError(
            f"{demo_dir}: a demo folder written by an older searchrl: {path.name} does not list the demo's "
            f"stages, runs and evaluations (its {LAYOUT_KEY!r}), so its runs cannot be found. Rerun the demo "
            f"(`searchrl demo --out {demo_dir}`, with the same --config) to write one, or pass its run "
            "directory (e.g. DEMO/ppo) instead"
        )
    return DemoLayout.from_dict(summary[LAYOUT_KEY], str(path))


def _summary_of(folder: Path) -> dict[str, Any]:
    try:
        data = json.loads((folder / SUMMARY_FILE).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}
    return data if isinstance(data, dict) else {}
