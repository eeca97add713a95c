"""The tokenizer of an imported GGUF model: converted by transformers, then fixed where the GGUF's differs.

Fixes to what the GGUF gives, each recorded in the import's manifest:

- pad token: SmolLM2 pads with EOS (`<|im_end|>`), which `load_tokenizer` refuses (a mask built by
  comparing ids with the pad id would hide real EOS tokens). `choose_pad_token` takes one of the
  vocabulary's existing special tokens that nothing uses; no token is added, so the embedding matrix is
  unchanged;
- pre-tokenizer: the GGUF says `tokenizer.ggml.pre = smollm` (digits split one by one before GPT-2's
  byte-level regex), but transformers' converter keeps only the byte-level step, so white space before a
  digit tokenises differently from training ("x  1": `Ġ Ġ 1` instead of `ĠĠ 1`). The digit split is put back;
- length limit: the converter leaves `model_max_length` at 1e30; it becomes the model's 8192 positions;
- chat template: SmolLM2's ChatML template renders `content` only, so tool calls vanish. With
  `tool_template=True` the package's `templates/smollm2_tools.jinja` replaces it (see `tool_chat_template`).

Not fixable without new tokens, so only recorded: the vocabulary has no token for 21 bytes
(`bytes_without_a_token`); text holding them loses them when encoded.

transformers is imported inside `load_gguf_tokenizer` (trl inside `prepare_tokenizer`), so the `searchrl models`
commands' `--help` loads neither.
"""

from __future__ import annotations

import copy
import hashlib
import importlib.resources
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tokenizers import pre_tokenizers

from searchrl.models.gguf_file import GGUFImportError

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedTokenizerBase

TOOL_TEMPLATE_NAME = "smollm2_tools.jinja"
# Gemma 3 (a gemma3 GGUF): its own turn markup, and its turn-end token as EOS (the rollout stops at EOS).
GEMMA_TEMPLATE_NAME = "gemma3_tools.jinja"
GEMMA_END_OF_TURN = "<end_of_turn>"


@dataclass
class PadChoice:
    """The pad token picked from the vocabulary, and why."""

    token: str
    id: int
    why: str
    candidates: list[str] = field(default_factory=list)
    untrained: list[str] = field(default_factory=list)


def tool_chat_template(architecture: str | None = None) -> str:
    """searchrl's SmolLM2 chat template with tool calls (package data `templates/smollm2_tools.jinja`); for
    `architecture` "gemma3", the Gemma 3 one (`templates/gemma3_tools.jinja`, Gemma's turns, the same tool layout).

    It renders exactly what SmolLM2's own template renders for conversations without tools, and adds
    what the `chat` protocol needs: the tool schemas in the system turn, an assistant turn's `tool_calls`
    as Qwen2.5-style `<tool_call>` JSON blocks, and consecutive `tool` messages as one user turn of
    `<tool_response>` blocks. The `search_r1` protocol works with either template."""
    name = GEMMA_TEMPLATE_NAME if architecture == "gemma3" else TOOL_TEMPLATE_NAME
    return (
        importlib.resources.files("searchrl.models").joinpath("templates", name).read_text(encoding="utf-8")
    )


def _special_token_ids(tokenizer: PreTrainedTokenizerBase) -> dict[str, int]:
    return {
        str(tok.content): int(i)
        for i, tok in sorted(tokenizer.added_tokens_decoder.items())
        if getattr(tok, "special", False)
    }


def choose_pad_token(
    tokenizer: PreTrainedTokenizerBase,
    embeddings: torch.Tensor | None = None,
    templates: tuple[str | None, ...] = (),
) -> PadChoice:
    """Pick a pad token among the vocabulary's special tokens that nothing uses.

    Candidates: special tokens that are not BOS, EOS or UNK (SmolLM2's UNK, `<|endoftext|>`, is also its
    pretraining document separator) and do not appear in any of `templates`. Among them, tokens whose
    embedding row equals another candidate's were never trained apart (the model has no use for them) and
    are preferred; of those, the one with the highest id. Raises when no candidate exists (a tokenizer with
    no spare special token needs a new one, which would change the embedding matrix)."""
    reserved = {tokenizer.bos_token, tokenizer.eos_token, tokenizer.unk_token}
    specials = _special_token_ids(tokenizer)
    candidates = [t for t in specials if t not in reserved and not any(tpl and t in tpl for tpl in templates)]
    if not candidates:
        raise GGUFImportError(
            "the vocabulary has no spare special token to pad with (all are BOS/EOS/UNK or used by the chat "
            "template); add a pad token and resize the embeddings yourself"
        )
    untrained: list[str] = []
    rows: dict[str, torch.Tensor] = {}
    if embeddings is not None:
        rows = {t: embeddings[specials[t]] for t in candidates if specials[t] < embeddings.shape[0]}
        untrained = [
            t for t in candidates if t in rows and any(u != t and rows[t].equal(rows[u]) for u in rows)
        ]
    pool = untrained or candidates
    token = max(pool, key=lambda t: specials[t])
    why = (
        f"{tokenizer.eos_token!r} is EOS, and pad must differ from it; {token!r} is an existing special token "
        "that is not BOS/EOS/UNK and is not used by the chat template"
    )
    if untrained:
        twins = [u for u in untrained if u != token and rows[token].equal(rows[u])]
        why += (
            f"; its embedding row is identical to that of {', '.join(twins)}, a sign that training never used it "
            f"({len(untrained)} of the {len(candidates)} candidates share a row with another); the highest id "
            "among those"
        )
    else:
        why += "; the highest id among the candidates"
    why += ". No token was added: the embedding matrix is unchanged."
    return PadChoice(token=token, id=specials[token], why=why, candidates=candidates, untrained=untrained)


