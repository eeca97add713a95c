"""Scalar scores from a sequence-classification head: the reward model's and the judge's forward.

Its own module so that every scorer (the trained reward model in `reward_model.py`, the model judge in
`judge.py`, the PPO trainer) reads a score the same way, and the rubric (`combine.py`, which knows the
judge) and the reward model (which builds preference pairs with the rubric) import it without a cycle.
"""

from __future__ import annotations

import torch
from torch import nn

# Used by the PPO trainer; names and behaviour are a contract.


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
