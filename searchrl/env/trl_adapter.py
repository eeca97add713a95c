"""`SearchToolEnv`: our environment in the shape TRL 1.16's `GRPOTrainer(environment_factory=...)` wants.

TRL probes the class with `inspect.getmembers(type(env), inspect.isfunction)`: `reset` is required,
`get_reward` is an extra reward source, and every other public function becomes a tool whose JSON
schema comes from its type hints and Google-style docstring. So the class has exactly three public
functions (a test holds it to that):

- `reset(**row) -> None`: starts an episode for the dataset row (TRL passes the whole row, `prompt`
  included; the question is the row's `question`, else the last user message of `prompt`). It
  returns None because the dataset's prompt already holds the question.
- `search(query) -> str`: one search through the same validation, allow-list, budget, deadline,
  circuit breaker, sanitiser and truncation as `SearchEnvironment.step`; a failed or rejected call
  returns the same error observation (TRL itself has no per-tool timeout: ours still applies).
- `get_reward() -> float`: a cost/safety penalty, ``-failure_penalty`` per call that did not succeed
  (invalid, over budget, failed, timed out, ...), ``0.0`` for a clean episode. Correctness comes from
  the trainer's `reward_funcs`; TRL sums the sources.

`make_environment_factory(backend_or_index_dir, config, tools=[...])` gives the zero-argument factory TRL
calls. User-defined tools (`searchrl.env.tools.tool`) become one more public function each
(`tool_env_class`): its signature and Google-style docstring are made from the tool's pydantic model, so TRL
renders the same schema as `SearchEnvironment.tools`, and a call runs through `SearchEnvironment.call_tool`
(validation, budgets, the tool's guard, permission denials as observations). The row's ``principal`` (a
dataset column TRL passes to `reset`) is the principal of every call of the episode.

Token budget: TRL's loop inserts each tool result with the chat template's glue, so pass `meter=
rollout.chat.ChatTokenMeter(tokenizer)` (what the GRPO trainer does) to count each observation exactly as
TRL inserts it; without a meter the environment counts the result's text only.
"""

from __future__ import annotations

import inspect
import os
from collections.abc import Callable, Sequence
from typing import Any

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment, TokenMeter
from searchrl.env.tools import ToolSpec
from searchrl.search.base import Backend


