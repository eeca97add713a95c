"""The tiny offline model: a BPE tokenizer trained on the task text and small Qwen2-config transformers.

Why: nothing may download at run time, yet every code path (chat template, tool-call glue, PPO with a
value model) must be the one a real Qwen2.5 model goes through. So the tokenizer speaks the Qwen2.5
chat format through the template file that the installed trl package ships (read at run time, never
copied), and the models are `Qwen2ForCausalLM` / `Qwen2ForSequenceClassification` built from a config.
Loading and saving model directories (the tiny model's or any other local one) is `searchrl.models.io`'s.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import (
    PreTrainedModel,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
    Qwen2Config,
    Qwen2ForCausalLM,
    Qwen2ForSequenceClassification,
)
from trl.chat_template_utils import add_response_schema

PAD_TOKEN = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
SPECIAL_TOKENS = [PAD_TOKEN, IM_START, IM_END]
# Protocol tags, added as single (non-special) tokens so `decode` keeps them and the tiny model
# sees each tag as one symbol.
PROTOCOL_TOKENS = [
    "<tool_call>",
    "</tool_call>",
    "<tool_response>",
    "</tool_response>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<information>",
    "</information>",
]
TEMPLATE_NAME = "qwen2_5.jinja"

# Qwen2's split regex with two changes, both for a model that must copy names it has never seen:
# - a word that starts with a capital (a name) never takes the character before it. With Qwen's
#   `[^\r\n\p{L}\p{N}]?\p{L}+` a name had one id in the question (" Nekril") and others where the agent
#   copies it into a query ('"Nekril') or an answer (">Nekril"); copying was then a per-name mapping that
#   cannot generalise. Here a name has the same ids wherever it stands;
# - a lowercase word keeps its leading space (" born" is one token), so ordinary text costs one token a
#   word, not two (a space token and the word): about 20% shorter episodes than spaces on their own.
PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?(?<!\p{L})\p{Ll}+|\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# The split for a task that reads numbers out of tool output (the support demo's dates and order ids):
# - a number comes in tokens of up to two digits that keep the space before them, so "delivered on 27
#   February" is " on", " 27", " February" in the order record and in the answer: the date is one token to
#   copy, found after the 2-gram "delivered on", where one digit a token made it " ", "2", "7", " " and every
#   digit after a space a candidate (measured: the status read out of a record 0.10 -> 0.34 after 400 steps
#   of the same reading examples, docs/support.md); an order id is three tokens, not five;
# - every word keeps the space before it (" February", " Ship"): shorter episodes, and no name is copied in
#   that task.
READING_PRETOKENIZE_REGEX = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)| ?(?<!\p{L})\p{Ll}+| ?\p{L}+| ?\p{N}{1,2}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
# `train_tokenizer(split=...)`: the two splits by the copies they are for.
SPLIT_REGEXES = {"names": PRETOKENIZE_REGEX, "reading": READING_PRETOKENIZE_REGEX}


def split_error(split: str) -> str:
    """What is wrong with `split` as a `SPLIT_REGEXES` name ("" when nothing): the one check `train_tokenizer`
    and `SupportDemoConfig.tokenizer_split` share."""
    return "" if split in SPLIT_REGEXES else f"{split!r} is not one of {sorted(SPLIT_REGEXES)}"


def trl_chat_template_path(name: str = TEMPLATE_NAME) -> Path:
    """Path of a chat template inside the installed trl package (the file is read, never copied)."""
    spec = importlib.util.find_spec("trl")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("trl is not installed: the tiny tokenizer needs trl's bundled chat templates")
    path = Path(next(iter(spec.submodule_search_locations))) / "chat_templates" / name
    if not path.is_file():
        raise FileNotFoundError(
            f"chat template {name!r} not found at {path}; this trl version does not ship it "
            "(searchrl expects trl 1.16, see constraints.txt)"
        )
    return path


def qwen2_5_chat_template() -> str:
    """The Qwen2.5 chat template text exactly as trl ships it (TRL recognises it by string identity)."""
    return trl_chat_template_path().read_text(encoding="utf-8")


def tokenizer_training_texts(
    corpus_rows: Iterable[dict[str, Any]], qa_rows: Iterable[dict[str, Any]]
) -> list[str]:
    """Texts to train the tiny tokenizer on: documents, questions, answers and protocol samples.

    `corpus_rows` carry `title` and `contents` (or `text`); `qa_rows` carry `question` and `golds`.
    Protocol samples teach the BPE the markup and JSON shapes it will see in every episode.
    """
    texts: list[str] = []
    for row in corpus_rows:
        body = row.get("contents", row.get("text", ""))
        texts.append(f"{row.get('title', '')}\n{body}")
    for row in qa_rows:
        question = str(row.get("question", ""))
        golds = row.get("golds", []) or []
        answer = golds[0] if golds else ""
        texts.append(question)
        texts.append(
            f'<tool_call>\n{{"name": "search", "arguments": {{"query": "{question}", "k": 3}}}}\n</tool_call>'
        )
        texts.append(f"<search>{question}</search>\n\n<information>Doc 1 [d1] {answer}</information>\n\n")
        texts.append(f"<answer>{answer} [d1]</answer>")
    texts.append(
        "system\nuser\nassistant\n<tool_response>\n[1] (id: d1) Title\ntext\n</tool_response>\n"
        '{"type": "function", "function": {"name": "search", "description": "Search the corpus.", '
        '"parameters": {"type": "object", "properties": {"query": {"type": "string"}, '
        '"k": {"type": "integer"}}, "required": ["query"]}}}'
    )
    return texts


def train_tokenizer(
    texts: Iterable[str],
    vocab_size: int = 2048,
    min_frequency: int = 2,
    model_max_length: int = 2048,
    split: str = "names",
) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE tokenizer on `texts` and dress it as a Qwen2.5 chat tokenizer.

    `split` picks the pre-tokenizer's regex (`SPLIT_REGEXES`): "names" (names keep their ids wherever they
    stand; one digit a token) or "reading" (numbers of up to two digits and words with their space).

    Byte-level, so any text encodes (after Unicode NFC normalisation, as Qwen2.5's tokenizer does); pad
    (`<|endoftext|>`) differs from EOS (`<|im_end|>`); left padding for batched generation; the chat
    template is trl's Qwen2.5 file. Saved next to the model, it reloads as `Qwen2Tokenizer` with
    exactly the same token ids.
    """
    if why := split_error(split):
        raise ValueError(f"split={why}")
    if vocab_size < 300:
        raise ValueError(
            f"vocab_size={vocab_size} is too small: byte-level BPE needs at least 256 + specials"
        )
    # Qwen2Tokenizer's pipeline (NFC, a split regex, byte level) with one of the split regexes above. Saved next to a
    # Qwen2 config.json it reloads as Qwen2Tokenizer, which keeps tokenizer.json's pre-tokenizer: the
    # reload test in tests/test_models_tiny.py checks the ids are the same.
    core = Tokenizer(models.BPE(dropout=None, unk_token=None, fuse_unk=False, byte_fallback=False))
    core.normalizer = normalizers.NFC()
    core.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(SPLIT_REGEXES[split]), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    core.train_from_iterator(list(texts), trainer=trainer)
    tok = PreTrainedTokenizerFast(
        tokenizer_object=core,
        bos_token=None,
        eos_token=IM_END,
        pad_token=PAD_TOKEN,
        unk_token=None,
        additional_special_tokens=[IM_START, IM_END],
        padding_side="left",
        model_max_length=model_max_length,
        clean_up_tokenization_spaces=False,
    )
    tok.add_tokens(PROTOCOL_TOKENS)
    tok.chat_template = qwen2_5_chat_template()
    add_response_schema(tok)  # so TRL's parse_response reads our tool calls (recognised by template identity)
    return tok


