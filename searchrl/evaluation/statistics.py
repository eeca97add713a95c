"""The statistics of an evaluation: per-question values, seeded bootstrap intervals and the summary.

What: `trajectory_values` gives every per-question metric of one trajectory (exact match, F1, citation
support, format validity, searches, tokens, turns, tool failures, latency), `summarise` turns a set of
trajectories into those metrics overall and by hop count, each with a seeded 95% percentile-bootstrap
confidence interval (`bootstrap_ci`; `bootstrap_ratio_ci` for a ratio of sums such as the tool failure
rate), `paired_comparison` / `paired_difference` the difference of two policies on the same questions with
a paired bootstrap interval (questions resampled jointly), and `dev_metrics` / `flat_metrics` reduce a
summary to the flat `eval/*` figures of a log line.

Why its own module: the numbers a report prints must mean the same whatever produced the trajectories (the
evaluation loop, a demo, the benchmark suite). The answer is the one the environment extracted
(`traj.answer`), scored with `rewards.qa`; citation support and format validity are the rewards' own
definitions. Timing (latency) is the only part of a summary that is not deterministic; it lives under the
`timing` key so the rest can be compared byte for byte.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from searchrl.common.trajectory import TERMINATION_REASONS, Trajectory
from searchrl.rewards.citation import citation_status
from searchrl.rewards.qa import exact_match, f1_score
from searchrl.rewards.shaping import is_well_formed

# Metrics that are a mean over questions (one value per trajectory).
PER_QUESTION_METRICS = (
    "exact_match",
    "f1",
    "citation_support",
    "format_valid",
    "searches_per_question",
    "action_tokens_per_question",
    "tokens_per_question",
    "turns_per_question",
)
# A ratio of sums (failed calls / all calls): bootstrapped over questions, not over calls.
RATIO_METRICS = ("tool_failure_rate",)
TIMING_METRICS = ("latency_s_per_question", "search_latency_ms_per_question")

DEFAULT_BOOTSTRAP = 1000
DEFAULT_CONFIDENCE = 0.95


# -- per-trajectory values ------------------------------------------------------------------------


def trajectory_values(traj: Trajectory) -> dict[str, float]:
    """Every per-question metric of one trajectory (the unit the bootstrap resamples)."""
    answer = traj.answer or ""
    golds = traj.golds or [""]
    failures = sum(1 for c in traj.tool_calls if c.status != "ok")
    return {
        "exact_match": exact_match(answer, golds) if traj.answer is not None else 0.0,
        "f1": f1_score(answer, golds) if traj.answer is not None else 0.0,
        "citation_support": float(traj.answer is not None and citation_status(traj) == "supported"),
        "format_valid": float(traj.termination == "answered" and is_well_formed(traj.final_text)),
        "searches_per_question": float(len(traj.tool_calls)),
        "action_tokens_per_question": float(traj.num_action_tokens),
        "tokens_per_question": float(len(traj.input_ids)),
        "turns_per_question": float(traj.num_turns),
        "tool_calls": float(len(traj.tool_calls)),
        "tool_failures": float(failures),
        "latency_s_per_question": float(traj.metadata.get("latency_s", 0.0)),
        "search_latency_ms_per_question": float(sum(c.latency_ms for c in traj.tool_calls)),
    }


# -- bootstrap ------------------------------------------------------------------------------------


def _resample_indices(n: int, n_resamples: int, seed: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, n, size=(n_resamples, n))


def bootstrap_ci(
    values: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap confidence interval of the mean of `values` (seeded: same input, same CI)."""
    _check_bootstrap_args(n_resamples, confidence)
    x = np.asarray(values, dtype=np.float64)
    if x.size == 0:
        raise ValueError("bootstrap_ci: no values; an interval needs at least one observation")
    means = x[_resample_indices(x.size, n_resamples, seed)].mean(axis=1)
    return _percentile_interval(means, confidence)


