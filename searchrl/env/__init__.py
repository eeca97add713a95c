"""searchrl.env: the tool environment between the policy's turns and the search backend.

`parse_turn` reads a turn (tool calls, final answer, or what is malformed), `SearchEnvironment` runs an
episode (validation, allow-list, budgets, batched searches under a deadline, user-defined tools made with
`tool`, each episode acting for its row's principal) with the settings of `EnvConfig` (the episode's
`EpisodeSettings` and its own limits), `ObservationWriter` words what a search
shows the policy (sanitised, labelled, truncated), and `SearchToolEnv` adapts the environment to TRL
1.16's `GRPOTrainer(environment_factory=...)`.
"""

from searchrl.env.config import EnvConfig, EpisodeSettings
from searchrl.env.environment import (
    SearchEnvironment,
    StepResult,
    TextTokenMeter,
    TokenMeter,
    step_batch,
)
from searchrl.env.guard import BackendGuard, guard_for
from searchrl.env.observations import ObservationWriter, TokenCounter
from searchrl.env.protocol import (
    ToolCall,
    Turn,
    format_answer,
    format_search_r1_call,
    format_tool_call,
    parse_turn,
    split_citations,
)
from searchrl.env.sanitize import sanitize_text
from searchrl.env.tools import (
    SEARCH_TOOL,
    ArgLimits,
    SearchArgs,
    ToolContext,
    ToolPermissionError,
    ToolRegistry,
    ToolSpec,
    ToolUnavailable,
    tool,
)
from searchrl.env.trl_adapter import SearchToolEnv, make_environment_factory

__all__ = [
    "SEARCH_TOOL",
    "ArgLimits",
    "BackendGuard",
    "EnvConfig",
    "EpisodeSettings",
    "ObservationWriter",
    "SearchArgs",
    "SearchEnvironment",
    "SearchToolEnv",
    "StepResult",
    "TextTokenMeter",
    "TokenCounter",
    "TokenMeter",
    "ToolCall",
    "ToolContext",
    "ToolPermissionError",
    "ToolRegistry",
    "ToolSpec",
    "ToolUnavailable",
    "Turn",
    "format_answer",
    "format_search_r1_call",
    "format_tool_call",
    "guard_for",
    "make_environment_factory",
    "parse_turn",
    "sanitize_text",
    "split_citations",
    "step_batch",
    "tool",
]
