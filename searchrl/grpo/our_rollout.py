"""`our_rollout` mode: our batched multi-turn engine as TRL's `rollout_func`.

Why: TRL's tool loop re-prefills the whole history every tool turn and runs tool calls one sample at a time;
our engine (`searchrl.rollout`) decodes a batch over one KV cache and makes one batched search per turn. TRL
1.16 lets a `rollout_func(prompts, trainer)` replace its generation: `EngineRollout` returns per row the
`prompt_ids`, `completion_ids` (actions and observations, exactly the trajectory's tokens), the sampling
`logprobs` and `env_mask` (0 on every observation and template-glue token, TRL's tool-mask meaning), plus the
`Trajectory` itself as an extra field, which reaches the reward function (`RubricReward`) untouched.

The engine is the run's `rollout_backend` (`searchrl.rollout.backends.make_generator`, the factory PPO uses):
`HFGenerator` decodes with the policy itself; `VLLMGenerator` holds its own copy of the weights, so
`EngineWeightSync` pushes the policy's weights into it at the end of every optimizer step, as PPO does after
its update. One engine serves the whole run (it caches the template glue), and the dev evaluation too when
it is vLLM.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from transformers import TrainerCallback

from searchrl.env.environment import SearchEnvironment
from searchrl.grpo.dataset import ROW_COLUMNS
from searchrl.grpo.record import BatchRecord
from searchrl.rollout.backends import make_generator, sync_engine_weights
from searchrl.rollout.loop import GenerationConfig

if TYPE_CHECKING:
    from trl import GRPOTrainer


class EngineRollout:
    """`rollout_func(prompts, trainer)`: one batched multi-turn rollout of our engine per generation batch.

    Returns per row `prompt_ids`, `completion_ids` (actions and observations, exactly the trajectory's
    tokens after the prompt), `logprobs` (the sampling logprobs, 0.0 on observation tokens), `env_mask`
    (the trajectory's action mask after the prompt: 0 on every observation/glue token) and `trajectory`.
    The batch's rows come from `record` (`SearchGRPOTrainer` writes them there), and `record.rollout_calls`
    counts the batches (each one's sampling seed). `generator_factory(model, tokenizer, generation_config)`
    starts the engine (default: `make_generator`, HF).
    """

    def __init__(
        self,
        tokenizer: Any,
        env_factory: Callable[[], SearchEnvironment],
        generation_config: GenerationConfig,
        record: BatchRecord,
        generator_factory: Callable[..., Any] = make_generator,
    ) -> None:
        self.tokenizer = tokenizer
        self.env_factory = env_factory
        self.generation_config = generation_config
        self.record = record
        self.generator_factory = generator_factory
        self.last_stats: dict[str, float] = {}
        self._generator: Any = None

    def engine(self, model: Any) -> Any:
        """The run's one engine over `model`, started on first use (or when the trainer's model changes)."""
        if self._generator is None or self._generator.model is not model:
            self._generator = self.generator_factory(model, self.tokenizer, self.generation_config)
        return self._generator

    def sync_weights(self) -> bool:
        """Push the policy's weights into an engine that holds its own copy (vLLM); True when it did."""
        return self._generator is not None and sync_engine_weights(self._generator, self._generator.model)

    def __call__(self, prompts: list[Any], trainer: GRPOTrainer) -> dict[str, Any]:
        """TRL's `rollout_func(prompts, trainer)`: the policy is `trainer`'s model."""
        rows = self.record.rows
        if rows is None or len(rows) != len(prompts):
            raise RuntimeError(
                "EngineRollout needs the batch rows: SearchGRPOTrainer writes them into the record it shares "
                "(build_grpo_trainer)"
            )
        model = trainer.accelerator.unwrap_model(trainer.model)
        # A new seed per generation batch: the same seed would repeat the same samples every step.
        calls = self.record.rollout_calls
        sampling = self.generation_config.sampling(seed=self.generation_config.seed * 1_000_003 + calls)
        self.record.rollout_calls += 1
        generator = self.engine(model)  # the model follows the trainer; the seed goes with the call
        env_rows = [{k: row[k] for k in ROW_COLUMNS if k in row} for row in rows]
        batch = generator.rollout([self.env_factory() for _ in rows], env_rows, sampling)
        self.last_stats = dict(batch.stats)
        trajectories = batch.trajectories
        return {
            "prompt_ids": [t.input_ids[: t.prompt_length] for t in trajectories],
            "completion_ids": [t.input_ids[t.prompt_length :] for t in trajectories],
            "logprobs": [t.logprobs[t.prompt_length :] for t in trajectories],
            "env_mask": [t.action_mask[t.prompt_length :] for t in trajectories],
            "trajectory": trajectories,
        }


class EngineWeightSync(TrainerCallback):
    """At the end of every optimizer step (transformers' `on_optimizer_step`, right after `optimizer.step()`),
    the policy's new weights go into `rollout`'s engine when it holds its own copy (vLLM); a no-op for HF."""

    def __init__(self, rollout: EngineRollout) -> None:
        self.rollout = rollout

    def on_optimizer_step(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.rollout.sync_weights()
