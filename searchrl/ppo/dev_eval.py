"""PPO's dev evaluation during training: the loop every trainer and `searchrl eval` share
(`searchrl.evaluation.loop.evaluate_during_training`), on the trainer's own engine, at `eval_temperature`.

Why apart from `trainer.py`: it is not the algorithm. It measures the policy between steps, writes
`RUN/eval/step-N.json` with the episode count and the clocks, keeps its time out of the training clock
(`time/train_s`) and tells the callbacks (`on_evaluate`); `eval_on_start` adds the starting policy as step 0.
On the run's dev questions it also asks whether the run is learning (`ppo/learning_check.py`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import torch

from searchrl.evaluation.loop import evaluate_during_training
from searchrl.ppo import checkpointing
from searchrl.ppo.distributed import gathered_for_generation
from searchrl.ppo.learning_check import logged_kls


def evaluate(trainer: Any, rows: list[dict] | None = None, seed: int = 0) -> dict[str, float]:
    """The dev metrics of `trainer`'s policy on `rows` (default: its first `num_eval_questions` dev rows)."""
    rows = rows if rows is not None else trainer.eval_rows[: trainer.args.num_eval_questions]
    if not rows:
        return {}
    eval_config = replace(trainer.generator.config, temperature=trainer.args.eval_temperature)
    # Evaluation time is not training time; the clock is read as the evaluation begins, as GRPO's.
    gathered = gathered_for_generation(trainer.wrapped_model, trainer.accelerator, trainer.uses_deepspeed)
    answers: dict[str, str] = {}
    with trainer.training_clock.evaluating() as clock, torch.no_grad(), gathered:
        out = evaluate_during_training(
            trainer.policy,
            trainer.tokenizer,
            rows,
            trainer.env_factory,
            eval_config,
            rubric=trainer.rubric,
            batch_size=trainer.args.local_batch_size,
            seed=seed,
            generator=trainer.generator,  # the trainer's own engine (HF or vLLM)
            answers_out=answers,
        )
    if rows_are_the_dev_set(trainer, rows):  # is the run learning? (`ppo/learning_check.py`)
        kls = logged_kls(trainer.run.metrics, trainer.last_metrics) if trainer.global_step else []
        out.update(
            trainer.learning.after_evaluation(
                answers, out, trainer.global_step, trainer.num_total_batches, kls
            )
        )
    if trainer.is_main:  # every rank evaluates the same rows with the same weights and seeds
        trainer.run.write_eval(trainer.global_step, {"episode": trainer.episode, **clock, **out})
    trainer._callback("on_evaluate", metrics=out)
    return out


def rows_are_the_dev_set(trainer: Any, rows: list[dict]) -> bool:
    """Whether `rows` are the run's own dev questions (not rows a caller passed to `evaluate`)."""
    return rows == trainer.eval_rows[: trainer.args.num_eval_questions]


def evaluate_on_start(trainer: Any) -> None:
    """`eval_on_start`: the starting policy measured before the first update, as `eval/step-0.json` and a
    step-0 metrics line (episode 0, training clock 0), like GRPO's runs and transformers' Trainer."""
    line = {"step": 0, "episode": trainer.episode, **trainer.clock(), **evaluate(trainer)}
    if trainer.is_main:
        trainer.run.log_metrics(line)
    checkpointing.save_after_step(trainer, line)  # the warm start itself may stay the best policy of the run
    trainer._callback("on_log", logs=line)
