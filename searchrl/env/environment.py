"""`SearchEnvironment`: the state machine between the policy's turns and the search backend.

One episode: `reset(row)` gives the prompt messages; then each finished policy turn goes to `step(text)`
(or, for a whole batch of rows that paused at the same step, `step_batch(envs, texts)`), which

1. parses the turn (`protocol.parse_turn`): tool calls, a final answer, or what is malformed;
2. validates every call (pydantic schema), authorises it (allow-list) and checks the budgets;
3. sends all accepted searches of all rows as ONE `backend.search(queries, k)` per distinct
   (backend, k), under a hard deadline, with retries and a shared circuit breaker (`guard.BackendGuard`),
   each query for its episode's principal; and runs every call of a user-defined tool (`tools=`) as its
   own guarded executor call, all of them concurrently with the searches (`executors.py`);
4. turns hits into sanitised, numbered, truncated observations, and every rejected or failed call
   into an observation that says what was wrong and how to call the tool correctly
   (`observations.ObservationWriter`).

Whose episode: a row may carry ``principal``, the user the episode acts for (`searchrl.search.acl`). Every
search of the episode returns only documents that principal may read (none: public documents only), and
every executor receives it in its `ToolContext`. `max_tool_calls` counts searches and tool calls together.

Its settings are `config.EnvConfig`: the episode's (`EpisodeSettings`, which the trainers' environment
section is) and its own limits and failure handling.

Termination (`StepResult.termination`, one of `TERMINATION_REASONS`):

- ``answered``: the turn holds one well-formed ``<answer>`` (the answer wins over tool calls in the
  same turn: those are recorded by the parser but not executed);
- ``no_answer``: a turn with neither a tool call nor an answer, or a malformed answer (several
  ``<answer>`` blocks, an unclosed one);
- ``max_turns``: the turn numbered `max_turns` did not answer (its calls are not executed: there is no
  next turn to read their results; they are recorded with status ``over_budget``);
- ``max_tool_calls``: calls beyond `max_tool_calls` get an "over budget" observation once (status
  ``over_budget``, the backend is never called); if the policy tries again in a later turn instead of
  answering, the episode ends;
- ``token_budget``: the tokens after the prompt (actions + observations) would exceed
  `max_episode_tokens`; the env refuses to add such an observation. The rollout may also end the episode
  itself with `finish("token_budget")`;
- ``error``: set only from outside through `finish("error")` (a failed call is an observation, never a
  crash or an end).

Token counts: the budget adds up what a `TokenMeter` says each turn and observation costs. The rollout
hands every episode its meter (`env.meter`), which counts exactly the tokens the sequence receives, the
chat template's glue included; without one the env counts the text itself (`TextTokenMeter`: tokens of
the tokenizer when one is given, else white-space words; no template glue). Truncation always counts
tokens of the text.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

from searchrl.common.trajectory import TERMINATION_REASONS, ToolCallRecord
from searchrl.env.config import EnvConfig
from searchrl.env.executors import offered_tools, recorded_arguments, start_tool_call, tool_observation
from searchrl.env.guard import BackendGuard, BatchOutcome, Flight, guard_for
from searchrl.env.observations import ObservationWriter, TokenCounter
from searchrl.env.protocol import (
    ANSWER_CLOSE,
    ANSWER_OPEN,
    SEARCH_CLOSE,
    SEARCH_OPEN,
    ToolCall,
    Turn,
    check_call,
    correct_call_hint,
    parse_turn,
)
from searchrl.env.sanitize import special_tokens_of
from searchrl.env.tools import ToolContext, ToolRegistry, ToolSpec, example_call_json
from searchrl.search.acl import check_principal
from searchrl.search.base import Backend, Hit

DEFAULT_SYSTEM_PROMPT_CHAT = (
    "Answer the question. Use the search tool to find documents; you may search more than once. "
    f"When you know the answer, reply {ANSWER_OPEN}ANSWER [doc_id]{ANSWER_CLOSE}, citing in square brackets "
    "the ids of the documents that support it."
)
# Without the template's tool section: one example call stands in for the JSON schema (short prompts).
DEFAULT_SYSTEM_PROMPT_CHAT_COMPACT = (
    'Answer the question. To search, write <tool_call>\n{"name": "search", "arguments": {"query": "..."}}\n'
    f"</tool_call>; you may search more than once. When you know the answer, reply {ANSWER_OPEN}ANSWER "
    f"[doc_id]{ANSWER_CLOSE}, citing the ids of the documents that support it."
)
# With citation_style="number" the prompts say "[n]" where they say "[doc_id]" (`system_prompt`).
DEFAULT_SYSTEM_PROMPT_SEARCH_R1 = (
    f"Answer the question. To search, write {SEARCH_OPEN}query{SEARCH_CLOSE}; the results appear between "
    "<information> and </information>. You may search more than once. When you know the answer, write "
    f"{ANSWER_OPEN}ANSWER [doc_id]{ANSWER_CLOSE}, citing in square brackets the ids of the documents that "
    "support it."
)


@dataclass
class StepResult:
    """What happens after one policy turn. See the module docstring for the termination rules."""

    done: bool
    termination: str | None = None
    tool_messages: list[dict[str, Any]] = field(default_factory=list)
    inline_observation: str | None = None
    records: list[ToolCallRecord] = field(default_factory=list)
    answer: str | None = None
    citations: list[str] = field(default_factory=list)
    error: str | None = None
    injection_attempts: int = 0


class TokenMeter(Protocol):
    """What a finished turn and an observation add to an episode's token count (the budget's only measure)."""

    def turn_tokens(self, text: str) -> int:
        """Tokens of the policy turn `text`, its EOS or stop included."""
        ...

    def observation_tokens(self, result: StepResult) -> int:
        """Tokens the observation of `result` (its tool messages or inline text) adds to the sequence."""
        ...


class TextTokenMeter:
    """The environment's own count when no rollout gives it one: the text's tokens (white-space words
    without a tokenizer), plus one EOS per turn with a tokenizer; no chat-template glue."""

    def __init__(self, counter: TokenCounter) -> None:
        self.counter = counter

    def turn_tokens(self, text: str) -> int:
        return self.counter.count(text) + (1 if self.counter.tokenizer is not None else 0)

    def observation_tokens(self, result: StepResult) -> int:
        if result.inline_observation is not None:
            return self.counter.count(result.inline_observation)
        return sum(self.counter.count(str(m.get("content", ""))) for m in result.tool_messages)


@dataclass
class _Slot:
    """One call of a turn on its way to an observation."""

    record: ToolCallRecord
    content: str | None = None
    query: str | None = None
    k: int | None = None
    shown: dict[str, str] = field(default_factory=dict)
    injections: int = 0
    tool: ToolSpec | None = None  # a user-defined tool to execute (search slots have query and k instead)
    parsed: Any = None  # its validated arguments


@dataclass
class _Plan:
    env: SearchEnvironment
    turn: Turn
    slots: list[_Slot] = field(default_factory=list)
    result: StepResult | None = None  # set when the turn ends the episode before any search


class SearchEnvironment:
    """One episode at a time of question answering with a search tool (see the module docstring).

    `meter` counts what each turn and observation costs against `max_episode_tokens`; the rollout sets its
    own per episode (exact token counts), and TRL's tool loop gets `rollout.chat.ChatTokenMeter`.
    `tools` are user-defined tools (`searchrl.env.tools.tool`) the episode offers besides the config's
    `allowed_tools`: registered and allowed (chat protocol only). `registry` may name further tools the
    policy can call but is not allowed to (a permission denial).
    """

    def __init__(
        self,
        backend: Backend,
        config: EnvConfig | None = None,
        tokenizer: Any | None = None,
        registry: ToolRegistry | None = None,
        meter: TokenMeter | None = None,
        tools: Sequence[ToolSpec] = (),
    ) -> None:
        self.config = config if config is not None else EnvConfig()
        self.registry, self.allowed_tools = offered_tools(self.config, registry, tools)
        self.backend = backend
        self.guard: BackendGuard = guard_for(
            backend, self.config.breaker_failures, self.config.breaker_reset_s
        )
        self.tokenizer = tokenizer
        self.counter = TokenCounter(tokenizer)
        self.writer = ObservationWriter(self.config, self.counter, special_tokens_of(tokenizer))
        self.meter: TokenMeter = meter if meter is not None else TextTokenMeter(self.counter)
        self.row: dict[str, Any] | None = None
        self._clear_episode()

    # -- public surface ----------------------------------------------------------------------------
    @property
    def tools(self) -> list[dict[str, Any]]:
        """JSON tool schemas for `apply_chat_template(tools=...)` (chat protocol; `[]` for search_r1)."""
        if self.config.protocol != "chat" or not self.config.tool_schema_in_prompt:
            return []
        return self.registry.schemas(self.allowed_tools, self.config.limits)

    @property
    def principal(self) -> str | None:
        """The user this episode acts for (the row's ``principal``); None: public documents only."""
        return None if self.row is None else self.row.get("principal")

    @property
    def stop_strings(self) -> list[str]:
        """Stop strings besides EOS: search_r1 stops at the closing tags."""
        return [SEARCH_CLOSE, ANSWER_CLOSE] if self.config.protocol == "search_r1" else []

    @property
    def system_prompt(self) -> str:
        if self.config.system_prompt:
            return self.config.system_prompt
        if self.config.protocol != "chat":
            prompt = DEFAULT_SYSTEM_PROMPT_SEARCH_R1
        elif self.config.tool_schema_in_prompt:
            prompt = DEFAULT_SYSTEM_PROMPT_CHAT
        else:
            prompt = DEFAULT_SYSTEM_PROMPT_CHAT_COMPACT + self._other_tools_line()
        return self._in_citation_style(prompt)

    def _other_tools_line(self) -> str:
        """Without the template's tool schema, the compact prompt names every other tool the episode offers,
        each with its description and an example call (empty when search is the only one)."""
        specs = [self.registry.get(n) for n in self.allowed_tools if n != "search"]
        lines = [f" {s.name}: {s.description} Call it like this: {example_call_json(s)}" for s in specs if s]
        return (" Other tools:" + "".join(lines)) if lines else ""

    def _in_citation_style(self, text: str) -> str:
        if self.config.citation_style != "number":
            return text
        return text.replace("[doc_id]", "[n]").replace(
            "the ids of the documents", "the numbers of the documents"
        )

    def citation_label(self, doc_id: str) -> str:
        """What the policy writes in brackets to cite `doc_id`: its number this episode, or the id itself."""
        if self.config.citation_style == "number" and doc_id in self.source_numbers:
            return str(self.source_numbers[doc_id])
        return doc_id

    def resolve_citation(self, label: str) -> str:
        """The document id a bracketed label stands for; an unknown label is returned as written (it is then
        not in `retrieved`, i.e. a fabricated citation)."""
        if self.config.citation_style == "number" and label.isdigit():
            for doc_id, number in self.source_numbers.items():
                if str(number) == label:
                    return doc_id
        return label

    def reset(self, row: dict[str, Any]) -> list[dict[str, Any]]:
        """Start an episode for `row` (needs `question`; `id` and `golds` are kept) -> [system, user]."""
        if not isinstance(row, dict):
            raise TypeError(f"reset(row) takes a dict with a 'question', got {type(row).__name__}")
        question = row.get("question")
        if not isinstance(question, str) or not question.strip():
            raise ValueError(f"reset(row): the row needs a non-empty 'question' string, got {question!r}")
        check_principal(row.get("principal"), "reset(row): field 'principal'")
        self.row = dict(row)
        self._clear_episode()
        return [
            {"role": "system", "content": self.system_prompt},
            {"role": "user", "content": question.strip()},
        ]

    def step(self, text: str) -> StepResult:
        """One finished policy turn (decoded sampled text, without EOS) in; what happens next out."""
        return step_batch([self], [text])[0]

    def finish(self, reason: str, observation_shown: bool = True) -> None:
        """End the episode from outside (e.g. the rollout hit its exact token budget).

        Pass `observation_shown=False` when the rollout did NOT insert the observation of the last step
        (it would not fit): that observation and the documents first shown in it are then removed from
        `observations`/`retrieved`, so citation rewards only credit what the policy actually saw."""
        if reason not in TERMINATION_REASONS:
            raise ValueError(f"finish({reason!r}): reason must be one of {list(TERMINATION_REASONS)}")
        if not observation_shown:
            self._retract_last_observation()
        if not self.done:
            self.done, self.termination = True, reason

    def _retract_last_observation(self) -> None:
        count, new_docs = self._last_observation
        if count:
            del self.observations[-count:]
        for doc_id in new_docs:
            self.retrieved.pop(doc_id, None)
            self.source_numbers.pop(doc_id, None)
        self._last_observation = (0, [])

    def call_tool(self, name: str, arguments: dict[str, Any]) -> tuple[ToolCallRecord, str]:
        """Run one call outside a parsed turn (TRL's tool loop): the same validation, allow-list, budget,
        deadline and rendering as `step`. Returns the record and the observation text; never raises for
        a bad call. Once the episode has ended, every call gets an observation saying so."""
        self._check_can_step()
        call = check_call(ToolCall(name=str(name), arguments=arguments), self.registry, self.config.limits)
        plan = _Plan(env=self, turn=Turn(text="", protocol=self.config.protocol, tool_calls=[call]))
        self._plan_calls(plan, turn_index=len(self.turns))
        if plan.result is not None:
            record = plan.result.records[0]
            return record, f"Error ({record.status}): {record.error}. Answer now."
        _execute([plan])
        result = self._finish_turn(plan)
        record = plan.slots[0].record
        if result.done:
            return record, f"Error: {result.error}. Answer now."
        return record, plan.slots[0].content or ""

    @property
    def question(self) -> str:
        return "" if self.row is None else str(self.row.get("question", "")).strip()

    @property
    def stats(self) -> dict[str, Any]:
        """Per-episode counters for the training metrics."""
        statuses: dict[str, int] = {}
        for rec in self.records:
            statuses[rec.status] = statuses.get(rec.status, 0) + 1
        return {
            "turns": len(self.turns),
            "tool_calls": len(self.records),
            "searches_sent": self.searches_sent,
            "tokens_used": self.tokens_used,
            "injection_attempts": self.injection_attempts,
            "statuses": statuses,
        }

    # -- episode state -----------------------------------------------------------------------------
    def _clear_episode(self) -> None:
        self.done = False
        self.termination: str | None = None
        self.turns: list[Turn] = []
        self.records: list[ToolCallRecord] = []
        self.retrieved: dict[str, str] = {}
        self.observations: list[str] = []
        self.answer: str | None = None
        self.citations: list[str] = []  # document ids (cited numbers resolved)
        self.cited_labels: list[str] = []  # what the policy wrote in brackets
        self.source_numbers: dict[
            str, int
        ] = {}  # doc id -> its number this episode (citation_style "number")
        self.final_text = ""
        self.tokens_used = 0  # after the prompt, as `meter` counts each turn and observation
        self.searches_sent = 0
        self.calls_sent = 0  # searches and executed tool calls: what `max_tool_calls` counts
        self.injection_attempts = 0
        self._over_budget_warned = False
        self._last_observation: tuple[int, list[str]] = (0, [])  # (observations added, new doc ids)

    # -- turn processing (called by step_batch) ------------------------------------------------------
    def _check_can_step(self) -> None:
        if self.row is None:
            raise RuntimeError("SearchEnvironment.step: call reset(row) before the first step")
        if self.done:
            raise RuntimeError(
                f"SearchEnvironment.step: the episode already ended ({self.termination}); call reset(row) first"
            )

    def _plan_turn(self, text: str) -> _Plan:
        self._check_can_step()
        cfg = self.config
        text = text if isinstance(text, str) else str(text)
        turn = parse_turn(text, cfg.protocol, self.registry, cfg.limits)
        self.turns.append(turn)
        self.final_text = text
        self._last_observation = (0, [])  # the policy wrote a new turn, so it saw the last observation
        self.tokens_used += self.meter.turn_tokens(text)
        plan = _Plan(env=self, turn=turn)
        turn_index = len(self.turns) - 1

        if turn.answer is not None:
            self.cited_labels = list(turn.citations)
            self.answer, self.citations = turn.answer, [self.resolve_citation(c) for c in turn.citations]
            plan.result = self._end("answered", answer=turn.answer, citations=list(self.citations))
        elif turn.answer_error is not None:
            plan.result = self._end("no_answer", error=turn.error)
        elif not turn.has_actions:
            plan.result = self._end(
                "no_answer",
                error="the turn has neither a tool call nor an answer",
            )
        elif len(self.turns) >= cfg.max_turns:
            plan.result = self._end_unexecuted(
                turn, turn_index, "max_turns", f"turn limit ({cfg.max_turns}) reached"
            )
        elif self.tokens_used >= cfg.max_episode_tokens:
            plan.result = self._end_unexecuted(
                turn, turn_index, "token_budget", f"token budget ({cfg.max_episode_tokens}) used up"
            )
        else:
            self._plan_calls(plan, turn_index)
        return plan

    def _end(self, reason: str, **kwargs: Any) -> StepResult:
        self.done, self.termination = True, reason
        return StepResult(done=True, termination=reason, **kwargs)

    def _end_unexecuted(self, turn: Turn, turn_index: int, reason: str, why: str) -> StepResult:
        # Calls the registry rejected keep their own status; valid ones were stopped by the limit.
        records = [
            ToolCallRecord(
                name=c.name,
                arguments=c.arguments,
                status="over_budget" if c.ok else str(c.status),
                error=why if c.ok else c.error,
                turn_index=turn_index,
            )
            for c in turn.tool_calls
        ]
        records += [
            ToolCallRecord(name="", arguments={}, status="malformed", error=m, turn_index=turn_index)
            for m in turn.malformed
        ]
        self.records.extend(records)
        return self._end(reason, records=records, error=why)

    def _plan_calls(self, plan: _Plan, turn_index: int) -> None:
        cfg = self.config
        hint = correct_call_hint(cfg.protocol, self.registry)
        over_budget = False
        for call in plan.turn.tool_calls:
            record = ToolCallRecord(name=call.name, arguments=call.arguments, turn_index=turn_index)
            slot = _Slot(record=record)
            if not call.ok:
                self._reject(slot, str(call.status), str(call.error), hint)
            elif call.name not in self.allowed_tools:
                allowed = ", ".join(self.allowed_tools) or "none"
                self._reject(
                    slot,
                    "permission_denied",
                    f"the tool {call.name!r} is not allowed here; allowed tools: {allowed}",
                    hint,
                )
            elif self.calls_sent >= cfg.max_tool_calls:
                over_budget = True
                self._reject(
                    slot,
                    "over_budget",
                    self._budget_message(),
                    self._in_citation_style(f"Answer now with {ANSWER_OPEN}ANSWER [doc_id]{ANSWER_CLOSE}."),
                )
            elif call.name == "search":
                assert call.validated is not None
                slot.query, slot.k = str(call.validated["query"]), int(call.validated["k"])
                record.arguments = dict(call.validated)
                self.searches_sent += 1
                self.calls_sent += 1
            else:
                slot.tool, slot.parsed = self.registry.get(call.name), call.parsed
                record.arguments = recorded_arguments(call.parsed, call.arguments)
                self.calls_sent += 1
            plan.slots.append(slot)
        for message in plan.turn.malformed:
            slot = _Slot(record=ToolCallRecord(name="", arguments={}, turn_index=turn_index))
            self._reject(slot, "malformed", message, hint)
            plan.slots.append(slot)
        if over_budget and self._over_budget_warned:
            # Told once already: trying again instead of answering ends the episode.
            records = [s.record for s in plan.slots]
            self.records.extend(records)
            plan.slots = []
            plan.result = self._end(
                "max_tool_calls", records=records, error=f"tool-call budget ({cfg.max_tool_calls}) exhausted"
            )
        self._over_budget_warned = self._over_budget_warned or over_budget

    def _budget_message(self) -> str:
        n = self.config.max_tool_calls
        if self.allowed_tools == ["search"]:
            return f"search budget used up ({n} of {n} searches); no more searches will run"
        return f"tool-call budget used up ({n} of {n} calls); no more tool calls will run"

    def _reject(self, slot: _Slot, status: str, detail: str, hint: str) -> None:
        """Record a refused call; its observation says why, then how to go on (`ObservationWriter.error`)."""
        slot.record.status = status
        slot.record.error = detail
        slot.content = self.writer.error(status, detail, hint)

    def _deliver(self, slot: _Slot, outcome: BatchOutcome, hits: list[Hit] | None) -> None:
        """Turn one call's share of a batch outcome into its record and observation."""
        slot.record.latency_ms = outcome.latency_ms
        slot.record.status = outcome.status
        if outcome.status != "ok" or hits is None:
            slot.record.error = outcome.error
            slot.content = self.writer.failure(outcome)
            return
        slot.record.doc_ids = [h.doc_id for h in hits]
        slot.content, slot.shown, slot.injections = self.writer.documents(
            str(slot.query), hits, self.source_numbers
        )

    def _deliver_tool(self, slot: _Slot, outcome: BatchOutcome) -> None:
        """Turn one executed tool call's outcome into its record and observation."""
        assert slot.tool is not None
        slot.record.latency_ms = outcome.latency_ms
        status, slot.content, error, slot.injections = tool_observation(
            slot.tool, outcome, self.writer, self.config
        )
        slot.record.status, slot.record.error = status, error

    def _finish_turn(self, plan: _Plan) -> StepResult:
        if plan.result is not None:
            return plan.result
        cfg = self.config
        records = [s.record for s in plan.slots]
        self.records.extend(records)
        contents = [s.content or "" for s in plan.slots]
        errors = [f"{r.status}: {r.error}" for r in records if r.status != "ok" and r.error]
        error = " | ".join(errors) if errors else None
        result = StepResult(done=False, records=records, error=error)
        if cfg.protocol == "chat":
            result.tool_messages = [
                {"role": "tool", "name": s.tool.name if s.tool else "search", "content": c}
                for s, c in zip(plan.slots, contents, strict=True)
            ]
        else:
            result.inline_observation = "".join(f"\n\n<information>{c}</information>\n\n" for c in contents)
        cost = self.meter.observation_tokens(result)
        if self.tokens_used + cost > cfg.max_episode_tokens:
            return self._end(
                "token_budget",
                records=records,
                error=f"the observation ({cost} tokens) would exceed the token budget ({cfg.max_episode_tokens})",
            )
        self.tokens_used += cost
        self.observations.extend(contents)
        injections = 0
        new_docs: list[str] = []
        for slot in plan.slots:
            new_docs += [d for d in slot.shown if d not in self.retrieved and d not in new_docs]
            self.retrieved.update(slot.shown)
            injections += slot.injections
        self._last_observation = (len(contents), new_docs)
        self.injection_attempts += injections
        result.injection_attempts = injections
        return result


def step_batch(envs: list[SearchEnvironment], texts: list[str]) -> list[StepResult]:
    """Step every env with its turn; ONE `backend.search` per distinct (backend, k) for all rows.

    Searches of different (backend, k) groups run concurrently, so the whole call returns within about
    the largest `search_timeout_s` even when a backend hangs. Identical queries within a group are sent once.
    """
    if len(envs) != len(texts):
        raise ValueError(
            f"step_batch: {len(envs)} environments but {len(texts)} texts; give one text per env"
        )
    if len({id(env) for env in envs}) != len(envs):
        raise ValueError("step_batch: the same environment appears twice; give each row its own environment")
    for env in envs:
        env._check_can_step()
    plans = [env._plan_turn(text) for env, text in zip(envs, texts, strict=True)]
    _execute(plans)
    return [plan.env._finish_turn(plan) for plan in plans]


def _execute(plans: list[_Plan]) -> None:
    """Run the accepted calls of all plans at once: one search flight per (guard, k, limits), each query for
    its episode's principal, and one flight per user-tool call; then collect them all."""
    groups: dict[tuple[int, int, float, int, float], list[tuple[SearchEnvironment, _Slot]]] = {}
    guards: dict[int, BackendGuard] = {}
    tool_flights: list[tuple[Flight, SearchEnvironment, _Slot]] = []
    for plan in plans:
        env, cfg = plan.env, plan.env.config
        for slot in plan.slots:
            if slot.tool is not None:
                context = ToolContext.of(env.row, env.principal)
                tool_flights.append((start_tool_call(slot.tool, slot.parsed, context, cfg), env, slot))
            if slot.query is None or slot.k is None:
                continue
            key = (id(env.guard), slot.k, cfg.search_timeout_s, cfg.max_retries, cfg.retry_backoff_s)
            guards[id(env.guard)] = env.guard
            groups.setdefault(key, []).append((env, slot))
    flights: list[tuple[Flight, list[tuple[str, str | None]], list[tuple[SearchEnvironment, _Slot]]]] = []
    for (guard_id, k, timeout_s, retries, backoff_s), slots in groups.items():
        unique = list(dict.fromkeys((str(s.query), env.principal) for env, s in slots))
        queries, principals = [q for q, _ in unique], [p for _, p in unique]
        flight = guards[guard_id].start(queries, k, timeout_s, retries, backoff_s, principals)
        flights.append((flight, unique, slots))
    for flight, unique, slots in flights:
        outcome = flight.wait()
        by_query = dict(zip(unique, outcome.hits, strict=True)) if outcome.hits is not None else {}
        for env, slot in slots:
            env._deliver(slot, outcome, by_query.get((str(slot.query), env.principal)))
    for flight, env, slot in tool_flights:
        env._deliver_tool(slot, flight.wait())
