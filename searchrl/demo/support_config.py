"""The customer-service demo's settings (`searchrl demo --task support`, `searchrl.demo.support`).

Why apart from `searchrl.demo.configs`: that module holds the synthetic demo and the real loop side by side and is
near the size limit; this demo shares their sections (environment, generation, PPO, SFT) and builds its PPO
stage with the same `stage_ppo_config`, and starts from the synthetic demo's settings, so what differs is what
this module's fields say.

The recipe (docs/support.md, "The default"): the synthetic demo's tiny model with a small BPE vocabulary whose
`reading` split writes numbers two digits a token with their space (a date or an order id read out of a tool's
output is the same one to three tokens in the record and in the answer). The warm start first learns the copies
the task needs from the expert's reading examples (an order id out of a search result, a status or item out of
a record, the item into the first search), at 1e-3 and gated on held-out examples (the copies form after a
number of steps that depends on the draw), then the first-turn curriculum and the whole demonstrations with
those examples replayed. PPO at 1e-4 for 2,560 episodes, with partial credit for the answer's F1 (a look-up
that reads the status with a wrong day earns something, the lazy "shipped" nothing) and a denied call costing 1.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Literal

from searchrl.common.config import ConfigError
from searchrl.data.support import SupportConfig
from searchrl.demo.configs import DemoConfig, smoke_config, stage_ppo_config
from searchrl.models.tiny import TinyModelConfig, split_error
from searchrl.ppo.config import PPOConfig, PPOSection
from searchrl.sections import EnvironmentSection, GenerationSection
from searchrl.sft.support_expert import READING_KINDS, SupportExpertConfig, reading_kinds_error
from searchrl.sft.warm_start import SFTWarmStartConfig

# Names the tools (the prompt has no tool schema): the tiny model learns their use from demonstrations.
SUPPORT_SYSTEM_PROMPT = "Help the customer; tools: search, get_order."


def _support_environment() -> EnvironmentSection:
    # "where" with a followed injection: search, get_order, get_order (denied), answer: four turns, three calls.
    return dataclasses.replace(
        DemoConfig().environment, system_prompt=SUPPORT_SYSTEM_PROMPT, max_episode_tokens=480
    )


def _support_sft() -> SFTWarmStartConfig:
    # 800 span-copy steps of the expert's reading examples only (an order id out of a search result, a status or
    # item out of a record, the item into the first search) at 1e-3, gated: until 0.85 of held-out copy examples of
    # every group (kind and question type) are reproduced the phase goes on, 200 steps at a time, at most 800 more
    # (the copies form after a number of steps that depends on the draw: seed 0's status copy had not formed by step
    # 800 without the gate). Then 300 first-turn steps and 400 whole-demonstration steps, every phase at 1e-3 with
    # 40% of its examples the reading examples again (replayed, so the copies stay while the task is learned).
    # docs/support.md: why each (the learning rate, the reading split, the examples, the gate).
    return dataclasses.replace(
        DemoConfig().sft,
        learning_rate=1e-3,
        max_steps=400,
        copy_gate=0.0,
        copy_pretrain_steps=800,
        copy_pretrain_window=512,
        copy_pretrain_learning_rate=1e-3,
        copy_pretrain_task_share=1.0,
        copy_replay_share=0.4,
        copy_pretrain_gate=0.85,
        copy_pretrain_gate_max_steps=800,
        copy_gate_chunk=200,
    )


def _support_ppo() -> PPOSection:
    # 2,560 episodes at 1e-4 (the synthetic demo's 640 at 3e-5 turned look-ups down: docs/support.md).
    return dataclasses.replace(
        DemoConfig().ppo, output_dir="runs/demo-support/ppo", total_episodes=2560, learning_rate=1e-4
    )


@dataclass
class SupportDemoConfig:
    """Every knob of the customer-service demo (`searchrl demo --task support`, docs/support.md)."""

    kind: Literal["support"] = field(
        default="support",
        metadata={
            "help": "Marks a demo YAML as the customer-service demo: `searchrl demo --config` runs it."
        },
    )
    out_dir: str = field(default="runs/demo-support", metadata={"help": "Run directory the demo writes."})
    seed: int = field(default=0, metadata={"help": "Seed of the store, models, rollouts and training."})
    task: SupportConfig = field(
        default_factory=lambda: SupportConfig(customers=2000, train_questions=6000),
        metadata={"help": "The generated store and its questions (its seed is the demo's `seed`)."},
    )
    vocab_size: int = field(
        default=1024,
        metadata={"help": "BPE vocabulary trained on the task text (small: a smaller, faster softmax)."},
    )
    tokenizer_split: str = field(
        default="reading",
        metadata={
            "help": "The BPE's split regex (`searchrl.models.tiny.SPLIT_REGEXES`): names (the synthetic demo's: "
            "one digit a token, a capitalised word apart from the space before it) or reading (numbers in "
            "tokens of up to two digits and words with the space before them, so a date or an order id read "
            "out of a tool's output is one to three tokens, the same in the record and in the answer)."
        },
    )
    num_threads: int = field(default=2, metadata={"help": "torch CPU threads."})
    model: TinyModelConfig = field(
        default_factory=lambda: dataclasses.replace(DemoConfig().model),
        metadata={"help": "Tiny policy shape."},
    )
    expert: SupportExpertConfig = field(
        default_factory=SupportExpertConfig,
        metadata={"help": "Expert demonstrations and their imperfections (room left for RL)."},
    )
    permission_denied_penalty: float = field(
        default=1.0, metadata={"help": "Reward lost per permission-denied call (the rubric's own term)."}
    )
    answer_f1_weight: float = field(
        default=0.5,
        metadata={
            "help": "Weight of the answer's token F1 in PPO's reward, beside exact match's 1.0: partial credit "
            "for a status read with a wrong day ('delivered on 29 April' against '... 19 April': F1 0.75), where "
            "the lazy 'shipped' earns 0. 0 = exact match only (F1 logged beside it)."
        },
    )
    reading_kinds: list[str] = field(
        default_factory=lambda: list(READING_KINDS),
        metadata={
            "help": "The task's copy examples the warm start draws from when `sft.copy_pretrain_task_share` or "
            "`sft.copy_replay_share` is > 0 (`searchrl.sft.support_expert.reading_examples`): order_id (the id "
            "out of a search result), answer (a status or item out of the last observation), query (the item "
            "out of the question into the first search)."
        },
    )
    sft: SFTWarmStartConfig = field(
        default_factory=_support_sft,
        metadata={"help": "SFT warm start optimisation (first-turn curriculum, then whole demonstrations)."},
    )
    environment: EnvironmentSection = field(
        default_factory=_support_environment,
        metadata={"help": "The episode of every stage (turns, calls, top-k, token budgets, the prompt)."},
    )
    generation: GenerationSection = field(
        default_factory=lambda: GenerationSection(temperature=1.0),
        metadata={"help": "Sampling of PPO's rollouts (every evaluation is greedy)."},
    )
    ppo: PPOSection = field(
        default_factory=_support_ppo,
        metadata={"help": "PPO stage: PPO's own fields, batch, optimiser and evaluation cadence (on dev)."},
    )
    progress_bar: bool = field(default=True, metadata={"help": "Show a progress line per stage."})
    reuse_warm_start: bool = field(
        default=False,
        metadata={
            "help": "Keep the SFT warm start `out_dir` already holds when it was trained with the same settings "
            "(all but out_dir, num_threads, ppo, generation, permission_denied_penalty, answer_f1_weight, "
            "progress_bar): the store and index are rebuilt, the tokenizer, SFT policy and demonstrations read "
            "back, and both evaluations, PPO, the audit and the report run again (`searchrl.demo.support_reuse`). "
            "Otherwise every stage runs, and the demo says why."
        },
    )

    def __post_init__(self) -> None:
        why = reading_kinds_error(self.reading_kinds)
        if why:
            raise ConfigError(f"reading_kinds: {why}")
        if why := split_error(self.tokenizer_split):
            raise ConfigError(f"tokenizer_split: {why}")
        if not 0.0 <= self.answer_f1_weight <= 1.0:
            raise ConfigError(f"answer_f1_weight: a weight in [0, 1], got {self.answer_f1_weight}")

    def ppo_config(self) -> PPOConfig:
        """The PPO stage's settings (`stage_ppo_config`): what PPO trains with and every evaluation's limits."""
        return stage_ppo_config(self)


def support_smoke_config(out_dir: str = "runs/demo-support-smoke", seed: int = 0) -> SupportDemoConfig:
    """The same stages at toy size (CI and tests): a small store, a very small model, a few steps."""
    smoke = smoke_config(out_dir, seed)
    task = SupportConfig(customers=60, train_questions=96, dev_questions=12, test_questions=12)
    model: TinyModelConfig = smoke.model
    cfg = SupportDemoConfig(out_dir=out_dir, seed=seed, task=task, vocab_size=700, model=model)
    # A few span-copy steps, half of them the expert's reading examples at their own rate, gated, and those
    # examples replayed in the later phases (every kind of them), so that the smoke run goes through every phase
    # and check the default has.
    cfg.sft = dataclasses.replace(
        smoke.sft,
        num_train_epochs=1,
        copy_pretrain_steps=2,
        copy_pretrain_batch_size=8,
        copy_pretrain_learning_rate=1e-3,
        copy_pretrain_task_share=0.5,
        copy_replay_share=0.2,
        # The default's gate, out of reach: measured after the phase, then one chunk of 2 steps more.
        copy_pretrain_gate=1.0,
        copy_pretrain_gate_max_steps=2,
        copy_gate_chunk=2,
    )
    cfg.reading_kinds = list(READING_KINDS)
    cfg.environment = dataclasses.replace(_support_environment(), max_new_tokens_per_turn=32)
    cfg.ppo = dataclasses.replace(smoke.ppo, total_episodes=16, num_eval_questions=12)
    return cfg
