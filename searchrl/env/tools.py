"""The tools an environment can offer: argument schemas, JSON schemas for the chat template, allow-lists.

Every tool the policy may name is a `ToolSpec` in a `ToolRegistry`. A spec owns a pydantic model that
validates the arguments (so a bad call is rejected before anything runs) and a short JSON schema that
the chat template renders into the system prompt (short on purpose: the tiny model's context is small).

Validation outcomes map one to one onto `ToolCallRecord.status` values:

- a name the registry does not know        -> ``unknown_tool``
- a known name outside the allow-list      -> ``permission_denied`` (checked by the environment)
- arguments the pydantic model rejects     -> ``invalid_arguments``, with the pydantic error turned
  into one readable line plus an example of a correct call.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator


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
class ToolSpec:
    """One tool: its name, a one-line description, its argument model and its JSON parameter schema."""

    name: str
    description: str
    args_model: type[BaseModel]
    parameters: Callable[[ArgLimits], dict[str, Any]]
    example_arguments: dict[str, Any] = field(default_factory=dict)

    def schema(self, limits: ArgLimits = DEFAULT_LIMITS) -> dict[str, Any]:
        """The OpenAI/HF function schema that `apply_chat_template(tools=...)` renders."""
        return {
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters(limits),
            },
        }

    def validate(
        self, arguments: Any, limits: ArgLimits = DEFAULT_LIMITS
    ) -> tuple[dict[str, Any] | None, str | None]:
        """(validated arguments, None) or (None, one readable line saying what is wrong)."""
        if not isinstance(arguments, dict):
            return None, f"arguments of {self.name} must be a JSON object, got {type(arguments).__name__}"
        try:
            parsed = self.args_model.model_validate(arguments, context=limits)
        except ValidationError as err:
            return None, f"invalid arguments for {self.name}: {describe_validation_error(err)}"
        return parsed.model_dump(), None


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
        if spec.name in self._specs:
            raise ValueError(f"tool {spec.name!r} is already registered")
        self._specs[spec.name] = spec

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
