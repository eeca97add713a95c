"""The demos' stage runner (`searchrl.demo.stages`): each stage measured and in order, progress moved by a
trainer's optimizer steps (a `TrainerCallback`) and by an evaluation's batches (`evaluate_policy`'s hook)."""

from __future__ import annotations

import io
from types import SimpleNamespace
from typing import Any

import pytest
import torch
from rich.console import Console
from worlds import TINY_ONE_LAYER

from searchrl.demo.stages import StageProgress, StageRunner
from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.evaluation.loop import evaluate_policy
from searchrl.models.tiny import build_policy, tokenizer_training_texts, train_tokenizer
from searchrl.rollout.generator import GenerationConfig
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.warm_start import SFTWarmStartConfig, run_sft, sft_total_steps


def shown_runner() -> tuple[StageRunner, io.StringIO]:
    """A runner that shows its stages, on a console writing to a string."""
    runner = StageRunner(show=True)
    out = io.StringIO()
    runner.console = Console(file=out, width=120)
    return runner, out


@pytest.fixture(scope="module")
def world(synthetic_index) -> SimpleNamespace:
    synthetic = synthetic_index(0)
    rows = synthetic.task.splits["train"][:8]
    tok = train_tokenizer(tokenizer_training_texts(synthetic.task.corpus, rows), vocab_size=500)
    envs = [SearchEnvironment(synthetic.backend, EnvConfig(), tokenizer=tok) for _ in rows]
    demos = ExpertPolicy(ExpertConfig(noise=0.0, k=1)).demonstrate(None, tok, envs, rows)
    return SimpleNamespace(backend=synthetic.backend, rows=rows, tok=tok, demos=demos)


def test_every_stage_is_measured_in_the_order_it_ran() -> None:
    runner = StageRunner(show=False)
    assert runner.run("first", lambda: 1) == 1
    busy = runner.run_with_progress("busy", lambda progress: sum(i * i for i in range(2_000_000)), total=3)
    assert busy > 0
    assert list(runner.timings) == list(runner.cpu) == list(runner.peak_rss) == ["first", "busy"]
    assert runner.timings["busy"] > 0 and runner.cpu["busy"] > 0  # the loop's CPU time, not the neighbours'
    assert runner.peak_rss["busy"] >= runner.peak_rss["first"] > 10
    totals = runner.totals()
    assert set(totals) == {"wall_seconds", "cpu_seconds", "peak_rss_mb"} and totals["peak_rss_mb"] > 10
    assert totals["wall_seconds"] >= round(runner.timings["busy"], 1) - 0.1


def test_a_failed_stage_raises_and_is_not_recorded() -> None:
    runner, out = shown_runner()

    def fails() -> None:
        raise RuntimeError("index missing")

    with pytest.raises(RuntimeError, match="index missing"):
        runner.run("index", fails)
    assert runner.timings == {} and runner.cpu == {} and "index" not in out.getvalue()
    runner.run("data", lambda: None)
    assert "✓ data" in out.getvalue()


def test_the_trainer_callback_moves_the_bar_one_step_per_optimizer_step(world: SimpleNamespace) -> None:
    """SFT's curriculum runs one trainer per phase; the stage's total is their steps together, and each
    optimizer step of each phase moves the bar once. The callback does not change training."""
    config = SFTWarmStartConfig(
        max_steps=3,
        per_device_train_batch_size=2,
        first_turn_steps=2,
        first_turn_batch_size=4,
        logging_steps=1,
    )
    total = sft_total_steps(config, len(world.demos))
    assert total == 2 + 3
    runner, out = shown_runner()
    seen: list[StageProgress] = []

    def train(progress: StageProgress) -> Any:
        seen.append(progress)
        policy = build_policy(world.tok, TINY_ONE_LAYER)
        return run_sft(policy, world.tok, world.demos, config, callbacks=[progress.trainer_callback()])

    torch.manual_seed(0)
    with_bar = runner.run_with_progress("sft", train, total=total)
    (task,) = seen[0].bar.tasks
    assert task.total == task.completed == 5 and task.fields["note"].startswith("loss ")
    torch.manual_seed(0)
    without = run_sft(build_policy(world.tok, TINY_ONE_LAYER), world.tok, world.demos, config)
    assert with_bar.losses == without.losses
    assert "✓ sft" in out.getvalue()


def test_a_callback_takes_its_total_from_the_trainer_when_the_stage_has_none() -> None:
    runner, _ = shown_runner()

    def fake_training(progress: StageProgress) -> Any:
        callback = progress.trainer_callback()
        state = SimpleNamespace(max_steps=4, global_step=0)
        callback.on_train_begin(None, state, None)
        for step in range(4):
            callback.on_step_end(None, state, None)
            callback.on_log(None, state, None, logs={"objective/scores": 0.5 + step, "objective/kl": 0.01})
        return progress.bar.tasks[0]

    task = runner.run_with_progress("ppo", fake_training)
    assert task.total == task.completed == 4 and task.fields["note"] == "score 3.500 kl 0.010"


def test_an_evaluation_reports_each_batch_of_questions(world: SimpleNamespace) -> None:
    batches: list[int] = []
    policy = build_policy(world.tok, TINY_ONE_LAYER)
    rows = world.rows[:7]
    result = evaluate_policy(
        policy,
        world.tok,
        rows,
        lambda: SearchEnvironment(world.backend, EnvConfig(max_turns=1), tokenizer=world.tok),
        GenerationConfig(max_new_tokens_per_turn=4, max_episode_tokens=600),
        batch_size=3,
        progress=batches.append,
    )
    assert batches == [3, 3, 1] and len(result.trajectories) == 7
    runner, _ = shown_runner()
    task = runner.run_with_progress(
        "eval",
        lambda progress: (
            progress.evaluation_hook()(3),
            progress.evaluation_hook()(4),
            progress.bar.tasks[0],
        )[-1],
        total=7,
    )
    assert task.completed == task.total == 7
