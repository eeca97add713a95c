"""GRPO's reward: our `Rubric` behind TRL's reward-function signature, with the metrics PPO logs.

Why: both trainers must be scored by the same rubric on the same `Trajectory`, or a comparison says nothing.
`RubricReward` takes each rollout's trajectory (`our_rollout`: the `trajectory` extra field of
`EngineRollout`; `trl_loop`: rebuilt by `trajectory_from_trl` from the trainer's last generation and the
`environments=` TRL passes), scores it, and logs through TRL's `log_metric` the reward breakdown, the
environment's tool statistics, terminations, exact match and the stability kit's likelihood monitors
(`searchrl.common.health`, PPO's names) from the rollouts' sampling logprobs. It keeps the training batch's
trajectories for the run directory (`RunDirCallback`) until `pop_trajectories()`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from searchrl.common.health import likelihood_metrics, trajectory_logprobs
from searchrl.common.trajectory import Trajectory
from searchrl.grpo.trl_loop import trajectory_from_trl
from searchrl.rewards.combine import Rubric, mean_breakdown
from searchrl.rewards.qa import answered_right, exact_match
from searchrl.rollout.stats import termination_stats, tool_stats

if TYPE_CHECKING:
    from searchrl.grpo.trainer import SearchGRPOTrainer


def sampling_likelihood_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The stability kit's likelihood monitors (`searchrl.common.health`, PPO's names) from the sampling
    logprobs each rollout returned: our engine's in `our_rollout`, TRL's generation's in `trl_loop` when it
    has them (vLLM; TRL's transformers generation returns none, and those episodes are left out)."""
    sampled = [t for t in trajs if t.metadata.get("sampling_logprobs", True)]
    if not sampled:
        return {}
    logprobs, mask = trajectory_logprobs(sampled)
    return likelihood_metrics(logprobs, mask, answered_right(sampled))


class RubricReward:
    """TRL reward function scoring each completion's Trajectory with a `Rubric`; logs breakdown and tools.

    our_rollout: the trajectories arrive as the `trajectory` extra field of `EngineRollout`.
    trl_loop: they are rebuilt (`trajectory_from_trl`) from the trainer's last generation and the
    `environments=` TRL passes. Training-batch trajectories are kept for the run directory until
    `pop_trajectories()`.
    """

    def __init__(self, rubric: Rubric, tokenizer: Any) -> None:
        self.__name__ = "rubric"  # TRL names the reward column after it
        self.rubric = rubric
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.trainer: SearchGRPOTrainer | None = None
        self.episodes = 0
        self._pending: list[Trajectory] = []

    def __call__(
        self,
        prompts: list[Any],
        completions: list[Any],
        completion_ids: list[list[int]],
        trajectory: list[Trajectory] | None = None,
        environments: list[Any] | None = None,
        log_metric: Callable[[str, float], None] | None = None,
        **row_columns: Any,
    ) -> list[float]:
        trajs = (
            list(trajectory) if trajectory is not None else self._rebuild(prompts, completions, environments)
        )
        scores = [float(self.rubric.score(t)[0]) for t in trajs]
        if log_metric is not None:
            for name, value in self.batch_metrics(trajs).items():
                log_metric(name, value)
        if self.trainer is None or self.trainer.model.training:
            self.episodes += len(trajs)
            self._pending.extend(trajs)
        return scores

    @staticmethod
    def batch_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
        """Reward breakdown, the environment's tool statistics and terminations, batch means."""
        out = dict(mean_breakdown(trajs))
        out.update(tool_stats(trajs))
        out.update(termination_stats(trajs))
        out["answer/exact_match"] = sum(exact_match(t.answer or "", t.golds) for t in trajs) / max(
            1, len(trajs)
        )
        out.update(sampling_likelihood_metrics(trajs))
        return out

    def pop_trajectories(self) -> list[Trajectory]:
        out, self._pending = self._pending, []
        return out

    def _rebuild(
        self, prompts: list[Any], completions: list[Any], environments: list[Any] | None
    ) -> list[Trajectory]:
        trainer = self.trainer
        if trainer is None or trainer.last_generation is None or environments is None:
            raise RuntimeError(
                "RubricReward got no trajectories: in trl_loop mode bind it to a SearchGRPOTrainer "
                "(reward.trainer = trainer) and use our SearchToolEnv environment_factory"
            )
        gen = trainer.last_generation
        rows = trainer.current_inputs or [{} for _ in prompts]
        trajs = []
        for i, (prompt, completion, env) in enumerate(zip(prompts, completions, environments, strict=True)):
            trajs.append(
                trajectory_from_trl(
                    rows[i],
                    prompt,
                    completion,
                    gen["prompt_ids"][i],
                    gen["completion_ids"][i],
                    gen["tool_mask"][i] if gen["tool_mask"] is not None else None,
                    gen["logprobs"][i] if gen["logprobs"] is not None else None,
                    env.environment,
                    self.eos_token_id,
                    index=i,
                )
            )
        return trajs
