"""searchrl.models: the tiny offline model (tokenizer trained on the task, tiny Qwen2 policy/value) and
loaders that take any local model directory."""

from searchrl.models.tiny import (
    TinyModelConfig,
    build_policy,
    build_value_model,
    load_policy,
    load_tokenizer,
    load_value_model,
    tokenizer_training_texts,
    train_tokenizer,
)

__all__ = [
    "TinyModelConfig",
    "build_policy",
    "build_value_model",
    "load_policy",
    "load_tokenizer",
    "load_value_model",
    "tokenizer_training_texts",
    "train_tokenizer",
]
