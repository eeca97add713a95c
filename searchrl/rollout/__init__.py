"""searchrl.rollout: trajectories, chat-template token glue, the one turn loop and its engines (HF KV cache,
replay, vLLM), metrics.

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
    "ChatTokenMeter": "chat",
    "ToolGlue": "chat",
    "prompt_ids": "chat",
    "render_conversation": "chat",
    "tool_suffix_ids": "chat",
    "GenerationConfig": "loop",
    "RolloutBatch": "loop",
    "TokenEngine": "loop",
    "TurnLoop": "loop",
    "TurnParams": "loop",
    "TurnCompletion": "loop",
    "HFGenerator": "generator",
    "KVCacheEngine": "generator",
    "ReplayEngine": "generator",
    "ScriptedPolicy": "generator",
    "sampling_log_probs": "generator",
    "VLLMGenerator": "vllm_generator",
    "VLLMEngine": "vllm_generator",
    "HFTokenEngine": "vllm_generator",
    "rollout_stats": "stats",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'searchrl.rollout' has no attribute {name!r}")
    return getattr(importlib.import_module(f"searchrl.rollout.{_EXPORTS[name]}"), name)
