"""Trainer step time: PPO against GRPO with TRL's tool loop and GRPO with our rollout engine.

Setup (all offline): the synthetic world's tiny split, a real BM25 index, one tiny Qwen2 policy and its
tokenizer. The policy is warm-started (a few dozen supervised steps on expert episodes run through the
real engine), or loaded from `--policy DIR` (e.g. the SFT output), so that sampled rollouts really search:
an untrained tiny model never calls the tool and every trainer would time nothing but sampling.

All three trainers start from the same weights and get the same budgets: `--episodes-per-step`
episodes per optimizer step (GRPO: that many divided by `--num-generations` questions, each answered
`--num-generations` times; PPO: that many questions), the same environment limits (turns, searches,
tokens) and one optimisation pass per batch (PPO `num_ppo_epochs=1, num_mini_batches=1`; GRPO
`num_iterations=1`). A step is rollout + scoring + update; the first `--warmup` steps are not timed.
One `PPOConfig` holds these settings; both GRPO modes copy the sections they share with it
(`searchrl.sections.with_sections_of`).

Figures: `ppo_step_s`, `grpo_trl_loop_step_s`, `grpo_our_rollout_step_s` (mean seconds per timed step),
with the searches per episode each trainer's rollouts made (sampling differs between the loops, so this
says whether the timed steps did comparable work).

Run: `python benchmarks/bench_trainers.py --json OUT.json` (a few minutes on 2 CPU cores).
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
import warnings
from pathlib import Path
from typing import Any

import torch

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
warnings.filterwarnings("ignore")

from transformers import TrainerCallback  # noqa: E402

from searchrl.common.io import write_jsonl  # noqa: E402
from searchrl.data.synthetic import generate, preset_config  # noqa: E402
from searchrl.env.environment import SearchEnvironment  # noqa: E402
from searchrl.grpo.config import GRPORunConfig  # noqa: E402
from searchrl.grpo.trainer import build_grpo_trainer  # noqa: E402
from searchrl.models.io import load_policy, load_tokenizer  # noqa: E402
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer  # noqa: E402
from searchrl.ppo.config import PPOConfig  # noqa: E402
from searchrl.rewards.combine import default_rubric  # noqa: E402
from searchrl.rollout.chat import render_conversation  # noqa: E402
from searchrl.rollout.generator import GenerationConfig  # noqa: E402
from searchrl.run.reader import RunReader  # noqa: E402
from searchrl.search.index import build_index  # noqa: E402
from searchrl.sections import with_sections_of  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the helpers beside this script
from _scripted_warm_start import scripted_warm_start  # noqa: E402


class StepTimer(TrainerCallback):
    """Wall-clock seconds of each optimizer step of a transformers/TRL trainer."""

    def __init__(self) -> None:
        self.seconds: list[float] = []
        self._t0 = 0.0

    def on_step_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self._t0 = time.perf_counter()

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.seconds.append(time.perf_counter() - self._t0)


def build_world(work: Path, args: argparse.Namespace) -> dict[str, Any]:
    task = generate(preset_config("tiny", seed=0))
    write_jsonl(work / "corpus.jsonl", task.corpus)
    backend = build_index(work / "corpus.jsonl", work / "index", overwrite=True)
    rows = [r for r in task.splits["train"] if r["hops"] == 1][: args.questions]
    cfg = grpo_config(work, "our_rollout", args)
    env_config = cfg.env_config()
    if args.policy:
        tokenizer = load_tokenizer(args.policy)
        policy_dir = Path(args.policy)
    else:
        texts = tokenizer_training_texts(task.corpus, task.splits["train"])
        first = train_tokenizer(texts, vocab_size=1024)
        env = SearchEnvironment(backend, env_config)
        rendered = render_conversation(first, env.reset(dict(rows[0])), env.tools, add_generation_prompt=True)
        tokenizer = train_tokenizer(texts + [rendered] * 50, vocab_size=1024)
        policy = build_policy(
            tokenizer,
            TinyModelConfig(
                hidden_size=64,
                num_hidden_layers=2,
                num_attention_heads=2,
                num_key_value_heads=1,
                intermediate_size=128,
            ),
        )
        scripted_warm_start(
            policy,
            tokenizer,
            [SearchEnvironment(backend, env_config, tokenizer=tokenizer) for _ in rows],
            rows,
            GenerationConfig(max_new_tokens_per_turn=64, max_episode_tokens=400),
            args.warm_steps,
            lr=1e-2,
        )
        policy_dir = work / "policy"
        policy.save_pretrained(policy_dir)
        tokenizer.save_pretrained(policy_dir)
    return {"backend": backend, "rows": rows, "tokenizer": tokenizer, "policy_dir": policy_dir}


def ppo_config(work: Path, args: argparse.Namespace) -> PPOConfig:
    """The one set of settings: PPO runs it, and both GRPO modes derive theirs from it."""
    return PPOConfig(
        output_dir=str(work / "ppo"),
        seed=1,
        per_device_train_batch_size=args.episodes_per_step,
        gradient_accumulation_steps=1,
        total_episodes=args.episodes_per_step * (args.steps + args.warmup),
        num_ppo_epochs=1,
        num_mini_batches=1,
        max_turns=args.max_turns,
        max_tool_calls=args.max_turns - 1,
        max_new_tokens_per_turn=48,
        max_episode_tokens=args.max_episode_tokens,
        max_observation_tokens=64,
        topk=2,
        tool_schema_in_prompt=False,
        temperature=0.8,
        learning_rate=1e-4,
        save_steps=10**6,
        progress_bar=False,
        save_trajectories=False,
    )


def grpo_config(work: Path, mode: str, args: argparse.Namespace) -> GRPORunConfig:
    """GRPO with the PPO run's environment, limits, batch, budget and learning rate (the sections they share)."""
    ppo = ppo_config(work, args)
    return with_sections_of(
        GRPORunConfig,
        ppo,
        eval_batch_size=ppo.episodes_per_step,
        mode=mode,
        output_dir=str(work / f"grpo-{mode}"),
        num_generations=args.num_generations,
    )


