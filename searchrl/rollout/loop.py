"""The one turn loop: episodes driven through any token engine, the environment and the token budgets.

What: `TurnLoop.rollout(envs, rows, sampling)` runs one episode per row and returns a `RolloutBatch`,
sampling as that call's `Sampling` says (temperature, top-k, top-p, seed; by default the loop's
`GenerationConfig`'s), so callers that share an engine never change its config. Each round
it asks the engine (`TokenEngine.generate`) to continue every live row's sequence, given as token ids
(prompt, sampled tokens, inserted observations); reads the answer token by token with one stopping rule;
sends every row whose turn ended in that round to `step_batch` together (one batched search); and
appends each observation's tokens, with exactly the chat template's glue, at action mask 0. The loop is
the only place that appends a token, sets the action mask, applies the turn and episode budgets and
counts tokens: the environment's budget adds up what the loop's meter tells it (`_RowMeter`).

The engines differ only in how they produce tokens:

- `generator.KVCacheEngine` (the HF backend): all live rows in one batched KV cache, one token per row
  and call, so rows that end a turn at the same step pause together, their observations go into the same
  cache, and finished rows leave it. Nothing is prefilled twice.
- `generator.ReplayEngine`: model-free replay, every token forced (expert demonstrations).
- `vllm_generator.VLLMEngine` (and its CPU reference `HFTokenEngine`): a whole turn per call; the engine
  may stop early or run past our stop (those tokens are dropped), the loop decides where a turn ends.

`HFGenerator` and `VLLMGenerator` are this loop plus the construction of their engine.

Failures: a policy's bad tool call is an observation (the environment's job). If the environment itself
raises, only the rows that paused at that step end, with termination "error" and the exception in
`Trajectory.metadata["error"]`; the other rows go on.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import PreTrainedTokenizerBase

from searchrl.common.trajectory import Span, Trajectory
from searchrl.env.environment import step_batch
from searchrl.rollout.chat import ToolGlue, observation_ids, prompt_ids, tools_key
from searchrl.rollout.sampling import Sampling
from searchrl.rollout.stats import rollout_stats


@dataclass
class GenerationConfig:
    """Sampling and length limits of a rollout (`sampling()`: the sampling part, what a call may change)."""

    temperature: float = field(
        default=1.0, metadata={"help": "Softmax temperature; 0 means greedy. Logprobs are recorded under it."}
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass in (0, 1]; 1 disables it."})
    top_k: int = field(default=0, metadata={"help": "Keep only the k most likely tokens; 0 disables it."})
    max_new_tokens_per_turn: int = field(
        default=256, metadata={"help": "A turn longer than this ends the episode with 'token_budget'."}
    )
    max_episode_tokens: int = field(
        default=1024,
        metadata={"help": "Tokens after the prompt (actions + observations); beyond it: 'token_budget'."},
    )
    seed: int = field(
        default=0, metadata={"help": "Seed of the sampling generator (same seed, same rollout)."}
    )
    share_prompt_prefill: bool = field(
        default=True,
        metadata={"help": "Compute identical prompts (e.g. a GRPO group's copies) once and share the cache."},
    )
    compact_pad_fraction: float = field(
        default=0.5,
        metadata={
            "help": "Squeeze padding out of the KV cache when more than this fraction of it is padding."
        },
    )

    def sampling(self, **changes: Any) -> Sampling:
        """This config's sampling fields as a `Sampling`, with `changes` (e.g. `seed=`, `temperature=`)."""
        fields = {
            "temperature": self.temperature,
            "top_p": self.top_p,
            "top_k": self.top_k,
            "seed": self.seed,
        }
        return Sampling(**{**fields, **changes})

    def validate(self) -> None:
        self.sampling()  # checks temperature, top_p and top_k
        if self.max_new_tokens_per_turn < 1 or self.max_episode_tokens < 1:
            raise ValueError("max_new_tokens_per_turn and max_episode_tokens must be >= 1")


