"""A trajectory: everything one episode produced, token by token, for PPO and for people.

Token in, token out: `input_ids` are exactly the prompt tokens, the tokens the policy sampled and the
tokens the environment inserted (observations plus chat-template glue), in order; nothing is
re-tokenised from text. `action_mask` is 1 on sampled tokens only. `logprobs[i]` is the log
probability of token `i` under the sampling distribution at the moment it was sampled (0.0 where
`action_mask` is 0). The reward slot is filled by `searchrl.rewards` after the episode ends.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Collection, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.common.io import read_jsonl, write_jsonl

TERMINATION_REASONS = ("answered", "no_answer", "max_turns", "max_tool_calls", "token_budget", "error")

# Status of one tool call. "ok" is the only success; every other status became an error observation.
TOOL_STATUSES = (
    "ok",
    "timeout",
    "unavailable",
    "bad_request",
    "error",
    "invalid_arguments",
    "unknown_tool",
    "permission_denied",
    "over_budget",
    "malformed",
    "circuit_open",
)

# What a token is, for people (the report and the viewer colour tokens by it; `token_kinds` decides).
TOKEN_KINDS = ("prompt", "action", "observation", "glue")


@dataclass
class ToolCallRecord:
    """One tool call the policy made and what became of it."""

    name: str
    arguments: dict[str, Any]
    status: str = "ok"
    latency_ms: float = 0.0
    doc_ids: list[str] = field(default_factory=list)
    error: str | None = None
    turn_index: int = 0


@dataclass
class Span:
    """A contiguous run of tokens `[start, end)` of one kind: prompt, action, observation or glue."""

    kind: str
    start: int
    end: int
    text: str = ""


@dataclass
class Trajectory:
    """One episode. See the module docstring for the token-level contract."""

    id: str
    question_id: str
    question: str
    golds: list[str]
    input_ids: list[int] = field(default_factory=list)
    action_mask: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    prompt_length: int = 0
    spans: list[Span] = field(default_factory=list)
    messages: list[dict[str, Any]] = field(default_factory=list)
    tool_calls: list[ToolCallRecord] = field(default_factory=list)
    observations: list[str] = field(default_factory=list)
    retrieved: dict[str, str] = field(default_factory=dict)
    answer: str | None = None
    citations: list[str] = field(default_factory=list)
    final_text: str = ""
    num_turns: int = 0
    termination: str = "no_answer"
    reward: float | None = None
    reward_breakdown: dict[str, float] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)

    # -- derived views -------------------------------------------------------------------------
    @property
    def num_action_tokens(self) -> int:
        return int(sum(self.action_mask))

    @property
    def action_texts(self) -> list[str]:
        return [s.text for s in self.spans if s.kind == "action"]

    @property
    def last_action_index(self) -> int:
        """Index of the last sampled token (where the scalar score is placed); -1 if none."""
        for i in range(len(self.action_mask) - 1, -1, -1):
            if self.action_mask[i]:
                return i
        return -1

    def ends_with_stop(self, stop_token_ids: Collection[int], stop_strings: Sequence[str] = ()) -> bool:
        """Did the policy end its last turn itself: its last sampled token one of `stop_token_ids`, or its last
        action ending with one of the protocol's `stop_strings`? False for an episode cut by a token budget,
        whatever its last token (the stop token was never sampled as an ending); TRL's "contains EOS"."""
        last = self.last_action_index
        if last < 0 or self.termination == "token_budget":
            return False
        if self.input_ids[last] in stop_token_ids:
            return True
        actions = self.action_texts
        tail = actions[-1].rstrip() if actions else ""
        return any(tail.endswith(stop) for stop in stop_strings)

    def validate(self) -> None:
        """Raise ValueError if the token-level arrays disagree."""
        n = len(self.input_ids)
        if len(self.action_mask) != n or len(self.logprobs) != n:
            raise ValueError(
                f"trajectory {self.id}: input_ids ({n}), action_mask ({len(self.action_mask)}) and "
                f"logprobs ({len(self.logprobs)}) must have the same length"
            )
        if any(m not in (0, 1) for m in self.action_mask):
            raise ValueError(f"trajectory {self.id}: action_mask must hold only 0 and 1")
        if any(self.action_mask[: self.prompt_length]):
            raise ValueError(f"trajectory {self.id}: prompt tokens must have action_mask 0")
        if self.termination not in TERMINATION_REASONS:
            raise ValueError(f"trajectory {self.id}: unknown termination {self.termination!r}")

    # -- serialisation -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Trajectory:
        d = dict(d)
        d["spans"] = [Span(**s) for s in d.get("spans", [])]
        d["tool_calls"] = [ToolCallRecord(**t) for t in d.get("tool_calls", [])]
        known = {f.name for f in dataclasses.fields(cls)}
        return cls(**{k: v for k, v in d.items() if k in known})


def write_trajectories(path: str | Path, trajectories: list[Trajectory]) -> None:
    """Write trajectories as JSON lines (gzip if the name ends in .gz), atomically."""
    write_jsonl(path, (t.to_dict() for t in trajectories))


def read_trajectories(path: str | Path) -> list[Trajectory]:
    return [Trajectory.from_dict(d) for d in read_jsonl(path)]


def token_kinds(traj: Trajectory, tokenizer: Any = None) -> list[str]:
    """The kind of every token of `traj` (`TOKEN_KINDS`): the one rule the report and the viewer colour by.

    A token takes the kind of the span that covers it; a token no span covers (or a span of another kind) is
    template glue. With a tokenizer, an observation span's tokens outside the ids of its own text (found as a
    contiguous run) are the chat template's tool-message glue. The action mask is the ground truth of what was
    sampled, whatever the spans say: every masked-in token is an action.
    """
    kinds = ["glue"] * len(traj.input_ids)
    for span in traj.spans:
        kind = span.kind if span.kind in TOKEN_KINDS else "glue"
        for i in range(max(0, span.start), min(span.end, len(kinds))):
            kinds[i] = kind
        if span.kind == "observation" and span.text and tokenizer is not None:
            _mark_observation_glue(kinds, traj.input_ids, span, tokenizer)
    for i, m in enumerate(traj.action_mask[: len(kinds)]):
        if m:
            kinds[i] = "action"
    return kinds


def _mark_observation_glue(kinds: list[str], ids: list[int], span: Span, tokenizer: Any) -> None:
    content = tokenizer.encode(span.text, add_special_tokens=False)
    window = ids[span.start : span.end]
    n = len(content)
    for offset in range(0, len(window) - n + 1):
        if window[offset : offset + n] == content:
            for i in range(span.start, span.end):
                if not span.start + offset <= i < span.start + offset + n:
                    kinds[i] = "glue"
            return
