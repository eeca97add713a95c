"""Trainers side by side in `report.html`: dev exact match against training seconds and against episodes.

Each run's `eval/step-N.json` (dev exact match, `episode`, `time/train_s`) becomes a `TrainerCurve`, drawn
as inline SVG, one line per trainer, with the plotted values in `data-*` attributes so a test or a person
can read them back without decoding an image, plus a table of final EM, wall-clock, episodes and seconds
per step. Used by `searchrl report --compare` and `benchmarks/compare_trainers.py`.
"""

from __future__ import annotations

import html
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from searchrl.evaluation.tables import finite_number, html_table
from searchrl.run.errors import RunTargetError
from searchrl.run.reader import RunReader
from searchrl.run.writer import step_of

COMPARE_COLORS = ("#0969da", "#cf222e", "#1a7f37", "#8250df", "#9a6700", "#57606a")


@dataclass
class TrainerCurve:
    """One trainer's held-out curve: per evaluation step, dev exact match, episodes and training seconds.

    `train_s` is `time/train_s` (wall-clock minus evaluation time); `episodes` / `train_s` entries are
    None where a run did not record them (neither in the eval file nor in that step's metrics line).
    """

    label: str
    run_dir: Path
    steps: list[int] = field(default_factory=list)
    exact_match: list[float] = field(default_factory=list)
    episodes: list[float | None] = field(default_factory=list)
    train_s: list[float | None] = field(default_factory=list)
    test: dict[str, Any] | None = None

    @property
    def final_exact_match(self) -> float:
        return self.exact_match[-1]

    @property
    def final_step(self) -> int:
        return self.steps[-1]

    @property
    def final_train_s(self) -> float | None:
        return self.train_s[-1]

    @property
    def final_episodes(self) -> float | None:
        return self.episodes[-1]

    @property
    def seconds_per_step(self) -> float | None:
        """Training seconds per optimizer step at the last evaluation (None without a clock or a step)."""
        if self.final_train_s is None or self.final_step <= 0:
            return None
        return self.final_train_s / self.final_step


def read_trainer_curve(label: str, run_dir: str | Path) -> TrainerCurve:
    """`RUN/eval/step-N.json` of one run as a `TrainerCurve` (sorted by step).

    `episode` and `time/train_s` come from the eval file, or else from the run's metrics line of the same
    step (both read through `RunReader`). A test-split summary in `RUN/eval/` (a JSON with `split: test`
    and `exact_match`, as `benchmarks/compare_trainers.py` writes) is kept as `.test`. Raises FileNotFoundError / ValueError
    naming the run when there is nothing to draw.
    """
    run_dir = Path(run_dir)
    if not run_dir.is_dir():
        raise FileNotFoundError(f"{label}={run_dir}: run directory not found")
    try:
        reader = RunReader(run_dir)
    except RunTargetError as e:
        raise ValueError(
            f"{label}={run_dir}: not a run directory, so no eval/step-N.json with eval/exact_match to draw ({e})"
        ) from None
    by_step: dict[int, dict[str, Any]] = {}
    test: dict[str, Any] | None = None
    for e in reader.eval_files(demo=False):
        if e.is_step_file and finite_number(e.data.get("eval/exact_match")) is not None:
            by_step[step_of(e.name) or 0] = e.data
        elif e.data.get("split") == "test" and "exact_match" in e.data:
            test = e.data
    if not by_step:
        raise ValueError(
            f"{label}={run_dir}: no eval/step-N.json with eval/exact_match; train with eval_steps > 0 "
            "(and eval_on_start for step 0) so the run records its held-out curve"
        )
    logged: dict[int, dict[str, Any]] = {}
    for line in reader.metrics():
        if isinstance(line.get("step"), int):
            logged.setdefault(line["step"], {}).update(line)
    curve = TrainerCurve(label, run_dir, test=test)
    for step in sorted(by_step):
        data, line = by_step[step], logged.get(step, {})
        curve.steps.append(step)
        curve.exact_match.append(float(data["eval/exact_match"]))
        for attr, key in (("episodes", "episode"), ("train_s", "time/train_s")):
            value = finite_number(data.get(key))
            getattr(curve, attr).append(value if value is not None else finite_number(line.get(key)))
    return curve