# -------------------------------------------------------------------------------------------------
# The engine protocol: what the loop needs from whatever produces tokens
# -------------------------------------------------------------------------------------------------


@dataclass
class TurnParams:
    """Sampling settings of one request (the fields of vLLM's `SamplingParams` the loop uses).

    `row`, `turn` and `position` say where the request continues (row index in the batch, assistant
    turn, tokens of that turn already sampled): vLLM ignores them, the HF engines key their cache rows
    and their teacher forcing on them.
    """

    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0
    seed: int = 0
    stop_token_ids: list[int] = field(default_factory=list)
    stop: list[str] = field(default_factory=list)
    row: int = 0
    turn: int = 0
    position: int = 0


@dataclass
class TurnCompletion:
    """The engine's answer to one request: sampled ids, their logprobs, prompt tokens found cached."""

    token_ids: list[int]
    logprobs: list[float]
    cached_tokens: int = 0
    finish_reason: str | None = None


class TokenEngine(Protocol):
    """Produces tokens for the turn loop, driven by token ids (KV cache, replay, vLLM, `HFTokenEngine`).

    `generate` gets each live row's whole sequence so far (read during the call only, never kept or
    changed) and answers at least one token per row, at most `max_tokens`, each with the logprob of the
    sampling distribution (`generator.sampling_log_probs`). Stopping at a stop is only an early exit: the
    loop drops what follows its own stop and continues a row that stopped short in the next call.
    """

    name: str

    def generate(self, prompts: Sequence[list[int]], params: Sequence[TurnParams]) -> list[TurnCompletion]:
        """One completion per prompt, in order, each stopping at its `max_tokens` or a stop."""
        ...

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Replace the engine's weights by these (Hugging Face parameter names) and drop cached KV."""
        ...


class TokenForcing(Protocol):
    """Teacher forcing hook: return a token id to emit instead of sampling, or None to sample.

    The forced token's logprob is still recorded under the sampling distribution, so a forced rollout
    is exactly what a policy that happened to sample those tokens would have produced.
    """

    def __call__(self, row: int, turn: int, position: int) -> int | None: ...


# -------------------------------------------------------------------------------------------------
# Episode state
# -------------------------------------------------------------------------------------------------


@dataclass
class RolloutBatch:
    """What one rollout call produced: the trajectories and the batch metrics."""

    trajectories: list[Trajectory]
    stats: dict[str, float]


@dataclass
class EpisodeState:
    """One episode's state while its batch runs: tokens, mask, logprobs, spans, turn and budget counts."""

    index: int
    env: Any
    row: dict[str, Any]
    messages: list[dict[str, Any]]
    ids: list[int]
    mask: list[int]
    logprobs: list[float]
    spans: list[Span]
    prompt_length: int
    glue: ToolGlue | None
    turn_ids: list[int] = field(default_factory=list)
    turn_index: int = 0
    done: bool = False
    observations: list[str] = field(default_factory=list)
    error: str | None = None  # set when the environment itself failed
    r1_content: str = ""  # search_r1: the one assistant message grows with actions and observations
    meter: _RowMeter | None = None  # this episode's token counts, which the environment's budget reads

    @property
    def episode_tokens(self) -> int:
        return len(self.ids) - self.prompt_length


class _RowMeter:
    """The environment's `TokenMeter` for one episode: the loop's own, exact counts.

    A turn costs the tokens sampled for it; an observation costs the ids the loop would insert for it,
    which are kept so that inserting them measures nothing again. `seconds` is the time spent measuring
    (the loop's, not the environment's: it is taken out of `rollout/search_s`).
    """

    def __init__(self, state: EpisodeState, tokenizer: PreTrainedTokenizerBase) -> None:
        self.state = state
        self.tokenizer = tokenizer
        self.seconds = 0.0
        self._last: tuple[Any, list[int], str] | None = None

    def turn_tokens(self, text: str) -> int:
        return len(self.state.turn_ids)

    def observation(self, result: Any) -> tuple[list[int], str]:
        """The observation's ids and text (measured once per step result)."""
        if self._last is None or self._last[0] is not result:
            t0 = time.perf_counter()
            ids, text = observation_ids(self.tokenizer, self.state.glue, result)
            self.seconds += time.perf_counter() - t0
            self._last = (result, ids, text)
        return self._last[1], self._last[2]

    def observation_tokens(self, result: Any) -> int:
        return len(self.observation(result)[0])


