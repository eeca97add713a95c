"""Forced turns, the machinery both experts share: each turn's text decided when the turn starts, then forced
token by token into the real rollout.

What: `PlannedTurnForcing` is a `TokenForcing` (`searchrl.rollout.loop`). When turn t of row r starts it asks
`next_text(r, t)` for the turn's text (a subclass decides it from the environment's state at that moment, so
it can read what the searches of earlier turns returned), records it in the row's plan, encodes it once and
then returns its ids one position at a time. `search_call` writes a search in the row's protocol and records
the query. The synthetic expert (`sft.expert.ExpertForcing`) and the real-question expert
(`sft.real_expert.RealExpertForcing`) differ only in `next_text`.

Why here: the two experts forced turns the same way, written twice; the token ends of a turn (EOS after a
chat turn, none after a search_r1 turn, whose closing tag is a stop string) must be the same for both.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Generic, Protocol, TypeVar

from transformers import PreTrainedTokenizerBase

from searchrl.env.protocol import format_search_r1_call, format_tool_call


class TurnPlan(Protocol):
    """What an expert has decided for one row: the text of each turn so far and the queries it searched."""

    texts: list[str]
    searches: list[str]


PlanT = TypeVar("PlanT", bound=TurnPlan)


class PlannedTurnForcing(Generic[PlanT]):
    """Forces each turn's text, decided by `next_text` when the turn starts (see the module docstring)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, envs: Sequence[Any], plans: Sequence[PlanT], k: int
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
            self._ids[key] = self._encode(row, text)
        ids = self._ids[key]
        return ids[position] if position < len(ids) else None

    def next_text(self, row: int, turn: int) -> str:
        """The text of turn `turn` of row `row`, decided now (the environment holds every earlier turn)."""
        raise NotImplementedError

    def search_call(self, row: int, query: str) -> str:
        """A search for `query` in the row's protocol (k documents in the chat protocol), recorded in its plan."""
        self.plans[row].searches.append(query)
        if self._protocol(row) == "chat":
            return format_tool_call("search", {"query": query, "k": self.k})
        return format_search_r1_call(query)

    def _turn_text(self, row: int, turn: int) -> str | None:
        plan = self.plans[row]
        if turn > len(plan.texts):  # an earlier turn was never decided: the episode took a path not planned
            return None
        if turn == len(plan.texts):
            plan.texts.append(self.next_text(row, turn))
        return plan.texts[turn]

    def _protocol(self, row: int) -> str:
        return str(getattr(getattr(self.envs[row], "config", None), "protocol", "chat"))

    def _encode(self, row: int, text: str) -> list[int]:
        ids = [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]
        # Chat turns end with EOS; search_r1 turns end where their closing tag ends (a stop string).
        return ids + [int(self.tokenizer.eos_token_id)] if self._protocol(row) == "chat" else ids
