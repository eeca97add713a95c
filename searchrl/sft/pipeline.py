"""The whole warm start, data in and tuned model out: what `searchrl sft` runs.

What: `run_warm_start_pipeline` demonstrates questions with the expert through the real environment, trains the
tokenizer and tiny policy when no model is given, runs the SFT warm start (`searchrl.sft.warm_start.run_sft`)
and saves the model; `SFTRunConfig` is its YAML. `prompt_texts` (the rendered system prompt, for training a tiny
tokenizer) and the greedy tool-call rate of first turns serve the demos too.

Why apart from `searchrl.sft.warm_start`: that module is the trainer (its phases, schedule and loss); this one
is a pipeline around it, and each stays readable on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from transformers import PreTrainedModel, PreTrainedTokenizerBase

from searchrl.common.io import atomic_write_json
from searchrl.common.trajectory import Trajectory, write_trajectories
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import parse_turn
from searchrl.models.io import load_policy, load_tokenizer, save_model_dir
from searchrl.models.tiny import TinyModelConfig, build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rollout.chat import render_conversation
from searchrl.rollout.generator import GenerationConfig, HFGenerator
from searchrl.sections import EnvironmentSection
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft


@dataclass
class SFTRunConfig:
    """Everything `searchrl sft` needs besides paths: expert, training, environment and tiny-model shape."""

    expert: ExpertConfig = field(
        default_factory=ExpertConfig, metadata={"help": "Expert demonstrations (noise knob, k, seed)."}
    )
    train: SFTWarmStartConfig = field(
        default_factory=SFTWarmStartConfig, metadata={"help": "SFTTrainer optimisation settings."}
    )
    environment: EnvironmentSection = field(
        default_factory=EnvironmentSection,
        metadata={
            "help": "The episode the expert demonstrates in (the same section PPO, GRPO and the demos use): "
            "protocol, prompt, citations, turns, searches, top-k, token budgets."
        },
    )
    model: TinyModelConfig = field(
        default_factory=TinyModelConfig, metadata={"help": "Shape of the tiny policy built when no --model."}
    )
    vocab_size: int = field(default=2048, metadata={"help": "BPE vocabulary of the tiny tokenizer."})
    split: str = field(
        default="train", metadata={"help": "Split of --data whose questions are demonstrated."}
    )
    limit: int | None = field(default=None, metadata={"help": "Demonstrate only the first N questions."})
    demo_batch_size: int = field(default=32, metadata={"help": "Rows per batched expert rollout."})
    eval_questions: int = field(
        default=50, metadata={"help": "Dev questions for the post-SFT greedy tool-call check; 0 = skip."}
    )


def prompt_texts(env: Any, rows: Sequence[dict[str, Any]], copies: int = 20) -> list[str]:
    """The rendered system prompt (with the tool schema) repeated, for training the tiny tokenizer.

    Without it the BPE, trained on documents and questions, spells the fixed tool schema in hundreds of
    byte-level pieces; with it the prompt is about half as long, which halves SFT and rollout cost.
    """
    if not rows:
        return []
    scratch = train_tokenizer(["searchrl"], vocab_size=300)  # only its chat template is used here
    system = env.reset(dict(rows[0]))[:1]
    return [render_conversation(scratch, system, env.tools)] * copies


def first_turn_tool_call_rate(trajectories: Sequence[Trajectory]) -> float:
    """Share of trajectories whose first turn is one or more well-formed, schema-valid tool calls."""
    if not trajectories:
        return 0.0
    good = 0
    for traj in trajectories:
        texts = traj.action_texts
        turn = parse_turn(texts[0] if texts else "")
        good += bool(turn.tool_calls) and not turn.malformed and all(c.ok for c in turn.tool_calls)
    return good / len(trajectories)


def run_warm_start_pipeline(
    rows: Sequence[dict[str, Any]],
    corpus_rows: Sequence[dict[str, Any]],
    index_dir: str | Path,
    out_dir: str | Path,
    config: SFTRunConfig | None = None,
    model_path: str | Path | None = None,
    dev_rows: Sequence[dict[str, Any]] = (),
) -> dict[str, Any]:
    """Demonstrate `rows` with the expert, SFT on them, save `out_dir/model`; returns a summary dict."""
    from searchrl.search.index import open_backend  # bm25s and numba: when demonstrations are made

    config = config or SFTRunConfig()
    env_config = config.environment.env_config()
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    backend = open_backend(index_dir)
    if model_path is not None:
        tokenizer, policy = load_tokenizer(model_path), load_policy(model_path)
    else:
        probe = SearchEnvironment(backend, env_config)
        texts = tokenizer_training_texts(corpus_rows, rows) + prompt_texts(probe, rows)
        tokenizer = train_tokenizer(texts, vocab_size=config.vocab_size)
        policy = build_policy(tokenizer, config.model)
    expert = ExpertPolicy(config.expert)
    demos: list[Trajectory] = []
    for start in range(0, len(rows), config.demo_batch_size):
        chunk = list(rows[start : start + config.demo_batch_size])
        envs = [SearchEnvironment(backend, env_config, tokenizer=tokenizer) for _ in chunk]
        demos.extend(expert.demonstrate(policy, tokenizer, envs, chunk))
    write_trajectories(out / "demonstrations.jsonl.gz", demos)
    outcome = run_sft(policy, tokenizer, demos, config.train)
    save_model_dir(outcome.policy, tokenizer, out / "model")
    kinds: dict[str, int] = {}
    for d in demos:
        kinds[str(d.metadata.get("expert_kind"))] = kinds.get(str(d.metadata.get("expert_kind")), 0) + 1
    summary: dict[str, Any] = {
        "demonstrations": len(demos),
        "kinds": kinds,
        "trained_tokens": outcome.trained_tokens,
        "first_loss": outcome.losses[0] if outcome.losses else None,
        "last_loss": outcome.losses[-1] if outcome.losses else None,
        "model_dir": str(out / "model"),
    }
    if dev_rows and config.eval_questions > 0:
        summary["dev_tool_call_rate"] = dev_tool_call_rate(
            outcome.policy, tokenizer, backend, env_config, list(dev_rows)[: config.eval_questions]
        )
    atomic_write_json(out / "sft_metrics.json", {**summary, "losses": outcome.losses, **outcome.metrics})
    return summary


def dev_tool_call_rate(
    policy: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    backend: Any,
    env_config: EnvConfig,
    rows: Sequence[dict[str, Any]],
    max_new_tokens: int = 64,
) -> float:
    """Greedy first turns on `rows` through the real environment; share that are well-formed tool calls."""
    one_turn = dataclasses.replace(env_config, max_turns=1)  # only the first turn is judged
    envs = [SearchEnvironment(backend, one_turn, tokenizer=tokenizer) for _ in rows]
    generation = GenerationConfig(temperature=0.0, max_new_tokens_per_turn=max_new_tokens)
    batch = HFGenerator(policy, tokenizer, generation).rollout(envs, list(rows))
    return first_turn_tool_call_rate(batch.trajectories)
