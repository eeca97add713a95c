"""`GRPORunConfig`: every setting of a `searchrl grpo` run, as one YAML-loadable dataclass.

Why a config of our own instead of TRL's `GRPOConfig` directly: a GRPO run here needs the same
settings as a PPO run (model and data paths, search backend, turn and token budgets, evaluation) so
that the two can be compared on equal terms, and TRL's config turns bf16 on by default, which breaks
CPU runs. The field names follow `searchrl.ppo.config.PPOConfig` where the two share a meaning, and
TRL's `GRPOConfig` for what only GRPO has (`num_generations`, `beta`, `epsilon`, `loss_type`,
`scale_rewards`). `to_trl_args()` maps the run onto TRL 1.16's `GRPOConfig` with the CPU caveats of
`reference/trl.md` §6 applied (`bf16=False`, `use_cpu` on a CPU box, `gradient_checkpointing=False`,
`report_to="none"`, TRL's own checkpointing and evaluation off: ours write the run directory).

Batch arithmetic is TRL's: one optimizer step consumes `per_device_train_batch_size *
gradient_accumulation_steps` completions (episodes), i.e. that many divided by `num_generations`
questions, each answered `num_generations` times; `max_steps` optimizer steps, or
`ceil(total_episodes / episodes_per_step)` when `total_episodes` is given (the PPO budget unit).

The environment and the rollout limits are derived with PPO's own code, not a copy of it:
`GRPORunConfig.env_config()` is `PPOConfig.env_config` applied to these fields (the names are PPO's), and
`searchrl.grpo.trainer.generation_config_for` is `searchrl.evaluation.evaluate.generation_config_from_ppo`.
`grpo_config_from_ppo(ppo, ...)` builds a GRPO run with a PPO run's settings (the demo's side-by-side).

Load with `searchrl.common.config.load_config(GRPORunConfig, "configs/grpo_tiny.yaml", overrides)`.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from searchrl.common.config import ConfigError
from searchrl.common.trl_args import cpu_safe_trainer_kwargs
from searchrl.ppo.config import PPOConfig

if TYPE_CHECKING:
    from searchrl.env.environment import EnvConfig

GRPO_MODES = ("trl_loop", "our_rollout")
LOSS_TYPES = ("dapo", "grpo", "bnpo", "dr_grpo", "cispo", "sapo", "vespo", "luspo")
SCALE_REWARDS = ("group", "batch", "none")
LR_SCHEDULER_TYPES = ("linear", "cosine", "constant", "constant_with_warmup")


def _help(text: str) -> dict[str, str]:
    return {"help": text}


@dataclass
class GRPORunConfig:
    """All settings of `searchrl grpo`; PPOConfig's names for shared settings, TRL's for GRPO-only ones."""

    # --- run -------------------------------------------------------------------------------------
    mode: Literal["trl_loop", "our_rollout"] = field(
        default="our_rollout",
        metadata=_help(
            "'trl_loop': TRL's own tool loop over our SearchToolEnv (environment_factory); 'our_rollout': "
            "our batched rollout engine as rollout_func (one batched search per turn, no re-prefill)."
        ),
    )
    output_dir: str = field(
        default="runs/grpo",
        metadata=_help("The run directory: config.yaml, manifest.json, metrics.jsonl, eval/, checkpoints/."),
    )
    seed: int = field(
        default=42, metadata=_help("Random seed of TRL's sampler, the model init and rollouts.")
    )

    # --- models ----------------------------------------------------------------------------------
    policy_model_path: str | None = field(
        default=None,
        metadata=_help(
            "Local directory of the starting policy (e.g. the SFT warm start). Required for `searchrl grpo`; "
            "TRL reloads the reference model from it when beta > 0."
        ),
    )
    tokenizer_path: str | None = field(
        default=None, metadata=_help("Local tokenizer directory; null: the policy's directory.")
    )
    reward_config_path: str | None = field(
        default=None,
        metadata=_help("Rubric YAML (see configs/rewards_default.yaml); null: the built-in default rubric."),
    )

    # --- data and search -------------------------------------------------------------------------
    train_file: str | None = field(
        default=None, metadata=_help("Training questions (JSONL with question and golds).")
    )
    dev_file: str | None = field(
        default=None, metadata=_help("Dev questions for evaluation during training (never the test split).")
    )
    index_dir: str | None = field(
        default=None, metadata=_help("Local search index directory (`searchrl index`); or set search_url.")
    )
    search_url: str | None = field(
        default=None, metadata=_help("URL of a `searchrl serve` retrieval server, instead of index_dir.")
    )
    topk: int = field(default=3, metadata=_help("Documents returned per search query (Search-R1 uses 3)."))
    search_timeout_s: float = field(
        default=5.0, metadata=_help("Deadline of one batched search, enforced even if the backend hangs.")
    )

    # --- episodes --------------------------------------------------------------------------------
    protocol: Literal["chat", "search_r1"] = field(
        default="chat",
        metadata=_help(
            "Tool-call protocol, as in PPOConfig: 'chat' (<tool_call> JSON, tool messages) or Search-R1's tags "
            "('search_r1', our_rollout only: TRL's tool loop speaks the chat protocol)."
        ),
    )
    max_turns: int = field(
        default=4,
        metadata=_help(
            "Most assistant turns per episode (trl_loop: max_tool_calling_iterations = this - 1)."
        ),
    )
    max_tool_calls: int = field(default=4, metadata=_help("Searches per episode; more get 'over budget'."))
    max_new_tokens_per_turn: int = field(
        default=64,
        metadata=_help("Longest turn (our_rollout; TRL's loop bounds each turn by max_episode_tokens only)."),
    )
    max_episode_tokens: int = field(
        default=1024,
        metadata=_help(
            "Tokens after the prompt, actions and observations (TRL's max_completion_length; PPOConfig's "
            "default, not TRL's 256, so both trainers' episodes have the same budget)."
        ),
    )
    max_observation_tokens: int = field(
        default=256, metadata=_help("Tokens per observation; longer ones are cut with '[... truncated]'.")
    )
    tool_schema_in_prompt: bool = field(
        default=True,
        metadata=_help(
            "Render the search tool's JSON schema into the prompt (the chat template's tool section); false "
            "keeps prompts short for tiny models (the system prompt shows one example call), in both modes."
        ),
    )
    citation_style: Literal["doc_id", "number"] = field(
        default="doc_id",
        metadata=_help(
            "How the environment labels documents and the policy cites them: 'doc_id' ([d000042]) or 'number' "
            "([1], [2], ... in the order the episode shows them, mapped back to document ids for rewards)."
        ),
    )
    system_prompt: str | None = field(
        default=None, metadata=_help("System prompt of every episode; null: the environment's default.")
    )
    temperature: float = field(
        default=1.0, metadata=_help("Sampling temperature of training rollouts (TRL scales logits by it).")
    )
    eval_temperature: float = field(default=0.0, metadata=_help("Temperature of evaluation; 0 = greedy."))
    top_p: float = field(default=1.0, metadata=_help("Nucleus sampling mass of training rollouts."))
    top_k: int = field(default=0, metadata=_help("Top-k of training rollouts; 0 disables it."))

    # --- GRPO ------------------------------------------------------------------------------------
    num_generations: int = field(
        default=4,
        metadata=_help("Completions per question (the group); >= 2, divides the episodes per step."),
    )
    per_device_train_batch_size: int = field(
        default=8, metadata=_help("Completions per micro-batch (TRL's meaning: includes the G repeats).")
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata=_help("Micro-batches per optimizer step (and per generation, TRL's default).")
    )
    max_steps: int = field(default=10, metadata=_help("Optimizer steps; ignored when total_episodes is set."))
    total_episodes: int | None = field(
        default=None, metadata=_help("Episode budget (PPO's unit); sets max_steps = ceil(total / per step).")
    )
    beta: float = field(
        default=0.0,
        metadata=_help("KL coefficient to the reference model; 0 (TRL's default) loads no reference."),
    )
    epsilon: float = field(default=0.2, metadata=_help("Clip range of the importance ratio."))
    num_iterations: int = field(
        default=1, metadata=_help("Optimisation passes per generation batch (TRL's mu).")
    )
    loss_type: str = field(
        default="dapo", metadata=_help(f"TRL loss aggregation; one of {list(LOSS_TYPES)}.")
    )
    scale_rewards: str = field(
        default="group", metadata=_help(f"Advantage scaling; one of {list(SCALE_REWARDS)}.")
    )

    # --- optimisation ----------------------------------------------------------------------------
    learning_rate: float = field(default=1e-6, metadata=_help("AdamW learning rate (TRL's default 1e-6)."))
    lr_scheduler_type: str = field(
        default="linear", metadata=_help(f"Learning-rate schedule; one of {list(LR_SCHEDULER_TYPES)}.")
    )
    warmup_steps: int = field(default=0, metadata=_help("Optimizer steps of linear warm-up."))
    max_grad_norm: float = field(default=1.0, metadata=_help("Gradient clipping norm."))
    weight_decay: float = field(default=0.0, metadata=_help("AdamW weight decay."))

    # --- logging, evaluation, checkpoints --------------------------------------------------------
    logging_steps: int = field(default=1, metadata=_help("Append metrics.jsonl every this many steps."))
    eval_steps: int = field(
        default=0,
        metadata=_help(
            "Evaluate on dev every this many steps and at the last step (RUN/eval/step-N.json); 0: never."
        ),
    )
    eval_on_start: bool = field(
        default=False, metadata=_help("Also evaluate the starting policy (step 0) before training.")
    )
    num_eval_questions: int = field(default=64, metadata=_help("Dev questions per evaluation."))
    eval_batch_size: int = field(default=16, metadata=_help("Episodes per evaluation rollout batch."))
    save_steps: int = field(
        default=0, metadata=_help("Write RUN/checkpoints/step-N every this many steps; the last step always.")
    )
    save_total_limit: int | None = field(
        default=None,
        metadata=_help("Keep only this many most recent checkpoints (never the best); null keeps all."),
    )
    best_metric: str | None = field(
        default="eval/reward",
        metadata=_help(
            "Keep the checkpoint of the dev evaluation with the highest value of this metric (eval/reward, "
            "eval/exact_match, ...), as PPOConfig does: written when reached, never pruned, named in "
            "RUN/best_checkpoint.json; null: off."
        ),
    )
    num_sample_generations: int = field(
        default=10,
        metadata=_help(
            "How many times over the run to write a few episodes as text to RUN/samples.jsonl; 0: never."
        ),
    )
    save_trajectories: bool = field(
        default=True, metadata=_help("Write each step's trajectories to RUN/trajectories/step-N.jsonl.gz.")
    )
    use_cpu: bool = field(default=False, metadata=_help("Train on CPU even when a GPU is available."))

    def __post_init__(self) -> None:
        self.validate()

    # -- validation -------------------------------------------------------------------------------
    def validate(self) -> None:
        _choice(self.mode, "mode", GRPO_MODES)
        _choice(self.loss_type, "loss_type", LOSS_TYPES)
        _choice(self.scale_rewards, "scale_rewards", SCALE_REWARDS)
        _choice(self.lr_scheduler_type, "lr_scheduler_type", LR_SCHEDULER_TYPES)
        for name in (
            "max_turns",
            "max_tool_calls",
            "max_new_tokens_per_turn",
            "max_episode_tokens",
            "per_device_train_batch_size",
            "gradient_accumulation_steps",
            "num_iterations",
            "topk",
            "eval_batch_size",
        ):
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
        if self.total_episodes is not None and self.total_episodes < 1:
            raise ConfigError(f"total_episodes: must be >= 1 or null, got {self.total_episodes}")
        if self.temperature <= 0:
            raise ConfigError(
                f"temperature: GRPO samples its groups, so it must be > 0, got {self.temperature}"
            )
        if self.eval_temperature < 0:
            raise ConfigError(f"eval_temperature: must be >= 0 (0 = greedy), got {self.eval_temperature}")
        if not 0.0 < self.top_p <= 1.0:
            raise ConfigError(f"top_p: must be in (0, 1], got {self.top_p}")
        if self.top_k < 0:
            raise ConfigError(f"top_k: must be >= 0 (0 disables it), got {self.top_k}")
        for name in ("beta", "epsilon", "learning_rate", "weight_decay", "max_grad_norm"):
            value = getattr(self, name)
            if not math.isfinite(value) or value < 0:
                raise ConfigError(f"{name}: must be a finite number >= 0, got {value}")
        for name in ("logging_steps", "eval_steps", "save_steps", "warmup_steps", "num_eval_questions"):
            if getattr(self, name) < 0:
                raise ConfigError(f"{name}: must be >= 0, got {getattr(self, name)}")
        if self.max_observation_tokens < 16:
            raise ConfigError(
                f"max_observation_tokens: must be >= 16 (room for a document and the truncation marker), "
                f"got {self.max_observation_tokens}"
            )
        if self.protocol not in ("chat", "search_r1"):
            raise ConfigError(f"protocol: {self.protocol!r} is not one of ['chat', 'search_r1']")
        if self.mode == "trl_loop" and self.protocol != "chat":
            raise ConfigError(
                f"protocol: {self.protocol!r} needs mode: our_rollout; TRL's tool loop (trl_loop) parses only "
                "the chat protocol's <tool_call> blocks"
            )
        if self.index_dir and self.search_url:
            raise ConfigError("index_dir and search_url: give one search backend, not both")
        if self.save_total_limit is not None and self.save_total_limit < 1:
            raise ConfigError(f"save_total_limit: must be >= 1 or null, got {self.save_total_limit}")
        if self.num_sample_generations < 0:
            raise ConfigError(f"num_sample_generations: must be >= 0, got {self.num_sample_generations}")
        if self.best_metric is not None and not str(self.best_metric).startswith("eval/"):
            raise ConfigError(
                f"best_metric: {self.best_metric!r} must name a dev-evaluation metric such as eval/reward or "
                "eval/exact_match, or be null"
            )

    # -- derived ----------------------------------------------------------------------------------
    @property
    def episodes_per_step(self) -> int:
        """Completions one optimizer step consumes (single process)."""
        return self.per_device_train_batch_size * self.gradient_accumulation_steps

    @property
    def num_steps(self) -> int:
        """Optimizer steps of the run: from the episode budget when one is given, else `max_steps`."""
        if self.total_episodes is not None:
            return max(1, math.ceil(self.total_episodes / self.episodes_per_step))
        return self.max_steps

    @property
    def run_dir(self) -> Path:
        return Path(self.output_dir)

    def env_config(self) -> EnvConfig:
        """The environment of the run, by PPO's own mapping (`PPOConfig.env_config`).

        The fields PPO's mapping reads carry PPO's names here, so both trainers build their environment
        with one piece of code and cannot drift apart.
        """
        return PPOConfig.env_config(self)  # type: ignore[arg-type]

    def to_trl_args(self, cuda_available: bool = False) -> Any:
        """TRL 1.16's `GRPOConfig` for this run (CPU-safe; our callbacks own checkpoints and evaluation)."""
        from trl import GRPOConfig

        on_cpu = self.use_cpu or not cuda_available
        return GRPOConfig(
            output_dir=str(self.run_dir / "trl"),
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
            max_grad_norm=self.max_grad_norm,
            weight_decay=self.weight_decay,
            logging_steps=max(1, self.logging_steps),
            eval_strategy="no",
            gradient_checkpointing=False,
            remove_unused_columns=False,
            **cpu_safe_trainer_kwargs(use_cpu=on_cpu),
        )