def time_grpo(world: dict[str, Any], work: Path, mode: str, args: argparse.Namespace) -> dict[str, float]:
    cfg = grpo_config(work, mode, args)
    timer = StepTimer()
    policy = load_policy(world["policy_dir"]).train()
    trainer = build_grpo_trainer(
        cfg, policy, world["tokenizer"], world["backend"], world["rows"], callbacks=[timer]
    )
    trainer.train()
    metrics = RunReader(cfg.run_dir).metrics()
    searches = [m["tools/calls_per_episode"] for m in metrics if "tools/calls_per_episode" in m]
    timed = timer.seconds[args.warmup :]
    return {
        "step_s": statistics.mean(timed),
        "searches_per_episode": statistics.mean(searches[args.warmup :]),
    }


def time_ppo(world: dict[str, Any], work: Path, args: argparse.Namespace) -> dict[str, float]:
    from searchrl.ppo.trainer import PPOTrainer

    ppo_args = ppo_config(work, args)
    env_config = ppo_args.env_config()
    tokenizer, backend = world["tokenizer"], world["backend"]
    trainer = PPOTrainer(
        ppo_args,
        tokenizer,
        load_policy(world["policy_dir"]).train(),
        None,
        None,
        world["rows"],
        reward_funcs=default_rubric(),
        environment=lambda: SearchEnvironment(backend, env_config, tokenizer=tokenizer),
    )
    seconds, searches = [], []
    for _ in range(args.steps + args.warmup):
        t0 = time.perf_counter()
        metrics = trainer.step()
        seconds.append(time.perf_counter() - t0)
        searches.append(metrics["tools/calls_per_episode"])
    return {
        "step_s": statistics.mean(seconds[args.warmup :]),
        "searches_per_episode": statistics.mean(searches[args.warmup :]),
    }


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--json", type=Path, default=None, help="Write the figures to this JSON file.")
    parser.add_argument(
        "--policy", default=None, help="Start from this policy directory (default: warm start)."
    )
    parser.add_argument("--steps", type=int, default=3, help="Timed optimizer steps per trainer.")
    parser.add_argument("--warmup", type=int, default=1, help="Untimed first steps per trainer.")
    parser.add_argument("--episodes-per-step", type=int, default=8, help="Episodes per optimizer step.")
    parser.add_argument("--num-generations", type=int, default=2, help="GRPO group size.")
    parser.add_argument(
        "--questions",
        type=int,
        default=8,
        help="Distinct training questions (>= episodes per step, for PPO).",
    )
    parser.add_argument("--max-turns", type=int, default=3, help="Turns per episode (searches: one fewer).")
    parser.add_argument("--max-episode-tokens", type=int, default=200, help="Tokens after the prompt.")
    parser.add_argument("--warm-steps", type=int, default=160, help="Supervised warm-start steps.")
    parser.add_argument("--threads", type=int, default=2, help="torch CPU threads.")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        world = build_world(work, args)
        setup_s = time.perf_counter() - t0
        ppo = time_ppo(world, work, args)
        trl_loop = time_grpo(world, work, "trl_loop", args)
        ours = time_grpo(world, work, "our_rollout", args)
    out = {
        "ppo_step_s": ppo["step_s"],
        "grpo_trl_loop_step_s": trl_loop["step_s"],
        "grpo_our_rollout_step_s": ours["step_s"],
        "ppo_searches_per_episode": ppo["searches_per_episode"],
        "grpo_trl_loop_searches_per_episode": trl_loop["searches_per_episode"],
        "grpo_our_rollout_searches_per_episode": ours["searches_per_episode"],
        "episodes_per_step": args.episodes_per_step,
        "num_generations": args.num_generations,
        "timed_steps": args.steps,
        "setup_s": setup_s,
        "device": "cuda" if torch.cuda.is_available() else "cpu",
        "torch_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
    }
    print(json.dumps(out, indent=2))
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
