"""searchrl.models: the tiny offline model (tokenizer trained on the task, tiny Qwen2 policy/value) and
loaders that take any local model directory.

Names are imported lazily from `searchrl.models.tiny` (torch, transformers and trl), so that importing a
light submodule such as the `searchrl models` commands loads none of them.
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_EXPORTS = {
    name: "searchrl.models.tiny"
    for name in (
        "TinyModelConfig",
        "build_policy",
        "build_value_model",
        "load_policy",
        "load_tokenizer",
        "load_value_model",
        "tokenizer_training_texts",
        "train_tokenizer",
    )
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
