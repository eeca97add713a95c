"""The run layer both trainers share: the training clock, atomic pruned checkpoints, the cadence of logging,
evaluation, saving and samples, the best checkpoint, and the files every run writes."""

from __future__ import annotations

import json
import time

import pytest

from searchrl.common.clock import TrainingClock
from searchrl.run.writer import BestCheckpoint, Cadence, RunDir


def test_the_training_clock_pauses_while_evaluating_and_resumes_from_a_checkpoint():
    clock = TrainingClock()
    assert clock.reading() == {"time/train_s": 0.0, "time/elapsed_s": 0.0}  # not started: no time passes
    clock.start()
    time.sleep(0.05)
    with clock.evaluating() as at_start:
        assert not clock.running
        time.sleep(0.3)
    assert clock.running  # it was running before the evaluation, so it runs again after
    reading = clock.reading()
    assert at_start["time/train_s"] >= 0.05
    assert reading["time/train_s"] < 0.25  # the 0.3 s of evaluation is not training time
    assert clock.eval_seconds >= 0.3
    assert reading["time/elapsed_s"] == pytest.approx(reading["time/train_s"] + clock.eval_seconds)

    clock.stop()
    with clock.evaluating():  # an evaluation outside the training loop leaves the clock stopped
        pass
    assert not clock.running

    resumed = TrainingClock()
    resumed.start()
    resumed.restore(12.0, 3.0)  # a checkpoint's seconds; the running clock goes on from them
    r = resumed.reading()
    assert 12.0 <= r["time/train_s"] < 12.5 and r["time/elapsed_s"] == pytest.approx(r["time/train_s"] + 3.0)


def test_a_checkpoint_whose_writer_fails_leaves_the_previous_one_whole(tmp_path):
    run = RunDir(tmp_path / "run")

    def fill(folder, text):
        (folder / "weights.bin").write_text(text)
        (folder / "trainer_state.json").write_text("{}")

    first = run.write_checkpoint(3, lambda f: fill(f, "first"))
    assert (first / "weights.bin").read_text() == "first"

    def broken(folder):
        (folder / "weights.bin").write_text("half")
        raise OSError("disk full")

    with pytest.raises(OSError, match="disk full"):
        run.write_checkpoint(3, broken)
    assert (first / "weights.bin").read_text() == "first"  # the complete one is untouched
    assert run.latest_checkpoint() == first
    # The next save clears the killed one's temporary folder and replaces step-3 as a whole.
    again = run.write_checkpoint(3, lambda f: fill(f, "second"))
    assert (again / "weights.bin").read_text() == "second"
    assert not list(run.checkpoints.glob(".tmp-*"))


def test_pruning_keeps_the_newest_and_the_protected_checkpoints(tmp_path):
    run = RunDir(tmp_path / "run")
    made = {
        step: run.write_checkpoint(step, lambda f: (f / "trainer_state.json").write_text("{}"))
        for step in (1, 2, 10, 11, 12)
    }
    (run.checkpoints / "step-13").mkdir()  # incomplete: no trainer_state.json, never counted
    assert [p.name for p in run.complete_checkpoints()] == [
        "step-1",
        "step-2",
        "step-10",
        "step-11",
        "step-12",
    ]
    run.prune_checkpoints(2, protected={made[2], None})
    assert [p.name for p in run.complete_checkpoints()] == ["step-2", "step-11", "step-12"]
    run.prune_checkpoints(None, protected=set())  # no limit: nothing goes
    assert len(run.complete_checkpoints()) == 3
    assert run.latest_checkpoint() == made[12]  # step 10 sorts after step 2: by number, not by name


def test_the_cadence_both_trainers_follow():
    cadence = Cadence(max_steps=10, logging_steps=3, eval_steps=4, save_steps=5, num_sample_generations=2)
    assert [s for s in range(1, 11) if cadence.should_log(s)] == [3, 6, 9, 10]  # and always the last step
    assert cadence.should_log(4, {"eval/reward": 1.0}) and cadence.should_log(5, {"guard/rollback": 1.0})
    assert not cadence.should_log(5, {"objective/kl": 0.1})
    assert [s for s in range(1, 11) if cadence.should_evaluate(s)] == [4, 8, 10]  # ends on a measured point
    assert [s for s in range(1, 11) if cadence.should_save(s)] == [5, 10]
    assert [s for s in range(1, 11) if cadence.should_sample(s)] == [5, 10]
    never = Cadence(max_steps=10)
    assert not any(
        never.should_evaluate(s) or never.should_save(s) or never.should_sample(s) for s in range(11)
    )


def test_the_best_checkpoint_keeps_the_first_of_equal_values_and_resumes(tmp_path):
    run = RunDir(tmp_path / "run")
    best = BestCheckpoint(run, "eval/reward")
    assert best.improves(1, {"eval/reward": 0.5})
    best.record(run.checkpoint_dir(1))
    assert not best.improves(2, {"eval/reward": 0.5})  # equal: the earlier one stays
    assert not best.improves(3, {"eval/reward": float("nan")}) and not best.improves(3, {"loss": 9.0})
    assert best.improves(4, {"eval/reward": 0.7})
    best.record(run.checkpoint_dir(4), write=False)  # not the main process: nothing written
    assert json.loads(run.best_checkpoint.read_text()) == {
        "step": 1, "metric": "eval/reward", "value": 0.5, "checkpoint": "step-1"
    }  # fmt: skip
    resumed = BestCheckpoint(run, "eval/reward")
    resumed.restore(best.best)
    assert resumed.checkpoint == run.checkpoint_dir(4) and not resumed.improves(5, {"eval/reward": 0.6})
    assert not BestCheckpoint(run, None).improves(1, {"eval/reward": 1.0})  # best_metric: null


def test_eval_files_step_trajectories_and_samples_have_one_shape_and_name(tmp_path):
    from searchrl.common.trajectory import Trajectory, read_trajectories

    run = RunDir(tmp_path / "run")
    path = run.write_eval(3, {"episode": 24, "eval/reward": 0.5})
    assert path.name == "step-3.json" and json.loads(path.read_text()) == {
        "step": 3,
        "episode": 24,
        "eval/reward": 0.5,
    }
    traj = Trajectory(id="a#0", question_id="a", question="Q?", golds=["x"], input_ids=[5, 6, 7],
                      action_mask=[0, 1, 1], logprobs=[0.0, -1.0, -1.0], prompt_length=1, answer="x")  # fmt: skip
    assert run.write_step_trajectories(3, [traj]).name == "step-000003.jsonl.gz"
    assert [t.id for t in read_trajectories(run.step_trajectories(3))] == ["a#0"]

    class Decoder:
        def decode(self, ids, skip_special_tokens=False):
            return " ".join(map(str, ids))

    run.write_samples(3, [traj] * 6, Decoder())
    samples = [json.loads(line) for line in run.samples.read_text().splitlines()]
    assert len(samples) == 4 and samples[0]["episode"] == "6 7" and samples[0]["question"] == "Q?"
    run.truncate_after(2)  # resume's clean-up drops all of it again
    assert (
        not run.samples.read_text() and not list(run.eval.iterdir()) and not list(run.trajectories.iterdir())
    )
