"""The environment's settings, each declared once: `EpisodeSettings` (what an episode is) and `EnvConfig`.

What: `EpisodeSettings` declares the ten settings a user sets for an episode (protocol, prompt, citations,
turns, searches, top-k, search deadline, token budgets) with their one name, help text, default and check.
`EnvConfig` is those plus the environment's own limits and failure handling (argument limits, retries,
circuit breaker, allow-list), which no trainer sets.

Why split so: the trainers, SFT and the demos set the episode through `searchrl.sections.EnvironmentSection`,
which *is* an `EpisodeSettings` (flat in `PPOConfig` and `GRPORunConfig`, an `environment:` part in the demos
and SFT), and `EnvironmentSection.env_config()` copies the settings field for field onto the `EnvConfig` the
environment runs with. One declaration, so a YAML key, a Python keyword and an error message use one name.
The section sits above this room (it is checked with the other sections); this module imports nothing from
above `searchrl.env`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from searchrl.common.config import ConfigError, Section, help_text
from searchrl.env.protocol import PROTOCOLS
from searchrl.env.tools import ArgLimits

CITATION_STYLES = ("doc_id", "number")

# Tools the environment runs itself, which `allowed_tools` may name. A user-defined tool (with its executor)
# is offered by passing it to `SearchEnvironment(tools=[...])`; other registered tools can only be denied.
BUILTIN_TOOLS = ("search",)


@dataclass
class EpisodeSettings(Section):
    """What one episode is: tool protocol, prompt, citations, turn and search budgets, top-k, deadline, tokens."""

    protocol: Literal["chat", "search_r1"] = field(
        default="chat",
        metadata=help_text(
            "Tool-call protocol: 'chat' (<tool_call> JSON, tool messages) or Search-R1's tags ('search_r1'; "
            "GRPO: our_rollout only, TRL's tool loop parses the chat protocol)."
        ),
    )
    tool_schema_in_prompt: bool = field(
        default=True,
        metadata=help_text(
            "Chat protocol: give the tool JSON schema to the chat template, which renders it into the prompt; "
            "false keeps prompts short for tiny models (the system prompt shows one example call instead, and "
            "the environment's `tools` is empty)."
        ),
    )
    citation_style: Literal["doc_id", "number"] = field(
        default="doc_id",
        metadata=help_text(
            "How the environment labels documents and the policy cites them: 'doc_id' (shown with the corpus "
            "id, cited as [d000042]) or 'number' ([1], [2], ... in the order the episode first shows them, "
            "across searches; a document shown again keeps its number). Cited numbers are mapped back to "
            "document ids, so rewards and the audit see corpus ids either way."
        ),
    )
    system_prompt: str | None = field(
        default=None,
        metadata=help_text(
            "System prompt of every episode (training, evaluation, demonstrations); null or empty: the "
            "environment's short default for the protocol."
        ),
    )
    max_turns: int = field(
        default=4,
        metadata=help_text(
            "Most policy turns per episode; the last one must answer (its tool calls are not run; GRPO "
            "trl_loop: max_tool_calling_iterations = this - 1)."
        ),
    )
    max_tool_calls: int = field(
        default=4,
        metadata=help_text(
            "Most searches per episode; further calls get an 'over budget' observation (0 = no search: every "
            "call is over budget, a closed-book episode in the same protocol)."
        ),
    )
    topk: int = field(
        default=3,
        metadata=help_text("Documents returned per search when a call gives no k (Search-R1 uses 3)."),
    )
    search_timeout_s: float = field(
        default=5.0,
        metadata=help_text(
            "Deadline of one batched search in seconds, enforced even if the backend hangs; a late search "
            "becomes an error observation."
        ),
    )
    max_episode_tokens: int = field(
        default=1024,
        metadata=help_text(
            "Most tokens after the prompt in one episode, actions and observations (TRL GRPO's "
            "max_completion_length)."
        ),
    )
    max_observation_tokens: int = field(
        default=256,
        metadata=help_text(
            "Tokens per tool result (at least 16); a longer one is cut with '[... truncated]'."
        ),
    )

    def check(self) -> None:
        """Refuse an episode the environment cannot run; every message starts with the field's name.

        Run when any config that is these settings is built (`check_sections`): an `EnvConfig`, a trainer's
        `EnvironmentSection`."""
        if self.protocol not in PROTOCOLS:
            raise ConfigError(f"protocol: {self.protocol!r} is not one of {list(PROTOCOLS)}")
        if self.citation_style not in CITATION_STYLES:
            raise ConfigError(
                f"citation_style: {self.citation_style!r} is not one of {list(CITATION_STYLES)}"
            )
        if self.max_tool_calls < 0:
            raise ConfigError(f"max_tool_calls: must be >= 0 (0 = no search), got {self.max_tool_calls}")
        for name in ("max_turns", "max_episode_tokens", "topk"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.max_observation_tokens < 16:
            raise ConfigError(
                f"max_observation_tokens: must be >= 16 (room for a document and the truncation marker), "
                f"got {self.max_observation_tokens}"
            )
        if self.search_timeout_s <= 0:
            raise ConfigError(f"search_timeout_s: must be > 0 seconds, got {self.search_timeout_s}")


@dataclass
class EnvConfig(EpisodeSettings):
    """Everything a `SearchEnvironment` runs with: the episode, plus argument limits and failure handling."""

    max_topk: int = field(default=10, metadata=help_text("Largest k a call may ask for."))
    max_query_chars: int = field(default=256, metadata=help_text("Longest query accepted, in characters."))
    max_retries: int = field(
        default=1,
        metadata=help_text("Retries of a search that failed with SearchUnavailable (within the deadline)."),
    )
    retry_backoff_s: float = field(
        default=0.05, metadata=help_text("First retry delay in seconds; doubles with every retry.")
    )
    allowed_tools: list[str] = field(
        default_factory=lambda: ["search"],
        metadata=help_text(
            "Allow-list of built-in tools (['search'], or [] for none); the tools passed to "
            "SearchEnvironment(tools=...) are allowed too, and a call to any other tool is a permission denial."
        ),
    )
    breaker_failures: int = field(
        default=3, metadata=help_text("Consecutive failed batches after which the circuit breaker opens.")
    )
    breaker_reset_s: float = field(
        default=30.0, metadata=help_text("Seconds the open breaker refuses calls before one trial batch.")
    )

    def check(self) -> None:
        """The limits and failure handling (`EpisodeSettings.check` checks the episode first)."""
        for name in ("max_topk", "max_query_chars"):
            if getattr(self, name) < 1:
                raise ConfigError(f"{name}: must be >= 1, got {getattr(self, name)}")
        if self.topk > self.max_topk:
            raise ConfigError(f"topk: {self.topk} is larger than max_topk={self.max_topk}")
        if self.max_retries < 0 or self.retry_backoff_s < 0:
            raise ConfigError("max_retries and retry_backoff_s must be >= 0")
        if self.breaker_failures < 1 or self.breaker_reset_s < 0:
            raise ConfigError("breaker_failures must be >= 1 and breaker_reset_s >= 0")
        for name in self.allowed_tools:
            if name not in BUILTIN_TOOLS:
                raise ConfigError(
                    f"allowed_tools: {name!r} is not a built-in tool; allow only {list(BUILTIN_TOOLS)} here and "
                    "offer your own tools with SearchEnvironment(tools=[...]) (docs/environment.md)"
                )

    @property
    def limits(self) -> ArgLimits:
        return ArgLimits(topk=self.topk, max_topk=self.max_topk, max_query_chars=self.max_query_chars)
