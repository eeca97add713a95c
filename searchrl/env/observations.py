"""What a search shows the policy: sanitised, labelled documents and error observations, cut to size.

What: `ObservationWriter` turns a search's hits into the observation text (each document labelled in the
episode's citation style and the protocol's layout), and a rejected or failed call into an error observation
that says what went wrong and how to go on; every observation is cut to `max_observation_tokens` with
`TRUNCATION_MARKER`. `TokenCounter` counts and cuts text in tokens (of the tokenizer, or white-space words).

Why apart from `environment.py`: the environment decides *what* happens in a turn (budgets, batching,
termination); this module decides only how the outcome reads. Text the policy or a document wrote is
sanitised (`sanitize.sanitize_text`) before it is shown; the environment's own advice keeps its markup.
Truncation always counts tokens of the text itself (the budget's meter may count more: template glue).
"""

from __future__ import annotations

import re
from typing import Any

from searchrl.env.config import EnvConfig
from searchrl.env.guard import BatchOutcome
from searchrl.env.sanitize import sanitize_text
from searchrl.search.base import Hit

TRUNCATION_MARKER = "[... truncated]"


class TokenCounter:
    """Counts and cuts text in tokens of `tokenizer` (an HF tokenizer), or in white-space words."""

    _WORD = re.compile(r"\S+")

    def __init__(self, tokenizer: Any | None = None) -> None:
        self.tokenizer = tokenizer

    def count(self, text: str) -> int:
        if not text:
            return 0
        if self.tokenizer is None:
            return len(text.split())
        return len(self.tokenizer.encode(text, add_special_tokens=False))

    def head(self, text: str, n: int) -> str:
        """The longest prefix of `text` that is at most `n` tokens (cut on token boundaries)."""
        if n <= 0:
            return ""
        if self.tokenizer is None:
            words = list(self._WORD.finditer(text))
            return text if len(words) <= n else text[: words[n - 1].end()]
        try:
            enc = self.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
            offsets = enc["offset_mapping"]
            return text if len(offsets) <= n else text[: offsets[n - 1][1]]
        except (NotImplementedError, KeyError, TypeError, ValueError):  # slow tokenizer: decode a prefix
            ids = self.tokenizer.encode(text, add_special_tokens=False)
            return text if len(ids) <= n else self.tokenizer.decode(ids[:n])


