"""Batched multi-turn generation with tool pauses over one KV cache (the HF backend).

What: `HFGenerator.rollout(envs, rows)` runs one episode per row. All rows decode together; a row that
ends a turn (EOS, or a stop string of its environment) pauses; all rows that paused at the same step go
to `step_batch` together (one batched search); each row's observation tokens, with exactly the chat
template's glue, are appended to the SAME KV cache by one batched forward over just the new tokens of
just those rows. The history is never prefilled again, and finished rows leave the batch.

Why this shape: TRL's tool loop re-prefills prompt + history on every tool turn and runs tools one row at
a time; for a search agent with several searches per episode that is most of the rollout cost.

How the cache stays correct with rows that grow by different amounts: the cache is one tensor per layer,
`(rows, kv_heads, columns, head_dim)`. When only some rows receive observation tokens, the other rows
get the same number of padding columns, masked out by the 2-D attention mask. Position ids are counted
per row (real tokens only), and keys are cached after RoPE, so padding in the middle of a row changes
nothing; `_KVBatch.compact` squeezes padding out when it piles up. Identical prompts (a GRPO group's
copies) are prefilled once and share their cache rows, and cache layers grow in place with spare room
instead of concatenating the whole cache on every token.

Failures: a policy's bad tool call is an observation (the environment's job). If the environment itself
raises, only the rows that paused at that step end, with termination "error" and the exception in
`Trajectory.metadata["error"]`; the other rows go on.

Sampling and the recorded logprob (the definition PPO must reproduce, see `sampling_log_probs`):
`logits / temperature`, then top-k, then top-p (nucleus over the tempered distribution) set the removed
tokens to -inf, then `log_softmax`. The token is drawn from that distribution with a seeded
`torch.Generator`, and its log-probability under it is recorded. `temperature=0` means greedy; the
recorded logprob is then the plain `log_softmax(logits)` of the argmax token.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, Protocol

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from searchrl.common.trajectory import Span, Trajectory
from searchrl.env.environment import step_batch
from searchrl.rollout.chat import ToolGlue, inline_observation_ids, prompt_ids, tools_key
from searchrl.rollout.stats import rollout_stats


@dataclass
class GenerationConfig:
    """Sampling and length limits of a rollout."""

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

    def validate(self) -> None:
        if self.temperature < 0:
            raise ValueError(f"temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0.0 < self.top_p <= 1.0:
            raise ValueError(f"top_p={self.top_p} must be in (0, 1]")
        if self.top_k < 0:
            raise ValueError(f"top_k={self.top_k} must be >= 0 (0 disables top-k)")
        if self.max_new_tokens_per_turn < 1 or self.max_episode_tokens < 1:
            raise ValueError("max_new_tokens_per_turn and max_episode_tokens must be >= 1")


def sampling_log_probs(
    logits: torch.Tensor, temperature: float, top_k: int = 0, top_p: float = 1.0
) -> torch.Tensor:
    """Log-probabilities of the sampling distribution for `logits` (`(..., vocab)`), as the rollout samples.

    Temperature first, then top-k, then top-p; filtered tokens get -inf. Temperature 0 (greedy) is
    scored as temperature 1 without filtering.
    """
    logits = logits.float()
    if temperature == 0:
        return torch.log_softmax(logits, dim=-1)
    scaled = logits / temperature
    if top_k and top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, top_k, dim=-1).values[..., -1:]
        scaled = scaled.masked_fill(scaled < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Remove a token when the mass before it already reaches top_p (the first token always stays).
        remove_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scaled = scaled.masked_fill(remove, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


class TokenForcing(Protocol):
    """Teacher forcing hook: return a token id to emit instead of sampling, or None to sample.

    The forced token's logprob is still recorded under the sampling distribution, so a forced rollout
    is exactly what a policy that happened to sample those tokens would have produced.
    """

    def __call__(self, row: int, turn: int, position: int) -> int | None: ...


class ScriptedPolicy:
    """Forces a scripted sequence of turns per row (tests, benchmarks, expert demonstrations).

    `turns[row][t]` is the text of turn `t` of that row; for the chat protocol each turn is followed by
    EOS, for stop-string protocols (Search-R1) the turn ends where its text ends. After the script runs
    out, the model samples freely. Use it without top-k/top-p filtering: a forced token outside the
    kept set has logprob -inf under the sampling distribution.
    """

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, turns: Sequence[Sequence[str]], append_eos: bool = True
    ) -> None:
        eos = [int(tokenizer.eos_token_id)] if append_eos else []
        self.turn_ids = [
            [[int(i) for i in tokenizer.encode(text, add_special_tokens=False)] + eos for text in row_turns]
            for row_turns in turns
        ]

    def __call__(self, row: int, turn: int, position: int) -> int | None:
        if row >= len(self.turn_ids) or turn >= len(self.turn_ids[row]):
            return None
        ids = self.turn_ids[row][turn]
        return ids[position] if position < len(ids) else None


@dataclass
class RolloutBatch:
    """What one rollout call produced: the trajectories and the batch metrics."""

    trajectories: list[Trajectory]
    stats: dict[str, float]


@dataclass
class EpisodeState:
    """One episode's state while its batch decodes (tokens, mask, logprobs, turn and budget counts); every
    engine's loop (HFGenerator, VLLMGenerator) keeps one per row."""

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

    @property
    def episode_tokens(self) -> int:
        return len(self.ids) - self.prompt_length


