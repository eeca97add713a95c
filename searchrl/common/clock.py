"""The training clock every trainer logs: training seconds apart from evaluation seconds.

`time/train_s` is the x axis of the trainers-side-by-side plots (dev exact match against training time),
so a trainer must not be charged for how often it was evaluated: the clock runs while the trainer trains
and pauses while it evaluates. `time/elapsed_s` is both together. A resumed run continues from the
seconds its checkpoint recorded, so the axis of a killed-and-resumed run matches an uninterrupted one's
(up to the seconds lost to the kill). PPO and GRPO both keep one `TrainingClock`.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from contextlib import contextmanager


class TrainingClock:
    """Training and evaluation seconds of one run, earlier sessions included."""

    def __init__(self, train_seconds: float = 0.0, eval_seconds: float = 0.0) -> None:
        self.train_seconds = float(train_seconds)
        self.eval_seconds = float(eval_seconds)
        self._started: float | None = None  # perf_counter when the running clock last started

    @property
    def running(self) -> bool:
        return self._started is not None

    def start(self) -> None:
        """Start (or keep) the training clock running."""
        if self._started is None:
            self._started = time.perf_counter()

    def stop(self) -> bool:
        """Fold the running clock into `train_seconds`; True when it was running."""
        if self._started is None:
            return False
        self.train_seconds += time.perf_counter() - self._started
        self._started = None
        return True

    def restore(self, train_seconds: float, eval_seconds: float) -> None:
        """Take a checkpoint's seconds; a running clock goes on from them."""
        self.train_seconds, self.eval_seconds = float(train_seconds), float(eval_seconds)
        if self._started is not None:
            self._started = time.perf_counter()

    def reading(self) -> dict[str, float]:
        """`time/train_s` (evaluation excluded) and `time/elapsed_s` (evaluation included), now."""
        train = self.train_seconds
        if self._started is not None:
            train += time.perf_counter() - self._started
        return {"time/train_s": train, "time/elapsed_s": train + self.eval_seconds}

    @contextmanager
    def evaluating(self) -> Iterator[dict[str, float]]:
        """Pause training time for an evaluation; yields the reading taken as the evaluation begins."""
        was_running = self.stop()
        started = time.perf_counter()
        try:
            yield self.reading()
        finally:
            self.eval_seconds += time.perf_counter() - started
            if was_running:
                self.start()
