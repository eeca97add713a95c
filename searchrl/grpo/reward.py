"""GRPO's reward: our `Rubric` behind TRL's reward-function signature, with the metrics PPO logs.

Why: both trainers must be scored by the same rubric on the same `Trajectory`, or a comparison says nothing.
`RubricReward` takes each rollout's trajectory (`our_rollout`: the `trajectory` extra field of
`EngineRollout`; `trl_loop`: rebuilt by `trajectory_from_trl` from the batch's rows and TRL's token-level
output in the shared `BatchRecord`, and the `environments=` TRL passes), scores it, and logs through TRL's
`log_metric` the reward breakdown, the environment's tool statistics, terminations, exact match and the
stability kit's likelihood monitors (`searchrl.common.health`, PPO's names) from the rollouts' sampling
logprobs. Training episodes are counted, and their trajectories kept for the run directory
(`RunDirCallback`), in the record.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from searchrl.common.health import likelihood_metrics, trajectory_logprobs
from searchrl.common.trajectory import Trajectory
from searchrl.grpo.record import BatchRecord
from searchrl.grpo.trl_loop import trajectory_from_trl
from searchrl.rewards.combine import Rubric, mean_breakdown
from searchrl.rewards.qa import answered_right, exact_match
from searchrl.rollout.stats import termination_stats, tool_stats


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
    trl_loop: they are rebuilt (`trajectory_from_trl`) from `record` (the batch's rows and TRL's token-level
    output, which `SearchGRPOTrainer` writes there) and the `environments=` TRL passes. Training episodes
    are counted in `record.episodes` and their trajectories kept in `record.trajectories` for the run
    directory.
    """

    def __init__(self, rubric: Rubric, tokenizer: Any, record: BatchRecord) -> None:
        self.__name__ = "rubric"  # TRL names the reward column after it
        self.rubric = rubric
        self.eos_token_id = int(tokenizer.eos_token_id)
        self.record = record

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
        generation = self.record.generation
        if generation is None or generation.training:  # TRL's own evaluation batches are not episodes
            self.record.episodes += len(trajs)
            self.record.trajectories.extend(trajs)
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

    def _rebuild(
        self, prompts: list[Any], completions: list[Any], environments: list[Any] | None
    ) -> list[Trajectory]:
        gen = self.record.generation
        if gen is None or environments is None:
            raise RuntimeError(
                "RubricReward got no trajectories: in trl_loop mode it reads TRL's output from the record a "
                "SearchGRPOTrainer writes (build_grpo_trainer) and needs our SearchToolEnv environment_factory"
            )
        rows = self.record.rows or [{} for _ in prompts]
        trajs = []
        for i, (prompt, completion, env) in enumerate(zip(prompts, completions, environments, strict=True)):
            trajs.append(
                trajectory_from_trl(
                    rows[i],
                    prompt,
                    completion,
                    gen.prompt_ids[i],
                    gen.completion_ids[i],
                    gen.tool_mask[i] if gen.tool_mask is not None else None,
                    gen.logprobs[i] if gen.logprobs is not None else None,
                    env.environment,
                    self.eos_token_id,
                    index=i,
                )
            )
        return trajs
