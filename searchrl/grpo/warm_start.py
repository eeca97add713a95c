"""GRPO from an existing warm-start policy with a PPO stage's settings: the demo's side-by-side runs.

Why a function of its own: the comparison is only fair when GRPO starts from the same SFT weights as PPO and
gets the same environment, rollout limits, sampling, batch, episode budget and evaluation. Those are the
sections both configs inherit (`searchrl.sections`), copied from the PPO stage's `PPOConfig` by
`with_sections_of`; GRPO builds its environment from them itself, so the caller passes only the search
backend and cannot hand GRPO another task by accident.

    run_dir = train_grpo_from_warm_start(
        "runs/demo/sft/policy", tok, train_rows, dev_rows, backend, rubric,
        mode="our_rollout", total_episodes=640, out_dir="runs/demo/grpo_our_rollout", ppo_config=ppo_args,
    )
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from searchrl.common.config import ConfigError
from searchrl.grpo.config import GRPO_MODES, GRPORunConfig
from searchrl.models.io import load_policy
from searchrl.ppo.config import PPOConfig
from searchrl.rewards.combine import Rubric
from searchrl.run.writer import RunDir
from searchrl.search.base import Backend
from searchrl.sections import with_sections_of


def train_grpo_from_warm_start(
    policy_dir: str | Path,
    tokenizer: Any,
    train_rows: Sequence[dict[str, Any]],
    eval_rows: Sequence[dict[str, Any]] | None,
    backend: Backend,
    rubric: Rubric,
    mode: str,
    total_episodes: int,
    out_dir: str | Path,
    *,
    ppo_config: PPOConfig,
    overrides: dict[str, Any] | None = None,
    callbacks: list[Any] | None = None,
    resume: bool = False,
) -> Path:
    """Train GRPO (`mode`: trl_loop | our_rollout) from the policy in `policy_dir`; returns the run directory.

    Every setting GRPO shares with PPO comes from `ppo_config` (the PPO stage it is compared with): the
    environment, the rollout limits and sampling, the episodes per optimizer step, the learning rate and
    schedule, and the dev evaluation (`eval_steps`, `num_eval_questions`, `eval_temperature`), with a step-0
    evaluation of the warm start. `total_episodes` is the budget; `overrides` sets GRPO-only fields
    (`num_generations`, `beta`, `loss_type`, ...) or anything else, last. `backend` is the search engine (the
    caller's, e.g. the demo's index). `eval_rows` is the dev split (never the test split). `resume=True`
    continues a killed run in `out_dir`. The run directory has `eval/step-N.json` with `eval/exact_match`,
    `episode` and `time/train_s`.
    """
    if mode not in GRPO_MODES:
        raise ConfigError(f"mode: {mode!r} is not one of {list(GRPO_MODES)}")
    policy_dir = Path(policy_dir)
    if not (policy_dir / "config.json").is_file():
        raise FileNotFoundError(
            f"{policy_dir}: no warm-start policy here (config.json missing); pass the SFT output directory, "
            "e.g. runs/demo/sft/policy"
        )
    values: dict[str, Any] = {
        "mode": mode,
        "output_dir": str(out_dir),
        "policy_model_path": str(policy_dir),
        "total_episodes": total_episodes,
        "eval_on_start": True,
        "eval_batch_size": ppo_config.episodes_per_step,  # PPO's evaluation batch: one step's episodes
        **(overrides or {}),
    }
    cfg = with_sections_of(GRPORunConfig, ppo_config, **values)
    from searchrl.grpo.trainer import build_grpo_trainer  # deferred: it imports TRL

    torch.manual_seed(cfg.seed)
    policy = load_policy(policy_dir).train()
    trainer = build_grpo_trainer(
        cfg,
        policy,
        tokenizer,
        backend,
        train_rows,
        eval_rows,
        rubric,
        callbacks=callbacks,
        resume=resume,
    )
    trainer.train()
    return cfg.run_dir


def final_policy_dir(run_dir: str | Path) -> Path:
    """The policy of a GRPO run's latest checkpoint (what `train_grpo_from_warm_start` trained last)."""
    return RunDir(run_dir).latest_checkpoint() / "policy"
