"""PPO's clipped policy and value losses over action tokens, and the per-token helpers around them.

Both losses are masked means over positions where `mask == 1` (the action tokens): observation,
glue and padding positions contribute nothing to the loss *or to its gradient*, whatever the
logprobs, advantages or values there hold (inputs are selected with `torch.where` before any
arithmetic, so even NaN at a masked position stays out). The formulas are TRL 1.12's:

- policy: `mean(max(-A * ratio, -A * clip(ratio, 1 - eps, 1 + eps)))`, `ratio = exp(logp - logp_old)`, each
  token's term optionally times a weight (`rollout_is`: the sampler/trainer importance weight);
- value: `0.5 * mean(max((V - R)^2, (clip(V, V_old - c, V_old + c) - R)^2))`.

Each returns `(loss, stats)`: the scalar loss to back-propagate and a dict of detached 0-dim
tensors for logging (kept as tensors so the trainer syncs with the device once per step, not once
per micro-batch).
"""

from __future__ import annotations

import torch

from searchrl.ppo.advantages import as_bool_mask, masked_mean


def policy_loss(
    logprobs: torch.Tensor,
    old_logprobs: torch.Tensor,
    advantages: torch.Tensor,
    mask: torch.Tensor,
    cliprange: float,
    weights: torch.Tensor | None = None,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped surrogate loss over action tokens; stats `clipfrac`, `approxkl`, `ratio` (all masked means).

    `approxkl` is `0.5 * mean((logp - logp_old)^2)` (the k2 estimator of KL(old || new), TRL's
    `policy/approxkl_avg`); `clipfrac` the share of action tokens where the clipped term won.

    `weights` (optional, `(batch, T)`, detached): a per-token factor on the clipped surrogate, e.g. the
    truncated importance weights of `searchrl.ppo.rollout_is` for a sampler that disagrees with the trainer.
    The loss is then `mean(w_t * max(...))` over the same action tokens (a weight of 0 keeps its token in the
    denominator, as TRL and verl do), so its gradient is `w_t` times the unweighted one, token by token.
    None (the default) gives exactly the unweighted loss. The statistics stay unweighted.
    """
    _check_positive(cliprange, "cliprange")
    others = {"old_logprobs": old_logprobs, "advantages": advantages}
    if weights is not None:
        others["weights"] = weights
    valid = _mask_for(mask, logprobs, **others)
    log_ratio = torch.where(valid, logprobs - old_logprobs.detach(), torch.zeros_like(logprobs))
    advantages = torch.where(valid, advantages.detach(), torch.zeros_like(advantages))
    ratio = torch.exp(log_ratio)
    unclipped = -advantages * ratio
    clipped = -advantages * torch.clamp(ratio, 1.0 - cliprange, 1.0 + cliprange)
    per_token = torch.maximum(unclipped, clipped)
    if weights is not None:
        per_token = per_token * torch.where(valid, weights.detach(), torch.zeros_like(weights)).to(
            per_token.dtype
        )
    loss = masked_mean(per_token, valid)
    with torch.no_grad():
        stats = {
            "clipfrac": masked_mean((clipped > unclipped).float(), valid),
            "approxkl": 0.5 * masked_mean(log_ratio.square(), valid),
            "ratio": masked_mean(ratio, valid),
        }
    return loss, stats


def value_loss(
    values: torch.Tensor,
    old_values: torch.Tensor,
    returns: torch.Tensor,
    mask: torch.Tensor,
    cliprange_value: float,
) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Clipped value loss `0.5 * max((V - R)^2, (clip(V, V_old +- c) - R)^2)` over action tokens; stat `clipfrac`.

    Clipping keeps the critic within `cliprange_value` of the values it had at rollout time, a trust
    region for the critic like the ratio clip is for the policy.
    """
    _check_positive(cliprange_value, "cliprange_value")
    valid = _mask_for(mask, values, old_values=old_values, returns=returns)
    zeros = torch.zeros_like(values)
    values = torch.where(valid, values, zeros)
    old_values = torch.where(valid, old_values.detach(), zeros)
    returns = torch.where(valid, returns.detach(), zeros)
    clipped_values = torch.clamp(values, old_values - cliprange_value, old_values + cliprange_value)
    unclipped_loss = (values - returns).square()
    clipped_loss = (clipped_values - returns).square()
    loss = 0.5 * masked_mean(torch.maximum(unclipped_loss, clipped_loss), valid)
    with torch.no_grad():
        stats = {"clipfrac": masked_mean((clipped_loss > unclipped_loss).float(), valid)}
    return loss, stats


def entropy_from_logits(logits: torch.Tensor) -> torch.Tensor:
    """Entropy of the categorical over the last dimension, in nats: `(batch, T, V)` -> `(batch, T)`.

    The caller takes the masked mean over action tokens. Logits of -inf (tokens removed by top-k or
    top-p) have probability 0 and contribute 0, not NaN.
    """
    log_probs = torch.log_softmax(logits.float(), dim=-1)
    probs = log_probs.exp()
    return -torch.where(probs > 0, probs * log_probs, torch.zeros_like(probs)).sum(dim=-1)


def _mask_for(mask: torch.Tensor, reference: torch.Tensor, **others: torch.Tensor) -> torch.Tensor:
    for name, tensor in others.items():
        if tensor.shape != reference.shape:
            raise ValueError(
                f"{name} has shape {tuple(tensor.shape)}, expected {tuple(reference.shape)} like the other "
                "per-token inputs."
            )
    return as_bool_mask(mask, reference)


def _check_positive(value: float, name: str) -> None:
    if not value > 0:
        raise ValueError(f"{name} must be > 0, got {value!r} (TRL's default is 0.2).")
