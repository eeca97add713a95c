"""What a path is, for the run reader: a demo folder, a run directory or one trajectories file, or nothing.

A run directory holds any of `RUN_MARKERS` (a run that has only just started has `config.yaml` alone) and
its trainer is the one its own records name (`trainer_of`); a demo folder holds a `summary.json` with its
layout (`searchrl.run.layout`); a trajectories file is JSON lines whose rows are trajectories. Everything
else is refused here with a `RunTargetError` that says what was wrong and what a valid target is. `RunReader`
(`reader.py`) opens targets through these; nothing here writes.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any, Literal, NoReturn

from searchrl.run.errors import VALID_TARGETS, RunTargetError
from searchrl.run.layout import DemoLayout, has_layout, read_layout
from searchrl.run.sources import read_json
from searchrl.run.writer import (
    CHECKPOINTS_DIR,
    CONFIG_FILE,
    MANIFEST_FILE,
    METRICS_FILE,
    RUN_SUBFOLDERS,
    SUMMARY_FILE,
    TRAINER_STATE_FILE,
    TRAJECTORIES_DIR,
    complete_checkpoints,
    is_trajectory_file,
)

RunKind = Literal["demo", "ppo", "grpo", "trajectories"]
TRAINERS: tuple[str, ...] = ("ppo", "grpo")
# Any of these makes a folder a run directory (a run that has only just started has config.yaml alone).
RUN_MARKERS: tuple[str, ...] = (CONFIG_FILE, MANIFEST_FILE, METRICS_FILE, TRAJECTORIES_DIR, CHECKPOINTS_DIR)
# What a demo folder from before the layout holds: such a folder is refused with a way out.
OLD_DEMO_MARKERS: tuple[str, ...] = ("demo_config.yaml", SUMMARY_FILE)


def is_demo_dir(folder: Path) -> bool:
    return folder.is_dir() and has_layout(folder)


def is_run_dir(folder: Path) -> bool:
    return folder.is_dir() and any((folder / marker).exists() for marker in RUN_MARKERS)


def trainer_of(folder: Path) -> Literal["ppo", "grpo"]:
    """The trainer a run's own records name: `manifest.json`'s `trainer` (the trainer's `build_manifest`
    extra), else a checkpoint's `trainer_state.json`; a folder with neither (hand-built) is PPO. No config
    field is taken as a sign of one trainer or the other."""
    manifest = read_json(folder / MANIFEST_FILE) or {}
    extra = manifest.get("extra") if isinstance(manifest.get("extra"), dict) else {}
    trainer = manifest.get("trainer", extra.get("trainer"))
    if trainer is None:
        states = (
            read_json(p / TRAINER_STATE_FILE) or {} for p in complete_checkpoints(folder / CHECKPOINTS_DIR)
        )
        trainer = next((s["trainer"] for s in states if s.get("trainer") in TRAINERS), "ppo")
    if trainer not in TRAINERS:
        raise RunTargetError(
            f"{folder / MANIFEST_FILE}: trainer {trainer!r} is not one of {list(TRAINERS)}; pass {VALID_TARGETS}"
        )
    return "grpo" if trainer == "grpo" else "ppo"


def demo_of_main_run(folder: Path) -> tuple[Path | None, DemoLayout | None]:
    """(demo folder, its layout) when `folder` is the main run of the nearest demo above it, else Nones."""
    for above in folder.parents:
        if is_demo_dir(above):
            layout = read_layout(above)
            main = layout.main_run
            if main is not None and (above / main.folder).resolve() == folder.resolve():
                return above, layout
            break
    return None, None


def enclosing_run(path: Path) -> Path | None:
    """The run or demo a trajectories file sits in (`RUN/trajectories/`, `RUN/eval/`, `DEMO/eval/`), if any."""
    parent = path.parent
    for folder in (parent.parent, parent) if parent.name in RUN_SUBFOLDERS else (parent,):
        if is_demo_dir(folder) or is_run_dir(folder):
            return folder
    return None


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


def check_trajectories_file(path: Path) -> None:
    """A `RunTargetError` unless `path` is a `*.jsonl.gz` / `*.jsonl` file whose first row is a trajectory."""
    if not is_trajectory_file(path):
        raise RunTargetError(f"{path}: not a trajectories file (*.jsonl.gz or *.jsonl); pass {VALID_TARGETS}")
    row = _first_row(path)
    if row is None:
        raise RunTargetError(f"{path}: the file is empty (no trajectories); pass {VALID_TARGETS}")
    if not isinstance(row, dict) or not {"input_ids", "action_mask", "question"} <= set(row):
        keys = sorted(row)[:8] if isinstance(row, dict) else type(row).__name__
        raise RunTargetError(
            f"{path}: JSON lines, but not trajectories (first row: {keys}; a trajectory row has "
            f"input_ids, action_mask, question, spans, ...); pass {VALID_TARGETS}"
        )


def refuse_folder(folder: Path) -> NoReturn:
    """The `RunTargetError` of a folder that is neither a run nor a demo, saying what it is instead."""
    if any((folder / marker).is_file() for marker in OLD_DEMO_MARKERS):
        read_layout(folder)  # refuses a demo folder written before the layout, saying to rerun it
    if folder.name in RUN_SUBFOLDERS and (is_run_dir(folder.parent) or is_demo_dir(folder.parent)):
        raise RunTargetError(
            f"{folder}: the {folder.name}/ folder of {folder.parent}, not a run; pass the run directory "
            f"{folder.parent} (or one file in it)"
        )
    if folder.parent.name == CHECKPOINTS_DIR and is_run_dir(folder.parent.parent):
        raise RunTargetError(
            f"{folder}: a checkpoint of the run {folder.parent.parent}; pass the run directory (searchrl eval "
            f"--run {folder.parent.parent} --checkpoint {folder.name} evaluates this checkpoint)"
        )
    raise RunTargetError(
        f"{folder}: not a run, a demo or a trajectories file: it holds none of {', '.join(RUN_MARKERS)} (a run), "
        f"nor a {SUMMARY_FILE} with a demo layout (a demo). Pass {VALID_TARGETS}"
    )
