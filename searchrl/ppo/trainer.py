"""PPOTrainer: TRL's PPO component design, rebuilt for agents that call a search engine.

Read it top to bottom; one `step()` is the whole algorithm:

  1. rollout      the policy talks to the environment (`searchrl.rollout`): token ids, action mask,
                  sampling logprobs, tool calls, termination reason per trajectory.
  2. score        rule rewards (`searchrl.rewards.combine.Rubric`) plus, optionally, a frozen reward
                  model's score with a weight; a missing-EOS penalty as in TRL 1.12.
  3. forward      old logprobs (policy, temperature-scaled, recomputed over the exact token ids),
                  reference logprobs and values, all under no_grad.
  4. rewards      the scalar score on the last action token, `-kl_coef * KL` on every action token
                  (Ziegler et al. 2019; TRL 1.12's per-token KL reward), optional reward whitening.
  5. advantages   GAE over action tokens only (observation tokens are not time steps; Schulman et
                  al. 2016), returns = advantages + values, advantages whitened over action tokens.
  6. optimise     `num_ppo_epochs` x `num_mini_batches` of the clipped surrogate (Schulman et al.
                  2017) and the clipped value loss, one optimizer step per mini-batch, gradients
                  clipped to `max_grad_norm`, scheduler stepped per optimizer step.
  7. control      the KL controller sees the measured KL (batch mean of per-trajectory summed KL);
                  the collapse guard may roll back to the last good checkpoint; metrics, checkpoints.

What differs from TRL 1.12 on purpose (see `reference/trl.md` §1.5-1.7): an explicit action mask
instead of "first pad" validity, the score on the last *action* token, the optimizer stepped per
mini-batch, gradients clipped, masked statistics, the critic checkpointed, resume supported, pad ≠ eos
required, separate learning rates for policy and value.

Several processes (`accelerate launch --num_processes N`): an `accelerate.Accelerator` made in `__init__`
wraps the policy+critic module in DDP and the optimizer; on one process it changes nothing. Each rank
rolls out its own slice of the global batch (rank r takes rows r, r+N, ... of the step's rows) with its
own sampling seed, the micro-batch token weights are made global (the mini-batch's action-token count is
all-reduced), gradients are averaged by DDP once per mini-batch (`no_sync` on the other micro-batches),
the whitening statistics and the KL fed to the controller are computed over all ranks, and metrics are
averaged over ranks and logged once by the main process (whose training clock every rank takes), which
also writes checkpoints, eval files and one trajectory file per step holding every rank's trajectories.

What is not the algorithm has its own owner: the run layer (`searchrl.common.run`: the run directory, when
to log, evaluate, save and write samples, the best checkpoint; `common.clock`; `common.health`, the
monitors GRPO logs too), `evaluation.evaluate.evaluate_during_training` (the dev loop), and beside this
file `checkpointing.py` (what a checkpoint holds, resume), `callbacks.py` (transformers callbacks),
`guard.py` (the collapse guard and its rollback), `distributed.py` (cross-rank statistics, DeepSpeed),
`modeling.py` (the models), `batch.py` (trajectories as tensors) and `optim.py`.
"""

from __future__ import annotations

import contextlib
import math
import random
import time
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import nn
from transformers import get_scheduler

from searchrl.common.clock import TrainingClock
from searchrl.common.health import likelihood_metrics
from searchrl.common.run import BestCheckpoint, Cadence, RunDir
from searchrl.common.trajectory import Trajectory
from searchrl.evaluation.evaluate import evaluate_during_training, generation_config_from_ppo
from searchrl.ppo import checkpointing
from searchrl.ppo.advantages import (
    apply_missing_eos_penalty,
    compute_gae,
    masked_explained_variance,
    masked_mean,
    place_rewards,
)
from searchrl.ppo.batch import collate_trajectories, trim_to_length
from searchrl.ppo.callbacks import TrainerCallbacks
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.distributed import (
    RankOps,
    configure_deepspeed,
    gathered_for_generation,
    prepare_for_inference,
)
from searchrl.ppo.guard import CollapseGuard, roll_back_on_collapse
from searchrl.ppo.kl import kl_penalty, make_kl_controller, per_sequence_kl
from searchrl.ppo.losses import policy_loss, value_loss
from searchrl.ppo.modeling import (
    assemble_models,
    disable_dropout,
    position_ids_from_mask,
    token_entropy,
    token_logprobs,
)
from searchrl.ppo.optim import build_optimizer, check_optimizer_covers
from searchrl.rewards.qa import exact_match
from searchrl.rewards.reward_model import FrozenRewardModel
from searchrl.rollout.generator import HFGenerator
from searchrl.rollout.stats import termination_stats

