"""Multi-turn rollouts on vLLM: the turn loop of `loop.TurnLoop` over a `VLLMEngine`.

What: `VLLMGenerator(policy, tokenizer, GenerationConfig(...)).rollout(envs, rows)` returns the
`RolloutBatch` that `HFGenerator.rollout` returns, but the tokens come from an inference engine that
holds its own copy of the weights. Token in, token out: every request is the row's whole history as
token ids (prompt, sampled tokens, inserted observation tokens), every answer is token ids with the
sampled token's logprob (`SamplingParams(logprobs=0)`); no text is re-tokenised.

How one batch runs (the loop is `HFGenerator`'s; only the engine answers whole turns):

1. All live rows are sent to the engine in one `generate` call. Each asks for at most the tokens its
   turn and episode budgets leave, and stops on EOS (and, for Search-R1, on its stop strings).
2. The loop reads each answer token by token with its one stopping rule: the turn ends exactly where
   `HFGenerator` ends it. The engine's stop is only an early exit: tokens it produced past our stop are
   dropped, and a row the engine stopped short (a stop it saw that we do not count) goes on in the next
   call.
3. All rows whose turn ended in this call go to `step_batch` together: one batched search per round.
4. Observation tokens (with exactly the chat template's glue) are appended to the row's ids with
   action mask 0; the next call re-submits the grown history. With prefix caching on
   (`enable_prefix_caching=True`) the engine finds the earlier blocks in its cache, so the history is
   not prefilled again; `rollout/prefix_cache_hit_rate` says how much was found.

Why an engine protocol (`loop.TokenEngine`): every vLLM call sits in `VLLMEngine`, so the loop runs on
CPU against `HFTokenEngine`, which answers the same requests with a Hugging Face model (real forward
passes, a real prefix cache of KV states). CPU tests compare its trajectories with `HFGenerator`'s token
for token.

Weights: the engine does not see the optimizer's updates. `sync_weights(model)` pushes the policy's
parameters into it the way TRL 1.16's vLLM colocate mode does
(`llm.llm_engine.model_executor.driver_worker.model_runner.model.load_weights(...)`, PEFT adapters
merged first, then `reset_prefix_cache()` since cached KV blocks belong to the old weights). The
trainer calls it after each update; as a safety net `rollout` also syncs when the parameters' version
counters moved since the last sync (an optimizer step or `load_state_dict` after a rollback).
"""

from __future__ import annotations

import contextlib
import copy
import importlib.util
import os
import socket
import tempfile
from collections import OrderedDict
from collections.abc import Callable, Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from transformers import DynamicCache, PreTrainedModel, PreTrainedTokenizerBase

from searchrl.common.config import ConfigError
from searchrl.models.io import save_model_dir
from searchrl.rollout.generator import sampling_log_probs
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

# -------------------------------------------------------------------------------------------------
# Availability and weights
# -------------------------------------------------------------------------------------------------


def check_vllm_available() -> None:
    """Raise `ConfigError` saying how to fix it when vLLM cannot run here (not installed, or no CUDA)."""
    if importlib.util.find_spec("vllm") is None:
        raise ConfigError(
            'rollout_backend="vllm" needs the vllm package, which is not installed in this environment. '
            "Install a vllm build that matches your torch and CUDA on a GPU machine (benchmarks/gpu/"
            "requirements-vllm.txt pins vllm 0.24.0: torch==2.11.0, built for CUDA 13), or set "
            'rollout_backend: "hf".'
        )
    if not torch.cuda.is_available():
        raise ConfigError(
            'rollout_backend="vllm" needs a CUDA GPU, but torch.cuda.is_available() is False here '
            f"(torch {torch.__version__}). Run on a GPU machine with a CUDA build of torch, or set "
            'rollout_backend: "hf" (the CPU-capable engine).'
        )


