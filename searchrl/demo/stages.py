"""The stage runner both demos use: each stage with a progress line, its wall and CPU seconds and peak memory.

What: `StageRunner.run(name, fn)` runs one stage under a spinner; `run_with_progress(name, fn, total)` under a
bar that `fn` moves through the `StageProgress` it gets: `advance(n)` by hand (expert batches, practice
worlds), `evaluation_hook()` from an evaluation (`evaluate_policy(progress=...)`, one call per batch of
questions) or `trainer_callback()`, a transformers `TrainerCallback` that SFT, PPO and GRPO fire at each
optimizer step (its total is the trainer's `max_steps` unless the stage gave one). For every stage the runner
records wall seconds (`timings`), CPU seconds of this process (`cpu`) and the process's peak RSS when the stage
ended (`peak_rss`); `totals()` gives the same three for the whole run. `on_stage_start(name)`, when given,
runs before each stage (the real loop decides its thread count there, `searchrl.demo.threads`).

Why CPU seconds too: on a shared machine the wall clock measures the neighbours as well; CPU seconds (user +
system of this process) do not. Why callbacks and hooks: the trainers and the evaluation say when a step ends;
parsing their log lines would tie the bar to a message's wording.
"""

from __future__ import annotations

import resource
import time
from collections.abc import Callable
from typing import Any, TypeVar

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from transformers import TrainerCallback

T = TypeVar("T")
# Logged figures shown beside a training stage's bar (SFT: loss; PPO: score and KL; GRPO: reward and loss).
NOTE_KEYS = (("objective/scores", "score"), ("objective/kl", "kl"), ("reward", "reward"), ("loss", "loss"))


def peak_rss_mb() -> float:
    """Peak resident memory of this process (Linux reports ru_maxrss in KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


class StageProgress:
    """What a stage reports its progress through; every method does nothing when no bar is shown."""

    def __init__(self, bar: Progress | None = None, task: TaskID | None = None, total: int | None = None):
        self.bar, self.task, self.total = bar, task, total

    def advance(self, n: int = 1) -> None:
        if self.bar is not None and self.task is not None:
            self.bar.advance(self.task, n)

    def set_total(self, total: int) -> None:
        self.total = total
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, total=max(1, total))

    def note(self, text: str) -> None:
        """A short text beside the bar (the last logged loss, a message)."""
        if self.bar is not None and self.task is not None:
            self.bar.update(self.task, note=text)

    def evaluation_hook(self) -> Callable[[int], None]:
        """`progress(n)` for `evaluate_policy`: called with the size of each evaluated batch of questions."""
        return self.advance

    def trainer_callback(self) -> TrainerCallback:
        """A `TrainerCallback` that moves this bar one step per optimizer step (SFT, PPO, GRPO)."""
        return StageProgressCallback(self)


class StageProgressCallback(TrainerCallback):
    """Moves a stage's bar with a trainer's optimizer steps; the logged loss or score goes beside it.

    The total is the trainer's `state.max_steps` at `on_train_begin` unless the stage already set one (SFT's
    curriculum runs one trainer per phase: the stage sets the steps of all phases together). It only reads the
    trainer's state, so a run with it trains exactly as one without.
    """

    def __init__(self, progress: StageProgress) -> None:
        self.progress = progress

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.progress.total is None and state.max_steps:
            self.progress.set_total(int(state.max_steps))

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.progress.advance(1)

    def on_log(
        self, args: Any, state: Any, control: Any, logs: dict[str, Any] | None = None, **kw: Any
    ) -> None:
        shown = [f"{label} {float(logs[key]):.3f}" for key, label in NOTE_KEYS if key in (logs or {})]
        if shown:
            self.progress.note(" ".join(shown[:2]))


class StageRunner:
    """Runs a demo's stages in order and measures each (see the module docstring)."""

    def __init__(self, show: bool, on_stage_start: Callable[[str], Any] | None = None) -> None:
        self.show = show
        self.on_stage_start = on_stage_start  # before each stage, with its name (the real loop: threads)
        self.console = Console(stderr=True)
        self.timings: dict[str, float] = {}  # wall seconds per stage
        self.cpu: dict[str, float] = {}  # CPU seconds per stage
        self.peak_rss: dict[str, float] = {}  # the process's peak RSS (MB) when each stage ended
        self._wall_start, self._cpu_start = time.perf_counter(), cpu_seconds()

    def run(self, name: str, fn: Callable[[], T]) -> T:
        """Run a stage that reports no progress (a spinner while it runs)."""
        if not self.show:
            return self._measured(name, fn)
        with self.console.status(f"[bold]{name}[/bold] ..."):
            return self._measured(name, fn)

    def run_with_progress(self, name: str, fn: Callable[[StageProgress], T], total: int | None = None) -> T:
        """Run a stage that reports progress: `fn(progress)`, with a bar of `total` steps (or the total a
        trainer callback sets)."""
        if not self.show:
            return self._measured(name, lambda: fn(StageProgress(total=total)))
        bar = Progress(
            TextColumn(f"[bold]{name:<10}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TextColumn("{task.fields[note]}"),
            console=self.console,
            transient=True,
        )
        task = bar.add_task(name, total=None if total is None else max(1, total), note="")
        with bar:
            return self._measured(name, lambda: fn(StageProgress(bar, task, total)))

    def totals(self) -> dict[str, float]:
        """Wall and CPU seconds since the runner was made, and the process's peak RSS (MB)."""
        return {
            "wall_seconds": round(time.perf_counter() - self._wall_start, 1),
            "cpu_seconds": round(cpu_seconds() - self._cpu_start, 1),
            "peak_rss_mb": round(peak_rss_mb(), 1),
        }

    def _measured(self, name: str, fn: Callable[[], T]) -> T:
        if self.on_stage_start is not None:
            self.on_stage_start(name)
        start, cpu = time.perf_counter(), cpu_seconds()
        out = fn()
        self.timings[name] = round(time.perf_counter() - start, 2)
        self.cpu[name] = round(cpu_seconds() - cpu, 1)
        self.peak_rss[name] = round(peak_rss_mb(), 1)
        if self.show:
            self.console.print(f"[green]✓[/green] {name:<10} {self.timings[name]:>7.1f} s")
        return out
