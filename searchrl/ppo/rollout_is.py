"""Importance weights for a sampler that disagrees with the trainer (Yao et al. 2025), and their metrics.

Why: the rollout engine (vLLM, or the HF engine decoding with a bf16 KV cache) reports logprobs that differ
from the trainer's full forward pass over the same tokens: different kernels, reduction orders and
precisions. The trainer recomputes `old_logprobs` itself, so PPO's ratio starts at exactly 1, but the tokens
were *drawn* from the sampler's distribution, not from the trainer's: the batch is off-policy by that gap
(0.18-0.31 nats per token measured on the real loop; "Your Efficient RL Framework Secretly Brings You
Off-Policy RL Training", Yao, Liu et al. 2025). The correction is importance sampling from the sampler to
the trainer's old policy, per action token:

    r_t = exp(old_logprobs_t - rollout_logprobs_t)      (trainer over sampler; detached, fixed for the step)

with the weight it gives the token's clipped PPO surrogate (`policy_loss(..., weights=w)`):

- `"none"`: no weight at all (the trainer passes `weights=None`; the update is bit-identical to before);
- `"token_truncate"`: `w_t = min(r_t, C)`, Yao et al.'s truncated importance sampling (TIS), verl's
  `rollout_is=token`;
- `"token_mask"`: `w_t = r_t` inside `[C_min, C]`, 0 outside (TRL's masked IS, verl's rejection sampling);
- `"sequence_truncate"` / `"sequence_mask"`: one ratio per trajectory, the product of its tokens' ratios
  (`exp` of the summed log-ratio), truncated or masked the same way, the same weight on each of its tokens.

`C` is `rollout_is_clip_max`, `C_min` `rollout_is_clip_min` (mask modes only; none by default). The mode
names are TRL 1.16's `vllm_importance_sampling_mode`. Log-ratios are clamped to [-20, 20] (verl's bounds,
so a product over a long trajectory stays finite) and a NaN log-ratio (a token the sampler gave no
logprob) counts as 0, ratio 1 (TRL's rule): neither changes a weight that C bounds anyway.

Only the policy loss is weighted: the policy gradient is the estimator whose expectation must be taken under
the trainer's policy, and it is what Yao et al. correct (verl and TRL weight the policy loss only). The value
loss is a regression onto the sampled returns, no policy-gradient estimate, and stays unweighted; the KL
penalty is in the rewards (there is no KL loss term), so it reaches the policy loss through the advantages,
which the weight already scales. A weight of 0 keeps its token in the loss's mean (TRL, verl).

`rollout_is_metrics` gives the step's `rollout_is/*` figures, logged in every mode so that a run shows how far
its sampler is from its trainer before the correction is switched on.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from searchrl.ppo.advantages import as_bool_mask
from searchrl.ppo.config import ROLLOUT_IS_MODES

LOG_RATIO_BOUND = 20.0  # |log r| is clamped to this (verl: IS weights within [exp(-20), exp(20)])
TRUNCATE_MODES = ("token_truncate", "sequence_truncate")
SEQUENCE_MODES = ("sequence_truncate", "sequence_mask")


def rollout_log_ratio(
    old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """`old_logprobs - rollout_logprobs` on action tokens (NaN -> 0, clamped to ±20), 0 elsewhere; detached."""
    if rollout_logprobs.shape != old_logprobs.shape:
        raise ValueError(
            f"rollout_logprobs has shape {tuple(rollout_logprobs.shape)}, expected "
            f"{tuple(old_logprobs.shape)} like old_logprobs."
        )
    valid = as_bool_mask(mask, old_logprobs)
    diff = (old_logprobs.detach().float() - rollout_logprobs.detach().float()).nan_to_num(
        nan=0.0, posinf=LOG_RATIO_BOUND, neginf=-LOG_RATIO_BOUND
    )
    diff = diff.clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND)
    return torch.where(valid, diff, torch.zeros_like(diff))


def rollout_is_weights(
    old_logprobs: torch.Tensor,
    rollout_logprobs: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_max: float = 2.0,
    clip_min: float | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Per-token weights `(batch, T)` for `mode` (0 off the action tokens), and their statistics.

    Statistics (0-dim tensors): `ratio_mean` and `ratio_max`, the per-token ratio over action tokens (every
    mode); with a mode, `weight_mean` (the mean weight over action tokens) and the share of units (action
    tokens, or trajectories in the sequence modes) whose ratio was cut: `truncated_frac` (above C) or
    `masked_frac` (outside [C_min, C]); the sequence modes add `seq_ratio_mean` and `seq_ratio_max`.
    """
    if mode not in ROLLOUT_IS_MODES:
        raise ValueError(f"mode={mode!r} is not one of {list(ROLLOUT_IS_MODES)}.")
    if not clip_max >= 1:
        raise ValueError(f"clip_max={clip_max!r} must be >= 1.")
    if clip_min is not None and (mode in TRUNCATE_MODES or not 0 < clip_min < 1):
        raise ValueError(
            f"clip_min={clip_min!r} must be in (0, 1), and only with a mask mode (got {mode!r})."
        )
    valid = as_bool_mask(mask, old_logprobs)
    log_ratio = rollout_log_ratio(old_logprobs, rollout_logprobs, valid)
    ratio = torch.exp(log_ratio)
    n_tokens = valid.sum().clamp(min=1)
    stats = {
        "ratio_mean": torch.where(valid, ratio, torch.zeros_like(ratio)).sum() / n_tokens,
        "ratio_max": torch.where(valid, ratio, torch.zeros_like(ratio)).max()
        if bool(valid.any())
        else torch.tensor(1.0),
    }
    if mode == "none":
        return valid.to(ratio.dtype), stats

    if mode in SEQUENCE_MODES:
        rows = valid.any(dim=1)  # trajectories with at least one action token
        unit_ratio = torch.exp(log_ratio.sum(dim=1).clamp(-LOG_RATIO_BOUND, LOG_RATIO_BOUND))  # (batch,)
        unit_valid = rows
    else:
        unit_ratio, unit_valid = ratio, valid
    if mode in TRUNCATE_MODES:
        cut = unit_ratio > clip_max
        unit_weight = torch.clamp(unit_ratio, max=clip_max)
    else:
        cut = unit_ratio > clip_max
        if clip_min is not None:
            cut = cut | (unit_ratio < clip_min)
        unit_weight = torch.where(cut, torch.zeros_like(unit_ratio), unit_ratio)
    weights = unit_weight[:, None].expand_as(ratio) if mode in SEQUENCE_MODES else unit_weight
    weights = torch.where(valid, weights, torch.zeros_like(ratio))

    n_units = unit_valid.sum().clamp(min=1)
    frac_name = "truncated_frac" if mode in TRUNCATE_MODES else "masked_frac"
    stats[frac_name] = (cut & unit_valid).sum() / n_units
    stats["weight_mean"] = weights.sum() / n_tokens
    if mode in SEQUENCE_MODES:
        kept = torch.where(unit_valid, unit_ratio, torch.zeros_like(unit_ratio))
        stats["seq_ratio_mean"] = kept.sum() / n_units
        stats["seq_ratio_max"] = kept.max() if bool(unit_valid.any()) else torch.tensor(1.0)
    return weights, stats


