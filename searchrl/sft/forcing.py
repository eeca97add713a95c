"""Forced turns, the one rule for every forced episode: each turn's text decided when the turn starts, then
forced token by token into the real rollout.

What: `PlannedTurnForcing` is a `TokenForcing` (`searchrl.rollout.loop`). When turn t of row r starts it asks
`next_text(r, t)` for the turn's text (a subclass decides it from the environment's state at that moment, so
it can read what the searches of earlier turns returned), records it in the row's plan, encodes it once and
then returns its ids one position at a time; None (nothing forced) lets the model write that turn and every
later one. A whole turn ends as the protocol ends it; a prefix (`is_prefix`) is continued by the model.
`search_call` writes a search in the row's protocol and records the query. Three forcings differ only in
`next_text`: the synthetic expert (`sft.expert.ExpertForcing`), the real-question expert
(`sft.real_expert.RealExpertForcing`) and the base-model baselines (`BaselineForcing` below: closed book and
naive RAG force the first turns, the zero-shot agent nothing).

Why here: the experts and the baselines forced turns the same way, written three times; the token ends of a
turn (EOS after a chat turn, none after a search_r1 turn, whose closing tag is a stop string) must be the
same for all.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, Protocol, TypeVar

from transformers import PreTrainedTokenizerBase

from searchrl.env.protocol import ANSWER_OPEN, format_search_r1_call, format_tool_call

# The base-model baselines a real-model demo measures before training (`BaselineForcing`).
BASELINES: tuple[str, ...] = ("closed_book", "naive_rag", "zero_shot")


class TurnPlan(Protocol):
    """What an expert has decided for one row: the text of each turn so far and the queries it searched."""

    texts: list[str]
    searches: list[str]


PlanT = TypeVar("PlanT", bound=TurnPlan)


class PlannedTurnForcing(Generic[PlanT]):
    """Forces each turn's text, decided by `next_text` when the turn starts (see the module docstring)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, envs: Sequence[Any], plans: Sequence[PlanT], k: int | None
    ) -> None:
        self.tokenizer = tokenizer
        self.envs = list(envs)
        self.plans = list(plans)
        self.k = k
        self._ids: dict[tuple[int, int], list[int]] = {}

    def __call__(self, row: int, turn: int, position: int) -> int | None:
        key = (row, turn)
        if key not in self._ids:
            text = self._turn_text(row, turn)
            if text is None:
                return None
            self._ids[key] = self._encode(row, text, whole_turn=not self.is_prefix(row, turn))
        ids = self._ids[key]
        return ids[position] if position < len(ids) else None

    def next_text(self, row: int, turn: int) -> str | None:
        """The text of turn `turn` of row `row`, decided now (the environment holds every earlier turn); None
        forces nothing from this turn on."""
        raise NotImplementedError

    def is_prefix(self, row: int, turn: int) -> bool:
        """Whether the forced text of this turn is only its start, which the model continues (no turn end)."""
        return False

    def search_call(self, row: int, query: str) -> str:
        """A search for `query` in the row's protocol (k documents in the chat protocol; no `k` argument when
        k is None: the environment's top-k), recorded in its plan."""
        self.plans[row].searches.append(query)
        if self._protocol(row) == "chat":
            arguments: dict[str, Any] = {"query": query} if self.k is None else {"query": query, "k": self.k}
            return format_tool_call("search", arguments)
        return format_search_r1_call(query)

    def _turn_text(self, row: int, turn: int) -> str | None:
        plan = self.plans[row]
        if turn > len(plan.texts):  # an earlier turn was never decided: the episode took a path not planned
            return None
        if turn == len(plan.texts):
            text = self.next_text(row, turn)
            if text is None:  # nothing forced: the model writes this turn (and every later one)
                return None
            plan.texts.append(text)
        return plan.texts[turn]

    def _protocol(self, row: int) -> str:
        return str(getattr(getattr(self.envs[row], "config", None), "protocol", "chat"))

    def _encode(self, row: int, text: str, whole_turn: bool = True) -> list[int]:
        ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        # Chat turns end with EOS; search_r1 turns end where their closing tag ends (a stop string); a prefix
        # does not end: the model goes on from it.
        ends_with_eos = whole_turn and self._protocol(row) == "chat"
        return ids + [int(self.tokenizer.eos_token_id)] if ends_with_eos else ids


def question_query(question: str, limit: int = 256) -> str:
    """The question as a search query: white space collapsed, cut at a word boundary to `limit` characters.

    The first search of the real-question expert and naive RAG's one search."""
    text = " ".join(question.split())
    if len(text) <= limit:
        return text
    cut = text[:limit].rsplit(" ", 1)[0]
    return cut or text[:limit]


@dataclass
class BaselinePlan:
    """One row of a baseline: its question row and what was forced so far."""

    row: dict[str, Any]
    texts: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)


class BaselineForcing(PlannedTurnForcing[BaselinePlan]):
    """A base-model baseline's forced turns; the model writes everything after them.

    closed_book: turn 0 starts with `<answer>` (with a search engine that finds nothing, what the model knows
    alone); naive_rag: turn 0 is the search for the question text (`question_query`), turn 1 starts with
    `<answer>` (retrieval without an agent); zero_shot: nothing is forced (the protocol's prompt alone; use no
    forcing at all, `baseline_forcing` returns None for it). A chat search names no `k`: the environment's.
    """

    SCRIPTS = {"closed_book": ("answer",), "naive_rag": ("search", "answer"), "zero_shot": ()}

    def __init__(
        self,
        baseline: str,
        tokenizer: PreTrainedTokenizerBase,
        envs: Sequence[Any],
        rows: Sequence[dict[str, Any]],
        max_query_chars: int = 256,
    ) -> None:
        if baseline not in self.SCRIPTS:
            raise ValueError(f"baseline {baseline!r}: choose one of {list(BASELINES)}")
        super().__init__(tokenizer, envs, [BaselinePlan(dict(r)) for r in rows], k=None)
        self.script = self.SCRIPTS[baseline]
        self.max_query_chars = max_query_chars

    def next_text(self, row: int, turn: int) -> str | None:
        if turn >= len(self.script):
            return None
        if self.script[turn] == "search":
            question = str(self.plans[row].row["question"])
            return self.search_call(row, question_query(question, self.max_query_chars))
        return ANSWER_OPEN

    def is_prefix(self, row: int, turn: int) -> bool:
        return self.script[turn] == "answer"  # `<answer>` opens the turn; the model writes the answer


def baseline_forcing(
    baseline: str | None,
    tokenizer: PreTrainedTokenizerBase,
    envs: Sequence[Any],
    rows: Sequence[dict[str, Any]],
    max_query_chars: int = 256,
) -> BaselineForcing | None:
    """The forcing of `baseline` for one batch of rows; None when nothing is forced (None or zero_shot)."""
    if baseline is not None and baseline not in BASELINES:
        raise ValueError(f"baseline {baseline!r}: choose one of {list(BASELINES)} or None")
    if baseline in (None, "zero_shot"):
        return None
    return BaselineForcing(baseline, tokenizer, envs, rows, max_query_chars)
