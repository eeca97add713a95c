"""The Hugging Face engines of the turn loop: one batched KV cache, and model-free replay.

What: `HFGenerator(model, tokenizer, GenerationConfig(...)).rollout(envs, rows)` is `loop.TurnLoop` over
a `KVCacheEngine`: all rows decode together, one token per row and step; a row that ends a turn (EOS,
or a stop string of its environment) pauses, all rows that paused at the same step go to `step_batch`
together (one batched search), and each row's observation tokens, with exactly the chat template's glue,
are appended to the SAME KV cache by one batched forward over just the new tokens of just those rows.
The history is never prefilled again, and finished rows leave the batch. With `model=None` the engine is
`ReplayEngine`: every token forced, no model run (expert demonstrations).

Why this shape: TRL's tool loop re-prefills prompt + history on every tool turn and runs tools one row at
a time; for a search agent with several searches per episode that is most of the rollout cost.

How the cache stays correct with rows that grow by different amounts: the cache is one tensor per layer,
`(rows, kv_heads, columns, head_dim)`. When only some rows receive observation tokens, the other rows
get the same number of padding columns, masked out by the 2-D attention mask. Position ids are counted
per row (real tokens only), and keys are cached after RoPE, so padding in the middle of a row changes
nothing; `_KVBatch.compact` squeezes padding out when it piles up. Identical prompts (a GRPO group's
copies) are prefilled once and share their cache rows, and cache layers grow in place with spare room
instead of concatenating the whole cache on every token.

Sampling and the recorded logprob (the definition PPO must reproduce, see `sampling_log_probs`):
`logits / temperature`, then top-k, then top-p (nucleus over the tempered distribution) set the removed
tokens to -inf, then `log_softmax`. The token is drawn from that distribution with one seeded
`torch.Generator` per rollout, and its log-probability under it is recorded. `temperature=0` means
greedy; the recorded logprob is then the plain `log_softmax(logits)` of the argmax token.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase
from transformers.cache_utils import DynamicLayer

from searchrl.rollout.loop import (
    EngineUsage,
    GenerationConfig,
    RolloutBatch,
    TokenEngine,
    TokenForcing,
    TurnCompletion,
    TurnLoop,
    TurnParams,
)
from searchrl.rollout.sampling import Sampling


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
        # Stable: tied logits keep their index order, so which of them the nucleus keeps is the same on every
        # device and run, and the first most likely token is always among them (an unstable sort could put it
        # after 16 or more equal ones and cut it).
        sorted_logits, order = torch.sort(scaled, dim=-1, descending=True, stable=True)
        cumulative = torch.softmax(sorted_logits, dim=-1).cumsum(dim=-1)
        # Remove a token when the mass before it already reaches top_p (the first token always stays).
        remove_sorted = (cumulative - torch.softmax(sorted_logits, dim=-1)) >= top_p
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        scaled = scaled.masked_fill(remove, float("-inf"))
    return torch.log_softmax(scaled, dim=-1)


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


def _choose_tokens(logp: torch.Tensor, temperature: float, gen: torch.Generator | None) -> list[int]:
    if temperature == 0:
        return logp.argmax(dim=-1).tolist()
    return torch.multinomial(logp.exp(), 1, generator=gen).squeeze(1).tolist()


class KVCacheEngine:
    """`TokenEngine` over one batched KV cache of a Hugging Face causal LM; one engine per rollout.

    Each `generate` call answers one token per row. The first call prefills the prompts; every later
    call feeds what each row's sequence gained since (its last sampled token, plus an observation when
    its turn was stepped) and drops from the cache the rows no longer asked for (finished episodes). Rows
    are known by `TurnParams.row`. Tokens are drawn for all rows at once from one `torch.Generator`
    seeded with `sampling.seed`, so a rollout repeats for the same seed; `forcing` overrides the draw
    (its logprob is still the model's). `tokens_run` / `real_tokens_run` count the positions the model
    computed (padding included / real tokens only).
    """

    name = "hf"

    def __init__(
        self,
        model: PreTrainedModel,
        pad_id: int,
        config: GenerationConfig,
        sampling: Sampling,
        forcing: TokenForcing | None = None,
    ) -> None:
        self.kv = _KVBatch(model, pad_id, share_prompts=config.share_prompt_prefill)
        self.compact_pad_fraction = config.compact_pad_fraction
        self.sampling = sampling
        self.forcing = forcing
        self.gen = torch.Generator().manual_seed(sampling.seed)
        self._rows: list[int] = []  # the batch row of each cache row, in cache order
        self._fed: dict[int, int] = {}  # per batch row: how many of its tokens the cache holds

    @property
    def tokens_run(self) -> int:
        return self.kv.tokens_run

    @property
    def real_tokens_run(self) -> int:
        return self.kv.real_tokens_run

    def generate(self, prompts: Sequence[list[int]], params: Sequence[TurnParams]) -> list[TurnCompletion]:
        rows = [p.row for p in params]
        logits = self._feed(prompts, rows)
        s = self.sampling
        logp = sampling_log_probs(logits, s.temperature, s.top_k, s.top_p)
        tokens = _choose_tokens(logp, s.temperature, self.gen)
        if self.forcing is not None:
            for i, p in enumerate(params):
                forced = self.forcing(p.row, p.turn, p.position)
                if forced is not None:
                    tokens[i] = int(forced)
        chosen = torch.tensor(tokens, dtype=torch.long)
        logps = logp.gather(1, chosen[:, None]).squeeze(1).tolist()
        return [TurnCompletion([t], [lp]) for t, lp in zip(tokens, logps, strict=True)]

    def _feed(self, prompts: Sequence[list[int]], rows: list[int]) -> torch.Tensor:
        """Bring the cache up to date with `prompts`; returns each row's next-token logits, in order."""
        if self.kv.cache is None:
            logits = self.kv.prefill([list(p) for p in prompts])
        else:
            logits = self._append(prompts, rows)
        self._rows = rows
        self._fed = {row: len(p) for row, p in zip(rows, prompts, strict=True)}
        return logits

    def _append(self, prompts: Sequence[list[int]], rows: list[int]) -> torch.Tensor:
        where = {row: i for i, row in enumerate(self._rows)}
        missing = [row for row in rows if row not in where]
        if missing:
            raise ValueError(
                f"KVCacheEngine: rows {missing} were never prefilled (a new row needs a new engine)"
            )
        keep = [where[row] for row in rows]
        if keep != list(range(len(self._rows))):
            self.kv.select(keep)  # finished rows leave the cache
        new = [list(p[self._fed[row] :]) for p, row in zip(prompts, rows, strict=True)]
        if not all(new):
            raise ValueError("KVCacheEngine: every request must continue its row with at least one new token")
        logits = self.kv.append_all([n[0] for n in new])  # the token each row sampled last
        grown = [i for i, n in enumerate(new) if len(n) > 1]  # and the observations inserted after it
        if grown:
            obs_logits = self.kv.append_some(grown, [new[i][1:] for i in grown])
            logits = logits.clone()
            logits[torch.tensor(grown)] = obs_logits
        self.kv.compact(force=False, threshold=self.compact_pad_fraction)
        return logits

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError(
            "KVCacheEngine runs the policy itself: there are no separate weights to load"
        )


class ReplayEngine:
    """`TokenEngine` for model-free replay: every token is forced, nothing is computed.

    The loop, and with it every id, mask, span and message of the trajectory, stays the same as with a
    model; only the recorded logprobs are meaningless (those of uniform logits under the sampling
    filters). Used for expert demonstrations, where running the model over forced tokens would only cost
    time.
    """

    name = "replay"
    tokens_run = 0
    real_tokens_run = 0

    def __init__(self, vocab_size: int, sampling: Sampling, forcing: TokenForcing | None) -> None:
        if forcing is None:
            raise ValueError("HFGenerator(model=None) replays forced tokens only: pass a forcing hook")
        self.forcing = forcing
        # Uniform logits at every step: their sampling distribution is computed once.
        self._logp = sampling_log_probs(
            torch.zeros(1, vocab_size), sampling.temperature, sampling.top_k, sampling.top_p
        )[0]

    def generate(self, prompts: Sequence[list[int]], params: Sequence[TurnParams]) -> list[TurnCompletion]:
        answers = []
        for p in params:
            forced = self.forcing(p.row, p.turn, p.position)
            if forced is None:
                raise ValueError(
                    f"row {p.row}, turn {p.turn}: a model-free replay needs every token forced, "
                    "but the forcing hook returned None; pass a model to sample the rest"
                )
            answers.append(TurnCompletion([int(forced)], [float(self._logp[int(forced)])]))
        return answers

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        raise NotImplementedError("ReplayEngine has no model")


class HFGenerator(TurnLoop):
    """Multi-turn rollouts of a Hugging Face causal LM against `SearchEnvironment`s (see module docstring).

    Args:
        model: the policy; None replays forced tokens without running a model (`ReplayEngine`, which
            needs a `forcing` hook that forces every token; logprobs are then not meaningful).
        tokenizer: the policy's tokenizer (pad != EOS).
        config: sampling and length limits (`GenerationConfig`); `rollout(..., sampling)` may sample otherwise.
        forcing: a teacher-forcing hook (`ScriptedPolicy`, an expert), read at every rollout.
        step_batch: the batched environment step (default `searchrl.env.environment.step_batch`).
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        config: GenerationConfig | None = None,
        forcing: TokenForcing | None = None,
        step_batch: Callable[[list[Any], list[str]], list[Any]] | None = None,
    ) -> None:
        super().__init__(tokenizer, config, step_batch)
        self.model = model
        self.forcing = forcing

    def rollout(
        self, envs: list[Any], rows: list[dict[str, Any]], sampling: Sampling | None = None
    ) -> RolloutBatch:
        """Run one episode per (environment, row) pair, all rows in one batch, the model in eval mode."""
        was_training = self.model is not None and self.model.training
        if self.model is not None:
            self.model.eval()
        try:
            with torch.inference_mode():
                return super().rollout(envs, rows, sampling)
        finally:
            if was_training:
                self.model.train()

    def _engine(self, sampling: Sampling) -> TokenEngine:
        if self.model is None:
            return ReplayEngine(len(self.tokenizer), sampling, self.forcing)
        return KVCacheEngine(self.model, self.pad_id, self.config, sampling, self.forcing)

    def _model_tokens(self, engine: TokenEngine, usage: EngineUsage) -> tuple[int, int]:
        assert isinstance(engine, KVCacheEngine | ReplayEngine)
        return engine.tokens_run, engine.real_tokens_run
