"""Format, cost, safety and the length cap; rl_methods.md §8 invariants 17 (stuffing) and 18 (format)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchrl.common.trajectory import ToolCallRecord, Trajectory
from searchrl.env.protocol import format_answer, parse_turn
from searchrl.rewards.qa import ContainsReward, ExactMatchReward, F1Reward
from searchrl.rewards.shaping import (
    AnswerLengthPenalty,
    FormatReward,
    SafetyPenalty,
    SearchCost,
    SearchCount,
    TokenCost,
    extract_answer,
    format_problems,
)

GOLDS = ["Port Velmora", "Velmora"]


def _traj(final_text: str = "", *, answer: str | None = None, statuses=(), action_tokens: int = 0, **kw):
    if answer is None and final_text:
        answer, citations = extract_answer(final_text)
        kw.setdefault("citations", citations)
    return Trajectory(
        id="t",
        question_id="q",
        question="Where was Alda Korin born?",
        golds=kw.pop("golds", GOLDS),
        final_text=final_text,
        answer=answer,
        termination=kw.pop("termination", "answered"),
        tool_calls=[ToolCallRecord(name="search", arguments={"query": "x"}, status=s) for s in statuses],
        action_mask=[1] * action_tokens,
        **kw,
    )


candidate_names = st.lists(
    st.sampled_from(["Fort Kesh", "Lake Dorin", "Tavos", "New Brel", "Mount Zir", "Kesh", "Alda Korin"]),
    min_size=1,
    max_size=6,
)


@given(
    others=candidate_names,
    gold=st.sampled_from(GOLDS),
    position=st.integers(0, 6),
    sep=st.sampled_from([", ", " or ", "; "]),
)
def test_invariant_17_stuffing_does_not_pay(others, gold, position, sep):
    candidates = list(others)
    candidates.insert(min(position, len(candidates)), gold)
    stuffed = _traj(answer=sep.join(candidates))
    bare = _traj(answer=gold)
    for reward in (F1Reward(), ExactMatchReward()):
        assert reward(stuffed) < reward(bare) == 1.0
    assert ExactMatchReward()(stuffed) == 0.0
    # Over the length cap, correctness is 0 however the gold is placed.
    over_cap = _traj(answer=sep.join([*candidates] * 10))
    assert F1Reward(max_answer_words=16)(over_cap) == 0.0
    assert AnswerLengthPenalty(max_answer_words=16)(over_cap) == -1.0
    assert AnswerLengthPenalty(max_answer_words=16)(bare) == 0.0
    # The deliberately hackable sub-EM does pay for stuffing: that is what the audit must catch.
    assert ContainsReward()(stuffed) == ContainsReward()(bare) == 1.0


@pytest.mark.parametrize(
    ("final_text", "problem"),
    [
        ("Port Velmora", "no <answer> block"),
        ("<answer>Port Velmora", "found 1 open and 0 close"),
        ("<answer>Port Velmora</answer> <answer>Fort Kesh</answer>", "found 2 open and 2 close"),
        ("<answer>Port <answer>Velmora</answer>", "found 2 open and 1 close"),
        ("</answer>Port Velmora<answer>", "comes before"),
        ("<answer>  [d000001] </answer>", "is empty"),
        ("<answer>Port Velmora</answer><tool_call>{}</tool_call>", "stray protocol markup '<tool_call>'"),
        (
            "<answer>Port Velmora <information>x</information></answer>",
            "stray protocol markup '<information>'",
        ),
        ("<search>q</search><answer>Port Velmora</answer>", "stray protocol markup '<search>'"),
        ("<answer>Port Velmora</answer>< Tool_Call >{}", "stray protocol markup '< Tool_Call >'"),
        ("<|im_start|>assistant\n<answer>Port Velmora</answer>", "stray protocol markup '<|im_start|>'"),
    ],
)
def test_invariant_18_format_validator_rejects_malformed_answers(final_text, problem):
    assert any(problem in p for p in format_problems(final_text)), format_problems(final_text)
    assert FormatReward(ok=1.0, fail=-1.0)(_traj(final_text, answer="")) == -1.0


@pytest.mark.parametrize(
    "final_text",
    [
        "<answer>Port Velmora [d000012]</answer>",
        "I found it. <answer>Port Velmora</answer>",
        "<answer>Port Velmora</answer><|im_end|>",
        "<think>two hops</think>\n<answer> port velmora [d1] [d2] </answer>\n",
    ],
)
def test_invariant_18_format_validator_accepts_one_well_formed_answer(final_text):
    assert format_problems(final_text) == []
    assert FormatReward()(_traj(final_text)) == 1.0
    # Not having answered (e.g. out of turns) is a format failure even with good-looking text.
    assert FormatReward()(_traj(final_text, termination="max_turns")) == 0.0


@given(
    st.sampled_from(GOLDS),
    st.sampled_from([str.upper, str.lower, lambda s: f"  {s} ", lambda s: s.replace(" ", "  ")]),
)
def test_invariant_18_reward_is_invariant_to_gold_case_and_white_space(gold, change):
    traj = _traj("<answer>Port Velmora [d1]</answer>")
    changed = _traj("<answer>Port Velmora [d1]</answer>", golds=[change(g) for g in GOLDS])
    for reward in (F1Reward(), ExactMatchReward(), FormatReward()):
        assert reward(traj) == reward(changed)


answer_text = st.text(
    alphabet=st.characters(blacklist_characters="[]<>", blacklist_categories=("Cs",)), max_size=30
)
doc_ids = st.lists(st.from_regex(r"d[0-9]{6}", fullmatch=True), max_size=3)


@given(answer_text, doc_ids)
def test_extract_answer_round_trips_the_env_format_and_agrees_with_the_parser(answer, citations):
    text = format_answer(answer, citations)
    got_answer, got_citations = extract_answer(text)
    assert got_answer == " ".join(answer.split()) and got_citations == citations
    turn = parse_turn(text)
    assert (turn.answer, turn.citations) == (got_answer, got_citations)


@given(st.text(max_size=200))
def test_extract_answer_and_format_problems_never_raise(text):
    answer, citations = extract_answer(text)
    assert answer is None or isinstance(answer, str)
    assert isinstance(format_problems(text), list) and isinstance(citations, list)


def test_search_cost_charges_only_beyond_the_free_quota():
    cost = SearchCost(free_searches=2, per_search=0.1)
    assert cost(_traj(statuses=["ok"] * 2)) == 0.0
    assert cost(_traj(statuses=["ok"] * 5)) == pytest.approx(-0.3)
    assert SearchCount()(_traj(statuses=["ok", "timeout"])) == 2.0


def test_token_cost_charges_only_over_the_budget():
    cost = TokenCost(token_budget=100, per_token=0.01)
    assert cost(_traj(action_tokens=100)) == 0.0
    assert cost(_traj(action_tokens=150)) == pytest.approx(-0.5)


def test_safety_penalises_denials_and_invalid_calls_not_search_failures():
    safety = SafetyPenalty(per_denial=0.5, per_invalid=0.1)
    assert safety(_traj(statuses=["ok", "timeout", "unavailable", "over_budget"])) == 0.0
    statuses = ["permission_denied", "invalid_arguments", "unknown_tool", "malformed", "ok"]
    assert safety(_traj(statuses=statuses)) == pytest.approx(-0.8)