@dataclass
class EngineUsage:
    """What the engine was asked and answered in one rollout (the vLLM metrics read it)."""

    calls: int = 0
    submitted: int = 0  # prompt tokens sent
    cached: int = 0  # of those, found in the engine's prefix cache
    computed: int = 0  # positions the engine ran: uncached prompt tokens + every answer token but the last
    dropped: int = 0  # answer tokens past the loop's stop


def _offered_tools(env: Any) -> dict[str, Any]:
    """`{"allowed_tools": [...]}` when the environment offered a tool besides search, else nothing."""
    allowed = list(getattr(env, "allowed_tools", []) or [])
    return {"allowed_tools": allowed} if set(allowed) - {"search"} else {}


def _cited_labels(env: Any) -> dict[str, list[str]]:
    """The bracketed labels as the policy wrote them, when they are not the document ids (numbered sources)."""
    labels = list(getattr(env, "cited_labels", []) or [])
    return {"cited_labels": labels} if labels and labels != list(getattr(env, "citations", []) or []) else {}


# -------------------------------------------------------------------------------------------------
# The loop
# -------------------------------------------------------------------------------------------------


class TurnLoop:
    """Multi-turn rollouts over a `TokenEngine` (module docstring); subclasses build the engine.

    Args:
        tokenizer: the policy's tokenizer (pad != EOS).
        config: sampling and length limits (`GenerationConfig`); a rollout samples as its config says unless
            the call passes its own `Sampling` (a trainer's step seed, an evaluation's temperature).
        step_batch: the batched environment step (default `searchrl.env.environment.step_batch`).
    """

    def __init__(
        self,
        tokenizer: PreTrainedTokenizerBase,
        config: GenerationConfig | None = None,
        step_batch: Callable[[list[Any], list[str]], list[Any]] | None = None,
    ) -> None:
        self.tokenizer = tokenizer
        self.config = config or GenerationConfig()
        self.config.validate()
        self._step_batch = step_batch
        if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
            raise ValueError("the tokenizer needs a pad token distinct from EOS (Qwen2.5: <|endoftext|>)")
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self._glues: dict[str, ToolGlue] = {}

    # -- what a subclass provides ----------------------------------------------------------------
    def _engine(self, sampling: Sampling) -> TokenEngine:
        """The engine for one rollout that samples as `sampling` says."""
        raise NotImplementedError

    def _model_tokens(self, engine: TokenEngine, usage: EngineUsage) -> tuple[int, int]:
        """(positions the model computed, of them real tokens): by default what the answers imply."""
        return usage.computed, usage.computed

    def _engine_stats(self, usage: EngineUsage) -> dict[str, float]:
        """Metrics of the engine's own, added to the batch metrics."""
        return {}

    # -- the loop --------------------------------------------------------------------------------
    def rollout(
        self, envs: list[Any], rows: list[dict[str, Any]], sampling: Sampling | None = None
    ) -> RolloutBatch:
        """Run one episode per (environment, row) pair, all rows in one batch, sampling as `sampling` says
        (None: as the loop's `GenerationConfig` says)."""
        sampling = sampling if sampling is not None else self.config.sampling()
        if len(envs) != len(rows):
            raise ValueError(
                f"rollout needs one environment per row: got {len(envs)} envs and {len(rows)} rows"
            )
        if not rows:
            return RolloutBatch([], rollout_stats([], wall_s=0.0))
        started = time.perf_counter()
        states = [self._start_row(i, env, row) for i, (env, row) in enumerate(zip(envs, rows, strict=True))]
        engine = self._engine(sampling)
        usage = EngineUsage()
        search_s = 0.0
        live = list(states)
        while live:
            asking = self._rows_with_room(live, engine)
            if asking:
                ended = self._sample(engine, asking, usage, sampling)
                if ended:
                    search_s += self._step_ended(ended)
            live = [r for r in live if not r.done]
        wall = time.perf_counter() - started
        trajectories = [self._trajectory(r, sampling) for r in states]
        model_tokens, real_tokens = self._model_tokens(engine, usage)
        stats = rollout_stats(
            trajectories,
            wall_s=wall,
            search_s=search_s,
            model_tokens=model_tokens,
            model_real_tokens=real_tokens,
        )
        return RolloutBatch(trajectories, stats | self._engine_stats(usage))

    def _rows_with_room(
        self, live: list[EpisodeState], engine: TokenEngine
    ) -> list[tuple[EpisodeState, int]]:
        """Live rows with the most tokens each may sample next; a row with no room ends with "token_budget"."""
        cfg = self.config
        max_len = getattr(engine, "max_model_len", None)
        asking = []
        for r in live:
            room = min(
                cfg.max_new_tokens_per_turn - len(r.turn_ids), cfg.max_episode_tokens - r.episode_tokens
            )
            if max_len is not None:
                room = min(room, int(max_len) - len(r.ids))
            if room >= 1:
                asking.append((r, room))
                continue
            # The context is full (the engine's max_model_len): end like any other token budget.
            if r.turn_ids:
                self._record_action(r, self._decode(r.turn_ids))
            self._finish(r, "token_budget")
        return asking

    def _sample(
        self,
        engine: TokenEngine,
        asking: list[tuple[EpisodeState, int]],
        usage: EngineUsage,
        sampling: Sampling,
    ) -> list[tuple[EpisodeState, str]]:
        """One engine call for the rows in `asking`; appends their tokens. Returns the rows whose turn ended."""
        prompt_lengths = [len(r.ids) for r, _ in asking]
        params = [self._params(r, room, sampling) for r, room in asking]
        answers = engine.generate([r.ids for r, _ in asking], params)
        usage.calls += 1
        if len(answers) != len(asking):
            raise RuntimeError(f"engine returned {len(answers)} answers for {len(asking)} prompts")
        ended: list[tuple[EpisodeState, str]] = []
        for (r, _), prompt_length, out in zip(asking, prompt_lengths, answers, strict=True):
            if not out.token_ids:
                raise RuntimeError(f"engine returned no token for row {r.index}")
            usage.submitted += prompt_length
            usage.cached += out.cached_tokens
            # Nothing follows the last sampled token in this call, so the engine never ran it.
            usage.computed += prompt_length - out.cached_tokens + len(out.token_ids) - 1
            is_end, text, dropped = self._consume(r, out)
            usage.dropped += dropped
            if is_end:
                ended.append((r, text))
        return ended

    def _params(self, r: EpisodeState, room: int, sampling: Sampling) -> TurnParams:
        return TurnParams(
            max_tokens=room,
            temperature=sampling.temperature,
            top_p=sampling.top_p,
            top_k=sampling.top_k,
            seed=self._seed(r, sampling.seed),
            stop_token_ids=[self.eos_id],
            stop=list(getattr(r.env, "stop_strings", []) or []),
            row=r.index,
            turn=r.turn_index,
            position=len(r.turn_ids),
        )

    @staticmethod
    def _seed(r: EpisodeState, seed: int) -> int:
        # One sampling stream per (rollout seed, row, turn, position) for engines seeded per request, so
        # rollouts repeat for the same seed (the KV-cache engine keeps one stream per rollout instead).
        key = seed * 1_000_003 + r.index * 10_007 + r.turn_index * 101 + len(r.turn_ids)
        return int(key % (2**31))

    def _consume(self, r: EpisodeState, out: TurnCompletion) -> tuple[bool, str, int]:
        """Append the answer's tokens up to where a turn or a budget stops; (turn ended, its text, dropped)."""
        if len(out.logprobs) != len(out.token_ids):
            raise RuntimeError(
                f"engine answer for row {r.index}: {len(out.token_ids)} tokens but {len(out.logprobs)} logprobs"
            )
        cfg = self.config
        for k, (tok, lp) in enumerate(zip(out.token_ids, out.logprobs, strict=True)):
            r.ids.append(int(tok))
            r.mask.append(1)
            r.logprobs.append(float(lp))
            r.turn_ids.append(int(tok))
            is_end, text = self._turn_end(r, int(tok))
            dropped = len(out.token_ids) - k - 1
            if is_end:
                return True, text, dropped
            if len(r.turn_ids) >= cfg.max_new_tokens_per_turn or r.episode_tokens >= cfg.max_episode_tokens:
                self._record_action(r, self._decode(r.turn_ids))
                self._finish(r, "token_budget")
                return False, "", dropped
        return False, "", 0

    def _turn_end(self, r: EpisodeState, token: int) -> tuple[bool, str]:
        """(ended, text to hand the environment) after `token` was appended to the row's turn."""
        if token == self.eos_id:
            return True, self._decode(r.turn_ids[:-1])
        stops = list(getattr(r.env, "stop_strings", []) or [])
        if stops:
            # The stop string was absent before this token, so it ends within the last len(stop)+1 tokens.
            window = max(len(s) for s in stops) + 1
            tail = self._decode(r.turn_ids[-window:])
            if any(s in tail for s in stops):
                return True, self._decode(r.turn_ids)
        return False, ""

    # -- the environment step ----------------------------------------------------------------------
    def _step_ended(self, ended: list[tuple[EpisodeState, str]]) -> float:
        """One batched environment step for every row whose turn ended; returns the environment's seconds.

        Records each action; a row whose environment failed ends with "error" (the others go on), a
        finished one is done, one whose observation does not fit ends with "token_budget" (and the
        environment forgets that observation: the policy never saw it), the others get their observation
        appended (the engine reads it with the next request).
        """
        meters = [self._meter(r) for r, _ in ended]
        measured = sum(m.seconds for m in meters)
        t0 = time.perf_counter()
        results = self._safe_step(ended)
        # The step asked the meters for observation ids: that is the rollout's work, not the search's.
        seconds = time.perf_counter() - t0 - (sum(m.seconds for m in meters) - measured)
        for (r, text), res in zip(ended, results, strict=True):
            self._record_action(r, text)
            if res is None:  # the environment itself failed: only this row ends
                self._finish(r, "error")
            elif res.done:
                r.done = True
            elif not self._insert(r, res):
                self._finish(r, "token_budget", observation_shown=False)
        return seconds

    def _safe_step(self, ended: list[tuple[EpisodeState, str]]) -> list[Any]:
        """`step_batch` for the paused rows; if the environment raises, those rows get None (-> "error").

        A policy's bad call is an observation inside the environment; this only catches the
        environment's own bugs, so one broken episode cannot crash the whole batch."""
        envs, texts = [r.env for r, _ in ended], [text for _, text in ended]
        try:
            return self._step_batch(envs, texts) if self._step_batch is not None else step_batch(envs, texts)
        except Exception as exc:  # noqa: BLE001 - any environment failure must end only these episodes
            for r, _ in ended:
                r.error = f"{type(exc).__name__}: {exc}"
            return [None] * len(ended)

    def _insert(self, r: EpisodeState, result: Any) -> bool:
        """Append the observation of a step result (glue included); False when the budget forbids it.

        The observation must leave room for the next action, so one that reaches the episode budget is
        refused too."""
        ids, text = self._meter(r).observation(result)
        if not ids or r.episode_tokens + len(ids) >= self.config.max_episode_tokens:
            return False
        start = len(r.ids)
        r.ids.extend(ids)
        r.mask.extend([0] * len(ids))
        r.logprobs.extend([0.0] * len(ids))
        r.spans.append(Span("observation", start, len(r.ids), text))
        r.observations.append(text)
        if r.glue is not None:
            r.messages.extend(result.tool_messages)
        else:
            r.r1_content += text
        return True

    def _meter(self, r: EpisodeState) -> _RowMeter:
        assert r.meter is not None, "_start_row gives every episode its meter"
        return r.meter

    def _record_action(self, r: EpisodeState, text: str) -> None:
        start = len(r.ids) - len(r.turn_ids)
        r.spans.append(Span("action", start, len(r.ids), text))
        if r.glue is not None:
            r.messages.append({"role": "assistant", "content": text})
        else:
            r.r1_content += self._decode(r.turn_ids)
        r.turn_ids = []
        r.turn_index += 1

    def _finish(self, r: EpisodeState, reason: str, observation_shown: bool = True) -> None:
        if not getattr(r.env, "done", False):
            r.env.finish(reason, observation_shown=observation_shown)
        r.done = True

    # -- episodes in and out -----------------------------------------------------------------------
    def _start_row(self, index: int, env: Any, row: dict[str, Any]) -> EpisodeState:
        """Reset the environment for `row`, render the prompt and hand the environment this loop's meter."""
        messages = [dict(m) for m in env.reset(row)]
        tools = list(getattr(env, "tools", []) or [])
        ids = prompt_ids(self.tokenizer, messages, tools)
        protocol = getattr(getattr(env, "config", None), "protocol", "chat")
        state = EpisodeState(
            index=index,
            env=env,
            row=row,
            messages=messages,
            ids=list(ids),
            mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            spans=[Span("prompt", 0, len(ids), "")],
            prompt_length=len(ids),
            glue=self._glue_for(tools) if protocol == "chat" else None,
        )
        state.meter = _RowMeter(state, self.tokenizer)
        if hasattr(env, "meter"):
            env.meter = state.meter  # the environment's budget counts what this loop counts
        return state

    def _glue_for(self, tools: list[dict] | None) -> ToolGlue:
        key = tools_key(tools)
        if key not in self._glues:
            self._glues[key] = ToolGlue(self.tokenizer, tools)
        return self._glues[key]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _trajectory(self, r: EpisodeState, sampling: Sampling) -> Trajectory:
        env = r.env
        messages = list(r.messages)
        if r.glue is None and r.turn_index:
            messages.append({"role": "assistant", "content": r.r1_content})
        return Trajectory(
            id=f"{r.row.get('id', r.index)}#{r.index}",
            question_id=str(r.row.get("id", r.index)),
            question=str(r.row.get("question", "")),
            golds=list(r.row.get("golds", []) or []),
            input_ids=list(r.ids),
            action_mask=list(r.mask),
            logprobs=list(r.logprobs),
            prompt_length=r.prompt_length,
            spans=list(r.spans),
            messages=messages,
            tool_calls=list(getattr(env, "records", []) or []),
            observations=list(r.observations),
            retrieved=dict(getattr(env, "retrieved", {}) or {}),
            answer=getattr(env, "answer", None),
            citations=list(getattr(env, "citations", []) or []),
            final_text=str(getattr(env, "final_text", "") or ""),
            num_turns=r.turn_index,
            termination=str(getattr(env, "termination", None) or "no_answer"),
            metadata={
                "temperature": sampling.temperature,
                "top_p": sampling.top_p,
                "top_k": sampling.top_k,
                "seed": sampling.seed,
                "protocol": "chat" if r.glue is not None else "search_r1",
                "tools": list(getattr(env, "tools", []) or []),
                "injection_attempts": int(getattr(env, "injection_attempts", 0) or 0),
                # Recorded only where they say something: whom the episode acted for, and the tools it
                # offered when there were more than search (the prompt's schema may be left out).
                **({"principal": env.principal} if getattr(env, "principal", None) else {}),
                **_offered_tools(env),
                **({"error": r.error} if r.error else {}),
                **_cited_labels(env),
            },
        )
