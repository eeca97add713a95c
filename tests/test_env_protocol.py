"""parse_turn: never raises, round-trips generated calls, reports every malformed shape in `.error`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.env.protocol import (
    format_answer,
    format_search_r1_call,
    format_tool_call,
    parse_turn,
    split_citations,
)
from searchrl.env.tools import ArgLimits

MARKUP = [
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "{",
    "}",
    '"',
    "[",
    "]",
]

# Text built from protocol fragments and noise, so the fuzzer actually reaches the parser's branches.
fragmentary_text = st.lists(
    st.one_of(
        st.sampled_from(MARKUP),
        st.text(max_size=12),
        st.just('{"name": "search", "arguments": {'),
        st.just("\n"),
    ),
    max_size=20,
).map("".join)


@settings(max_examples=1200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    text=st.one_of(st.text(max_size=300), fragmentary_text), protocol=st.sampled_from(["chat", "search_r1"])
)
def test_parse_turn_never_raises_on_any_text(text: str, protocol: str) -> None:
    turn = parse_turn(text, protocol)
    assert turn.text == text
    # A turn either is clean or says what is wrong; an answer never coexists with an answer error.
    assert (turn.answer is None) or (turn.answer_error is None)
    for call in turn.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        assert (call.status is None) == (call.validated is not None)


@settings(max_examples=800, deadline=None)
@given(
    value=st.recursive(
        st.none() | st.booleans() | st.integers() | st.text(max_size=5),
        lambda c: st.lists(c, max_size=3) | st.dictionaries(st.text(max_size=4), c, max_size=3),
        max_leaves=8,
    )
)
def test_parse_turn_never_raises_on_arbitrary_json_bodies(value: object) -> None:
    turn = parse_turn(f"<tool_call>\n{json.dumps(value)}\n</tool_call>")
    if not (isinstance(value, dict) and isinstance(value.get("name"), str)):
        assert turn.tool_calls == [] and turn.malformed and turn.error


def test_parse_turn_never_raises_on_non_text() -> None:
    for bad in (None, 42, b"<answer>x</answer>", ["<answer>x</answer>"]):
        turn = parse_turn(bad)  # type: ignore[arg-type]
        assert turn.error is not None and turn.answer is None and turn.tool_calls == []
    assert "unknown protocol" in (parse_turn("<answer>x</answer>", "xml").error or "")


safe_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="<>"), min_size=1, max_size=40
).filter(lambda s: s.strip())
names = st.from_regex(r"[a-z_][a-z0-9_]{0,15}", fullmatch=True)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(10**6), 10**6) | safe_text,
    lambda c: st.lists(c, max_size=3) | st.dictionaries(safe_text, c, max_size=3),
    max_leaves=6,
)


@settings(max_examples=300, deadline=None)
@given(name=names, arguments=st.dictionaries(safe_text, json_values, max_size=4))
def test_generated_calls_round_trip_name_and_arguments(name: str, arguments: dict) -> None:
    turn = parse_turn(f"Let me look.\n{format_tool_call(name, arguments)}")
    assert len(turn.tool_calls) == 1
    assert turn.tool_calls[0].name == name
    assert turn.tool_calls[0].arguments == arguments


@settings(max_examples=300, deadline=None)
@given(query=safe_text, k=st.integers(1, 10), n=st.integers(1, 3))
def test_generated_search_calls_validate_and_round_trip(query: str, k: int, n: int) -> None:
    text = "\n".join(format_tool_call("search", {"query": query, "k": k}) for _ in range(n))
    turn = parse_turn(text)
    assert turn.error is None and len(turn.tool_calls) == n
    for call in turn.tool_calls:
        assert call.ok and call.validated == {"query": query.strip(), "k": k}


@settings(max_examples=200, deadline=None)
@given(query=safe_text)
def test_generated_search_r1_calls_round_trip(query: str) -> None:
    turn = parse_turn(format_search_r1_call(query), "search_r1")
    assert [c.validated for c in turn.tool_calls] == [{"query": query.strip(), "k": 3}]


def test_format_tool_call_is_exactly_what_the_chat_template_renders() -> None:
    from transformers.utils.chat_template_utils import _compile_jinja_template

    from searchrl.models.tiny import qwen2_5_chat_template

    template = _compile_jinja_template(qwen2_5_chat_template())  # transformers' own jinja env (its tojson)
    for args in ({"query": "who wrote Ülysses?", "k": 2}, {"query": 'say "hi"'}, {}):
        call = {"function": {"name": "search", "arguments": args}}
        rendered = template.render(
            messages=[{"role": "assistant", "content": "", "tool_calls": [call]}], add_generation_prompt=False
        )
        assert format_tool_call("search", args) in rendered
        assert parse_turn(rendered).tool_calls[0].arguments == args


def test_whitespace_and_missing_k_are_accepted() -> None:
    turn = parse_turn('<tool_call>   {"name":"search","arguments":{"query":"  moon  "}}   </tool_call>')
    assert turn.error is None
    assert turn.tool_calls[0].validated == {"query": "moon", "k": 3}
    assert parse_turn('<tool_call>{"name": "search"}</tool_call>').tool_calls[0].status == "invalid_arguments"


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}</tool_call>', "not valid JSON"),
        ('<tool_call>["search", {"query": "x"}]</tool_call>', "JSON object"),
        ('<tool_call>{"name": 7, "arguments": {}}</tool_call>', '"name" must be a string'),
        ('<tool_call>{"name": "search", "arguments": "x"}</tool_call>', '"arguments" must be a JSON object'),
        ('<tool_call>{"name": "search", "arguments": {"query": "x"}}', "without a closing"),
        ('{"name": "search"}</tool_call>', "without a matching"),
    ],
)
def test_malformed_calls_are_reported_with_a_correct_example(text: str, needle: str) -> None:
    turn = parse_turn(text)
    assert turn.tool_calls == []
    assert len(turn.malformed) == 1 and needle in turn.malformed[0]
    assert turn.error is not None and needle in turn.error
    assert '<tool_call>\n{"name": "search", "arguments": {"query"' in turn.error  # how a correct call looks


def test_unknown_tool_and_wrong_argument_types_are_reported() -> None:
    unknown = parse_turn(format_tool_call("delete_index", {"query": "x"}))
    assert unknown.tool_calls[0].status == "unknown_tool" and "delete_index" in (unknown.error or "")
    for arguments, needle in [
        ({"query": 5}, "query"),
        ({"query": "x", "k": "3"}, "k"),
        ({"query": "x", "k": 2.0}, "k"),
        ({"query": "x", "k": True}, "k"),
        ({"query": "   "}, "must not be empty"),
        ({"query": "x", "k": 0}, "between 1 and 10"),
        ({"query": "x", "top_k": 3}, "unknown argument"),
    ]:
        call = parse_turn(format_tool_call("search", arguments)).tool_calls[0]
        assert call.status == "invalid_arguments", arguments
        assert needle in (call.error or ""), (arguments, call.error)
        assert "\n" not in (call.error or "")  # pydantic's report turned into one readable line


def test_limits_come_from_the_caller() -> None:
    limits = ArgLimits(topk=2, max_topk=4, max_query_chars=5)
    assert parse_turn(format_tool_call("search", {"query": "abcdef"}), limits=limits).tool_calls[
        0
    ].status == ("invalid_arguments")
    assert parse_turn(format_tool_call("search", {"query": "abc"}), limits=limits).tool_calls[
        0
    ].validated == {
        "query": "abc",
        "k": 2,
    }


def test_answer_with_citations() -> None:
    turn = parse_turn(f"I found it. {format_answer('Paris', ['d000042', 'd7'])}")
    assert turn.answer == "Paris" and turn.citations == ["d000042", "d7"] and turn.error is None
    assert split_citations("  the  [a1] big   city [b2] ") == ("the big city", ["a1", "b2"])


def test_several_or_unclosed_answers_are_format_errors() -> None:
    several = parse_turn("<answer>a</answer> <answer>b</answer>")
    assert several.answer is None and "2 answer blocks" in (several.error or "")
    unclosed = parse_turn("<answer>a")
    assert unclosed.answer is None and "without a closing" in (unclosed.error or "")


def test_answer_wins_over_tool_calls_in_the_same_turn() -> None:
    turn = parse_turn(format_tool_call("search", {"query": "x"}) + "<answer>y [d1]</answer>")
    assert turn.answer == "y" and len(turn.tool_calls) == 1


def test_search_r1_ignores_chat_markup_and_chat_ignores_search_tags() -> None:
    r1 = parse_turn("<search> capital of France </search>", "search_r1")
    assert r1.tool_calls[0].validated == {"query": "capital of France", "k": 3}
    assert parse_turn("<search>x</search>", "chat").tool_calls == []
    assert parse_turn(format_tool_call("search", {"query": "x"}), "search_r1").tool_calls == []
    assert "without a closing" in (parse_turn("<search>x", "search_r1").error or "")
