"""Rewards to advantages for multi-turn trajectories: reward placement, GAE over action tokens, whitening.

A search-agent trajectory interleaves tokens the policy sampled (action tokens, `action_mask == 1`)
with tokens the environment inserted (tool results, chat-template glue) and right padding (both
`action_mask == 0`). The MDP is defined over action tokens only: an observation is part of the
environment's transition, not a time step. So

- `place_rewards` puts the scalar score on the *last action token* of each row and the per-token KL
  penalty on action tokens only (TRL 1.12 put the score one past the last token, on a pad slot);
- `compute_gae` bootstraps each action token from the value at the *next action token*, skipping
  whatever lies between, so inserting observation tokens changes no advantage (verl's semantics
  after its PR #2337, equivalently GAE on the compressed sequence of action tokens);
- the masked statistics (`masked_mean`, `masked_var`, `masked_whiten`) use valid positions only, and
  select with `torch.where` rather than multiplying by the mask, so NaN or inf at masked positions
  (INVALID_LOGPROB fills, garbage values on padding) cannot leak into valid ones.

All functions take `(batch, T)` tensors; masks may be bool or 0/1 of any dtype.
"""

from __future__ import annotations

import torch

WHITEN_EPS = 1e-8


def as_bool_mask(mask: torch.Tensor, like: torch.Tensor, name: str = "mask") -> torch.Tensor:
    """Check that `mask` matches `like` in shape and holds only 0/1, and return it as bool."""
    if mask.shape != like.shape:
        raise ValueError(
            f"{name} has shape {tuple(mask.shape)} but the values have shape {tuple(like.shape)}; "
            "the mask must mark the same positions as the tensor it masks."
        )
    if mask.dtype == torch.bool:
        return mask
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError(f"{name} must hold only 0 and 1 (or be a bool tensor); found other values.")
    return mask.bool()


def masked_mean(values: torch.Tensor, mask: torch.Tensor, axis: int | None = None) -> torch.Tensor:
    """Mean of `values` over positions where `mask` is 1.

    With `axis=None` the mean over all valid positions (a 0-dim tensor); an all-zero mask raises,
    since there is nothing to average. With an `axis`, the mean along it; a slice with no valid
    position gets 0 (so one degenerate row cannot turn a batch statistic into NaN).
    """
    valid = as_bool_mask(mask, values)
    kept = torch.where(valid, values, torch.zeros_like(values))
    if axis is None:
        count = valid.sum()
        if int(count) == 0:
            raise ValueError(
                "masked_mean: the mask selects no position; there is nothing to average (check that the "
                "batch has at least one action token)."
            )
        return kept.sum() / count
    count = valid.sum(dim=axis)
    return kept.sum(dim=axis) / count.clamp(min=1)


