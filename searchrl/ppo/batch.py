"""Trajectories as PPO's `(batch, T)` tensors: right-padded, masks from lengths and spans, never from pad ids.

`collate_trajectories` turns a step's trajectories into `input_ids`, `attention_mask` (1 on every real
token), `action_mask` (1 on the policy's sampled tokens only, as the rollout recorded it) and
`rollout_logprobs` (the sampling logprobs); `trim_to_length` cuts a micro-batch to its longest row.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from searchrl.common.trajectory import Trajectory


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