def bootstrap_ratio_ci(
    numerators: Sequence[float],
    denominators: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """CI of `sum(num) / sum(den)` resampling whole questions (a resample with no calls counts as 0)."""
    _check_bootstrap_args(n_resamples, confidence)
    num = np.asarray(numerators, dtype=np.float64)
    den = np.asarray(denominators, dtype=np.float64)
    if num.shape != den.shape or num.size == 0:
        raise ValueError(
            f"bootstrap_ratio_ci: numerators ({num.size}) and denominators ({den.size}) must be equally long "
            "and non-empty"
        )
    idx = _resample_indices(num.size, n_resamples, seed)
    n_sum, d_sum = num[idx].sum(axis=1), den[idx].sum(axis=1)
    ratios = np.divide(n_sum, d_sum, out=np.zeros_like(n_sum), where=d_sum > 0)
    return _percentile_interval(ratios, confidence)


def bootstrap_statistic_ci(
    n: int,
    statistic: Callable[[np.ndarray], float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Percentile-bootstrap interval of any statistic of `n` units (questions): `statistic(indices)` on each
    resample of unit indices drawn with replacement, for what is not a mean (a variance share, a ratio of sums
    over groups). Seeded, and with the same draws as `bootstrap_ci` for the same `n`, `n_resamples` and `seed`."""
    _check_bootstrap_args(n_resamples, confidence)
    if n < 1:
        raise ValueError("bootstrap_statistic_ci: no units; an interval needs at least one")
    stats = np.array([statistic(idx) for idx in _resample_indices(n, n_resamples, seed)], dtype=np.float64)
    return _percentile_interval(stats, confidence)


def _percentile_interval(stats: np.ndarray, confidence: float) -> tuple[float, float]:
    tail = (1.0 - confidence) / 2.0 * 100.0
    low, high = np.percentile(stats, [tail, 100.0 - tail])
    return float(low), float(high)


def _check_bootstrap_args(n_resamples: int, confidence: float) -> None:
    if not isinstance(n_resamples, int) or n_resamples < 1:
        raise ValueError(f"n_resamples={n_resamples!r} must be an integer >= 1 (1000 is typical)")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence={confidence!r} must be in (0, 1), e.g. 0.95")


def _paired_arrays(a: Sequence[float], b: Sequence[float], name: str) -> tuple[np.ndarray, np.ndarray]:
    x, y = np.asarray(a, dtype=np.float64), np.asarray(b, dtype=np.float64)
    if x.shape != y.shape or x.ndim != 1 or x.size == 0:
        raise ValueError(
            f"{name}: the two samples must be non-empty and equally long (one value per question, the same "
            f"questions in the same order), got {x.size} and {y.size}"
        )
    return x, y


def paired_difference(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """Mean of `a[i] - b[i]` over the same questions, with a paired percentile-bootstrap interval.

    `a` and `b` hold one value per question, the same questions in the same order (two policies on one test
    split). Each resample draws questions with replacement and takes both values of a drawn question
    together, so what the two policies share (an easy question both answer, a hard one both miss) cancels
    out: when the two are correlated the interval is narrower than that of two independent resamples
    (`unpaired_difference_ci`). Seeded: same input, same interval. Returns `{"mean", "ci95": [low, high],
    "n"}` (the interval's key follows `confidence`, as in `summarise`).
    """
    _check_bootstrap_args(n_resamples, confidence)
    x, y = _paired_arrays(a, b, "paired_difference")
    diff = x - y
    means = diff[_resample_indices(diff.size, n_resamples, seed)].mean(axis=1)
    return {
        "mean": float(diff.mean()),
        _ci_key(confidence): list(_percentile_interval(means, confidence)),
        "n": int(diff.size),
    }


def unpaired_difference_ci(
    a: Sequence[float],
    b: Sequence[float],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> tuple[float, float]:
    """Interval of `mean(a) - mean(b)` resampling the two samples independently (what two separate intervals
    imply); `paired_difference` is the one to report for two policies on the same questions."""
    _check_bootstrap_args(n_resamples, confidence)
    x, y = _paired_arrays(a, b, "unpaired_difference_ci")
    idx = _resample_indices(x.size, n_resamples, seed)
    idy = _resample_indices(y.size, n_resamples, seed + 1)
    return _percentile_interval(x[idx].mean(axis=1) - y[idy].mean(axis=1), confidence)


def paired_comparison(
    first: Sequence[Trajectory],
    second: Sequence[Trajectory],
    metrics: Sequence[str] = ("exact_match", "f1"),
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
    values: Callable[[Trajectory], Mapping[str, float]] = trajectory_values,
) -> dict[str, dict[str, Any]]:
    """`first` minus `second`, per metric (names of `values`: `trajectory_values` by default, or a task's own
    per-question figures), paired by question id.

    Both must hold one trajectory for each of the same questions (any order): `{metric: {"mean", "ci95", "n"}}`
    from `paired_difference`, with the same resampled questions for every metric.
    """
    a = {t.question_id: values(t) for t in first}
    b = {t.question_id: values(t) for t in second}
    if len(a) != len(first) or len(b) != len(second) or set(a) != set(b):
        raise ValueError(
            f"paired_comparison: both sides need one trajectory per question and the same questions; got "
            f"{len(first)} trajectories on {len(a)} questions and {len(second)} on {len(b)}, "
            f"{len(set(a) ^ set(b))} questions on one side only"
        )
    ids = [t.question_id for t in first]
    return {
        m: paired_difference([a[q][m] for q in ids], [b[q][m] for q in ids], n_resamples, seed, confidence)
        for m in metrics
    }


# -- summaries ------------------------------------------------------------------------------------


def _ratio(num: float, den: float) -> float:
    return num / den if den > 0 else 0.0


def _summarise_group(
    values: list[dict[str, float]], terminations: list[str], n_resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    out: dict[str, Any] = {"n": len(values)}
    ci: dict[str, list[float]] = {}
    for name in PER_QUESTION_METRICS:
        column = [v[name] for v in values]
        out[name] = float(np.mean(column))
        ci[name] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    calls = [v["tool_calls"] for v in values]
    fails = [v["tool_failures"] for v in values]
    out["tool_failure_rate"] = _ratio(sum(fails), sum(calls))
    ci["tool_failure_rate"] = list(bootstrap_ratio_ci(fails, calls, n_resamples, seed, confidence))
    shares: dict[str, float] = {}
    for reason in TERMINATION_REASONS:
        column = [float(t == reason) for t in terminations]
        shares[reason] = float(np.mean(column))
        ci[f"termination/{reason}"] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    out["termination"] = shares
    out[_ci_key(confidence)] = ci
    return out


def _timing_group(values: list[dict[str, float]], n_resamples: int, seed: int, confidence: float) -> dict:
    out: dict[str, Any] = {}
    for name in TIMING_METRICS:
        column = [v[name] for v in values]
        out[name] = float(np.mean(column))
        out[f"{name}_ci"] = list(bootstrap_ci(column, n_resamples, seed, confidence))
    return out


def _hops_key(traj: Trajectory) -> str:
    hops = traj.metadata.get("hops")
    return "unknown" if hops is None else str(hops)


def summarise(
    trajectories: Sequence[Trajectory],
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """Metrics of a set of evaluation trajectories, overall and by hop count, each with a bootstrap CI.

    Keys: `n`, one float per metric in `PER_QUESTION_METRICS` and `RATIO_METRICS`, `termination`
    (share per reason), `ci95` (`{metric: [low, high]}`, termination shares as `termination/<reason>`),
    `by_hops` (`{"1": {...same keys...}, "2": ...}`, from `traj.metadata["hops"]`) and `timing`
    (latency per question; the only non-deterministic part). If `reward` is set on the trajectories,
    `reward` (the training rubric's mean score) is added too.
    """
    trajs = list(trajectories)
    if not trajs:
        raise ValueError("summarise: no trajectories; evaluate at least one question")
    values = [trajectory_values(t) for t in trajs]
    terms = [t.termination for t in trajs]
    out = _summarise_group(values, terms, n_resamples, seed, confidence)
    rewards = [t.reward for t in trajs if t.reward is not None]
    if len(rewards) == len(trajs):
        out["reward"] = float(np.mean(rewards))
        out[_ci_key(confidence)]["reward"] = list(bootstrap_ci(rewards, n_resamples, seed, confidence))
    groups: dict[str, list[int]] = {}
    for i, t in enumerate(trajs):
        groups.setdefault(_hops_key(t), []).append(i)
    out["by_hops"] = {
        key: _summarise_group(
            [values[i] for i in idx], [terms[i] for i in idx], n_resamples, seed, confidence
        )
        for key, idx in sorted(groups.items())
    }
    out["timing"] = _timing_group(values, n_resamples, seed, confidence)
    out["timing"]["by_hops"] = {
        key: _timing_group([values[i] for i in idx], n_resamples, seed, confidence)
        for key, idx in sorted(groups.items())
    }
    out["bootstrap"] = {"resamples": n_resamples, "seed": seed, "confidence": confidence}
    return out


def summarise_metrics(
    trajectories: Sequence[Trajectory],
    metrics: Mapping[str, Callable[[Trajectory], float]],
    totals: Collection[str] = (),
    by: Callable[[Trajectory], str] | None = None,
    n_resamples: int = DEFAULT_BOOTSTRAP,
    seed: int = 0,
    confidence: float = DEFAULT_CONFIDENCE,
) -> dict[str, Any]:
    """A task's own per-question figures with their intervals, beside `summarise` (which they leave as it is).

    Each of `metrics` maps one trajectory to a number. Its figure is the mean over questions or, for a name in
    `totals`, the sum over them (a count over the split, such as leaked observations), each with a seeded
    percentile-bootstrap interval that resamples questions (a sum's interval is n times its mean's). Keys: `n`,
    one float per metric, `ci95` (`{metric: [low, high]}`) and, with `by` (a trajectory's group, e.g. its question
    type), `by_group` with the same keys per group.
    """
    trajs = list(trajectories)
    if not trajs:
        raise ValueError("summarise_metrics: no trajectories; evaluate at least one question")
    columns = {name: [float(fn(t)) for t in trajs] for name, fn in metrics.items()}
    out = _metric_group(columns, set(totals), n_resamples, seed, confidence)
    if by is not None:
        groups: dict[str, list[int]] = {}
        for i, t in enumerate(trajs):
            groups.setdefault(str(by(t)), []).append(i)
        out["by_group"] = {
            key: _metric_group(
                {name: [col[i] for i in idx] for name, col in columns.items()},
                set(totals),
                n_resamples,
                seed,
                confidence,
            )
            for key, idx in sorted(groups.items())
        }
    return out


def _metric_group(
    columns: dict[str, list[float]], totals: set[str], n_resamples: int, seed: int, confidence: float
) -> dict[str, Any]:
    n = len(next(iter(columns.values()), []))
    out: dict[str, Any] = {"n": n}
    ci: dict[str, list[float]] = {}
    for name, column in columns.items():
        scale = float(n) if name in totals else 1.0
        out[name] = float(np.sum(column)) if name in totals else float(np.mean(column))
        ci[name] = [scale * v for v in bootstrap_ci(column, n_resamples, seed, confidence)]
    out[_ci_key(confidence)] = ci
    return out


def dev_metrics(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """The periodic dev evaluation's figures, the same for every trainer: `eval/exact_match`, `eval/f1`,
    `eval/searches_per_question` and, when every trajectory was scored (`evaluate_policy` with a rubric),
    `eval/reward` (the training reward). `summarise` is the full report with intervals; this is the
    per-step line."""
    if not trajs:
        return {}
    n = len(trajs)
    out = {
        "eval/exact_match": sum(exact_match(t.answer or "", t.golds) for t in trajs) / n,
        "eval/f1": sum(f1_score(t.answer or "", t.golds) for t in trajs) / n,
        "eval/searches_per_question": sum(len(t.tool_calls) for t in trajs) / n,
    }
    if all(t.reward is not None for t in trajs):
        out["eval/reward"] = sum(float(t.reward) for t in trajs) / n  # type: ignore[arg-type]
    return out


def _ci_key(confidence: float) -> str:
    return "ci95" if abs(confidence - 0.95) < 1e-12 else f"ci{confidence:g}"


def flat_metrics(summary: dict[str, Any], prefix: str = "eval/") -> dict[str, float]:
    """The headline numbers of a summary as a flat dict (`eval/exact_match`, `eval/f1`, ...)."""
    names = (*PER_QUESTION_METRICS, *RATIO_METRICS, "reward")
    out = {f"{prefix}{n}": float(summary[n]) for n in names if n in summary}
    for reason, share in summary.get("termination", {}).items():
        out[f"{prefix}termination/{reason}"] = float(share)
    for hops, group in summary.get("by_hops", {}).items():
        out[f"{prefix}hops{hops}/exact_match"] = float(group["exact_match"])
    return out
