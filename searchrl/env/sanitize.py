"""Neutralise markup inside retrieved text so a document can never forge a turn, a tool call or an answer.

Retrieved documents are untrusted (indirect prompt injection, Greshake et al. 2023). Two kinds of text
would be dangerous if they reached the policy's context verbatim:

- chat special tokens (``<|im_start|>``, ``<|im_end|>``, ``<|endoftext|>``, any ``<|...|>``, plus the
  tokenizer's own special tokens when one is given): a tokenizer would turn them into real control
  tokens, so a document could close the tool message and open a fake assistant turn;
- the protocol's own tags (``<tool_call>``, ``<tool_response>``, ``<answer>``, ``<search>``,
  ``<information>``, ``<think>``, ``<tools>`` and their closing forms, in any case and with spaces
  inside the brackets): `parse_turn` or a reward function reading the trajectory would take them as
  markup.

A third kind is noise that no reader sees but a tokenizer does: control characters (C0 except tab, newline
and carriage return; DEL; C1) and the bidirectional overrides and isolates (U+202A-U+202E, U+2066-U+2069,
the "Trojan Source" trick that makes text read differently from how it is stored). Byte-level BPE turns
each into byte tokens a small model never saw; each becomes U+FFFD (the replacement character), one per
character, so lengths and positions hold. They are not counted as injection attempts (broken scrapes hold
them too), but `control_characters` in the result says how many were replaced.

How: the angle brackets of every match are replaced by the look-alikes ``‹`` (U+2039) and ``›``
(U+203A), and the bars of ``<|...|>`` by ``¦`` (U+00A6). People still read the text as it was; no
tokenizer special token and no parser tag survives. Each neutralised match counts as one injection
attempt (the ``injection_attempts`` metric).
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass

PROTOCOL_TAGS = ("tool_call", "tool_response", "answer", "search", "information", "think", "tools")

_SPECIAL_TOKEN = re.compile(r"<\s*\|[^<>|]{0,64}\|\s*>")
_PROTOCOL_TAG = re.compile(r"<\s*/?\s*(?:" + "|".join(PROTOCOL_TAGS) + r")\s*/?\s*>", re.IGNORECASE)

_CONTROL = re.compile("[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]")

LEFT, RIGHT, BAR = "\u2039", "\u203a", "\u00a6"
REPLACEMENT = "\ufffd"


@dataclass(frozen=True)
class Sanitized:
    """The neutralised text and how many injection attempts were neutralised in it."""

    text: str
    injection_attempts: int
    control_characters: int = 0


def _defang(fragment: str) -> str:
    return fragment.replace("<", LEFT).replace(">", RIGHT).replace("|", BAR)


def sanitize_text(text: str, extra_tokens: Iterable[str] = ()) -> Sanitized:
    """Neutralise special tokens and protocol tags in `text` (see the module docstring)."""
    count = 0
    text, controls = _CONTROL.subn(REPLACEMENT, text)

    def replace(match: re.Match[str]) -> str:
        nonlocal count
        count += 1
        return _defang(match.group(0))

    text = _SPECIAL_TOKEN.sub(replace, text)
    text = _PROTOCOL_TAG.sub(replace, text)
    # Tokenizer-specific special tokens that do not look like <|...|> (e.g. "<s>", "[SEP]").
    for token in sorted({t for t in extra_tokens if t}, key=len, reverse=True):
        if token in text:
            count += text.count(token)
            text = text.replace(token, _defang_literal(token))
    return Sanitized(text=text, injection_attempts=count, control_characters=controls)


def _defang_literal(token: str) -> str:
    defanged = _defang(token)
    if defanged != token:
        return defanged
    # No bracket to swap (e.g. "[SEP]", "</s>" already handled): break it with a zero-width joiner.
    return token[0] + "\u2060" + token[1:]


def special_tokens_of(tokenizer: object | None) -> list[str]:
    """Every special/added token string of an HF tokenizer (empty list without one)."""
    if tokenizer is None:
        return []
    tokens: set[str] = set()
    for attr in ("all_special_tokens",):
        value = getattr(tokenizer, attr, None)
        if value:
            tokens.update(str(t) for t in value)
    decoder = getattr(tokenizer, "added_tokens_decoder", None)
    if isinstance(decoder, dict):
        tokens.update(str(t) for t in decoder.values())
    # Only marker-like tokens: an added plain word ("search") must not be mangled in ordinary text.
    return sorted(t for t in tokens if len(t) > 1 and any(ch in t for ch in "<>[]|"))
