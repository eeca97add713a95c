"""The offline demo, end to end: the seeds' advice made concrete.

"First close the loop on an offline verifiable search task at small scale, check trajectory boundaries,
reward placement and advantage masks by eye, and use an independent evaluation to tell real progress
from reward hacking." Stages, each through the demos' stage runner (`searchrl.demo.stages`: a progress line,
wall and CPU seconds, peak RSS):

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

The settings are `searchrl.demo.configs.DemoConfig` (beside the real loop's); the summary's per-stage entries
come from `searchrl.demo.summary`, as the real loop's do. Everything is generated or built here; nothing is
downloaded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from searchrl.common.config import save_config
from searchrl.common.io import write_jsonl
from searchrl.common.trajectory import read_trajectories, write_trajectories
from searchrl.data.synthetic import generate, practice_world, preset_config
from searchrl.demo.configs import DemoConfig, check_demo_config
from searchrl.demo.layouts import GRPO_LABELS, synthetic_demo_layout
from searchrl.demo.reuse import ReusedWarmStart, warm_start_if_asked
from searchrl.demo.stages import StageProgress, StageRunner
from searchrl.demo.summary import headline, learning_figures, paired_figures, stage_figures
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.loop import evaluate_with_ppo_limits
from searchrl.evaluation.report import write_report
from searchrl.grpo.warm_start import final_policy_dir, train_grpo_from_warm_start
from searchrl.models.io import load_policy, load_tokenizer, save_model_dir
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.ppo.trainer import PPOTrainer
from searchrl.rewards.combine import default_rubric
from searchrl.run.layout import write_layout
from searchrl.run.manifest import build_manifest
from searchrl.run.writer import write_evaluation
from searchrl.search.faults import FindsNothing
from searchrl.search.index import build_index
from searchrl.sft.copy_check import answer_copy_rate, warn_if_not_copying
from searchrl.sft.expert import ExpertPolicy
from searchrl.sft.pipeline import prompt_texts
from searchrl.sft.warm_start import run_sft, sft_total_steps


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
    num_demonstrations: int = 0

    def env_factory(self) -> SearchEnvironment:
        return SearchEnvironment(self.backend, self.env_config, tokenizer=self.tokenizer)

    def closed_book_env(self) -> SearchEnvironment:
        """The same environment with a search engine that finds nothing (the leak check)."""
        return SearchEnvironment(FindsNothing(), self.env_config, tokenizer=self.tokenizer)


def prepare_world(
    cfg: DemoConfig, out: Path, runner: StageRunner, reused: ReusedWarmStart | None = None
) -> DemoWorld:
    """Stages 1-4: data, index, tokenizer and policy, expert demonstrations (written under `out`).

    With `reused` (`searchrl.demo.reuse`), stages 3 and 4 read the warm start back instead: its tokenizer and
    SFT policy, and no demonstrations (only their count)."""
    data_dir = out / "data"

    # 1. data ------------------------------------------------------------------------------------
    def make_data():
        task = generate(preset_config(cfg.size, seed=cfg.seed))
        task.write(data_dir)
        return task

    task = runner.run("data", make_data)
    train_rows = task.splits["train"][: cfg.train_questions]
    test_rows = task.splits["test"][: cfg.test_questions]
    dev_rows = task.splits["dev"]

    # 2. index -----------------------------------------------------------------------------------
    backend = runner.run(
        "index", lambda: build_index(data_dir / "corpus.jsonl", out / "index", overwrite=True)
    )
    backend.search(["warm up"], 1)  # compile the numba scorer before any deadline runs

    env_config = cfg.environment.env_config()  # one environment for demonstrations, training and evaluation

    if reused is not None:
        tok, policy = runner.run(
            "models", lambda: (load_tokenizer(reused.policy_dir), load_policy(reused.policy_dir))
        )
        return DemoWorld(task, train_rows, dev_rows, test_rows, backend, tok, policy, [], env_config,
                         num_demonstrations=reused.num_demonstrations)  # fmt: skip

    # 3. models ----------------------------------------------------------------------------------
    def make_models():
        # The rendered system prompt joins the tokenizer's training text, so it costs few tokens.
        probe = SearchEnvironment(backend, env_config)
        texts = tokenizer_training_texts(task.corpus, task.splits["train"]) + prompt_texts(probe, train_rows)
        tok = train_tokenizer(texts, vocab_size=cfg.vocab_size)
        policy = build_policy(tok, cfg.model)
        return tok, policy

    tok, policy = runner.run("models", make_models)

    # 4. expert demonstrations: the world's train questions, then each practice world's ----------------
    def make_demos(progress: StageProgress) -> list:
        expert = ExpertPolicy(cfg.expert)

        def demonstrate(rows: list[dict], make_env: Callable[[], SearchEnvironment]) -> list:
            demos = []
            for i in range(0, len(rows), 64):
                chunk = rows[i : i + 64]
                demos.extend(expert.demonstrate(None, tok, [make_env() for _ in chunk], chunk))
            progress.advance(1)  # one world demonstrated
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

    demos = runner.run_with_progress("expert", make_demos, total=1 + cfg.practice_worlds)
    return DemoWorld(
        task, train_rows, dev_rows, test_rows, backend, tok, policy, demos, env_config, len(demos)
    )


def run_demo(cfg: DemoConfig) -> dict[str, Any]:
    """Run every stage; returns the summary written to `<out_dir>/summary.json`."""
    check_demo_config(cfg)
    runner = StageRunner(cfg.progress_bar)
    torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    out = Path(cfg.out_dir)
    out.mkdir(parents=True, exist_ok=True)
    reused = warm_start_if_asked(cfg, out)  # before this run's config replaces the saved one
    save_config(cfg, out / "demo_config.yaml")
    layout = synthetic_demo_layout(cfg.compare_grpo)
    write_layout(out, layout)  # now, so that a running demo can be viewed
    world = prepare_world(cfg, out, runner, reused)
    tok, demos = world.tokenizer, world.demos
    rubric = default_rubric()

    def evaluate(stage: str, policy: Any, env_factory: Callable[[], SearchEnvironment]) -> tuple[dict, list]:
        """Stage `stage`: `policy` on the hidden test split, greedy, with the PPO stage's limits."""
        return runner.run_with_progress(
            stage,
            lambda progress: _evaluate_test_split(cfg, policy, world, env_factory, rubric, progress),
            total=len(world.test_rows),
        )

    # 5. SFT warm start ------------------------------------------------------------------------------
    if reused is None:
        sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
        sft = runner.run_with_progress(
            "sft",
            lambda progress: run_sft(
                world.policy, tok, demos, sft_cfg, callbacks=[progress.trainer_callback()]
            ),
            total=sft_total_steps(sft_cfg, len(demos)),
        )
        sft_policy, sft_losses, copy_gate = sft.policy, sft.losses, sft.copy_gate
        sft_dir = save_model_dir(sft_policy, tok, out / "sft" / "policy")
    else:
        sft_policy, sft_dir = world.policy, reused.policy_dir
        sft_losses = [] if reused.final_loss is None else [reused.final_loss]
        copy_gate = reused.copy_gate
    # Did the warm start learn to copy answers out of observations? Without it PPO has no answer reward to
    # learn from (issue 25's seed 9). Teacher-forced on the last demonstrations: no random number is drawn.
    # A reused warm start's rate was measured when it was trained (the same weights and demonstrations).
    copy_rate = reused.answer_copy_rate if reused is not None else None
    if copy_rate is None:
        copy_rate = answer_copy_rate(sft_policy, demos or read_trajectories(out / "sft" / "expert.jsonl.gz"))
    warn_if_not_copying(copy_rate)

    # 6. evaluate the warm start on the hidden test split, and closed-book (the leak check) ---------------
    sft_summary, sft_trajs = evaluate("eval sft", sft_policy, world.env_factory)
    write_evaluation(out / "eval" / "sft-test.json", sft_summary, sft_trajs)
    closed_summary, _ = evaluate("closed book", sft_policy, world.closed_book_env)
    write_evaluation(out / "eval" / "sft-test-closed-book.json", closed_summary)

    # 7. PPO from the warm start -----------------------------------------------------------------------
    ppo_args = cfg.ppo_config()
    trainer = runner.run_with_progress(
        "ppo", lambda progress: _train_ppo(ppo_args, world, sft_policy, rubric, progress)
    )

    # 8. evaluate PPO on the same split -----------------------------------------------------------------
    ppo_summary, ppo_trajs = evaluate("eval ppo", trainer.policy, world.env_factory)
    write_evaluation(out / "eval" / "ppo-test.json", ppo_summary, ppo_trajs)

    # 9. summary and report ---------------------------------------------------------------------------
    summary: dict[str, Any] = {
        "sft": {
            "test": headline(sft_summary),
            "closed_book_test": headline(closed_summary),
            "final_loss": sft_losses[-1] if sft_losses else None,
            "answer_copy_rate": copy_rate,
            "copy_gate": copy_gate,  # the gate's measurements: whole-phase step, answer-copy rate
        },
        "ppo": {
            "test": headline(ppo_summary),
            "steps": trainer.global_step,
            "episodes": trainer.episode,
            "learning": learning_figures(out / "ppo"),
        },
        **stage_figures(runner),
        **runner.totals(),
        "num_demonstrations": world.num_demonstrations,
        "warm_start": reused.to_summary() if reused is not None else {"reused": False},
        "practice_worlds": cfg.practice_worlds,
        "test_questions": len(world.test_rows),
        "manifest": build_manifest(
            seeds={"seed": cfg.seed}, tokenizer=tok, index_fingerprint=world.backend.fingerprint
        ),
    }
    summary["improvement_exact_match"] = (
        summary["ppo"]["test"]["exact_match"] - summary["sft"]["test"]["exact_match"]
    )
    # The same 100 questions before and after PPO: the paired interval of the difference, not two intervals.
    summary.update(paired_figures({"ppo": ppo_trajs, "sft": sft_trajs}, seed=cfg.seed))

    # 8b. optional: GRPO in both modes from the same warm start, on the PPO stage's budget -------------
    compare: dict[str, Path] | None = None
    if cfg.compare_grpo:
        compare = {"PPO": out / "ppo"}
        for mode, label in GRPO_LABELS.items():
            policy_dir = runner.run_with_progress(
                f"grpo {mode}",
                lambda progress, mode=mode: _train_grpo(
                    mode, sft_dir, world, rubric, out, ppo_args, progress
                ),
            )
            grpo_summary, _ = evaluate(f"eval grpo {mode}", load_policy(policy_dir), world.env_factory)
            write_evaluation(out / f"grpo_{mode}" / "eval" / "test-final.json", grpo_summary)
            summary[f"grpo_{mode}"] = {"test": headline(grpo_summary)}
            compare[label] = out / f"grpo_{mode}"
    write_layout(out, layout, summary)
    runner.run("report", lambda: _write_report(out, summary, compare))
    summary.update(stage_figures(runner), **runner.totals())
    write_layout(out, layout, summary)
    return summary


