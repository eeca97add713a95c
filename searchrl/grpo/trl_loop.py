"""`trl_loop` mode: TRL 1.16's own tool loop over our environment, and its rollouts rebuilt as `Trajectory`s.

Why: TRL's loop is what a TRL user runs (`environment_factory`), and the honest comparison with our batched
engine needs it on the same environment and rubric. Two pieces make that so:

- `tool_env_factory`: TRL's `environment_factory`, a `SearchToolEnv` (`searchrl.env.trl_adapter`) whose
  `search(query, k)` and user-defined tools render exactly the tool schemas our environment shows, so both modes and the SFT warm
  start share one prompt; its token budget counts each tool result as TRL inserts it (`ChatTokenMeter`).
- `trajectory_from_trl`: TRL hands reward functions completion messages and ids but not a trajectory; the
  `Trajectory` is rebuilt from TRL's token ids, tool mask and sampling logprobs (kept by
  `SearchGRPOTrainer._generate`), its completion messages and the environment instance TRL passes as
  `environments=` (tool calls, observations, retrieved documents), so the rubric scores exactly what it
  scores for PPO. Calls TRL's parser rejected or could not dispatch never reached our environment;
  `unexecuted_call_records` records them as our environment would have.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from dataclasses import replace
from typing import Any

from transformers.utils import get_json_schema

from searchrl.common.trajectory import Span, ToolCallRecord, Trajectory
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import parse_turn
from searchrl.env.tools import ToolSpec
from searchrl.env.trl_adapter import SearchToolEnv, tool_env_class
from searchrl.rollout.chat import ChatTokenMeter
from searchrl.search.base import Backend


def tool_env_factory(
    backend: Backend, env_config: EnvConfig, tokenizer: Any, tools: Sequence[ToolSpec] = ()
) -> Callable[[], SearchToolEnv]:
    """TRL's `environment_factory` for `trl_loop`: `SearchToolEnv` whose tool schemas are our env's.

    TRL renders each tool's schema from its method's signature and docstring (`get_json_schema`). The
    adapter's own `search(query)` renders differently from `SearchEnvironment.tools` (no `k`, other
    descriptions), so a policy warm-started on our engine's prompts would see other prompt tokens in
    TRL's loop. This subclass builds `search(query, k)` whose docstring reproduces the environment's
    schema exactly, and one method per user-defined tool of `tools` (`trl_adapter.tool_env_class`); every
    rendered schema is checked here against the environment's, key order included, so both modes and the
    SFT warm start share one prompt.
    """
    tools = list(tools)
    # The schema is rendered from the full registry even for compact prompts: TRL still needs a typed tool.
    schemas = SearchEnvironment(backend, replace(env_config, tool_schema_in_prompt=True), tools=tools).tools
    by_name = {schema["function"]["name"]: schema for schema in schemas}
    if "search" not in by_name:
        raise ValueError(f"trl_loop needs the search tool; the environment offers {sorted(by_name)}")
    function = by_name["search"]["function"]
    args = "".join(
        f"    {name}: {prop.get('description', name)}\n"
        for name, prop in function["parameters"]["properties"].items()
    )

    # No return annotation: transformers would add a "return" entry the environment's schema lacks.
    def search(self, query: str, k: int = env_config.topk):  # noqa: ANN001, ANN202
        return self._call("search", {"query": query, "k": k})

    search.__doc__ = f"{function['description']}\n\nArgs:\n{args}"
    base = type("SearchToolEnvGRPO", (SearchToolEnv,), {"search": search, "__doc__": SearchToolEnv.__doc__})
    env_class = tool_env_class(tools, base)
    for name, schema in by_name.items():
        rendered = get_json_schema(getattr(env_class, name))
        if json.dumps(rendered) != json.dumps(schema):
            raise RuntimeError(
                f"TRL would render the tool {name!r} as {rendered}, the environment as {schema}; give its "
                "arguments plain types (str, int, float, bool, Literal, lists, optional ones) and descriptions"
            )

    # The token budget counts each tool result as TRL inserts it: the template's glue included.
    meter = ChatTokenMeter(tokenizer) if tokenizer is not None else None

    def factory() -> SearchToolEnv:
        # failure_penalty 0: the rubric alone is the reward, exactly as for PPO and our_rollout.
        return env_class(backend, env_config, tokenizer, failure_penalty=0.0, meter=meter, tools=tools)

    return factory


def spans_from_mask(prompt_length: int, mask: Sequence[int]) -> list[Span]:
    """Prompt span, then alternating action (mask 1) and observation (mask 0) runs of the completion."""
    spans = [Span("prompt", 0, prompt_length, "")]
    start = prompt_length
    for i in range(1, len(mask) + 1):
        if i == len(mask) or mask[i] != mask[start - prompt_length]:
            kind = "action" if mask[start - prompt_length] else "observation"
            spans.append(Span(kind, start, prompt_length + i, ""))
            start = prompt_length + i
    return spans


# How TRL's loop reports a call it could not dispatch (unknown argument, exception before our method ran).
TRL_TOOL_ERROR_PREFIX = "{'error':"


def unexecuted_call_records(completion: Sequence[dict[str, Any]]) -> list[ToolCallRecord]:
    """The calls of a TRL rollout that never reached our environment, as our environment would record them.

    So the rubric scores the same text the same way in both modes:
    - a `<tool_call>` TRL's parser rejected (TRL falls back to plain text and ends the episode; our
      environment records it as ``malformed``), found by parsing each assistant message's text;
    - a call TRL parsed but could not dispatch (its tool message holds TRL's ``{'error': ...}``), which
      our environment would have rejected as ``invalid_arguments``.
    """
    records: list[ToolCallRecord] = []
    turn_index = -1
    for message in completion:
        content = message.get("content")
        if message.get("role") == "assistant":
            turn_index += 1
            if isinstance(content, str) and content:
                turn = parse_turn(content)
                for problem in turn.malformed:
                    records.append(
                        ToolCallRecord("", {}, status="malformed", error=problem, turn_index=turn_index)
                    )
                for call in turn.tool_calls:  # well-formed for us, yet TRL did not run it
                    records.append(
                        ToolCallRecord(
                            call.name,
                            dict(call.arguments),
                            status="malformed",
                            error="not a tool call TRL's parser accepts",
                            turn_index=turn_index,
                        )
                    )
        elif (
            message.get("role") == "tool"
            and isinstance(content, str)
            and content.startswith(TRL_TOOL_ERROR_PREFIX)
        ):
            records.append(
                ToolCallRecord(
                    str(message.get("name", "")),
                    {},
                    status="invalid_arguments",
                    error=content,
                    turn_index=turn_index,
                )
            )
    return records


def _termination(final: dict[str, Any], answered: bool, ended_with_eos: bool) -> str:
    if final.get("tool_calls"):
        # The loop stopped with a call it never ran: the iteration cap, or the token budget rolled it back.
        return "max_turns" if ended_with_eos else "token_budget"
    if answered:
        return "answered"
    return "no_answer" if ended_with_eos else "token_budget"


def trajectory_from_trl(
    row: dict[str, Any],
    prompt: list[dict[str, Any]],
    completion: list[dict[str, Any]],
    prompt_ids: Sequence[int],
    completion_ids: Sequence[int],
    tool_mask: Sequence[int] | None,
    logprobs: Sequence[float] | None,
    env: SearchEnvironment,
    eos_token_id: int,
    index: int = 0,
) -> Trajectory:
    """The Trajectory of one TRL tool-loop rollout, so the rubric scores exactly what it scores for PPO."""
    mask = [int(m) for m in (tool_mask if tool_mask is not None else [1] * len(completion_ids))]
    assistant = [m for m in completion if m.get("role") == "assistant"]
    final = assistant[-1] if assistant else {"role": "assistant", "content": ""}
    final_text = final.get("content") or ""
    final_text = final_text if isinstance(final_text, str) else str(final_text)
    turn = parse_turn(final_text)
    answered = turn.answer is not None and not final.get("tool_calls")
    n_prompt = len(prompt_ids)
    lps = list(logprobs) if logprobs is not None else [0.0] * len(completion_ids)
    ended_with_eos = bool(completion_ids) and int(completion_ids[-1]) == int(eos_token_id)
    return Trajectory(
        id=f"{row.get('id', index)}#{index}",
        question_id=str(row.get("id", index)),
        question=str(row.get("question", env.question)),
        golds=list(row.get("golds", []) or []),
        input_ids=[int(i) for i in prompt_ids] + [int(i) for i in completion_ids],
        action_mask=[0] * n_prompt + mask,
        logprobs=[0.0] * n_prompt + [float(x) if m else 0.0 for x, m in zip(lps, mask, strict=False)],
        prompt_length=n_prompt,
        spans=spans_from_mask(n_prompt, mask),
        messages=list(prompt) + list(completion),
        tool_calls=[*env.records, *unexecuted_call_records(completion)],
        observations=list(env.observations),
        retrieved=dict(env.retrieved),
        answer=turn.answer if answered else None,
        citations=[env.resolve_citation(c) for c in turn.citations] if answered else [],
        final_text=final_text,
        num_turns=len(assistant),
        termination=_termination(final, answered, ended_with_eos),
        metadata={"trainer": "grpo", "mode": "trl_loop", "sampling_logprobs": logprobs is not None},
    )
