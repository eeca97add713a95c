"""The collapse guard: the most common complaint in search-agent RL is a run that collapses (entropy to zero,
KL exploding, format broken, reward falling, NaN in the passes) unnoticed. `CollapseGuard` watches the mean
of a window of steps' metrics and says why a bound was crossed; the trainer then rolls back to the last good
checkpoint and lowers the learning rate (`roll_back_on_collapse`). Its state is checkpointed. `guard_step`
is what the trainer calls after each step.
"""

from __future__ import annotations

import logging
import math
from typing import Any

import numpy as np

from searchrl.ppo.config import PPOConfig
from searchrl.run.writer import step_of

logger = logging.getLogger(__name__)

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


def roll_back_on_collapse(trainer: Any, metrics: dict[str, Any]) -> bool:
    """Roll the trainer back to its last good checkpoint with a lower learning rate when the guard fires.

    The failed step's metrics stay in the log (with `guard/*` keys saying why); `step` then restarts from
    the checkpoint's step, so the log's `step` column can repeat after a rollback. The cut compounds: after
    n rollbacks both learning rates are `collapse_lr_decay ** n` of the schedule's.
    """
    reason = trainer.guard.check({k: v for k, v in metrics.items() if isinstance(v, int | float)})
    if reason is None or trainer.last_good_checkpoint is None:
        return False
    if step_of(trainer.last_good_checkpoint.name) == trainer.global_step - 1:
        # This step's rollouts were sampled by the last good weights themselves: rolling back would redo the
        # same rollouts (same step, same seed) from the same weights. Say so and go on.
        metrics["guard/reason"] = reason
        metrics["guard/no_rollback"] = 1.0
        logger.warning("collapse guard: %s at step %d, on the last good weights' own rollouts: no rollback",
                       reason, trainer.global_step)  # fmt: skip
        return False
    args = trainer.args
    if trainer.rollbacks >= args.collapse_max_rollbacks:
        if trainer.is_main:
            trainer.run.log_metrics({**metrics, "guard/reason": reason, "guard/gave_up": 1.0})
        raise RuntimeError(
            f"collapse guard: the run collapsed again at step {trainer.global_step} ({reason}) after "
            f"{trainer.rollbacks} rollbacks (collapse_max_rollbacks={args.collapse_max_rollbacks}); "
            "lower learning_rate, raise kl_coef, or loosen the collapse_* bounds"
        )
    failed_step = trainer.global_step
    rollbacks, lr_scale = trainer.rollbacks + 1, trainer.lr_scale * args.collapse_lr_decay
    trainer.load_checkpoint(trainer.last_good_checkpoint, restore_clock=False)
    trainer.unverified_checkpoint = None  # its weights produced the collapse
    # The checkpoint's scheduler already carries its own lr_scale: scale by the ratio only.
    rescale_learning_rates(trainer.optimizer, trainer.lr_scheduler, lr_scale / trainer.lr_scale)
    trainer.rollbacks, trainer.lr_scale = rollbacks, lr_scale
    trainer.guard.reset_window()
    metrics.update({
        "guard/rollback": 1.0,
        "guard/rollbacks": float(trainer.rollbacks),
        "guard/lr_scale": trainer.lr_scale,
        "guard/rolled_back_to_step": float(trainer.global_step),
        "guard/failed_step": float(failed_step),
        "guard/reason": reason,
    })  # fmt: skip
    return True


def guard_step(trainer: Any, metrics: dict[str, Any]) -> bool:
    """After each step: under `collapse_guard`, roll back when the guard fires (`roll_back_on_collapse`); else
    a checkpoint that waited for this step's check (`unverified_checkpoint`) becomes the rollback target.
    True when the step was rolled back."""
    rollback = trainer.args.collapse_guard and roll_back_on_collapse(trainer, metrics)
    if not rollback and trainer.unverified_checkpoint is not None:
        # This step's rollouts came from the unverified weights and passed the guard.
        trainer.last_good_checkpoint, trainer.unverified_checkpoint = trainer.unverified_checkpoint, None
    return bool(rollback)
