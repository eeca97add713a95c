"""A PPO step's batch (`searchrl.ppo.batch`): trajectories to right-padded `(batch, T)` tensors and back, the
micro-batch trim, and the seeded, resumable order in which a run draws its rows."""

from __future__ import annotations

import torch

from searchrl.common.trajectory import Trajectory
from searchrl.ppo.batch import attach_per_token, collate_trajectories, next_rows, trim_to_length

PAD = 0


def _traj(name: str, ids: list[int], mask: list[int], logprobs: list[float]) -> Trajectory:
    return Trajectory(
        id=name, question_id=name, question="?", golds=[], input_ids=ids, action_mask=mask, logprobs=logprobs
    )


def _trajs() -> list[Trajectory]:
    # The second episode's real tokens include the pad id (0): the masks must come from lengths, not ids.
    return [
        _traj("a", [5, 6, 7], [0, 1, 1], [0.0, -0.5, -0.25]),
        _traj("b", [8, 0, 9, 0, 10], [0, 0, 1, 0, 1], [0.0, 0.0, -1.0, 0.0, -2.0]),
        _traj("c", [11, 12], [0, 1], [0.0, -0.125]),
    ]


def test_collate_pads_right_and_takes_masks_from_lengths_and_spans():
    batch = collate_trajectories(_trajs(), pad_token_id=PAD)
    assert set(batch) == {"input_ids", "attention_mask", "action_mask", "rollout_logprobs"}
    assert all(v.shape == (3, 5) for v in batch.values())
    assert batch["input_ids"].dtype == torch.long and batch["attention_mask"].dtype == torch.long
    assert batch["action_mask"].dtype == torch.float32 and batch["rollout_logprobs"].dtype == torch.float32
    assert batch["input_ids"].tolist() == [[5, 6, 7, PAD, PAD], [8, 0, 9, 0, 10], [11, 12, PAD, PAD, PAD]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 0, 0, 0]]
    assert batch["action_mask"].tolist() == [[0, 1, 1, 0, 0], [0, 0, 1, 0, 1], [0, 1, 0, 0, 0]]
    assert batch["rollout_logprobs"].tolist() == [
        [0.0, -0.5, -0.25, 0.0, 0.0],
        [0.0, 0.0, -1.0, 0.0, -2.0],
        [0.0, -0.125, 0.0, 0.0, 0.0],
    ]


def test_trim_selects_rows_and_cuts_to_the_longest_of_them():
    batch = collate_trajectories(_trajs(), pad_token_id=PAD)
    batch["scores"] = torch.tensor([1.0, 2.0, 3.0])  # a per-episode tensor is selected, not cut
    sub = trim_to_length(batch, torch.tensor([2, 0]))
    assert sub["input_ids"].tolist() == [[11, 12, PAD], [5, 6, 7]]
    assert sub["attention_mask"].tolist() == [[1, 1, 0], [1, 1, 1]]
    assert sub["action_mask"].shape == sub["rollout_logprobs"].shape == (2, 3)
    assert sub["scores"].tolist() == [3.0, 1.0]


def test_per_token_values_go_back_to_each_trajectory_at_its_own_length():
    trajs = _trajs()
    values = torch.arange(15, dtype=torch.float32).reshape(3, 5) / 3
    attach_per_token(trajs, {"advantages": values, "kl": torch.zeros(3, 5)})
    assert trajs[0].metadata["advantages"] == [0.0, 0.33333, 0.66667]
    assert trajs[1].metadata["advantages"] == [round(x / 3, 5) for x in range(5, 10)]
    assert trajs[2].metadata["advantages"] == [3.33333, 3.66667]
    assert [len(t.metadata["kl"]) for t in trajs] == [3, 5, 2]


def test_rows_are_drawn_as_a_fresh_seeded_permutation_per_pass():
    rows = list(range(7))
    first, epoch, offset = next_rows(rows, 7, seed=3, epoch=0, offset=0)
    assert sorted(first) == rows and (epoch, offset) == (1, 0)  # one pass: every row once
    second, _, _ = next_rows(rows, 7, seed=3, epoch=1, offset=0)
    assert sorted(second) == rows and second != first  # the next pass is another order
    assert next_rows(rows, 7, seed=3, epoch=0, offset=0)[0] == first  # deterministic in the seed
    assert next_rows(rows, 7, seed=4, epoch=0, offset=0)[0] != first


def test_a_resumed_draw_continues_where_the_uninterrupted_one_would():
    rows = [f"q{i}" for i in range(5)]
    straight, *_ = next_rows(rows, 12, seed=0, epoch=0, offset=0)
    part, epoch, offset = next_rows(rows, 4, seed=0, epoch=0, offset=0)
    assert (epoch, offset) == (0, 4)
    rest, epoch, offset = next_rows(rows, 8, seed=0, epoch=epoch, offset=offset)  # crosses two passes
    assert part + rest == straight
    assert (epoch, offset) == (2, 2)
