"""Whole PPO runs on the tiny world: kill and resume, the collapse guard, and learning on the dev split.

The world and the tiny model are conftest.py's `world`; the learnable `LikedTokens` reward comes from
`test_ppo_trainer.py` (see its docstring for why a varying reward is needed with an untrained model).
"""

from __future__ import annotations

import copy
import dataclasses
import json

import pytest
import torch
from test_ppo_trainer import (
    QA,
    TIMING_KEYS,
    LikedTokens,
    env_factory,
    make_args,
)
from transformers import TrainerCallback

from searchrl.ppo.trainer import PPOTrainer


class Killed(Exception):
    """Stands in for SIGKILL: raised from a callback, it stops the run wherever that callback fires."""


class KillAt(TrainerCallback):
    def __init__(self, event: str, step: int):
        self.event, self.step = event, step

    def _maybe_kill(self, state):
        if state.global_step == self.step:
            raise Killed(f"killed at {self.event} of step {self.step}")

    def on_log(self, args, state, control, **kw):
        if self.event == "on_log":
            self._maybe_kill(state)

    def on_save(self, args, state, control, **kw):
        if self.event == "on_save":
            self._maybe_kill(state)

    def on_step_end(self, args, state, control, **kw):
        if self.event == "on_step_end":
            self._maybe_kill(state)

    def on_train_begin(self, args, state, control, **kw):
        if self.event == "on_train_begin":
            self._maybe_kill(state)


def trainer_for(world, out, callbacks=None, rows=QA, eval_rows=None, **kw) -> PPOTrainer:
    base = dict(total_episodes=16, save_steps=1, num_ppo_epochs=2, learning_rate=3e-3)
    base.update(kw)
    args = make_args(out, **base)
    return PPOTrainer(
        args,
        world["tok"],
        copy.deepcopy(world["policy"]),  # every run starts from the same initial policy (and reference)
        None,
        None,
        rows,
        reward_funcs=LikedTokens(),
        environment=env_factory(world),
        eval_dataset=eval_rows,
        callbacks=callbacks or [],
    )


def read_raw_metrics(out) -> list[dict]:
    return [json.loads(line) for line in (out / "run" / "metrics.jsonl").read_text().splitlines()]


def read_metrics(out) -> list[dict]:
    return [
        {k: v for k, v in r.items() if not any(t in k for t in TIMING_KEYS)} for r in read_raw_metrics(out)
    ]


def read_eval_files(out) -> list[dict]:
    files = (out / "run" / "eval").glob("step-*.json")
    return sorted((json.loads(f.read_text()) for f in files), key=lambda e: e["step"])


def strictly_increasing(values) -> bool:
    return all(a < b for a, b in zip(values, values[1:], strict=False))