@dataclass
class TinyModelConfig:
    """Shape of the tiny Qwen2 models (policy and value/reward)."""

    hidden_size: int = field(default=128, metadata={"help": "Width of the residual stream."})
    num_hidden_layers: int = field(default=4, metadata={"help": "Number of transformer blocks."})
    num_attention_heads: int = field(default=4, metadata={"help": "Query heads per block."})
    num_key_value_heads: int = field(
        default=2,
        metadata={"help": "Key/value heads (grouped-query attention); must divide the query heads."},
    )
    intermediate_size: int = field(default=512, metadata={"help": "Width of the MLP hidden layer."})
    max_position_embeddings: int = field(
        default=2048, metadata={"help": "Longest sequence the model accepts."}
    )
    tie_word_embeddings: bool = field(default=True, metadata={"help": "Share input embedding and LM head."})
    rope_theta: float = field(default=10000.0, metadata={"help": "RoPE base frequency."})
    attn_implementation: str = field(
        default="sdpa",
        metadata={"help": "Attention kernel: 'sdpa' or 'eager' (both handle padded KV appends)."},
    )
    seed: int = field(default=0, metadata={"help": "Seed of the random initialisation."})

    def validate(self) -> None:
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError(
                f"num_key_value_heads={self.num_key_value_heads} must divide "
                f"num_attention_heads={self.num_attention_heads}"
            )
        if self.hidden_size % self.num_attention_heads:
            raise ValueError(
                f"hidden_size={self.hidden_size} must be a multiple of num_attention_heads={self.num_attention_heads}"
            )


def qwen2_config(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig, **extra: Any) -> Qwen2Config:
    """A Qwen2Config sized by `cfg` whose vocabulary and special ids come from `tokenizer`."""
    cfg.validate()
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        intermediate_size=cfg.intermediate_size,
        max_position_embeddings=cfg.max_position_embeddings,
        tie_word_embeddings=cfg.tie_word_embeddings,
        rope_theta=cfg.rope_theta,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
        bos_token_id=None,
        **extra,
    )
    config._attn_implementation = cfg.attn_implementation
    return config


def _build(model_cls: type[PreTrainedModel], config: Qwen2Config, seed: int) -> PreTrainedModel:
    # Seed only the initialisation, restoring the caller's RNG so building a model has no side effect.
    state = torch.random.get_rng_state()
    torch.manual_seed(seed)
    try:
        model = model_cls(config)
    finally:
        torch.random.set_rng_state(state)
    generation_config = getattr(model, "generation_config", None)
    if generation_config is not None:
        generation_config.pad_token_id = config.pad_token_id
        generation_config.eos_token_id = config.eos_token_id
    return model.float().eval()


def build_policy(tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None) -> Qwen2ForCausalLM:
    """A freshly initialised tiny Qwen2 causal LM over `tokenizer`'s vocabulary (float32)."""
    cfg = cfg or TinyModelConfig()
    return _build(Qwen2ForCausalLM, qwen2_config(tokenizer, cfg), cfg.seed)


def build_value_model(
    tokenizer: PreTrainedTokenizerBase, cfg: TinyModelConfig | None = None
) -> Qwen2ForSequenceClassification:
    """A tiny Qwen2 with a scalar head (`num_labels=1`) for the value or reward model."""
    cfg = cfg or TinyModelConfig()
    config = qwen2_config(tokenizer, cfg, num_labels=1)
    return _build(Qwen2ForSequenceClassification, config, cfg.seed + 1)
