"""The customer-service demo's settings (`searchrl demo --task support`, `searchrl.demo.support`).

Why apart from `searchrl.demo.configs`: that module holds the synthetic demo and the real loop side by side and is
near the size limit; this demo shares their sections (environment, generation, PPO, SFT) and builds its PPO
stage with the same `stage_ppo_config`, and starts from the synthetic demo's settings, so what differs is what
this module's fields say.

The recipe: the synthetic demo's tiny model, warm start and PPO stage, with a small BPE vocabulary (every digit
of an order id is one token either way, and a smaller softmax is faster). The warm start first learns span
copying (`copy_pretrain_steps`: continuing a span of its context, the induction circuit a pretrained model
brings), then the first-turn curriculum (copying an order id or an item out of the question), then the whole
demonstrations (reading one out of an observation).
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
    # 400 steps of span copying over whole demonstrations (a window of 512 tokens holds any of them), 300
    # first-turn steps, then 400 whole-demonstration steps (stable, then decaying), no copy gate. Measured on
    # seed 0 (docs/support.md): without span copying the tiny model copies from the question by position only
    # and reads order ids, dates and items out of observations poorly (1,300 steps of the synthetic demo's
    # recipe: test task success 0.39; the same 700 later steps alone: 0.18); span copying over whole
    # demonstrations gave 0.53, over 128-token windows 0.29.
    return dataclasses.replace(
        DemoConfig().sft, copy_pretrain_steps=400, copy_pretrain_window=512, max_steps=400, copy_gate=0.0
    )


def _support_ppo() -> PPOSection:
    return dataclasses.replace(DemoConfig().ppo, output_dir="runs/demo-support/ppo")


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
        default="names",
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
        default=0.5, metadata={"help": "Reward lost per permission-denied call (the rubric's own term)."}
    )
    answer_f1_weight: float = field(
        default=0.0,
        metadata={
            "help": "Weight of the answer's token F1 in PPO's reward, beside exact match's 1.0: partial credit "
            "for a status read with a wrong day ('delivered on 29 April' against '... 19 April': F1 0.75), where "
            "the lazy 'shipped' earns 0. 0 = exact match only (F1 logged beside it)."
        },
    )
    reading_kinds: list[str] = field(
        default_factory=lambda: ["order_id"],
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
    # and check the recipe has.
    cfg.sft = dataclasses.replace(
        smoke.sft,
        num_train_epochs=1,
        copy_pretrain_steps=2,
        copy_pretrain_batch_size=8,
        copy_pretrain_learning_rate=1e-3,
        copy_pretrain_task_share=0.5,
        copy_replay_share=0.2,
        # The copy phase's gate, out of reach: measured after the phase, then one chunk of 2 steps more.
        copy_pretrain_gate=1.0,
        copy_pretrain_gate_max_steps=2,
        copy_gate_chunk=2,
    )
    cfg.reading_kinds = list(READING_KINDS)
    cfg.environment = dataclasses.replace(_support_environment(), max_new_tokens_per_turn=32)
    cfg.ppo = dataclasses.replace(smoke.ppo, total_episodes=16, num_eval_questions=12)
    return cfg