def restore_smollm_pretokenizer(tokenizer: PreTrainedTokenizerBase, gguf_pre: str | None) -> bool:
    """Put back the digit split of `tokenizer.ggml.pre = smollm` that transformers' converter drops.

    Returns whether the pre-tokenizer changed (False for other `pre` values or when already present)."""
    if gguf_pre != "smollm":
        return False

    backend = tokenizer.backend_tokenizer
    state = json.loads(backend.to_str()).get("pre_tokenizer") or {}
    if "Digits" in json.dumps(state):
        return False
    if state.get("type") != "ByteLevel":
        raise GGUFImportError(
            f"unexpected pre-tokenizer {state.get('type')!r} from the GGUF converter (expected ByteLevel); "
            "this transformers version converts GGUF tokenizers differently, see constraints.txt"
        )
    backend.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Digits(individual_digits=True),
            pre_tokenizers.ByteLevel(add_prefix_space=False, trim_offsets=True, use_regex=True),
        ]
    )
    return True


def _byte_symbols() -> dict[int, str]:
    """Byte-level BPE's printable stand-in for each byte (printable Latin-1 bytes stand for themselves, the
    others take the code points from 256 on, in byte order)."""
    keep = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    others = [b for b in range(256) if b not in keep]
    return {**{b: chr(b) for b in keep}, **{b: chr(256 + i) for i, b in enumerate(others)}}


def bytes_without_a_token(tokenizer: PreTrainedTokenizerBase) -> list[int]:
    """Bytes that a byte-level BPE vocabulary has no token for: encoding silently drops them.

    SmolLM2's vocabulary lacks 21: bytes that never occur in UTF-8 (0xC0, 0xC1, 0xF5-0xFF), the lead bytes
    0xF1 and 0xF2 (code points U+40000-U+BFFFF, unassigned) and six control characters."""
    vocab = tokenizer.get_vocab()
    return sorted(b for b, symbol in _byte_symbols().items() if symbol not in vocab)


def prepare_tokenizer(
    tokenizer: PreTrainedTokenizerBase,
    pad: PadChoice,
    tool_template: bool = True,
    model_max_length: int | None = None,
    architecture: str | None = None,
) -> dict[str, Any]:
    """Set the pad token, left padding, the length limit and (optionally) the tool chat template.

    Returns the facts for the manifest. The tool template also gets TRL's Qwen-style `response_template`
    (the tool-call layout is Qwen2.5's), so `tokenizer.parse_response` reads its tool calls. For a gemma3 model
    the template is Gemma's (`tool_chat_template(architecture)`) and EOS becomes `<end_of_turn>`, the token that
    ends its turns (the base model's `<eos>` ends a document, not a turn)."""
    original = tokenizer.chat_template
    tokenizer.pad_token = pad.token
    tokenizer.padding_side = "left"
    if model_max_length:
        tokenizer.model_max_length = int(model_max_length)
    facts: dict[str, Any] = {
        "original_sha256": _sha256_text(original),
        "original": original,
        "installed": "original",
        "response_template": None,
    }
    if tool_template:
        tokenizer.chat_template = tool_chat_template(architecture)
        name = GEMMA_TEMPLATE_NAME if architecture == "gemma3" else TOOL_TEMPLATE_NAME
        facts["installed"] = f"searchrl/models/templates/{name}"
        if architecture == "gemma3":
            facts["eos_token_was"] = tokenizer.eos_token
            tokenizer.eos_token = GEMMA_END_OF_TURN
        try:
            from trl.chat_template_utils import qwen3_template
        except ImportError:  # an older trl: parse_response stays unavailable, the chat protocol still works
            qwen3_template = None
        if qwen3_template is not None:
            tokenizer.response_template = copy.deepcopy(qwen3_template)
            facts["response_template"] = "trl.chat_template_utils.qwen3_template"
    facts["sha256"] = _sha256_text(tokenizer.chat_template)
    return facts


def _sha256_text(text: str | None) -> str | None:
    return None if text is None else hashlib.sha256(text.encode("utf-8")).hexdigest()


def load_gguf_tokenizer(path: Path) -> PreTrainedTokenizerBase:
    """The tokenizer that transformers converts from the GGUF file (slow: seconds)."""
    from transformers import AutoTokenizer  # deferred, like torch: the CLI reads this module for --help

    return AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name, local_files_only=True)
