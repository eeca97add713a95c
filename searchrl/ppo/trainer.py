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
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from accelerate.utils import gather_object
from torch import nn
from transformers import get_scheduler

from searchrl.common.clock import TrainingClock
from searchrl.common.config import save_config
from searchrl.common.io import append_jsonl, atomic_write_json
from searchrl.common.run import RunDir, build_manifest, step_of_name
from searchrl.common.trajectory import TERMINATION_REASONS, Trajectory, write_trajectories
from searchrl.models.forward_patches import shares_storage
from searchrl.ppo.advantages import (
    apply_missing_eos_penalty,
    compute_gae,
    masked_explained_variance,
    masked_mean,
    place_rewards,
)
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.distributed import RankOps
from searchrl.ppo.guard import CollapseGuard, rescale_learning_rates
from searchrl.ppo.kl import kl_penalty, make_kl_controller, per_sequence_kl
from searchrl.ppo.losses import policy_loss, value_loss
from searchrl.ppo.modeling import (
    PolicyAndValue,
    disable_dropout,
    frozen_copy,
    load_adapter_weights,
    load_weights,
    position_ids_from_mask,
    prepare_policy,
    token_entropy,
    token_logprobs,
    value_model_from_policy,
)
from searchrl.ppo.optim import build_optimizer, check_optimizer_covers
from searchrl.rewards.reward_model import FrozenRewardModel
from searchrl.rollout.generator import GenerationConfig, HFGenerator

logger = logging.getLogger(__name__)

# ---------------------------------------------------------------------------------------------
# Batching trajectories: right-padded tensors; masks come from lengths and spans, never from pad ids.
# ---------------------------------------------------------------------------------------------


def collate_trajectories(trajs: Sequence[Trajectory], pad_token_id: int) -> dict[str, torch.Tensor]:
    T = max(len(t.input_ids) for t in trajs)
    B = len(trajs)
    input_ids = torch.full((B, T), pad_token_id, dtype=torch.long)
    attention_mask = torch.zeros((B, T), dtype=torch.long)
    action_mask = torch.zeros((B, T), dtype=torch.float32)
    rollout_logprobs = torch.zeros((B, T), dtype=torch.float32)
    for i, t in enumerate(trajs):
        n = len(t.input_ids)
        input_ids[i, :n] = torch.tensor(t.input_ids, dtype=torch.long)
        attention_mask[i, :n] = 1
        action_mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.float32)
        rollout_logprobs[i, :n] = torch.tensor(t.logprobs, dtype=torch.float32)
    return {
        "input_ids": input_ids,
        "attention_mask": attention_mask,
        "action_mask": action_mask,
        "rollout_logprobs": rollout_logprobs,
    }


def trim_to_length(batch: dict[str, torch.Tensor], idx: torch.Tensor) -> dict[str, torch.Tensor]:
    """Select rows and cut the columns to the longest selected row (less compute per micro-batch)."""
    sub = {k: v[idx] for k, v in batch.items()}
    length = int(sub["attention_mask"].sum(1).max())
    return {k: (v[:, :length] if v.dim() == 2 else v) for k, v in sub.items()}


def explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """`masked_explained_variance`, NaN when fewer than two action tokens leave it undefined."""
    if float(mask.sum()) < 2:
        return float("nan")
    return masked_explained_variance(values, returns, mask)