def weights_version(model: torch.nn.Module) -> int:
    """Sum of the parameters' autograd version counters: changes whenever a parameter is written in place.

    Optimizer steps and `load_state_dict` bump it; a write through `param.data` does not (call
    `sync_weights` yourself after such a write).
    """
    return sum(p._version for p in model.parameters())


@contextlib.contextmanager
def policy_weights(model: torch.nn.Module) -> Iterator[Iterator[tuple[str, torch.Tensor]]]:
    """The policy's weights under the names of its base architecture, for an engine's `load_weights`.

    A PEFT model has its adapter merged into the base weights while the context is open (names lose
    `base_model.model.` and `.base_layer`, LoRA tensors are skipped), exactly TRL 1.16's
    `VLLMGeneration._iter_named_params`; it is unmerged when the context closes, so consume the
    iterator inside it.
    """
    is_peft = hasattr(model, "merge_adapter") and hasattr(model, "peft_config")
    if not is_peft:
        yield ((name, p.detach()) for name, p in model.named_parameters())
        return
    prefix = str(getattr(model, "prefix", "lora_"))
    model.merge_adapter()
    try:

        def merged() -> Iterator[tuple[str, torch.Tensor]]:
            for name, p in model.named_parameters():
                name = name.removeprefix("base_model.model.").replace(".base_layer", "")
                if prefix in name or "original_module" in name:
                    continue  # adapter tensors are merged already; vLLM has no such parameters
                yield name.replace("modules_to_save.default.", ""), p.detach()

        yield merged()
    finally:
        model.unmerge_adapter()


# -------------------------------------------------------------------------------------------------
# CPU reference engine
# -------------------------------------------------------------------------------------------------


