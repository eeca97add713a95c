"""searchrl.rollout: trajectories, chat-template token glue, the one turn loop and its engines (HF KV cache,
replay, vLLM), metrics.

Names are imported lazily so that `searchrl.common.trajectory` (used by the environment and the
rewards) does not pull in torch and transformers.
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_EXPORTS = {
    "Trajectory": "searchrl.common.trajectory",
    "ToolCallRecord": "searchrl.common.trajectory",
    "Span": "searchrl.common.trajectory",
    "read_trajectories": "searchrl.common.trajectory",
    "write_trajectories": "searchrl.common.trajectory",
    "ChatTokenMeter": "searchrl.rollout.chat",
    "ToolGlue": "searchrl.rollout.chat",
    "prompt_ids": "searchrl.rollout.chat",
    "render_conversation": "searchrl.rollout.chat",
    "tool_suffix_ids": "searchrl.rollout.chat",
    "GenerationConfig": "searchrl.rollout.loop",
    "RolloutBatch": "searchrl.rollout.loop",
    "Sampling": "searchrl.rollout.sampling",
    "TokenEngine": "searchrl.rollout.loop",
    "TurnLoop": "searchrl.rollout.loop",
    "TurnParams": "searchrl.rollout.loop",
    "TurnCompletion": "searchrl.rollout.loop",
    "HFGenerator": "searchrl.rollout.generator",
    "KVCacheEngine": "searchrl.rollout.generator",
    "ReplayEngine": "searchrl.rollout.generator",
    "ScriptedPolicy": "searchrl.rollout.generator",
    "sampling_log_probs": "searchrl.rollout.generator",
    "VLLMGenerator": "searchrl.rollout.vllm_generator",
    "VLLMEngine": "searchrl.rollout.vllm_generator",
    "HFTokenEngine": "searchrl.rollout.vllm_generator",
    "rollout_stats": "searchrl.rollout.stats",
    "RolloutBackend": "searchrl.rollout.backends",
    "make_generator": "searchrl.rollout.backends",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
