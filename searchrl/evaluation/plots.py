"""The report's matplotlib plots: metrics over training steps as base64 PNGs for `report.html`.

Kept apart from the page (`report.py`) so the page's HTML and the plotting library meet in one call,
`build_plots(metrics, evals, xlabel)`; every x axis names the run's trainer ("PPO step", "GRPO step").
"""

from __future__ import annotations

import base64
import io
import math
from collections.abc import Sequence
from typing import Any

# Line plots: title -> (y label, [(metric key, legend label)]). Missing keys are skipped; a plot with no
# data is left out rather than drawn empty.
LINE_PLOTS: dict[str, tuple[str, tuple[tuple[str, str], ...]]] = {
    "Training reward": ("score", (("objective/scores", "total score"),)),
    # The reward-hacking signature in one picture: the proxy rising while the gold metric does not.
    "Training reward vs held-out EM": (
        "value",
        (("objective/scores", "training score"), ("eval/exact_match", "dev EM")),
    ),
    "Entropy per action token": ("nats", (("objective/entropy_per_token", "entropy / token"),)),
    "Searches per episode": ("tool calls", (("tools/calls_per_episode", "calls / episode"),)),
    "Answer length": ("words", (("answer/length_words", "answer words"),)),
}


def metric_series(metrics: Sequence[dict[str, Any]], key: str) -> tuple[list[float], list[float]]:
    """(steps, values) of `key` over the metric lines that hold a finite number for it."""
    xs, ys = [], []
    for i, m in enumerate(metrics):
        v = m.get(key)
        if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v):
            xs.append(float(m.get("step", i + 1)))
            ys.append(float(v))
    return xs, ys


def second_half_mean(metrics: Sequence[dict[str, Any]], key: str) -> float | None:
    """Mean of `key`'s finite values over the second half of the lines that log it (a run's settled figure,
    e.g. the critic's explained variance); None when none does."""
    _, values = metric_series(metrics, key)
    half = values[len(values) // 2 :]
    return sum(half) / len(half) if half else None


def _png(fig: Any) -> str:
    """The figure as a base64 PNG; the figure is closed either way (pyplot keeps every open figure)."""
    import matplotlib.pyplot as plt

    try:
        buf = io.BytesIO()
        fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
        return base64.b64encode(buf.getvalue()).decode("ascii")
    finally:
        plt.close(fig)


def _new_figure(xlabel: str = "step") -> tuple[Any, Any]:
    import matplotlib

    matplotlib.use("Agg")  # no display on a training box
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5.2, 3.0))
    ax.grid(alpha=0.3)
    ax.set_xlabel(xlabel)
    return fig, ax


def line_plot(
    metrics: Sequence[dict[str, Any]],
    title: str,
    ylabel: str,
    keys: Sequence[tuple[str, str]],
    xlabel: str = "step",
) -> str | None:
    """A base64 PNG of the given metric keys over steps, or None if none of them was logged."""
    drawn = [(label, *metric_series(metrics, key)) for key, label in keys]
    drawn = [d for d in drawn if d[1]]
    if not drawn:
        return None
    fig, ax = _new_figure(xlabel)
    for label, xs, ys in drawn:
        ax.plot(xs, ys, marker="o" if len(xs) < 30 else None, markersize=3, label=label)
    ax.set_title(title)
    ax.set_ylabel(ylabel)
    ax.legend(fontsize=7)
    return _png(fig)


def reward_components_plot(metrics: Sequence[dict[str, Any]], xlabel: str = "step") -> str | None:
    """The weighted reward components (`reward/<name>`, metrics-only terms left out) over steps."""
    keys = sorted(
        {k for m in metrics for k in m if k.startswith("reward/") and not k.startswith("reward/metric/")}
    )
    return line_plot(
        metrics,
        "Reward components",
        "weighted contribution",
        [(k, k[len("reward/") :]) for k in keys],
        xlabel=xlabel,
    )


def kl_plot(metrics: Sequence[dict[str, Any]], xlabel: str = "step") -> str | None:
    """KL to the reference (left axis) and the KL coefficient (right axis) over steps."""
    kx, ky = metric_series(metrics, "objective/kl")
    cx, cy = metric_series(metrics, "kl_coef")
    if not kx and not cx:
        return None
    fig, ax = _new_figure(xlabel)
    ax.plot(kx, ky, color="#0969da", label="KL (nats / trajectory)")
    ax.set_ylabel("KL", color="#0969da")
    ax2 = ax.twinx()
    ax2.plot(cx, cy, color="#cf222e", linestyle="--", label="kl_coef")
    ax2.set_ylabel("kl_coef", color="#cf222e")
    ax.set_title("KL to the reference and the KL coefficient")
    return _png(fig)


def heldout_plot(
    metrics: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]], xlabel: str = "step"
) -> str | None:
    """Dev EM logged during training plus every eval JSON with a step (test split points with CI bars)."""
    dx, dy = metric_series(metrics, "eval/exact_match")
    points: dict[str, list[tuple[float, float, float, float]]] = {}
    for e in evals:
        if e.get("step") is None or "exact_match" not in e:
            continue
        lo, hi = (e.get("ci95") or {}).get("exact_match", [e["exact_match"], e["exact_match"]])
        points.setdefault(str(e.get("split", "eval")), []).append(
            (float(e["step"]), e["exact_match"], lo, hi)
        )
    if not dx and not points:
        return None
    fig, ax = _new_figure(xlabel)
    if dx:
        ax.plot(dx, dy, marker="o", markersize=3, label="dev EM (training log)")
    for split, pts in sorted(points.items()):
        pts.sort()
        xs = [p[0] for p in pts]
        ys = [p[1] for p in pts]
        err = [[p[1] - p[2] for p in pts], [p[3] - p[1] for p in pts]]
        ax.errorbar(xs, ys, yerr=err, marker="s", capsize=3, label=f"{split} EM (95% CI)")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title("Held-out exact match")
    ax.set_ylabel("exact match")
    ax.legend(fontsize=7)
    return _png(fig)


def build_plots(
    metrics: Sequence[dict[str, Any]], evals: Sequence[dict[str, Any]], xlabel: str = "step"
) -> list[tuple[str, str]]:
    """(title, base64 PNG) of every plot that has data, in reading order; `xlabel` names the x axis
    ("PPO step", "GRPO step": the run's trainer)."""

    def line(title: str) -> tuple[str, str | None]:
        ylabel, keys = LINE_PLOTS[title]
        return title, line_plot(metrics, title, ylabel, keys, xlabel=xlabel)

    made: list[tuple[str, str | None]] = [
        line("Training reward"),
        ("Reward components", reward_components_plot(metrics, xlabel)),
        ("Held-out exact match", heldout_plot(metrics, evals, xlabel)),
        line("Training reward vs held-out EM"),
        ("KL and KL coefficient", kl_plot(metrics, xlabel)),
        line("Entropy per action token"),
        line("Searches per episode"),
        line("Answer length"),
    ]
    return [(t, png) for t, png in made if png]
