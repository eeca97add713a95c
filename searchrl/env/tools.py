"""The tools an environment can offer: argument schemas, JSON schemas for the chat template, executors.

Every tool the policy may name is a `ToolSpec` in a `ToolRegistry`. A spec owns a pydantic model that
validates the arguments (so a bad call is rejected before anything runs) and a short JSON schema that
the chat template renders into the system prompt (short on purpose: the tiny model's context is small).

`search` is built in: the environment runs it itself, batched (one backend call per distinct k). Any other
tool is defined by its user with an *executor*: a function of the validated arguments (an instance of the
tool's pydantic model) and the episode's `ToolContext` (its row and its principal) that returns the
observation (a string, or a JSON-serialisable dict or list). `tool(name, description, Args)` turns such a
function into a `ToolSpec`; `SearchEnvironment(..., tools=[spec])` offers it. The environment runs executors
under its deadline, retries and a circuit breaker per tool (`guard.py`), concurrently across a batch
(`executors.py`). An executor tells the policy "not allowed" by raising `ToolPermissionError(reason)`
(status ``permission_denied``; the observation says what is not allowed and shows nothing of the object);
`ToolUnavailable` is a transient failure worth a retry; any other exception, a hang or a return value that
is not text becomes an error observation, never a crashed rollout.

Validation outcomes map one to one onto `ToolCallRecord.status` values:

- a name the registry does not know        -> ``unknown_tool``
- a known name outside the allow-list      -> ``permission_denied`` (checked by the environment)
- arguments the pydantic model rejects     -> ``invalid_arguments``, with the pydantic error turned
  into one readable line plus an example of a correct call.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

# A tool's name: what the policy writes in a call and TRL's tool loop makes a method of.
TOOL_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,63}")
# Names TRL's `environment_factory` class already uses for itself (`SearchToolEnv`).
RESERVED_TOOL_NAMES = frozenset({"reset", "get_reward", "environment"})


@dataclass(frozen=True)
class ArgLimits:
    """Bounds the search arguments are checked against (taken from `EnvConfig`)."""

    topk: int = 3
    max_topk: int = 10
    max_query_chars: int = 256

    def __post_init__(self) -> None:
        if self.max_topk < 1:
            raise ValueError(f"max_topk must be >= 1, got {self.max_topk}")
        if not 1 <= self.topk <= self.max_topk:
            raise ValueError(f"topk must be between 1 and max_topk={self.max_topk}, got {self.topk}")
        if self.max_query_chars < 1:
            raise ValueError(f"max_query_chars must be >= 1, got {self.max_query_chars}")


DEFAULT_LIMITS = ArgLimits()


class SearchArgs(BaseModel):
    """Arguments of the `search` tool. Limits come from the validation context (an `ArgLimits`)."""

    # Unknown keys are an error: a model that invents `top_k` should learn the real name.
    model_config = ConfigDict(extra="forbid", strict=True)

    query: str = Field(description="search query")
    k: int | None = Field(default=None, validate_default=True, description="number of documents to return")

    @field_validator("query")
    @classmethod
    def _query_is_usable(cls, value: str, info: ValidationInfo) -> str:
        limits = _limits_from(info)
        value = value.strip()
        if not value:
            raise ValueError("query must not be empty")
        if len(value) > limits.max_query_chars:
            raise ValueError(f"query is {len(value)} characters long; the limit is {limits.max_query_chars}")
        return value

    @field_validator("k")
    @classmethod
    def _k_in_bounds(cls, value: int | None, info: ValidationInfo) -> int:
        limits = _limits_from(info)
        if value is None:
            return limits.topk
        if not 1 <= value <= limits.max_topk:
            raise ValueError(f"k must be between 1 and {limits.max_topk}, got {value}")
        return value


def _limits_from(info: ValidationInfo) -> ArgLimits:
    context = info.context
    if isinstance(context, ArgLimits):
        return context
    return DEFAULT_LIMITS


def _search_schema(limits: ArgLimits) -> dict[str, Any]:
    return {
        "type": "object",
        "properties": {
            "query": {"type": "string", "description": "search query"},
            "k": {
                "type": "integer",
                "description": f"documents to return, 1-{limits.max_topk} (default {limits.topk})",
            },
        },
        "required": ["query"],
    }


@dataclass(frozen=True)
class ToolContext:
    """What an executor knows of the episode it acts in: the question row (read-only) and its principal.

    `principal` is the user the episode acts for (the row's ``principal``; None: nobody in particular). An
    executor decides from it what the call may see, and raises `ToolPermissionError` for anything else."""

    row: Mapping[str, Any]
    principal: str | None = None

    @classmethod
    def of(cls, row: Mapping[str, Any] | None, principal: str | None) -> ToolContext:
        return cls(MappingProxyType(dict(row or {})), principal)


class ToolPermissionError(Exception):
    """Raised by an executor: the episode's principal may not do this. Status ``permission_denied``.

    `reason` is shown to the policy (sanitised, at most 200 characters): say *what* is not allowed ("order
    o-17 belongs to another customer"), never the object's content."""

    def __init__(self, reason: str = "not allowed for the user this episode acts for") -> None:
        super().__init__(reason)
        self.reason = str(reason)


class ToolUnavailable(Exception):
    """Raised by an executor when its service failed for now: retried (`max_retries`), then ``unavailable``;
    it counts toward the tool's circuit breaker. Its message is shown to the policy."""


Executor = Callable[[Any, ToolContext], Any]


@dataclass(frozen=True)
class ToolSpec:
    """One tool: its name, a one-line description, its argument model and its JSON parameter schema.

    `executor` runs a user-defined tool (None for the built-in `search`, which the environment batches);
    `parameters` renders the schema for given limits (None: derived from `args_model`'s fields, each of
    which then needs a description); `timeout_s` overrides the environment's deadline for this tool."""

    name: str
    description: str
    args_model: type[BaseModel]
    parameters: Callable[[ArgLimits], dict[str, Any]] | None = None
    example_arguments: dict[str, Any] = field(default_factory=dict)
    executor: Executor | None = None
    timeout_s: float | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not TOOL_NAME.fullmatch(self.name):
            raise ValueError(
                f"tool name {self.name!r} must be a Python identifier of at most 64 characters (the policy "
                "writes it in calls; TRL's tool loop makes a method of it)"
            )
        if self.name in RESERVED_TOOL_NAMES:
            raise ValueError(f"tool name {self.name!r} is reserved ({sorted(RESERVED_TOOL_NAMES)})")
        if not isinstance(self.args_model, type) or not issubclass(self.args_model, BaseModel):
            raise TypeError(f"tool {self.name!r}: args_model must be a pydantic BaseModel class")
        if self.timeout_s is not None and not self.timeout_s > 0:
            raise ValueError(f"tool {self.name!r}: timeout_s must be > 0 seconds, got {self.timeout_s}")
        if self.parameters is None:
            model_parameters(self.args_model)  # refuses nested models now, not when a prompt is rendered
            undescribed = [n for n, f in self.args_model.model_fields.items() if not f.description]
            if undescribed:
                raise ValueError(
                    f"tool {self.name!r}: give every argument a description (Field(description=...)), the "
                    f"policy reads them in the tool schema; missing for {undescribed}"
                )

    def schema(self, limits: ArgLimits = DEFAULT_LIMITS) -> dict[str, Any]:
        """The OpenAI/HF function schema that `apply_chat_template(tools=...)` renders."""
        parameters = (
            self.parameters(limits) if self.parameters is not None else model_parameters(self.args_model)
        )
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": parameters,
            },
        }

    def parse(
        self, arguments: Any, limits: ArgLimits = DEFAULT_LIMITS
    ) -> tuple[BaseModel | None, str | None]:
        """(the arguments as an `args_model` instance, None) or (None, one readable line saying what is wrong)."""
        if not isinstance(arguments, dict):
            return None, f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}"
        try:
            return self.args_model.model_validate(arguments, context=limits), None
        except ValidationError as err:
            return None, f"invalid arguments for {self.name}: {describe_validation_error(err)}"
        except Exception as exc:  # a validator with a bug must not crash a rollout: the call is refused
            return None, f"invalid arguments for {self.name}: its argument model raised {type(exc).__name__}"

    def validate(
        self, arguments: Any, limits: ArgLimits = DEFAULT_LIMITS
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(validated arguments, None) or (None, one readable line saying what is wrong)."""
        parsed, problem = self.parse(arguments, limits)
        if parsed is None:
            return None, problem
        return parsed.model_dump(), None


def tool(
    name: str,
    description: str,
    args_model: type[BaseModel],
    *,
    example_arguments: dict[str, Any] | None = None,
    timeout_s: float | None = None,
) -> Callable[[Executor], ToolSpec]:
    """Decorator: the executor `fn(args, context) -> str` below it becomes a `ToolSpec` named `name`.

    ``@tool("get_order", "Look up one of your orders by its id.", GetOrderArgs)`` over
    ``def get_order(args: GetOrderArgs, ctx: ToolContext) -> str`` (see docs/environment.md)."""

    def wrap(executor: Executor) -> ToolSpec:
        if not callable(executor):
            raise TypeError(f"tool {name!r}: the executor must be callable, got {type(executor).__name__}")
        return ToolSpec(
            name=name,
            description=description,
            args_model=args_model,
            example_arguments=dict(example_arguments or {}),
            executor=executor,
            timeout_s=timeout_s,
        )

    return wrap


def model_parameters(model: type[BaseModel]) -> dict[str, Any]:
    """The JSON parameter schema of a tool's argument model, written as transformers' `get_json_schema`
    writes a function's (types, items, enum, nullable, description; no titles or defaults), so our engine's
    prompt and TRL's tool loop render the same tool the same way."""
    raw = model.model_json_schema()
    if "$defs" in raw:
        raise ValueError(
            f"{model.__name__}: nested models in tool arguments are not supported; use plain fields (str, int, "
            "float, bool, Literal, lists of those, optional ones)"
        )
    properties = {name: _property(prop) for name, prop in raw.get("properties", {}).items()}
    out: dict[str, Any] = {"type": "object", "properties": properties}
    if raw.get("required"):
        out["required"] = list(raw["required"])
    return out


def _property(prop: dict[str, Any]) -> dict[str, Any]:
    nullable = False
    options = prop.get("anyOf")
    if isinstance(options, list):
        rest = [o for o in options if o != {"type": "null"}]
        nullable = len(rest) < len(options)
        base = dict(rest[0]) if len(rest) == 1 else {"anyOf": rest}
    else:
        base = {k: v for k, v in prop.items() if k not in ("title", "default", "description")}
    out: dict[str, Any] = {}
    for key in ("type", "items", "enum"):
        if key in base:
            out[key] = _clean(base[key])
    out.update(
        {k: _clean(v) for k, v in base.items() if k not in ("type", "items", "enum", "title", "default")}
    )
    if nullable:
        out["nullable"] = True
    if prop.get("description"):
        out["description"] = prop["description"]
    return out


def _clean(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _clean(v) for k, v in value.items() if k not in ("title", "default")}
    if isinstance(value, list):
        return [_clean(v) for v in value]
    return value


def describe_validation_error(err: ValidationError) -> str:
    """Turn pydantic's multi-line report into one line: `field: problem; field: problem`."""
    parts = []
    for item in err.errors(include_url=False):
        where = ".".join(str(p) for p in item.get("loc", ())) or "arguments"
        message = str(item.get("msg", "invalid value"))
        message = message.removeprefix("Value error, ")
        if item.get("type") == "extra_forbidden":
            message = "unknown argument"
        elif item.get("type") == "missing":
            message = "required argument is missing"
        parts.append(f"{where}: {message}")
    return "; ".join(parts)


SEARCH_TOOL = ToolSpec(
    name="search",
    description="Search the document collection. Returns numbered documents with their ids.",
    args_model=SearchArgs,
    parameters=_search_schema,
    example_arguments={"query": "your search words", "k": 3},
)


class ToolRegistry:
    """The tools the policy may name. Unknown names are `unknown_tool`; the allow-list is the env's."""

    def __init__(self, specs: list[ToolSpec] | None = None) -> None:
        self._specs: dict[str, ToolSpec] = {}
        for spec in specs if specs is not None else [SEARCH_TOOL]:
            self.register(spec)

    def register(self, spec: ToolSpec) -> None:
        if not isinstance(spec, ToolSpec):
            raise TypeError(
                f"a tool must be a ToolSpec (see searchrl.env.tools.tool), got {type(spec).__name__}"
            )
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._specs[spec.name] = spec

    def with_tools(self, specs: list[ToolSpec]) -> ToolRegistry:
        """A new registry: these tools, then `specs` (a name registered twice is an error)."""
        registry = ToolRegistry(list(self._specs.values()))
        for spec in specs:
            registry.register(spec)
        return registry

    def get(self, name: str) -> ToolSpec | None:
        return self._specs.get(name)

    @property
    def names(self) -> list[str]:
        return list(self._specs)

    def __contains__(self, name: object) -> bool:
        return name in self._specs

    def schemas(self, names: list[str], limits: ArgLimits = DEFAULT_LIMITS) -> list[dict[str, Any]]:
        return [self._specs[n].schema(limits) for n in names if n in self._specs]


DEFAULT_REGISTRY = ToolRegistry()


def example_call_json(spec: ToolSpec) -> str:
    """The JSON body of a correct call of `spec`, as the Qwen2.5 template renders it."""
    return json.dumps({"name": spec.name, "arguments": spec.example_arguments}, ensure_ascii=False)
