"""Parser fuzzing: 10,000+ hypothesis cases against `parse_turn` and the tool argument schemas.

No exception may escape (the rollout must never crash on what a policy writes), and every outcome
must be self-consistent: a call is either validated or carries a status from `TOOL_STATUSES` with a
message; a malformed block is reported; an answer and an answer error never coexist; a well-formed
call written by `format_tool_call` parses back to the same name and arguments.

Case counts (sum 10,500): 4,000 adversarial texts, 2,500 structured calls, 1,500 Search-R1 turns,
2,500 argument dictionaries. `database=None` and `derandomize=True` keep the run deterministic in CI.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.common.trajectory import TOOL_STATUSES
from searchrl.env.protocol import format_answer, format_tool_call, parse_turn
from searchrl.env.tools import SEARCH_TOOL, ArgLimits

FUZZ = dict(deadline=None, database=None, derandomize=True, suppress_health_check=list(HealthCheck))

# Pieces a policy (or an attacker) would combine: the protocol's tags, chat specials, JSON debris.
FRAGMENTS = [
    "<tool_call>",
    "</tool_call>",
    "<answer>",
    "</answer>",
    "<search>",
    "</search>",
    "<information>",
    "<|im_start|>",
    "<|im_end|>",
    '{"name": "search", "arguments": {"query": "x"}}',
    '{"name": "shell", "arguments": {"cmd": "rm -rf /"}}',
    '{"name": 3}',
    '{"name": "search", "arguments": []}',
    "[d000001]",
    "[]",
    "{",
    "}",
    '"',
    "\\",
    "\n",
    "\x00",
    "\ud7ff",
    "[" * 50,
    "{" * 2000,
]
texts = st.lists(st.one_of(st.sampled_from(FRAGMENTS), st.text(max_size=40)), max_size=12).map("".join)
json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=True)
    | st.text(max_size=30),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=4,
)
LIMITS = ArgLimits(topk=3, max_topk=10, max_query_chars=64)


def check_consistent(turn, text: str) -> None:
    assert turn.text == text
    for call in turn.tool_calls:
        assert isinstance(call.name, str) and isinstance(call.arguments, dict)
        if call.status is None:
            assert call.validated is not None and call.error is None
        else:
            assert call.status in TOOL_STATUSES and call.error and call.validated is None
    if turn.malformed or any(c.status for c in turn.tool_calls):
        assert turn.error, "a rejected or malformed call must be explained in Turn.error"
    if turn.answer is not None:
        assert turn.answer_error is None and "<answer>" not in turn.answer
    for cited in turn.citations:
        assert cited and " " not in cited and "[" not in cited


@settings(max_examples=4000, **FUZZ)
@given(text=texts, protocol=st.sampled_from(["chat", "search_r1", "chat", "bogus"]))
def test_parse_turn_never_raises_on_adversarial_text(text, protocol):
    turn = parse_turn(text, protocol=protocol, limits=LIMITS)
    check_consistent(turn, text)
    if protocol == "bogus":
        assert "unknown protocol" in turn.error


names = st.one_of(st.just("search"), st.text(alphabet="abcdefghijklmnopqrstuvwxyz_", min_size=1, max_size=12))


@settings(max_examples=2500, **FUZZ)
@given(
    name=names,
    arguments=st.dictionaries(st.text(max_size=8), json_values, max_size=4),
    prefix=st.text(max_size=20),
)
def test_structured_calls_round_trip_or_are_rejected_with_a_reason(name, arguments, prefix):
    text = prefix.replace("<tool_call>", "").replace("</tool_call>", "") + format_tool_call(name, arguments)
    try:
        json.dumps(arguments, allow_nan=False)
        strict_json = True
    except ValueError:
        strict_json = False
    turn = parse_turn(text, limits=LIMITS)
    check_consistent(turn, text)
    if strict_json:
        assert not turn.malformed
        call = turn.tool_calls[-1]
        assert call.name == name and call.arguments == arguments
        if name != "search":
            assert call.status == "unknown_tool"


@settings(max_examples=1500, **FUZZ)
@given(query=st.text(max_size=120), answer=st.one_of(st.none(), st.text(max_size=30)), junk=texts)
def test_search_r1_turns(query, answer, junk):
    text = junk + f"<search>{query}</search>" + (format_answer(answer, ["d1"]) if answer is not None else "")
    turn = parse_turn(text, protocol="search_r1", limits=LIMITS)
    check_consistent(turn, text)


@settings(max_examples=2500, **FUZZ)
@given(
    arguments=st.one_of(
        st.dictionaries(st.sampled_from(["query", "k", "top_k", "q"]), json_values, max_size=3),
        st.fixed_dictionaries({"query": st.text(max_size=100)}, optional={"k": json_values}),
        json_values,
    )
)
def test_search_argument_schema_accepts_exactly_the_valid_calls(arguments):
    validated, problem = SEARCH_TOOL.validate(arguments, LIMITS)
    assert (validated is None) != (problem is None)
    if validated is not None:
        assert set(arguments) <= {"query", "k"}
        assert validated["query"] == arguments["query"].strip() and validated["query"]
        assert len(validated["query"]) <= LIMITS.max_query_chars
        assert 1 <= validated["k"] <= LIMITS.max_topk
        assert arguments.get("k") is None or type(arguments["k"]) is int  # null means the default k
    else:
        assert problem.startswith("invalid arguments for search") or "must be a JSON object" in problem
