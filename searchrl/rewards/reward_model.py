"""The learned reward model: trained on preference pairs with its own loss, frozen during PPO.

`FrozenRewardModel` wraps a sequence-classification model (`num_labels=1`). It reads the whole
trajectory, observations included, and returns the logit at the last real token, under `no_grad`,
with every parameter's `requires_grad` off: PPO's gradient never reaches it (the seeds: a reward model
"updates with its own loss, and in online PPO is frozen and only gives scores").
"""

from __future__ import annotations

import torch
from torch import nn


def last_token_indices(attention_mask: torch.Tensor) -> torch.Tensor:
    """Index of the last attended position of each row (from lengths, never from pad-id comparison)."""
    positions = torch.arange(attention_mask.shape[1], device=attention_mask.device)
    return (attention_mask.long() * positions).max(dim=1).values


def sequence_scores(model: nn.Module, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """Scalar score per row: the head's logit at the last real token of a right- or left-padded batch."""
    position_ids = (attention_mask.long().cumsum(-1) - 1).clamp(min=0)
    backbone = getattr(model, model.base_model_prefix)
    hidden = backbone(
        input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids, use_cache=False
    ).last_hidden_state
    logits = model.score(hidden).squeeze(-1)
    return logits.gather(1, last_token_indices(attention_mask)[:, None]).squeeze(1)


class FrozenRewardModel:
    """A frozen scorer over token ids; call it with a right-padded batch."""

    def __init__(self, model: nn.Module, batch_size: int = 16):
        self.model = model
        self.model.eval()
        for p in self.model.parameters():
            p.requires_grad_(False)
        self.batch_size = batch_size

    @torch.no_grad()
    def score(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        device = next(self.model.parameters()).device
        out = []
        for i in range(0, input_ids.shape[0], self.batch_size):
            ids = input_ids[i : i + self.batch_size].to(device)
            mask = attention_mask[i : i + self.batch_size].to(device)
            out.append(sequence_scores(self.model, ids, mask).float().cpu())
        return torch.cat(out) if out else torch.zeros(0)