def _choice(value: str, name: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name}: {value!r} is not one of {list(choices)}")


# Settings a PPO run and a GRPO run share, by the same name and meaning: the start, data, search, the
# environment's budgets, sampling, the episode budget and batch, optimisation, evaluation and saving.
SHARED_WITH_PPO = (
    "seed",
    "policy_model_path",
    "tokenizer_path",
    "reward_config_path",
    "train_file",
    "dev_file",
    "index_dir",
    "search_url",
    "topk",
    "search_timeout_s",
    "protocol",
    "tool_schema_in_prompt",
    "citation_style",
    "system_prompt",
    "max_turns",
    "max_tool_calls",
    "max_new_tokens_per_turn",
    "max_episode_tokens",
    "max_observation_tokens",
    "temperature",
    "eval_temperature",
    "top_p",
    "top_k",
    "per_device_train_batch_size",
    "gradient_accumulation_steps",
    "total_episodes",
    "learning_rate",
    "lr_scheduler_type",
    "warmup_steps",
    "max_grad_norm",
    "weight_decay",
    "logging_steps",
    "eval_steps",
    "num_eval_questions",
    "save_steps",
    "save_total_limit",
    "best_metric",
    "num_sample_generations",
    "save_trajectories",
    "use_cpu",
)


def grpo_config_from_ppo(ppo: PPOConfig, **overrides: Any) -> GRPORunConfig:
    """A GRPO run with a PPO run's settings (`SHARED_WITH_PPO`), then `overrides` (any GRPO field).

    The result builds the same environment (`env_config()` equals `ppo.env_config()`) and the same rollout
    limits (`generation_config_for` equals `generation_config_from_ppo(ppo)`), consumes the same episodes
    per optimizer step and stops at the same episode budget. PPO's `max_tool_calls: 0` (no search) has no
    GRPO equivalent and is refused. What only GRPO has (`mode`, `num_generations`, `beta`, `loss_type`,
    ...) keeps GRPO's defaults unless given in `overrides`; `eval_batch_size` is PPO's evaluation batch
    (`PPOTrainer.evaluate` rolls out `per_device_train_batch_size * gradient_accumulation_steps` at a time).
    """
    unknown = sorted(set(overrides) - {f.name for f in dataclasses.fields(GRPORunConfig)})
    if unknown:
        raise ConfigError(f"grpo_config_from_ppo: {unknown} are not GRPORunConfig fields")
    if ppo.max_tool_calls < 1:
        raise ConfigError("max_tool_calls: the PPO run allows no search (0); a GRPO run needs at least 1")
    values: dict[str, Any] = {name: getattr(ppo, name) for name in SHARED_WITH_PPO}
    values["eval_batch_size"] = ppo.per_device_train_batch_size * ppo.gradient_accumulation_steps
    values.update(overrides)
    return GRPORunConfig(**values)
