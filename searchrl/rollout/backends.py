"""Which engine a run's rollouts use: `make_generator`, the one factory PPO and GRPO's `our_rollout` call.

What: a run config's `rollout_backend` (its generation section) picks the engine. `"hf"` is `HFGenerator`,
the policy itself decoding over one KV cache (CPU or GPU). `"vllm"` is `VLLMGenerator` over an in-process
vLLM engine (TRL's colocate mode, GPU only) with the run's memory share, prefix caching, seed and dtype.
Both return the same trajectories for the same tokens (`tests/test_rollout_vllm.py`).

Why one factory: the two trainers must start the same engine from the same settings, and check the same
things first. A vLLM engine holds its own copy of the weights, so after every optimizer step the trainer
pushes the policy's weights into it (`sync_engine_weights`: PPO after its update, GRPO from a callback at
the optimizer step's end); for `HFGenerator`, which decodes with the policy itself, that is a no-op.

Checked before vLLM is started (`check_backend`, ConfigError saying how to fix): the GPU is allowed
(`use_cpu` false), the vllm package is importable and CUDA is present, and DeepSpeed is off (ZeRO-3 shards
the weights this engine would have to gather on every sync; not supported here).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.common.config import ConfigError
from searchrl.rollout import vllm_generator
from searchrl.rollout.generator import HFGenerator
from searchrl.rollout.loop import GenerationConfig
from searchrl.rollout.sampling import ROLLOUT_BACKENDS
from searchrl.rollout.vllm_generator import VLLMGenerator


@dataclass(frozen=True)
class RolloutBackend:
    """The engine settings of a run: `name` ("hf" or "vllm") and what vLLM is started with."""

    name: str = "hf"
    gpu_memory_utilization: float = 0.3
    enable_prefix_caching: bool = True
    seed: int = 0
    dtype: str = "auto"
    use_cpu: bool = False
    uses_deepspeed: bool = False

    @classmethod
    def of(cls, cfg: Any, uses_deepspeed: bool = False) -> RolloutBackend:
        """A run config's settings: its generation section's `rollout_backend` and `vllm_*` fields, `seed`,
        `use_cpu`, and bf16 weights in vLLM when the config trains in bf16 (PPO's `mixed_precision`)."""
        return cls(
            name=cfg.rollout_backend,
            gpu_memory_utilization=float(cfg.vllm_gpu_memory_utilization),
            enable_prefix_caching=bool(cfg.vllm_enable_prefix_caching),
            seed=int(cfg.seed),
            dtype="bfloat16" if getattr(cfg, "mixed_precision", "no") == "bf16" else "auto",
            use_cpu=bool(cfg.use_cpu),
            uses_deepspeed=uses_deepspeed,
        )


def check_backend(backend: RolloutBackend) -> None:
    """ConfigError, saying how to fix it, when `backend` cannot run here (module docstring); nothing for "hf"."""
    if backend.name not in ROLLOUT_BACKENDS:
        raise ConfigError(f"rollout_backend={backend.name!r} is not one of {list(ROLLOUT_BACKENDS)}")
    if backend.name == "hf":
        return
    if backend.use_cpu:
        raise ConfigError('rollout_backend="vllm" needs the GPU, but use_cpu is true; set use_cpu: false')
    vllm_generator.check_vllm_available()
    if backend.uses_deepspeed:
        raise ConfigError(
            'rollout_backend="vllm" is not supported under DeepSpeed here (ZeRO-3 would need the sharded '
            'weights gathered on every sync); launch without DeepSpeed or set rollout_backend: "hf"'
        )


def make_generator(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    generation_config: GenerationConfig,
    backend: RolloutBackend | None = None,
) -> HFGenerator | VLLMGenerator:
    """The rollout engine `backend` names (default "hf") over `policy`, sampling as `generation_config` says."""
    backend = backend or RolloutBackend()
    if backend.name == "hf":
        return HFGenerator(policy, tokenizer, generation_config)
    check_backend(backend)
    return VLLMGenerator(
        policy,
        tokenizer,
        generation_config,
        gpu_memory_utilization=backend.gpu_memory_utilization,
        enable_prefix_caching=backend.enable_prefix_caching,
        seed=backend.seed,
        dtype=backend.dtype,
    )


def sync_engine_weights(generator: Any, policy: Any) -> bool:
    """Push `policy`'s current weights into an engine that holds its own copy (`VLLMGenerator.sync_weights`);
    nothing for an engine that decodes with the policy itself. True when weights were pushed."""
    sync = getattr(generator, "sync_weights", None)
    if sync is None:
        return False
    sync(policy)
    return True
