"""The run layer both trainers share: the training clock and atomic, pruned checkpoints."""

from __future__ import annotations

import time

import pytest

from searchrl.common.clock import TrainingClock
from searchrl.common.run import RunDir


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
