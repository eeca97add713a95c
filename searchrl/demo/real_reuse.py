"""`reuse_warm_start` for the real loop: rerun PPO (and GRPO) on the warm start a folder already holds.

Why: on 2 CPU cores the real loop spends about two thirds of its hour before PPO starts (the base model's
baselines and the SFT policy's evaluation on the 320 test questions, the expert, SFT), and none of it depends
on a PPO or GRPO setting. A user trying a PPO learning rate (docs/real_loop.md's levers) should pay for PPO
and its evaluation only, and should get the same summary, paired comparisons included, as a full run.

With `reuse_warm_start: true` (`searchrl demo --config configs/demo_real.yaml --reuse-warm-start`), a folder
whose `demo_config.yaml` has the same warm-start settings (every field but `NOT_WARM_START`) and which holds
the finished stages 4-7 (each baseline's and the SFT policy's test evaluation with their trajectories, the
demonstrations, `sft/sft_metrics.json` and the SFT policy) is read back; import, data and index are found or
rebuilt as in any run (seconds: deterministic from the seed); PPO, its evaluation, GRPO and the summary run
again, and the paired figures compare the new policies with the read-back trajectories of the same test
questions. Anything missing or trained otherwise: the demo says why and runs every stage.

PPO does not depend on how the process reached it: `PPOTrainer` seeds its generators from the PPO seed and the
SFT policy is read back from the float32 files the first run wrote (its PPO step scores come out the same).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.trajectory import Trajectory, read_trajectories
from searchrl.demo.layouts import BASELINE_FILES
from searchrl.demo.reuse import remove_paths, reused_summary, warm_stages_seconds, why_not_reusable
from searchrl.demo.summary import headline
from searchrl.models.io import load_policy
from searchrl.run.sources import read_json
from searchrl.run.writer import eval_trajectories_path

# RealDemoConfig fields that do not change stages 1-7: where the run goes, how fast, what comes after SFT.
# `generation.temperature` samples PPO's and GRPO's rollouts only: every evaluation of stages 4 and 7 is greedy
# and the expert's turns are forced.
NOT_WARM_START = ("out_dir", "num_threads", "ppo", "grpo", "progress_bar", "reuse_warm_start",
                  "generation.temperature")  # fmt: skip

# What a run writes after SFT's evaluation: removed before those stages run again (a new PPO run must not
# resume from, or append to, the old one).
AFTER_WARM_START = ("ppo", "grpo", "eval/ppo-test.json", "eval/ppo-test.trajectories.jsonl.gz", "eval/grpo-test.json",
                    "eval/grpo-test.trajectories.jsonl.gz", "summary.json")  # fmt: skip

# Stages 4-7's seconds in the run that trained the warm start (its summary's `stages_seconds`).
WARM_STAGES = ("import", "data", "index", "expert", "sft", "eval sft")


@dataclass
class RealWarmStart:
    """Stages 4-7 as a run left them: the baselines' and SFT's test evaluations (headline and trajectories),
    the demonstrations, SFT's facts and policy."""

    baselines: dict[str, Any]
    baseline_trajectories: dict[str, list[Trajectory]]
    demonstrations: list[Trajectory]
    sft_info: dict[str, Any]
    sft_summary: dict[str, Any]
    sft_trajectories: list[Trajectory]
    sft_policy_dir: Path
    stages_seconds: dict[str, float]

    def to_summary(self) -> dict[str, Any]:
        return reused_summary(self.sft_policy_dir, self.stages_seconds)

    def load_sft_policy(self) -> Any:
        """The SFT policy from its files, named by their absolute path (the PPO adapter records it as its
        base)."""
        policy = load_policy(self.sft_policy_dir)
        policy.config._name_or_path = policy.name_or_path = str(self.sft_policy_dir)
        return policy


def _required_files(cfg: Any, out: Path) -> list[Path]:
    evals = [out / "eval" / f"{BASELINE_FILES[name]}.json" for name in cfg.baselines]
    evals.append(out / "eval" / "sft-test.json")
    return [
        out / "demo_config.yaml",
        out / "sft" / "expert.jsonl.gz",
        out / "sft" / "sft_metrics.json",
        out / "sft" / "policy" / "config.json",
        out / "sft" / "policy" / "model.safetensors",
        *evals,
        *(eval_trajectories_path(p) for p in evals),
    ]


def find_real_warm_start(cfg: Any, out: Path) -> tuple[RealWarmStart | None, str]:
    """Stages 4-7 read back from `out` when `cfg` may reuse them; else None and the reason, for the user."""
    why = why_not_reusable(cfg, out, _required_files(cfg, out), NOT_WARM_START)
    if why:
        return None, why
    baselines: dict[str, Any] = {}
    baseline_trajectories: dict[str, list[Trajectory]] = {}
    for name in cfg.baselines:
        summary, trajectories = _read_eval(out / "eval" / f"{BASELINE_FILES[name]}.json")
        baselines[name] = {"test": headline(summary)}
        baseline_trajectories[name] = trajectories
    sft_summary, sft_trajectories = _read_eval(out / "eval" / "sft-test.json")
    seconds = warm_stages_seconds(read_json(out / "summary.json") or {}, WARM_STAGES, prefixes=("base ",))
    return RealWarmStart(
        baselines=baselines,
        baseline_trajectories=baseline_trajectories,
        demonstrations=read_trajectories(out / "sft" / "expert.jsonl.gz"),
        sft_info=read_json(out / "sft" / "sft_metrics.json") or {},
        sft_summary=sft_summary,
        sft_trajectories=sft_trajectories,
        sft_policy_dir=(out / "sft" / "policy").resolve(),
        stages_seconds=seconds,
    ), ""


def _read_eval(path: Path) -> tuple[dict[str, Any], list[Trajectory]]:
    return read_json(path) or {}, read_trajectories(eval_trajectories_path(path))


def clear_after_warm_start(out: Path) -> None:
    """Remove what stages 8 and later wrote in an earlier run of this folder (`AFTER_WARM_START`)."""
    remove_paths(out, AFTER_WARM_START)
