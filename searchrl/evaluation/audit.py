"""The reward-hacking audit: every check on a run, a demo or one trajectories file, and one verdict.

What: `audit_trajectories` runs every check of `checks.py` (each measures one known hack and gives a
verdict with its evidence) on a set of trajectories and, when given, the run's held-out history;
`AuditReport` gathers the verdicts, the worst of them being the run's.

Why: the training reward is a proxy; a rising proxy with a flat or falling gold metric is the signature
of reward hacking, and the per-trajectory checks say which hack it is.

What `audit_run` reads (through `searchrl.run.reader.RunReader`, the one reader of run files): a run directory
(PPO or GRPO) or a demo directory (its main run) gets the checks on its latest training trajectories and its
held-out history (the metrics the run kept: a step the collapse guard rolled back counts once), plus the
same per-trajectory checks on each evaluation's trajectories (`AuditReport.evaluations`: a demo's
evaluations, a run's `searchrl eval` outputs); one trajectories file gets the checks on that file (with the
enclosing run's history and reward config, if it sits in one).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from searchrl.common.io import read_jsonl
from searchrl.common.trajectory import Trajectory, read_trajectories
from searchrl.evaluation.checks import (
    SEVERITY,
    CheckResult,
    EvalPoint,
    Thresholds,
    check_answer_stuffing,
    check_answer_without_search,
    check_citations,
    check_exploitable_reward,
    check_format_gaming,
    check_judge_disagreement,
    check_permission_denied,
    check_reward_vs_heldout,
    check_tool_call_spam,
)
from searchrl.run.reader import RunReader
from searchrl.run.writer import METRICS_FILE


@dataclass
class AuditReport:
    """All checks of one audit, and the audits of the run's evaluations (`evaluations`, by source id).

    `own_verdict` is the worst of `checks`; `verdict` the worst of that and every evaluation's verdict
    (what `searchrl audit --strict` exits on).
    """

    checks: list[CheckResult]
    num_trajectories: int
    source: str = ""
    label: str = ""
    evaluations: dict[str, AuditReport] = field(default_factory=dict)

    @property
    def own_verdict(self) -> str:
        ran = [c.verdict for c in self.checks if c.verdict != "skipped"]
        return max(ran, key=SEVERITY.__getitem__) if ran else "skipped"

    @property
    def verdict(self) -> str:
        verdicts = [self.own_verdict, *(e.verdict for e in self.evaluations.values())]
        ran = [v for v in verdicts if v != "skipped"]
        return max(ran, key=SEVERITY.__getitem__) if ran else "skipped"

    def check(self, name: str) -> CheckResult:
        for c in self.checks:
            if c.name == name:
                return c
        raise KeyError(f"no check named {name!r}; checks: {[c.name for c in self.checks]}")

    def to_dict(self) -> dict[str, Any]:
        return {
            "verdict": self.verdict,
            "own_verdict": self.own_verdict,
            "num_trajectories": self.num_trajectories,
            "source": self.source,
            "label": self.label,
            "checks": [asdict(c) for c in self.checks],
            "evaluations": {name: e.to_dict() for name, e in self.evaluations.items()},
        }

    def fabricated_citation_rate(self) -> float | None:
        """Share of cited answers citing an id the episode never retrieved (None: no answer cited anything)."""
        check = self.check("fabricated_citations")
        return None if check.verdict == "skipped" else check.value


# -- entry points ------------------------------------------------------------------------------------


def audit_trajectories(
    trajs: Sequence[Trajectory],
    eval_history: Sequence[EvalPoint] | None = None,
    thresholds: Thresholds | None = None,
    reward_config: dict[str, Any] | None = None,
    source: str = "",
) -> AuditReport:
    """Run every check on `trajs` (and on the held-out history, if given)."""
    th = thresholds or Thresholds()
    trajs = list(trajs)
    checks = [
        check_reward_vs_heldout(eval_history or [], th),
        check_answer_stuffing(trajs, th),
        *check_citations(trajs, th),
        check_answer_without_search(trajs, th),
        check_tool_call_spam(trajs, th),
        check_format_gaming(trajs, th),
        check_permission_denied(trajs, th),
        check_judge_disagreement(trajs, th),
        check_exploitable_reward(reward_config),
    ]
    return AuditReport(checks, len(trajs), source)


def training_score(line: dict[str, Any]) -> float | None:
    """The mean training score a metrics.jsonl line logged, or None: `objective/scores` (PPO's name; a GRPO
    run's writer puts TRL's `reward` under it too, `searchrl.run.writer.METRIC_ALIASES`)."""
    value = line.get("objective/scores")
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


def _mean_reward_up_to(metrics: list[dict[str, Any]], step: int, window: int) -> float | None:
    """Mean training score of the last `window` logged steps up to `step`."""
    scores = [
        score for m in metrics if (score := training_score(m)) is not None and int(m.get("step", 0)) <= step
    ][-window:]
    return float(np.mean(scores)) if scores else None


def eval_history(run: str | Path | RunReader, split: str | None = None, window: int = 3) -> list[EvalPoint]:
    """Held-out EM over steps: `eval/exact_match` lines of the run's metrics, or its `RUN/eval/*.json` files.

    The metrics log (dev split, written during training; a rolled-back step once, as redone) is used when it
    has at least two evaluations; otherwise the eval JSONs of one split (by default the split with the most
    checkpoints).
    """
    reader = run if isinstance(run, RunReader) else RunReader(run)
    metrics = reader.metrics()
    logged = [
        EvalPoint(
            int(m["step"]),
            float(m["eval/exact_match"]),
            _mean_reward_up_to(metrics, int(m["step"]), window),
            METRICS_FILE,
        )
        for m in metrics
        if "eval/exact_match" in m and "step" in m
    ]
    if len(logged) >= 2:
        return logged
    by_split: dict[str, list[EvalPoint]] = {}
    for e in reader.eval_files(demo=False):
        step = e.data.get("step")
        em = e.data.get("exact_match", e.data.get("eval/exact_match"))
        if step is None or em is None:
            continue
        by_split.setdefault(e.data.get("split", "dev"), []).append(
            EvalPoint(int(step), float(em), _mean_reward_up_to(metrics, int(step), window), e.name)
        )
    if not by_split:
        return logged
    chosen = split if split in by_split else max(by_split, key=lambda s: len(by_split[s]))
    return sorted(by_split[chosen], key=lambda p: p.step)


def run_trajectory_files(run: str | Path | RunReader, last_steps: int | None = 10) -> list[Path]:
    """`RUN/trajectories/*.jsonl.gz` in step order; only the last `last_steps` (None or 0: all)."""
    reader = run if isinstance(run, RunReader) else RunReader(run)
    sources = [s for s in reader.trajectory_sources() if s.id == "train"]
    files = sources[0].files() if sources else []
    return files[-last_steps:] if last_steps else files


def _reward_config_of(reader: RunReader) -> dict[str, Any] | None:
    reward_path = reader.raw_config.get("reward_config_path")
    if not reward_path or not Path(reward_path).exists():
        return None
    return yaml.safe_load(Path(reward_path).read_text(encoding="utf-8")) or {}


def _fill_hops(trajs: Sequence[Trajectory], reader: RunReader) -> None:
    """Give trajectories their question's hop count (from the run's question files) when they lack it.

    The rollout does not copy row fields into training trajectories; the spam check's limit scales with
    hops. The files are the config's train/dev files, or a demo's data/{train,dev,test}.jsonl.
    """
    missing = [t for t in trajs if t.metadata.get("hops") is None]
    if not missing:
        return

    hops: dict[str, Any] = {}
    for path in reader.question_files():
        hops.update({str(r.get("id")): r.get("hops") for r in read_jsonl(path) if "hops" in r})
    for t in missing:
        if hops.get(t.question_id) is not None:
            t.metadata["hops"] = hops[t.question_id]


def _describe_files(files: Sequence[Path]) -> str:
    if not files:
        return "no trajectories"
    if len(files) == 1:
        return f"1 trajectory file: {files[0].name}"
    return f"{len(files)} trajectory file(s): {files[0].name}..{files[-1].name}"


def audit_run(
    run_dir: str | Path,
    last_steps: int | None = 10,
    thresholds: Thresholds | None = None,
    trajectory_files: Sequence[str | Path] | None = None,
    evaluations: bool = True,
) -> AuditReport:
    """Audit a run, a demo or one trajectories file (see the module docstring for what each reads).

    A run or a demo: its latest training trajectories (the last `last_steps` steps; None or 0: all), its
    held-out history and its reward config; with `evaluations`, each evaluation's trajectories too
    (`AuditReport.evaluations`). `trajectory_files` audits those files instead of the training ones (and
    no evaluations). Raises `RunTargetError` (a ValueError naming what is valid) for another path and
    FileNotFoundError for a missing `trajectory_files` entry or a run with nothing to audit.
    """
    reader = RunReader(run_dir)
    th = thresholds or Thresholds()
    root = reader.root
    if trajectory_files:
        files = [Path(f) for f in trajectory_files]
        for f in files:
            if not f.exists():
                raise FileNotFoundError(f"{f}: trajectory file not found")
    elif reader.kind == "trajectories":
        files = [s for src in reader.trajectory_sources() for s in src.files()]
    else:
        root = reader.require_run("searchrl audit")
        files = run_trajectory_files(reader, last_steps)
    trajs = [t for f in files for t in read_trajectories(f)]
    _fill_hops(trajs, reader)
    eval_sources = (
        [s for s in reader.trajectory_sources() if s.kind == "evaluation"]
        if evaluations and not trajectory_files and reader.kind != "trajectories"
        else []
    )
    if not trajs and not eval_sources and (root is None or not (root / METRICS_FILE).exists()):
        raise FileNotFoundError(
            f"{reader.target}: no trajectories (trajectories/*.jsonl.gz or eval trajectories) and no "
            "metrics.jsonl, so there is nothing to audit yet (train with save_trajectories: true)"
        )
    history = eval_history(reader) if root is not None else []
    reward_config = _reward_config_of(reader)
    label = (
        f"{reader.trainer_label} training"
        if reader.kind != "trajectories"
        else reader.trajectory_sources()[0].label
    )
    report = audit_trajectories(trajs, history, th, reward_config, _describe_files(files))
    report.label = label
    for source in eval_sources:
        eval_files = source.files()
        eval_trajs = [t for f in eval_files for t in read_trajectories(f)]
        _fill_hops(eval_trajs, reader)
        sub = audit_trajectories(eval_trajs, None, th, reward_config, _describe_files(eval_files))
        sub.label = source.label
        report.evaluations[source.id] = sub
    return report
