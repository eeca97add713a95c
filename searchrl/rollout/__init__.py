"""searchrl.rollout: trajectories, chat-template token glue, the multi-turn generators (HF, vLLM), metrics.

Names are imported lazily so that `searchrl.common.trajectory` (used by the environment and the
rewards) does not pull in torch and transformers.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "Trajectory": "trajectory",
    "ToolCallRecord": "trajectory",
    "Span": "trajectory",
    "read_trajectories": "trajectory",
    "write_trajectories": "trajectory",
    "ToolGlue": "chat",
    "prompt_ids": "chat",
    "render_conversation": "chat",
    "tool_suffix_ids": "chat",
    "GenerationConfig": "generator",
    "HFGenerator": "generator",
    "RolloutBatch": "generator",
    "ScriptedPolicy": "generator",
    "sampling_log_probs": "generator",
    "VLLMGenerator": "vllm_generator",
    "VLLMEngine": "vllm_generator",
    "HFTokenEngine": "vllm_generator",
    "TurnParams": "vllm_generator",
    "TurnCompletion": "vllm_generator",
    "rollout_stats": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'searchrl.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(f"searchrl.rollout.{_EXPORTS[name]}"), name)
