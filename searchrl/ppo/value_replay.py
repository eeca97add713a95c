"""The critic's replay: the last N PPO steps' batches with the targets the critic fitted then, and the
critic-only optimizer steps over them after each PPO update (`PPOConfig.value_replay_steps`).

Why: a critic made from the policy's backbone with a zero head learns slowly from what one PPO step gives it.
On the synthetic demo's own PPO batches (20 steps of 32 episodes, returns about 1 with a standard deviation
of 0.5, a third to a half of it explained by the question's hop count alone), the shipped critic (4 updates a
step, learning rate 3e-4, value clip 0.2, lambda 0.95) never separated one-hop from two-hop questions:
explained variance -0.17 to +0.06 at every step. Fitting Monte-Carlo returns without the clip at 1e-3 moved
it little (+0.03 over the second half); more passes over the same batch overfit it (+0.27); the same number
of updates spread over the last two batches as well reached +0.45 (docs/ppo.md, "The critic"). More distinct
episodes, not more passes, is what the critic lacked, and a PPO step's own batch is all the policy may use.

What a replayed step is: for each of the last N batches (oldest first), `num_ppo_epochs` passes of
`num_mini_batches` mini-batches, each one optimizer step of the critic's loss alone, unclipped
(`0.5 * (V - R)^2` over action tokens: the values the clip would anchor to belong to an older critic),
gradients clipped to `max_grad_norm`. The policy gets no gradient and the scheduler does not step, so the
policy's learning-rate schedule is the one without replay. The targets are the returns as computed at their
own step (with `value_lam`: Monte-Carlo returns when it is 1), slightly stale for a policy that has moved
since, which is the bias a larger batch would have too.

Several processes: each rank replays its own slice; the critic's gradients are averaged across ranks by
hand (these passes do not go through the DDP wrapper). DeepSpeed is refused: its engine owns the step.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from searchrl.ppo.batch import trim_to_length
from searchrl.ppo.losses import value_loss
from searchrl.ppo.optim import clip_and_step

REPLAYED_KEYS = ("input_ids", "attention_mask", "action_mask")


class ValueReplay:
    """The last `capacity` batches (input ids, masks, the critic's targets), on the CPU, oldest first."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.batches: deque[dict[str, torch.Tensor]] = deque(maxlen=max(capacity, 1))

    def __len__(self) -> int:
        return len(self.batches) if self.capacity > 0 else 0

    def add(self, batch: dict[str, torch.Tensor], returns: torch.Tensor) -> None:
        if self.capacity > 0:
            kept = {k: batch[k].detach().cpu().clone() for k in REPLAYED_KEYS}
            self.batches.append({**kept, "returns": returns.detach().cpu().float().clone()})

    def state_dict(self) -> dict[str, Any]:
        """What a checkpoint keeps, so that a resumed run replays what the uninterrupted one would."""
        return {"capacity": self.capacity, "batches": list(self.batches)}

    def load_state_dict(self, state: dict[str, Any] | None) -> None:
        self.batches.clear()
        for item in (state or {}).get("batches", [])[-self.capacity :] if self.capacity > 0 else []:
            self.batches.append(item)


def fit_critic_on_replay(
    model: Any,
    optimizer: torch.optim.Optimizer,
    replay: ValueReplay,
    args: Any,
    device: torch.device,
    autocast: Callable[[], Any],
    generator: torch.Generator,
    world_size: int = 1,
) -> dict[str, float]:
    """The critic-only steps over `replay` (module docstring); returns the mean replayed loss and step count."""
    losses: list[float] = []
    steps = 0
    if len(replay) == 0:
        return {}
    model.train()
    value_params = [p for p in model.value_parameters() if p.requires_grad]
    for _epoch in range(args.num_ppo_epochs):
        for batch in list(replay.batches):
            size = batch["input_ids"].shape[0]
            per_mini_batch = max(1, size // args.num_mini_batches)
            order = torch.randperm(size, generator=generator)
            for start in range(0, size, per_mini_batch):
                losses.append(_critic_step(model, batch, order[start : start + per_mini_batch], args, device,
                                           autocast))  # fmt: skip
                _average_gradients(value_params, world_size)
                clip_and_step(model, optimizer, None, args.max_grad_norm)
                steps += 1
    model.eval()
    return {"val/replay_loss": float(sum(losses) / len(losses)), "val/replay_steps": float(steps)}


def _critic_step(
    model: Any,
    batch: dict[str, torch.Tensor],
    rows: torch.Tensor,
    args: Any,
    device: torch.device,
    autocast: Callable[[], Any],
) -> float:
    """Forward and backward of one replayed mini-batch in micro-batches, each weighted by its token share."""
    tokens = batch["action_mask"][rows].sum().clamp(min=1.0)
    total = 0.0
    for start in range(0, len(rows), args.per_device_train_batch_size):
        mb = {k: v.to(device) for k, v in trim_to_length(batch, rows[start : start + args.per_device_train_batch_size]).items()}  # fmt: skip
        with autocast():
            values = model.critic_values(mb["input_ids"], mb["attention_mask"])
        zeros = torch.zeros_like(values)
        loss, _ = value_loss(values, zeros, mb["returns"], mb["action_mask"], math.inf)
        weight = mb["action_mask"].sum() / tokens.to(device)
        (args.vf_coef * loss * weight).backward()
        total += float(loss.detach()) * float(weight)
    return total


def _average_gradients(params: list[torch.nn.Parameter], world_size: int) -> None:
    if world_size <= 1 or not dist.is_available() or not dist.is_initialized():
        return
    for p in params:
        if p.grad is not None:
            dist.all_reduce(p.grad, op=dist.ReduceOp.SUM)
            p.grad /= world_size
