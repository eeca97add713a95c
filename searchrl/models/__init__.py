"""searchrl.models: the tiny offline model (tokenizer trained on the task, tiny Qwen2 policy/value), loaders
that take any local model directory, and the one atomic saver of model directories (`save_model_dir`).

Names are imported lazily from `searchrl.models.tiny` (torch, transformers and trl) and `searchrl.models.io`,
so that importing a light submodule such as the `searchrl models` commands loads none of them.
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_TINY = (
    "TinyModelConfig",
    "build_policy",
    "build_value_model",
    "tokenizer_training_texts",
    "train_tokenizer",
)
_IO = ("load_policy", "load_tokenizer", "load_value_model", "save_model_dir")
_EXPORTS = {
    **{name: "searchrl.models.tiny" for name in _TINY},
    **{name: "searchrl.models.io" for name in _IO},
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