__all__ = ["PPOTrainer", "collate_trajectories", "trim_to_length"]


class PPOTrainer:
    """Agent-aware PPO with TRL's constructor shape.

    Args:
        args: the `PPOConfig`.
        processing_class: the tokenizer (pad ≠ eos required; TRL 1.12 silently broke when they matched).
        model: the policy, a causal LM.
        ref_model: the frozen reference; `None` makes a frozen copy of the policy (with PEFT: the
            policy with its adapter disabled).
        reward_model: optional frozen sequence-classification scorer; its score joins the reward
            functions with weight `args.reward_model_weight`.
        train_dataset: rows with at least `question` and `golds` (a list of dicts or a `datasets.Dataset`).
        value_model: the critic (seq-cls model with a `.score` head); `None` builds one from the policy's
            backbone (`value_mode="separate"`) or uses a value head on the policy (`"shared_backbone"`).
        reward_funcs: a `searchrl.rewards.combine.Rubric` (weighted reward functions).
        environment: a zero-argument factory returning a fresh `SearchEnvironment` per episode.
        eval_dataset: rows for validation during training (the dev split; never the test split).
        optimizers: `(optimizer, scheduler)`; a user optimizer must cover policy and value parameters.
        callbacks: `transformers.TrainerCallback`s (`on_train_begin`, `on_step_end`, `on_log`, `on_save`,
            `on_evaluate`, `on_train_end`).
        peft_config: a `peft` config; the policy is wrapped with `get_peft_model`.
    """

    def __init__(
        self,
        args: PPOConfig,
        processing_class: Any,
        model: nn.Module,
        ref_model: nn.Module | None,
        reward_model: nn.Module | None,
        train_dataset: Any,
        value_model: nn.Module | None = None,
        reward_funcs: Any = None,
        environment: Callable[[], Any] | None = None,
        eval_dataset: Any = None,
        optimizers: tuple[torch.optim.Optimizer | None, Any] = (None, None),
        callbacks: list[Any] | None = None,
        peft_config: Any = None,
        generator_factory: Callable[..., Any] | None = None,
    ):
        if train_dataset is None:
            raise ValueError("train_dataset is required: rows with 'question' and 'golds'")
        if ref_model is not None and ref_model is model:
            raise ValueError("ref_model must not be the policy itself; pass None to get a frozen copy")
        if environment is None:
            raise ValueError("environment is required: a factory returning a SearchEnvironment")
        if reward_funcs is None and reward_model is None:
            raise ValueError("no reward source: pass reward_funcs (a Rubric) and/or a reward_model")
        tok = processing_class
        if tok.pad_token_id is None or tok.pad_token_id == tok.eos_token_id:
            raise ValueError(
                "the tokenizer's pad token must exist and differ from its EOS token (with pad == eos the "
                "EOS would be masked as padding); add one, e.g. tokenizer.add_special_tokens({'pad_token': '<|endoftext|>'})"
            )
        if args.mixed_precision == "fp16":
            raise ValueError(
                "mixed_precision='fp16' needs loss scaling, which this trainer does not do; use 'bf16' "
                "(autocast, no scaler needed) or 'no'"
            )
        self.args = args
        self.tokenizer = tok
        self.train_rows = [dict(r) for r in train_dataset]
        self.eval_rows = [dict(r) for r in eval_dataset] if eval_dataset is not None else []
        self.env_factory = environment
        self.rubric = reward_funcs
        self.callbacks = TrainerCallbacks(args, tok, callbacks)
        self.hf_args = self.callbacks.hf_args
        self.run = RunDir(args.output_dir)
        # One process: a no-op wrapper. Several (`accelerate launch`): rank, world size, DDP/DeepSpeed, collectives.
        self.accelerator = Accelerator(cpu=args.use_cpu or not torch.cuda.is_available())
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.uses_deepspeed = getattr(self.accelerator.state, "deepspeed_plugin", None) is not None
        self.device = self.accelerator.device
        self.ranks = RankOps(self.accelerator)  # sums, means, whitening and metrics over all ranks
        # Different seeds per rank (TRL's `seed + rank * 100003`); DDP broadcasts rank 0's weights anyway.
        self._seed_everything(args.seed + self.rank * 100003)

        # --- models: policy + critic in one module, the frozen reference, the frozen reward model ----
        module, ref_model, self.is_peft = assemble_models(
            model, ref_model, value_model, args.value_mode, peft_config, args.gradient_checkpointing
        )
        self.model = module.to(self.device)
        self.policy = self.model.policy
        args.finalize(world_size=self.world_size, num_train_rows=len(self.train_rows))  # TRL 1.12's names
        if self.uses_deepspeed:
            configure_deepspeed(self.accelerator, args)
        if reward_model is not None:
            disable_dropout(reward_model)
            reward_model = prepare_for_inference(reward_model, self.accelerator, self.uses_deepspeed)
        self.reward_model = FrozenRewardModel(reward_model) if reward_model is not None else None
        if ref_model is not None:
            ref_model = prepare_for_inference(ref_model, self.accelerator, self.uses_deepspeed).eval()
        self.ref_model = ref_model
        self.num_total_batches = args.num_total_batches

        # --- optimizer and scheduler: one optimizer, two param groups (policy lr, value lr) ----------
        optimizer, scheduler = optimizers
        if optimizer is None:
            optimizer = build_optimizer(self.model, args)
        else:
            check_optimizer_covers(optimizer, self.model)
        self.optimizer = optimizer
        self.num_optimizer_steps = self.num_total_batches * args.num_ppo_epochs * args.num_mini_batches
        self.lr_scheduler = scheduler or get_scheduler(
            args.lr_scheduler_type,
            optimizer,
            num_warmup_steps=args.warmup_steps,
            num_training_steps=max(1, self.num_optimizer_steps),
        )
        # The gradient passes go through DDP (or a DeepSpeed engine) over the same parameters as `self.model`,
        # which stays the plain module for rollouts, no-grad passes and checkpoints. The scheduler is not
        # prepared: accelerate's wrapper would step it once per process.
        self.wrapped_model: nn.Module = self.model
        if self.world_size > 1 or self.uses_deepspeed:
            self.wrapped_model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

        self.kl_ctl = make_kl_controller(args.kl_coef, args.kl_target, args.kl_horizon)

        # --- rollout engine ----------------------------------------------------------------------------
        self.generation_config = generation_config_from_ppo(args)  # the one mapping eval and GRPO use too
        if generator_factory is None and args.rollout_backend == "vllm":
            # vLLM rollouts (GPU): checks vllm/CUDA first and raises ConfigError saying how to fix it.
            from searchrl.rollout.vllm_generator import vllm_generator_factory

            generator_factory = vllm_generator_factory(args, uses_deepspeed=self.uses_deepspeed)
        self.generator = (generator_factory or HFGenerator)(self.policy, tok, self.generation_config)
        # The stop token the rollout ends a turn on (TRL 1.12's `stop_token_id`): the missing-EOS
        # penalty checks for it, not for whatever `eos_token_id` a model config might carry.
        self.stop_token_ids = {int(getattr(self.generator, "eos_id", tok.eos_token_id))}
        self.stop_strings = list(getattr(environment(), "stop_strings", []) or [])

        # --- run state: data position, the guard's rollback targets, the best dev checkpoint, clocks -----
        self.cadence = Cadence(
            self.num_total_batches,
            args.logging_steps,
            args.eval_steps,
            args.save_steps,
            args.num_sample_generations,
        )
        self.guard = CollapseGuard(args)
        self.global_step = 0
        self.episode = 0
        self.data_epoch = 0
        self.data_offset = 0
        self.last_good_checkpoint: Path | None = None
        # A checkpoint written after step N holds weights no rollout has tested yet: step N+1's metrics
        # are the first to measure them. It becomes the rollback target only when that check passes.
        self.unverified_checkpoint: Path | None = None
        self.last_metrics: dict[str, float] = {}
        self.last_trajectories: list[Trajectory] = []
        self.rollbacks = 0  # collapse-guard rollbacks so far (checkpointed, so a resumed run keeps count)
        self.best = BestCheckpoint(self.run, args.best_metric)
        self.lr_scale = 1.0  # product of the guard's learning-rate cuts, re-applied after every load
        # `time/train_s` (the x axis of the trainers-side-by-side plots): training seconds, evaluation
        # excluded, summed over sessions; checkpointed, so a resumed run goes on from its checkpoint's value.
        self.training_clock = TrainingClock()

    def _seed_everything(self, seed: int) -> None:
        random.seed(seed)
        np.random.seed(seed % (2**32))
        torch.manual_seed(seed)

    def _autocast(self) -> Any:
        """bf16 autocast of the forward passes when `mixed_precision='bf16'` (logprobs and losses stay fp32)."""
        enabled = self.args.mixed_precision == "bf16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    def _next_rows(self, n: int) -> list[dict]:
        """The next `n` training rows: a fresh permutation per data epoch, seeded by (seed, epoch)."""
        rows = []
        while len(rows) < n:
            order = np.random.default_rng(self.args.seed + 7919 * self.data_epoch).permutation(
                len(self.train_rows)
            )
            take = min(n - len(rows), len(order) - self.data_offset)
            rows.extend(self.train_rows[i] for i in order[self.data_offset : self.data_offset + take])
            self.data_offset += take
            if self.data_offset >= len(order):
                self.data_epoch += 1
                self.data_offset = 0
        return rows

    # -----------------------------------------------------------------------------------------
    # 1. rollout: this rank's rows r, r + N, r + 2N, ... of the step (all of them on one process)
    # -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def rollout(
        self, rows: list[dict], seed: int, temperature: float | None = None
    ) -> tuple[list[Trajectory], dict]:
        self.policy.eval()
        envs = [self.env_factory() for _ in rows]
        gen_cfg = self.generator.config
        saved = (gen_cfg.seed, gen_cfg.temperature)
        gen_cfg.seed = seed
        if temperature is not None:
            gen_cfg.temperature = temperature
        try:
            with gathered_for_generation(self.wrapped_model, self.accelerator, self.uses_deepspeed):
                batch = self.generator.rollout(envs, rows)
        finally:
            gen_cfg.seed, gen_cfg.temperature = saved
        return list(batch.trajectories), dict(getattr(batch, "stats", {}) or {})

    # -----------------------------------------------------------------------------------------
    # 2. score: rule rewards + weighted reward-model score, minus TRL 1.12's missing-EOS penalty
    # -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def score(self, trajs: list[Trajectory], batch: dict[str, torch.Tensor]) -> torch.Tensor:
        scores = torch.zeros(len(trajs))
        if self.rubric is not None:
            for i, t in enumerate(trajs):
                total, _ = self.rubric.score(t)
                scores[i] = total
        if self.reward_model is not None:
            rm = self.reward_model.score(batch["input_ids"], batch["attention_mask"])
            for i, t in enumerate(trajs):
                t.reward_breakdown["reward_model"] = float(rm[i])
            scores = scores + self.args.reward_model_weight * rm
        if self.args.missing_eos_penalty is not None:
            # TRL 1.12: `scores[~contain_eos] -= missing_eos_penalty`, here per trajectory.
            ended = torch.tensor([self.ends_with_stop(t) for t in trajs], dtype=torch.bool)
            scores = apply_missing_eos_penalty(scores, ended, self.args.missing_eos_penalty)
            for t, ok in zip(trajs, ended.tolist(), strict=True):
                if not ok:
                    t.reward_breakdown["missing_eos_penalty"] = -self.args.missing_eos_penalty
        for i, t in enumerate(trajs):
            t.reward = float(scores[i])
        return scores

    def ends_with_stop(self, traj: Trajectory) -> bool:
        """Did the policy end its last turn itself (the configured stop token, or a protocol stop string)?

        False for a trajectory cut by a token budget, whatever its last token: the stop token was never
        sampled as an ending.
        """
        last = traj.last_action_index
        if last < 0 or traj.termination == "token_budget":
            return False
        if traj.input_ids[last] in self.stop_token_ids:
            return True
        actions = [sp for sp in traj.spans if sp.kind == "action"]
        tail = actions[-1].text.rstrip() if actions else ""
        return any(tail.endswith(stop) for stop in self.stop_strings)

    # -----------------------------------------------------------------------------------------
    # 3. forward passes under no_grad: old logprobs, reference logprobs, values
    # -----------------------------------------------------------------------------------------
    @torch.no_grad()
    def _policy_and_values(
        self, batch: dict[str, torch.Tensor]
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        a = self.args
        self.model.eval()
        lps, vals, ents = [], [], []
        for i in range(0, batch["input_ids"].shape[0], a.local_rollout_forward_batch_size):
            mb = {k: v[i : i + a.local_rollout_forward_batch_size].to(self.device) for k, v in batch.items()}
            with self._autocast():
                logits, values = self.model(mb["input_ids"], mb["attention_mask"])
            lps.append(token_logprobs(logits, mb["input_ids"], a.temperature, a.top_k, a.top_p).cpu())
            ents.append(token_entropy(logits, a.temperature).cpu())
            vals.append(values.cpu())
        return torch.cat(lps), torch.cat(vals), torch.cat(ents)

    @torch.no_grad()
    def _ref_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        a = self.args
        out = []
        for i in range(0, batch["input_ids"].shape[0], a.local_rollout_forward_batch_size):
            ids = batch["input_ids"][i : i + a.local_rollout_forward_batch_size].to(self.device)
            mask = batch["attention_mask"][i : i + a.local_rollout_forward_batch_size].to(self.device)
            kwargs = dict(
                input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False
            )
            if self.ref_model is None:  # PEFT: the reference is the policy with its adapter disabled
                with self.policy.disable_adapter(), self._autocast():
                    logits = self.policy(**kwargs).logits
            else:
                with self._autocast():
                    logits = self.ref_model(**kwargs).logits
            out.append(token_logprobs(logits, ids, a.temperature, a.top_k, a.top_p).cpu())
        return torch.cat(out)

    # -----------------------------------------------------------------------------------------
    # one PPO step
    # -----------------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        a = self.args
        t0 = time.perf_counter()
        rows = self._next_rows(a.batch_size)[self.rank :: self.world_size]
        step_seed = a.seed * 1_000_003 + self.global_step + self.rank * 100003
        trajs, rollout_stats = self.rollout(rows, seed=step_seed)
        t_rollout = time.perf_counter() - t0
        batch = collate_trajectories(trajs, self.tokenizer.pad_token_id)
        action_mask = batch["action_mask"]

        # 2. score
        scores = self.score(trajs, batch)

        # 3. old logprobs recomputed over the exact token ids (equal to the rollout's up to float error;
        # recomputing makes the ratio exactly 1 before the first update), reference logprobs, values.
        old_logprobs, old_values, entropy = self._policy_and_values(batch)
        ref_logprobs = self._ref_logprobs(batch)
        logprob_gap = (old_logprobs - batch["rollout_logprobs"]).abs() * action_mask

        # 4. rewards: per-token KL penalty on action tokens, the score on the last action token
        # (Ziegler et al. 2019; TRL 1.12's `rewards = -kl_coef * kl`, `rewards[last] += score`).
        kl = kl_penalty(old_logprobs, ref_logprobs, a.kl_estimator) * action_mask
        rewards = place_rewards(scores, kl, action_mask, self.kl_ctl.value)
        if a.whiten_rewards:
            rewards = self.ranks.whiten(rewards, action_mask, shift_mean=False) * action_mask

        # 5. advantages: GAE over action tokens only (Schulman et al. 2016; an observation token is not a
        # time step), returns = advantages + values from the raw advantages, then whitening.
        advantages, returns = compute_gae(rewards, old_values * action_mask, action_mask, a.gamma, a.lam)
        if a.whiten_advantages:
            advantages = self.ranks.whiten(advantages, action_mask) * action_mask

        # 6. optimise: the clipped surrogate and the clipped value loss (Schulman et al. 2017).
        train_stats = self._optimise(batch, old_logprobs, old_values * action_mask, advantages, returns)
        sync_weights = getattr(self.generator, "sync_weights", None)
        if sync_weights is not None:  # an engine with its own copy of the weights (vLLM): push the update
            sync_weights(self.policy)

        # 7. control: the KL controller sees the batch mean of per-trajectory summed KL (TRL's unit), over
        # all ranks, and counts the global batch, so every rank holds the same coefficient.
        seq_kl = per_sequence_kl(kl, action_mask)
        mean_kl = self.ranks.mean(seq_kl)
        kl_coef_used = float(self.kl_ctl.value)  # the coefficient in this step's rewards, logged as such
        self.kl_ctl.update(mean_kl, a.batch_size)

        self.global_step += 1
        self.episode += len(trajs) * self.world_size
        n_action = action_mask.sum(1).clamp(min=1)
        non_score = (-kl_coef_used * kl * action_mask).sum(1)
        correct = [
            t.answer is not None and bool(t.golds) and bool(exact_match(t.answer, t.golds)) for t in trajs
        ]
        metrics: dict[str, float] = {
            "step": self.global_step,
            "episode": self.episode,
            "objective/kl": mean_kl,
            "objective/entropy": float(((entropy * action_mask).sum(1)).mean()),
            "objective/entropy_per_token": float(masked_mean(entropy, action_mask)),
            "objective/non_score_reward": float(non_score.mean()),
            "objective/rlhf_reward": float(non_score.mean() + scores.mean()),
            "objective/scores": float(scores.mean()),
            "objective/scores_std": float(scores.std()) if len(scores) > 1 else 0.0,
            "kl_coef": kl_coef_used,
            "kl_coef_next": float(self.kl_ctl.value),
            "lr": float(self.lr_scheduler.get_last_lr()[0]),
            "val/explained_variance": masked_explained_variance(
                old_values * action_mask, returns, action_mask
            ),
            "rollout/logprob_max_abs_diff": float(logprob_gap.max()),
            "rollout/action_tokens_per_episode": float(n_action.mean()),
            "rollout/seconds": t_rollout,
            "tokens_per_second": float(batch["attention_mask"].sum()) / max(time.perf_counter() - t0, 1e-9),
            **train_stats,
            **likelihood_metrics(old_logprobs, action_mask, correct, ref_logprobs),
            **{k: float(v) for k, v in rollout_stats.items() if isinstance(v, int | float)},
            **self._reward_metrics(trajs),
        }
        metrics = self.ranks.reduce_metrics(metrics)
        self._save_trajectories(
            trajs, {"advantages": advantages, "kl": kl, "values": old_values * action_mask}
        )
        self.last_metrics = metrics
        self.last_trajectories = trajs
        return metrics

    def _optimise(self, batch, old_logprobs, old_values, advantages, returns) -> dict[str, float]:
        a = self.args
        self.model.train()
        B = batch["input_ids"].shape[0]
        mb_size = max(1, B // a.num_mini_batches)
        micro = a.per_device_train_batch_size
        full = {**batch, "old_logprobs": old_logprobs, "old_values": old_values, "advantages": advantages,
                "returns": returns}  # fmt: skip
        stats: dict[str, list[float]] = {
            k: [] for k in ("pg", "vf", "pg_clip", "vf_clip", "approxkl", "ratio", "grad_norm")
        }
        gen = torch.Generator().manual_seed(a.seed + self.global_step)
        skipped = 0
        for _epoch in range(a.num_ppo_epochs):
            perm = torch.randperm(B, generator=gen)
            for start in range(0, B, mb_size):
                mb_idx = perm[start : start + mb_size]
                # The token count of the whole mini-batch over all ranks: the weights below then give
                # the token-level mean over the global mini-batch (DDP averages over ranks, hence x N).
                mb_tokens = self.ranks.sum(full["action_mask"][mb_idx].sum()).clamp(min=1.0)
                micro_starts = list(range(0, len(mb_idx), micro))
                for j, ustart in enumerate(micro_starts):
                    mb = {
                        k: v.to(self.device)
                        for k, v in trim_to_length(full, mb_idx[ustart : ustart + micro]).items()
                    }
                    # Gradients are all-reduced once per mini-batch, on its last micro-batch only.
                    last_micro = j == len(micro_starts) - 1
                    sync = (
                        contextlib.nullcontext()
                        if last_micro
                        else self.accelerator.no_sync(self.wrapped_model)
                    )
                    with sync:
                        for k, v in self._micro_batch_backward(mb, mb_tokens).items():
                            stats[k].append(v)
                if self.uses_deepspeed:
                    # The engine clipped and stepped at its accumulation boundary (NOT run here).
                    grad_norm = self.wrapped_model.get_global_grad_norm() or 0.0
                else:
                    # max_grad_norm null: measure the norm, clip nothing.
                    limit = a.max_grad_norm if a.max_grad_norm is not None else float("inf")
                    grad_norm = torch.nn.utils.clip_grad_norm_(
                        [p for p in self.model.parameters() if p.requires_grad], limit
                    )
                stats["grad_norm"].append(float(grad_norm))
                if math.isfinite(float(grad_norm)) or self.uses_deepspeed:
                    self.optimizer.step()
                else:
                    # A NaN/inf gradient would poison every weight it touches: skip this update (counted in
                    # health/skipped_updates; the collapse guard treats it as a collapse).
                    skipped += 1
                self.lr_scheduler.step()
                self.optimizer.zero_grad(set_to_none=True)
        self.model.eval()
        return {
            "loss/policy_avg": float(np.mean(stats["pg"])),
            "loss/value_avg": float(np.mean(stats["vf"])),
            "policy/clipfrac_avg": float(np.mean(stats["pg_clip"])),
            "val/clipfrac_avg": float(np.mean(stats["vf_clip"])),
            "policy/approxkl_avg": float(np.mean(stats["approxkl"])),
            "val/ratio": float(np.mean(stats["ratio"])),
            "val/ratio_var": float(np.var(stats["ratio"])),
            "policy/first_ratio": stats["ratio"][0],
            "policy/first_approxkl": stats["approxkl"][0],
            "grad_norm": float(np.mean(stats["grad_norm"])),
            "health/skipped_updates": float(skipped),
        }

    def _micro_batch_backward(self, mb: dict[str, torch.Tensor], mb_tokens: torch.Tensor) -> dict[str, float]:
        """Forward and backward of one micro-batch, weighted by its share of the mini-batch's action tokens."""
        a = self.args
        with self._autocast():
            logits, vpred = self.wrapped_model(mb["input_ids"], mb["attention_mask"])
        new_logprobs = token_logprobs(logits, mb["input_ids"], a.temperature, a.top_k, a.top_p)
        pg, pg_stats = policy_loss(
            new_logprobs, mb["old_logprobs"], mb["advantages"], mb["action_mask"], a.cliprange
        )
        vf, vf_stats = value_loss(
            vpred, mb["old_values"], mb["returns"], mb["action_mask"], a.cliprange_value
        )
        # Each micro-batch's masked mean weighted by its share of the mini-batch's action tokens: the sum
        # equals the token-level mean over the whole (global) mini-batch.
        weight = mb["action_mask"].sum() / mb_tokens.to(self.device)
        if self.world_size > 1:
            weight = weight * self.world_size  # DDP divides the summed gradients by the world size
        self.accelerator.backward((pg + a.vf_coef * vf) * weight)
        return {
            "pg": pg.item(),
            "vf": vf.item(),
            "pg_clip": float(pg_stats["clipfrac"]),
            "vf_clip": float(vf_stats["clipfrac"]),
            "approxkl": float(pg_stats["approxkl"]),
            "ratio": float(pg_stats["ratio"]),
        }

    @staticmethod
    def _reward_metrics(trajs: list[Trajectory]) -> dict[str, float]:
        """Each reward term's batch mean (0 for an episode without it), termination shares, answer length.
        Tool counts and search latency come from the rollout's own statistics (`rollout.stats.tool_stats`),
        the one definition GRPO logs too."""
        keys = sorted({k for t in trajs for k in t.reward_breakdown})
        out = {f"reward/{k}": float(np.mean([t.reward_breakdown.get(k, 0.0) for t in trajs])) for k in keys}
        out.update(termination_stats(trajs))
        out["answer/length_words"] = float(np.mean([len((t.answer or "").split()) for t in trajs]))
        return out

    def _save_trajectories(self, trajs: list[Trajectory], per_token: dict[str, torch.Tensor]) -> None:
        if not self.args.save_trajectories:
            return
        for i, t in enumerate(trajs):
            t.metadata["step"] = self.global_step
            # Per-token PPO quantities (whitened advantages, KL to the reference, values) for the trajectory
            # viewer, cut to this trajectory's own length; 0 on non-action tokens.
            for name, values in per_token.items():
                t.metadata[name] = [round(float(x), 5) for x in values[i, : len(t.input_ids)]]
            if self.world_size > 1:
                t.metadata["rank"] = self.rank
        if self.world_size > 1:
            trajs = gather_object(list(trajs))  # one file per step, every rank's episodes, rank order
        if self.is_main:
            self.run.write_step_trajectories(self.global_step, trajs)

    # -----------------------------------------------------------------------------------------
    # evaluation on held-out rows: the loop `searchrl eval` runs (same prompt, retriever, answer extraction)
    # -----------------------------------------------------------------------------------------
    def evaluate(self, rows: list[dict] | None = None, seed: int = 0) -> dict[str, float]:
        """Dev evaluation at `eval_temperature` (`evaluate_during_training`, the loop every trainer and
        `searchrl eval` share); writes `RUN/eval/step-N.json` with `episode` and the clocks.

        Its time does not count as training time (`time/train_s`); callbacks get `on_evaluate`.
        """
        rows = rows if rows is not None else self.eval_rows[: self.args.num_eval_questions]
        if not rows:
            return {}
        eval_config = replace(self.generator.config, temperature=self.args.eval_temperature)
        # Evaluation time is not training time; the clock is read as the evaluation begins, as GRPO's.
        gathered = gathered_for_generation(self.wrapped_model, self.accelerator, self.uses_deepspeed)
        with self.training_clock.evaluating() as clock, torch.no_grad(), gathered:
            out = evaluate_during_training(
                self.policy,
                self.tokenizer,
                rows,
                self.env_factory,
                eval_config,
                rubric=self.rubric,
                batch_size=self.args.local_batch_size,
                seed=seed,
                generator=self.generator,  # the trainer's own engine (HF or vLLM)
            )
        if self.is_main:  # every rank evaluates the same rows with the same weights and seeds
            self.run.write_eval(self.global_step, {"episode": self.episode, **clock, **out})
        self._callback("on_evaluate", metrics=out)
        return out

    def clock(self) -> dict[str, float]:
        """`time/train_s` (training seconds so far, evaluation excluded, earlier sessions included) and
        `time/elapsed_s` (the same plus evaluation seconds)."""
        return self.training_clock.reading()

    # -----------------------------------------------------------------------------------------
    # checkpoints (`ppo/checkpointing.py`): atomic, pruned, restoring everything a resumed run needs
    # -----------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        final = checkpointing.save_checkpoint(self)
        self._callback("on_save")
        return final

    def load_checkpoint(self, path: str | Path, restore_clock: bool = True) -> None:
        checkpointing.load_checkpoint(self, path, restore_clock)

    # -----------------------------------------------------------------------------------------
    # the training loop
    # -----------------------------------------------------------------------------------------
    def train(self, resume: bool = False) -> dict[str, float]:
        a = self.args
        checkpointing.start_or_resume(self, resume)
        self._callback("on_train_begin")
        if a.eval_on_start and self.global_step == 0 and self.eval_rows:
            self._evaluate_on_start()
        with self._progress() as (progress, task):
            self.training_clock.start()
            while self.global_step < self.num_total_batches:
                metrics = self.step()
                # The clock stops at the end of the step: its reading is the step's and its eval file's.
                self.training_clock.stop()
                c = self.training_clock  # every rank takes the main process's readings (the ones it writes)
                c.train_seconds, c.eval_seconds = self.ranks.from_main(c.train_seconds, c.eval_seconds)
                metrics.update(self.clock())
                if self.eval_rows and self.cadence.should_evaluate(self.global_step):
                    metrics.update(self.evaluate())
                self.training_clock.start()
                rollback = a.collapse_guard and roll_back_on_collapse(self, metrics)
                if not rollback and self.unverified_checkpoint is not None:
                    # This step's rollouts came from the unverified weights and passed the guard.
                    self.last_good_checkpoint, self.unverified_checkpoint = self.unverified_checkpoint, None
                if self.cadence.should_log(self.global_step, metrics):
                    if self.is_main:  # metrics are already the same on every rank: logged once
                        self.run.log_metrics(metrics)
                    self._callback("on_log", logs=metrics)
                if self.is_main and self.last_trajectories and self.cadence.should_sample(self.global_step):
                    self.run.write_samples(self.global_step, self.last_trajectories, self.tokenizer)
                self._callback("on_step_end")
                checkpointing.save_after_step(self, metrics, rollback)  # every save_steps, and a new best
                info = f"score {metrics['objective/scores']:.3f} kl {metrics['objective/kl']:.3f}"
                progress.update(task, completed=self.global_step, info=info)
        latest = self.run.latest_checkpoint()
        if latest is None or latest.name != f"step-{self.global_step}":
            self.save_checkpoint()
        self.training_clock.stop()
        self._callback("on_train_end")
        return self.last_metrics

    def _evaluate_on_start(self) -> None:
        """`eval_on_start`: the starting policy measured before the first update, as `eval/step-0.json` and
        a step-0 metrics line (episode 0, training clock 0), like GRPO's runs and transformers' Trainer."""
        line = {"step": 0, "episode": self.episode, **self.clock(), **self.evaluate()}
        if self.is_main:
            self.run.log_metrics(line)
        checkpointing.save_after_step(self, line)  # the warm start itself may stay the best policy of the run
        self._callback("on_log", logs=line)

    @contextlib.contextmanager
    def _progress(self) -> Any:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        columns = (TextColumn("[bold]PPO"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                   TextColumn("{task.fields[info]}"))  # fmt: skip
        with Progress(*columns, disable=not self.args.progress_bar or not self.is_main) as progress:
            yield (
                progress,
                progress.add_task("ppo", total=self.num_total_batches, completed=self.global_step, info=""),
            )

    def _callback(self, event: str, **kwargs: Any) -> None:
        """transformers callbacks (`ppo/callbacks.py`): the `report_to` integrations and the user's own."""
        self.callbacks.fire(event, self, **kwargs)