def masked_var(values: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of `values` over valid positions; `unbiased` applies Bessel's correction n / (n - 1)."""
    valid = as_bool_mask(mask, values)
    count = int(valid.sum())
    if count == 0:
        raise ValueError(
            "masked_var: the mask selects no position, so there is no variance to compute (this happens "
            "when a mini-batch holds no action token; use larger mini-batches)."
        )
    if unbiased and count < 2:
        raise ValueError(
            "masked_var: the unbiased variance needs at least 2 valid positions, the mask selects 1 "
            "(use a larger batch, or disable whitening with whiten_advantages=False / whiten_rewards=False)."
        )
    mean = masked_mean(values, valid)
    centered = torch.where(valid, values - mean, torch.zeros_like(values))
    variance = centered.square().sum() / count
    if unbiased:
        variance = variance * (count / (count - 1))
    return variance


def masked_whiten(values: torch.Tensor, mask: torch.Tensor, shift_mean: bool = True) -> torch.Tensor:
    """Normalise valid positions to unit variance (and zero mean when `shift_mean`); masked positions -> 0.

    `(x - mean) / sqrt(var + 1e-8)` with the unbiased variance over valid positions; with
    `shift_mean=False` the mean is added back, so only the scale changes (how rewards are whitened).
    Masked positions are set to 0 rather than left holding whitened garbage.
    """
    valid = as_bool_mask(mask, values)
    mean = masked_mean(values, valid)
    variance = masked_var(values, valid, unbiased=True)
    whitened = (values - mean) * torch.rsqrt(variance + WHITEN_EPS)
    if not shift_mean:
        whitened = whitened + mean
    return torch.where(valid, whitened, torch.zeros_like(whitened))


def compute_gae(
    rewards: torch.Tensor,
    values: torch.Tensor,
    action_mask: torch.Tensor,
    gamma: float,
    lam: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation over action tokens only: `(advantages, returns)`, both `(batch, T)`.

    For consecutive action tokens `t` and `t'` (the next position with mask 1, however many masked
    positions lie between), `delta_t = r_t + gamma * V_t' - V_t` and `A_t = delta_t + gamma * lam * A_t'`;
    after a row's last action token the next value and advantage are 0 (the episode ended). Rewards
    and values at masked positions are ignored, so `place_rewards` must put every reward on an action
    token. Masked positions get advantage 0 and return 0; `returns = advantages + values` on action
    tokens, computed before any whitening (the value target).
    """
    _check_same_2d_shape(rewards=rewards, values=values, action_mask=action_mask)
    _check_unit_interval(gamma, "gamma")
    _check_unit_interval(lam, "lam")
    valid = as_bool_mask(action_mask, values, "action_mask")
    dtype = _float_dtype(rewards, values)
    rewards, values = rewards.to(dtype), values.to(dtype)
    batch, length = values.shape

    zeros_row = torch.zeros(batch, dtype=dtype, device=values.device)
    next_value = zeros_row  # value at the next action token of each row (0 past the last one)
    next_advantage = zeros_row  # advantage at the next action token of each row
    advantages = torch.zeros_like(values)
    # A reversed loop over T: at a masked position both carried quantities pass through unchanged,
    # which is exactly "skip observation tokens" with no extra gamma*lam decay per skipped token.
    for t in reversed(range(length)):
        is_action = valid[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        advantage_t = delta + gamma * lam * next_advantage
        advantages[:, t] = torch.where(is_action, advantage_t, zeros_row)
        next_advantage = torch.where(is_action, advantage_t, next_advantage)
        next_value = torch.where(is_action, values[:, t], next_value)
    returns = torch.where(valid, advantages + values, torch.zeros_like(values))
    return advantages, returns


def last_action_index(action_mask: torch.Tensor) -> torch.Tensor:
    """Index of each row's last action token, `(batch,)`; a row without any action token raises."""
    if action_mask.dim() != 2:
        raise ValueError(f"action_mask must be (batch, T), got shape {tuple(action_mask.shape)}.")
    valid = as_bool_mask(action_mask, action_mask, "action_mask")
    has_action = valid.any(dim=1)
    if not bool(has_action.all()):
        empty_rows = torch.nonzero(~has_action).flatten().tolist()
        raise ValueError(
            f"Rows {empty_rows} have no action token, so their score has nowhere to go; drop trajectories "
            "in which the policy sampled nothing before training on them."
        )
    length = valid.shape[1]
    positions = torch.arange(length, device=valid.device).expand_as(valid)
    return torch.where(valid, positions, torch.full_like(positions, -1)).amax(dim=1)


def place_rewards(
    scores: torch.Tensor,
    kl_per_token: torch.Tensor,
    action_mask: torch.Tensor,
    kl_coef: float,
) -> torch.Tensor:
    """Per-token rewards `(batch, T)`: `-kl_coef * kl` on action tokens, plus each row's score on its last one.

    Nothing lands on a masked (observation, glue or padding) position, whatever `kl_per_token` holds
    there, so for each row `sum_t rewards_t == score + sum over action tokens of (-kl_coef * kl_t)`.
    """
    if scores.dim() != 1 or scores.shape[0] != kl_per_token.shape[0]:
        raise ValueError(
            f"scores must be (batch,) with one score per trajectory, got shape {tuple(scores.shape)} for a "
            f"batch of {kl_per_token.shape[0]}."
        )
    if kl_per_token.dim() != 2:
        raise ValueError(f"kl_per_token must be (batch, T), got shape {tuple(kl_per_token.shape)}.")
    valid = as_bool_mask(action_mask, kl_per_token, "action_mask")
    dtype = _float_dtype(kl_per_token, scores)
    kl_per_token = kl_per_token.to(dtype)
    non_score_reward = torch.where(valid, -kl_coef * kl_per_token, torch.zeros_like(kl_per_token))
    rows = torch.arange(scores.shape[0], device=scores.device)
    rewards = non_score_reward.clone()
    rewards[rows, last_action_index(valid)] += scores.to(dtype)
    return rewards


def apply_missing_eos_penalty(
    scores: torch.Tensor, ended_with_stop: torch.Tensor, penalty: float | None
) -> torch.Tensor:
    """Subtract `penalty` from the score of each trajectory that did not end on its stop token.

    `ended_with_stop` is a `(batch,)` bool: whether the episode ended the way the protocol asks (the
    configured stop / end-of-turn token, a final answer), decided by the caller from the trajectory,
    not from comparing token ids with `eos_token_id`. `penalty=None` leaves the scores unchanged.
    """
    if penalty is None:
        return scores
    if penalty < 0:
        raise ValueError(f"missing_eos_penalty must be >= 0 (it is subtracted), got {penalty!r}.")
    if ended_with_stop.shape != scores.shape:
        raise ValueError(
            f"ended_with_stop has shape {tuple(ended_with_stop.shape)} but scores has {tuple(scores.shape)}."
        )
    return torch.where(ended_with_stop.bool(), scores, scores - penalty)


def masked_explained_variance(values: torch.Tensor, returns: torch.Tensor, mask: torch.Tensor) -> float:
    """`1 - Var(returns - values) / Var(returns)` over valid positions (1 = perfect critic, <= 0 = useless).

    Returns NaN when fewer than two positions are valid or the returns have no variance (explained
    variance is undefined then).
    """
    valid = as_bool_mask(mask, values)
    if int(valid.sum()) < 2:
        return float("nan")
    returns_var = masked_var(returns, valid, unbiased=False)
    if float(returns_var) == 0.0:
        return float("nan")
    residual_var = masked_var(returns - values, valid, unbiased=False)
    return float(1.0 - residual_var / returns_var)


def _float_dtype(*tensors: torch.Tensor) -> torch.dtype:
    # Accumulating returns in bf16/fp16 loses the small KL terms; work in float32 unless given float64.
    if any(t.dtype == torch.float64 for t in tensors):
        return torch.float64
    return torch.float32


def _check_same_2d_shape(**tensors: torch.Tensor) -> None:
    shapes = {name: tuple(t.shape) for name, t in tensors.items()}
    first = next(iter(shapes.values()))
    if len(first) != 2 or any(shape != first for shape in shapes.values()):
        raise ValueError(f"Expected (batch, T) tensors of one shape, got {shapes}.")


def _check_unit_interval(value: float, name: str) -> None:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be in [0, 1], got {value!r}.")