@dataclass(frozen=True)
class RolloutIS:
    """A run's correction (`PPOConfig.rollout_is_*`): the weights the policy loss takes, the metrics it logs."""

    mode: str = "none"
    clip_max: float = 2.0
    clip_min: float | None = None

    @classmethod
    def of(cls, args: Any) -> RolloutIS:
        return cls(args.rollout_is_mode, float(args.rollout_is_clip_max), args.rollout_is_clip_min)

    def weights(
        self, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> torch.Tensor | None:
        """The policy loss's `weights` argument: None with mode "none" (the unweighted loss, bit for bit)."""
        if self.mode == "none":
            return None
        weights, _ = rollout_is_weights(
            old_logprobs, rollout_logprobs, mask, self.mode, self.clip_max, self.clip_min
        )
        return weights

    def metrics(
        self, old_logprobs: torch.Tensor, rollout_logprobs: torch.Tensor, mask: torch.Tensor
    ) -> dict[str, float]:
        """`rollout_is/<stat>` for the step's metrics line (every mode: see `rollout_is_weights`)."""
        _, stats = rollout_is_weights(
            old_logprobs, rollout_logprobs, mask, self.mode, self.clip_max, self.clip_min
        )
        return {f"rollout_is/{name}": float(value) for name, value in stats.items()}
