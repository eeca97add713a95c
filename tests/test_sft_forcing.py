"""Forced turns (`searchrl.sft.forcing.PlannedTurnForcing`): each turn's text decided when the turn starts,
recorded in the row's plan, and forced token by token, ending where the protocol ends a turn.

The unit tests drive the hook as the rollout engine does (row, turn, position); the last test forces a
search-then-answer episode through the real engine and environment (the Varnholt world of conftest.py)
and reads the forced text back out of the trajectory, in both protocols.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from types import SimpleNamespace
from typing import Any

import pytest

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_search_r1_call, format_tool_call
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.sft.forcing import PlannedTurnForcing


@dataclass
class Plan:
    texts: list[str] = field(default_factory=list)
    searches: list[str] = field(default_factory=list)


class SearchThenAnswer(PlannedTurnForcing[Plan]):
    """Turn 0 searches "Varnholt"; turn 1 answers with (and cites) the first document that search found."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.decided: list[tuple[int, int]] = []

    def next_text(self, row: int, turn: int) -> str:
        self.decided.append((row, turn))
        env = self.envs[row]
        if turn == 0:
            return self.search_call(row, "Varnholt")
        found = [d for rec in env.records for d in rec.doc_ids][:1]
        return format_answer(found[0] if found else "nothing", found)


class CharTokenizer:
    """One id per character (ord), EOS 1: what was forced can be read back exactly."""

    eos_token_id = 1

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def _env(protocol: str) -> Any:
    return SimpleNamespace(config=SimpleNamespace(protocol=protocol), records=[])


def _turn(forcing: PlannedTurnForcing, row: int, turn: int) -> list[int]:
    """Every id the hook forces for one turn, position by position, until it says the turn has ended."""
    ids: list[int] = []
    while (token := forcing(row, turn, len(ids))) is not None:
        ids.append(token)
        assert len(ids) < 1000
    return ids


@pytest.mark.parametrize("protocol", ["chat", "search_r1"])
def test_a_turn_is_decided_once_and_forced_token_by_token(protocol):
    plans = [Plan()]
    forcing = SearchThenAnswer(CharTokenizer(), [_env(protocol)], plans, k=3)
    ids = _turn(forcing, 0, 0)
    expected = (
        format_tool_call("search", {"query": "Varnholt", "k": 3})
        if protocol == "chat"
        else format_search_r1_call("Varnholt")
    )
    # A chat turn ends with EOS; a search_r1 turn ends where its closing tag ends (a stop string).
    eos = [CharTokenizer.eos_token_id] if protocol == "chat" else []
    assert ids == [ord(c) for c in expected] + eos
    assert plans[0].texts == [expected] and plans[0].searches == ["Varnholt"]
    assert _turn(forcing, 0, 0) == ids  # asked again: the same ids, not a new decision
    assert forcing.decided == [(0, 0)]


def test_each_row_has_its_own_plan_and_an_unplanned_turn_forces_nothing():
    plans = [Plan(), Plan()]
    forcing = SearchThenAnswer(CharTokenizer(), [_env("chat"), _env("search_r1")], plans, k=2)
    assert forcing(1, 1, 0) is None  # turn 0 of row 1 was never decided: the episode left the plan
    assert forcing.decided == [] and plans[1].texts == []
    _turn(forcing, 1, 0)
    assert forcing.decided == [(1, 0)] and plans[0] == Plan()
    assert plans[1].texts == [format_search_r1_call("Varnholt")]


@pytest.mark.parametrize("protocol", ["chat", "search_r1"])
def test_forced_turns_come_out_of_the_real_rollout_as_planned(world, protocol):
    tok = world["tok"]
    rows = [{"id": "q1", "question": "In which province is Varnholt?", "golds": ["Quessa"]}]
    envs = [SearchEnvironment(world["backend"], EnvConfig(protocol=protocol, max_turns=3), tokenizer=tok)]
    plans = [Plan()]
    forcing = SearchThenAnswer(tok, envs, plans, k=2)
    generation = GenerationConfig(max_new_tokens_per_turn=96, max_episode_tokens=600)
    traj = HFGenerator(world["policy"], tok, generation, forcing=forcing).rollout(envs, rows).trajectories[0]

    assert forcing.decided == [(0, 0), (0, 1)]  # turn 1 was decided after turn 0's search had run
    assert [c.arguments["query"] for c in traj.tool_calls] == ["Varnholt"] == plans[0].searches
    cited = traj.tool_calls[0].doc_ids[0]
    assert plans[0].texts[1] == format_answer(cited, [cited])
    assert traj.termination == "answered" and traj.num_turns == 2
    assert traj.answer == cited and traj.citations == [cited]
    # The sampled tokens are exactly the forced ones: each action span decodes to its planned text.
    actions = [tok.decode(traj.input_ids[s.start : s.end], skip_special_tokens=True) for s in traj.spans]
    actions = [a for a, s in zip(actions, traj.spans, strict=True) if s.kind == "action"]
    assert [a.strip() for a in actions] == plans[0].texts