class ObservationWriter:
    """The observations of one environment: its protocol's layout, citation style and size limit."""

    def __init__(self, config: EnvConfig, counter: TokenCounter, extra_special: Any) -> None:
        self.config = config
        self.counter = counter
        self.extra_special = extra_special  # the tokenizer's marker-like tokens, neutralised like the tags

    def sanitize(self, text: str) -> tuple[str, int]:
        """(`text` with markup neutralised, the number of injection attempts found in it)."""
        clean = sanitize_text(text, self.extra_special)
        return clean.text, clean.injection_attempts

    def error(self, status: str, detail: str, hint: str) -> str:
        """An error observation: the (sanitised) problem, then the environment's own trusted advice.

        The detail may quote the policy's text (a tool name, a JSON error), so it is sanitised; the hint is
        ours and keeps its real markup so the policy sees exactly how a correct call or answer looks."""
        return self.fit(f"Error ({status}): {self.sanitize(detail)[0]}. {hint}")

    def failure(self, outcome: BatchOutcome) -> str:
        """The observation of a search that failed (timeout, unavailable, ...): what to do about it."""
        return self.fit(self.sanitize(_failure_message(outcome, self.config))[0])

    def documents(
        self, query: str, hits: list[Hit], source_numbers: dict[str, int]
    ) -> tuple[str, dict[str, str], int]:
        """Labelled documents -> (observation text, {doc_id: shown title+text}, injection attempts).

        With citation_style "number", a document new to the episode gets the next number in
        `source_numbers` (updated in place), unless the size limit cut it off before it was shown."""
        if not hits:
            shown_query = self.sanitize(query)[0]
            return self.fit(f'No documents found for "{shown_query}". Try other keywords.'), {}, 0
        blocks: list[tuple[str, str, str, str]] = []  # (doc_id, title, header, body)
        injections = 0
        numbered = self.config.citation_style == "number"
        numbered_before = len(source_numbers)
        for rank, hit in enumerate(hits, start=1):
            doc_id, n0 = self.sanitize(hit.doc_id)
            title, n1 = self.sanitize(" ".join(hit.title.split()))
            body, n2 = self.sanitize(hit.text.strip())
            injections += n0 + n1 + n2
            if numbered:  # the episode's running number is the document's label; its id is not shown
                label = source_numbers.setdefault(hit.doc_id, len(source_numbers) + 1)
                header = (
                    f"[{label}] {title}"
                    if self.config.protocol == "chat"
                    else f"Doc {label} (Title: {title})"
                )
            elif self.config.protocol == "chat":
                header = f"[{rank}] (id: {doc_id}) {title}".rstrip()
            else:
                header = f"Doc {rank} (id: {doc_id}, Title: {title})"
            blocks.append((hit.doc_id, title, header, body))
        text, kept = self._fit_blocks([(header, body) for _, _, header, body in blocks])
        shown = {
            doc_id: f"{title}\n{body}" for (doc_id, title, _, _), body in zip(blocks, kept, strict=False)
        }
        if numbered:  # a document cut off by the observation limit was never shown: it keeps no number
            for doc_id, _, _, _ in blocks[len(kept) :]:
                if doc_id not in shown and source_numbers.get(doc_id, 0) > numbered_before:
                    del source_numbers[doc_id]
        return text, shown, injections

    def fit(self, text: str) -> str:
        """Cut a plain observation to `max_observation_tokens`, marker included."""
        limit = self.config.max_observation_tokens
        if self.counter.count(text) <= limit:
            return text
        n = limit - self.counter.count(TRUNCATION_MARKER) - 1
        while n > 0:
            candidate = f"{self.counter.head(text, n)}\n{TRUNCATION_MARKER}"
            if self.counter.count(candidate) <= limit:
                return candidate
            n -= 1
        return TRUNCATION_MARKER

    def _join_block(self, header: str, body: str) -> str:
        sep = "\n" if self.config.protocol == "chat" else " "
        return f"{header}{sep}{body}" if body else header

    def _join_blocks(self, blocks: list[str]) -> str:
        return ("\n\n" if self.config.protocol == "chat" else "\n").join(blocks)

    def _fit_blocks(self, blocks: list[tuple[str, str]]) -> tuple[str, list[str]]:
        """Join document blocks within `max_observation_tokens`: whole blocks first, then a cut one.

        Returns the text and the body shown of each document kept (in order)."""
        limit = self.config.max_observation_tokens
        full = self._join_blocks([self._join_block(h, b) for h, b in blocks])
        if self.counter.count(full) <= limit:
            return full, [b for _, b in blocks]
        kept_text: list[str] = []
        kept_bodies: list[str] = []
        for header, body in blocks:
            whole = self._join_block(header, body)
            if self._fits(kept_text + [whole], limit):
                kept_text.append(whole)
                kept_bodies.append(body)
                continue
            cut = self._longest_body_that_fits(kept_text, header, body, limit)
            if cut is not None:
                kept_text.append(self._join_block(header, cut) if cut else header)
                kept_bodies.append(cut)
            break
        return self._join_blocks(kept_text + [TRUNCATION_MARKER]), kept_bodies

    def _fits(self, blocks: list[str], limit: int) -> bool:
        return self.counter.count(self._join_blocks(blocks + [TRUNCATION_MARKER])) <= limit

    def _longest_body_that_fits(self, kept: list[str], header: str, body: str, limit: int) -> str | None:
        if not self._fits(kept + [header], limit):
            return None
        lo, hi = 0, self.counter.count(body)  # binary search on the number of body tokens
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._fits(kept + [self._join_block(header, self.counter.head(body, mid))], limit):
                lo = mid
            else:
                hi = mid - 1
        return self.counter.head(body, lo)


def _failure_message(outcome: BatchOutcome, cfg: EnvConfig) -> str:
    """What went wrong with the search and what the policy can do about it."""
    detail = f" ({outcome.error})" if outcome.error else ""
    advice = {
        "timeout": f"the search timed out after {cfg.search_timeout_s:g} s{detail}. Try again with a shorter, "
        "more specific query, or answer with what you have found.",
        "unavailable": f"the search service is unavailable{detail}. Try again later, or answer with what you "
        "have found.",
        "bad_request": f"the search service rejected the request{detail}. Rephrase the query with plain words.",
        "circuit_open": f"the search service is failing repeatedly and is paused{detail}. Answer with what you "
        "have found so far.",
    }.get(
        outcome.status,
        f"the search failed{detail}. Try again with other words, or answer with what you have.",
    )
    return f"Error ({outcome.status}): {advice}"
