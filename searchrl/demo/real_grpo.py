"""The real loop's optional GRPO stage: TRL's GRPOTrainer from the same SFT policy as PPO, for PPO's wall clock.

What: `train_real_grpo` builds a `GRPORunConfig` from the PPO stage's settings (`with_sections_of`: the same
environment, sampling, batch, learning rate and schedule, dev evaluation cadence, rubric and search index;
GRPO's own fields from `RealGRPOSettings`), wraps the SFT policy loaded from `sft/policy` in a fresh LoRA
adapter of the same shape as PPO's (the reference, when `beta > 0`, is that policy with the adapter off, as
PPO's), rolls out with the real loop's generator (`real_generator_factory`: our batched engine under bfloat16
autocast, mode `our_rollout`) and trains until its training clock (`time/train_s`, evaluation excluded, the
clock PPO logs) reaches the budget, at the end of a step (`WallClockStop`). The run directory is `grpo/`, a
normal GRPO run (`searchrl eval --run runs/demo-real/grpo` evaluates it). It returns the policy with the
adapter merged (what the test-split evaluation decodes) and the facts summary.json records.

Why a wall-clock budget rather than PPO's episode count: issue 25 compares the two at equal wall clock, the
resource a user pays for; a GRPO step (no critic, no value pass) costs less than a PPO step, so at the same
wall clock it takes more steps. TRL runs GRPO's forward and backward passes in float32 on a CPU
(`cpu_safe_trainer_kwargs`), PPO under bfloat16 autocast: GRPO pays that here (docs/real_loop.md).
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from transformers import TrainerCallback

from searchrl.demo.baselines import real_generator_factory
from searchrl.grpo.config import GRPORunConfig
from searchrl.grpo.trainer import build_grpo_trainer
from searchrl.models.io import load_policy
from searchrl.sections import with_sections_of


class WallClockStop(TrainerCallback):
    """Stops training at the end of the first step at which `clock()` (training seconds) reaches `seconds`."""

    def __init__(self, seconds: float, clock: Callable[[], float]) -> None:
        self.seconds, self.clock = seconds, clock
        self.stopped_at_step: int | None = None

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.stopped_at_step is None and self.clock() >= self.seconds:
            self.stopped_at_step = int(state.global_step)
            control.should_training_stop = True


def grpo_run_config(cfg: Any, sft_dir: Path, out_dir: Path) -> GRPORunConfig:
    """The GRPO stage's run settings: the PPO stage's shared sections, GRPO's own from `cfg.grpo`."""
    settings = cfg.grpo
    ppo = cfg.ppo_config()
    return with_sections_of(
        GRPORunConfig,
        ppo,
        mode="our_rollout",
        output_dir=str(out_dir),
        policy_model_path=str(sft_dir),
        reward_config_path=cfg.reward_config_path,
        total_episodes=None,
        max_steps=settings.max_steps,
        num_generations=settings.num_generations,
        beta=settings.beta,
        loss_type=settings.loss_type,
        learning_rate=settings.learning_rate if settings.learning_rate is not None else ppo.learning_rate,
        eval_batch_size=min(cfg.eval_batch_size, max(1, ppo.num_eval_questions)),
        progress_bar=False,
    )


def train_real_grpo(
    cfg: Any,
    sft_dir: Path,
    tok: Any,
    backend: Any,
    rubric: Any,
    train_rows: list[dict[str, Any]],
    dev_rows: list[dict[str, Any]],
    budget_s: float,
    callbacks: list[Any],
) -> tuple[Any, dict[str, Any]]:
    """Train the GRPO stage (module docstring) for `budget_s` training seconds; (merged policy, facts)."""
    run_cfg = grpo_run_config(cfg, sft_dir, Path(cfg.out_dir) / "grpo")
    policy = load_policy(sft_dir).train()
    if cfg.finetune == "lora":
        from peft import get_peft_model  # deferred: peft loads torch and transformers' PEFT integration

        policy = get_peft_model(policy, cfg.lora.peft_config())
    factory = None if run_cfg.rollout_backend == "vllm" else real_generator_factory(cfg.bf16_rollouts)
    trainer = build_grpo_trainer(
        run_cfg,
        policy,
        tok,
        backend,
        train_rows,
        dev_rows,
        rubric,
        callbacks=callbacks,
        generator_factory=factory,
    )
    stop = WallClockStop(budget_s, lambda: trainer.run_callback.clock()["time/train_s"])
    trainer.add_callback(stop)
    # transformers prints its end-of-training metrics dict on stdout; the demo's stdout is its JSON headline.
    with contextlib.redirect_stdout(sys.stderr):
        trainer.train()
    trained = trainer.accelerator.unwrap_model(trainer.model)
    merged = trained.merge_and_unload() if cfg.finetune == "lora" else trained
    merged.eval()
    clock = trainer.run_callback.clock()
    info = {
        "mode": run_cfg.mode,
        "steps": int(trainer.state.global_step),
        "episodes": int(trainer.record.episodes),
        "num_generations": run_cfg.num_generations,
        "beta": run_cfg.beta,
        "loss_type": run_cfg.loss_type,
        "learning_rate": run_cfg.learning_rate,
        "budget_train_s": round(budget_s, 1),
        "train_s": round(clock["time/train_s"], 1),
        "stopped_by_wall_clock": stop.stopped_at_step is not None,
    }
    return merged, info
