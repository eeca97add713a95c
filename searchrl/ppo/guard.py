"""The collapse guard: the most common complaint in search-agent RL is a run that collapses (entropy to zero,
KL exploding, format broken, reward falling, NaN in the passes) unnoticed. `CollapseGuard` watches the mean
of a window of steps' metrics and says why a bound was crossed; the trainer then rolls back to the last good
checkpoint and lowers the learning rate (`PPOTrainer._collapse_check`). Its state is checkpointed.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from searchrl.ppo.config import PPOConfig

# ---------------------------------------------------------------------------------------------


class CollapseGuard:
    def __init__(self, args: PPOConfig):
        self.args = args
        self.history: list[dict[str, float]] = []
        self.best_reward: float | None = None
        self.format_baseline: float | None = None  # format validity at the run's first step
        self.entropy_baseline: float | None = None  # entropy per action token at the run's first step

    def check(self, metrics: dict[str, float]) -> str | None:
        """Return why the run is collapsing, or None when it is healthy."""
        a = self.args
        self.history.append(metrics)
        window = self.history[-a.collapse_window :]
        mean = {k: float(np.mean([m[k] for m in window if k in m])) for k in window[-1]}
        reasons = []
        if self.entropy_baseline is None and "objective/entropy_per_token" in metrics:
            self.entropy_baseline = float(metrics["objective/entropy_per_token"])
        floor = self.entropy_floor()
        if floor is not None and mean.get("objective/entropy_per_token", 1e9) < floor:
            reasons.append(
                f"entropy per action token {mean['objective/entropy_per_token']:.3g} < {floor:.3g}"
            )
        if a.collapse_kl_max is not None and mean.get("objective/kl", 0.0) > a.collapse_kl_max:
            reasons.append(f"KL to reference {mean['objective/kl']:.3g} > {a.collapse_kl_max}")
        if a.collapse_format_min is not None and mean.get("reward/format", 1.0) < a.collapse_format_min:
            reasons.append(f"format validity {mean['reward/format']:.3g} < {a.collapse_format_min}")
        if self.format_baseline is None and "reward/format" in metrics:
            self.format_baseline = float(metrics["reward/format"])
        drop, start = a.collapse_format_drop, self.format_baseline
        if drop is not None and start is not None and mean.get("reward/format", start) < start - drop:
            reasons.append(
                f"format validity {mean['reward/format']:.3g} fell more than {drop} below its start {start:.3g}"
            )
        score = mean.get("objective/scores")
        if score is not None:
            drop = a.collapse_reward_drop
            if drop is not None and self.best_reward is not None and score < self.best_reward - drop:
                reasons.append(f"reward {score:.3g} fell more than {drop} below best {self.best_reward:.3g}")
            if not reasons:
                self.best_reward = score if self.best_reward is None else max(self.best_reward, score)
        for k in ("loss/policy_avg", "loss/value_avg"):
            if k in metrics and not math.isfinite(metrics[k]):
                reasons.append(f"{k} is not finite")
        for k in ("health/nonfinite_logprobs", "health/skipped_updates"):
            if metrics.get(k, 0.0) > 0:
                reasons.append(f"{k} = {metrics[k]:g} (NaN or inf in the forward or backward pass)")
        return "; ".join(reasons) or None

    def entropy_floor(self) -> float | None:
        """`collapse_entropy_min`, or half the first step's entropy when the starting policy is already below it.

        A confident warm start (the demo's: 0.017 nats per action token, most tokens copied) is not a collapse;
        entropy falling to half of where the run began is. The first step's rollouts come from the starting
        weights, so that step sets the baseline and can never trip this bound.
        """
        floor = self.args.collapse_entropy_min
        if floor is None or self.entropy_baseline is None:
            return floor
        return min(floor, 0.5 * self.entropy_baseline)

    def reset_window(self) -> None:
        self.history.clear()

    def state_dict(self) -> dict:
        return {
            "history": self.history,
            "best_reward": self.best_reward,
            "format_baseline": self.format_baseline,
            "entropy_baseline": self.entropy_baseline,
        }

    def load_state_dict(self, d: dict) -> None:
        self.history = list(d.get("history", []))
        self.best_reward = d.get("best_reward")
        self.format_baseline = d.get("format_baseline")
        self.entropy_baseline = d.get("entropy_baseline")


def rescale_learning_rates(optimizer: Any, lr_scheduler: Any, factor: float) -> None:
    """Multiply the current and the scheduled (base) learning rates of every param group by `factor` (the
    guard's cut after a rollback; the scheduler keeps its place in the schedule)."""
    for g in optimizer.param_groups:
        g["lr"] *= factor
        if "initial_lr" in g:
            g["initial_lr"] *= factor
    if hasattr(lr_scheduler, "base_lrs"):
        lr_scheduler.base_lrs = [lr * factor for lr in lr_scheduler.base_lrs]
        lr_scheduler._last_lr = [g["lr"] for g in optimizer.param_groups]