class SearchToolEnv:
    """One pooled TRL environment instance: reset per rollout, `search` as the tool, `get_reward`."""

    def __init__(
        self,
        backend: Backend,
        config: EnvConfig | None = None,
        tokenizer: Any | None = None,
        failure_penalty: float = 0.1,
        meter: TokenMeter | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> None:
        if failure_penalty < 0:
            raise ValueError(f"failure_penalty must be >= 0 (it is subtracted), got {failure_penalty}")
        self._env = SearchEnvironment(backend, config, tokenizer, meter=meter, tools=tools)
        self._failure_penalty = failure_penalty

    def reset(self, **kwargs: Any) -> str | None:
        """Start an episode for one dataset row (TRL passes the row's columns as keyword arguments)."""
        question = kwargs.get("question")
        if not isinstance(question, str) or not question.strip():
            question = _last_user_text(kwargs.get("prompt")) or "(no question given)"
        row = {key: value for key, value in kwargs.items() if key != "prompt"}
        row["question"] = question
        self._env.reset(row)
        return None

    def search(self, query: str) -> str:
        """Search the document collection.

        Args:
            query: The search words.

        Returns:
            Numbered documents with their ids and titles, or an error message that says how to retry.
        """
        return self._call("search", {"query": query})

    def _call(self, name: str, arguments: dict[str, Any]) -> str:
        """One call of tool `name` through the environment (every failure is an observation)."""
        if self._env.row is None:
            self._env.reset({"question": "(no question given)"})
        if self._env.done:
            more = "searches" if name == "search" else "tool calls"
            return f"Error: the episode has ended ({self._env.termination}); no more {more}. Answer now."
        return self._env.call_tool(name, arguments)[1]

    def get_reward(self) -> float:
        """Minus `failure_penalty` for every call that did not succeed in this episode."""
        failed = sum(1 for record in self._env.records if record.status != "ok")
        return -self._failure_penalty * failed

    # Read-only views for reward functions (TRL passes `environments=`); properties are not probed as tools.
    @property
    def environment(self) -> SearchEnvironment:
        return self._env


def _last_user_text(prompt: Any) -> str | None:
    if isinstance(prompt, str):
        return prompt.strip() or None
    if isinstance(prompt, list):
        for message in reversed(prompt):
            if isinstance(message, dict) and message.get("role") == "user":
                content = message.get("content")
                if isinstance(content, str) and content.strip():
                    return content.strip()
    return None


def tool_method(spec: ToolSpec) -> Callable[..., str]:
    """The public function TRL makes a tool of: named like `spec`, with one typed parameter per field of its
    argument model and a Google-style docstring of their descriptions (what `get_json_schema` reads)."""
    fields = spec.args_model.model_fields
    params = [inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)]
    for name, info in fields.items():
        default = (
            inspect.Parameter.empty if info.is_required() else info.get_default(call_default_factory=True)
        )
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=default, annotation=info.annotation
            )
        )

    def method(self: SearchToolEnv, **arguments: Any) -> str:
        return self._call(spec.name, arguments)

    method.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    method.__annotations__ = {name: info.annotation for name, info in fields.items()}
    method.__name__ = method.__qualname__ = spec.name
    described = "".join(f"    {name}: {info.description or name}\n" for name, info in fields.items())
    method.__doc__ = f"{spec.description}\n\nArgs:\n{described}" if described else spec.description
    return method


def tool_env_class(
    tools: Sequence[ToolSpec], base: type[SearchToolEnv] = SearchToolEnv
) -> type[SearchToolEnv]:
    """`base` with one public function per tool of `tools` (TRL probes the class for its tools)."""
    if not tools:
        return base
    taken = {name for name, _ in inspect.getmembers(base, inspect.isfunction)}
    clash = sorted(t.name for t in tools if t.name in taken)
    if clash:
        raise ValueError(f"tools {clash} clash with {base.__name__}'s own functions; rename them")
    methods = {spec.name: tool_method(spec) for spec in tools}
    return type(f"{base.__name__}WithTools", (base,), {**methods, "__doc__": base.__doc__})


def make_environment_factory(
    backend_or_index_dir: Backend | str | os.PathLike,
    config: EnvConfig | None = None,
    tokenizer: Any | None = None,
    failure_penalty: float = 0.1,
    meter: TokenMeter | None = None,
    tools: Sequence[ToolSpec] = (),
) -> Callable[[], SearchToolEnv]:
    """A zero-argument factory of `SearchToolEnv` (with a function per tool of `tools`) over one shared
    backend (opened once from an index dir) and one shared token `meter` (see the module docstring)."""
    backend = _open_backend(backend_or_index_dir)
    config = config if config is not None else EnvConfig()
    tools = list(tools)
    env_class = tool_env_class(tools)
    SearchEnvironment(backend, config, tools=tools)  # refuses a bad tool set now, not in TRL's first rollout

    def factory() -> SearchToolEnv:
        return env_class(backend, config, tokenizer, failure_penalty, meter, tools)

    return factory


def _open_backend(backend_or_index_dir: Backend | str | os.PathLike) -> Backend:
    if isinstance(backend_or_index_dir, str | os.PathLike):
        from searchrl.search.index import open_backend  # bm25s and numba: only for an index path

        return open_backend(backend_or_index_dir)
    if not callable(getattr(backend_or_index_dir, "search", None)):
        raise TypeError(
            f"make_environment_factory needs a Backend (with .search(queries, k)) or an index directory, "
            f"got {type(backend_or_index_dir).__name__}"
        )
    return backend_or_index_dir
