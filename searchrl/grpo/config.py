"""`GRPORunConfig`: every setting of a `searchrl grpo` run, as one YAML-loadable dataclass.

Why a config of our own instead of TRL's `GRPOConfig` directly: a GRPO run here needs the same settings as
a PPO run (model and data paths, search engine, episode budgets, sampling, batch, evaluation) so that the two
compare on equal terms, and TRL's config turns bf16 on by default, which breaks CPU runs. Those shared
settings are the sections of `searchrl.sections`, the very declarations `PPOConfig` inherits, so the two
trainers cannot drift apart; what only GRPO has follows TRL's `GRPOConfig` (`num_generations`, `beta`,
`epsilon`, `loss_type`, `scale_rewards`, ...). `to_trl_args()` maps the run onto TRL 1.16's `GRPOConfig`
with the CPU caveats of `reference/trl.md` §6 applied (`bf16=False`, `use_cpu` on a CPU box,
`gradient_checkpointing=False`, TRL's own checkpointing and evaluation off: ours write the run directory);
`report_to` and `run_name` go through to TRL's loggers. `rollout_backend` (the generation section's) picks
`our_rollout`'s engine; `trl_loop` refuses "vllm": TRL generates there with its own engine.

Batch arithmetic is TRL's: one optimizer step consumes `per_device_train_batch_size *
gradient_accumulation_steps` completions (episodes), i.e. that many divided by `num_generations`
questions, each answered `num_generations` times; `max_steps` optimizer steps, or
`ceil(total_episodes / episodes_per_step)` when `total_episodes` is given (the PPO budget unit).

A GRPO run with a PPO run's settings (the demo's side-by-side):
`searchrl.sections.with_sections_of(GRPORunConfig, ppo_config, mode="trl_loop", output_dir=...)`.

Load with `searchrl.common.config.load_config(GRPORunConfig, "configs/grpo_tiny.yaml", overrides)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, ClassVar, Literal

from searchrl.common.config import ConfigError, help_text
from searchrl.common.trl_args import cpu_safe_trainer_kwargs
from searchrl.sections import (
    DataSection,
    EnvironmentSection,
    GenerationSection,
    ModelSection,
    RunSection,
    SearchSection,
    TrainingSection,
)

GRPO_MODES = ("trl_loop", "our_rollout")
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "vespo", "luspo")
SCALE_REWARDS = ("group", "batch", "none")


@dataclass
class GRPORunConfig(
    RunSection,
    TrainingSection,
    GenerationSection,
    EnvironmentSection,
    SearchSection,
    DataSection,
    ModelSection,
):
    """All settings of `searchrl grpo`: the sections PPO shares, then TRL GRPOConfig's names for GRPO's own."""

    default_output_dir: ClassVar[str] = "runs/grpo"

    mode: Literal["trl_loop", "our_rollout"] = field(
        default="our_rollout",
        metadata=help_text(
            "'trl_loop': TRL's own tool loop over our SearchToolEnv (environment_factory); 'our_rollout': "
            "our batched rollout engine as rollout_func (one batched search per turn, no re-prefill)."
        ),
    )
    num_generations: int = field(
        default=4,
        metadata=help_text("Completions per question (the group); >= 2, divides the episodes per step."),
    )
    max_steps: int = field(
        default=10, metadata=help_text("Optimizer steps; ignored when total_episodes is set.")
    )
    beta: float = field(
        default=0.0,
        metadata=help_text("KL coefficient to the reference model; 0 (TRL's default) loads no reference."),
    )
    epsilon: float = field(default=0.2, metadata=help_text("Clip range of the importance ratio."))
    num_iterations: int = field(
        default=1, metadata=help_text("Optimisation passes per generation batch (TRL's mu).")
    )
    loss_type: str = field(
        default="dapo", metadata=help_text(f"TRL loss aggregation; one of {list(LOSS_TYPES)}.")
    )
    scale_rewards: str = field(
        default="group", metadata=help_text(f"Advantage scaling; one of {list(SCALE_REWARDS)}.")
    )
    eval_batch_size: int = field(default=16, metadata=help_text("Episodes per evaluation rollout batch."))

    def check(self) -> None:
        """GRPO's own fields (the sections check theirs: `searchrl.common.config.check_sections`)."""
        _choice(self.mode, "mode", GRPO_MODES)
        _choice(self.loss_type, "loss_type", LOSS_TYPES)
        _choice(self.scale_rewards, "scale_rewards", SCALE_REWARDS)
        for name in ("num_iterations", "eval_batch_size"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.num_generations < 2:
            raise ConfigError(
                f"num_generations: GRPO needs at least 2 completions per question to form a group, "
                f"got {self.num_generations}"
            )
        if self.episodes_per_step % self.num_generations:
            raise ConfigError(
                f"num_generations={self.num_generations} must divide per_device_train_batch_size * "
                f"gradient_accumulation_steps = {self.episodes_per_step}; change either"
            )
        if self.total_episodes is None and self.max_steps < 1:
            raise ConfigError(f"max_steps: must be >= 1 (or set total_episodes), got {self.max_steps}")
        for name in ("beta", "epsilon"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name}: must be a finite number >= 0, got {value}")
        if self.mode == "trl_loop" and self.rollout_backend == "vllm":
            raise ConfigError(
                'rollout_backend: "vllm" needs mode: our_rollout. In trl_loop TRL generates with its own engine: '
                "TRL's use_vllm (its VLLMGeneration) is another engine than searchrl's VLLMGenerator, and searchrl "
                "does not turn it on (untested with our environment_factory). Use mode: our_rollout for vLLM "
                'rollouts, or rollout_backend: "hf" for TRL\'s loop.'
            )
        if self.mode == "trl_loop" and self.protocol != "chat":
            raise ConfigError(
                f"protocol: {self.protocol!r} needs mode: our_rollout; TRL's tool loop (trl_loop) parses only "
                "the chat protocol's <tool_call> blocks"
            )

    # -- derived ----------------------------------------------------------------------------------
    @property
    def num_steps(self) -> int:
        """Optimizer steps of the run: from the episode budget when one is given, else `max_steps`."""
        if self.total_episodes is not None:
            return max(1, math.ceil(self.total_episodes / self.episodes_per_step))
        return self.max_steps

    def to_trl_args(self, cuda_available: bool = False) -> Any:
        """TRL 1.16's `GRPOConfig` for this run (CPU-safe; our callbacks own checkpoints and evaluation)."""
        from trl import GRPOConfig

        on_cpu = self.use_cpu or not cuda_available
        common = cpu_safe_trainer_kwargs(use_cpu=on_cpu)
        common["report_to"] = self.loggers or "none"  # the loggers log what TRL logs, at its steps
        return GRPOConfig(
            output_dir=str(self.run_dir / "trl"),
            run_name=self.run_name or self.run_dir.name,
            seed=self.seed,
            max_steps=self.num_steps,
            per_device_train_batch_size=self.per_device_train_batch_size,
            gradient_accumulation_steps=self.gradient_accumulation_steps,
            num_generations=self.num_generations,
            max_completion_length=self.max_episode_tokens,
            max_tool_calling_iterations=max(1, self.max_turns - 1),
            temperature=self.temperature,
            top_p=self.top_p,
            top_k=self.top_k,
            beta=self.beta,
            epsilon=self.epsilon,
            num_iterations=self.num_iterations,
            loss_type=self.loss_type,
            scale_rewards=self.scale_rewards,
            learning_rate=self.learning_rate,
            lr_scheduler_type=self.lr_scheduler_type,
            warmup_steps=self.warmup_steps,
            max_grad_norm=0.0
            if self.max_grad_norm is None
            else self.max_grad_norm,  # 0: transformers clips none
            weight_decay=self.weight_decay,
            logging_steps=self.logging_steps,
            eval_strategy="no",
            gradient_checkpointing=False,
            remove_unused_columns=False,
            **common,
        )


def _choice(value: str, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {list(choices)}")