# ---------------------------------------------------------------------------------------------
# The trainer
# ---------------------------------------------------------------------------------------------


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
        self.args = args
        self.tokenizer = tok
        self.train_rows = [dict(r) for r in train_dataset]
        self.eval_rows = [dict(r) for r in eval_dataset] if eval_dataset is not None else []
        self.env_factory = environment
        self.rubric = reward_funcs
        self._init_callbacks(callbacks)
        self.run = RunDir(args.output_dir)
        # One process: a no-op wrapper (the device is the one the trainer always picked). Several processes
        # (`accelerate launch`): rank, world size, DDP/DeepSpeed and the collectives come from here.
        self.accelerator = Accelerator(cpu=args.use_cpu or not torch.cuda.is_available())
        self.rank = self.accelerator.process_index
        self.world_size = self.accelerator.num_processes
        self.is_main = self.accelerator.is_main_process
        self.uses_deepspeed = getattr(self.accelerator.state, "deepspeed_plugin", None) is not None
        self.device = self.accelerator.device
        self.ranks = RankOps(self.accelerator)  # sums, means, whitening and metrics over all ranks
        if args.mixed_precision == "fp16":
            raise ValueError(
                "mixed_precision='fp16' needs loss scaling, which this trainer does not do; use 'bf16' "
                "(autocast, no scaler needed) or 'no'"
            )
        # Different seeds per rank (TRL's `seed + rank * 100003`); DDP broadcasts rank 0's weights anyway.
        self._seed_everything(args.seed + self.rank * 100003)

        # --- models -------------------------------------------------------------------------
        # A policy fresh from an in-process SFT (or GRPO) carries trainer wrappers on `forward`: remove them,
        # so it samples and trains in its own precision and nothing copied from it can run it instead.
        prepare_policy(model)
        for role, side in (("ref_model", ref_model), ("value_model", value_model)):
            if side is not None:
                prepare_policy(side, role)
                if shares_storage(side, model):
                    raise ValueError(
                        f"{role} shares weights with the policy, so it would move with every update; pass an "
                        f"independent model (or None to have one built from the policy)"
                    )
        already_peft = hasattr(model, "disable_adapter")
        if already_peft and peft_config is not None:
            raise ValueError("model is already a PeftModel: pass peft_config=None, or pass the base model")
        # The critic is built from the base weights *before* any adapter is injected.
        if value_model is None and args.value_mode == "separate":
            value_model = value_model_from_policy(model.get_base_model() if already_peft else model)
        if peft_config is not None:
            from peft import get_peft_model

            model = get_peft_model(model, peft_config)
        self.is_peft = hasattr(model, "disable_adapter")
        if ref_model is None and not self.is_peft:
            ref_model = frozen_copy(model)
        self.ref_model = ref_model
        if args.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.model = PolicyAndValue(model, value_model, args.value_mode).to(self.device)
        self.policy = self.model.policy
        for m in (self.policy, value_model, ref_model, reward_model):
            if m is not None:
                disable_dropout(m)

        # --- batch arithmetic (TRL 1.12's names) --------------------------------------------
        args.finalize(world_size=self.world_size, num_train_rows=len(self.train_rows))
        if self.uses_deepspeed:
            self._configure_deepspeed()
        reward_model = self._prepare_for_inference(reward_model)
        self.reward_model = FrozenRewardModel(reward_model) if reward_model is not None else None
        if self.ref_model is not None:
            self.ref_model = self._prepare_for_inference(self.ref_model).eval()
        self.num_total_batches = args.num_total_batches

        # --- optimizer and scheduler: one optimizer, two param groups (policy lr, value lr) ----
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
        # The module the gradient passes go through: DDP (or a DeepSpeed engine) over the same parameters
        # as `self.model`, which stays the plain module for rollouts, no-grad passes and checkpoints. The
        # scheduler is not prepared: accelerate's wrapper would step it once per process.
        self.wrapped_model: nn.Module = self.model
        if self.world_size > 1 or self.uses_deepspeed:
            self.wrapped_model, self.optimizer = self.accelerator.prepare(self.model, self.optimizer)

        # --- KL control ----------------------------------------------------------------------
        self.kl_ctl = make_kl_controller(args.kl_coef, args.kl_target, args.kl_horizon)

        # --- rollout engine --------------------------------------------------------------------
        self.generation_config = GenerationConfig(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=args.top_k,
            max_new_tokens_per_turn=args.max_new_tokens_per_turn,
            max_episode_tokens=args.max_episode_tokens,
            seed=args.seed,
        )
        if generator_factory is None and args.rollout_backend == "vllm":
            # vLLM rollouts (GPU): checks vllm/CUDA first and raises ConfigError saying how to fix it.
            from searchrl.rollout.vllm_generator import vllm_generator_factory

            generator_factory = vllm_generator_factory(args, uses_deepspeed=self.uses_deepspeed)
        make_gen = generator_factory or HFGenerator
        self.generator = make_gen(self.policy, tok, self.generation_config)
        # The stop token the rollout ends a turn on (TRL 1.12's `stop_token_id`): the missing-EOS
        # penalty checks for it, not for whatever `eos_token_id` a model config might carry.
        self.stop_token_ids = {int(getattr(self.generator, "eos_id", tok.eos_token_id))}
        self.stop_strings = list(getattr(environment(), "stop_strings", []) or [])

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
        # The best dev evaluation so far by `best_metric` ({"step", "metric", "value"}) and its checkpoint.
        self.best: dict[str, Any] | None = None
        self.best_checkpoint: Path | None = None
        self.lr_scale = 1.0  # product of the guard's learning-rate cuts, re-applied after every load
        # The training clock (`time/train_s`, the x axis of the trainers-side-by-side plots): seconds spent
        # in the training loop, evaluation excluded, summed over sessions. Checkpointed, so a resumed run
        # goes on from its checkpoint's value; `eval_seconds` is the evaluation time on the same terms.
        self.training_clock = TrainingClock()

    # -----------------------------------------------------------------------------------------
    # several processes: DeepSpeed set-up and the cross-rank statistics (identity on one process)
    # -----------------------------------------------------------------------------------------
    def _configure_deepspeed(self) -> None:
        """Fill the batch fields DeepSpeed needs but cannot infer without a dataloader (NOT run here).

        One DeepSpeed "step" is one of our optimizer steps: `micro_batches_per_mini_batch` micro-batches of
        `per_device_train_batch_size` episodes; gradient clipping moves into the engine.
        """
        ds_config = self.accelerator.state.deepspeed_plugin.deepspeed_config
        ds_config["train_micro_batch_size_per_gpu"] = self.args.per_device_train_batch_size
        ds_config["gradient_accumulation_steps"] = self.args.micro_batches_per_mini_batch
        ds_config["gradient_clipping"] = self.args.max_grad_norm

    def _prepare_for_inference(self, model: nn.Module | None) -> nn.Module | None:
        """Reference and reward models: frozen, no optimizer. DeepSpeed shards them for inference
        (`trl.models.prepare_deepspeed`, ZeRO-3 aware); otherwise they are only moved to the device."""
        if model is None:
            return None
        if self.uses_deepspeed:
            from trl.models import prepare_deepspeed

            return prepare_deepspeed(model, self.accelerator)
        return model.to(self.device)

    # -----------------------------------------------------------------------------------------
    # data and seeds
    # -----------------------------------------------------------------------------------------
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
    # 1. rollout
    # -----------------------------------------------------------------------------------------
    def _shard(self, rows: list[dict]) -> list[dict]:
        """This rank's slice of the step's rows: rows r, r + N, r + 2N, ... (all of them on one process)."""
        return rows[self.rank :: self.world_size]

    @torch.no_grad()
    def rollout(
        self, rows: list[dict], seed: int, temperature: float | None = None
    ) -> tuple[list[Trajectory], dict]:
        if self.uses_deepspeed:
            # ZeRO-3 partitions the weights: gather them for generation (NOT run in this session).
            from trl.models import unwrap_model_for_generation

            with unwrap_model_for_generation(self.wrapped_model, self.accelerator):
                return self._rollout(rows, seed, temperature)
        return self._rollout(rows, seed, temperature)

    def _rollout(
        self, rows: list[dict], seed: int, temperature: float | None
    ) -> tuple[list[Trajectory], dict]:
        self.policy.eval()
        envs = [self.env_factory() for _ in rows]
        gen_cfg = self.generator.config
        saved = (gen_cfg.seed, gen_cfg.temperature)
        gen_cfg.seed = seed
        if temperature is not None:
            gen_cfg.temperature = temperature
        try:
            batch = self.generator.rollout(envs, rows)
        finally:
            gen_cfg.seed, gen_cfg.temperature = saved
        return list(batch.trajectories), dict(getattr(batch, "stats", {}) or {})

    # -----------------------------------------------------------------------------------------
    # 2. score
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
        self.model.eval()
        B = batch["input_ids"].shape[0]
        lps, vals, ents = [], [], []
        for i in range(0, B, self.args.local_rollout_forward_batch_size):
            idx = torch.arange(i, min(B, i + self.args.local_rollout_forward_batch_size))
            mb = {k: v[idx].to(self.device) for k, v in batch.items()}
            with self._autocast():
                logits, values = self.model(mb["input_ids"], mb["attention_mask"])
            lps.append(
                token_logprobs(
                    logits, mb["input_ids"], self.args.temperature, self.args.top_k, self.args.top_p
                ).cpu()
            )
            ents.append(token_entropy(logits, self.args.temperature).cpu())
            vals.append(values.cpu())
        return torch.cat(lps), torch.cat(vals), torch.cat(ents)

    @torch.no_grad()
    def _ref_logprobs(self, batch: dict[str, torch.Tensor]) -> torch.Tensor:
        B = batch["input_ids"].shape[0]
        out = []
        for i in range(0, B, self.args.local_rollout_forward_batch_size):
            ids = batch["input_ids"][i : i + self.args.local_rollout_forward_batch_size].to(self.device)
            mask = batch["attention_mask"][i : i + self.args.local_rollout_forward_batch_size].to(self.device)
            kwargs = dict(
                input_ids=ids, attention_mask=mask, position_ids=position_ids_from_mask(mask), use_cache=False
            )
            if self.ref_model is None:  # PEFT: the reference is the policy with its adapter disabled
                with self.policy.disable_adapter(), self._autocast():
                    logits = self.policy(**kwargs).logits
            else:
                with self._autocast():
                    logits = self.ref_model(**kwargs).logits
            out.append(
                token_logprobs(logits, ids, self.args.temperature, self.args.top_k, self.args.top_p).cpu()
            )
        return torch.cat(out)

    # -----------------------------------------------------------------------------------------
    # one PPO step
    # -----------------------------------------------------------------------------------------
    def step(self) -> dict[str, float]:
        a = self.args
        t0 = time.perf_counter()
        rows = self._shard(self._next_rows(a.batch_size))
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

        # 4. rewards: per-token KL penalty on action tokens, the score on the last action token.
        kl = kl_penalty(old_logprobs, ref_logprobs, a.kl_estimator) * action_mask
        rewards = place_rewards(scores, kl, action_mask, self.kl_ctl.value)
        if a.whiten_rewards:
            rewards = self.ranks.whiten(rewards, action_mask, shift_mean=False) * action_mask

        # 5. advantages: GAE over action tokens only; returns from the raw advantages.
        advantages, returns = compute_gae(rewards, old_values * action_mask, action_mask, a.gamma, a.lam)
        if a.whiten_advantages:
            advantages = self.ranks.whiten(advantages, action_mask) * action_mask

        # 6. optimise
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
        health = self._health_metrics(trajs, old_logprobs, ref_logprobs, action_mask)
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
            "val/explained_variance": explained_variance(old_values * action_mask, returns, action_mask),
            "rollout/logprob_max_abs_diff": float(logprob_gap.max()),
            "rollout/action_tokens_per_episode": float(n_action.mean()),
            "rollout/seconds": t_rollout,
            "tokens_per_second": float(batch["attention_mask"].sum()) / max(time.perf_counter() - t0, 1e-9),
            **train_stats,
            **health,
            **{k: float(v) for k, v in rollout_stats.items() if isinstance(v, int | float)},
        }
        metrics.update(self._reward_metrics(trajs))
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
        full = {
            **batch,
            "old_logprobs": old_logprobs,
            "old_values": old_values,
            "advantages": advantages,
            "returns": returns,
        }
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
                    idx = mb_idx[ustart : ustart + micro]
                    mb = {k: v.to(self.device) for k, v in trim_to_length(full, idx).items()}
                    # Gradients are all-reduced once per mini-batch, on its last micro-batch only.
                    last_micro = j == len(micro_starts) - 1
                    sync = (
                        contextlib.nullcontext()
                        if last_micro
                        else self.accelerator.no_sync(self.wrapped_model)
                    )
                    with sync:
                        stats_mb = self._micro_batch_backward(mb, mb_tokens)
                    for k, v in stats_mb.items():
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
    def _health_metrics(
        trajs: list[Trajectory], logprobs: torch.Tensor, ref_logprobs: torch.Tensor, action_mask: torch.Tensor
    ) -> dict[str, float]:
        """What collapsing runs show first (Search-R1 #88/#89, LLDS): non-finite logprobs, and the likelihood
        of the policy's own sampled tokens, overall and on the episodes it got right, falling step after step."""
        from searchrl.rewards.qa import exact_match

        valid = action_mask.bool()
        finite = torch.isfinite(logprobs) & torch.isfinite(ref_logprobs)
        out = {"health/nonfinite_logprobs": float((valid & ~finite).sum())}
        safe = torch.where(finite, logprobs, torch.zeros_like(logprobs))
        per_traj = (safe * action_mask).sum(1) / action_mask.sum(1).clamp(min=1)
        out["objective/logprob_per_token"] = float(masked_mean(safe, action_mask))
        right = [
            i
            for i, t in enumerate(trajs)
            if t.answer is not None and t.golds and exact_match(t.answer, t.golds)
        ]
        if right:
            out["objective/logprob_per_token_correct"] = float(per_traj[right].mean())
        return out

    def _reward_metrics(self, trajs: list[Trajectory]) -> dict[str, float]:
        out: dict[str, float] = {}
        keys = sorted({k for t in trajs for k in t.reward_breakdown})
        for k in keys:
            out[f"reward/{k}"] = float(np.mean([t.reward_breakdown.get(k, 0.0) for t in trajs]))
        for reason in TERMINATION_REASONS:
            out[f"termination/{reason}"] = float(np.mean([t.termination == reason for t in trajs]))
        # Tool counts and search latency come from the rollout's `rollout_stats` (`searchrl.rollout.stats.
        # tool_stats`), the one definition GRPO logs too: latency over every call that reached the engine.
        out["answer/length_words"] = float(np.mean([len((t.answer or "").split()) for t in trajs]))
        return out

    def _save_trajectories(
        self, trajs: list[Trajectory], per_token: dict[str, torch.Tensor] | None = None
    ) -> None:
        if self.args.save_trajectories:
            for i, t in enumerate(trajs):
                t.metadata["step"] = self.global_step
                # Per-token PPO quantities (whitened advantages, KL to the reference, values) for the
                # trajectory viewer, cut to this trajectory's own length; 0 on non-action tokens.
                for name, values in (per_token or {}).items():
                    t.metadata[name] = [round(float(x), 5) for x in values[i, : len(t.input_ids)]]
                if self.world_size > 1:
                    t.metadata["rank"] = self.rank
            if self.world_size > 1:
                trajs = gather_object(list(trajs))  # one file per step, every rank's episodes, rank order
            if self.is_main:
                write_trajectories(self.run.trajectories / f"step-{self.global_step:06d}.jsonl.gz", trajs)

    # -----------------------------------------------------------------------------------------
    # evaluation on held-out rows (same prompt, retriever, decoding and answer extraction as offline eval)
    # -----------------------------------------------------------------------------------------
    def evaluate(self, rows: list[dict] | None = None, seed: int = 0) -> dict[str, float]:
        """Dev evaluation at `eval_temperature`; writes `RUN/eval/step-N.json` with `episode` and the clocks.

        Its time does not count as training time (`time/train_s`); callbacks get `on_evaluate`.
        """
        rows = rows if rows is not None else self.eval_rows[: self.args.num_eval_questions]
        if not rows:
            return {}
        # Evaluation time is not training time; the clock is read as the evaluation begins, as GRPO's.
        with self.training_clock.evaluating() as clock:
            out = self._evaluate_rows(rows, seed)
        if self.is_main:  # every rank evaluates the same rows with the same weights and seeds
            atomic_write_json(
                self.run.eval / f"step-{self.global_step}.json",
                {"step": self.global_step, "episode": self.episode, **clock, **out},
            )
        self._callback("on_evaluate", metrics=out)
        return out

    @torch.no_grad()
    def _evaluate_rows(self, rows: list[dict], seed: int) -> dict[str, float]:
        from searchrl.evaluation.evaluate import dev_metrics

        trajs: list[Trajectory] = []
        bs = self.args.local_batch_size
        for i in range(0, len(rows), bs):
            t, _ = self.rollout(rows[i : i + bs], seed=seed + i, temperature=self.args.eval_temperature)
            trajs.extend(t)
        return dev_metrics(trajs, self.rubric)

    def _evaluate_on_start(self) -> None:
        """`eval_on_start`: the starting policy measured before the first update, as `eval/step-0.json` and
        a step-0 metrics line (episode 0, training clock 0), like GRPO's runs and transformers' Trainer."""
        clock = self.clock()
        line = {"step": 0, "episode": self.episode, **clock, **self.evaluate()}
        if self.is_main:
            append_jsonl(self.run.metrics, line)
        if self._is_new_best(line):  # the warm start itself may stay the best policy of the run
            existing = self.run.checkpoint_dir(0)
            self._record_best(
                existing if (existing / "trainer_state.json").exists() else self.save_checkpoint()
            )
        self._callback("on_log", logs=line)

    # -----------------------------------------------------------------------------------------
    # the training clock (searchrl/common/clock.py): runs inside the training loop, stops for evaluation
    # -----------------------------------------------------------------------------------------
    def clock(self) -> dict[str, float]:
        """`time/train_s` (training seconds so far, evaluation excluded, earlier sessions included) and
        `time/elapsed_s` (the same plus evaluation seconds)."""
        return self.training_clock.reading()

    def _sync_clock(self) -> None:
        """Every rank takes the main process's readings (the ones it writes), so logged metrics agree."""
        c = self.training_clock
        c.train_seconds, c.eval_seconds = self.ranks.from_main(c.train_seconds, c.eval_seconds)

    # -----------------------------------------------------------------------------------------
    # checkpoints: written to a temporary folder, then renamed; `trainer_state.json` marks completion
    # -----------------------------------------------------------------------------------------
    def save_checkpoint(self) -> Path:
        """Written by the main process; every rank waits until it is complete, then may read it."""
        final = self.run.checkpoint_dir(self.global_step)
        if self.is_main:
            self.run.write_checkpoint(self.global_step, self._fill_checkpoint)
            # `save_total_limit`, never deleting the newest one, the guard's rollback targets or the best.
            protected = {final, self.last_good_checkpoint, self.unverified_checkpoint, self.best_checkpoint}
            self.run.prune_checkpoints(self.args.save_total_limit, protected)
        self.accelerator.wait_for_everyone()
        self._callback("on_save")
        return final

    def _fill_checkpoint(self, folder: Path) -> None:
        """`policy/` (weights + tokenizer), the value model or head, optimizer + scheduler + RNG, and
        `trainer_state.json` last (`RunDir.write_checkpoint` then renames the folder into place)."""
        model = self.accelerator.unwrap_model(self.wrapped_model)  # the plain PolicyAndValue, not DDP
        model.policy.save_pretrained(folder / "policy")  # with PEFT: the adapter only (the base is frozen)
        self.tokenizer.save_pretrained(folder / "policy")
        if model.value_mode == "separate":
            model.value_model.save_pretrained(folder / "value")
        else:
            torch.save(model.value_head.state_dict(), folder / "value_head.pt")
        torch.save(
            {
                "optimizer": self.optimizer.state_dict(),
                "scheduler": self.lr_scheduler.state_dict(),
                "rng": {
                    "python": random.getstate(),
                    "numpy": np.random.get_state(),
                    "torch": torch.get_rng_state(),
                },
            },
            folder / "optim_rng.pt",
        )
        state = {
            "global_step": self.global_step,
            "episode": self.episode,
            "data_epoch": self.data_epoch,
            "data_offset": self.data_offset,
            "kl_controller": self.kl_ctl.state_dict(),
            "guard": self.guard.state_dict(),
            "last_metrics": self.last_metrics,
            "rollbacks": self.rollbacks,
            "lr_scale": self.lr_scale,
            "best": self.best,
            **self.clock(),
            "time/eval_s": self.training_clock.eval_seconds,
        }
        atomic_write_json(folder / "trainer_state.json", state)

    def load_checkpoint(self, path: str | Path, restore_clock: bool = True) -> None:
        """Restore everything a checkpoint holds. `restore_clock=False` (the collapse guard's rollback) keeps
        the training clock running on: the failed steps took real time."""
        path = Path(path)
        state = json.loads((path / "trainer_state.json").read_text())
        if self.is_peft:
            load_adapter_weights(self.policy, path / "policy")
        else:
            load_weights(self.policy, path / "policy")
        if self.model.value_mode == "separate":
            load_weights(self.model.value_model, path / "value")
        else:
            self.model.value_head.load_state_dict(torch.load(path / "value_head.pt"))
        blob = torch.load(path / "optim_rng.pt", weights_only=False)
        self.optimizer.load_state_dict(blob["optimizer"])
        self.lr_scheduler.load_state_dict(blob["scheduler"])
        random.setstate(blob["rng"]["python"])
        np.random.set_state(blob["rng"]["numpy"])
        torch.set_rng_state(blob["rng"]["torch"])
        self.global_step = state["global_step"]
        self.episode = state["episode"]
        self.data_epoch = state["data_epoch"]
        self.data_offset = state["data_offset"]
        self.kl_ctl.load_state_dict(state["kl_controller"])
        self.guard.load_state_dict(state.get("guard", {}))
        self.last_metrics = state.get("last_metrics", {})
        self.rollbacks = int(state.get("rollbacks", 0))
        self.lr_scale = float(state.get("lr_scale", 1.0))
        if restore_clock:  # a rollback keeps the best found so far; a resumed run takes the checkpoint's
            self.best = state.get("best")
            self.best_checkpoint = (
                self.run.checkpoint_dir(int(self.best["step"])) if self.best is not None else None
            )
        if restore_clock:
            self.training_clock.restore(state.get("time/train_s", 0.0), state.get("time/eval_s", 0.0))
        self.last_good_checkpoint = path

    # -----------------------------------------------------------------------------------------
    # the training loop
    # -----------------------------------------------------------------------------------------
    def train(self, resume: bool = False) -> dict[str, float]:
        a = self.args
        if resume:
            ckpt = self.run.latest_checkpoint()
            if ckpt is not None:
                self.load_checkpoint(ckpt)
            if self.is_main:
                # Lines logged after the checkpoint go. A run resumed at step 0 starts over (its step-0
                # evaluation included), so none of its lines stay.
                self.run.truncate_after(self.global_step if self.global_step > 0 else -1)
        if self.global_step == 0 and self.is_main:
            save_config(a, self.run.config)
            self.run.write_manifest(
                build_manifest(
                    seeds={"seed": a.seed},
                    tokenizer=self.tokenizer,
                    generation_config=asdict(self.generation_config),
                    config=a,
                    extra={
                        "trainer": "ppo",
                        "value_mode": a.value_mode,
                        "kl_controller": type(self.kl_ctl).__name__,
                    },
                )
            )
        if self.global_step == 0 and a.collapse_guard:
            self.last_good_checkpoint = self.save_checkpoint()
        self._callback("on_train_begin")
        if a.eval_on_start and self.global_step == 0 and self.eval_rows:
            self._evaluate_on_start()
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        progress = Progress(
            TextColumn("[bold]PPO"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            disable=not a.progress_bar or not self.is_main,
        )
        with progress:
            task = progress.add_task("ppo", total=self.num_total_batches, completed=self.global_step, info="")
            self.training_clock.start()
            while self.global_step < self.num_total_batches:
                metrics = self.step()
                # The clock stops at the end of the step: its reading is the step's and its eval file's.
                self.training_clock.stop()
                self._sync_clock()
                metrics.update(self.clock())
                if a.eval_steps and self.eval_rows and self.global_step % a.eval_steps == 0:
                    metrics.update(self.evaluate())
                self.training_clock.start()
                rollback = a.collapse_guard and self._collapse_check(metrics)
                if not rollback and self.unverified_checkpoint is not None:
                    # This step's rollouts came from the unverified weights and passed the guard.
                    self.last_good_checkpoint, self.unverified_checkpoint = self.unverified_checkpoint, None
                if self._should_log(metrics):
                    if self.is_main:  # metrics are already the same on every rank: logged once
                        append_jsonl(self.run.metrics, metrics)
                    self._callback("on_log", logs=metrics)
                self._log_samples(metrics)
                self._callback("on_step_end")
                improved = not rollback and self._is_new_best(metrics)
                regular = not rollback and a.save_steps and self.global_step % a.save_steps == 0
                if regular or improved:
                    saved = self.save_checkpoint()
                    if improved:
                        self._record_best(saved)
                    if regular and a.collapse_guard:
                        self.unverified_checkpoint = saved
                    elif regular:
                        self.last_good_checkpoint = saved
                progress.update(
                    task,
                    completed=self.global_step,
                    info=f"score {metrics['objective/scores']:.3f} kl {metrics['objective/kl']:.3f}",
                )
        if (
            self.run.latest_checkpoint() is None
            or self.run.latest_checkpoint().name != f"step-{self.global_step}"
        ):
            self.save_checkpoint()
        self.training_clock.stop()
        self._callback("on_train_end")
        return self.last_metrics

    def _should_log(self, metrics: dict[str, Any]) -> bool:
        """Every `logging_steps` steps, and always a step that evaluated, rolled back or ended the run."""
        if self.global_step % self.args.logging_steps == 0 or self.global_step >= self.num_total_batches:
            return True
        return any(k.startswith(("eval/", "guard/")) for k in metrics)

    def _log_samples(self, metrics: dict[str, Any]) -> None:
        """`num_sample_generations` times over the run (TRL's field): a few of this step's episodes as text in
        RUN/samples.jsonl (question, golds, the decoded episode after the prompt, answer, reward)."""
        n = self.args.num_sample_generations
        if not n or not self.is_main or not self.last_trajectories:
            return
        every = max(1, self.num_total_batches // n)
        if self.global_step % every and self.global_step != self.num_total_batches:
            return
        for t in self.last_trajectories[:4]:
            episode = self.tokenizer.decode(t.input_ids[t.prompt_length :], skip_special_tokens=False)
            row = {"step": self.global_step, "id": t.id, "question": t.question, "golds": t.golds,
                   "episode": episode, "answer": t.answer, "reward": t.reward}  # fmt: skip
            append_jsonl(self.run.samples, row)

    def _is_new_best(self, metrics: dict[str, Any]) -> bool:
        """True (and `self.best` updated) when this step's dev evaluation beats the best `best_metric`."""
        name = self.args.best_metric
        value = metrics.get(name) if name else None
        if not isinstance(value, int | float) or not math.isfinite(value):
            return False
        if self.best is not None and value <= self.best["value"]:
            return False
        self.best = {"step": self.global_step, "metric": name, "value": float(value)}
        return True

    def _record_best(self, checkpoint: Path) -> None:
        """The best checkpoint is never pruned and is named in `RUN/best_checkpoint.json`."""
        self.best_checkpoint = checkpoint
        if self.is_main and self.best is not None:
            atomic_write_json(self.run.best_checkpoint, {**self.best, "checkpoint": checkpoint.name})

    def _collapse_check(self, metrics: dict[str, float]) -> bool:
        """Roll back to the last good checkpoint with a lower learning rate when the guard fires.

        The failed step's metrics stay in the log (with `guard/*` keys saying why); `step` then restarts
        from the checkpoint's step, so the log's `step` column can repeat after a rollback. The cut
        compounds: after n rollbacks both learning rates are `collapse_lr_decay ** n` of the schedule's.
        """
        reason = self.guard.check({k: v for k, v in metrics.items() if isinstance(v, int | float)})
        if reason is None or self.last_good_checkpoint is None:
            return False
        if step_of_name(self.last_good_checkpoint.name) == self.global_step - 1:
            # This step's rollouts were sampled by the last good weights themselves: rolling back would redo
            # the same rollouts (same step, same seed) from the same weights. Say so and go on.
            metrics["guard/reason"] = reason  # type: ignore[assignment]
            metrics["guard/no_rollback"] = 1.0
            logger.warning("collapse guard: %s at step %d, on the last good weights' own rollouts: no rollback",
                           reason, self.global_step)  # fmt: skip
            return False
        if self.rollbacks >= self.args.collapse_max_rollbacks:
            if self.is_main:
                append_jsonl(self.run.metrics, {**metrics, "guard/reason": reason, "guard/gave_up": 1.0})
            raise RuntimeError(
                f"collapse guard: the run collapsed again at step {self.global_step} ({reason}) after "
                f"{self.rollbacks} rollbacks (collapse_max_rollbacks={self.args.collapse_max_rollbacks}); "
                "lower learning_rate, raise kl_coef, or loosen the collapse_* bounds"
            )
        failed_step = self.global_step
        rollbacks, lr_scale = self.rollbacks + 1, self.lr_scale * self.args.collapse_lr_decay
        self.load_checkpoint(self.last_good_checkpoint, restore_clock=False)
        self.unverified_checkpoint = None  # its weights produced the collapse
        # The checkpoint's scheduler already carries its own lr_scale: scale by the ratio only.
        rescale_learning_rates(self.optimizer, self.lr_scheduler, lr_scale / self.lr_scale)
        self.rollbacks, self.lr_scale = rollbacks, lr_scale
        self.guard.reset_window()
        metrics["guard/rollback"] = 1.0
        metrics["guard/rollbacks"] = float(self.rollbacks)
        metrics["guard/lr_scale"] = self.lr_scale
        metrics["guard/rolled_back_to_step"] = float(self.global_step)
        metrics["guard/failed_step"] = float(failed_step)
        metrics["guard/reason"] = reason  # type: ignore[assignment]
        return True

    # -----------------------------------------------------------------------------------------
    # transformers callbacks: report_to integrations (tensorboard, trackio, ...) plus the user's own
    # -----------------------------------------------------------------------------------------
    def _init_callbacks(self, callbacks: list[Any] | None) -> None:
        from transformers import TrainerControl, TrainerState, TrainingArguments
        from transformers.integrations import get_reporting_integration_callbacks
        from transformers.trainer_callback import CallbackHandler

        report_to = [r for r in self.args.report_to if r != "none"]
        self.hf_args = TrainingArguments(
            output_dir=str(self.args.output_dir),
            report_to=report_to or "none",
            use_cpu=not torch.cuda.is_available() or self.args.use_cpu,
            seed=self.args.seed,
            logging_steps=self.args.logging_steps,
            run_name=self.args.run_name or Path(self.args.output_dir).name,
            project="searchrl",  # trackio's project (transformers' default: "huggingface")
        )
        self.state = TrainerState()
        self.control = TrainerControl()
        from transformers.trainer_callback import DefaultFlowCallback

        integrations = get_reporting_integration_callbacks(report_to) if report_to else []
        self.callback_handler = CallbackHandler(
            [DefaultFlowCallback, *integrations, *(callbacks or [])], None, self.tokenizer, None, None
        )

    def _callback(self, event: str, **kwargs: Any) -> None:
        self.state.global_step = self.global_step
        self.state.max_steps = self.num_total_batches
        # transformers' integrations (tensorboard, ...) report only from the main process.
        self.state.is_world_process_zero = self.state.is_local_process_zero = self.is_main
        handler = self.callback_handler
        handler.model, handler.optimizer, handler.lr_scheduler = (
            self.policy,
            self.optimizer,
            self.lr_scheduler,
        )
        if event == "on_log":
            logs = {k: v for k, v in kwargs["logs"].items() if isinstance(v, int | float)}
            self.state.log_history.append(logs)
            kwargs = {"logs": logs}
        self.control = getattr(handler, event)(self.hf_args, self.state, self.control, **kwargs)
