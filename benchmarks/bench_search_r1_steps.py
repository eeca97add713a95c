"""The Search-R1 PPO recipe's first steps, timed: seconds per step and peak memory at the recipe's model shape.

What a user wants to know before renting 8 GPUs for `configs/search_r1/qwen2.5-3b_ppo.yaml`: how long one
PPO step takes and how much memory it holds, per GPU. This script runs the recipe itself (`load_config` of
the YAML, then `searchrl.ppo.commands.build_trainer`, the same path as `searchrl train`) for a few steps and
substitutes only what an offline machine cannot have:

- the model: a Qwen2 model with the recipe's *shape* (Qwen2.5-3B: 36 layers, width 2048, 16 query and 2
  key/value heads, MLP 11008, tied embeddings) and random weights, over a tokenizer trained on the toy task
  (so its vocabulary is about 4k tokens instead of 151,936: 0.3B fewer embedding parameters, said in the
  JSON). Random weights never write a stop tag, so every turn runs to `max_new_tokens_per_turn` and every
  episode to the recipe's turn budget: a worst case for generation time, the same for training;
- the retriever: a BM25 index over the synthetic task's corpus instead of the wiki-18 e5 server (retrieval
  is a small part of a step; `searchrl serve` and the e5 path are measured by `bench_search.py`);
- the batch: `--episodes` episodes per step on one process (the recipe's 512 over 8 processes is 64 per
  process), one mini-batch.

Everything else (protocol, turns, token limits, KL, clip ranges, GAE, learning rates, bf16, gradient
checkpointing, the separate critic and the frozen reference) is the file's. The JSON holds, per step, the
step's wall seconds, the rollout's seconds and tokens per second and the KL, and after the run the peak GPU memory
(`torch.cuda.max_memory_allocated`) and the parameter counts.

    python benchmarks/bench_search_r1_steps.py --json out.json                        # on a GPU: the 3B shape
    python benchmarks/bench_search_r1_steps.py --shape tiny --cpu --steps 1 --json o.json   # CPU smoke run

`benchmarks/gpu/search_r1_steps.sh` runs it on a lent device machine inside a time budget.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch

from searchrl.common.config import load_config
from searchrl.common.io import atomic_write_json, read_jsonl
from searchrl.data.synthetic import generate, preset_config
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.config import PPOConfig
from searchrl.search.index import build_index

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "configs" / "search_r1" / "qwen2.5-3b_ppo.yaml"

# Qwen2.5-3B's config.json (the architecture, not the weights); "tiny" is the CPU smoke shape.
SHAPES: dict[str, TinyModelConfig] = {
    "qwen2.5-3b": TinyModelConfig(
        hidden_size=2048,
        num_hidden_layers=36,
        num_attention_heads=16,
        num_key_value_heads=2,
        intermediate_size=11008,
        max_position_embeddings=32768,
        tie_word_embeddings=True,
        rope_theta=1_000_000.0,
    ),
    "tiny": TinyModelConfig(hidden_size=32, num_hidden_layers=1, intermediate_size=64),
}
QWEN_VOCAB = 151_936


def prepare(work: Path, shape: str) -> dict[str, Path]:
    """The toy task's corpus, BM25 index and questions, and a random model of `shape` saved to disk."""
    task = generate(preset_config("tiny", seed=0))
    paths = task.write(work / "data")
    build_index(paths["corpus"], work / "index", overwrite=True)
    rows = read_jsonl(paths["train"])
    tokenizer = train_tokenizer(tokenizer_training_texts(task.corpus, rows), vocab_size=4096)
    policy = build_policy(tokenizer, SHAPES[shape])
    policy.save_pretrained(work / "policy")
    tokenizer.save_pretrained(work / "policy")
    return {"train": paths["train"], "dev": paths["dev"], "index": work / "index", "policy": work / "policy"}


def recipe_overrides(
    paths: dict[str, Path], out: Path, episodes: int, steps: int, cpu: bool
) -> dict[str, Any]:
    """What an offline single-process run cannot take from the recipe; everything else stays the file's."""
    overrides: dict[str, Any] = {
        "output_dir": str(out),
        "policy_model_path": str(paths["policy"]),
        "train_file": str(paths["train"]),
        "dev_file": str(paths["dev"]),
        "search_backend": "bm25",
        "index_dir": str(paths["index"]),
        "search_url": None,
        "rollout_backend": "hf",
        "report_to": ["none"],
        "per_device_train_batch_size": episodes,
        "gradient_accumulation_steps": 1,
        "num_mini_batches": 1,
        "total_episodes": episodes * steps,
        "local_rollout_forward_batch_size": episodes,
        "eval_on_start": False,
        "save_trajectories": False,
        "num_sample_generations": 0,
        "progress_bar": False,
    }
    if cpu:  # the smoke shape on a CPU: float32, short turns
        overrides |= {
            "use_cpu": True,
            "mixed_precision": "no",
            "gradient_checkpointing": False,
            "max_new_tokens_per_turn": 8,
            "max_observation_tokens": 32,
            "max_episode_tokens": 120,
        }
    return overrides


