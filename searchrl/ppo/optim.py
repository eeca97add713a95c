"""PPO's optimizer: one AdamW over policy and critic, with a learning rate for each (TRL 1.12's shape).

The policy and the value model learn at different rates (`learning_rate`, `value_learning_rate`): one
optimizer with two named param groups, so one scheduler and one `step()` move both, and a checkpoint holds
one optimizer state. A user's own optimizer (`optimizers=(optimizer, scheduler)`) is accepted when it
covers every trainable parameter of both models; one that misses some would silently freeze them.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn


def build_optimizer(model: Any, args: Any) -> torch.optim.Optimizer:
    """AdamW with a `policy` and a `value` param group over `model` (a `PolicyAndValue`)."""
    value_params = model.value_parameters()
    value_ids = {id(p) for p in value_params}
    policy_params = [p for p in model.parameters() if p.requires_grad and id(p) not in value_ids]
    return torch.optim.AdamW(
        [
            {"params": policy_params, "lr": args.learning_rate, "name": "policy"},
            {"params": value_params, "lr": args.value_learning_rate or args.learning_rate, "name": "value"},
        ],
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
        eps=args.adam_epsilon,
        weight_decay=args.weight_decay,
    )


def check_optimizer_covers(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """ValueError naming the trainable parameters of `model` that `optimizer` does not update."""
    covered = {id(p) for g in optimizer.param_groups for p in g["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
    if missing:
        raise ValueError(
            f"the optimizer you passed does not cover {len(missing)} trainable parameters of the "
            f"policy/value models (e.g. {missing[:3]}); build it over both models' parameters"
        )
