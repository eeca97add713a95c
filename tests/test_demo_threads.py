"""The real loop's thread rule (`searchrl.demo.threads`), with injected CPU readings: no model, no waiting."""

from __future__ import annotations

import pytest

from searchrl.demo.stages import StageRunner
from searchrl.demo.threads import CpuReading, ThreadGovernor, choose_threads, others_busy, read_cpu


@pytest.mark.parametrize(
    ("cores", "others", "budget", "expected"),
    [
        (2, 0.0, 2, 2),  # idle: both cores
        (2, 0.4, 2, 2),  # a light neighbour: 1.6 free cores round up
        (2, 0.6, 2, 1),  # 1.4 free: two threads would wait for each other
        (2, 1.0, 2, 1),  # one busy neighbour (`make test`): one thread
        (2, 5.0, 2, 1),  # overloaded: never fewer than one
        (16, 3.0, 2, 2),  # a big machine: the budget caps it
        (16, 3.0, 8, 8),
        (16, 10.7, 8, 5),
        (1, 0.0, 2, 1),  # one core
    ],
)
def test_choose_threads(cores, others, budget, expected):
    assert choose_threads(cores, others, budget) == expected


class FakeClock:
    """Readings of a machine where the others use `others` cores and this process `own` cores."""

    def __init__(self, others: float = 0.0, own: float = 0.0) -> None:
        self.wall = self.busy = self.own_s = 0.0
        self.others, self.own = others, own
        self.sleeps: list[float] = []

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.busy += (self.others + self.own) * seconds
        self.own_s += self.own * seconds

    def read(self) -> CpuReading:
        return CpuReading(self.wall, self.busy, self.own_s)

    def sleep(self, seconds: float) -> None:
        self.sleeps.append(seconds)
        own, self.own = self.own, 0.0  # this process waits while it samples
        self.advance(seconds)
        self.own = own


def governor(clock: FakeClock, **kw) -> tuple[ThreadGovernor, list[int]]:
    set_calls: list[int] = []
    gov = ThreadGovernor(
        0, budget=2, reader=clock.read, sleep=clock.sleep, set_threads=set_calls.append, cores=2, **kw
    )
    return gov, set_calls


def test_each_stage_decides_from_the_others_load_not_its_own():
    clock = FakeClock(others=1.0)  # `make test` running beside the demo
    gov, set_calls = governor(clock)
    assert gov.decide("import") == 1 and clock.sleeps == [1.0]  # the first decision samples for 1 s
    assert gov.decisions["import"]["others_busy_cores"] == pytest.approx(1.0)
    # The neighbour ends; this run keeps one core busy through the stage (its own load is not counted).
    clock.others, clock.own = 0.0, 1.0
    clock.advance(300)
    assert gov.decide("sft") == 2 and clock.sleeps == [1.0]  # the stage was the window: no waiting
    assert gov.decisions["sft"] == {
        "threads": 2,
        "others_busy_cores": 0.0,
        "window_s": 300.0,
        "load_1m": gov.decisions["sft"]["load_1m"],
    }
    # Our two threads keep both cores busy: still 2 (a load average would read 2.0 and choose 1).
    clock.own = 2.0
    clock.advance(200)
    assert gov.decide("eval sft") == 2
    # A neighbour starts during the next stage: back to one thread.
    clock.others, clock.own = 1.2, 0.8
    clock.advance(100)
    assert gov.decide("ppo") == 1
    assert set_calls == [1, 2, 1]  # torch is told only when the count changes
    assert gov.summary()["per_stage"].keys() == {"import", "sft", "eval sft", "ppo"}
    assert "per stage" in gov.summary()["rule"]


def test_a_short_window_is_replaced_by_a_fresh_sample():
    clock = FakeClock(others=0.0)
    gov, _ = governor(clock)
    gov.decide("data")
    clock.advance(0.2)  # a stage of 0.2 s tells nothing: sample again
    gov.decide("index")
    assert clock.sleeps == [1.0, 1.0] and gov.decisions["index"]["window_s"] == 1.0


def test_recheck_inside_a_stage_records_changes():
    clock = FakeClock(others=0.0, own=2.0)
    gov, _ = governor(clock, recheck_s=60)
    assert gov.decide("ppo") == 2
    clock.advance(30)
    assert gov.recheck("ppo") == 2 and "changes" not in gov.decisions["ppo"]  # too soon: not measured
    clock.others, clock.own = 1.0, 1.0
    clock.advance(90)
    assert gov.recheck("ppo") == 1
    assert [c["threads"] for c in gov.decisions["ppo"]["changes"]] == [1]
    assert clock.sleeps == [1.0]  # rechecks never wait
    callback = gov.trainer_callback("ppo")
    clock.others, clock.own = 0.0, 1.0
    clock.advance(90)
    callback.on_step_end(None, None, None)
    assert [c["threads"] for c in gov.decisions["ppo"]["changes"]] == [1, 2]


def test_a_fixed_count_is_kept_and_the_runner_asks_before_each_stage():
    clock = FakeClock(others=2.0)
    set_calls: list[int] = []
    gov = ThreadGovernor(2, reader=clock.read, sleep=clock.sleep, set_threads=set_calls.append, cores=2)
    runner = StageRunner(False, on_stage_start=gov.decide)
    assert runner.run("a", lambda: 1) == 1 and runner.run("b", lambda: 2) == 2
    assert gov.decisions == {"a": {"threads": 2}, "b": {"threads": 2}} and set_calls == [2]
    assert clock.sleeps == [] and gov.recheck("b") == 2 and gov.summary()["rule"] == "fixed: num_threads 2"


def test_real_readings_and_others_busy():
    first = read_cpu()
    total = sum(i * i for i in range(200_000))  # some CPU time of our own
    second = read_cpu()
    assert total > 0 and second.wall > first.wall and second.own >= first.own
    assert others_busy(first, second) >= 0.0
    with pytest.raises(ValueError, match="later"):
        others_busy(second, first)


def test_the_default_budget_is_every_usable_core():
    clock = FakeClock(others=3.0)  # a 16-core machine with three cores busy elsewhere
    gov = ThreadGovernor(0, reader=clock.read, sleep=clock.sleep, set_threads=lambda n: None, cores=16)
    assert gov.budget == 16 and gov.decide("sft") == 13
    assert "at most 16" in gov.rule
