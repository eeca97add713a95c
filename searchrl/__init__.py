"""searchrl: train LLM agents that call a search engine, with agent-aware PPO in TRL's component design.

Importing the package switches the Hugging Face libraries to offline mode: nothing in searchrl may
download a model, tokenizer or dataset at run time (models are built from configs, tokenizers are
trained locally, data is generated or shipped). Set the variables yourself before import to override.
"""

import os

for _name, _value in {
    "HF_HUB_OFFLINE": "1",
    "TRANSFORMERS_OFFLINE": "1",
    "HF_DATASETS_OFFLINE": "1",
    "HF_HUB_DISABLE_TELEMETRY": "1",
    "TRL_EXPERIMENTAL_SILENCE": "1",
    "TOKENIZERS_PARALLELISM": "false",
    "HF_HUB_DISABLE_PROGRESS_BARS": "1",
}.items():
    os.environ.setdefault(_name, _value)

__version__ = "0.1.0"
