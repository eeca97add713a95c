"""How many torch threads a real-loop stage runs with, decided at each stage from what the run measures.

What: `ThreadGovernor.decide(stage)` (the stage runner calls it as each stage starts) measures how many cores
the other processes on the machine used, `others = (system busy CPU seconds - this process's CPU seconds) /
wall seconds` over a window (the cores this process may run on, `/proc/stat`; this process's own CPU seconds
from `getrusage`), and picks `choose_threads(cores, others)`: as many threads as the free cores allow, at most
`budget` (default: every core this process may use; 2 on the shared 2-core machine). The window is the time since the last decision (the previous stage, or the previous check
inside a stage) when that is at least `min_window_s` long, else a fresh sample of `sample_s` seconds while
this process waits. `trainer_callback()` re-decides inside a long stage (SFT, PPO, GRPO) at an optimizer
step's end, at most every `recheck_s` seconds. Every decision is kept (`decisions`: stage -> threads, the
others' cores, the window, the 1-minute load average) and goes into summary.json.

Why not the load average: it counts this run's own threads too (two threads of ours read as a load of 2,
"busy"), and it lags a minute; decided once at the start, a run started right after `make test` chose one
thread for its whole 40 minutes on an idle machine (issue 25). Why not more threads than free cores: on two
shared cores, two OpenMP threads that wait for each other made a decode step 3-5x slower than one thread.
Subtracting our own CPU time leaves what the neighbours take, whatever our thread count was.

Tests inject the reading (`reader`, `sleep`) and check the rule (tests/test_demo_threads.py).
"""

from __future__ import annotations

import math
import os
import resource
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from transformers import TrainerCallback

# /proc/stat's per-CPU fields that count as busy: user, nice, system, irq, softirq, steal (not idle, iowait).
_BUSY_FIELDS = (0, 1, 2, 5, 6, 7)


@dataclass(frozen=True)
class CpuReading:
    """One reading: monotonic wall seconds, busy CPU seconds of the cores this process may use (all
    processes), and this process's own CPU seconds (user + system, every thread)."""

    wall: float
    busy: float
    own: float


def usable_cores() -> list[int]:
    """The CPUs this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return sorted(os.sched_getaffinity(0))
    return list(range(os.cpu_count() or 1))


def read_cpu(cores: list[int] | None = None) -> CpuReading:
    """A `CpuReading` now (Linux `/proc/stat`; without it, busy is estimated from the 1-minute load average)."""
    cores = usable_cores() if cores is None else cores
    usage = resource.getrusage(resource.RUSAGE_SELF)
    own = usage.ru_utime + usage.ru_stime
    wall = time.monotonic()
    try:
        tick = os.sysconf("SC_CLK_TCK")
        wanted = {f"cpu{c}" for c in cores}
        busy = 0.0
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                name, *fields = line.split()
                if name in wanted:
                    busy += sum(int(fields[i]) for i in _BUSY_FIELDS if i < len(fields)) / tick
        return CpuReading(wall, busy, own)
    except (OSError, ValueError):  # no /proc: a reading whose window shows the load average as "others"
        return CpuReading(wall, float("nan"), own)


def choose_threads(cores: int, others_busy: float, budget: int = 2, margin: float = 0.5) -> int:
    """Threads for `cores` cores of which other processes use `others_busy`: the free cores, rounded up
    when within `margin` of the next whole core, between 1 and `min(budget, cores)`."""
    free = cores - max(0.0, others_busy)
    return max(1, min(budget, cores, math.floor(free + margin)))


def others_busy(before: CpuReading, after: CpuReading) -> float:
    """Cores the other processes used between two readings (this process's CPU time taken out)."""
    wall = after.wall - before.wall
    if wall <= 0:
        raise ValueError("others_busy: the second reading must be later than the first")
    if math.isnan(after.busy) or math.isnan(before.busy):
        return os.getloadavg()[0]
    return max(0.0, ((after.busy - before.busy) - (after.own - before.own)) / wall)


class ThreadGovernor:
    """Decides the thread count per stage (module docstring). `requested > 0` fixes it for the whole run."""

    def __init__(
        self,
        requested: int = 0,
        budget: int | None = None,
        reader: Callable[[], CpuReading] | None = None,
        sleep: Callable[[float], None] = time.sleep,
        set_threads: Callable[[int], None] | None = None,
        cores: int | None = None,
        sample_s: float = 1.0,
        min_window_s: float = 5.0,
        recheck_s: float = 120.0,
    ) -> None:
        self.requested = requested
        self.cores = cores if cores is not None else len(usable_cores())
        self.budget = budget if budget is not None else self.cores  # null: every usable core
        self.reader = reader or read_cpu
        self.sleep = sleep
        self.set_threads = set_threads or _torch_set_threads
        self.sample_s, self.min_window_s, self.recheck_s = sample_s, min_window_s, recheck_s
        self.decisions: dict[str, dict[str, Any]] = {}
        self.threads = 0
        self._last: CpuReading | None = None

    @property
    def rule(self) -> str:
        if self.requested > 0:
            return f"fixed: num_threads {self.requested}"
        return (
            f"per stage: the free cores of {self.cores} (others' CPU use measured since the last decision, or "
            f"over {self.sample_s:g} s), at most {self.budget}"
        )

    def decide(self, stage: str) -> int:
        """The thread count for `stage` (set in torch) and its record in `decisions[stage]`."""
        if self.requested > 0:
            threads, record = self.requested, {"threads": self.requested}
        else:
            threads, record = self._measure()
        self._apply(threads)
        self.decisions[stage] = record
        return threads

    def recheck(self, stage: str) -> int:
        """Inside a stage: decide again when `recheck_s` has passed since the last decision (the window is that
        time, so nothing waits); a change is appended to `decisions[stage]["changes"]`."""
        if self.requested > 0 or self._last is None or self.reader().wall - self._last.wall < self.recheck_s:
            return self.threads
        before = self.threads
        threads, record = self._measure()
        self._apply(threads)
        if threads != before:
            entry = self.decisions.setdefault(stage, {"threads": before})
            entry.setdefault("changes", []).append(record)
        return threads

    def trainer_callback(self, stage: str) -> TrainerCallback:
        """A `TrainerCallback` that rechecks at each optimizer step's end (SFT, PPO, GRPO)."""
        return _RecheckCallback(self, stage)

    def _measure(self) -> tuple[int, dict[str, Any]]:
        now = self.reader()
        start = self._last
        if start is None or now.wall - start.wall < self.min_window_s:
            start = now
            self.sleep(self.sample_s)
            now = self.reader()
        others = others_busy(start, now)
        self._last = now
        threads = choose_threads(self.cores, others, self.budget)
        return threads, {
            "threads": threads,
            "others_busy_cores": round(others, 2),
            "window_s": round(now.wall - start.wall, 1),
            "load_1m": round(os.getloadavg()[0], 2),
        }

    def _apply(self, threads: int) -> None:
        if threads != self.threads:
            self.set_threads(threads)
            self.threads = threads

    def summary(self) -> dict[str, Any]:
        """What summary.json records: the rule and each stage's decision."""
        return {"rule": self.rule, "per_stage": dict(self.decisions)}


class _RecheckCallback(TrainerCallback):
    def __init__(self, governor: ThreadGovernor, stage: str) -> None:
        self.governor, self.stage = governor, stage

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.governor.recheck(self.stage)


def _torch_set_threads(n: int) -> None:
    import torch  # deferred: the demo has loaded it by then; tests of the rule need not

    torch.set_num_threads(n)
