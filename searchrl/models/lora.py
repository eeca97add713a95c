"""The LoRA adapter's settings: the `peft.LoraConfig` fields a run trains an adapter with.

Why in models/: an adapter is a way of fine-tuning a model, not a demo's concern; the real loop's config
(`searchrl.demo.configs.RealDemoConfig.lora`) holds one, and peft is imported only when the adapter is built.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from searchrl.common.config import ConfigError

# Linear layers of a Llama block; LoRA on all of them is the usual choice for instruction tuning.
LLAMA_LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass
class LoRASettings:
    """The LoRA adapter trained in SFT (then merged) and again in PPO (`peft.LoraConfig` fields)."""

    r: int = field(default=16, metadata={"help": "Rank of the LoRA update matrices."})
    alpha: int = field(
        default=32, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r)."}
    )
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input (0: PPO needs none)."})
    target_modules: list[str] = field(
        default_factory=lambda: list(LLAMA_LINEAR_LAYERS),
        metadata={
            "help": "Names of the linear layers that get an adapter (Llama/Qwen: the seven per block)."
        },
    )

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha < 1:
            raise ConfigError(f"lora: r and alpha must be >= 1, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("lora.target_modules: name at least one linear layer, e.g. q_proj")

    def peft_config(self) -> Any:
        """The `peft.LoraConfig` these settings describe (a causal-LM task)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )
