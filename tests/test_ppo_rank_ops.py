"""PPO's cross-rank statistics (`searchrl.ppo.distributed`) in one process: no launcher needed.

On one process every `RankOps` statistic must be the local one (the trainer calls them unconditionally).
The several-rank formulas are checked here too, in one process, against a stand-in accelerator whose
all-reduce is that of two ranks holding the same tensors: whitening over "both ranks" must then equal
`masked_whiten` over the data twice, and a mean of equal halves is the local mean. The real two-process
run, with gloo, is tests/test_ppo_distributed.py.
"""

from __future__ import annotations

import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from accelerate import Accelerator

from searchrl.ppo import distributed
from searchrl.ppo.advantages import masked_whiten
from searchrl.ppo.distributed import RankOps, seed_process

VALUES = torch.tensor([[0.5, -1.0, 2.0, 9.0], [3.0, 0.25, -4.0, 7.0]])
MASK = torch.tensor([[1, 1, 1, 0], [1, 0, 1, 0]])


@pytest.fixture(scope="module")
def one_process() -> RankOps:
    return RankOps(Accelerator(cpu=not torch.cuda.is_available()))


def two_identical_ranks() -> RankOps:
    """RankOps over a stand-in accelerator: rank 0 of 2, whose sum over ranks doubles the local value."""
    accelerator = SimpleNamespace(
        num_processes=2,
        process_index=0,
        is_main_process=True,
        device=torch.device("cpu"),
        state=SimpleNamespace(deepspeed_plugin=None),
        reduce=lambda tensor, reduction: tensor * 2 if reduction == "sum" else None,
    )
    return RankOps(accelerator)


def test_one_process_is_the_main_rank_and_prepares_nothing(one_process):
    assert (one_process.world_size, one_process.rank, one_process.is_main) == (1, 0, True)
    model, optimizer = torch.nn.Linear(2, 1), object()
    assert one_process.prepare(model, optimizer) == (model, optimizer)


def test_one_process_statistics_are_the_local_ones(one_process):
    assert one_process.sum(torch.tensor(3.5)).item() == 3.5
    assert one_process.mean(torch.tensor([1.0, 2.0, 6.0])) == pytest.approx(3.0)
    assert torch.equal(one_process.whiten(VALUES, MASK), masked_whiten(VALUES, MASK))
    assert torch.equal(
        one_process.whiten(VALUES, MASK, shift_mean=False), masked_whiten(VALUES, MASK, shift_mean=False)
    )
    metrics = {"step": 3.0, "episode": 12.0, "loss": 0.5, "kl/max": 2.0}
    assert one_process.reduce_metrics(metrics) == metrics
    assert one_process.from_main(1.5, -2.0) == (1.5, -2.0)


def test_gathering_on_one_process_keeps_the_items_in_order(one_process):
    items = ["q3", "q1", "q2"]
    assert one_process.gather(items) == ["q3", "q1", "q2"]


def test_cross_rank_whitening_uses_every_ranks_action_tokens():
    ops = two_identical_ranks()
    both = masked_whiten(torch.cat([VALUES, VALUES]), torch.cat([MASK, MASK]))[:2]
    assert torch.allclose(ops.whiten(VALUES, MASK), both, atol=1e-6)
    assert not torch.allclose(both, masked_whiten(VALUES, MASK), atol=1e-3)  # the count matters
    scaled = ops.whiten(VALUES, MASK, shift_mean=False)
    assert torch.allclose(
        scaled, masked_whiten(torch.cat([VALUES, VALUES]), torch.cat([MASK, MASK]), shift_mean=False)[:2]
    )
    assert torch.all(scaled[MASK == 0] == 0)
    assert ops.mean(torch.tensor([1.0, 2.0, 6.0])) == pytest.approx(3.0)
    with pytest.raises(ValueError, match="at least 2 action tokens"):
        ops.whiten(VALUES, torch.zeros_like(MASK))


def test_cross_rank_metrics_are_means_with_maxima_for_max_keys(monkeypatch):
    mine = {"step": 4.0, "episode": 16.0, "loss": 1.0, "kl/max": 2.0, "search/latency": 0.5}
    other = {"step": 4.0, "episode": 16.0, "loss": 3.0, "kl/max": 5.0}  # made no search call
    monkeypatch.setattr(distributed, "gather_object", lambda objects: [*objects, other])
    reduced = two_identical_ranks().reduce_metrics(mine)
    assert reduced == {"step": 4.0, "episode": 16.0, "loss": 2.0, "kl/max": 5.0, "search/latency": 0.5}
    assert list(reduced) == list(mine)  # the local key order


def test_each_rank_gets_its_own_reproducible_seed():
    def draw(seed: int, rank: int) -> tuple[float, float, float]:
        seed_process(seed, rank)
        return random.random(), float(np.random.rand()), float(torch.rand(()))

    assert draw(7, 0) == draw(7, 0)
    assert draw(7, 1) == draw(7, 1)
    assert all(a != b for a, b in zip(draw(7, 0), draw(7, 1), strict=True))
    assert draw(7 + 100003, 0) == draw(7, 1)  # TRL's seed + rank * 100003
