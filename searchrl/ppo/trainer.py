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
                  metrics. Then `train()`: the collapse guard's decision (go on, roll back to the last
                  good checkpoint, give up) carried out, logs, checkpoints.

What differs from TRL 1.12 on purpose (see `reference/trl.md` §1.5-1.7): an explicit action mask
instead of "first pad" validity, the score on the last *action* token, the optimizer stepped per
mini-batch, gradients clipped, masked statistics, the critic checkpointed, resume supported, pad ≠ eos
required, separate learning rates for policy and value.

Several processes (`accelerate launch --num_processes N`): each rank rolls out its own slice of the
batch; token weights, whitening, the controller's KL and the metrics are made global through `self.ranks`
(`distributed.py` says how); on one process every such call is the identity.

What is not the algorithm has its own owner: the run layer (`searchrl.run.writer`: the run directory, when
to log, evaluate, save and write samples, the best checkpoint; `common.clock`; `common.health`, the
monitors GRPO logs too), `evaluation.loop.evaluate_during_training` (the dev loop), the rollout engines
(`searchrl.rollout`), and beside this file `dev_eval.py` (the dev evaluation between steps),
`value_replay.py` (the critic's replayed batches, `value_replay_steps`), `checkpointing.py` (what a
checkpoint holds, resume),
`callbacks.py` (transformers callbacks, the progress bar), `guard.py` (the collapse guard and its decision),
`distributed.py` (processes, cross-rank statistics, DeepSpeed), `modeling.py` (the models), `batch.py` (the
step's rows, trajectories as tensors) and `optim.py` (optimizer, scheduler, one clipped step).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from torch import nn

from searchrl.common.clock import TrainingClock
from searchrl.common.health import likelihood_metrics
from searchrl.common.trajectory import Trajectory
from searchrl.ppo import checkpointing, dev_eval
from searchrl.ppo.advantages import (
    apply_missing_eos_penalty,
    compute_gae,
    masked_explained_variance,
    masked_mean,
    place_rewards,
)
from searchrl.ppo.batch import attach_per_token, collate_trajectories, next_rows, trim_to_length
from searchrl.ppo.callbacks import TrainerCallbacks, progress_bar
from searchrl.ppo.config import PPOConfig
from searchrl.ppo.distributed import RankOps, configure_deepspeed, gathered_for_generation, seed_process
from searchrl.ppo.guard import CollapseGuard, rescale_learning_rates
from searchrl.ppo.kl import kl_penalty, make_kl_controller, per_sequence_kl
from searchrl.ppo.learning_check import LearningCheck
from searchrl.ppo.losses import policy_loss, value_loss
from searchrl.ppo.modeling import (
    assemble_models,
    frozen_models,
    position_ids_from_mask,
    token_entropy,
    token_logprobs,
)
from searchrl.ppo.optim import clip_and_step, optimizer_and_scheduler
from searchrl.ppo.rollout_is import RolloutIS
from searchrl.ppo.value_replay import ValueReplay, fit_critic_on_replay
from searchrl.rewards.qa import answered_right
from searchrl.rollout.backends import RolloutBackend, make_generator, sync_engine_weights
from searchrl.rollout.stats import scored_episode_stats
from searchrl.run.writer import BestCheckpoint, Cadence, RunDir

__all__ = ["PPOTrainer", "collate_trajectories", "trim_to_length"]

# How far a step's seeds move per collapse-guard rollback (`PPOTrainer._retry_offset`).
ROLLBACK_SEED_STRIDE = 7_919


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
        self.callbacks = TrainerCallbacks(args, tok, callbacks)
        self.hf_args = self.callbacks.hf_args
        self.run = RunDir(args.output_dir)
        # One process: a no-op wrapper. Several (`accelerate launch`): rank, world size, DDP/DeepSpeed, collectives.
        self.ranks = RankOps(Accelerator(cpu=args.use_cpu or not torch.cuda.is_available()))
        self.accelerator, self.device, self.uses_deepspeed = (
            self.ranks.accelerator, self.ranks.device, self.ranks.uses_deepspeed
        )  # fmt: skip
        self.rank, self.world_size, self.is_main = self.ranks.rank, self.ranks.world_size, self.ranks.is_main
        seed_process(args.seed, self.rank)

        # --- models: policy + critic in one module, the frozen reference, the frozen reward model ----
        module, ref_model, self.is_peft = assemble_models(
            model, ref_model, value_model, args.value_mode, peft_config, args.gradient_checkpointing
        )
        self.model = module.to(self.device)
        self.policy = self.model.policy
        args.finalize(world_size=self.world_size, num_train_rows=len(self.train_rows))  # TRL 1.12's names
        if self.uses_deepspeed:
            configure_deepspeed(self.accelerator, args)
        self.ref_model, self.reward_model = frozen_models(ref_model, reward_model, self.ranks)
        self.num_total_batches = args.num_total_batches

        # --- one optimizer, two param groups (policy lr, value lr), stepped once per mini-batch ---------
        self.num_optimizer_steps = self.num_total_batches * args.num_ppo_epochs * args.num_mini_batches
        self.optimizer, self.lr_scheduler = optimizer_and_scheduler(
            self.model, args, optimizers, self.num_optimizer_steps
        )
        # The gradient passes go through DDP (or a DeepSpeed engine); `self.model` stays the plain module.
        self.wrapped_model, self.optimizer = self.ranks.prepare(self.model, self.optimizer)
        self.kl_ctl = make_kl_controller(args.kl_coef, args.kl_target, args.kl_horizon)
        if args.value_replay_steps and self.uses_deepspeed:
            raise ValueError(
                "value_replay_steps needs the critic's own optimizer steps; DeepSpeed owns the step"
            )
        self.value_replay = ValueReplay(args.value_replay_steps)  # the critic's last batches (checkpointed)

        # --- rollout engine ----------------------------------------------------------------------------
        self.generation_config = args.generation_config()  # the one mapping eval and GRPO use too
        # `rollout_backend`: HF, or vLLM (checked first: a ConfigError saying how to fix it).
        if generator_factory is None:
            generator_factory = partial(make_generator, backend=RolloutBackend.of(args, self.uses_deepspeed))
        self.generator = generator_factory(self.policy, tok, self.generation_config)
        # The stop token the rollout ends a turn on (TRL 1.12's `stop_token_id`): the missing-EOS
        # penalty checks for it, not for whatever `eos_token_id` a model config might carry.
        self.stop_token_ids = {int(getattr(self.generator, "eos_id", tok.eos_token_id))}
        self.stop_strings = list(getattr(environment(), "stop_strings", []) or [])

        # --- run state: data position, the guard's rollback targets, the best dev checkpoint, clocks -----
        self.cadence = Cadence.of(args, self.num_total_batches)
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
        self.learning = LearningCheck()  # eval/answers_changed, eval/not_learning (`ppo/learning_check.py`)
        self.last_trajectories: list[Trajectory] = []
        self.rollbacks = 0  # collapse-guard rollbacks so far (checkpointed, so a resumed run keeps count)
        self.best = BestCheckpoint(self.run, args.best_metric)
        self.lr_scale = 1.0  # product of the guard's learning-rate cuts, re-applied after every load
        # `time/train_s` (the x axis of the trainers-side-by-side plots): training seconds, evaluation
        # excluded, summed over sessions; checkpointed, so a resumed run goes on from its checkpoint's value.
        self.training_clock = TrainingClock()

    def _autocast(self) -> Any:
        """bf16 autocast of the forward passes when `mixed_precision='bf16'` (logprobs and losses stay fp32)."""
        enabled = self.args.mixed_precision == "bf16"
        return torch.autocast(device_type=self.device.type, dtype=torch.bfloat16, enabled=enabled)

    # --- 1. rollout: this rank's rows r, r + N, r + 2N, ... of the step (all of them on one process) ---
    @torch.no_grad()
    def rollout(
        self, rows: list[dict], seed: int, temperature: float | None = None
    ) -> tuple[list[Trajectory], dict]:
        self.policy.eval()
        envs = [self.env_factory() for _ in rows]
        # The engine's config stays as built: this call's seed (and temperature) go with the call.
        changes = {"seed": seed} if temperature is None else {"seed": seed, "temperature": temperature}
        sampling = self.generator.config.sampling(**changes)
        with gathered_for_generation(self.wrapped_model, self.accelerator, self.uses_deepspeed):
            batch = self.generator.rollout(envs, rows, sampling)
        return list(batch.trajectories), dict(getattr(batch, "stats", {}) or {})

    # --- 2. score: rule rewards + weighted reward-model score, minus TRL 1.12's missing-EOS penalty ---
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
        """Did the policy end its last turn itself (the rollout's stop token, or a protocol stop string)?"""
        return traj.ends_with_stop(self.stop_token_ids, self.stop_strings)

    # --- 3. forward passes under no_grad: old logprobs, reference logprobs, values ---
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

    def _retry_offset(self) -> int:
        """Added to a step's rollout and mini-batch seeds: after a collapse-guard rollback the step is sampled
        afresh, since the same seed from the restored weights would replay the very rollouts that failed (the
        support demo rolled back three times onto the same episodes). 0 in a run without rollbacks."""
        return self.rollbacks * ROLLBACK_SEED_STRIDE

    # --- one PPO step: 1 -> 7 ---
    def step(self) -> dict[str, float]:
        a = self.args
        t0 = time.perf_counter()
        rows, self.data_epoch, self.data_offset = next_rows(
            self.train_rows, a.batch_size, a.seed, self.data_epoch, self.data_offset
        )
        rows = rows[self.rank :: self.world_size]  # this rank's slice of the global batch
        step_seed = a.seed * 1_000_003 + self.global_step + self.rank * 100003 + self._retry_offset()
        trajs, rollout_stats = self.rollout(rows, seed=step_seed)
        t_rollout = time.perf_counter() - t0
        batch = collate_trajectories(trajs, self.tokenizer.pad_token_id)
        action_mask = batch["action_mask"]

        # 2. score
        scores = self.score(trajs, batch)

        # 3-5. old and reference logprobs and values, per-token rewards, GAE (`estimate`, just below).
        est = self.estimate(batch, scores)
        old_logprobs, ref_logprobs, entropy = est["old_logprobs"], est["ref_logprobs"], est["entropy"]
        kl, values, advantages, returns = est["kl"], est["values"], est["advantages"], est["returns"]
        logprob_gap = (old_logprobs - batch["rollout_logprobs"]).abs() * action_mask

        # 6. optimise: the clipped surrogate and the clipped value loss (Schulman et al. 2017).
        train_stats = self._optimise(batch, old_logprobs, values, advantages, returns)
        sync_engine_weights(self.generator, self.policy)  # an engine with its own copy of the weights (vLLM)

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
            "val/explained_variance": masked_explained_variance(values, returns, action_mask),
            "val/explained_variance_mc": masked_explained_variance(values, est["mc_returns"], action_mask),
            "rollout/logprob_max_abs_diff": float(logprob_gap.max()),
            # the sampler's logprobs against the trainer's (`rollout_is/*`, every mode; ppo/rollout_is.py)
            **RolloutIS.of(a).metrics(old_logprobs, batch["rollout_logprobs"], action_mask),
            "rollout/action_tokens_per_episode": float(n_action.mean()),
            "rollout/seconds": t_rollout,
            "tokens_per_second": float(batch["attention_mask"].sum()) / max(time.perf_counter() - t0, 1e-9),
            **train_stats,
            **likelihood_metrics(old_logprobs, action_mask, answered_right(trajs), ref_logprobs),
            **{k: float(v) for k, v in rollout_stats.items() if isinstance(v, int | float)},
            **scored_episode_stats(trajs),
        }
        metrics = self.ranks.reduce_metrics(metrics)
        self._save_trajectories(trajs, {"advantages": advantages, "kl": kl, "values": values})
        self.last_metrics = metrics
        self.last_trajectories = trajs
        return metrics

    def estimate(self, batch: dict[str, torch.Tensor], scores: torch.Tensor) -> dict[str, torch.Tensor]:
        """Steps 3-5 of `step` on a collated, scored batch, before any update: the policy's and the reference's
        logprobs, the critic's values, the per-token KL and rewards, GAE's advantages and the critic's targets,
        and `mc_returns` (lambda 1: what an ideal critic predicts; benchmarks/critic_ceiling.py reads them)."""
        a, mask = self.args, batch["action_mask"]
        # 3. old logprobs recomputed over the exact token ids (equal to the rollout's up to float error;
        # recomputing makes the ratio exactly 1 before the first update), reference logprobs, values.
        old_logprobs, old_values, entropy = self._policy_and_values(batch)
        ref_logprobs = self._ref_logprobs(batch)

        # 4. rewards: per-token KL penalty on action tokens, the score on the last action token
        # (Ziegler et al. 2019; TRL 1.12's `rewards = -kl_coef * kl`, `rewards[last] += score`).
        kl = kl_penalty(old_logprobs, ref_logprobs, a.kl_estimator) * mask
        rewards = place_rewards(scores, kl, mask, self.kl_ctl.value)
        if a.whiten_rewards:
            rewards = self.ranks.whiten(rewards, mask, shift_mean=False) * mask

        # 5. advantages: GAE over action tokens only (Schulman et al. 2016; an observation token is not a
        # time step), returns = advantages + values from the raw advantages, then whitening. The critic's
        # targets may use their own lambda (`value_lam`; VC-PPO's decoupled GAE, Yuan et al. 2025).
        values = old_values * mask
        advantages, returns = compute_gae(rewards, values, mask, a.gamma, a.lam)
        if a.critic_lam != a.lam:
            returns = compute_gae(rewards, values, mask, a.gamma, a.critic_lam)[1]
        mc_returns = compute_gae(rewards, values, mask, a.gamma, 1.0)[1]  # what an ideal critic predicts
        if a.whiten_advantages:
            advantages = self.ranks.whiten(advantages, mask) * mask
        return {"old_logprobs": old_logprobs, "ref_logprobs": ref_logprobs, "entropy": entropy, "kl": kl,
                "values": values, "advantages": advantages, "returns": returns, "mc_returns": mc_returns}  # fmt: skip

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
        gen = torch.Generator().manual_seed(a.seed + self.global_step + self._retry_offset())
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
                    with self.ranks.accumulating(self.wrapped_model, j == len(micro_starts) - 1):
                        for k, v in self._micro_batch_backward(mb, mb_tokens).items():
                            stats[k].append(v)
                # Clip to max_grad_norm and step; a NaN/inf gradient skips the update (health/skipped_updates).
                engine = self.wrapped_model if self.uses_deepspeed else None
                grad_norm, stepped = clip_and_step(
                    self.model, self.optimizer, self.lr_scheduler, a.max_grad_norm, engine
                )
                stats["grad_norm"].append(grad_norm)
                skipped += not stepped
        # The critic also fits the last `value_replay_steps` batches, critic-only (`value_replay.py`: why).
        replayed = fit_critic_on_replay(
            self.model,
            self.optimizer,
            self.value_replay,
            a,
            self.device,
            self._autocast,
            gen,
            self.world_size,
        )
        self.value_replay.add(batch, returns)
        self.model.eval()
        return {
            **replayed,
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
        # The sampler drew these tokens, not the trainer: `rollout_is_mode` weights each token's clipped surrogate
        # by min(pi_old / pi_sampler, C) or a masked variant (Yao et al. 2025; None with "none"). The policy
        # loss only: the value loss regresses onto sampled returns (ppo/rollout_is.py says why in full).
        is_weights = RolloutIS.of(a).weights(mb["old_logprobs"], mb["rollout_logprobs"], mb["action_mask"])
        pg, pg_stats = policy_loss(
            new_logprobs, mb["old_logprobs"], mb["advantages"], mb["action_mask"], a.cliprange, is_weights
        )
        vf, vf_stats = value_loss(vpred, mb["old_values"], mb["returns"], mb["action_mask"], a.value_clip)
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

    def _save_trajectories(self, trajs: list[Trajectory], per_token: dict[str, torch.Tensor]) -> None:
        """`RUN/trajectories/step-N.jsonl.gz`: every rank's episodes with the per-token PPO quantities."""
        if not self.args.save_trajectories:
            return
        for t in trajs:
            t.metadata["step"] = self.global_step
        attach_per_token(trajs, per_token)
        for t in trajs if self.world_size > 1 else ():
            t.metadata["rank"] = self.rank
        trajs = self.ranks.gather(trajs)  # one file per step, every rank's episodes, rank order
        if self.is_main:
            self.run.write_step_trajectories(self.global_step, trajs)

    # --- evaluation on held-out rows: the loop `searchrl eval` runs ---
    def evaluate(self, rows: list[dict] | None = None, seed: int = 0) -> dict[str, float]:
        """Dev evaluation at `eval_temperature` on `rows` (default: the first `num_eval_questions` dev rows),
        written as `RUN/eval/step-N.json`; its time is not training time (`ppo/dev_eval.py`)."""
        return dev_eval.evaluate(self, rows, seed)

    def clock(self) -> dict[str, float]:
        """`time/train_s` (training seconds so far, evaluation excluded, earlier sessions included) and
        `time/elapsed_s` (the same plus evaluation seconds)."""
        return self.training_clock.reading()

    # --- checkpoints (`ppo/checkpointing.py`): atomic, pruned, restoring everything a resumed run needs ---
    def save_checkpoint(self) -> Path:
        final = checkpointing.save_checkpoint(self)
        self._callback("on_save")
        return final

    def load_checkpoint(self, path: str | Path, restore_clock: bool = True) -> None:
        checkpointing.load_checkpoint(self, path, restore_clock)

    # --- the training loop ---
    def train(self, resume: bool = False) -> dict[str, float]:
        a = self.args
        checkpointing.start_or_resume(self, resume)
        self._callback("on_train_begin")
        if a.eval_on_start and self.global_step == 0 and self.eval_rows:
            dev_eval.evaluate_on_start(self)
        with progress_bar(
            self.num_total_batches, self.global_step, a.progress_bar and self.is_main
        ) as progress:
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
                # The collapse guard decides (`ppo/guard.py`); what it decided is done here.
                decision = self.guard.decide(
                    metrics, self.global_step, self.last_good_checkpoint, self.rollbacks, self.lr_scale
                )
                metrics.update(decision.metrics)  # guard/*: why, and what was done
                if decision.action == "give_up":
                    if self.is_main:
                        self.run.log_metrics(metrics)
                    raise RuntimeError(decision.message)
                if decision.action == "roll_back":
                    # Everything the checkpoint holds comes back, but the clock runs on (the failed steps
                    # took real time) and the best evaluation found so far is kept.
                    self.load_checkpoint(decision.checkpoint, restore_clock=False)
                    self.unverified_checkpoint = None  # its weights produced the collapse
                    # The checkpoint's scheduler already carries its own lr_scale: scale by the ratio only.
                    rescale_learning_rates(
                        self.optimizer, self.lr_scheduler, decision.lr_scale / self.lr_scale
                    )
                    self.rollbacks, self.lr_scale = decision.rollbacks, decision.lr_scale
                    self.guard.reset_window()
                elif self.unverified_checkpoint is not None:
                    # This step's rollouts came from the unverified weights and passed the guard.
                    self.last_good_checkpoint, self.unverified_checkpoint = self.unverified_checkpoint, None
                if self.cadence.should_log(self.global_step, metrics):
                    if self.is_main:  # metrics are already the same on every rank: logged once
                        self.run.log_metrics(metrics)
                    self._callback("on_log", logs=metrics)
                if self.is_main and self.last_trajectories and self.cadence.should_sample(self.global_step):
                    self.run.write_samples(self.global_step, self.last_trajectories, self.tokenizer)
                self._callback("on_step_end")
                # Every save_steps, and on a new best (never right after a rollback).
                checkpointing.save_after_step(self, metrics, decision.action == "roll_back")
                progress(
                    self.global_step,
                    f"score {metrics['objective/scores']:.3f} kl {metrics['objective/kl']:.3f}",
                )
        latest = self.run.latest_checkpoint()
        if latest is None or latest != self.run.checkpoint_dir(self.global_step):
            self.save_checkpoint()
        self.training_clock.stop()
        self._callback("on_train_end")
        return self.last_metrics

    def _callback(self, event: str, **kwargs: Any) -> None:
        """transformers callbacks (`ppo/callbacks.py`): the `report_to` integrations and the user's own."""
        self.callbacks.fire(event, self, **kwargs)
