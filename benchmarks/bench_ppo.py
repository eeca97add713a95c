"""PPO's optimisation phase against a plain forward + backward over the same tokens and models.

Builds the tiny synthetic task, a BM25 index and a tiny Qwen2 policy, and runs real PPO steps whose
rollouts are teacher-forced through the real engine (a search call, its observation, an answer), so
the batch has the multi-turn shape PPO trains on. Inside each step it times `PPOTrainer._optimise`
(`num_ppo_epochs` x mini-batches x micro-batches of logprobs under the sampling distribution, clipped
policy and value losses, backward, gradient clipping, optimizer and scheduler steps) and then, on the
same batch, the same micro-batches, the same `PolicyAndValue` module, a plain forward and backward with
a trivial loss and no optimizer. Both process the same number of tokens, so

    update_vs_fwd_bwd = (tokens / update seconds) / (tokens / fwd+bwd seconds)   (target >= 0.7)

is the share of the optimisation phase's time that is the unavoidable model compute.

Usage: ``python benchmarks/bench_ppo.py --json OUT [--steps 3] [--hidden 128] [--layers 4]``.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from searchrl.common.io import write_jsonl  # noqa: E402
from searchrl.data.synthetic import generate, preset_config  # noqa: E402
from searchrl.env.config import EnvConfig  # noqa: E402
from searchrl.env.environment import SearchEnvironment  # noqa: E402
from searchrl.models.tiny import (  # noqa: E402
    TinyModelConfig,
    build_policy,
    tokenizer_training_texts,
    train_tokenizer,
)
from searchrl.ppo.config import PPOConfig  # noqa: E402
from searchrl.ppo.trainer import PPOTrainer, trim_to_length  # noqa: E402
from searchrl.rewards.combine import default_rubric  # noqa: E402
from searchrl.rollout.generator import ScriptedPolicy  # noqa: E402
from searchrl.search.index import build_index  # noqa: E402


def plain_forward_backward(trainer: PPOTrainer, full: dict[str, torch.Tensor]) -> float:
    """Seconds of forward + backward over exactly the micro-batches `_optimise` uses (no optimizer)."""
    a = trainer.args
    B = full["input_ids"].shape[0]
    mb_size = max(1, B // a.num_mini_batches)
    gen = torch.Generator().manual_seed(0)
    trainer.model.train()
    start = time.perf_counter()
    for _epoch in range(a.num_ppo_epochs):
        perm = torch.randperm(B, generator=gen)
        for s in range(0, B, mb_size):
            mb_idx = perm[s : s + mb_size]
            for u in range(0, len(mb_idx), a.per_device_train_batch_size):
                mb = trim_to_length(full, mb_idx[u : u + a.per_device_train_batch_size])
                logits, values = trainer.model(mb["input_ids"], mb["attention_mask"])
                (logits.float().mean() + values.mean()).backward()
        trainer.model.zero_grad(set_to_none=True)
    elapsed = time.perf_counter() - start
    trainer.model.eval()
    return elapsed


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--steps", type=int, default=3, help="PPO steps to time (the first one warms up)")
    ap.add_argument("--hidden", type=int, default=128, help="hidden size of the tiny policy")
    ap.add_argument("--layers", type=int, default=4, help="transformer blocks of the tiny policy")
    ap.add_argument("--threads", type=int, default=1, help="torch intra-op threads (CPU)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    tmp = Path(tempfile.mkdtemp(prefix="bench_ppo_"))
    task = generate(preset_config("tiny", seed=0))
    write_jsonl(tmp / "corpus.jsonl", task.corpus)
    backend = build_index(tmp / "corpus.jsonl", tmp / "index")
    train = task.splits["train"]
    tok = train_tokenizer(tokenizer_training_texts(task.corpus, train), vocab_size=2048)
    heads = max(1, args.hidden // 32)
    policy = build_policy(
        tok,
        TinyModelConfig(
            hidden_size=args.hidden,
            num_hidden_layers=args.layers,
            num_attention_heads=heads,
            num_key_value_heads=1,
            intermediate_size=4 * args.hidden,
        ),
    )
    cfg = PPOConfig(
        output_dir=str(tmp / "run"),
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        total_episodes=8 * (args.steps + 1),
        num_ppo_epochs=4,
        max_new_tokens_per_turn=48,
        max_episode_tokens=512,
        learning_rate=1e-4,
        temperature=1.0,
        save_steps=10_000,
        eval_steps=10_000,
        progress_bar=False,
        save_trajectories=False,
        use_cpu=True,
    )
    env_cfg = EnvConfig(max_turns=3, max_tool_calls=2, max_episode_tokens=512, max_observation_tokens=128)
    trainer = PPOTrainer(
        cfg,
        tok,
        policy,
        None,
        None,
        train,
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, env_cfg, tokenizer=tok),
    )
    # Expert-shaped episodes: search for the question's subject, then answer with the gold.
    scripts = []
    for row in train:
        query = row.get("subject") or row["question"]
        call = json.dumps({"name": "search", "arguments": {"query": query}})
        scripts.append([f"<tool_call>\n{call}\n</tool_call>", f"<answer>{row['golds'][0]}</answer>"])
    timings: list[dict[str, float]] = []
    original = trainer._optimise

    def timed_optimise(batch, old_logprobs, old_values, advantages, returns):  # noqa: ANN001, ANN202
        full = {
            **batch,
            "old_logprobs": old_logprobs,
            "old_values": old_values,
            "advantages": advantages,
            "returns": returns,
        }
        tokens = int(batch["attention_mask"].sum()) * cfg.num_ppo_epochs
        start = time.perf_counter()
        stats = original(batch, old_logprobs, old_values, advantages, returns)
        update_s = time.perf_counter() - start
        fwd_bwd_s = plain_forward_backward(trainer, full)
        timings.append({"tokens": tokens, "update_s": update_s, "fwd_bwd_s": fwd_bwd_s})
        return stats

    trainer._optimise = timed_optimise  # type: ignore[method-assign]
    for _ in range(args.steps + 1):
        rows_before = trainer.data_offset
        order = [train[i % len(train)] for i in range(rows_before, rows_before + 8)]
        trainer.generator.forcing = ScriptedPolicy(tok, [scripts[train.index(r)] for r in order])
        metrics = trainer.step()
    measured = timings[1:]  # the first step warms up allocators and kernels
    update_tps = statistics.median(t["tokens"] / t["update_s"] for t in measured)
    fwd_bwd_tps = statistics.median(t["tokens"] / t["fwd_bwd_s"] for t in measured)
    out = {
        "update_vs_fwd_bwd": update_tps / fwd_bwd_tps,
        "target": 0.7,
        "update_tokens_per_s": update_tps,
        "fwd_bwd_tokens_per_s": fwd_bwd_tps,
        "tokens_per_step": measured[0]["tokens"],
        "steps_timed": len(measured),
        "observation_tokens_per_episode": metrics.get("rollout/observation_tokens", 0.0) / 8,
        "model": {"hidden": args.hidden, "layers": args.layers, "vocab": len(tok)},
        "threads": args.threads,
        "machine": {
            "python": platform.python_version(),
            "torch": torch.__version__,
            "cpu_count": os.cpu_count(),
            "loadavg_1m": os.getloadavg()[0],
        },
    }
    print(f"{'update tokens/s':>24}: {update_tps:10.0f}")
    print(f"{'fwd+bwd tokens/s':>24}: {fwd_bwd_tps:10.0f}")
    print(f"{'update_vs_fwd_bwd':>24}: {out['update_vs_fwd_bwd']:10.3f}  (target >= 0.7)")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
