"""`PPOConfig`: every setting of a PPO run over search-agent trajectories, as one YAML-loadable dataclass.

Field names and defaults follow TRL 1.12's `PPOConfig` where it had them (`kl_coef` 0.05,
`kl_estimator` "k1", `cliprange` 0.2, `cliprange_value` 0.2, `vf_coef` 0.1, `gamma` 1.0, `lam` 0.95,
`num_ppo_epochs` 4, `num_mini_batches` 1, `whiten_rewards` False, `temperature` 0.7,
`learning_rate` 3e-6, ...), so a TRL user finds their knobs where they left them. It is a plain
dataclass, not a `transformers.TrainingArguments` subclass: TRL's base config turned bf16 on by
default (`bf16=None` resolved to `not fp16`), which breaks CPU runs, and most TrainingArguments fields
meant nothing to TRL's PPO loop anyway. What is new: adaptive KL (`kl_target`, `kl_horizon`), a
gradient clip that is really applied, a separate value learning rate, rollout limits for multi-turn
tool use, the collapse guard, and importance weights for a sampler that disagrees with the trainer
(`rollout_is_mode`, `rollout_is_clip_max`, `rollout_is_clip_min`; names after verl's `rollout_is` and TRL's
`vllm_importance_sampling_*`).

How it is put together: the settings every trainer shares (run directory and cadence, model, data, search,
environment, sampling and the rollout engine, batch and optimiser) are the sections of `searchrl.sections`, declared and checked
there once; `PPOSection` adds what only PPO has (the critic and reference, KL, clipping, GAE, mini-batches,
the collapse guard) and `PPOConfig` is the flat union TRL users know (`args.max_turns`,
`PPOConfig(kl_coef=0.1, max_turns=3)`, flat YAML). The demos keep `PPOSection` as their `ppo:` part, beside
their `environment:` and `generation:` parts, and build the stage's `PPOConfig` with
`searchrl.sections.with_sections_of`.

Batch arithmetic is TRL's (`finalize` computes it; one PPO step = one rollout batch):
`local_batch_size = per_device_train_batch_size * gradient_accumulation_steps` episodes per process,
`batch_size = local_batch_size * world_size`, `mini_batch_size = batch_size / num_mini_batches`,
`num_total_batches = ceil(total_episodes / batch_size)` PPO steps. Unlike TRL 1.12, the optimizer
steps once per mini-batch (`micro_batches_per_mini_batch` micro-batches accumulated), not on
TRL's gradient-accumulation counter.

Load with `searchrl.common.config.load_config(PPOConfig, "configs/ppo_tiny.yaml", overrides)`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal, Self

from searchrl.common.config import help_text, require, require_choice
from searchrl.sections import (
    DataSection,
    EnvironmentSection,
    GenerationSection,
    ModelSection,
    RunSection,
    SearchSection,
    TrainingSection,
)

# The per-token estimators `ppo.kl.kl_penalty` computes; named here so that reading a config imports no torch.
KL_ESTIMATORS: tuple[str, ...] = ("k1", "k2", "k3")
VALUE_MODES = ("separate", "shared_backbone")
MIXED_PRECISION_MODES = ("no", "bf16", "fp16")
# How the policy loss corrects for a sampler that disagrees with the trainer (`ppo.rollout_is`): "none", or
# one of TRL 1.16's `vllm_importance_sampling_mode` values.
ROLLOUT_IS_MODES: tuple[str, ...] = (
    "none",
    "token_truncate",
    "token_mask",
    "sequence_truncate",
    "sequence_mask",
)
RolloutISMode = Literal["none", "token_truncate", "token_mask", "sequence_truncate", "sequence_mask"]


@dataclass
class PPOSection(RunSection, TrainingSection):
    """What a PPO stage sets besides the shared environment, generation, search, data and model sections.

    The run's recording and the batch and optimiser come from `RunSection` and `TrainingSection`; the fields
    below are PPO's own. A demo's `ppo:` part is one of these.
    """

    default_output_dir: ClassVar[str] = "runs/ppo"

    # --- models besides the policy ---
    ref_model_path: str | None = field(
        default=None,
        metadata=help_text(
            "Local folder of the frozen reference model; null makes a frozen copy of the initial policy "
            "(with PEFT: the policy with its adapter disabled)."
        ),
    )
    value_model_path: str | None = field(
        default=None,
        metadata=help_text(
            "Local folder of the critic (a sequence-classification model with a score head, as in TRL); null "
            "initialises it from reward_model_path if set, else from the policy with a zero score head."
        ),
    )
    value_mode: Literal["separate", "shared_backbone"] = field(
        default="separate",
        metadata=help_text(
            '"separate": the critic is its own model (TRL\'s design); "shared_backbone": a value head on the '
            "policy's backbone (less memory, the two losses share gradients)."
        ),
    )
    reward_model_path: str | None = field(
        default=None,
        metadata=help_text(
            "Local folder of a frozen reward model whose score joins the reward functions; null: none."
        ),
    )
    reward_model_weight: float = field(
        default=1.0, metadata=help_text("Weight of the reward model's score in the total score.")
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata=help_text("Recompute activations in the backward pass of the policy to save memory."),
    )
    mixed_precision: Literal["no", "bf16", "fp16"] = field(
        default="no",
        metadata=help_text(
            'Autocast mode passed to accelerate; keep "no" on CPU (bf16 on CPU is slow and lossy).'
        ),
    )

    # --- rollout ---
    missing_eos_penalty: float | None = field(
        default=None,
        metadata=help_text(
            "Subtracted from the score of an episode that did not end properly (no final answer / stop token); "
            "null: no penalty."
        ),
    )
    local_rollout_forward_batch_size: int = field(
        default=64,
        metadata=help_text("Chunk size of the no-grad forward passes (reference logprobs, values, scores)."),
    )

    # --- a sampler that disagrees with the trainer: importance weights (Yao et al. 2025; ppo/rollout_is.py) ---
    rollout_is_mode: RolloutISMode = field(
        default="none",
        metadata=help_text(
            "Correct the policy loss for a sampler (vLLM, a bf16 KV cache) whose logprobs differ from the "
            "trainer's: each action token's clipped surrogate is weighted by r = exp(old_logprobs - "
            'rollout_logprobs), detached. "none": no weight (the default); "token_truncate": min(r, '
            "rollout_is_clip_max), the truncated importance sampling of Yao et al. 2025 (verl's "
            'rollout_is=token); "token_mask": r, or 0 outside [rollout_is_clip_min, rollout_is_clip_max]; '
            '"sequence_truncate" / "sequence_mask": one r per trajectory (the product over its action '
            "tokens) truncated or masked the same way. The names are TRL 1.16's "
            "vllm_importance_sampling_mode. The rollout_is/* metrics are logged in every mode."
        ),
    )
    rollout_is_clip_max: float = field(
        default=2.0,
        metadata=help_text(
            "The cap C of the importance ratio, >= 1: truncate modes use min(r, C), mask modes drop r > C. "
            "2.0 is Yao et al.'s and verl's rollout_is_threshold; TRL's vllm_importance_sampling_clip_max "
            "is 3.0."
        ),
    )
    rollout_is_clip_min: float | None = field(
        default=None,
        metadata=help_text(
            "Mask modes only: ratios below this (in (0, 1)) get weight 0, TRL's "
            "vllm_importance_sampling_clip_min and verl's rollout_is_threshold_lower; null: no lower bound. "
            "Truncate modes refuse it (they keep Yao et al.'s min(r, C))."
        ),
    )

    # --- batch arithmetic (TRL 1.12; the batch sizes are TrainingSection's) ---
    num_mini_batches: int = field(
        default=1, metadata=help_text("Mini-batches per PPO epoch; the optimizer steps once per mini-batch.")
    )
    num_ppo_epochs: int = field(
        default=4, metadata=help_text("Passes of PPO updates over each rollout batch.")
    )
    num_train_epochs: float = field(
        default=3.0, metadata=help_text("Passes over the training questions when total_episodes is null.")
    )

    # --- PPO ---
    kl_coef: float = field(
        default=0.05,
        metadata=help_text(
            "KL penalty coefficient beta (the initial one when kl_target is set); 0 disables the penalty."
        ),
    )
    kl_estimator: Literal["k1", "k2", "k3"] = field(
        default="k1",
        metadata=help_text(
            'Per-token KL estimator in the reward: "k1" = logp - ref (unbiased, TRL default), "k2" = '
            '0.5*(logp - ref)^2, "k3" = exp(ref - logp) - (ref - logp) - 1 (unbiased, >= 0).'
        ),
    )
    kl_target: float | None = field(
        default=None,
        metadata=help_text(
            "Adaptive KL (Ziegler et al. 2019): target KL in nats per trajectory (summed over action tokens, "
            "batch mean); null keeps kl_coef fixed."
        ),
    )
    kl_horizon: float = field(
        default=10000.0,
        metadata=help_text("Adaptive KL horizon in episodes: how slowly beta follows the error."),
    )
    cliprange: float = field(default=0.2, metadata=help_text("PPO ratio clip epsilon for the policy loss."))
    cliprange_value: float | None = field(
        default=0.2,
        metadata=help_text(
            "Clip range of the value predictions around the rollout-time values (PPO2's value clip; TRL's "
            "default 0.2); null: no clip. A clipped value moves at most this far per step, so a fresh critic "
            "facing returns of about 1 spends its first steps on the mean (docs/ppo.md: the critic)."
        ),
    )
    vf_coef: float = field(default=0.1, metadata=help_text("Weight of the value loss in the total loss."))
    gamma: float = field(default=1.0, metadata=help_text("Discount factor over action tokens."))
    lam: float = field(default=0.95, metadata=help_text("GAE lambda over action tokens."))
    value_lam: float | None = field(
        default=None,
        metadata=help_text(
            "GAE lambda of the critic's targets (the returns it fits); null: lam. 1.0 fits Monte-Carlo "
            "returns while the policy's advantages keep lam (VC-PPO's decoupled GAE, Yuan et al. 2025): with "
            "lam 0.95 over 40 action tokens, an early token's target holds 0.95^40 = 0.13 of the outcome and "
            "the rest is the critic's own guess."
        ),
    )
    value_replay_steps: int = field(
        default=0,
        metadata=help_text(
            "The critic also fits the targets of the last N steps' batches: critic-only optimizer steps "
            "(num_ppo_epochs x num_mini_batches per replayed batch) after each PPO update; the policy and its "
            "learning-rate schedule are untouched. A critic learns from more distinct episodes than one batch "
            "holds (docs/ppo.md: the critic). 0: off (TRL). Needs value_mode separate and no DeepSpeed."
        ),
    )
    whiten_rewards: bool = field(
        default=False,
        metadata=help_text("Scale per-token rewards to unit variance (mean kept) over action tokens."),
    )
    whiten_advantages: bool = field(
        default=True,
        metadata=help_text("Whiten advantages to mean 0, std 1 over action tokens (TRL always did)."),
    )

    # --- optimisation besides TrainingSection's ---
    value_learning_rate: float | None = field(
        default=None, metadata=help_text("AdamW learning rate of the value model; null: learning_rate.")
    )
    adam_beta1: float = field(default=0.9, metadata=help_text("AdamW beta1."))
    adam_beta2: float = field(default=0.999, metadata=help_text("AdamW beta2."))
    adam_epsilon: float = field(
        default=1e-8,
        metadata=help_text("AdamW epsilon (transformers' default; the N+ PPO recipe used 1e-5)."),
    )

    # --- collapse guard: bounds on the mean over the last collapse_window steps; null turns one off ---
    collapse_guard: bool = field(
        default=False,
        metadata=help_text(
            "Watch entropy, KL, format validity and reward; on collapse log why, roll back to the last good "
            "checkpoint and lower the learning rate. Off by default for TRL parity, on in the shipped configs."
        ),
    )
    collapse_window: int = field(
        default=5,
        metadata=help_text("Number of recent PPO steps whose mean is compared with the collapse bounds."),
    )
    collapse_entropy_min: float | None = field(
        default=0.05,
        metadata=help_text(
            "Collapse if the mean per-token policy entropy on action tokens (nats) falls below this, or below "
            "half the first step's entropy when the starting policy is already below it (a confident warm start "
            "is not a collapse); while the windowed score is above the first step's, low entropy is the policy "
            "settling on what pays and is only logged."
        ),
    )
    collapse_kl_max: float | None = field(
        default=30.0,
        metadata=help_text(
            "Collapse if the KL to the reference (nats per trajectory, summed over action tokens) exceeds this."
        ),
    )
    collapse_format_min: float | None = field(
        default=None,
        metadata=help_text(
            "Collapse if the mean format-validity reward (share of well-formed episodes) falls below this "
            "absolute value. Off by default: a weak warm start may begin below any useful absolute bound."
        ),
    )
    collapse_format_drop: float | None = field(
        default=0.3,
        metadata=help_text(
            "Collapse if the windowed mean format validity falls this far (absolute) below its value at the "
            "run's first step (the warm start's own level, kept in checkpoints)."
        ),
    )
    collapse_reward_drop: float | None = field(
        default=0.5,
        metadata=help_text(
            "Collapse if the windowed mean score falls this far (absolute) below the best one so far."
        ),
    )
    collapse_lr_decay: float = field(
        default=0.5,
        metadata=help_text("Multiply the policy and value learning rates by this after each rollback."),
    )
    collapse_max_rollbacks: int = field(
        default=3,
        metadata=help_text("Stop the run with an error after this many rollbacks instead of looping."),
    )

    # --- computed by finalize(); values given in YAML are overwritten ---
    world_size: int | None = field(default=None, metadata=help_text("Computed: number of processes."))
    local_batch_size: int | None = field(
        default=None, metadata=help_text("Computed: episodes per process per PPO step.")
    )
    micro_batch_size: int | None = field(
        default=None, metadata=help_text("Computed: episodes per micro-batch over all processes.")
    )
    batch_size: int | None = field(
        default=None, metadata=help_text("Computed: episodes per PPO step, all processes.")
    )
    local_mini_batch_size: int | None = field(
        default=None, metadata=help_text("Computed: episodes per mini-batch on each process.")
    )
    mini_batch_size: int | None = field(
        default=None, metadata=help_text("Computed: episodes per mini-batch over all processes.")
    )
    micro_batches_per_mini_batch: int | None = field(
        default=None,
        metadata=help_text(
            "Computed: micro-batches accumulated into one optimizer step (accelerate's accumulation)."
        ),
    )
    num_total_batches: int | None = field(
        default=None, metadata=help_text("Computed: PPO steps in the run (= max_steps).")
    )

    def check(self) -> None:
        """PPO's own fields; the sections check theirs (`searchrl.common.config.check_sections`)."""
        self._check_choices()
        self._check_ppo_ranges()
        self._check_optimisation()
        self._check_counts()
        self._check_collapse_guard()
        self._check_rollout_is()

    # --- derived values ----------------------------------------------------------------------------
    @property
    def effective_value_learning_rate(self) -> float:
        """The value model's learning rate (value_learning_rate, or learning_rate when that is null)."""
        return self.learning_rate if self.value_learning_rate is None else self.value_learning_rate

    @property
    def critic_lam(self) -> float:
        """The GAE lambda of the critic's targets: value_lam, or lam when that is null."""
        return self.lam if self.value_lam is None else self.value_lam

    @property
    def value_clip(self) -> float:
        """cliprange_value, or infinity (no clip) when it is null."""
        return math.inf if self.cliprange_value is None else self.cliprange_value

    @property
    def adaptive_kl(self) -> bool:
        return self.kl_target is not None

    def finalize(self, world_size: int = 1, num_train_rows: int | None = None) -> Self:
        """Compute the batch arithmetic for `world_size` processes and a train set of `num_train_rows`.

        Raises ValueError, saying what to change, when the sizes do not divide. Returns self.
        """
        require(
            isinstance(world_size, int) and world_size >= 1, "world_size", world_size, "must be an int >= 1"
        )
        local_batch_size = self.per_device_train_batch_size * self.gradient_accumulation_steps
        batch_size = local_batch_size * world_size
        if local_batch_size % self.num_mini_batches != 0:
            raise ValueError(
                f"local_batch_size = per_device_train_batch_size * gradient_accumulation_steps = "
                f"{self.per_device_train_batch_size} * {self.gradient_accumulation_steps} = {local_batch_size} "
                f"does not divide into num_mini_batches={self.num_mini_batches} mini-batches; choose "
                f"num_mini_batches among the divisors of {local_batch_size} or change the batch sizes."
            )
        local_mini_batch_size = local_batch_size // self.num_mini_batches
        if local_mini_batch_size % self.per_device_train_batch_size != 0:
            raise ValueError(
                f"A mini-batch holds {local_mini_batch_size} episodes per process, not a whole number of "
                f"micro-batches of per_device_train_batch_size={self.per_device_train_batch_size}; make "
                f"gradient_accumulation_steps ({self.gradient_accumulation_steps}) a multiple of "
                f"num_mini_batches ({self.num_mini_batches})."
            )
        total_episodes = self.total_episodes
        if total_episodes is None:
            if num_train_rows is None:
                raise ValueError(
                    "total_episodes is null, so finalize() needs num_train_rows to compute "
                    "num_train_epochs * num_train_rows; pass it or set total_episodes."
                )
            total_episodes = int(self.num_train_epochs * num_train_rows)
        if num_train_rows is not None:
            require(num_train_rows >= 1, "num_train_rows", num_train_rows, "the training set is empty")
            if num_train_rows < batch_size:
                raise ValueError(
                    f"The training set has {num_train_rows} questions but one PPO step needs batch_size = "
                    f"{batch_size} (per_device_train_batch_size * gradient_accumulation_steps * world_size); "
                    "lower per_device_train_batch_size or gradient_accumulation_steps, or add questions."
                )
        require(
            total_episodes >= 1, "total_episodes", total_episodes, "must be >= 1 (is the training set empty?)"
        )

        self.world_size = world_size
        self.total_episodes = total_episodes
        self.local_batch_size = local_batch_size
        self.micro_batch_size = self.per_device_train_batch_size * world_size
        self.batch_size = batch_size
        self.local_mini_batch_size = local_mini_batch_size
        self.mini_batch_size = batch_size // self.num_mini_batches
        self.micro_batches_per_mini_batch = local_mini_batch_size // self.per_device_train_batch_size
        self.num_total_batches = math.ceil(total_episodes / batch_size)
        return self

    # --- validation of PPO's own fields ------------------------------------------------------------
    def _check_choices(self) -> None:
        require_choice(self.kl_estimator, "kl_estimator", KL_ESTIMATORS)
        require_choice(self.value_mode, "value_mode", VALUE_MODES)
        require_choice(self.mixed_precision, "mixed_precision", MIXED_PRECISION_MODES)

    def _check_ppo_ranges(self) -> None:
        require(self.kl_coef >= 0, "kl_coef", self.kl_coef, "must be >= 0 (0 disables the KL penalty)")
        if self.kl_target is not None:
            require(
                self.kl_target > 0, "kl_target", self.kl_target, "must be > 0 nats per trajectory, or null"
            )
            require(
                self.kl_coef > 0,
                "kl_coef",
                self.kl_coef,
                "must be > 0 with kl_target (it is the initial beta)",
            )
        require(self.kl_horizon > 0, "kl_horizon", self.kl_horizon, "must be > 0 episodes (TRL used 10000)")
        require(
            0 < self.cliprange < 1, "cliprange", self.cliprange, "must be in (0, 1); TRL's default is 0.2"
        )
        require(
            self.cliprange_value is None or self.cliprange_value > 0,
            "cliprange_value",
            self.cliprange_value,
            "must be > 0 (TRL's default is 0.2), or null for no value clipping",
        )
        require(
            self.value_lam is None or 0 <= self.value_lam <= 1,
            "value_lam",
            self.value_lam,
            "must be in [0, 1], or null to use lam",
        )
        require(
            isinstance(self.value_replay_steps, int) and self.value_replay_steps >= 0,
            "value_replay_steps",
            self.value_replay_steps,
            "must be an integer >= 0 (0: the critic fits the current batch only)",
        )
        if self.value_replay_steps > 0:
            require(
                self.value_mode == "separate",
                "value_mode",
                self.value_mode,
                "must be separate with value_replay_steps > 0 (critic-only steps need the critic's own model)",
            )
        require(self.vf_coef >= 0, "vf_coef", self.vf_coef, "must be >= 0")
        require(0 <= self.gamma <= 1, "gamma", self.gamma, "must be in [0, 1]")
        require(0 <= self.lam <= 1, "lam", self.lam, "must be in [0, 1]")
        if self.missing_eos_penalty is not None:
            require(
                self.missing_eos_penalty >= 0,
                "missing_eos_penalty",
                self.missing_eos_penalty,
                "must be >= 0 (it is subtracted from the score) or null",
            )

    def _check_optimisation(self) -> None:
        if self.value_learning_rate is not None:
            require(
                self.value_learning_rate > 0,
                "value_learning_rate",
                self.value_learning_rate,
                "must be > 0 or null",
            )
        require(0 <= self.adam_beta1 < 1, "adam_beta1", self.adam_beta1, "must be in [0, 1)")
        require(0 <= self.adam_beta2 < 1, "adam_beta2", self.adam_beta2, "must be in [0, 1)")
        require(self.adam_epsilon > 0, "adam_epsilon", self.adam_epsilon, "must be > 0")
        require(
            self.reward_model_weight >= 0, "reward_model_weight", self.reward_model_weight, "must be >= 0"
        )

    def _check_collapse_guard(self) -> None:
        require(self.collapse_window >= 1, "collapse_window", self.collapse_window, "must be >= 1")
        require(
            0.0 < self.collapse_lr_decay <= 1.0,
            "collapse_lr_decay",
            self.collapse_lr_decay,
            "must be in (0, 1], e.g. 0.5 halves the learning rate",
        )
        require(
            self.collapse_max_rollbacks >= 0,
            "collapse_max_rollbacks",
            self.collapse_max_rollbacks,
            "must be >= 0",
        )
        for name in (
            "collapse_entropy_min",
            "collapse_kl_max",
            "collapse_reward_drop",
            "collapse_format_drop",
        ):
            value = getattr(self, name)
            require(value is None or value >= 0, name, value, "must be >= 0, or null to turn this check off")
        require(
            self.collapse_format_min is None or 0.0 <= self.collapse_format_min <= 1.0,
            "collapse_format_min",
            self.collapse_format_min,
            "must be in [0, 1], or null to turn this check off",
        )

    def _check_counts(self) -> None:
        for name in ("num_mini_batches", "num_ppo_epochs", "local_rollout_forward_batch_size"):
            value = getattr(self, name)
            require(isinstance(value, int) and value >= 1, name, value, "must be an integer >= 1")
        require(self.num_train_epochs > 0, "num_train_epochs", self.num_train_epochs, "must be > 0")

    def _check_rollout_is(self) -> None:
        require_choice(self.rollout_is_mode, "rollout_is_mode", ROLLOUT_IS_MODES)
        clip_max, clip_min = self.rollout_is_clip_max, self.rollout_is_clip_min
        require(
            isinstance(clip_max, int | float) and not isinstance(clip_max, bool) and clip_max >= 1,
            "rollout_is_clip_max",
            clip_max,
            "must be a number >= 1 (a cap below 1 shrinks tokens the sampler and trainer agree on; Yao et al. "
            "and verl use 2.0)",
        )
        if clip_min is None:
            return
        require(
            isinstance(clip_min, int | float) and not isinstance(clip_min, bool) and 0 < clip_min < 1,
            "rollout_is_clip_min",
            clip_min,
            "must be in (0, 1), or null for no lower bound",
        )
        require(
            self.rollout_is_mode in ("none", "token_mask", "sequence_mask"),
            "rollout_is_clip_min",
            clip_min,
            f"applies to the mask modes only: rollout_is_mode={self.rollout_is_mode!r} truncates from above "
            "(min(r, C), Yao et al. 2025); set rollout_is_clip_min to null, or rollout_is_mode to token_mask "
            "or sequence_mask",
        )


@dataclass
class PPOConfig(PPOSection, GenerationSection, EnvironmentSection, SearchSection, DataSection, ModelSection):
    """All settings of `searchrl train`, flat as in TRL: the shared sections plus `PPOSection`.

    Constructing it checks every section's fields, then PPO's own (`searchrl.common.config.check_sections`).
    """
