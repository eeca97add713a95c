"""PPO's optimizer (`searchrl.ppo.optim`): a learning rate per model, the user's optimizer checked, one step
that clips the global gradient norm and skips a NaN update, and the scheduler stepped either way.

A two-layer stand-in for `PolicyAndValue` (a policy layer, a value layer it names in `value_parameters`,
a frozen layer) keeps every number exact; the SGD step of the clipping tests (lr 1, no momentum) moves each
parameter by exactly minus its clipped gradient, so the norm of the move is the clipped norm.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from searchrl.ppo.config import PPOConfig
from searchrl.ppo.optim import (
    build_optimizer,
    check_optimizer_covers,
    clip_and_step,
    optimizer_and_scheduler,
)


class PolicyAndCritic(nn.Module):
    """What `build_optimizer` reads of `PolicyAndValue`: its parameters and `value_parameters()`."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.policy = nn.Linear(3, 2)
        self.value = nn.Linear(2, 1)
        self.frozen = nn.Linear(2, 2)
        self.frozen.requires_grad_(False)

    def value_parameters(self) -> list[nn.Parameter]:
        return list(self.value.parameters())

    def loss(self) -> torch.Tensor:
        x = torch.tensor([[1.0, -2.0, 0.5]])
        return (self.value(self.frozen(self.policy(x))) ** 2).sum()


def _args(tmp_path, **kw) -> PPOConfig:
    return PPOConfig(output_dir=str(tmp_path / "run"), **{"learning_rate": 1e-3, **kw})


def _ids(params) -> set[int]:
    return {id(p) for p in params}


def test_policy_and_value_groups_get_their_own_learning_rates(tmp_path):
    model = PolicyAndCritic()
    optimizer = build_optimizer(model, _args(tmp_path, learning_rate=1e-3, value_learning_rate=5e-2))
    groups = {g["name"]: g for g in optimizer.param_groups}
    assert set(groups) == {"policy", "value"}
    assert groups["policy"]["lr"] == 1e-3 and groups["value"]["lr"] == 5e-2
    assert _ids(groups["policy"]["params"]) == _ids(model.policy.parameters())
    assert _ids(groups["value"]["params"]) == _ids(model.value.parameters())
    # The frozen layer is in neither group: nothing would update it anyway.
    assert not _ids(model.frozen.parameters()) & _ids(p for g in optimizer.param_groups for p in g["params"])


def test_the_value_learning_rate_defaults_to_the_policy_one(tmp_path):
    optimizer = build_optimizer(PolicyAndCritic(), _args(tmp_path, learning_rate=3e-4))
    assert [g["lr"] for g in optimizer.param_groups] == [3e-4, 3e-4]


def test_a_step_changes_the_parameters_and_clears_the_gradients(tmp_path):
    model = PolicyAndCritic()
    optimizer, scheduler = optimizer_and_scheduler(model, _args(tmp_path), (None, None), num_training_steps=4)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    model.loss().backward()
    norm, stepped = clip_and_step(model, optimizer, scheduler, max_grad_norm=1.0)
    assert stepped and norm > 0
    moved = {n for n, p in model.named_parameters() if not torch.equal(p, before[n])}
    assert moved == {"policy.weight", "policy.bias", "value.weight", "value.bias"}
    assert all(p.grad is None for p in model.parameters())


def _sgd_step(model: PolicyAndCritic, max_grad_norm: float | None) -> tuple[float, float]:
    """(the norm clip_and_step reports, the norm of the parameters' move) after one SGD step of lr 1."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda _step: 1.0)
    before = [p.detach().clone() for p in model.parameters()]
    model.loss().backward()
    norm, _ = clip_and_step(model, optimizer, scheduler, max_grad_norm)
    move = torch.cat([(p.detach() - b).flatten() for p, b in zip(model.parameters(), before, strict=True)])
    return norm, float(move.norm())


def test_clipping_clips_the_global_norm_and_reports_the_norm_before():
    unclipped_norm, unclipped_move = _sgd_step(PolicyAndCritic(), max_grad_norm=None)
    assert unclipped_move == pytest.approx(unclipped_norm, rel=1e-5)  # a null limit clips nothing
    limit = unclipped_norm / 4
    norm, move = _sgd_step(PolicyAndCritic(), max_grad_norm=limit)
    assert norm == pytest.approx(unclipped_norm, rel=1e-6)
    assert move == pytest.approx(limit, rel=1e-5)


@pytest.mark.filterwarnings("ignore:Detected call of `lr_scheduler.step\\(\\)` before")  # skipped on purpose
def test_a_nan_gradient_skips_the_update_but_steps_the_scheduler(tmp_path):
    model = PolicyAndCritic()
    optimizer, scheduler = optimizer_and_scheduler(
        model, _args(tmp_path, warmup_steps=2), (None, None), num_training_steps=10
    )
    lr_before = [g["lr"] for g in optimizer.param_groups]
    before = [p.detach().clone() for p in model.parameters()]
    (model.loss() * float("nan")).backward()
    norm, stepped = clip_and_step(model, optimizer, scheduler, max_grad_norm=1.0)
    assert math.isnan(norm) and not stepped
    assert all(torch.equal(p, b) for p, b in zip(model.parameters(), before, strict=True))
    assert all(p.grad is None for p in model.parameters())
    assert [g["lr"] for g in optimizer.param_groups] != lr_before  # warm-up moved on


def test_a_users_optimizer_must_cover_every_trainable_parameter(tmp_path):
    model = PolicyAndCritic()
    partial = torch.optim.SGD(model.policy.parameters(), lr=0.1)
    with pytest.raises(ValueError, match=r"does not cover 2 trainable parameters.*value\.weight"):
        optimizer_and_scheduler(model, _args(tmp_path), (partial, None), num_training_steps=1)
    full = torch.optim.SGD([*model.policy.parameters(), *model.value.parameters()], lr=0.1)
    check_optimizer_covers(full, model)  # the frozen layer needs no cover
    optimizer, scheduler = optimizer_and_scheduler(model, _args(tmp_path), (full, None), num_training_steps=1)
    assert optimizer is full and scheduler is not None


def test_fp16_is_refused_before_anything_is_built(tmp_path):
    args = _args(tmp_path)
    args.mixed_precision = "fp16"  # set after construction: the config itself may refuse it too
    with pytest.raises(ValueError, match="fp16.*loss scaling"):
        optimizer_and_scheduler(PolicyAndCritic(), args, (None, None), num_training_steps=1)