class HFTokenEngine:
    """Answers `TokenEngine` requests with a Hugging Face causal LM, one row at a time, on any device.

    It samples exactly as `HFGenerator` does (`sampling_log_probs`: temperature, top-k, top-p; greedy at
    temperature 0; a seeded `torch.Generator` per request) and keeps a prefix cache of KV states: a
    request whose prompt extends an earlier request's prompt and output reuses that KV and computes only
    the new tokens (`cached_tokens` counts the reused ones), as vLLM's prefix caching does by blocks.
    With `forcing` (e.g. a `ScriptedPolicy`) the token at `(row, turn, position)` is forced instead of
    sampled, with its logprob still the model's: the CPU tests drive it and `HFGenerator` with the same
    script and compare the trajectories.
    """

    name = "hf"

    def __init__(
        self,
        model: PreTrainedModel,
        tokenizer: PreTrainedTokenizerBase,
        forcing: TokenForcing | None = None,
        cache_entries: int = 256,
    ) -> None:
        self.model = model
        self.tokenizer = tokenizer
        self.forcing = forcing
        self.cache_entries = cache_entries
        self._prefix_cache: OrderedDict[tuple[int, ...], DynamicCache] = OrderedDict()
        self.requests: list[tuple[list[int], TurnParams]] = []  # every request seen (tests read it)
        self.loads = 0

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def _lookup(self, prompt: list[int]) -> tuple[int, DynamicCache | None]:
        """Longest cached prefix of `prompt` (at most len(prompt) - 1 tokens: the last must be fed)."""
        best, best_key = 0, None
        for key in self._prefix_cache:
            n = len(key)
            if best < n < len(prompt) and tuple(prompt[:n]) == key:
                best, best_key = n, key
        if best_key is None:
            return 0, None
        self._prefix_cache.move_to_end(best_key)
        return best, copy.deepcopy(self._prefix_cache[best_key])

    def _store(self, fed: list[int], cache: DynamicCache) -> None:
        self._prefix_cache[tuple(fed)] = cache
        while len(self._prefix_cache) > self.cache_entries:
            self._prefix_cache.popitem(last=False)

    def _feed(self, ids: list[int], cache: DynamicCache) -> torch.Tensor:
        out = self.model(
            input_ids=torch.tensor([ids], device=self.device),
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1, :].float().cpu()

    def _stops(self, generated: list[int], p: TurnParams) -> bool:
        if generated[-1] in p.stop_token_ids:
            return True
        if p.stop:
            text = self.tokenizer.decode(generated, skip_special_tokens=False)
            return any(s in text for s in p.stop)
        return False

    @torch.inference_mode()
    def generate(self, prompts: Sequence[list[int]], params: Sequence[TurnParams]) -> list[TurnCompletion]:
        if len(prompts) != len(params):
            raise ValueError(f"generate needs one TurnParams per prompt: {len(prompts)} vs {len(params)}")
        was_training = self.model.training
        self.model.eval()
        results = []
        try:
            for prompt, p in zip(prompts, params, strict=True):
                self.requests.append((list(prompt), p))
                results.append(self._one(list(prompt), p))
        finally:
            if was_training:
                self.model.train()
        return results

    def _one(self, prompt: list[int], p: TurnParams) -> TurnCompletion:
        if not prompt:
            raise ValueError("a request needs at least one prompt token")
        cached, cache = self._lookup(prompt)
        cache = cache if cache is not None else DynamicCache(config=self.model.config)
        logits = self._feed(prompt[cached:], cache)
        gen = torch.Generator().manual_seed(p.seed)
        tokens: list[int] = []
        logps: list[float] = []
        finish = "length"
        for i in range(p.max_tokens):
            logp = sampling_log_probs(logits, p.temperature, p.top_k, p.top_p)[0]
            if p.temperature == 0:
                token = int(logp.argmax())
            else:
                token = int(torch.multinomial(logp.exp(), 1, generator=gen))
            forced = self.forcing(p.row, p.turn, p.position + i) if self.forcing is not None else None
            if forced is not None:
                token = int(forced)
            tokens.append(token)
            logps.append(float(logp[token]))
            if self._stops(tokens, p):
                finish = "stop"
                break
            if i + 1 < p.max_tokens:
                logits = self._feed([token], cache)
        # The KV now holds the prompt and every token but the last (never fed): the next request of
        # this row (its history grown by those tokens and an observation) starts from there.
        self._store(prompt + tokens[:-1], cache)
        return TurnCompletion(tokens, logps, cached_tokens=cached, finish_reason=finish)

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        params = dict(self.model.named_parameters())
        with torch.no_grad():
            for name, tensor in weights:
                if name not in params:
                    raise KeyError(f"load_weights: the engine's model has no parameter {name!r}")
                params[name].copy_(tensor.to(params[name].device, params[name].dtype))
        self._prefix_cache.clear()  # KV computed with the old weights is stale
        self.loads += 1


# -------------------------------------------------------------------------------------------------
# The vLLM engine (GPU only)
# -------------------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _external_launcher_env() -> None:
    # vLLM's "external_launcher" executor runs the engine in this process (so its model is reachable
    # for load_weights, as in TRL's colocate mode) and rendezvous through torch.distributed's env://.
    # Under torchrun/accelerate these are set already; a single process gets a world of one.
    os.environ.setdefault("RANK", "0")
    os.environ.setdefault("LOCAL_RANK", "0")
    os.environ.setdefault("WORLD_SIZE", "1")
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", str(_free_port()))


def _load_weights_on_worker(worker: Any, weights: list[tuple[str, torch.Tensor]]) -> None:
    # collective_rpc target when the engine runs in another process (needs
    # VLLM_ALLOW_INSECURE_SERIALIZATION=1 to send a function); weights travel as CPU tensors.
    worker.model_runner.model.load_weights(weights)


