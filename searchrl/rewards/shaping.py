"""Shaping rewards: format, cost, safety and the answer-length cap, each a checkable fact about a trajectory.

These are the terms a search agent games first when they are missing (`rl_methods.md` §4): without a
format term it rambles; without a cost term searching is free, so PPO learns to search more on an empty
retriever; without a length cap it lists candidates. Every function here reads only the policy's final
text, the tool-call records and token counts, never observation text, so a change in what search
returned cannot change them (invariant 22).

Answer convention: `<answer>ANSWER [doc_id] [doc_id]</answer>`. `extract_answer` splits the citations
off with the environment parser's own `split_citations`, so rewards and environment agree on what the
answer is.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from searchrl.common.trajectory import Trajectory
from searchrl.env.protocol import split_citations
from searchrl.rewards.qa import answer_word_count

ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"

# Markup that belongs to the tool protocol or the chat template; inside a final answer turn it means the
# policy mixed a tool call into its answer or copied observation framing. Matched in any case and with
# spaces inside the brackets, as the environment's sanitiser does, so "<Tool_Call >" is no way around it.
STRAY_TAGS = ("tool_call", "tool_response", "information", "search", "tools")
_STRAY_MARKUP = re.compile(
    r"<\s*/?\s*(?:" + "|".join(STRAY_TAGS) + r")\s*/?\s*>|<\s*\|\s*im_start\s*\|\s*>", re.IGNORECASE
)

# End-of-turn tokens a decoder may leave at the end of the final text; they are not policy markup.
_TRAILING_END_TOKENS = ("<|im_end|>", "<|endoftext|>")

_ANSWER_BLOCK = re.compile(re.escape(ANSWER_OPEN) + r"(.*?)" + re.escape(ANSWER_CLOSE), re.DOTALL)

# Tool-call statuses that are the policy's fault (not the search engine's): safety penalises these.
INVALID_CALL_STATUSES = ("invalid_arguments", "unknown_tool", "malformed")
DENIED_CALL_STATUSES = ("permission_denied",)


def extract_answer(text: str) -> tuple[str | None, list[str]]:
    """The answer of a final turn as (answer without citations, cited ids); (None, []) if there is none.

    Never raises. Same rule as the environment's parser (`searchrl.env.protocol`): exactly one
    `<answer>...</answer>` block counts; several blocks are a format error and give no answer, so a
    policy cannot hedge by answering twice.
    """
    if text.count(ANSWER_OPEN) != 1 or text.count(ANSWER_CLOSE) != 1:
        return None, []
    blocks = _ANSWER_BLOCK.findall(text)
    if len(blocks) != 1:
        return None, []
    return split_citations(blocks[0])


def _strip_end_tokens(text: str) -> str:
    stripped = text.rstrip()
    changed = True
    while changed:
        changed = False
        for tok in _TRAILING_END_TOKENS:
            if stripped.endswith(tok):
                stripped = stripped[: -len(tok)].rstrip()
                changed = True
    return stripped


def format_problems(text: str) -> list[str]:
    """Every reason the final text is not exactly one well-formed answer; [] when it is well formed."""
    body = _strip_end_tokens(text)
    problems: list[str] = []
    n_open, n_close = body.count(ANSWER_OPEN), body.count(ANSWER_CLOSE)
    if n_open == 0 and n_close == 0:
        problems.append("no <answer> block")
    elif n_open != 1 or n_close != 1:
        problems.append(
            f"expected exactly one <answer>...</answer>, found {n_open} open and {n_close} close tags"
        )
    elif body.index(ANSWER_OPEN) > body.index(ANSWER_CLOSE):
        problems.append("</answer> comes before <answer>")
    else:
        answer, _ = extract_answer(body)
        if not answer:
            problems.append("the <answer> block is empty")
    for match in _STRAY_MARKUP.finditer(body):
        problems.append(f"stray protocol markup {match.group(0)!r} in the final turn")
    return problems


def is_well_formed(text: str) -> bool:
    return not format_problems(text)


@dataclass(frozen=True)
class FormatReward:
    """`ok` for a final turn with exactly one well-formed, non-empty answer and no stray markup, else `fail`."""

    ok: float = field(default=1.0, metadata={"help": "Value for a well-formed final answer."})
    fail: float = field(
        default=0.0, metadata={"help": "Value for malformed, missing or repeated answer blocks (e.g. -1)."}
    )

    def __call__(self, traj: Trajectory) -> float:
        if traj.termination != "answered":
            return self.fail
        return self.ok if is_well_formed(traj.final_text) else self.fail


@dataclass(frozen=True)
class SearchCost:
    """Minus `per_search` for every tool call beyond the first `free_searches`: searching is not free."""

    free_searches: int = field(default=2, metadata={"help": "Tool calls per episode that cost nothing."})
    per_search: float = field(
        default=0.05, metadata={"help": "Cost of each tool call beyond the free quota."}
    )

    def __call__(self, traj: Trajectory) -> float:
        extra = max(0, len(traj.tool_calls) - self.free_searches)
        return -self.per_search * extra


@dataclass(frozen=True)
class TokenCost:
    """Minus `per_token` for every sampled (action) token beyond `token_budget`."""

    token_budget: int = field(default=256, metadata={"help": "Sampled tokens per episode that cost nothing."})
    per_token: float = field(default=0.001, metadata={"help": "Cost of each sampled token over the budget."})

    def __call__(self, traj: Trajectory) -> float:
        extra = max(0, traj.num_action_tokens - self.token_budget)
        return -self.per_token * extra


@dataclass(frozen=True)
class SafetyPenalty:
    """Minus a penalty per permission denial and per invalid call (bad arguments, unknown tool, malformed)."""

    per_denial: float = field(default=0.5, metadata={"help": "Penalty per permission-denied tool call."})
    per_invalid: float = field(
        default=0.1, metadata={"help": "Penalty per invalid_arguments, unknown_tool or malformed call."}
    )

    def __call__(self, traj: Trajectory) -> float:
        denials = sum(1 for c in traj.tool_calls if c.status in DENIED_CALL_STATUSES)
        invalid = sum(1 for c in traj.tool_calls if c.status in INVALID_CALL_STATUSES)
        return -(self.per_denial * denials + self.per_invalid * invalid)


@dataclass(frozen=True)
class PermissionDeniedPenalty:
    """Minus `per_denial` per permission-denied call: acting beyond the episode's authority, as its own term.

    A denial is a call the environment refused for the episode's principal: a tool outside the allow-list, or
    an executor's `ToolPermissionError` (another customer's order). `SafetyPenalty` counts denials too (its
    `per_denial`); a rubric that weighs them here sets that to 0 so that a denial is not paid twice."""

    per_denial: float = field(default=1.0, metadata={"help": "Penalty per permission-denied tool call."})

    def __call__(self, traj: Trajectory) -> float:
        return -self.per_denial * sum(1 for c in traj.tool_calls if c.status in DENIED_CALL_STATUSES)


@dataclass(frozen=True)
class AnswerLengthPenalty:
    """`penalty` (negative) when the answer is longer than `max_answer_words`, else 0: against stuffing."""

    max_answer_words: int = field(default=16, metadata={"help": "Longest answer, in normalised words."})
    penalty: float = field(default=-1.0, metadata={"help": "Value for an answer over the cap."})

    def __call__(self, traj: Trajectory) -> float:
        if traj.answer is None:
            return 0.0
        return self.penalty if answer_word_count(traj.answer) > self.max_answer_words else 0.0


@dataclass(frozen=True)
class SearchCount:
    """The number of tool calls (a metric: give it weight 0)."""

    def __call__(self, traj: Trajectory) -> float:
        return float(len(traj.tool_calls))
