"""The TrainingArguments settings every TRL trainer in searchrl shares (SFT, reward model, GRPO).

`reference/trl.md` §6: TRL's configs default to `bf16=True`, which raises on a CPU-only box; reporting
and TRL's own checkpointing are off because searchrl writes its own run directory; no progress bars
or dataloader workers inside a parent process that has its own.
"""

from __future__ import annotations

from typing import Any

import torch


def cpu_safe_trainer_kwargs(use_cpu: bool | None = None) -> dict[str, Any]:
    """`use_cpu=None` means: on the CPU when no CUDA device is visible."""
    return {
        "bf16": False,
        "fp16": False,
        "use_cpu": (not torch.cuda.is_available()) if use_cpu is None else use_cpu,
        "report_to": "none",
        "save_strategy": "no",
        "disable_tqdm": True,
        "dataloader_num_workers": 0,
    }