def _evaluate_test_split(
    cfg: DemoConfig,
    policy: Any,
    world: DemoWorld,
    env_factory: Callable[[], SearchEnvironment],
    rubric: Any,
    progress: StageProgress,
) -> tuple[dict, list]:
    """The demo's held-out measurement (`evaluate_with_ppo_limits`); (summary, trajectories)."""
    result = evaluate_with_ppo_limits(
        policy,
        world.tokenizer,
        world.test_rows,
        env_factory,
        cfg.ppo_config(),
        rubric=rubric,
        seed=cfg.seed,
        progress=progress.evaluation_hook(),
    )
    return result.summary, result.trajectories


def _train_ppo(
    ppo_args: Any, world: DemoWorld, policy: Any, rubric: Any, progress: StageProgress
) -> PPOTrainer:
    """PPO from the warm start on the train split, evaluated on dev (critic from the SFT backbone)."""
    trainer = PPOTrainer(
        # The stage runner draws this stage's bar (through the callback): PPO's own bar stays off.
        dataclasses.replace(ppo_args, progress_bar=False),
        world.tokenizer,
        policy,
        None,
        None,
        world.train_rows,
        reward_funcs=rubric,
        environment=world.env_factory,
        eval_dataset=world.dev_rows,
        callbacks=[progress.trainer_callback()],
    )
    trainer.train()
    return trainer


def _train_grpo(
    mode: str,
    sft_dir: Path,
    world: DemoWorld,
    rubric: Any,
    out: Path,
    ppo_args: Any,
    progress: StageProgress,
) -> Path:
    """GRPO from the SFT directory with every section it shares with PPO taken from the PPO stage."""
    # transformers prints its end-of-training metrics dict on stdout; the demo's stdout is its JSON headline.
    with contextlib.redirect_stdout(sys.stderr):
        run_dir = train_grpo_from_warm_start(
            sft_dir,
            world.tokenizer,
            world.train_rows,
            world.dev_rows,
            world.backend,
            rubric,
            mode=mode,
            total_episodes=int(ppo_args.total_episodes),
            out_dir=out / f"grpo_{mode}",
            ppo_config=ppo_args,
            callbacks=[progress.trainer_callback()],
        )
    return final_policy_dir(run_dir)


def _write_report(out: Path, summary: dict, compare: dict[str, Path] | None = None) -> None:
    write_report(out / "ppo", out=out / "report.html", summary=summary, compare=compare)
