"""The collapse guard: the most common complaint in search-agent RL is a run that collapses (entropy to zero,
KL exploding, format broken, reward falling, NaN in the passes) unnoticed. `CollapseGuard` watches the mean
of a window of steps' metrics and says why a bound was crossed. After each step it decides
(`CollapseGuard.decide`) and returns a `GuardDecision`: go on, roll back to the last good checkpoint with a
lower learning rate, or give up; `PPOTrainer.train` carries the decision out, in one place. Its state is
checkpointed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from searchrl.ppo.config import PPOConfig
from searchrl.run.writer import step_of

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class GuardDecision:
    """What the collapse guard decided after a step; `PPOTrainer.train` carries it out.

    The failed step's metrics line keeps the decision's `metrics` (`guard/*`: why, and what was done); after
    a rollback `step` restarts from the checkpoint's step, so the log's `step` column can repeat.
    """

    action: Literal["continue", "roll_back", "give_up"] = field(
        default="continue",
        metadata={"help": "continue (healthy, guard off, or nothing to roll back to), roll_back or give_up."},
    )
    reason: str | None = field(default=None, metadata={"help": "Why the guard fired; None when it did not."})
    metrics: Mapping[str, float | str] = field(
        default_factory=dict, metadata={"help": "The guard/* keys this step's metrics line gets."}
    )
    checkpoint: Path | None = field(default=None, metadata={"help": "roll_back: the checkpoint to load."})
    rollbacks: int = field(default=0, metadata={"help": "roll_back: the run's rollbacks, this one included."})
    lr_scale: float = field(
        default=1.0, metadata={"help": "roll_back: both learning rates' scale, this cut included."}
    )
    message: str = field(default="", metadata={"help": "give_up: the error the run stops with."})


class CollapseGuard:
    """The collapse bounds of `args` over a window of steps (`check`), and what to do about it (`decide`)."""

    def __init__(self, args: PPOConfig):
        self.args = args
        self.history: list[dict[str, float]] = []
        self.best_reward: float | None = None
        self.format_baseline: float | None = None  # format validity at the run's first step
        self.entropy_baseline: float | None = None  # entropy per action token at the run's first step
        self.score_baseline: float | None = None  # mean score at the run's first step

    def check(self, metrics: dict[str, float]) -> str | None:
        """Return why the run is collapsing, or None when it is healthy."""
        a = self.args
        self.history.append(metrics)
        window = self.history[-a.collapse_window :]
        mean = {k: float(np.mean([m[k] for m in window if k in m])) for k in window[-1]}
        reasons = []
        if self.entropy_baseline is None and "objective/entropy_per_token" in metrics:
            self.entropy_baseline = float(metrics["objective/entropy_per_token"])
        if self.score_baseline is None and "objective/scores" in metrics:
            self.score_baseline = float(metrics["objective/scores"])
        floor = self.entropy_floor()
        if floor is not None and mean.get("objective/entropy_per_token", 1e9) < floor:
            low = f"entropy per action token {mean['objective/entropy_per_token']:.3g} < {floor:.3g}"
            if self._score_rose(mean):
                logger.info("collapse guard: %s, but the mean score %.3g is above its start %.3g: the policy "
                            "settles on what pays, not a collapse", low, mean["objective/scores"],
                            self.score_baseline)  # fmt: skip
            else:
                reasons.append(low)
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

    def decide(
        self, metrics: dict[str, Any], step: int, last_good: Path | None, rollbacks: int, lr_scale: float
    ) -> GuardDecision:
        """After step `step` (under `collapse_guard`): roll back to `last_good` with the learning rates cut by
        `collapse_lr_decay` (the cut compounds: after n rollbacks they are `collapse_lr_decay ** n` of the
        schedule's), or give up after `collapse_max_rollbacks`. Nothing to do when the run is healthy or
        there is no checkpoint to go back to; and no rollback when this step's rollouts were sampled by the
        last good weights themselves (it would redo the same rollouts, same step and seed, from the same
        weights): the reason is logged and the run goes on. `rollbacks` and `lr_scale` are the run's so far.
        """
        a = self.args
        if not a.collapse_guard:
            return GuardDecision()
        reason = self.check({k: v for k, v in metrics.items() if isinstance(v, int | float)})
        if reason is None or last_good is None:
            return GuardDecision()
        target = step_of(last_good.name)
        if target == step - 1:
            logger.warning("collapse guard: %s at step %d, on the last good weights' own rollouts: no rollback",
                           reason, step)  # fmt: skip
            return GuardDecision(reason=reason, metrics={"guard/reason": reason, "guard/no_rollback": 1.0})
        if rollbacks >= a.collapse_max_rollbacks:
            message = (
                f"collapse guard: the run collapsed again at step {step} ({reason}) after {rollbacks} rollbacks "
                f"(collapse_max_rollbacks={a.collapse_max_rollbacks}); lower learning_rate, raise kl_coef, or "
                "loosen the collapse_* bounds"
            )
            metrics_line = {"guard/reason": reason, "guard/gave_up": 1.0}
            return GuardDecision("give_up", reason, metrics_line, message=message)
        rollbacks, lr_scale = rollbacks + 1, lr_scale * a.collapse_lr_decay
        metrics_line = {
            "guard/rollback": 1.0,
            "guard/rollbacks": float(rollbacks),
            "guard/lr_scale": lr_scale,
            "guard/rolled_back_to_step": float(target),
            "guard/failed_step": float(step),
            "guard/reason": reason,
        }
        return GuardDecision("roll_back", reason, metrics_line, last_good, rollbacks, lr_scale)

    def _score_rose(self, mean: dict[str, float]) -> bool:
        """The window's mean score is above the first step's (the starting policy's): low entropy then is the
        policy growing sure of what pays, not a collapse. Measured on the support demo (seed 0): PPO raised the
        score from 0.85 to 1.2-1.4 while entropy fell from 0.054 to 0.027 nats a token, and a floor at half the
        start rolled the run back three times on its best weights and stopped it at step 77 of 80."""
        score = mean.get("objective/scores")
        return score is not None and self.score_baseline is not None and score > self.score_baseline

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
            "score_baseline": self.score_baseline,
        }

    def load_state_dict(self, d: dict) -> None:
        self.history = list(d.get("history", []))
        self.best_reward = d.get("best_reward")
        self.format_baseline = d.get("format_baseline")
        self.entropy_baseline = d.get("entropy_baseline")
        self.score_baseline = d.get("score_baseline")


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
