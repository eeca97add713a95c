"""What the run layer refuses, and what it says a valid target is.

`RunTargetError` is raised by every reader of the run layer (`RunReader`, the demo layout, the manifest's
config class) for a path or a record it cannot read as a run; its message names what was wrong and, where it
helps, `VALID_TARGETS`. It sits below the other modules of the package so that each can raise it.
"""

from __future__ import annotations

VALID_TARGETS = (
    "a run directory (PPO or GRPO, what `searchrl train` / `searchrl grpo` write: config.yaml, manifest.json, "
    "metrics.jsonl, trajectories/, checkpoints/), a demo directory (what `searchrl demo` writes: summary.json "
    "with its layout) or one trajectories file (*.jsonl.gz or *.jsonl, e.g. "
    "RUN/trajectories/step-000001.jsonl.gz or RUN/eval/test-step-2.trajectories.jsonl.gz)"
)


class RunTargetError(ValueError):
    """The path is not a demo directory, a run directory or a trajectories file; the message says what is."""
