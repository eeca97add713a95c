"""`reuse_warm_start`: rerun the demo's RL half on a warm start the same settings already trained.

Why: the SFT warm start is 80% of the demo's time (about 8 of its 10 minutes on 2 cores) and depends on
none of the PPO settings. A user who changes `ppo:` (a learning rate, the critic's recipe) and wants the
demo's own figures, on several seeds, should not pay for SFT again. With `reuse_warm_start: true`
(`searchrl demo --reuse-warm-start`), a folder whose `demo_config.yaml` has the same warm-start settings
(everything but the fields in `NOT_WARM_START`) and whose `sft/policy` is complete keeps its tokenizer,
its SFT policy and its demonstrations; data and index are rebuilt (deterministic, under a second), the
expert and SFT stages are read back, and every stage after SFT runs again: the two evaluations of the warm
start (which must reproduce the old figures), PPO, its evaluation and the report. `summary.json` says
what was reused (`warm_start.reused`, the stages' seconds of the run that trained it). When the folder
cannot be reused, the demo says why and runs every stage.

PPO does not depend on how the process got its warm start: `PPOTrainer` seeds every generator from
`PPOConfig.seed`, the critic starts from the SFT backbone, and the policy is read back from the float32
files the first run wrote, so a reused run trains as the full run would.
"""

from __future__ import annotations

import dataclasses
import gzip
import shutil
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.config import ConfigError, load_config
from searchrl.run.sources import read_json

# DemoConfig fields that do not change the warm start: where it is written, what comes after SFT, how fast.
NOT_WARM_START = ("out_dir", "test_questions", "num_threads", "ppo", "compare_grpo", "progress_bar",
                  "reuse_warm_start")  # fmt: skip

# What the demo writes after SFT: removed before those stages run again (a new PPO run must not append to
# the old one's metrics).
AFTER_WARM_START = ("ppo", "eval", "grpo_trl_loop", "grpo_our_rollout", "report.html")

POLICY_FILES = ("config.json", "model.safetensors", "tokenizer.json")


@dataclass
class ReusedWarmStart:
    """A finished warm start found in the demo folder: where, how many demonstrations, what it cost."""

    policy_dir: Path
    num_demonstrations: int
    final_loss: float | None
    stages_seconds: dict[str, float]
    copy_gate: list[dict[str, float]] = field(default_factory=list)
    answer_copy_rate: float | None = None  # measured when it was trained (None: a summary from before #25)

    def to_summary(self) -> dict[str, Any]:
        return reused_summary(self.policy_dir, self.stages_seconds)


def warm_start_settings(cfg: Any, not_warm_start: tuple[str, ...] = NOT_WARM_START) -> dict[str, Any]:
    """The config fields a warm start depends on (all but `not_warm_start`: fields, or `section.field`), as
    plain data."""
    settings = dataclasses.asdict(cfg)
    for name in not_warm_start:
        section, _, key = name.partition(".")
        if key:
            settings.get(section, {}).pop(key, None)
        else:
            settings.pop(section, None)
    return settings


def why_not_reusable(
    cfg: Any, out: Path, required: list[Path], not_warm_start: tuple[str, ...] = NOT_WARM_START
) -> str:
    """Why the warm start in `out` cannot serve `cfg` (a file of `required` missing, a saved config this
    searchrl cannot read, other warm-start settings), or "" when it can. Serves both demos."""
    missing = [p for p in required if not p.exists()]
    if missing:
        return f"no finished warm start in {out} (missing {', '.join(str(p) for p in missing)})"
    saved_config = out / "demo_config.yaml"
    try:
        saved = load_config(type(cfg), saved_config)
    except (ConfigError, TypeError, ValueError) as exc:
        return f"{saved_config} is not a {type(cfg).__name__} this searchrl reads ({exc})"
    now, then = warm_start_settings(cfg, not_warm_start), warm_start_settings(saved, not_warm_start)
    changed = sorted(key for key in now if now[key] != then.get(key))
    if changed:
        return f"{saved_config} trained its warm start with other settings: {', '.join(changed)}"
    return ""


def reused_summary(policy_dir: Path, stages_seconds: dict[str, float]) -> dict[str, Any]:
    """summary.json's `warm_start` for a reused warm start."""
    return {"reused": True, "policy_dir": str(policy_dir), "stages_seconds_when_trained": stages_seconds}


def warm_stages_seconds(
    summary: dict[str, Any], stages: tuple[str, ...], prefixes: tuple[str, ...] = ()
) -> dict[str, float]:
    """The seconds an earlier run's summary gives the stages a reused warm start stands for (`stages`, and any
    stage whose name starts with one of `prefixes`). Serves the three demos' reuse."""
    seconds = summary.get("stages_seconds", {})
    return {k: v for k, v in seconds.items() if k in stages or k.startswith(prefixes)}


def remove_paths(out: Path, names: tuple[str, ...]) -> None:
    """Remove each of `names` (files or folders) under `out` that exists."""
    for name in names:
        path = out / name
        if path.is_dir():
            shutil.rmtree(path)
        elif path.exists():
            path.unlink()


def find_warm_start(cfg: Any, out: Path) -> tuple[ReusedWarmStart | None, str]:
    """The warm start in `out` when `cfg` may reuse it; else None and the reason, for the user."""
    policy_dir = out / "sft" / "policy"
    demos = out / "sft" / "expert.jsonl.gz"
    required = [out / "demo_config.yaml", demos, *(policy_dir / f for f in POLICY_FILES)]
    why = why_not_reusable(cfg, out, required)
    if why:
        return None, why
    summary = read_json(out / "summary.json") or {}
    stages = warm_stages_seconds(summary, ("data", "index", "models", "expert", "sft"))
    sft = summary.get("sft", {})
    return ReusedWarmStart(
        policy_dir, _count_lines(demos), sft.get("final_loss"), stages, sft.get("copy_gate") or [],
        sft.get("answer_copy_rate"),
    ), ""  # fmt: skip


def clear_after_warm_start(out: Path) -> None:
    """Remove what the stages after SFT wrote in an earlier run of this folder."""
    remove_paths(out, AFTER_WARM_START)


def _count_lines(path: Path) -> int:
    with gzip.open(path, "rt", encoding="utf-8") as f:
        return sum(1 for line in f if line.strip())


def warm_start_if_asked(
    cfg: Any,
    out: Path,
    find: Callable[[Any, Path], tuple[Any, str]] = find_warm_start,
    clear: Callable[[Path], None] = clear_after_warm_start,
) -> Any | None:
    """With `cfg.reuse_warm_start`, the warm start `find` reads from `out` (what followed it is then removed by
    `clear`); None without the setting, or after saying on stderr why it cannot be reused. Serves the synthetic
    demo and, with `searchrl.demo.real_reuse`'s two functions, the real loop."""
    if not cfg.reuse_warm_start:
        return None
    found, why_not = find(cfg, out)
    if found is None:
        print(f"reuse_warm_start: {why_not}; running every stage", file=sys.stderr)
        return None
    clear(out)
    return found