def test_killed_and_resumed_run_matches_the_uninterrupted_run_exactly(world, tmp_path):
    # 16 episodes / batch 4 = 4 PPO steps; 4 questions: each step is a whole data epoch, so the data
    # position crosses epochs and must restore exactly.
    straight = trainer_for(world, tmp_path / "a")
    straight.train()
    reference = read_metrics(tmp_path / "a")
    assert [r["step"] for r in reference] == [1, 2, 3, 4]

    # Kill 1: right after checkpoint 2 is written. Kill 2: after step 3 is logged, before its checkpoint,
    # so resume must also drop step 3's line from metrics.jsonl (no duplicate steps).
    with pytest.raises(Killed):
        trainer_for(world, tmp_path / "b", callbacks=[KillAt("on_save", 2)]).train()
    with pytest.raises(Killed):
        trainer_for(world, tmp_path / "b", callbacks=[KillAt("on_log", 3)]).train(resume=True)
    assert [r["step"] for r in read_metrics(tmp_path / "b")] == [1, 2, 3]
    resumed = trainer_for(world, tmp_path / "b")
    resumed.train(resume=True)
    assert read_metrics(tmp_path / "b") == reference
    # The weights agree too, not only the logged numbers.
    for (name, p), (_, q) in zip(
        straight.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert p.equal(q), name
    # Rollout seeds are per step (seed * 1_000_003 + step), and the generator's own seed is left alone.
    assert resumed.generator.config.seed == resumed.args.seed


def test_eval_on_start_and_the_training_clock_go_on_across_a_resume(world, tmp_path):
    # 12 episodes / batch 4 = 3 steps, evaluated before the first update and after every step; killed
    # after step 2 is logged (and evaluated), before its checkpoint: the resume redoes step 2 from step 1.
    kw = dict(total_episodes=12, num_ppo_epochs=1, eval_on_start=True, eval_steps=1, num_eval_questions=2)
    with pytest.raises(Killed):
        trainer_for(world, tmp_path, callbacks=[KillAt("on_log", 2)], eval_rows=QA, **kw).train()
    before = read_raw_metrics(tmp_path)
    assert [r["step"] for r in before] == [0, 1, 2]
    saved = json.loads((tmp_path / "run" / "checkpoints" / "step-1" / "trainer_state.json").read_text())
    trainer_for(world, tmp_path, eval_rows=QA, **kw).train(resume=True)

    rows = read_raw_metrics(tmp_path)
    assert [r["step"] for r in rows] == [0, 1, 2, 3]  # step 0 is not evaluated again on resume
    train_s = [r["time/train_s"] for r in rows]
    assert train_s[0] == 0.0 and strictly_increasing(train_s)
    # The clock went on from the checkpoint's reading, which is at least step 1's (saved after its line).
    assert rows[1] == before[1] and train_s[1] <= saved["time/train_s"] < train_s[2]
    # Evaluation time is not training time; elapsed counts both.
    assert all(r["time/elapsed_s"] > r["time/train_s"] for r in rows[1:])

    evals = read_eval_files(tmp_path)
    assert [e["step"] for e in evals] == [0, 1, 2, 3]
    assert [e["episode"] for e in evals] == [0, 4, 8, 12] == [r["episode"] for r in rows]
    # Each eval file carries its step's clock reading: what the report's side-by-side curves read.
    assert [e["time/train_s"] for e in evals] == train_s
    assert [e["eval/exact_match"] for e in evals] == [r["eval/exact_match"] for r in rows]


def test_without_eval_on_start_there_is_no_step_0_and_every_step_has_a_clock(world, tmp_path):
    trainer_for(world, tmp_path, eval_rows=QA, total_episodes=8, eval_steps=2, num_eval_questions=2).train()
    rows = read_raw_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["time/train_s"] > 0 and strictly_increasing([r["time/train_s"] for r in rows])
    (only,) = read_eval_files(tmp_path)
    assert only["step"] == 2 and only["episode"] == 8 and only["time/train_s"] == rows[1]["time/train_s"]
    assert not (tmp_path / "run" / "eval" / "step-0.json").exists()


def record_rollout_seeds(trainer) -> list[int]:
    """The seed of every rollout `trainer` asks its engine for, in order (filled as it trains)."""
    seen: list[int] = []
    original = trainer.generator.rollout

    def spy(envs, rows, sampling):
        seen.append(sampling.seed)
        return original(envs, rows, sampling)

    trainer.generator.rollout = spy
    return seen


def test_rollouts_are_seeded_per_step_through_the_sampling_passed_to_the_engine(world, tmp_path):
    trainer = trainer_for(world, tmp_path, total_episodes=8)
    config = dataclasses.replace(trainer.generator.config)
    seen = record_rollout_seeds(trainer)
    trainer.train()
    s = trainer.args.seed
    assert seen == [s * 1_000_003 + 0, s * 1_000_003 + 1]
    assert trainer.generator.config == config  # nothing was set on the shared engine


def test_collapse_guard_rolls_back_an_absurd_learning_rate_and_the_run_recovers(world, tmp_path):
    bounds = dict(collapse_window=1, collapse_entropy_min=1.0, collapse_kl_max=20.0)
    trainer = trainer_for(
        world,
        tmp_path,
        total_episodes=16,
        learning_rate=2.0,  # absurd: one step wrecks the policy
        lr_scheduler_type="constant",
        collapse_guard=True,
        collapse_lr_decay=1e-4,
        collapse_max_rollbacks=2,
        collapse_format_min=None,  # LikedTokens has no format term
        collapse_reward_drop=None,
        **bounds,
    )
    reference_before = {k: v.clone() for k, v in trainer.ref_model.state_dict().items()}
    trainer.train()
    rows = read_metrics(tmp_path)
    fired = [i for i, r in enumerate(rows) if r.get("guard/rollback")]
    assert fired, "the guard never fired on an lr of 2.0"
    # The rollback loads the checkpoint into the policy in place: the frozen reference is neither touched nor
    # tied to the policy's storage afterwards (issue 16: a reference must never run the live policy).
    for name, tensor in trainer.ref_model.state_dict().items():
        assert torch.equal(tensor, reference_before[name]), f"the reference's {name} moved"
    policy_storage = {p.data_ptr() for p in trainer.model.parameters()}
    assert not policy_storage & {p.data_ptr() for p in trainer.ref_model.parameters()}
    # A rollback restores the weights, not the clock: the failed steps took real training time.
    assert strictly_increasing([r["time/train_s"] for r in read_raw_metrics(tmp_path)])
    first = rows[fired[0]]
    assert "entropy" in first["guard/reason"] or "KL" in first["guard/reason"]
    assert first["objective/entropy_per_token"] < 1.0 or first["objective/kl"] > 20.0
    # Rolled back and continued with a lower learning rate, to the end of the run, within bounds.
    assert trainer.rollbacks == len(fired) <= 2
    assert trainer.lr_scale == pytest.approx(1e-4 ** len(fired))
    after = rows[fired[-1] + 1 :]
    assert after and [r["step"] for r in after][-1] == trainer.num_total_batches
    for r in after:
        assert r["objective/entropy_per_token"] >= 1.0 and r["objective/kl"] <= 20.0
        assert r["lr"] == pytest.approx(2.0 * trainer.lr_scale)
    assert trainer.global_step == trainer.num_total_batches


def test_collapse_guard_stops_after_collapse_max_rollbacks(world, tmp_path):
    trainer = trainer_for(
        world,
        tmp_path,
        total_episodes=16,
        learning_rate=2.0,
        lr_scheduler_type="constant",
        collapse_guard=True,
        collapse_window=1,
        collapse_entropy_min=None,
        collapse_kl_max=1e-9,  # every step after the first "collapses" (step 1 samples the reference itself)
        collapse_format_min=None,
        collapse_reward_drop=None,
        collapse_max_rollbacks=1,
    )
    seen = record_rollout_seeds(trainer)
    with pytest.raises(RuntimeError, match="collapse_max_rollbacks=1"):
        trainer.train()
    rows = read_metrics(tmp_path)
    assert sum(1 for r in rows if r.get("guard/rollback")) == 1
    assert rows[-1]["guard/gave_up"] == 1.0
    # Steps 1, 2 (collapses: back to the start, the last weights that passed), 1 and 2 again (gives up). The
    # retried steps are sampled afresh: the failed steps' seeds would replay their rollouts from the same weights.
    s = trainer.args.seed * 1_000_003
    assert seen == [s, s + 1, s + 7_919, s + 1 + 7_919]


def test_resume_drops_the_eval_trajectory_and_sample_files_a_killed_run_wrote_after_its_checkpoint(
    world, tmp_path
):
    # Killed at the end of step 2 (logged, evaluated, trajectories and samples written), before checkpoint 2: on resume
    # (stopped again right after the clean-up) nothing of step 2 may remain, as with GRPO's runs.
    kw = dict(total_episodes=12, num_ppo_epochs=1, eval_steps=1, num_eval_questions=2)
    kw.update(num_sample_generations=3, save_trajectories=True)
    with pytest.raises(Killed):
        trainer_for(world, tmp_path, callbacks=[KillAt("on_step_end", 2)], eval_rows=QA, **kw).train()
    run = tmp_path / "run"
    assert (run / "eval" / "step-2.json").exists() and (
        run / "trajectories" / "step-000002.jsonl.gz"
    ).exists()
    assert 2 in {json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()}
    with pytest.raises(Killed):
        trainer_for(world, tmp_path, callbacks=[KillAt("on_train_begin", 1)], eval_rows=QA, **kw).train(
            resume=True
        )
    assert sorted(p.name for p in (run / "eval").glob("step-*.json")) == ["step-1.json"]
    assert sorted(p.name for p in (run / "trajectories").iterdir()) == ["step-000001.jsonl.gz"]
    assert {json.loads(line)["step"] for line in (run / "samples.jsonl").read_text().splitlines()} == {1}
    assert [r["step"] for r in read_raw_metrics(tmp_path)] == [1]


def test_the_guard_does_not_roll_back_the_first_step_onto_the_weights_that_sampled_it(world, tmp_path):
    # Step 1's rollouts come from the starting weights (the step-0 checkpoint): a rollback would redo the same
    # rollouts from the same weights. The guard says why and goes on instead of looping to a RuntimeError.
    trainer = trainer_for(
        world,
        tmp_path,
        total_episodes=8,
        collapse_guard=True,
        collapse_window=1,
        collapse_entropy_min=None,
        collapse_kl_max=None,
        collapse_format_min=None,
        collapse_reward_drop=None,
        collapse_max_rollbacks=0,
    )
    trainer.guard.check = lambda metrics: "forced" if trainer.global_step == 1 else None
    trainer.train()
    rows = read_metrics(tmp_path)
    assert [r["step"] for r in rows] == [1, 2]
    assert rows[0]["guard/reason"] == "forced" and rows[0]["guard/no_rollback"] == 1.0
    assert trainer.rollbacks == 0