class VLLMEngine:
    """`TokenEngine` over `vllm.LLM` in this process (TRL's colocate mode); needs vLLM and a CUDA GPU.

    The `LLM` is created with `enable_prefix_caching`, `logprobs_mode="processed_logprobs"` (the logprob
    of the sampled token under the tempered, top-k/top-p filtered distribution, which is the rollout
    logprob `sampling_log_probs` defines), `distributed_executor_backend="external_launcher"` and, unless
    `llm_kwargs` says otherwise, `max_num_batched_tokens=4096`: TRL 1.16's colocate settings (TRL caps the
    batched tokens because vLLM V1's memory profiler, sized for the default cap, may find too little
    memory beside the trainer). Written against vLLM 0.24's API; never run here for lack of a GPU.
    """

    name = "vllm"

    def __init__(
        self,
        model_dir: str | Path,
        *,
        gpu_memory_utilization: float = 0.3,
        enable_prefix_caching: bool = True,
        max_model_len: int | None = None,
        dtype: str = "auto",
        seed: int = 0,
        enforce_eager: bool = False,
        **llm_kwargs: Any,
    ) -> None:
        check_vllm_available()
        _external_launcher_env()
        from vllm import LLM

        llm_kwargs.setdefault("max_num_batched_tokens", 4096)

        self.llm = LLM(
            model=str(model_dir),
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            max_model_len=max_model_len,
            dtype=dtype,
            seed=seed,
            enforce_eager=enforce_eager,
            distributed_executor_backend="external_launcher",
            logprobs_mode="processed_logprobs",
            **llm_kwargs,
        )
        self.max_model_len = int(self.llm.llm_engine.model_config.max_model_len)

    @classmethod
    def from_model(
        cls, model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, **kwargs: Any
    ) -> VLLMEngine:
        """Start vLLM on a copy of `model` (written to a temporary folder with its tokenizer).

        A PEFT model is written as its base model; `VLLMGenerator` pushes the merged weights right after.
        """
        base = model.get_base_model() if hasattr(model, "get_base_model") else model
        with tempfile.TemporaryDirectory(prefix="searchrl-vllm-") as tmp:
            folder = save_model_dir(base, tokenizer, Path(tmp) / "model")
            return cls(str(folder), **kwargs)

    def _driver_model(self) -> Any | None:
        executor = getattr(self.llm.llm_engine, "model_executor", None)
        worker = getattr(executor, "driver_worker", None)
        runner = getattr(worker, "model_runner", None) if worker is not None else None
        return getattr(runner, "model", None) if runner is not None else None

    def generate(self, prompts: Sequence[list[int]], params: Sequence[TurnParams]) -> list[TurnCompletion]:
        from vllm import SamplingParams

        sampling = [
            SamplingParams(
                n=1,
                temperature=p.temperature,
                top_p=p.top_p,
                top_k=p.top_k,
                seed=p.seed,
                max_tokens=p.max_tokens,
                # Only our stop ids end a turn (HFGenerator ignores the model config's other EOS ids).
                ignore_eos=True,
                stop_token_ids=list(p.stop_token_ids),
                stop=list(p.stop) or None,
                include_stop_str_in_output=True,
                logprobs=0,  # just the sampled token's logprob
                # Text is only needed for stop strings; the loop reads token ids.
                detokenize=bool(p.stop),
                skip_special_tokens=False,
            )
            for p in params
        ]
        outputs = self.llm.generate(
            [{"prompt_token_ids": list(ids)} for ids in prompts], sampling, use_tqdm=False
        )
        completions = []
        for out in outputs:
            choice = out.outputs[0]
            ids = [int(t) for t in choice.token_ids]
            if choice.logprobs is None or len(choice.logprobs) != len(ids):
                raise RuntimeError(
                    "vLLM returned no per-token logprobs; was SamplingParams(logprobs=0) dropped?"
                )
            logps = [float(entry[t].logprob) for t, entry in zip(ids, choice.logprobs, strict=True)]
            completions.append(
                TurnCompletion(
                    ids,
                    logps,
                    cached_tokens=int(getattr(out, "num_cached_tokens", 0) or 0),
                    finish_reason=choice.finish_reason,
                )
            )
        return completions

    def load_weights(self, weights: Iterable[tuple[str, torch.Tensor]]) -> None:
        model = self._driver_model()
        if model is not None:  # in-process engine: what TRL 1.16's colocate mode calls
            for name, tensor in weights:
                model.load_weights([(name, tensor)])
        else:  # engine in a worker process: the collective_rpc path
            cpu = [(name, tensor.detach().cpu()) for name, tensor in weights]
            self.llm.collective_rpc(_load_weights_on_worker, args=(cpu,))
        self.llm.reset_prefix_cache()


