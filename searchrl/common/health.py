"""Health monitors every trainer logs under the same names: what collapsing runs show first.

Search-R1's users (issues #88/#89) and LLDS (likelihood-decline in search agents) report the same
signature before a run falls apart: non-finite logprobs, and the likelihood of the policy's own sampled
tokens, overall and on the episodes it got right, falling step after step. PPO computes these from the
logprobs it recomputes before the update; GRPO from the sampling logprobs its rollout returned (see
docs/grpo.md for which mode has them). Both log:

- `health/nonfinite_logprobs`: how many action-token logprobs (policy or reference) are NaN or inf;
- `objective/logprob_per_token`: the mean logprob of the sampled action tokens (non-finite ones as 0);
- `objective/logprob_per_token_correct`: the same averaged per episode over the episodes answered right
  (absent when none was).

The entropy monitor (`objective/entropy_per_token`) is each trainer's own figure: PPO's from its logits,
GRPO's TRL's `entropy`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch


def likelihood_metrics(
    logprobs: torch.Tensor,
    action_mask: torch.Tensor,
    correct: Sequence[bool] = (),
    ref_logprobs: torch.Tensor | None = None,
) -> dict[str, float]:
    """The monitors above from `(batch, T)` logprobs and action mask; `correct[i]` says episode i was right."""
    valid = action_mask.bool()
    finite = torch.isfinite(logprobs)
    if ref_logprobs is not None:
        finite = finite & torch.isfinite(ref_logprobs)
    out = {"health/nonfinite_logprobs": float((valid & ~finite).sum())}
    safe = torch.where(finite, logprobs, torch.zeros_like(logprobs)) * action_mask
    out["objective/logprob_per_token"] = float(safe.sum() / action_mask.sum().clamp(min=1))
    right = [i for i, ok in enumerate(correct) if ok]
    if right:
        per_episode = safe.sum(1) / action_mask.sum(1).clamp(min=1)
        out["objective/logprob_per_token_correct"] = float(per_episode[right].mean())
    return out


def trajectory_logprobs(trajectories: Sequence[Any]) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded `(batch, T)` sampling logprobs and action masks of trajectories (what their rollout
    recorded), for `likelihood_metrics` where no forward pass recomputes them."""
    width = max((len(t.input_ids) for t in trajectories), default=0)
    logprobs = torch.zeros((len(trajectories), width), dtype=torch.float32)
    mask = torch.zeros((len(trajectories), width), dtype=torch.float32)
    for i, t in enumerate(trajectories):
        n = len(t.input_ids)
        logprobs[i, :n] = torch.tensor([float(x) for x in t.logprobs], dtype=torch.float32)
        mask[i, :n] = torch.tensor(t.action_mask, dtype=torch.float32)
    return logprobs, mask
