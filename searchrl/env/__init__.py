"""searchrl.env: the tool environment between the policy's turns and the search backend.

`parse_turn` reads a turn (tool calls, final answer, or what is malformed), `SearchEnvironment` runs an
episode (validation, allow-list, budgets, batched searches under a deadline, sanitised observations) and
`SearchToolEnv` adapts it to TRL 1.16's `GRPOTrainer(environment_factory=...)`.
"""

from searchrl.env.environment import (
    EnvConfig,
    SearchEnvironment,
    StepResult,
    TextTokenMeter,
    TokenCounter,
    TokenMeter,
    step_batch,
)
from searchrl.env.guard import BackendGuard, guard_for
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
from searchrl.env.tools import SEARCH_TOOL, ArgLimits, SearchArgs, ToolRegistry, ToolSpec
from searchrl.env.trl_adapter import SearchToolEnv, make_environment_factory

__all__ = [
    "SEARCH_TOOL",
    "ArgLimits",
    "BackendGuard",
    "EnvConfig",
    "SearchArgs",
    "SearchEnvironment",
    "SearchToolEnv",
    "StepResult",
    "TextTokenMeter",
    "TokenCounter",
    "TokenMeter",
    "ToolCall",
    "ToolRegistry",
    "ToolSpec",
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
]
