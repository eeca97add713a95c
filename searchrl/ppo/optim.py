"""PPO's optimizer: one AdamW over policy and critic, with a learning rate for each (TRL 1.12's shape).

The policy and the value model learn at different rates (`learning_rate`, `value_learning_rate`): one
optimizer with two named param groups, so one scheduler and one `step()` move both, and a checkpoint holds
one optimizer state. A user's own optimizer (`optimizers=(optimizer, scheduler)`) is accepted when it
covers every trainable parameter of both models; one that misses some would silently freeze them.

One optimizer step (`clip_and_step`) clips the global gradient norm to `max_grad_norm` (a null limit
measures the norm and clips nothing) and skips the update when the norm is NaN or inf: such a gradient
would poison every weight it touches (counted in `health/skipped_updates`; the collapse guard treats it as
a collapse). Under DeepSpeed the engine has clipped and stepped at its accumulation boundary already; the
norm is read from it. The scheduler steps once per optimizer step, skipped or not; a step without a scheduler
(the critic-only steps of `value_replay.py`) leaves the schedule where it is.
"""

from __future__ import annotations

import math
from typing import Any

import torch
from torch import nn
from transformers import get_scheduler


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


def optimizer_and_scheduler(
    model: nn.Module, args: Any, optimizers: tuple[torch.optim.Optimizer | None, Any], num_training_steps: int
) -> tuple[torch.optim.Optimizer, Any]:
    """`PPOTrainer`'s `optimizers=(optimizer, scheduler)`: the user's (an optimizer checked to cover `model`),
    else `build_optimizer` and `args.lr_scheduler_type` with `args.warmup_steps` over `num_training_steps`
    optimizer steps. fp16 is refused: it needs loss scaling, which `clip_and_step` does not do."""
    if args.mixed_precision == "fp16":
        raise ValueError(
            "mixed_precision='fp16' needs loss scaling, which this trainer does not do; use 'bf16' "
            "(autocast, no scaler needed) or 'no'"
        )
    optimizer, scheduler = optimizers
    if optimizer is None:
        optimizer = build_optimizer(model, args)
    else:
        check_optimizer_covers(optimizer, model)
    scheduler = scheduler or get_scheduler(
        args.lr_scheduler_type,
        optimizer,
        num_warmup_steps=args.warmup_steps,
        num_training_steps=max(1, num_training_steps),
    )
    return optimizer, scheduler


def clip_and_step(
    model: nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: Any | None,
    max_grad_norm: float | None,
    deepspeed_engine: Any = None,
) -> tuple[float, bool]:
    """One optimizer step over the accumulated gradients of `model` (module docstring): (grad norm, stepped)."""
    if deepspeed_engine is not None:
        # The engine clipped and stepped at its accumulation boundary (NOT run here).
        grad_norm = float(deepspeed_engine.get_global_grad_norm() or 0.0)
    else:
        limit = max_grad_norm if max_grad_norm is not None else float("inf")
        trainable = [p for p in model.parameters() if p.requires_grad]
        grad_norm = float(torch.nn.utils.clip_grad_norm_(trainable, limit))
    stepped = math.isfinite(grad_norm) or deepspeed_engine is not None
    if stepped:
        optimizer.step()
    if scheduler is not None:
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    return grad_norm, stepped


def check_optimizer_covers(optimizer: torch.optim.Optimizer, model: nn.Module) -> None:
    """ValueError naming the trainable parameters of `model` that `optimizer` does not update."""
    covered = {id(p) for g in optimizer.param_groups for p in g["params"]}
    missing = [n for n, p in model.named_parameters() if p.requires_grad and id(p) not in covered]
    if missing:
        raise ValueError(
            f"the optimizer you passed does not cover {len(missing)} trainable parameters of the "
            f"policy/value models (e.g. {missing[:3]}); build it over both models' parameters"
        )
