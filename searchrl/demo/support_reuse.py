"""`reuse_warm_start` for the customer-service demo: rerun PPO on the warm start a folder already holds.

Why: the support demo's warm start (span copying, the first-turn curriculum, whole demonstrations) is most of
its time (17-50 minutes on 2 cores, docs/support.md), and depends on no PPO setting. A user changing `ppo:` (a
learning rate, the number of episodes) should pay for PPO and its evaluations only.

With `reuse_warm_start: true` (`searchrl demo --config support.yaml --reuse-warm-start`), a folder whose
`demo_config.yaml` has the same warm-start settings (every field but `NOT_WARM_START`) and which holds the SFT
policy and the demonstrations is read back: the store and the index are rebuilt (deterministic from the seed,
seconds), the tokenizer and SFT policy are loaded, the demonstrations read (the summary counts them), the
teacher-forced copy rates taken from the old summary when it has them; both evaluations, PPO, the audit and the
report run again. Anything missing or trained otherwise: the demo says why and runs every stage.
"""

from __future__ import annotations

import gzip
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.demo.reuse import remove_paths, reused_summary, warm_stages_seconds, why_not_reusable
from searchrl.run.sources import read_json

# SupportDemoConfig fields that do not change stages 1-5. `generation` samples PPO's rollouts only (every
# evaluation is greedy, the expert's turns are forced); `permission_denied_penalty` and `answer_f1_weight` price
# PPO's reward.
NOT_WARM_START = ("out_dir", "num_threads", "ppo", "generation", "permission_denied_penalty", "answer_f1_weight",
                  "progress_bar", "reuse_warm_start")  # fmt: skip

# What a run writes after SFT: removed before those stages run again (a new PPO run must not resume from, or
# append to, the old one).
AFTER_WARM_START = ("ppo", "eval", "audit.json", "report.html", "summary.json")

POLICY_FILES = ("config.json", "model.safetensors", "tokenizer.json")
# What the SFT stage measured (final loss, copy gate, copy rates, the warm stages' seconds), written when it ends.
WARM_START_FACTS = "sft/warm_start.json"
WARM_STAGES = ("data", "index", "models", "expert", "sft")


@dataclass
class SupportWarmStart:
    """The SFT policy and demonstrations a run left, and what its summary said of them."""

    policy_dir: Path
    demonstrations_path: Path
    stages_seconds: dict[str, float]
    final_loss: float | None = None
    copy_rates: dict[str, Any] | None = None
    copy_gate: list[dict[str, float]] = field(default_factory=list)

    def to_summary(self) -> dict[str, Any]:
        return reused_summary(self.policy_dir, self.stages_seconds)


def find_support_warm_start(cfg: Any, out: Path) -> tuple[SupportWarmStart | None, str]:
    """The warm start in `out` when `cfg` may reuse it; else None and the reason, for the user."""
    policy_dir = out / "sft" / "policy"
    demos = out / "sft" / "expert.jsonl.gz"
    required = [out / "demo_config.yaml", demos, *(policy_dir / f for f in POLICY_FILES)]
    why = why_not_reusable(cfg, out, required, NOT_WARM_START)
    if why:
        return None, why
    if not _readable_gzip(demos):
        return None, f"{demos} is not a complete gzip file (a run stopped while writing it?)"
    # The facts file SFT wrote; a run from before it (or one whose file is gone) has them in its summary only.
    summary = read_json(out / WARM_START_FACTS) or read_json(out / "summary.json") or {}
    sft = summary.get("sft", summary)
    stages = warm_stages_seconds(summary, WARM_STAGES)
    return SupportWarmStart(
        policy_dir, demos, stages, sft.get("final_loss"), sft.get("copy_rates"), sft.get("copy_gate") or []
    ), ""  # fmt: skip


def clear_support_after_warm_start(out: Path) -> None:
    """Remove what the stages after SFT wrote in an earlier run of this folder."""
    remove_paths(out, AFTER_WARM_START)


def _readable_gzip(path: Path) -> bool:
    try:
        with gzip.open(path, "rb") as f:
            while f.read(1 << 20):
                pass
    except (OSError, EOFError):
        return False
    return True
