"""Read one policy turn: the tool calls it makes, its final answer, or what is wrong with it.

Two protocols, chosen by `EnvConfig.protocol`:

- ``"chat"`` (default): tool calls exactly as Qwen2.5's chat template renders them,
  ``<tool_call>\\n{"name": "search", "arguments": {"query": "...", "k": 3}}\\n</tool_call>``, one or more
  per turn; results come back as ``tool`` messages.
- ``"search_r1"``: Search-R1's tags, ``<search>query</search>``; results are inserted inline as
  ``<information>...</information>``.

Both end with ``<answer>ANSWER [doc_id] [doc_id]</answer>``: citations are document ids in square brackets
inside the answer block. `Turn.answer` is the answer text with the citations removed and white space
collapsed; `Turn.citations` the cited ids in order.

Rules (liberal about spacing, strict about structure):

- White space around the JSON body and a missing ``k`` are fine; a missing ``"arguments"`` means ``{}``.
- A ``<tool_call>`` without ``</tool_call>``, invalid JSON, a body that is not an object, a name that is
  not a string or arguments that are not an object make the block *malformed*: it is reported in
  `Turn.malformed` (one short message per block) and in `Turn.error`, which ends with an example of a
  correct call.
- Calls with a well-formed body are checked against the tool registry: an unknown name or arguments
  the tool's schema rejects are kept in `Turn.tool_calls` with `.status`/`.error` set.
- Several ``<answer>`` blocks, or an ``<answer>`` without ``</answer>``, is a format error: no answer.
- An answer and tool calls in the same turn: **the answer wins**. The turn ends the episode and the
  calls are kept in `Turn.tool_calls` (so rewards can see them) but are never executed.

`parse_turn` never raises, on any input (a hypothesis test holds it to that).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from searchrl.env.tools import DEFAULT_LIMITS, DEFAULT_REGISTRY, ArgLimits, ToolRegistry, example_call_json

Protocol = Literal["chat", "search_r1"]
PROTOCOLS: tuple[str, ...] = ("chat", "search_r1")

TOOL_CALL_OPEN = "<tool_call>"
TOOL_CALL_CLOSE = "</tool_call>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
SEARCH_OPEN = "<search>"
SEARCH_CLOSE = "</search>"

# A citation is a bracketed token without spaces: "[d000042]". Ids never contain brackets or spaces.
_CITATION = re.compile(r"\[([^\[\]\s]+)\]")


@dataclass
class ToolCall:
    """One call the policy wrote. `status`/`error` are set when the registry rejects it."""

    name: str
    arguments: dict[str, Any]
    validated: dict[str, Any] | None = None
    status: str | None = None
    error: str | None = None
    parsed: Any = None  # the validated arguments as the tool's pydantic model (what an executor receives)

    @property
    def ok(self) -> bool:
        return self.status is None


@dataclass
class Turn:
    """What one turn says: tool calls, a final answer, and any problems found."""

    text: str
    protocol: str = "chat"
    tool_calls: list[ToolCall] = field(default_factory=list)
    malformed: list[str] = field(default_factory=list)
    answer: str | None = None
    citations: list[str] = field(default_factory=list)
    answer_error: str | None = None
    error: str | None = None

    @property
    def has_actions(self) -> bool:
        """True if the turn tried to call a tool (well-formed or not)."""
        return bool(self.tool_calls or self.malformed)


def format_tool_call(name: str, arguments: dict[str, Any]) -> str:
    """A tool call exactly as the Qwen2.5 chat template renders it (name raw, arguments `tojson`)."""
    return f'{TOOL_CALL_OPEN}\n{{"name": "{name}", "arguments": {json.dumps(arguments, ensure_ascii=False)}}}\n{TOOL_CALL_CLOSE}'


def format_search_r1_call(query: str) -> str:
    return f"{SEARCH_OPEN}{query}{SEARCH_CLOSE}"


def format_answer(answer: str, citations: list[str] | None = None) -> str:
    """``<answer>ANSWER [id] [id]</answer>``, the answer format both protocols share."""
    cited = "".join(f" [{c}]" for c in citations or [])
    return f"{ANSWER_OPEN}{answer}{cited}{ANSWER_CLOSE}"


def correct_call_hint(protocol: str = "chat", registry: ToolRegistry = DEFAULT_REGISTRY) -> str:
    """How a correct call looks, for error observations."""
    if protocol == "search_r1":
        return f"To search, write {SEARCH_OPEN}your search words{SEARCH_CLOSE}."
    spec = registry.get("search") or next((registry.get(n) for n in registry.names), None)
    body = example_call_json(spec) if spec is not None else '{"name": "<tool name>", "arguments": {}}'
    return f"Call a tool exactly like this: {TOOL_CALL_OPEN}\n{body}\n{TOOL_CALL_CLOSE}"


def parse_turn(
    text: str,
    protocol: str = "chat",
    registry: ToolRegistry | None = None,
    limits: ArgLimits | None = None,
) -> Turn:
    """Parse one finished policy turn (decoded sampled text, without EOS). Never raises."""
    registry = registry if registry is not None else DEFAULT_REGISTRY
    limits = limits if limits is not None else DEFAULT_LIMITS
    try:
        return _parse(text, protocol, registry, limits)
    except Exception as exc:  # a parser bug must not crash a rollout: report it as a format error
        turn = Turn(text=text if isinstance(text, str) else "", protocol=str(protocol))
        turn.error = f"could not parse the turn ({type(exc).__name__}: {exc})"
        turn.answer_error = turn.error
        return turn


def _parse(text: Any, protocol: str, registry: ToolRegistry, limits: ArgLimits) -> Turn:
    if not isinstance(text, str):
        turn = Turn(text="", protocol=str(protocol))
        turn.error = f"a turn must be text (str), got {type(text).__name__}"
        return turn
    turn = Turn(text=text, protocol=protocol)
    if protocol == "chat":
        _read_chat_calls(text, turn, registry, limits)
    elif protocol == "search_r1":
        _read_search_r1_calls(text, turn, registry, limits)
    else:
        turn.error = f"unknown protocol {protocol!r}; use one of {list(PROTOCOLS)}"
        return turn
    _read_answer(text, turn)
    turn.error = _summarise_errors(turn, correct_call_hint(protocol, registry))
    return turn


def _blocks(text: str, open_tag: str, close_tag: str) -> tuple[list[str], list[str]]:
    """Bodies of complete `open...close` blocks, and problems (unclosed or stray closing tags)."""
    bodies: list[str] = []
    problems: list[str] = []
    pos = 0
    while True:
        start = text.find(open_tag, pos)
        stray = text.find(close_tag, pos)
        if stray != -1 and (start == -1 or stray < start):
            problems.append(f"{close_tag} without a matching {open_tag}")
            pos = stray + len(close_tag)
            continue
        if start == -1:
            return bodies, problems
        body_start = start + len(open_tag)
        end = text.find(close_tag, body_start)
        nested = text.find(open_tag, body_start)
        if end == -1 or (nested != -1 and nested < end):
            problems.append(f"{open_tag} without a closing {close_tag}")
            pos = body_start if end == -1 else nested
            if end == -1:
                return bodies, problems
            continue
        bodies.append(text[body_start:end])
        pos = end + len(close_tag)


def _read_chat_calls(text: str, turn: Turn, registry: ToolRegistry, limits: ArgLimits) -> None:
    bodies, problems = _blocks(text, TOOL_CALL_OPEN, TOOL_CALL_CLOSE)
    turn.malformed.extend(f"malformed tool call: {p}" for p in problems)
    for body in bodies:
        call, problem = _decode_call_body(body)
        if problem is not None:
            turn.malformed.append(f"malformed tool call: {problem}")
            continue
        assert call is not None
        turn.tool_calls.append(check_call(call, registry, limits))


def _decode_call_body(body: str) -> tuple[ToolCall | None, str | None]:
    try:
        payload = json.loads(body.strip())
    except (json.JSONDecodeError, RecursionError) as err:
        reason = err.msg if isinstance(err, json.JSONDecodeError) else "nested too deeply"
        return None, f"the body is not valid JSON ({reason})"
    if not isinstance(payload, dict):
        return (
            None,
            f'the body must be a JSON object with "name" and "arguments", got {type(payload).__name__}',
        )
    name = payload.get("name")
    if not isinstance(name, str):
        return None, f'"name" must be a string, got {type(name).__name__}'
    arguments = payload.get("arguments", {})
    if not isinstance(arguments, dict):
        return None, f'"arguments" must be a JSON object, got {type(arguments).__name__}'
    return ToolCall(name=name, arguments=arguments), None


def _read_search_r1_calls(text: str, turn: Turn, registry: ToolRegistry, limits: ArgLimits) -> None:
    bodies, problems = _blocks(text, SEARCH_OPEN, SEARCH_CLOSE)
    turn.malformed.extend(f"malformed search: {p}" for p in problems)
    for body in bodies:
        turn.tool_calls.append(
            check_call(ToolCall(name="search", arguments={"query": body}), registry, limits)
        )


def check_call(call: ToolCall, registry: ToolRegistry, limits: ArgLimits) -> ToolCall:
    """Set `call.status`/`.error` if the registry does not know the tool or rejects the arguments."""
    spec = registry.get(call.name)
    if spec is None:
        call.status = "unknown_tool"
        call.error = (
            f"there is no tool named {call.name!r}; available tools: {', '.join(registry.names) or 'none'}"
        )
        return call
    parsed, problem = spec.parse(call.arguments, limits)
    if parsed is None:
        call.status = "invalid_arguments"
        call.error = problem
    else:
        call.parsed, call.validated = parsed, parsed.model_dump()
    return call


def _read_answer(text: str, turn: Turn) -> None:
    bodies, problems = _blocks(text, ANSWER_OPEN, ANSWER_CLOSE)
    if problems:
        turn.answer_error = f"answer format: {problems[0]}; write exactly one {ANSWER_OPEN}...{ANSWER_CLOSE}"
        return
    if len(bodies) > 1:
        turn.answer_error = (
            f"answer format: {len(bodies)} answer blocks; write exactly one {ANSWER_OPEN}...{ANSWER_CLOSE}"
        )
        return
    if bodies:
        turn.answer, turn.citations = split_citations(bodies[0])


def split_citations(answer_body: str) -> tuple[str, list[str]]:
    """("answer text without citations, white space collapsed", [cited ids in order])."""
    citations = _CITATION.findall(answer_body)
    bare = _CITATION.sub(" ", answer_body)
    return " ".join(bare.split()), citations


def _summarise_errors(turn: Turn, hint: str) -> str | None:
    problems = list(turn.malformed)
    problems += [f"{c.status}: {c.error}" for c in turn.tool_calls if c.error]
    if problems:
        problems[-1] += f". {hint}"
    if turn.answer_error:
        problems.append(turn.answer_error)
    return " | ".join(problems) if problems else None
