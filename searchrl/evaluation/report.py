"""`report.html`: one self-contained page a person reads to judge a run.

What: plots over steps (reward and its components, held-out exact match, KL and the KL coefficient,
entropy, searches per episode, answer length) as inline base64 PNGs from matplotlib; the summary
tables (a demo's summary, every eval JSON with its confidence intervals, the audit's verdicts); and a
few full trajectories rendered span by span, action tokens (what the policy sampled, which PPO trains
on) coloured differently from observation tokens (what search returned, masked out of the loss).

Trainers side by side (`compare={"PPO": dir, "GRPO (TRL loop)": dir, ...}`): each run's
`eval/step-N.json` (dev exact match, `episode`, `time/train_s`) drawn as one line per trainer against
training wall-clock seconds and against episodes, as inline SVG (the points are in the page, so a test or
a person can read them back), plus a table of final EM, wall-clock, episodes and seconds per step.

At a glance (the top of the page): next to exact match, the figures a reader should not have to dig
for: the hidden-test evaluations' citation support and fabricated-citation rate (from the demo summary and
the audit of each evaluation's trajectories), the dev exact match, `rollout/logprob_max_abs_diff` (max
over the run and at the last step: the rollout engine's logprobs against the trainer's forward pass) and
`objective/kl` (mean and last).

What it reads (`searchrl.common.run.RunReader`): a run directory (PPO or GRPO; x axes say "PPO step" or
"GRPO step", and GRPO's TRL names `reward`, `kl`, `entropy` stand in for PPO's), or a demo directory: its
PPO run, `summary.json`, the hidden-test evaluations in `DEMO/eval/` and, after `--compare-grpo`, the
trainers side by side. A PPO run that is a demo's `ppo/` gets the demo's evaluations too.

Benchmarks (`searchrl eval --benchmarks`, `searchrl.evaluation.benchmarks`): every suite eval JSON as
Search-R1's Table 3, one column per QA set and the unweighted average, exact match with its CI, then F1 and
searches per question, with the paper's rows beside them for reference.

Where: this module reads the run and assembles the page; the matplotlib plots are `plots.py`, the
trainers-side-by-side section (curves, SVG, table) is `compare.py`, the HTML table helpers `tables.py`.

Why self-contained: a report is mailed, attached to an issue or opened from a cluster's scratch disk;
inline CSS and images mean nothing has to be fetched and nothing breaks when the run folder moves.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_text
from searchrl.common.run import DEMO_RUNS, STAGE_LABELS, EvalFile, RunReader, RunTargetError
from searchrl.common.trajectory import Trajectory, read_trajectories
from searchrl.data.benchmarks import BENCHMARKS, SEARCH_R1_PAPER_EM
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.evaluation.audit import AuditReport, audit_run
from searchrl.evaluation.compare import comparison_section
from searchrl.evaluation.plots import build_plots, metric_series
from searchrl.evaluation.tables import finite_number, fmt_cell, html_table

# TRL's GRPO logs under its own names; the plots and the headline read PPO's, so a GRPO line gets both.
GRPO_METRIC_ALIASES: dict[str, str] = {
    "objective/scores": "reward",
    "objective/kl": "kl",
    "objective/entropy_per_token": "entropy",
}


def normalise_metrics(metrics: Sequence[dict[str, Any]], trainer: str | None) -> list[dict[str, Any]]:
    """The metrics lines with PPO's names filled in from GRPO's (`GRPO_METRIC_ALIASES`) for a GRPO run."""
    if trainer != "grpo":
        return list(metrics)
    out = []
    for line in metrics:
        line = dict(line)
        for ppo_name, grpo_name in GRPO_METRIC_ALIASES.items():
            if ppo_name not in line and grpo_name in line:
                line[ppo_name] = line[grpo_name]
        out.append(line)
    return out


CSS = """
body { font-family: -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2em auto; max-width: 1100px;
       color: #222; line-height: 1.4; }
h1 { font-size: 1.6em; } h2 { border-bottom: 1px solid #ddd; padding-bottom: .2em; margin-top: 2em; }
table { border-collapse: collapse; margin: .5em 0 1.5em; font-size: .9em; }
th, td { border: 1px solid #ddd; padding: .25em .6em; text-align: right; }
th:first-child, td:first-child { text-align: left; }
th { background: #f4f4f4; }
.plots { display: grid; grid-template-columns: 1fr 1fr; gap: 1em; }
.plots figure { margin: 0; } .plots img { width: 100%; border: 1px solid #eee; }
.plots svg.compare { width: 100%; height: auto; border: 1px solid #eee; }
.verdict-pass { color: #1a7f37; font-weight: bold; } .verdict-warn { color: #9a6700; font-weight: bold; }
.verdict-fail { color: #cf222e; font-weight: bold; } .verdict-skipped { color: #888; }
.traj { border: 1px solid #ccc; border-radius: 6px; padding: .8em; margin: 1em 0; }
.tokens { white-space: pre-wrap; font-family: Menlo, Consolas, monospace; font-size: .8em;
          line-height: 1.5; }
.span { border-radius: 3px; padding: 0 1px; }
.span.prompt { background: #f0f0f0; color: #555; }
.span.action { background: #d6ecff; color: #003a70; border-bottom: 2px solid #0969da; }
.span.observation { background: #fff1c7; color: #5c4400; }
.span.glue { background: #eee; color: #999; }
.legend span { margin-right: 1em; }
table.audit td:nth-child(4), table.audit td:nth-child(6) { text-align: left; }
details.prompt summary { cursor: pointer; color: #555; }
.meta { color: #555; font-size: .85em; }
"""


# -- tables -----------------------------------------------------------------------------------------

EVAL_ROWS = (
    *HEADLINE_METRICS,
    "action_tokens_per_question",
    "reward",
)


def eval_table(e: dict[str, Any]) -> str:
    """One eval JSON: metric, overall mean [95% CI], and the mean per hop count."""
    hops = sorted(e.get("by_hops", {}))
    rows = []
    for name in EVAL_ROWS:
        if name not in e:
            continue
        lo, hi = (e.get("ci95") or {}).get(name, [float("nan"), float("nan")])
        cells = [html.escape(name), f"{fmt_cell(e[name])} [{fmt_cell(lo)}, {fmt_cell(hi)}]"]
        cells += [fmt_cell(e["by_hops"][h].get(name, "")) for h in hops]
        rows.append(cells)
    shares = e.get("termination", {})
    rows.append(
        ["termination", html.escape(", ".join(f"{k} {v:.2f}" for k, v in shares.items() if v))]
        + [""] * len(hops)
    )
    header = ["metric", f"all (n={e.get('n', '?')}) [95% CI]"] + [
        f"{h}-hop (n={e['by_hops'][h].get('n')})" for h in hops
    ]
    return html_table(header, rows)


def _flatten(prefix: str, value: Any, out: list[tuple[str, Any]]) -> None:
    if isinstance(value, dict):
        for k, v in value.items():
            _flatten(f"{prefix}.{k}" if prefix else str(k), v, out)
    elif not isinstance(value, list):
        out.append((prefix, value))


def summary_table(summary: dict[str, Any]) -> str:
    """A demo summary (nested dict) as key / value rows; CI lists and per-hop details are left to the eval tables."""
    flat: list[tuple[str, Any]] = []
    _flatten("", summary, flat)
    skip = (".by_hops.", ".timing.", ".termination.", ".ci95.")
    keep = [(k, v) for k, v in flat if not any(part in f".{k}." for part in skip)]
    return html_table(["key", "value"], [[html.escape(k), fmt_cell(v)] for k, v in keep])


def _stages_with_test_metrics(summary: dict[str, Any]) -> list[str]:
    """Top-level keys (e.g. "sft", "ppo") whose value holds a `test` summary with an exact match."""
    return [
        k
        for k, v in summary.items()
        if isinstance(v, dict) and isinstance(v.get("test"), dict) and "exact_match" in v["test"]
    ]


def comparison_table(summary: dict[str, Any]) -> str | None:
    """Held-out metrics of each stage side by side (SFT warm start vs PPO) with the change, or None."""
    stages = _stages_with_test_metrics(summary)
    if not stages:
        return None
    rows = []
    for name in EVAL_ROWS:
        values = [summary[s]["test"].get(name) for s in stages]
        if all(v is None for v in values):
            continue
        cells = [html.escape(name)]
        for s, v in zip(stages, values, strict=True):
            ci = (summary[s]["test"].get("ci95") or {}).get(name)
            interval = f" [{fmt_cell(ci[0])}, {fmt_cell(ci[1])}]" if ci else ""
            cells.append("" if v is None else fmt_cell(float(v)) + interval)
        first, last = values[0], values[-1]
        changed = len(stages) > 1 and first is not None and last is not None
        rows.append([*cells, f"{last - first:+.3f}" if changed else ""])
    change = f"{stages[-1]} − {stages[0]}" if len(stages) > 1 else ""
    return html_table(["test metric", *[f"{s} [95% CI]" for s in stages], change], rows)


def audit_table(report: AuditReport) -> str:
    rows = []
    for c in report.checks:
        value = "" if c.value is None else fmt_cell(float(c.value))
        evidence = html.escape(", ".join(c.evidence[:8]) + (" ..." if len(c.evidence) > 8 else ""))
        rows.append(
            [
                html.escape(c.name),
                f'<span class="verdict-{c.verdict}">{c.verdict}</span>',
                value,
                html.escape(c.threshold),
                f"{c.num_flagged}/{c.num_checked}",
                evidence,
            ]
        )
    return html_table(
        ["check", "verdict", "value", "threshold", "flagged", "evidence (trajectory ids)"], rows, "audit"
    )


# -- at a glance: the figures next to exact match -----------------------------------------------------


def _numbers(metrics: Sequence[dict[str, Any]], key: str) -> list[tuple[int, float]]:
    xs, ys = metric_series(metrics, key)
    return [(int(x), y) for x, y in zip(xs, ys, strict=True)]


@dataclass
class HeldOutRow:
    """One hidden-test (or held-out) evaluation in the at-a-glance table."""

    label: str
    exact_match: float | None
    ci: list[float] | None
    citation_support: float | None
    fabricated_rate: float | None
    fabricated: str
    n: Any


def _fabricated(audit: AuditReport | None) -> tuple[float | None, str]:
    """The audit's fabricated-citation rate and its counts ("2/10 cited answers, 3 of 14 citations")."""
    if audit is None:
        return None, "no trajectories audited"
    check = audit.check("fabricated_citations")
    if check.verdict == "skipped":
        return None, "no answer cited a document"
    detail = f"{check.num_flagged}/{check.num_checked} cited answers"
    if "citations" in check.details:
        detail += (
            f", {check.details.get('fabricated_citations', 0)} of {check.details['citations']} citations"
        )
    return check.value, detail


def held_out_rows(
    summary: dict[str, Any] | None,
    evals: Sequence[EvalFile],
    eval_audits: Mapping[Path, AuditReport],
) -> list[HeldOutRow]:
    """The demo summary's stages with a `test` summary (SFT, PPO, ...), then every other test-split eval
    JSON: exact match [CI], citation support, fabricated-citation rate (the audit of its trajectories)."""
    rows: list[HeldOutRow] = []
    covered: set[Path] = set()
    for stage in _stages_with_test_metrics(summary or {}):
        test = summary[stage]["test"]  # type: ignore[index]
        match = next((e for e in evals if e.stage == stage and e.variant is None and e.split == "test"), None)
        audit = eval_audits.get(match.trajectories) if match is not None and match.trajectories else None
        if match is not None:
            covered.add(match.path)
        rate, detail = _fabricated(audit)
        label = STAGE_LABELS.get(stage) or f"{DEMO_RUNS.get(stage, stage)} policy"
        rows.append(
            HeldOutRow(
                f"{label} ({stage}.test)",
                finite_number(test.get("exact_match")),
                (test.get("ci95") or {}).get("exact_match"),
                finite_number(test.get("citation_support")),
                rate,
                detail,
                test.get("n", (match.data.get("n") if match is not None else None) or ""),
            )
        )
    for e in evals:
        if e.path in covered or e.split != "test" or "exact_match" not in e.data:
            continue
        audit = eval_audits.get(e.trajectories) if e.trajectories else None
        rate, detail = _fabricated(audit)
        rows.append(
            HeldOutRow(
                f"{e.label} ({e.name})",
                finite_number(e.data.get("exact_match")),
                (e.data.get("ci95") or {}).get("exact_match"),
                finite_number(e.data.get("citation_support")),
                rate,
                detail,
                e.data.get("n", ""),
            )
        )
    return rows


def held_out_table(rows: Sequence[HeldOutRow]) -> str:
    cells = []
    for r in rows:
        ci = f" [{fmt_cell(r.ci[0])}, {fmt_cell(r.ci[1])}]" if r.ci else ""
        cells.append(
            [
                html.escape(r.label),
                "n/a" if r.exact_match is None else fmt_cell(r.exact_match) + ci,
                "n/a" if r.citation_support is None else fmt_cell(r.citation_support),
                ("n/a" if r.fabricated_rate is None else fmt_cell(r.fabricated_rate))
                + f" <span class='meta'>({html.escape(r.fabricated)})</span>",
                fmt_cell(r.n),
            ]
        )
    return html_table(
        ["held-out evaluation", "exact match [95% CI]", "citation support", "fabricated-citation rate", "n"],
        cells,
        "glance-heldout",
    )


def training_glance_rows(metrics: Sequence[dict[str, Any]], trainer_label: str) -> list[list[str]]:
    """Dev EM (last), `rollout/logprob_max_abs_diff` (max over the run, last) and `objective/kl` (mean, last)."""
    missing = f"not logged ({trainer_label} run)"
    rows: list[list[str]] = []
    em = _numbers(metrics, "eval/exact_match")
    rows.append(
        ["dev exact match (eval/exact_match)"]
        + (
            [f"{em[-1][1]:.3f} at step {em[-1][0]}", f"best {max(v for _, v in em):.3f}"]
            if em
            else [missing, ""]
        )
    )
    gap = _numbers(metrics, "rollout/logprob_max_abs_diff")
    if gap:
        worst = max(gap, key=lambda p: p[1])
        rows.append(
            [
                "rollout/logprob_max_abs_diff",
                f"max {worst[1]:.3g} (step {worst[0]})",
                f"last {gap[-1][1]:.3g} (step {gap[-1][0]})",
            ]
        )
    else:
        rows.append(["rollout/logprob_max_abs_diff", missing, ""])
    kl = _numbers(metrics, "objective/kl")
    if kl:
        mean = sum(v for _, v in kl) / len(kl)
        rows.append(
            [
                "objective/kl",
                f"mean {mean:.4g} over {len(kl)} steps",
                f"last {kl[-1][1]:.4g} (step {kl[-1][0]})",
            ]
        )
    else:
        rows.append(["objective/kl", missing, ""])
    return rows


def glance_section(
    metrics: Sequence[dict[str, Any]],
    trainer_label: str,
    summary: dict[str, Any] | None,
    evals: Sequence[EvalFile],
    eval_audits: Mapping[Path, AuditReport],
) -> str:
    """The "At a glance" section: held-out results with their citation figures, and training diagnostics."""
    parts = ["<h2>At a glance</h2>"]
    rows = held_out_rows(summary, evals, eval_audits)
    if rows:
        parts.append(held_out_table(rows))
        parts.append(
            "<p class='meta'>Citation support: answers whose cited, retrieved document contains the answer. "
            "Fabricated-citation rate: answers citing a document id the episode never retrieved, among the "
            "answers that cite (the audit's <code>fabricated_citations</code> check on the evaluation's "
            "trajectories).</p>"
        )
    body = training_glance_rows(metrics, trainer_label)
    parts.append(
        html_table(
            [f"{trainer_label} training", "value", ""],
            [[html.escape(c) for c in r] for r in body],
            "glance-training",
        )
    )
    return "".join(parts)


# -- benchmark suites (Search-R1's Table 3 layout) ----------------------------------------------------


def _suite_cell(result: dict[str, Any] | None, metric: str, with_ci: bool) -> str:
    if result is None or metric not in result:
        return ""
    cell = fmt_cell(float(result[metric]))
    ci = (result.get("ci95") or {}).get(metric)
    if with_ci and ci:
        cell += f" <span class='meta'>[{fmt_cell(float(ci[0]))}, {fmt_cell(float(ci[1]))}]</span>"
    return cell


def benchmarks_section(evals: Sequence[EvalFile]) -> str | None:
    """Every benchmark-suite eval JSON (`searchrl eval --benchmarks`) as Search-R1's Table 3: a column per set
    (dagger: trained on) and the unweighted average, exact match with its 95% CI; then F1 and searches per
    question; then the paper's rows for reference. None when the run has no suite evaluation."""
    from searchrl.evaluation.benchmarks import is_suite  # the suite evaluation imports torch

    suites = [e for e in evals if is_suite(e.data)]
    if not suites:
        return None
    present = {name for e in suites for name in e.data["benchmarks"]}
    columns = [b for b in BENCHMARKS if b.name in present]
    header = ["model · checkpoint"] + [f"{b.label}{'†' if b.in_domain else ''}" for b in columns] + ["Avg"]

    def rows(metric: str, with_ci: bool) -> list[list[str]]:
        out = []
        for e in suites:
            sets = e.data["benchmarks"]
            cells = [_suite_cell(sets.get(b.name), metric, with_ci) for b in columns]
            out.append(
                [html.escape(f"{e.data.get('checkpoint', e.stem)} ({e.name})"), *cells]
                + [_suite_cell(e.data.get("average"), metric, with_ci)]
            )
        return out

    em_rows = rows("exact_match", True)
    all_seven = len(columns) == len(BENCHMARKS)
    for label, values, avg in SEARCH_R1_PAPER_EM:
        by_name = dict(zip((b.name for b in BENCHMARKS), values, strict=True))
        em_rows.append(
            [f"<span class='meta'>{html.escape(label)} (paper)</span>"]
            + [f"<span class='meta'>{by_name[b.name]:.3f}</span>" for b in columns]
            + [f"<span class='meta'>{avg:.3f}</span>" if all_seven else "<span class='meta'>n/a</span>"]
        )
    notes = []
    for e in suites:
        sets = e.data["benchmarks"]
        where = ", ".join(
            f"{r['label']} {r['split']} n={r['n']}"
            + ("" if r.get("matches_search_r1_split") else " (not the paper's split)")
            for r in sets.values()
        )
        limit = e.data.get("limit_per_set")
        cut = f" First {limit} questions per set, not the full sets." if limit else ""
        search = e.data.get("index") or e.data.get("corpus") or "?"
        notes.append(
            f"<li>{html.escape(e.name)}: {html.escape(where)}. Search: {html.escape(str(search))}; top-k "
            f"{html.escape(str((e.data.get('env_config') or {}).get('topk', '?')))}. Questions "
            f"{html.escape(str(e.data.get('question_rule', '')))}.{html.escape(cut)}</li>"
        )
    return "".join(
        [
            "<h2>Benchmarks (Search-R1's Table 3 layout)</h2>",
            "<p class='meta'>Exact match with SQuAD's answer normalisation, greedy decoding; Avg is the unweighted "
            "mean over the sets, its 95% CI a bootstrap resampling each set within itself. † = trained on "
            "(NQ, HotpotQA). The paper's rows (arXiv 2503.09516 v5) compare only within the same setup: "
            "wiki-18, e5 top-3, trained on NQ + HotpotQA.</p>",
            "<h3>Exact match [95% CI]</h3>",
            html_table(header, em_rows, "benchmarks-em"),
            "<h3>F1</h3>",
            html_table(header, rows("f1", False), "benchmarks-f1"),
            "<h3>Searches per question</h3>",
            html_table(header, rows("searches_per_question", False), "benchmarks-searches"),
            f"<ul class='meta'>{''.join(notes)}</ul>",
        ]
    )


# -- trajectories -------------------------------------------------------------------------------------


def _span_text(traj: Trajectory, start: int, end: int, fallback: str, tokenizer: Any) -> str:
    if tokenizer is not None:
        return tokenizer.decode(
            traj.input_ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    return fallback


def _prompt_fallback(traj: Trajectory) -> str:
    return "\n".join(f"[{m.get('role')}] {m.get('content', '')}" for m in traj.messages[:2])


def render_trajectory(traj: Trajectory, tokenizer: Any = None) -> str:
    """One trajectory as HTML: every span decoded on its own, coloured by kind; gaps shown as glue."""
    pieces, cursor = [], 0
    for span in sorted(traj.spans, key=lambda s: s.start):
        if span.start > cursor:
            text = _span_text(traj, cursor, span.start, "", tokenizer)
            pieces.append(f'<span class="span glue" title="glue">{html.escape(text)}</span>')
        fallback = span.text or (_prompt_fallback(traj) if span.kind == "prompt" else "")
        text = _span_text(traj, span.start, span.end, fallback, tokenizer)
        n = span.end - span.start
        kind = span.kind if span.kind in ("prompt", "action", "observation", "glue") else "glue"
        title = f"{span.kind}: tokens {span.start}-{span.end} ({n})"
        if span.kind == "action" and traj.logprobs:
            lps = traj.logprobs[span.start : span.end]
            title += f", mean logprob {sum(lps) / max(1, len(lps)):.2f}"
        piece = f'<span class="span {kind}" title="{html.escape(title)}">{html.escape(text)}</span>'
        if kind == "prompt":  # long (system prompt + tool schemas) and the same in every episode: folded
            piece = f"<details class='prompt'><summary>prompt · {n} tokens</summary>{piece}</details>"
        pieces.append(piece)
        cursor = max(cursor, span.end)
    reward = "" if traj.reward is None else f"{traj.reward:.3f}"
    breakdown = ", ".join(
        f"{k} {v:.3f}" for k, v in traj.reward_breakdown.items() if not k.startswith("metric/")
    )
    meta = (
        f"<div class='meta'><b>{html.escape(traj.id)}</b> · question: {html.escape(traj.question)} · golds: "
        f"{html.escape(' | '.join(traj.golds))} · answer: <b>{html.escape(str(traj.answer))}</b> · "
        f"termination: {html.escape(traj.termination)} · searches: {len(traj.tool_calls)} · reward: {reward}"
        f"{' (' + html.escape(breakdown) + ')' if breakdown else ''} · action tokens: {traj.num_action_tokens}"
        f" of {len(traj.input_ids)}</div>"
    )
    return f"<div class='traj'>{meta}<div class='tokens'>{''.join(pieces)}</div></div>"


def pick_trajectories(trajs: Sequence[Trajectory], n: int) -> list[Trajectory]:
    """A few telling trajectories: the best- and worst-rewarded, then ones that searched, in order."""
    if n <= 0 or not trajs:
        return []
    scored = sorted(trajs, key=lambda t: t.reward if t.reward is not None else 0.0, reverse=True)
    chosen: list[Trajectory] = []
    for t in [scored[0], scored[-1], *[t for t in trajs if t.tool_calls], *trajs]:
        if t not in chosen:
            chosen.append(t)
        if len(chosen) >= n:
            break
    return chosen


# -- the page -----------------------------------------------------------------------------------------


def _latest_trajectories(reader: RunReader) -> list[Trajectory]:
    """The last training step's trajectories, else the first evaluation's (what the page renders)."""
    sources = reader.trajectory_sources()
    for source in [s for s in sources if s.id == "train"] + [s for s in sources if s.kind == "evaluation"]:
        files = source.files()
        if files:
            return read_trajectories(files[-1])
    return []


def _tokenizer_of(reader: RunReader) -> Any:
    """The run's tokenizer (`RunReader.tokenizer_dir`) to decode spans; None if it cannot be loaded."""
    folder = reader.tokenizer_dir()
    if folder is None or not (folder / "tokenizer_config.json").exists():
        return None
    try:
        from searchrl.models.tiny import load_tokenizer  # transformers: only when spans are decoded

        return load_tokenizer(folder)
    except (OSError, ValueError):
        return None


def _eval_audits(reader: RunReader, audit: AuditReport | None) -> dict[Path, AuditReport]:
    """Each evaluation's audit by its trajectories file (the audit keys them by trajectory source id)."""
    if audit is None:
        return {}
    out: dict[Path, AuditReport] = {}
    for source in reader.trajectory_sources():
        if source.kind == "evaluation" and source.id in audit.evaluations and source.paths:
            out[source.paths[0]] = audit.evaluations[source.id]
    return out


def write_report(
    run_dir: str | Path,
    out: str | Path | None = None,
    summary: dict[str, Any] | None = None,
    audit: AuditReport | None = None,
    trajectories: Sequence[Trajectory] | None = None,
    tokenizer: Any = None,
    num_trajectories: int = 3,
    title: str | None = None,
    compare: Mapping[str, str | Path] | None = None,
) -> Path:
    """Write the report of a run or a demo (`DEMO/report.html`, `RUN/report.html`, or `out`); return its path.

    `run_dir` is a run directory (PPO or GRPO) or a demo directory (see the module docstring); a bare
    trajectories file is refused (`RunTargetError`: use `searchrl view` or `searchrl audit` for one).

    `compare` maps a label ("PPO", "GRPO (TRL loop)", ...) to a run directory: the page then gets the
    trainers-side-by-side section (read from each run's `eval/step-N.json`; a run without any is refused
    with a ValueError naming it). A demo directory with GRPO runs compares its runs without it.

    `summary` (e.g. the demo's summary.json) is shown as a table; without it the demo's (or
    `RUN/summary.json`) is used if present. `audit` defaults to `audit_run(run_dir)` (with the
    evaluations' audits); `trajectories` to the latest training step's; `tokenizer` to the run's (spans
    fall back to their stored text without one).
    """
    reader = RunReader(run_dir)
    if reader.kind == "trajectories":
        raise RunTargetError(
            f"{reader.target}: searchrl report needs a run directory or a demo directory, not one trajectories "
            f"file; read a file with `searchrl view {reader.target}` or `searchrl audit --run {reader.target}`"
        )
    root = reader.require_run("searchrl report")
    out = Path(out) if out is not None else reader.report_path()
    metrics = normalise_metrics(reader.metrics(), reader.trainer)
    evals = reader.eval_files()
    if summary is None:
        summary = reader.summary()
    if audit is None:
        try:
            audit = audit_run(run_dir)
        except FileNotFoundError:
            audit = None
    trajs = list(trajectories) if trajectories is not None else _latest_trajectories(reader)
    tok = tokenizer if tokenizer is not None else _tokenizer_of(reader)
    if compare is None and len(reader.sub_runs()) > 1:
        compare = reader.sub_runs()
    side_by_side = comparison_section(compare) if compare else None  # before writing: refuse bad runs
    xlabel = f"{reader.trainer_label} step"
    name = title or (reader.demo_root.name if reader.kind == "demo" and reader.demo_root else root.name)

    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(name)} · searchrl report</title><style>{CSS}</style></head><body>",
        f"<h1>searchrl run report: {html.escape(name)}</h1>",
        f"<p class='meta'>{html.escape(reader.describe())} · {reader.trainer_label} run {html.escape(str(root))} · "
        f"{len(metrics)} logged steps · {len(evals)} eval file(s)</p>",
        glance_section(metrics, reader.trainer_label, summary, evals, _eval_audits(reader, audit)),
    ]
    if summary:
        parts.append("<h2>Summary</h2>")
        comparison = comparison_table(summary)
        if comparison:
            parts.append(comparison)
        parts.append(f"<details><summary>All summary fields</summary>{summary_table(summary)}</details>")
    if side_by_side:
        parts.append(side_by_side)
    parts.append("<h2>Training curves</h2>")
    plots = build_plots(metrics, [e.data for e in evals], xlabel)
    if plots:
        figs = "".join(
            f"<figure><img class='plot' alt='{html.escape(t)}' src='data:image/png;base64,{png}'></figure>"
            for t, png in plots
        )
        parts.append(f"<p class='meta'>x axis: {html.escape(xlabel)}.</p><div class='plots'>{figs}</div>")
    else:
        parts.append("<p>No metrics logged yet (metrics.jsonl is missing or empty).</p>")
    held_out = [e for e in evals if "by_hops" in e.data]
    if held_out:
        parts.append("<h2>Held-out evaluation</h2>")
        for e in held_out:
            parts.append(
                f"<h3>{html.escape(e.name)} · {html.escape(e.label)} · split {html.escape(str(e.split))} · "
                f"{html.escape(str(e.data.get('checkpoint', e.stage or '')))}</h3>"
            )
            parts.append(eval_table(e.data))
    suites = benchmarks_section(evals)
    if suites:
        parts.append(suites)
    if audit is not None:
        parts += [
            "<h2>Reward-hacking audit</h2>",
            f"<p>Overall verdict: <span class='verdict-{audit.verdict}'>{audit.verdict}</span>. "
            f"{html.escape(audit.label or 'Training')}: <span class='verdict-{audit.own_verdict}'>"
            f"{audit.own_verdict}</span> over {audit.num_trajectories} trajectories "
            f"({html.escape(audit.source)}).</p>",
            audit_table(audit),
        ]
        for sub in audit.evaluations.values():
            parts += [
                f"<h3>Audit of {html.escape(sub.label)}</h3>",
                f"<p>Verdict: <span class='verdict-{sub.verdict}'>{sub.verdict}</span> over "
                f"{sub.num_trajectories} trajectories ({html.escape(sub.source)}).</p>",
                audit_table(sub),
            ]
    chosen = pick_trajectories(trajs, num_trajectories)
    if chosen:
        parts += [
            "<h2>Trajectories</h2>",
            "<p class='legend'><span class='span prompt'>prompt</span><span class='span action'>action tokens "
            "(sampled by the policy, trained on)</span><span class='span observation'>observation tokens "
            "(inserted by the environment, masked out)</span><span class='span glue'>template glue</span></p>",
            *[render_trajectory(t, tok) for t in chosen],
        ]
    parts.append("</body></html>")
    atomic_write_text(out, "\n".join(parts))
    return out