class _GrowingLayer(DynamicLayer):
    """A DynamicLayer whose buffers grow by a margin, so a decode step writes in place.

    The stock layer concatenates the whole cache on every token (a full copy per step and layer);
    here `keys`/`values` are views into buffers with spare room, re-allocated only when full.
    """

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
            self.set(key_states[:, :, :0], value_states[:, :, :0])
        used, new = self.keys.shape[-2], key_states.shape[-2]
        if used + new > self._key_buf.shape[-2]:
            self._reserve(used + new + max(64, (used + new) // 2))
        self._key_buf[:, :, used : used + new] = key_states
        self._value_buf[:, :, used : used + new] = value_states
        self.keys = self._key_buf[:, :, : used + new]
        self.values = self._value_buf[:, :, : used + new]
        return self.keys, self.values

    def _reserve(self, capacity: int) -> None:
        used = self.keys.shape[-2]
        shape = (*self.keys.shape[:2], capacity, self.keys.shape[3])
        key_buf, value_buf = self.keys.new_empty(shape), self.values.new_empty(shape)
        key_buf[:, :, :used] = self.keys
        value_buf[:, :, :used] = self.values
        self._key_buf, self._value_buf = key_buf, value_buf
        self.keys, self.values = key_buf[:, :, :used], value_buf[:, :, :used]

    def set(self, keys: torch.Tensor, values: torch.Tensor) -> None:
        """Replace the content (after selecting rows or squeezing padding); grows on the next update."""
        self.keys, self.values = keys, values
        self._key_buf, self._value_buf = keys, values
        self.is_initialized = True


def _set_kv(layer: DynamicLayer, keys: torch.Tensor, values: torch.Tensor) -> None:
    if isinstance(layer, _GrowingLayer):
        layer.set(keys, values)
    else:
        layer.keys, layer.values = keys, values


class _KVBatch:
    """The live rows' KV cache, attention mask and next position ids; counts tokens run through the model."""

    def __init__(self, model: PreTrainedModel, pad_id: int, share_prompts: bool = True) -> None:
        self.model = model
        self.pad_id = pad_id
        self.share_prompts = share_prompts
        self.cache: DynamicCache | None = None
        self.attn = torch.zeros(0, 0, dtype=torch.long)
        self.next_pos = torch.zeros(0, dtype=torch.long)
        self.tokens_run = 0  # every position a forward pass computed, padding included
        self.real_tokens_run = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _forward(
        self,
        ids: torch.Tensor,
        attn_new: torch.Tensor,
        cache: DynamicCache,
        attn_past: torch.Tensor,
        pos0: torch.Tensor,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Run `ids` (rows, n) after `cache`; returns (last-position logits, full attention mask)."""
        positions = pos0[:, None] + attn_new.cumsum(dim=1) - 1
        positions = positions.clamp(min=0)
        attn = torch.cat([attn_past, attn_new], dim=1)
        out = self.model(
            input_ids=ids.to(self.device),
            attention_mask=attn.to(self.device),
            position_ids=positions.to(self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,  # only the last position's logits are used: skip the LM head elsewhere
        )
        self.tokens_run += ids.numel()
        self.real_tokens_run += int(attn_new.sum())
        return out.logits[:, -1, :].float(), attn

    @staticmethod
    def _left_pad(chunks: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
        width = max(len(c) for c in chunks)
        ids = torch.full((len(chunks), width), pad_id, dtype=torch.long)
        attn = torch.zeros((len(chunks), width), dtype=torch.long)
        for r, chunk in enumerate(chunks):
            if chunk:
                ids[r, width - len(chunk) :] = torch.tensor(chunk, dtype=torch.long)
                attn[r, width - len(chunk) :] = 1
        return ids, attn

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        """Run the prompts; identical prompts (GRPO-style groups) are computed once and shared."""
        unique: dict[tuple[int, ...], int] = {}
        # Without sharing, the row index makes every key distinct.
        owner = [
            unique.setdefault(tuple(p) if self.share_prompts else (i, *p), len(unique))
            for i, p in enumerate(prompts)
        ]
        ids, attn_new = self._left_pad(
            [list(p[0 if self.share_prompts else 1 :]) for p in unique], self.pad_id
        )
        self.cache = DynamicCache(config=self.model.config)
        if all(type(layer) is DynamicLayer for layer in self.cache.layers):
            self.cache.layers = [_GrowingLayer() for _ in self.cache.layers]
        empty = torch.zeros((len(unique), 0), dtype=torch.long)
        logits, attn = self._forward(
            ids, attn_new, self.cache, empty, torch.zeros(len(unique), dtype=torch.long)
        )
        if len(unique) < len(prompts):
            index = torch.tensor(owner, dtype=torch.long)
            dev_index = index.to(self.device)
            for layer in self.cache.layers:
                _set_kv(layer, layer.keys[dev_index], layer.values[dev_index])
            logits, attn, attn_new = logits[dev_index], attn[index], attn_new[index]
        self.attn = attn
        self.next_pos = attn_new.sum(dim=1)
        return logits

    def append_all(self, tokens: list[int]) -> torch.Tensor:
        """One new token for every live row (the decode step)."""
        ids = torch.tensor(tokens, dtype=torch.long)[:, None]
        attn_new = torch.ones_like(ids)
        logits, self.attn = self._forward(ids, attn_new, self.cache, self.attn, self.next_pos)
        self.next_pos = self.next_pos + 1
        return logits

    def append_some(self, rows: list[int], chunks: list[list[int]]) -> torch.Tensor:
        """Append `chunks[i]` to live row `rows[i]` with one forward over those rows only.

        The other rows get the same number of (masked) padding columns so the cache stays rectangular.
        """
        assert self.cache is not None
        index = torch.tensor(rows, dtype=torch.long)
        dev_index = index.to(self.device)
        ids, attn_new = self._left_pad(chunks, self.pad_id)
        sub = DynamicCache(
            ddp_cache_data=[(layer.keys[dev_index], layer.values[dev_index]) for layer in self.cache.layers],
            config=self.model.config,
        )
        logits, _ = self._forward(ids, attn_new, sub, self.attn[index], self.next_pos[index])
        width = ids.shape[1]
        for full, part in zip(self.cache.layers, sub.layers, strict=True):
            new_keys = full.keys.new_zeros(full.keys.shape[0], full.keys.shape[1], width, full.keys.shape[3])
            new_values = torch.zeros_like(new_keys)
            new_keys[dev_index] = part.keys[:, :, -width:]
            new_values[dev_index] = part.values[:, :, -width:]
            full.update(new_keys, new_values)
        pad_cols = torch.zeros((self.attn.shape[0], width), dtype=torch.long)
        pad_cols[index] = attn_new
        self.attn = torch.cat([self.attn, pad_cols], dim=1)
        self.next_pos[index] += attn_new.sum(dim=1)
        return logits

    def select(self, keep: list[int]) -> None:
        """Drop finished rows: keep only live rows `keep` (their order is the new order)."""
        index = torch.tensor(keep, dtype=torch.long)
        dev_index = index.to(self.device)
        for layer in self.cache.layers:
            _set_kv(layer, layer.keys[dev_index], layer.values[dev_index])
        self.attn = self.attn[index]
        self.next_pos = self.next_pos[index]
        # Columns that are padding in every remaining row are dead weight.
        self.compact(force=False)

    def pad_fraction(self) -> float:
        return 1.0 - float(self.attn.sum()) / max(1, self.attn.numel())

    def compact(self, force: bool = False, threshold: float = 0.5) -> None:
        """Squeeze padding out of the cache: each row's real columns move right, in order.

        Keys already carry their rotary positions, so moving a column changes no attention score.
        """
        if self.attn.numel() == 0 or (not force and self.pad_fraction() <= threshold):
            return
        lengths = self.attn.sum(dim=1)
        width = int(lengths.max())
        # Stable sort puts padding (0) before real columns (1) and keeps real columns in order.
        order = torch.sort(self.attn, dim=1, stable=True).indices[:, -width:]
        dev_order = order.to(self.device)
        for layer in self.cache.layers:
            gather = dev_order[:, None, :, None].expand(-1, layer.keys.shape[1], -1, layer.keys.shape[3])
            _set_kv(layer, torch.gather(layer.keys, 2, gather), torch.gather(layer.values, 2, gather))
        self.attn = torch.gather(self.attn, 1, order)


def _cited_labels(env: Any) -> dict[str, list[str]]:
    """The bracketed labels as the policy wrote them, when they are not the document ids (numbered sources)."""
    labels = list(getattr(env, "cited_labels", []) or [])
    return {"cited_labels": labels} if labels and labels != list(getattr(env, "citations", []) or []) else {}


def _sync_token_count(env: Any, tokens: int) -> None:
    # SearchEnvironment counts tokens by re-tokenising text; the rollout knows the exact count.
    if hasattr(env, "tokens_used"):
        env.tokens_used = int(tokens)


class _ReplayKV:
    """Stands in for `_KVBatch` when there is no model: every token is forced, so nothing is computed.

    The rollout loop, and with it every id, mask, span and message of the trajectory, stays the same as
    with a model; only the recorded logprobs are meaningless (uniform). Used for expert demonstrations,
    where running the model over forced tokens would only cost time.
    """

    def __init__(self, vocab_size: int) -> None:
        self.vocab_size = vocab_size
        self.rows = 0
        self.tokens_run = 0
        self.real_tokens_run = 0

    def _logits(self, n: int) -> torch.Tensor:
        return torch.zeros(n, self.vocab_size)

    def prefill(self, prompts: list[list[int]]) -> torch.Tensor:
        self.rows = len(prompts)
        return self._logits(self.rows)

    def append_all(self, tokens: list[int]) -> torch.Tensor:
        return self._logits(len(tokens))

    def append_some(self, rows: list[int], chunks: list[list[int]]) -> torch.Tensor:
        return self._logits(len(rows))

    def select(self, keep: list[int]) -> None:
        self.rows = len(keep)

    def compact(self, force: bool = False, threshold: float = 0.5) -> None:
        return None


class HFGenerator:
    """Multi-turn rollouts of a Hugging Face causal LM against `SearchEnvironment`s (see module docstring).

    With `model=None` and a `forcing` hook that forces every token, it replays scripted episodes through
    the same loop without running any model (expert demonstrations); logprobs are then not meaningful.
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        config: GenerationConfig | None = None,
        forcing: TokenForcing | None = None,
        step_batch: Callable[[list[Any], list[str]], list[Any]] | None = None,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.config = config or GenerationConfig()
        self.config.validate()
        self.forcing = forcing
        self._step_batch = step_batch
        if tokenizer.pad_token_id is None or tokenizer.pad_token_id == tokenizer.eos_token_id:
            raise ValueError("the tokenizer needs a pad token distinct from EOS (Qwen2.5: <|endoftext|>)")
        self.eos_id = int(tokenizer.eos_token_id)
        self.pad_id = int(tokenizer.pad_token_id)
        self._glues: dict[str, ToolGlue] = {}

    # -- helpers -------------------------------------------------------------------------------
    def _step(self, envs: list[Any], texts: list[str]) -> list[Any]:
        if self._step_batch is not None:
            return self._step_batch(envs, texts)
        return step_batch(envs, texts)

    def _safe_step(self, ended: list[tuple[EpisodeState, str]]) -> list[Any]:
        """`step_batch` for the paused rows; if the environment raises, those rows get None (-> "error").

        A policy's bad call is an observation inside the environment; this only catches the
        environment's own bugs, so one broken episode cannot crash the whole batch."""
        try:
            return self._step([r.env for r, _ in ended], [text for _, text in ended])
        except Exception as exc:  # noqa: BLE001 - any environment failure must end only these episodes
            for r, _ in ended:
                r.error = f"{type(exc).__name__}: {exc}"
            return [None] * len(ended)

    def _glue_for(self, tools: list[dict] | None) -> ToolGlue:
        key = tools_key(tools)
        if key not in self._glues:
            self._glues[key] = ToolGlue(self.tokenizer, tools)
        return self._glues[key]

    def _decode(self, ids: list[int]) -> str:
        return self.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)

    def _choose(
        self, logits: torch.Tensor, rows: list[EpisodeState], gen: torch.Generator
    ) -> tuple[list[int], list[float]]:
        cfg = self.config
        logp = sampling_log_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        if self.model is None:
            # A model-free replay forces every token: drawing samples to overwrite them was 37% of the
            # expert's demonstration time (profiled on the demo).
            tokens = [-1] * len(rows)
        elif cfg.temperature == 0:
            tokens = logp.argmax(dim=-1).tolist()
        else:
            tokens = torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1).tolist()
        if self.forcing is not None:
            for i, r in enumerate(rows):
                forced = self.forcing(r.index, r.turn_index, len(r.turn_ids))
                if forced is not None:
                    tokens[i] = int(forced)
                elif self.model is None:
                    raise ValueError(
                        f"row {r.index}, turn {r.turn_index}: a model-free replay needs every token forced, "
                        "but the forcing hook returned None; pass a model to sample the rest"
                    )
        elif self.model is None:
            raise ValueError("HFGenerator(model=None) replays forced tokens only: pass a forcing hook")
        chosen = torch.tensor(tokens, dtype=torch.long)
        return tokens, logp.gather(1, chosen[:, None]).squeeze(1).tolist()

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

    def _record_action(self, r: EpisodeState, text: str) -> None:
        start = len(r.ids) - len(r.turn_ids)
        r.spans.append(Span("action", start, len(r.ids), text))
        if r.glue is not None:
            r.messages.append({"role": "assistant", "content": text})
        else:
            r.r1_content += self._decode(r.turn_ids)
        r.turn_ids = []
        r.turn_index += 1

    def _finish(self, r: EpisodeState, reason: str) -> None:
        if not getattr(r.env, "done", False):
            r.env.finish(reason)
        r.done = True

    def _insert(self, r: EpisodeState, result: Any) -> list[int]:
        """Observation tokens for a step result (glue included), or [] when the budget forbids them."""
        if r.glue is not None:
            ids = r.glue.suffix_ids(list(result.tool_messages))
            text = "\n\n".join(str(m.get("content", "")) for m in result.tool_messages)
        else:
            text = str(result.inline_observation or "")
            ids = inline_observation_ids(self.tokenizer, text)
        if not ids:
            return []
        if r.episode_tokens + len(ids) >= self.config.max_episode_tokens:
            return []
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
        return ids

    # -- the loop --------------------------------------------------------------------------------
    def rollout(self, envs: list[Any], rows: list[dict[str, Any]]) -> RolloutBatch:
        """Run one episode per (environment, row) pair, all rows in one batch."""
        if len(envs) != len(rows):
            raise ValueError(
                f"rollout needs one environment per row: got {len(envs)} envs and {len(rows)} rows"
            )
        if not rows:
            return RolloutBatch([], rollout_stats([], wall_s=0.0))
        started = time.perf_counter()
        gen = torch.Generator().manual_seed(self.config.seed)
        states = [self._start_row(i, env, row) for i, (env, row) in enumerate(zip(envs, rows, strict=True))]
        kv: _KVBatch | _ReplayKV
        if self.model is None:
            kv = _ReplayKV(len(self.tokenizer))
        else:
            kv = _KVBatch(self.model, self.pad_id, share_prompts=self.config.share_prompt_prefill)
        search_s = 0.0
        was_training = self.model is not None and self.model.training
        if self.model is not None:
            self.model.eval()
        with torch.inference_mode():
            live = list(states)
            logits = kv.prefill([r.ids for r in live])
            while live:
                tokens, logps = self._choose(logits, live, gen)
                ended: list[tuple[EpisodeState, str]] = []
                for r, tok, lp in zip(live, tokens, logps, strict=True):
                    r.ids.append(tok)
                    r.mask.append(1)
                    r.logprobs.append(lp)
                    r.turn_ids.append(tok)
                    is_end, text = self._turn_end(r, tok)
                    if is_end:
                        ended.append((r, text))
                    elif len(r.turn_ids) >= self.config.max_new_tokens_per_turn or (
                        r.episode_tokens >= self.config.max_episode_tokens
                    ):
                        self._record_action(r, self._decode(r.turn_ids))
                        self._finish(r, "token_budget")
                inserts: dict[int, list[int]] = {}
                if ended:
                    seconds, inserts = self._step_ended(ended)
                    search_s += seconds
                logits = self._advance(kv, live, tokens, inserts)
                live = [r for r in live if not r.done]
        if was_training:
            self.model.train()
        wall = time.perf_counter() - started
        trajectories = [self._trajectory(r) for r in states]
        stats = rollout_stats(
            trajectories,
            wall_s=wall,
            search_s=search_s,
            model_tokens=kv.tokens_run,
            model_real_tokens=kv.real_tokens_run,
        )
        return RolloutBatch(trajectories, stats)

    def _step_ended(self, ended: list[tuple[EpisodeState, str]]) -> tuple[float, dict[int, list[int]]]:
        """One batched environment step for every row whose turn ended (every engine's loop calls it).

        Records each action; a row whose environment failed ends with "error" (the others go on), a
        finished one is done, one whose observation does not fit ends with "token_budget". Returns the
        step's seconds and the observation ids inserted per row index (the KV cache feeds them next).
        """
        for r, _ in ended:
            # The environment's budget starts from the exact count before this turn; it adds its own
            # estimate of the turn and observation on top.
            _sync_token_count(r.env, r.episode_tokens - len(r.turn_ids))
        t0 = time.perf_counter()
        results = self._safe_step(ended)
        seconds = time.perf_counter() - t0
        inserts: dict[int, list[int]] = {}
        for (r, text), res in zip(ended, results, strict=True):
            self._record_action(r, text)
            if res is None:  # the environment itself failed: only this row ends
                self._finish(r, "error")
                continue
            if res.done:
                r.done = True
                continue
            ids = self._insert(r, res)
            if ids:
                inserts[r.index] = ids
                _sync_token_count(r.env, r.episode_tokens)
            else:
                self._finish(r, "token_budget")
        return seconds, inserts

    def _advance(
        self,
        kv: _KVBatch | _ReplayKV,
        live: list[EpisodeState],
        tokens: list[int],
        inserts: dict[int, list[int]],
    ) -> torch.Tensor:
        """Feed this step's tokens of the rows still running; returns their next-token logits, in order."""
        keep = [i for i, r in enumerate(live) if not r.done]
        if not keep:
            return torch.empty(0)
        if len(keep) < len(live):
            kv.select(keep)
        running = [live[i] for i in keep]
        logits = kv.append_all([tokens[i] for i in keep])
        with_obs = [i for i, r in enumerate(running) if r.index in inserts]
        if with_obs:
            obs_logits = kv.append_some(with_obs, [inserts[running[i].index] for i in with_obs])
            logits = logits.clone()
            logits[torch.tensor(with_obs)] = obs_logits
        kv.compact(force=False, threshold=self.config.compact_pad_fraction)
        return logits

    def _start_row(self, index: int, env: Any, row: dict[str, Any]) -> EpisodeState:
        messages = [dict(m) for m in env.reset(row)]
        tools = list(getattr(env, "tools", []) or [])
        ids = prompt_ids(self.tokenizer, messages, tools)
        protocol = getattr(getattr(env, "config", None), "protocol", "chat")
        glue = self._glue_for(tools) if protocol == "chat" else None
        return EpisodeState(
            index=index,
            env=env,
            row=row,
            messages=messages,
            ids=list(ids),
            mask=[0] * len(ids),
            logprobs=[0.0] * len(ids),
            spans=[Span("prompt", 0, len(ids), "")],
            prompt_length=len(ids),
            glue=glue,
        )

    def _trajectory(self, r: EpisodeState) -> Trajectory:
        env = r.env
        messages = list(r.messages)
        if r.glue is None and r.turn_index:
            messages.append({"role": "assistant", "content": r.r1_content})
        cfg = self.config
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
                "temperature": cfg.temperature,
                "top_p": cfg.top_p,
                "top_k": cfg.top_k,
                "seed": cfg.seed,
                "protocol": "chat" if r.glue is not None else "search_r1",
                "tools": list(getattr(env, "tools", []) or []),
                "injection_attempts": int(getattr(env, "injection_attempts", 0) or 0),
                **({"error": r.error} if r.error else {}),
                **_cited_labels(env),
            },
        )
