"""The offline demo, end to end: the seeds' advice made concrete.

"First close the loop on an offline verifiable search task at small scale, check trajectory boundaries,
reward placement and advantage masks by eye, and use an independent evaluation to tell real progress
from reward hacking." Stages, each with a progress line and its wall-clock time:

  1. data      synthesise the world, its corpus and the train / dev / test questions
  2. index     build the BM25 index over the corpus
  3. models    train the tokenizer on the task text; build the tiny policy from a Qwen2 config
  4. expert    expert demonstrations through the real environment (with a noise knob), on the world's
               train questions and on practice worlds (its name words, other facts; see below)
  5. sft       warm-start the policy with TRL's SFTTrainer on those demonstrations (curriculum: first
               turns, then whole demonstrations)
  6. eval sft  greedy evaluation on the hidden test split (never used to choose anything), plus the same
               questions closed-book (a search engine that finds nothing): the leak check
  7. ppo       PPO from the SFT policy (critic initialised from the SFT backbone)
  8. eval ppo  the same evaluation on the same test split
  9. report    report.html, summary.json

Why practice worlds: the policy is a transformer trained from scratch, and such a model never writes a
token it was never trained to write (measured: 0% on names whose tokens were never a target, while it
copies the others perfectly). The demo world's test answers are, by construction, names that no train
question mentions. A pretrained model has written every name piece before; practice worlds give the tiny
one the same: the demo world's name words recombined into other entities with other, random facts
(`searchrl.data.synthetic.practice_world`; no practice entity carries a dev or test entity's name). Facts
of the held-out split exist only in the demo world's corpus, which the policy reads only through search;
the closed-book evaluation measures what it knows without it (expected: about 0).

Why 31 practice worlds: 16,000 demonstrations, so the first 500 whole-demonstration steps of 32 see each
one once, while the copy circuit forms. A tiny model that has seen a fact before can recall it instead of
reading it; with fresh facts every time, only copying from the observation lowers the loss. Measured on
seed 0 with the earlier 500-step recipe (dev split, PPO's step-0 evaluation): warm-start dev exact match
0.375 with 15 worlds, 0.56 with 31. The shipped 1,000 steps make a second pass after copying has formed;
the closed-book check stays at 0.00 on seeds 0, 1 and 2.

Why the expert is lazy: the SFT warm start must leave room for RL to show. The demonstrator stops after
the first hop on most two-hop questions and answers the bridge entity (`ExpertConfig.noise`, kind
``one_hop``), so the warm start copies that habit (greedy decoding follows the majority); the complete
two-hop demonstrations keep the second search within the policy's reach, and PPO's reward finds it.

Everything is generated or built here; nothing is downloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import resource
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from searchrl.common.config import ConfigError, save_config
from searchrl.common.io import write_jsonl
from searchrl.common.trajectory import write_trajectories
from searchrl.data.synthetic import SIZE_PRESETS, generate, practice_world, preset_config
from searchrl.demo.layouts import GRPO_LABELS, synthetic_demo_layout
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.evaluation.loop import evaluate_with_ppo_limits
from searchrl.evaluation.report import write_report
from searchrl.grpo.warm_start import final_policy_dir, train_grpo_from_warm_start
from searchrl.models.tiny import (
    TinyModelConfig,
    build_policy,
    load_policy,
    tokenizer_training_texts,
    train_tokenizer,
)
from searchrl.ppo.config import PPOConfig, PPOSection
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rewards.combine import default_rubric
from searchrl.run.layout import write_layout
from searchrl.run.manifest import build_manifest
from searchrl.run.writer import write_evaluation
from searchrl.search.index import build_index
from searchrl.sections import EnvironmentSection, GenerationSection, with_sections_of
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.warm_start import SFTWarmStartConfig, prompt_texts, run_sft

# A short instruction: the tiny model learns the protocol from demonstrations, not from prose; every token
# of the prompt costs time in every episode.
DEMO_SYSTEM_PROMPT = "Answer the question; search with tool calls."


def _model_default() -> TinyModelConfig:
    return TinyModelConfig(
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_key_value_heads=2,
        intermediate_size=384,
    )


def _environment_default() -> EnvironmentSection:
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


def _ppo_default() -> PPOSection:
    return PPOSection(
        output_dir="runs/demo/ppo",  # the demo writes its PPO run to <out_dir>/ppo
        learning_rate=3e-5,
        value_learning_rate=3e-4,
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
    model: TinyModelConfig = field(default_factory=_model_default, metadata={"help": "Tiny policy shape."})
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
            bf16=True,
            trl_loss=False,
            logging_steps=25,
        ),
        metadata={"help": "SFT warm start optimisation (first-turn curriculum, then whole demonstrations)."},
    )
    environment: EnvironmentSection = field(
        default_factory=_environment_default,
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
        default_factory=_ppo_default,
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
        _environment_default(), max_new_tokens_per_turn=32, max_episode_tokens=300
    )
    cfg.ppo = dataclasses.replace(
        _ppo_default(),
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


class StageClock:
    """Prints one line per stage (name, seconds) and keeps the timings for the summary."""

    def __init__(self, show: bool):
        self.show = show
        self.timings: dict[str, float] = {}

        self.console = Console(stderr=True)

    def run(self, name: str, fn: Callable[[], Any]) -> Any:
        start = time.perf_counter()
        if self.show:
            with self.console.status(f"[bold]{name}[/bold] ..."):
                out = fn()
        else:
            out = fn()
        self.timings[name] = round(time.perf_counter() - start, 2)
        if self.show:
            self.console.print(f"[green]✓[/green] {name:<10} {self.timings[name]:>7.1f} s")
        return out


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def _eval_split(policy, tok, rows, env_factory, cfg: DemoConfig, rubric) -> tuple[dict, list]:
    stage = cfg.ppo_config()
    result = evaluate_with_ppo_limits(policy, tok, rows, env_factory, stage, rubric=rubric, seed=cfg.seed)
    return result.summary, result.trajectories


class FindsNothing:
    """A search engine that returns no document: the closed-book evaluation (what the policy knows alone)."""

    fingerprint = "finds-nothing"

    def search(self, queries: list[str], k: int) -> list[list[Any]]:
        return [[] for _ in queries]


def _headline(summary: dict) -> dict[str, float]:
    keys = HEADLINE_METRICS
    out = {k: summary[k] for k in keys if k in summary}
    out["ci95"] = {k: summary["ci95"][k] for k in keys if k in summary.get("ci95", {})}
    out["by_hops"] = {h: {k: g[k] for k in keys if k in g} for h, g in summary.get("by_hops", {}).items()}
    return out


@dataclass
class DemoWorld:
    """What the demo's first four stages produce: the task and its splits, the search engine, the tokenizer,
    the untrained policy and the expert demonstrations (also what `benchmarks/warm_start_seeds.py` reuses)."""

    task: Any
    train_rows: list[dict]
    dev_rows: list[dict]
    test_rows: list[dict]
    backend: Any
    tokenizer: Any
    policy: Any
    demos: list
    env_config: Any

    def env_factory(self) -> SearchEnvironment:
        return SearchEnvironment(self.backend, self.env_config, tokenizer=self.tokenizer)


def check_demo_config(cfg: DemoConfig) -> None:
    if cfg.expert.k != cfg.environment.topk:
        raise ConfigError(
            f"expert.k={cfg.expert.k} but environment.topk={cfg.environment.topk}: the demonstrations would show "
            "a different number of documents per search than training and evaluation; set them equal"
        )


def prepare_world(cfg: DemoConfig, out: Path, clock: StageClock) -> DemoWorld:
    """Stages 1-4: data, index, tokenizer and policy, expert demonstrations (written under `out`)."""
    data_dir = out / "data"

    # 1. data ------------------------------------------------------------------------------------
    def make_data():
        task = generate(preset_config(cfg.size, seed=cfg.seed))
        task.write(data_dir)
        return task

    task = clock.run("data", make_data)
    train_rows = task.splits["train"][: cfg.train_questions]
    test_rows = task.splits["test"][: cfg.test_questions]
    dev_rows = task.splits["dev"]

    # 2. index -----------------------------------------------------------------------------------
    backend = clock.run(
        "index", lambda: build_index(data_dir / "corpus.jsonl", out / "index", overwrite=True)
    )
    backend.search(["warm up"], 1)  # compile the numba scorer before any deadline runs

    env_config = cfg.environment.env_config()  # one environment for demonstrations, training and evaluation

    # 3. models ----------------------------------------------------------------------------------
    def make_models():
        # The rendered system prompt joins the tokenizer's training text, so it costs few tokens.
        probe = SearchEnvironment(backend, env_config)
        texts = tokenizer_training_texts(task.corpus, task.splits["train"]) + prompt_texts(probe, train_rows)
        tok = train_tokenizer(texts, vocab_size=cfg.vocab_size)
        policy = build_policy(tok, cfg.model)
        return tok, policy

    tok, policy = clock.run("models", make_models)

    # 4. expert demonstrations: the world's train questions, then each practice world's ----------------
    def make_demos():
        expert = ExpertPolicy(cfg.expert)

        def demonstrate(rows: list[dict], make_env: Callable[[], SearchEnvironment]) -> list:
            demos = []
            for i in range(0, len(rows), 64):
                chunk = rows[i : i + 64]
                demos.extend(expert.demonstrate(None, tok, [make_env() for _ in chunk], chunk))
            return demos

        demos = demonstrate(train_rows, lambda: SearchEnvironment(backend, env_config, tokenizer=tok))
        for w in range(cfg.practice_worlds):
            world = practice_world(task, seed=cfg.seed + 1000 + w, train_questions=cfg.practice_questions)
            world_dir = out / "practice" / f"world-{w}"
            write_jsonl(world_dir / "corpus.jsonl", world.corpus)
            world_backend = build_index(world_dir / "corpus.jsonl", world_dir / "index", overwrite=True)
            demos.extend(
                demonstrate(
                    world.splits["train"],
                    lambda b=world_backend: SearchEnvironment(b, env_config, tokenizer=tok),
                )
            )
        write_trajectories(out / "sft" / "expert.jsonl.gz", demos)
        return demos

    demos = clock.run("expert", make_demos)
    return DemoWorld(task, train_rows, dev_rows, test_rows, backend, tok, policy, demos, env_config)


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run every stage; returns the summary written to `<out_dir>/summary.json`."""
    check_demo_config(cfg)
    t_start = time.perf_counter()
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    save_config(cfg, out / "demo_config.yaml")
    layout = synthetic_demo_layout(cfg.compare_grpo)
    write_layout(out, layout)  # now, so that a running demo can be viewed
    clock = StageClock(cfg.progress_bar)
    world = prepare_world(cfg, out, clock)
    tok, policy, demos, backend = world.tokenizer, world.policy, world.demos, world.backend
    train_rows, dev_rows, test_rows = world.train_rows, world.dev_rows, world.test_rows
    env_config, env_factory = world.env_config, world.env_factory

    # 5. SFT warm start ------------------------------------------------------------------------------
    sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
    sft = clock.run("sft", lambda: run_sft(policy, tok, demos, sft_cfg))
    sft_dir = out / "sft" / "policy"
    sft.policy.save_pretrained(sft_dir)
    tok.save_pretrained(sft_dir)
    rubric = default_rubric()

    # 6. evaluate the warm start on the hidden test split ---------------------------------------------
    sft_summary, sft_trajs = clock.run(
        "eval sft", lambda: _eval_split(sft.policy, tok, test_rows, env_factory, cfg, rubric)
    )
    write_evaluation(out / "eval" / "sft-test.json", sft_summary, sft_trajs)

    def closed_book_env() -> SearchEnvironment:
        return SearchEnvironment(FindsNothing(), env_config, tokenizer=tok)

    closed_summary, _ = clock.run(
        "closed book", lambda: _eval_split(sft.policy, tok, test_rows, closed_book_env, cfg, rubric)
    )
    write_evaluation(out / "eval" / "sft-test-closed-book.json", closed_summary)

    # 7. PPO from the warm start -----------------------------------------------------------------------
    ppo_args = cfg.ppo_config()

    def train_ppo():
        trainer = PPOTrainer(
            ppo_args,
            tok,
            sft.policy,
            None,
            None,
            train_rows,
            reward_funcs=rubric,
            environment=env_factory,
            eval_dataset=dev_rows,
        )
        trainer.train()
        return trainer

    trainer = clock.run("ppo", train_ppo)

    # 8. evaluate PPO on the same split -----------------------------------------------------------------
    ppo_summary, ppo_trajs = clock.run(
        "eval ppo", lambda: _eval_split(trainer.policy, tok, test_rows, env_factory, cfg, rubric)
    )
    write_evaluation(out / "eval" / "ppo-test.json", ppo_summary, ppo_trajs)

    # 9. summary and report ---------------------------------------------------------------------------
    summary: dict[str, Any] = {
        "sft": {
            "test": _headline(sft_summary),
            "closed_book_test": _headline(closed_summary),
            "final_loss": sft.losses[-1] if sft.losses else None,
        },
        "ppo": {"test": _headline(ppo_summary), "steps": trainer.global_step, "episodes": trainer.episode},
        "stages_seconds": clock.timings,
        "wall_seconds": round(time.perf_counter() - t_start, 1),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "num_demonstrations": len(demos),
        "practice_worlds": cfg.practice_worlds,
        "test_questions": len(test_rows),
        "manifest": build_manifest(
            seeds={"seed": cfg.seed}, tokenizer=tok, index_fingerprint=backend.fingerprint
        ),
    }
    summary["improvement_exact_match"] = (
        summary["ppo"]["test"]["exact_match"] - summary["sft"]["test"]["exact_match"]
    )

    # 8b. optional: GRPO in both modes from the same warm start, on the PPO stage's budget -------------
    compare: dict[str, Path] | None = None
    if cfg.compare_grpo:
        compare = {"PPO": out / "ppo"}
        for mode, label in GRPO_LABELS.items():
            policy_dir = clock.run(
                f"grpo {mode}",
                lambda mode=mode: _train_grpo(
                    mode, sft_dir, tok, train_rows, dev_rows, backend, rubric, out, ppo_args
                ),
            )
            grpo_policy = load_policy(policy_dir)
            grpo_summary, _ = clock.run(
                f"eval grpo {mode}",
                lambda p=grpo_policy: _eval_split(p, tok, test_rows, env_factory, cfg, rubric),
            )
            write_evaluation(out / f"grpo_{mode}" / "eval" / "test-final.json", grpo_summary)
            summary[f"grpo_{mode}"] = {"test": _headline(grpo_summary)}
            compare[label] = out / f"grpo_{mode}"
    write_layout(out, layout, summary)
    clock.run("report", lambda: _write_report(out, summary, compare))
    summary["wall_seconds"] = round(time.perf_counter() - t_start, 1)
    summary["peak_rss_mb"] = round(peak_rss_mb(), 1)
    write_layout(out, layout, summary)
    return summary


def _train_grpo(mode, sft_dir, tok, train_rows, dev_rows, backend, rubric, out, ppo_args) -> Path:
    """GRPO from the SFT directory with every section it shares with PPO taken from the PPO stage."""
    # transformers prints its end-of-training metrics dict on stdout; the demo's stdout is its JSON headline.
    with contextlib.redirect_stdout(sys.stderr):
        run_dir = train_grpo_from_warm_start(
            sft_dir,
            tok,
            train_rows,
            dev_rows,
            backend,
            rubric,
            mode=mode,
            total_episodes=int(ppo_args.total_episodes),
            out_dir=out / f"grpo_{mode}",
            ppo_config=ppo_args,
        )
    return final_policy_dir(run_dir)


def _write_report(out: Path, summary: dict, compare: dict[str, Path] | None = None) -> None:
    write_report(out / "ppo", out=out / "report.html", summary=summary, compare=compare)