def timed_steps(trainer: Any, steps: int, on_gpu: bool) -> list[dict[str, Any]]:
    """`steps` calls of `PPOTrainer.step()` (rollout, scoring, forward passes, GAE, updates), each timed.

    `step()` rather than `train()`: `train()` ends with a checkpoint, and a 3B policy with its critic and
    both optimizers' states is about 75 GB, more than a device machine's disk.
    """
    rows = []
    for _ in range(steps):
        started = time.perf_counter()
        metrics = trainer.step()
        if on_gpu:
            torch.cuda.synchronize()
        rows.append(
            {
                "step": trainer.global_step,
                "step_s": round(time.perf_counter() - started, 3),
                "rollout_s": metrics.get("rollout/seconds"),
                "rollout_tokens_per_s": metrics.get("rollout/tokens_per_s"),
                "action_tokens_per_episode": metrics.get("rollout/action_tokens_per_episode"),
                "objective/kl": metrics.get("objective/kl"),
            }
        )
        print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--config", type=Path, default=RECIPE, help="The recipe YAML (a PPOConfig).")
    parser.add_argument("--shape", choices=sorted(SHAPES), default="qwen2.5-3b", help="Model shape.")
    parser.add_argument("--steps", type=int, default=3, help="PPO steps to run and time.")
    parser.add_argument("--episodes", type=int, default=8, help="Episodes per PPO step (one process).")
    parser.add_argument("--work", type=Path, default=Path("/tmp/searchrl-sr1-steps"), help="Scratch folder.")
    parser.add_argument("--cpu", action="store_true", help="Run on the CPU (the smoke shape only).")
    parser.add_argument("--set", action="append", default=[], metavar="FIELD=VALUE", help="More overrides.")
    parser.add_argument("--json", type=Path, required=True, help="Where to write the figures.")
    args = parser.parse_args(argv)
    if not args.cpu and not torch.cuda.is_available():
        parser.error("no CUDA device: pass --cpu (with --shape tiny) for the smoke run")
    from searchrl.ppo.commands import build_trainer, parse_set_options

    started = time.perf_counter()
    paths = prepare(args.work, args.shape)
    prepare_s = time.perf_counter() - started
    overrides = recipe_overrides(paths, args.work / "run", args.episodes, args.steps, args.cpu)
    overrides |= parse_set_options(args.set)
    cfg = load_config(PPOConfig, args.config, overrides)
    trainer = build_trainer(cfg)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    params = {"policy": count(trainer.policy), "policy_and_value": count(trainer.model)}
    if trainer.ref_model is not None:
        params["reference"] = count(trainer.ref_model)
    on_gpu = torch.cuda.is_available() and not args.cpu
    train_started = time.perf_counter()
    steps = timed_steps(trainer, args.steps, on_gpu)
    result = {
        "config": str(args.config),
        "shape": args.shape,
        "device": torch.cuda.get_device_name(0) if on_gpu else "cpu",
        "torch": torch.__version__,
        "episodes_per_step": args.episodes,
        "vocab_size": trainer.policy.config.vocab_size,
        "embedding_parameters_missing_vs_qwen": (QWEN_VOCAB - trainer.policy.config.vocab_size)
        * trainer.policy.config.hidden_size
        if args.shape == "qwen2.5-3b"
        else None,
        "parameters": params,
        "settings": {
            k: getattr(cfg, k)
            for k in (
                "max_turns",
                "max_new_tokens_per_turn",
                "max_episode_tokens",
                "mixed_precision",
                "gradient_checkpointing",
                "value_mode",
                "topk",
            )
        },
        "prepare_s": round(prepare_s, 1),
        "train_s": round(time.perf_counter() - train_started, 1),
        "steps": steps,
        "peak_gpu_memory_gb": round(torch.cuda.max_memory_allocated() / 2**30, 2) if on_gpu else None,
    }
    atomic_write_json(args.json, result)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
