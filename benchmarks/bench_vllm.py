"""vLLM against HFGenerator on one GPU: rollout tokens per second on the same prompts, and PPO steps on vLLM.

Setup (all offline, no downloads): the synthetic world's `tiny` split, a real BM25 index, a tokenizer
trained on the task text and a small Qwen2 policy built from a config (`--hidden`, `--layers`, ...),
warm-started by `--warm-steps` supervised steps on scripted expert episodes (search the question, then
answer with a citation) so that sampled rollouts really search: an untrained model never calls the
tool, and every engine would time nothing but free sampling.

Parts (`--part`), each meant for its own process so that a vLLM engine never outlives its part:

- `setup`: builds the world under `--work` (index, tokenizer, warm-started policy) and reports the
  warm start's first-turn tool-call rate.
- `rollout`: the same `--rows` prompts through `HFGenerator` and through `VLLMGenerator`, both in
  `--dtype`, `--repeats` timed runs each after one warm-up (best run reported). Figures: sampled
  tokens/s of each, `vllm_vs_hf_tokens_per_s`, searches per episode, vLLM's prefix-cache hit rate and
  prefill ratio; then a greedy pass of `--check-rows` rows on both engines (`greedy_identical_rows` of
  `greedy_rows`: rows whose token ids agree exactly; bf16 kernels differ, so on vLLM expect agreement on a
  prefix, not everywhere) and the gap between the logprobs vLLM recorded at temperature `--temperature`
  and an HF forward pass over the same ids.
- `ppo`: `--ppo-steps` PPO steps with `rollout_backend="vllm"` (or `--backend hf` for the same run on
  HFGenerator): per-step seconds, rollout seconds, `rollout/logprob_max_abs_diff` (vLLM's logprobs
  against the trainer's recomputation: large only if a weight sync was missed or the logprob semantics
  differ), weight syncs (`weight_syncs_total`: one per update), KL, and after the run the largest
  difference between the policy's and the engine's copy of every weight both name alike (vLLM fuses
  q/k/v and gate/up, so there: the embedding and the norms).

`--engine hf` runs the vLLM parts over `HFTokenEngine` instead: a CPU smoke test of this script
(tests/test_benchmarks_vllm.py runs all three parts at toy size). Run on a GPU machine:
`benchmarks/gpu/vllm_ppo_check.sh` (all parts, JSON to $OUT).

Usage: `python benchmarks/bench_vllm.py --part setup --work W [--json setup.json]`, then
`--part rollout` and `--part ppo` with the same `--work` and model options.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
import warnings
from dataclasses import replace
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
warnings.filterwarnings("ignore")

from searchrl.common.io import read_jsonl, write_jsonl  # noqa: E402
from searchrl.data.synthetic import generate, preset_config  # noqa: E402
from searchrl.env.config import EnvConfig  # noqa: E402
from searchrl.env.environment import SearchEnvironment  # noqa: E402
from searchrl.models.io import load_policy, load_tokenizer  # noqa: E402
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer  # noqa: E402
from searchrl.rollout.chat import render_conversation  # noqa: E402
from searchrl.rollout.generator import (  # noqa: E402
    GenerationConfig,
    HFGenerator,
    sampling_log_probs,
)
from searchrl.rollout.vllm_generator import HFTokenEngine, VLLMGenerator  # noqa: E402
from searchrl.search.index import build_index, load_index  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers beside this script
from _scripted_warm_start import scripted_warm_start  # noqa: E402

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16}


def env_config(args: argparse.Namespace) -> EnvConfig:
    return EnvConfig(
        max_turns=args.max_turns,
        max_tool_calls=args.max_turns - 1,
        max_episode_tokens=args.max_episode_tokens,
        max_observation_tokens=96,
        topk=2,
        tool_schema_in_prompt=False,
    )


def gen_config(args: argparse.Namespace, **kw: Any) -> GenerationConfig:
    base = dict(
        temperature=args.temperature,
        max_new_tokens_per_turn=args.max_new_tokens_per_turn,
        max_episode_tokens=args.max_episode_tokens,
        seed=0,
    )
    return GenerationConfig(**{**base, **kw})


def load_world(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    rows = list(read_jsonl(work / "rows.jsonl"))[: args.rows]  # --rows: at most the rows setup wrote
    return {
        "backend": load_index(work / "index"),
        "tok": load_tokenizer(work / "policy"),
        "rows": rows,
        "policy_dir": work / "policy",
    }


def envs_for(world: dict[str, Any], args: argparse.Namespace, n: int) -> list[SearchEnvironment]:
    cfg = env_config(args)
    return [SearchEnvironment(world["backend"], cfg, tokenizer=world["tok"]) for _ in range(n)]


# -------------------------------------------------------------------------------------------------
# setup
# -------------------------------------------------------------------------------------------------


def part_setup(args: argparse.Namespace, device: str) -> dict[str, Any]:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    task = generate(preset_config("tiny", seed=0))
    write_jsonl(work / "corpus.jsonl", task.corpus)
    backend = build_index(work / "corpus.jsonl", work / "index", overwrite=True)
    rows = [r for r in task.splits["train"] if r["hops"] == 1]
    rows = (rows * (args.rows // max(1, len(rows)) + 1))[: args.rows]
    write_jsonl(work / "rows.jsonl", rows)
    texts = tokenizer_training_texts(task.corpus, task.splits["train"])
    first = train_tokenizer(texts, vocab_size=args.vocab)
    env = SearchEnvironment(backend, env_config(args))
    rendered = render_conversation(first, env.reset(dict(rows[0])), env.tools, add_generation_prompt=True)
    tok = train_tokenizer(texts + [rendered] * 50, vocab_size=args.vocab)
    policy = build_policy(
        tok,
        TinyModelConfig(
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=args.heads,
            num_key_value_heads=args.kv_heads,
            intermediate_size=args.intermediate,
            max_position_embeddings=4096,
        ),
    ).to(device)
    world = {"backend": backend, "tok": tok, "rows": rows}
    scripted_warm_start(
        policy,
        tok,
        envs_for(world, args, len(rows)),
        rows,
        gen_config(args, max_new_tokens_per_turn=96),
        args.warm_steps,
        lr=args.warm_lr,
    )
    policy.eval()
    policy.save_pretrained(work / "policy")
    tok.save_pretrained(work / "policy")
    # How often the warm policy searches in its first turn when it samples freely.
    hf = HFGenerator(policy, tok, gen_config(args, max_new_tokens_per_turn=48))
    batch = hf.rollout(envs_for(world, args, len(rows)), rows)
    calls = [t.tool_calls for t in batch.trajectories]
    return {
        "setup_s": time.perf_counter() - t0,
        "parameters": sum(p.numel() for p in policy.parameters()),
        "vocab_size": len(tok),
        "warm_first_turn_search_rate": sum(bool(c) and c[0].turn_index == 0 for c in calls) / len(calls),
        "warm_searches_per_episode": batch.stats["tools/calls_per_episode"],
        "warm_termination_answered": batch.stats.get("termination/answered", 0.0),
    }


# -------------------------------------------------------------------------------------------------
# rollout throughput and agreement
# -------------------------------------------------------------------------------------------------


def make_vllm_generator(
    policy: Any, tok: Any, cfg: GenerationConfig, args: argparse.Namespace
) -> VLLMGenerator:
    if args.engine == "hf":
        return VLLMGenerator(policy, tok, cfg, engine=HFTokenEngine(policy, tok))
    return VLLMGenerator(
        policy,
        tok,
        cfg,
        gpu_memory_utilization=args.gpu_memory_utilization,
        enable_prefix_caching=not args.no_prefix_caching,
        dtype=args.dtype,
        max_model_len=args.max_model_len,
    )


def timed(gen: Any, world: dict[str, Any], args: argparse.Namespace) -> dict[str, float]:
    rows = world["rows"]
    gen.rollout(envs_for(world, args, len(rows)), rows)  # warm-up: compilation, caches, allocator
    best: dict[str, float] | None = None
    for _ in range(args.repeats):
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        batch = gen.rollout(envs_for(world, args, len(rows)), rows)
        wall = time.perf_counter() - t0
        sampled = sum(t.num_action_tokens for t in batch.trajectories)
        run = {
            "wall_s": wall,
            "sampled_tokens": float(sampled),
            "tokens_per_s": sampled / wall,
            "trajectory_tokens": float(sum(len(t.input_ids) for t in batch.trajectories)),
            "searches_per_episode": batch.stats["tools/calls_per_episode"],
            "answered": batch.stats.get("termination/answered", 0.0),
            "search_share": batch.stats["rollout/search_share"],
            "prefill_ratio": batch.stats["rollout/prefill_ratio"],
            **{
                k.split("/", 1)[1]: v
                for k, v in batch.stats.items()
                if k.startswith("rollout/") and "cache" in k
            },
        }
        if best is None or run["wall_s"] < best["wall_s"]:
            best = run
    assert best is not None
    return best


def part_rollout(args: argparse.Namespace, device: str) -> dict[str, Any]:
    world = load_world(args.work, args)
    tok = world["tok"]
    dtype = DTYPES[args.dtype]
    policy = load_policy(world["policy_dir"], dtype=dtype).to(device)
    cfg = gen_config(args)
    t0 = time.perf_counter()
    vgen = make_vllm_generator(policy, tok, replace(cfg), args)
    engine_start_s = time.perf_counter() - t0
    hf = timed(HFGenerator(policy, tok, replace(cfg)), world, args)
    vl = timed(vgen, world, args)
    out: dict[str, Any] = {
        "engine": args.engine,
        "engine_start_s": engine_start_s,
        "rows": len(world["rows"]),
        "hf": hf,
        "vllm": vl,
        "vllm_vs_hf_tokens_per_s": vl["tokens_per_s"] / hf["tokens_per_s"],
        "vllm_vs_hf_wall": vl["wall_s"] / hf["wall_s"],
    }
    # Greedy on both: identical rows (exact token ids) and the first position where rows differ.
    rows = world["rows"][: args.check_rows]
    g_cfg = replace(cfg, temperature=0.0)
    a = vgen.rollout(envs_for(world, args, len(rows)), rows, g_cfg.sampling()).trajectories
    b = HFGenerator(policy, tok, replace(g_cfg)).rollout(envs_for(world, args, len(rows)), rows).trajectories
    same = [x.input_ids == y.input_ids for x, y in zip(a, b, strict=True)]
    first_diff = []
    for x, y in zip(a, b, strict=True):
        n = next((i for i, (p, q) in enumerate(zip(x.input_ids, y.input_ids, strict=False)) if p != q), None)
        if n is not None:
            first_diff.append(n - x.prompt_length)
    out["greedy_rows"] = len(same)
    out["greedy_identical_rows"] = sum(same)
    out["greedy_first_difference_after_prompt_min"] = min(first_diff) if first_diff else None
    # vLLM's recorded logprobs at the sampling temperature against one HF forward over the same ids.
    trajs = vgen.rollout(envs_for(world, args, len(rows)), rows, cfg.sampling(seed=1)).trajectories
    gaps = []
    for t in trajs:
        ids = torch.tensor([t.input_ids], device=device)
        with torch.no_grad():
            logits = policy(ids).logits[0, :-1].float()
        logp = sampling_log_probs(logits, cfg.temperature, cfg.top_k, cfg.top_p)
        logp = logp.gather(1, ids[0, 1:, None]).squeeze(1).cpu()
        mask = torch.tensor(t.action_mask[1:], dtype=torch.bool)
        gaps.append((logp[mask] - torch.tensor(t.logprobs[1:])[mask]).abs())
    gap = torch.cat(gaps)
    out["logprob_gap_max"] = float(gap.max())
    out["logprob_gap_mean"] = float(gap.mean())
    return out


# -------------------------------------------------------------------------------------------------
# PPO steps
# -------------------------------------------------------------------------------------------------


def part_ppo(args: argparse.Namespace, device: str) -> dict[str, Any]:
    from searchrl.ppo.config import PPOConfig
    from searchrl.ppo.trainer import PPOTrainer
    from searchrl.rewards.combine import default_rubric

    world = load_world(args.work, args)
    tok, backend = world["tok"], world["backend"]
    cfg = env_config(args)
    backend_name = args.backend
    ppo_args = PPOConfig(
        output_dir=str(args.work / f"ppo-{backend_name}"),
        seed=1,
        use_cpu=device == "cpu",
        rollout_backend="vllm" if backend_name == "vllm" and args.engine == "vllm" else "hf",
        vllm_gpu_memory_utilization=args.gpu_memory_utilization,
        vllm_enable_prefix_caching=not args.no_prefix_caching,
        per_device_train_batch_size=args.ppo_batch,
        gradient_accumulation_steps=1,
        total_episodes=args.ppo_batch * args.ppo_steps,
        num_ppo_epochs=1,
        num_mini_batches=1,
        temperature=args.temperature,
        max_turns=args.max_turns,
        max_tool_calls=args.max_turns - 1,
        max_new_tokens_per_turn=args.max_new_tokens_per_turn,
        max_episode_tokens=args.max_episode_tokens,
        learning_rate=args.ppo_lr,
        save_steps=10**6,
        eval_steps=10**6,
        progress_bar=False,
        save_trajectories=False,
    )
    factory = None
    if backend_name == "vllm" and args.engine == "hf":  # CPU smoke test of this script

        def factory(model: Any, tokenizer: Any, gcfg: GenerationConfig) -> VLLMGenerator:
            import copy

            return VLLMGenerator(
                model, tokenizer, gcfg, engine=HFTokenEngine(copy.deepcopy(model), tokenizer)
            )

    t0 = time.perf_counter()
    trainer = PPOTrainer(
        ppo_args,
        tok,
        load_policy(world["policy_dir"]).train(),
        None,
        None,
        world["rows"],
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, cfg, tokenizer=tok),
        generator_factory=factory,
    )
    build_s = time.perf_counter() - t0
    keys = (
        "rollout/seconds",
        "rollout/logprob_max_abs_diff",
        "rollout/weight_syncs",
        "rollout/prefix_cache_hit_rate",
        "rollout/engine_calls",
        "rollout/tokens_per_s",
        "tools/calls_per_episode",
        "objective/kl",
        "objective/scores",
        "rollout/action_tokens_per_episode",
    )
    steps = []
    for _ in range(args.ppo_steps):
        t1 = time.perf_counter()
        metrics = trainer.step()
        steps.append({"step_s": time.perf_counter() - t1, **{k: metrics.get(k) for k in keys}})
    out: dict[str, Any] = {
        "backend": backend_name,
        "engine": args.engine,
        "generator": type(trainer.generator).__name__,
        "trainer_build_s": build_s,
        "steps": steps,
        "weight_syncs_total": getattr(trainer.generator, "weight_syncs", None),
    }
    engine = getattr(trainer.generator, "engine", None)
    model = getattr(engine, "_driver_model", lambda: getattr(engine, "model", None))() if engine else None
    if model is not None:
        # After the last update and its sync, the engine's copy must equal the policy (up to its dtype).
        theirs = dict(model.named_parameters())
        compared, worst = [], 0.0
        for name, p in trainer.policy.named_parameters():
            if name not in theirs:
                continue  # vLLM fuses q/k/v and gate/up under other names
            mine = p.detach()
            # vLLM pads the vocabulary rows of its embedding; compare the real rows.
            got = theirs[name].detach()[: mine.shape[0]]
            if got.shape != mine.shape:
                continue
            diff = (got.float().to(mine.device) - mine.float()).abs().max()
            worst = max(worst, float(diff))
            compared.append(name)
        out["engine_vs_policy_params_compared"] = len(compared)
        out["engine_vs_policy_max_abs_diff"] = worst if compared else None
    return out


# -------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> dict[str, Any]:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=("setup", "rollout", "ppo"), required=True)
    p.add_argument(
        "--work", type=Path, required=True, help="Folder the setup part writes and the others read."
    )
    p.add_argument("--json", type=Path, default=None, help="Write this part's figures here.")
    p.add_argument(
        "--engine", choices=("vllm", "hf"), default="vllm", help="hf: HFTokenEngine (CPU smoke test)."
    )
    p.add_argument("--backend", choices=("vllm", "hf"), default="vllm", help="ppo part: the rollout backend.")
    p.add_argument(
        "--rows",
        type=int,
        default=64,
        help="Prompts per rollout batch (setup writes this many; later parts use at most as many).",
    )
    p.add_argument("--check-rows", type=int, default=16, help="Rows of the greedy and logprob checks.")
    p.add_argument("--repeats", type=int, default=3, help="Timed rollouts per engine (best reported).")
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--heads", type=int, default=8)
    p.add_argument("--kv-heads", type=int, default=4)
    p.add_argument("--intermediate", type=int, default=1536)
    p.add_argument("--vocab", type=int, default=2048)
    p.add_argument("--warm-steps", type=int, default=150, help="Supervised warm-start steps.")
    p.add_argument("--warm-lr", type=float, default=3e-3)
    p.add_argument("--temperature", type=float, default=1.0)
    p.add_argument("--max-turns", type=int, default=3)
    p.add_argument("--max-new-tokens-per-turn", type=int, default=64)
    p.add_argument("--max-episode-tokens", type=int, default=512)
    p.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16", help="rollout part: both engines.")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3)
    p.add_argument("--max-model-len", type=int, default=2048)
    p.add_argument("--no-prefix-caching", action="store_true")
    p.add_argument("--ppo-steps", type=int, default=3)
    p.add_argument("--ppo-batch", type=int, default=16)
    p.add_argument("--ppo-lr", type=float, default=1e-5)
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (e.g. 1 on a shared CPU).")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    torch.manual_seed(0)
    t0 = time.perf_counter()
    part = {"setup": part_setup, "rollout": part_rollout, "ppo": part_ppo}[args.part]
    out = part(args, device)
    out.update(
        part=args.part,
        part_s=time.perf_counter() - t0,
        device=torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
        python=platform.python_version(),
        torch=torch.__version__,
    )
    try:
        out["vllm_version"] = importlib.metadata.version("vllm")
    except importlib.metadata.PackageNotFoundError:
        out["vllm_version"] = None
    print(json.dumps(out, indent=2, default=str))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2, default=str) + "\n")
    return out


if __name__ == "__main__":
    main()