# -------------------------------------------------------------------------------------------------
# The generator
# -------------------------------------------------------------------------------------------------


class VLLMGenerator(TurnLoop):
    """Multi-turn rollouts with the same interface and trajectories as `HFGenerator` (module docstring).

    Args:
        model: the policy being trained (its weights are pushed to the engine by `sync_weights`); may be
            None with an explicit `engine` that needs no syncing.
        tokenizer: the policy's tokenizer (pad != EOS).
        config: sampling and length limits (`GenerationConfig`); `rollout(..., sampling)` may sample otherwise.
        engine: a `TokenEngine`; None starts `VLLMEngine.from_model(model, ...)` with `engine_kwargs`.
        step_batch: the batched environment step (default `searchrl.env.environment.step_batch`).
        auto_sync: sync before a rollout when the policy's parameters changed since the last sync.
    """

    def __init__(
        self,
        model: PreTrainedModel | None,
        tokenizer: PreTrainedTokenizerBase,
        config: GenerationConfig | None = None,
        engine: TokenEngine | None = None,
        step_batch: Callable[[list[Any], list[str]], list[Any]] | None = None,
        auto_sync: bool = True,
        **engine_kwargs: Any,
    ) -> None:
        super().__init__(tokenizer, config, step_batch)
        self.model = model
        self.auto_sync = auto_sync
        self.weight_syncs = 0
        started_from_base = False
        if engine is None:
            if model is None:
                raise ValueError("VLLMGenerator needs a model to start vLLM from, or an explicit engine")
            engine = VLLMEngine.from_model(model, tokenizer, **engine_kwargs)
            started_from_base = hasattr(model, "peft_config")
        elif engine_kwargs:
            raise ValueError(f"engine options {sorted(engine_kwargs)} only apply when no engine is passed")
        self.engine = engine
        self._synced_version = weights_version(model) if model is not None else None
        if started_from_base:
            self.sync_weights(model)  # vLLM started from the base weights: push the merged adapter

    # -- weights ----------------------------------------------------------------------------------
    def sync_weights(self, model: torch.nn.Module | None = None) -> None:
        """Load the policy's current weights into the engine (call after each optimizer update)."""
        model = model if model is not None else self.model
        if model is None:
            raise ValueError("sync_weights needs the policy model")
        with policy_weights(model) as weights:
            self.engine.load_weights(weights)
        self.model = model
        self.weight_syncs += 1
        self._synced_version = weights_version(model)

    # -- the loop's engine and metrics -----------------------------------------------------------
    def rollout(
        self, envs: list[Any], rows: list[dict[str, Any]], sampling: Sampling | None = None
    ) -> RolloutBatch:
        """Run one episode per (environment, row) pair; the same contract as `HFGenerator.rollout`."""
        stale = self.model is not None and weights_version(self.model) != self._synced_version
        if rows and self.auto_sync and stale:
            self.sync_weights(self.model)
        batch = super().rollout(envs, rows, sampling)
        for t in batch.trajectories:
            t.metadata["engine"] = getattr(self.engine, "name", type(self.engine).__name__)
        return batch

    def _engine(self, sampling: Sampling) -> TokenEngine:
        return self.engine  # one engine for the run: each request carries its sampling (`TurnParams`)

    def _engine_stats(self, usage: EngineUsage) -> dict[str, float]:
        return {
            "rollout/engine_calls": float(usage.calls),
            "rollout/prefix_cache_hit_rate": usage.cached / usage.submitted if usage.submitted else 0.0,
            "rollout/dropped_engine_tokens": float(usage.dropped),
            "rollout/weight_syncs": float(self.weight_syncs),
        }
