"""A PPO step's batch: the rows it takes, and its trajectories as `(batch, T)` tensors and back.

`next_rows` draws the step's training rows: a fresh permutation per pass over the data, seeded by (seed,
pass), so a resumed run (which restores the pass and the offset) draws what the uninterrupted run drew.

`collate_trajectories` turns a step's trajectories into `input_ids`, `attention_mask` (1 on every real
token), `action_mask` (1 on the policy's sampled tokens only, as the rollout recorded it) and
`rollout_logprobs` (the sampling logprobs): right-padded, masks from lengths and spans, never from pad ids.
`trim_to_length` cuts a micro-batch to its longest row. `attach_per_token` writes per-token tensors back
onto the trajectories (for the viewer).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
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


def next_rows(rows: Sequence[Any], n: int, seed: int, epoch: int, offset: int) -> tuple[list[Any], int, int]:
    """(the next `n` rows, data epoch, offset after them) from position (`epoch`, `offset`) of the data order."""
    out: list[Any] = []
    while len(out) < n:
        order = np.random.default_rng(seed + 7919 * epoch).permutation(len(rows))
        take = min(n - len(out), len(order) - offset)
        out.extend(rows[i] for i in order[offset : offset + take])
        offset += take
        if offset >= len(order):
            epoch, offset = epoch + 1, 0
    return out, epoch, offset


def attach_per_token(trajs: Sequence[Trajectory], per_token: dict[str, torch.Tensor]) -> None:
    """`trajectory.metadata[name]`: row i of each `(batch, T)` tensor, cut to the trajectory's own length and
    rounded (0 on non-action tokens where the tensor is masked): what the trajectory viewer shows per token."""
    for i, t in enumerate(trajs):
        for name, values in per_token.items():
            t.metadata[name] = [round(float(x), 5) for x in values[i, : len(t.input_ids)]]
