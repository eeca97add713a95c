"""The TrainingArguments settings every TRL trainer in searchrl shares (SFT, reward model, GRPO).

`reference/trl.md` §6: TRL's configs default to `bf16=True`, which raises on a CPU-only box; reporting
and TRL's own checkpointing are off because searchrl writes its own run directory; no progress bars
or dataloader workers inside a parent process that has its own.
"""

from __future__ import annotations

from typing import Any


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


def schedule_kwargs(config: Any) -> dict[str, Any]:
    """The TrainingArguments that the SFT and reward-model configs fill alike from their own fields (learning
    rate, epochs or steps, batch, warm-up, scheduler, weight decay, logging, seed)."""
    return {
        "learning_rate": config.learning_rate,
        "num_train_epochs": config.num_train_epochs,
        "max_steps": config.max_steps,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "warmup_steps": config.warmup_ratio,  # a float in [0, 1) is a share of the steps (transformers 5)
        "lr_scheduler_type": config.lr_scheduler_type,
        "weight_decay": config.weight_decay,
        "logging_steps": config.logging_steps,
        "seed": config.seed,
        "data_seed": config.seed,
        "activation_checkpointing": False,  # TRL defaults to on; pointless and slow for tiny models
    }
