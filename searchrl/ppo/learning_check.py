"""Is this run learning? The signature of a PPO run that trains for its whole budget and changes nothing.

Issue 25 met it on a demo seed: dev exact match the same at every evaluation, the greedy policy giving the
same answer to every dev question from start to end, KL to the reference about 0.01, the clip fraction
near 0: the updates were too small to flip a single greedy decision. Nothing crashed and the collapse guard
had nothing to say (it watches for a run that falls, not one that stays). This check says so, at every dev
evaluation, in the metrics line and `eval/step-N.json`:

- `eval/answers_changed`: the share of dev questions whose answer differs from the first evaluation's
  (the starting policy with `eval_on_start`);
- `eval/not_learning`: 1.0 from the second half of training on when no answer changed, the dev exact match
  is the first evaluation's and the mean `objective/kl` so far is below `NOT_LEARNING_KL`; else 0.0. The
  first time it fires, a warning names the usual cause (the policy's learning rate) and what to try.

A first evaluation with no answer right gets a warning of its own: a warm start that never learned to
answer (issue 25's seed 9) leaves PPO no answer reward to learn from.

The demo's summary and report show both (`ppo.learning`). The first evaluation's answers are checkpointed,
so a resumed run compares with the same start.
"""

from __future__ import annotations

import logging
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.run.sources import read_metric_lines

logger = logging.getLogger(__name__)

NOT_LEARNING_KL = 0.01  # mean objective/kl below which the policy has barely moved from its reference


@dataclass
class LearningCheck:
    """The first dev evaluation (answers per question, exact match) and whether the warning was given."""

    first_answers: dict[str, str] | None = None
    first_exact_match: float | None = None
    warned: bool = field(default=False)

    def after_evaluation(
        self,
        answers: dict[str, str],
        metrics: dict[str, float],
        step: int,
        total_steps: int,
        kls: list[float],
    ) -> dict[str, float]:
        """The two metrics for this evaluation (see the module docstring)."""
        if self.first_answers is None:
            self.first_answers = dict(answers)
            self.first_exact_match = metrics.get("eval/exact_match")
            if self.first_exact_match == 0.0 and answers:
                logger.warning(
                    "the starting policy answers none of the %d dev questions right: if its training episodes "
                    "fare the same, every answer reward is 0 and PPO has nothing to learn from. Check the warm "
                    "start first (the demo's sft.answer_copy_rate, its SFT loss).",
                    len(answers),
                )
            return {"eval/answers_changed": 0.0, "eval/not_learning": 0.0}
        shared = [key for key in answers if key in self.first_answers]
        changed = sum(answers[key] != self.first_answers[key] for key in shared) / max(1, len(shared))
        out = {"eval/answers_changed": changed, "eval/not_learning": 0.0}
        if 2 * step < total_steps or self.first_exact_match is None:
            return out
        mean_kl = statistics.fmean(kls) if kls else 0.0
        flat = abs(metrics.get("eval/exact_match", 0.0) - self.first_exact_match) < 1e-12
        if changed == 0.0 and flat and mean_kl < NOT_LEARNING_KL:
            out["eval/not_learning"] = 1.0
            if not self.warned:
                self.warned = True
                logger.warning(
                    "PPO is not learning: at step %d of %d no dev answer changed since the first evaluation, "
                    "dev exact match is still %.3f and the mean KL is %.4f (< %.2f). The updates are too small "
                    "to change a greedy decision: raise learning_rate (the policy's), or check that rewards "
                    "differ within a batch (objective/scores' spread) and that the critic explains them "
                    "(val/explained_variance).",
                    step, total_steps, self.first_exact_match, mean_kl, NOT_LEARNING_KL,
                )  # fmt: skip
        return out

    def state_dict(self) -> dict[str, Any]:
        return {"first_answers": self.first_answers, "first_exact_match": self.first_exact_match,
                "warned": self.warned}  # fmt: skip

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        state = state or {}
        self.first_answers = state.get("first_answers")
        self.first_exact_match = state.get("first_exact_match")
        self.warned = bool(state.get("warned", False))


def logged_kls(metrics_file: Path, current: dict[str, float]) -> list[float]:
    """`objective/kl` of every step logged so far in `metrics_file`, and of the step not yet logged."""
    kls = [
        float(v)
        for row in read_metric_lines(metrics_file)
        if isinstance(v := row.get("objective/kl"), int | float)
    ]
    if isinstance(current.get("objective/kl"), int | float):
        kls.append(float(current["objective/kl"]))
    return kls
