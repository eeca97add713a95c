"""searchrl.run: the run directory, one owner for each of its sides.

- `manifest.py`: `manifest.json` (versions, commit, seeds, tokenizer facts, the trainer and its config class);
- `writer.py`: the file and step names, the eval files (`write_evaluation`, one trajectories suffix), metric
  names written once (`METRIC_ALIASES`), `RunDir`, `Cadence` and `BestCheckpoint`: what every trainer writes;
- `layout.py`: `DemoLayout`, the stages, runs and evaluations a demo lists in its `summary.json`;
- `reader.py` and `sources.py`: `RunReader`, the one reader of run files (metrics with the collapse guard's
  rollbacks applied, eval files, trajectory sources, checkpoints, data, index, and the run's environment,
  generation and reward settings), with `TrajectorySource` and `EvalFile`;
- `target.py`: what a path is (a demo, a run and its trainer, a trajectories file) and the refusals;
- `errors.py`: `RunTargetError`, what every reader raises for a path that is not a run.

`from searchrl.run import RunReader` works; the names below are imported from their module on first use.
"""

from __future__ import annotations

from searchrl.common.lazy import lazy_attributes

_EXPORTS = {
    "RunReader": "searchrl.run.reader",
    "RunDir": "searchrl.run.writer",
    "DemoLayout": "searchrl.run.layout",
    "RunTargetError": "searchrl.run.errors",
}

__all__ = sorted(_EXPORTS)

__getattr__ = lazy_attributes(__name__, _EXPORTS)
