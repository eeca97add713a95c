"""The TrainingArguments settings every TRL trainer in searchrl shares (SFT, reward model, GRPO).

`ScheduleSection` declares once the schedule of the supervised TRL runs, the SFT warm start and the reward
model (learning rate, epochs or steps, batch, warm-up, scheduler, weight decay, logging, seed), with
TrainingArguments' names, and fills those arguments (`training_arguments()`). `SFTWarmStartConfig` and
`RewardModelConfig` are schedules plus their own fields. The RL trainers schedule by rollout steps instead
(`searchrl.sections.TrainingSection`: warm-up in steps, the episode budget).

`cpu_safe_trainer_kwargs`, `reference/trl.md` §6: TRL's configs default to `bf16=True`, which raises on a
CPU-only box; reporting and TRL's own checkpointing are off because searchrl writes its own run directory;
no progress bars or dataloader workers inside a parent process that has its own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from searchrl.common.config import ConfigError, Section, help_text


def cpu_safe_trainer_kwargs(use_cpu: bool | None = None) -> dict[str, Any]:
    """`use_cpu=None` means: on the CPU when no CUDA device is visible."""
    import torch  # deferred: GRPORunConfig, which the CLI imports to register `grpo`, imports this module

    return {
        "bf16": False,
        "fp16": False,
        "use_cpu": (not torch.cuda.is_available()) if use_cpu is None else use_cpu,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }


@dataclass
class ScheduleSection(Section):
    """The optimisation schedule of a supervised TRL run (the SFT warm start, the reward model)."""

    output_dir: str = field(
        default="", metadata=help_text("Trainer scratch directory; empty = a temporary directory.")
    )
    learning_rate: float = field(default=1e-3, metadata=help_text("Peak learning rate (AdamW)."))
    num_train_epochs: float = field(
        default=3.0,
        metadata=help_text("Passes over the training examples (demonstrations, or preference pairs)."),
    )
    max_steps: int = field(default=-1, metadata=help_text("Optimizer steps; > 0 overrides num_train_epochs."))
    per_device_train_batch_size: int = field(
        default=8,
        metadata=help_text("Training examples per micro-batch (trajectories, or preference pairs)."),
    )
    gradient_accumulation_steps: int = field(
        default=1, metadata=help_text("Micro-batches per optimizer step.")
    )
    warmup_ratio: float = field(default=0.05, metadata=help_text("Share of steps with linear LR warm-up."))
    lr_scheduler_type: str = field(
        default="linear", metadata=help_text("transformers scheduler name: linear, cosine, constant, ...")
    )
    weight_decay: float = field(default=0.0, metadata=help_text("AdamW weight decay."))
    logging_steps: int = field(default=1, metadata=help_text("Log the loss every this many steps."))
    seed: int = field(
        default=0,
        metadata=help_text(
            "Seed of the data order and any random state (the reward model's held-out split)."
        ),
    )

    def check(self) -> None:
        """Refuse a schedule that cannot train (a config's own `check` follows: `check_sections`)."""
        if self.learning_rate <= 0 or not math.isfinite(self.learning_rate):
            raise ConfigError(f"learning_rate: must be a positive number, got {self.learning_rate}")
        if self.per_device_train_batch_size < 1 or self.gradient_accumulation_steps < 1:
            raise ConfigError("per_device_train_batch_size and gradient_accumulation_steps must be >= 1")
        if self.max_steps <= 0 and self.num_train_epochs <= 0:
            raise ConfigError(
                "set num_train_epochs > 0 or max_steps > 0: there is nothing to train otherwise"
            )
        if not 0.0 <= self.warmup_ratio < 1.0:
            raise ConfigError(f"warmup_ratio: must be in [0, 1), got {self.warmup_ratio}")

    def training_arguments(self) -> dict[str, Any]:
        """The TrainingArguments this schedule fills (for TRL's `SFTConfig` and `RewardConfig` alike)."""
        return {
            "learning_rate": self.learning_rate,
            "num_train_epochs": self.num_train_epochs,
            # transformers reads max_steps 0 as "stop after the first step", not as "use the epochs"
            "max_steps": self.max_steps if self.max_steps > 0 else -1,
            "per_device_train_batch_size": self.per_device_train_batch_size,
            "gradient_accumulation_steps": self.gradient_accumulation_steps,
            "warmup_steps": self.warmup_ratio,  # a float in [0, 1) is a share of the steps (transformers 5)
            "lr_scheduler_type": self.lr_scheduler_type,
            "weight_decay": self.weight_decay,
            "logging_steps": self.logging_steps,
            "seed": self.seed,
            "data_seed": self.seed,
            "activation_checkpointing": False,  # TRL defaults to on; pointless and slow for tiny models
        }
