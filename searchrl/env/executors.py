"""Run user-defined tools: one guarded executor call per tool call, and what its outcome shows the policy.

What: `start_tool_call` starts an executor (a `ToolSpec.executor`) in its tool's guard (`guard.ToolGuard`:
deadline, retries of `ToolUnavailable`, a circuit breaker per tool) with the episode's `ToolContext`;
`tool_observation` turns the outcome into the call's status and observation text: the executor's text
(sanitised, cut to the observation limit), a permission denial that names what is not allowed and nothing
else, or an error observation for an exception, a hang, or a return value that is not text.

`offered_tools` decides which tools an environment offers (the config's built-in allow-list plus the user's
tools) and refuses what cannot run.

Why apart from `environment.py`: the environment decides which calls run (validation, allow-list, budgets)
and runs all calls of a batch at once; this module owns the one thing that differs for a user's tool: an
arbitrary function that may raise, hang, or return anything, and whose failures must never show the
policy data it may not see (an unexpected exception shows only its type, never its message).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from searchrl.common.config import ConfigError
from searchrl.env.config import BUILTIN_TOOLS, EnvConfig
from searchrl.env.guard import BatchOutcome, Flight, tool_guard_for
from searchrl.env.observations import ObservationWriter
from searchrl.env.tools import DEFAULT_REGISTRY, ToolContext, ToolRegistry, ToolSpec

# A tool's text is cut to this many characters before it is tokenised and fitted to the observation limit,
# so an executor that returns megabytes costs no more than one that returns a page.
MAX_TOOL_OUTPUT_CHARS = 32_768
MAX_DENIAL_REASON_CHARS = 200
DENIAL_HINT = "Do not try to get it another way: act only for the user this conversation is for."


def start_tool_call(spec: ToolSpec, arguments: Any, context: ToolContext, config: EnvConfig) -> Flight:
    """Start one call of `spec`'s executor under its guard (the tool's own deadline, else the environment's)."""
    if spec.executor is None:
        raise ValueError(f"tool {spec.name!r} has no executor; only the built-in search runs without one")
    executor = spec.executor
    guard = tool_guard_for(spec, config.breaker_failures, config.breaker_reset_s)
    timeout_s = spec.timeout_s if spec.timeout_s is not None else config.search_timeout_s
    return guard.start(
        lambda: executor(arguments, context), timeout_s, config.max_retries, config.retry_backoff_s
    )


def recorded_arguments(parsed: Any, raw: dict[str, Any]) -> dict[str, Any]:
    """A call's validated arguments as the trajectory records them (JSON); the raw ones if they will not dump."""
    try:
        return parsed.model_dump(mode="json")
    except Exception:  # a field type pydantic cannot write as JSON: keep what the policy wrote
        return dict(raw)


def tool_output_text(value: Any) -> tuple[str | None, str | None]:
    """(the observation text of an executor's return value, None) or (None, why it is not usable)."""
    if isinstance(value, str):
        text = "".join((value,))  # a plain str, whatever methods a str subclass overrides
    elif isinstance(value, dict | list | int | float) and not isinstance(value, bool):
        try:
            text = json.dumps(value, ensure_ascii=False, allow_nan=False)
        except (TypeError, ValueError, RecursionError):
            return None, f"it returned a {type(value).__name__} that is not JSON"
    else:
        return None, f"it returned {type(value).__name__}, not text"
    text = text.encode("utf-8", "replace").decode("utf-8")  # lone surrogates would break a tokenizer
    return text[:MAX_TOOL_OUTPUT_CHARS], None


def tool_observation(
    spec: ToolSpec, outcome: BatchOutcome, writer: ObservationWriter, config: EnvConfig
) -> tuple[str, str, str | None, int]:
    """(status, observation text, error for the record, injection attempts) of one executed call."""
    name = spec.name
    if outcome.status == "ok":
        text, problem = tool_output_text(outcome.value)
        if text is None:
            detail = f"the tool {name} failed: {problem}"
            return (
                "error",
                writer.error("error", detail, "Try other arguments, or answer with what you have."),
                detail,
                0,
            )
        clean, injections = writer.sanitize(text)
        return "ok", writer.fit(clean), None, injections
    if outcome.status == "permission_denied":
        reason = " ".join(str(outcome.error or "not allowed").split())[:MAX_DENIAL_REASON_CHARS]
        detail = f"{name} is not allowed: {reason}"
        return "permission_denied", writer.error("permission_denied", detail, DENIAL_HINT), detail, 0
    detail = _failure_detail(name, outcome, spec.timeout_s or config.search_timeout_s)
    return outcome.status, writer.fit(writer.sanitize(detail)[0]), detail, 0


def _failure_detail(name: str, outcome: BatchOutcome, timeout_s: float) -> str:
    """What went wrong with the tool and what the policy can do about it."""
    said = f" ({outcome.error})" if outcome.error else ""
    advice = {
        "timeout": f"the tool {name} did not answer within {timeout_s:g} s. Try again, or answer with what "
        "you have.",
        "unavailable": f"the tool {name} is unavailable{said}. Try again later, or answer with what you have.",
        "circuit_open": f"the tool {name} is failing repeatedly and is paused{said}. Answer with what you "
        "have found so far.",
    }.get(outcome.status, f"the tool {name} failed{said}. Try other arguments, or answer with what you have.")
    return f"Error ({outcome.status}): {advice}"


def offered_tools(
    config: EnvConfig, registry: ToolRegistry | None, tools: Sequence[ToolSpec]
) -> tuple[ToolRegistry, list[str]]:
    """The registry an environment parses calls with, and the tool names it allows: the config's built-in
    `allowed_tools`, then `tools` (registered into a copy of `registry`). Refused with a `ConfigError`: a name
    twice, an allowed tool that is not registered or has no executor, another tool than search with
    Search-R1's tags."""
    registry = registry if registry is not None else DEFAULT_REGISTRY
    try:
        registry = registry.with_tools(list(tools)) if tools else registry
    except (TypeError, ValueError) as e:
        raise ConfigError(f"tools: {e}") from None
    allowed = list(config.allowed_tools) + [t.name for t in tools if t.name not in config.allowed_tools]
    for name in allowed:
        spec = registry.get(name)
        if spec is None:
            raise ConfigError(f"allowed_tools: {name!r} is not a registered tool ({registry.names})")
        if name not in BUILTIN_TOOLS and spec.executor is None:
            raise ConfigError(f"tools: {name!r} has no executor, so the environment cannot run it")
    if config.protocol == "search_r1" and any(name not in BUILTIN_TOOLS for name in allowed):
        raise ConfigError(
            "protocol: search_r1's tags can only search (<search>query</search>); the tools "
            f"{[n for n in allowed if n not in BUILTIN_TOOLS]} need protocol: chat"
        )
    return registry, allowed