def _nice_ticks(lo: float, hi: float, n: int = 5) -> list[float]:
    """About `n` round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(1, n)
    magnitude = 10 ** math.floor(math.log10(raw))
    step = next(m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    return ticks


def _tick_label(v: float) -> str:
    return f"{v:g}" if abs(v) < 1e5 else f"{v:.2g}"


def comparison_svg(curves: Sequence[TrainerCurve], x: str, title: str, xlabel: str) -> str:
    """An inline SVG line plot of dev EM against `x` ("train_s" or "episodes"), one line per trainer.

    Each line is a `<polyline class="curve" data-label=... data-x=... data-y=...>` whose data attributes
    hold the plotted values (comma-separated), so the page can be checked without decoding an image.
    Points without an x value are skipped; a trainer with none is named in the caption instead.
    """
    width, height, left, right, top, bottom = 540, 320, 56, 16, 30, 46
    series, missing = [], []
    for i, c in enumerate(curves):
        pts = [(xv, y) for xv, y in zip(getattr(c, x), c.exact_match, strict=True) if xv is not None]
        if pts:
            series.append((c.label, COMPARE_COLORS[i % len(COMPARE_COLORS)], pts))
        else:
            missing.append(c.label)
    xs = [p[0] for _, _, pts in series for p in pts] or [0.0, 1.0]
    xticks = _nice_ticks(min(0.0, min(xs)), max(xs))
    x0, x1 = xticks[0], xticks[-1] if xticks[-1] > xticks[0] else xticks[0] + 1.0
    yticks = [0.0, 0.2, 0.4, 0.6, 0.8, 1.0]
    pw, ph = width - left - right, height - top - bottom

    def px(v: float) -> float:
        return left + (v - x0) / (x1 - x0) * pw

    def py(v: float) -> float:
        return top + (1.0 - v) * ph

    out = [
        f'<svg class="compare" data-x="{html.escape(x)}" width="{width}" '
        f'height="{height}" viewBox="0 0 {width} {height}" role="img" aria-label="{html.escape(title)}">',
        f'<text x="{width / 2:.0f}" y="18" text-anchor="middle" font-size="13" font-weight="bold">'
        f"{html.escape(title)}</text>",
    ]
    for t in yticks:
        out.append(
            f'<line x1="{left}" x2="{left + pw}" y1="{py(t):.1f}" y2="{py(t):.1f}" stroke="#eee"/>'
            f'<text x="{left - 6}" y="{py(t) + 4:.1f}" text-anchor="end" font-size="10">{t:.1f}</text>'
        )
    for t in xticks:
        out.append(
            f'<line x1="{px(t):.1f}" x2="{px(t):.1f}" y1="{top}" y2="{top + ph}" stroke="#eee"/>'
            f'<text x="{px(t):.1f}" y="{top + ph + 14}" text-anchor="middle" font-size="10">'
            f"{_tick_label(t)}</text>"
        )
    out.append(f'<rect x="{left}" y="{top}" width="{pw}" height="{ph}" fill="none" stroke="#999"/>')
    out.append(
        f'<text x="{left + pw / 2:.0f}" y="{height - 8}" text-anchor="middle" font-size="11">'
        f"{html.escape(xlabel)}</text>"
        f'<text x="14" y="{top + ph / 2:.0f}" text-anchor="middle" font-size="11" '
        f'transform="rotate(-90 14 {top + ph / 2:.0f})">dev exact match</text>'
    )
    for k, (label, color, pts) in enumerate(series):
        coords = " ".join(f"{px(a):.1f},{py(b):.1f}" for a, b in pts)
        data_x = ",".join(f"{a:.6g}" for a, _ in pts)
        data_y = ",".join(f"{b:.6g}" for _, b in pts)
        out.append(
            f'<polyline class="curve" data-label="{html.escape(label)}" data-x="{data_x}" data-y="{data_y}" '
            f'points="{coords}" fill="none" stroke="{color}" stroke-width="2"><title>{html.escape(label)}'
            "</title></polyline>"
        )
        out += [f'<circle cx="{px(a):.1f}" cy="{py(b):.1f}" r="2.5" fill="{color}"/>' for a, b in pts]
        ly = top + 12 + 14 * k
        out.append(
            f'<line x1="{left + 8}" x2="{left + 26}" y1="{ly - 4}" y2="{ly - 4}" stroke="{color}" '
            f'stroke-width="2"/><text x="{left + 30}" y="{ly}" font-size="10">{html.escape(label)}</text>'
        )
    out.append("</svg>")
    caption = ""
    if missing:
        caption = (
            f"<figcaption class='meta'>Not drawn (no {html.escape(xlabel)} recorded): "
            f"{html.escape(', '.join(missing))}</figcaption>"
        )
    return f"<figure>{''.join(out)}{caption}</figure>"


def trainer_table(curves: Sequence[TrainerCurve]) -> str:
    """Final dev EM (and test EM when recorded), training wall-clock, episodes, steps, seconds per step."""
    with_test = any(c.test is not None for c in curves)
    rows = []
    for c in curves:
        cells = [
            html.escape(c.label),
            f"{c.final_exact_match:.3f} (step {c.final_step})",
        ]
        if with_test:
            t = c.test or {}
            ci = (t.get("ci95") or {}).get("exact_match")
            em = finite_number(t.get("exact_match"))
            cells.append(
                "n/a" if em is None else f"{em:.3f}" + (f" [{ci[0]:.3f}, {ci[1]:.3f}]" if ci else "")
            )
        cells += [
            "n/a" if c.final_train_s is None else f"{c.final_train_s:.1f}",
            "n/a" if c.final_episodes is None else f"{c.final_episodes:.0f}",
            str(c.final_step),
            "n/a" if c.seconds_per_step is None else f"{c.seconds_per_step:.2f}",
        ]
        rows.append(cells)
    header = ["trainer", "final dev EM"]
    if with_test:
        header.append("test EM [95% CI]")
    header += ["training wall-clock (s)", "episodes", "steps", "seconds / step"]
    return html_table(header, rows, "trainers")


def comparison_section(compare: Mapping[str, str | Path]) -> str:
    """The "trainers side by side" section: the table and two SVG plots (wall-clock, episodes)."""
    curves = [read_trainer_curve(label, path) for label, path in compare.items()]
    plots = [
        comparison_svg(curves, "train_s", "Held-out EM against training wall-clock", "training seconds"),
        comparison_svg(curves, "episodes", "Held-out EM against episodes", "episodes"),
    ]
    return "".join(
        [
            "<h2>Trainers side by side</h2>",
            "<p class='meta'>Dev-split exact match from each run's eval/step-N.json, against training "
            "wall-clock (time/train_s: evaluation time excluded) and against episodes.</p>",
            trainer_table(curves),
            f"<div class='plots'>{''.join(plots)}</div>",
        ]
    )
