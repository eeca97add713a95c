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

What it reads (`searchrl.run.reader.RunReader`, the one reader of run files): a run directory (PPO or GRPO;
x axes say "PPO step" or "GRPO step"; a GRPO run's writer logged TRL's `reward`, `kl`, `entropy` under PPO's
names too) with the metrics the run kept (a step the collapse guard rolled back counts once), or a demo
directory: its main run, `summary.json`, the evaluations its layout lists and, when it has several runs
(`--compare-grpo`), the trainers side by side. A run that is a demo's main run gets the demo's evaluations too.

Benchmarks (`searchrl eval --benchmarks`, `searchrl.evaluation.benchmarks`): every suite eval JSON as
Search-R1's Table 3, one column per QA set and the unweighted average, exact match with its CI, then F1 and
searches per question, with the paper's rows beside them for reference.

Where: this module reads the run and assembles the page; the "At a glance" section is `glance.py`, the
matplotlib plots `plots.py`, the trainers-side-by-side section (curves, SVG, table) `compare.py`, the HTML
table helpers `tables.py`.

Why self-contained: a report is mailed, attached to an issue or opened from a cluster's scratch disk;
inline CSS and images mean nothing has to be fetched and nothing breaks when the run folder moves.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_text
from searchrl.common.trajectory import Trajectory, read_trajectories, token_kinds
from searchrl.data.benchmarks import BENCHMARKS, SEARCH_R1_PAPER_EM
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.evaluation.audit import AuditReport, audit_run
from searchrl.evaluation.compare import comparison_section
from searchrl.evaluation.glance import glance_section, stages_with_test_metrics
from searchrl.evaluation.plots import build_plots
from searchrl.evaluation.tables import fmt_cell, html_table
from searchrl.run.errors import RunTargetError
from searchrl.run.reader import RunReader
from searchrl.run.sources import EvalFile

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


def comparison_table(summary: dict[str, Any]) -> str | None:
    """Held-out metrics of each stage side by side (SFT warm start vs PPO) with the change, or None."""
    stages = stages_with_test_metrics(summary)
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


def kind_runs(kinds: Sequence[str]) -> list[tuple[str, int, int]]:
    """(kind, start, end) of each maximal run of tokens of one kind, in order."""
    runs: list[tuple[str, int, int]] = []
    for i, kind in enumerate(kinds):
        if runs and runs[-1][0] == kind and runs[-1][2] == i:
            runs[-1] = (kind, runs[-1][1], i + 1)
        else:
            runs.append((kind, i, i + 1))
    return runs


def _prompt_fallback(traj: Trajectory) -> str:
    return "\n".join(f"[{m.get('role')}] {m.get('content', '')}" for m in traj.messages[:2])


def _run_text(traj: Trajectory, kind: str, start: int, end: int, tokenizer: Any) -> str:
    """The run's tokens decoded on their own; without a tokenizer, the stored text of the spans it starts."""
    if tokenizer is not None:
        return tokenizer.decode(
            traj.input_ids[start:end], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
    texts = [s.text or (_prompt_fallback(traj) if s.kind == "prompt" else "") for s in traj.spans
             if s.kind == kind and start <= s.start < end]  # fmt: skip
    return "".join(texts)


def render_trajectory(traj: Trajectory, tokenizer: Any = None) -> str:
    """One trajectory as HTML: its tokens in runs of one kind (`token_kinds`, the rule the viewer colours by
    too), each run decoded from its own tokens and coloured by its kind; the prompt folded."""
    pieces = []
    for kind, start, end in kind_runs(token_kinds(traj, tokenizer)):
        text = _run_text(traj, kind, start, end, tokenizer)
        n = end - start
        title = f"{kind}: tokens {start}-{end} ({n})"
        if kind == "action" and traj.logprobs:
            lps = traj.logprobs[start:end]
            title += f", mean logprob {sum(lps) / max(1, len(lps)):.2f}"
        piece = f'<span class="span {kind}" title="{html.escape(title)}">{html.escape(text)}</span>'
        if kind == "prompt":  # long (system prompt + tool schemas) and the same in every episode: folded
            piece = f"<details class='prompt'><summary>prompt · {n} tokens</summary>{piece}</details>"
        pieces.append(piece)
    reward = "" if traj.reward is None else f"{traj.reward:.3f}"
    n_denied = sum(1 for c in traj.tool_calls if c.status == "permission_denied")
    denied = f" · <b class='denied'>permission-denied calls: {n_denied}</b>" if n_denied else ""
    breakdown = ", ".join(
        f"{k} {v:.3f}" for k, v in traj.reward_breakdown.items() if not k.startswith("metric/")
    )
    meta = (
        f"<div class='meta'><b>{html.escape(traj.id)}</b> · question: {html.escape(traj.question)} · golds: "
        f"{html.escape(' | '.join(traj.golds))} · answer: <b>{html.escape(str(traj.answer))}</b> · "
        f"termination: {html.escape(traj.termination)} · searches: {len(traj.tool_calls)}{denied} · reward: {reward}"
        f"{' (' + html.escape(breakdown) + ')' if breakdown else ''} · action tokens: {traj.num_action_tokens}"
        f" of {len(traj.input_ids)}</div>"
    )
    return f"<div class='traj'>{meta}<div class='tokens'>{''.join(pieces)}</div></div>"


def pick_trajectories(trajs: Sequence[Trajectory], n: int) -> list[Trajectory]:
    """A few telling trajectories: the best- and worst-rewarded, then ones with a permission-denied call, then
    ones that searched, in order."""
    if n <= 0 or not trajs:
        return []
    scored = sorted(trajs, key=lambda t: t.reward if t.reward is not None else 0.0, reverse=True)
    chosen: list[Trajectory] = []
    denied = [t for t in trajs if any(c.status == "permission_denied" for c in t.tool_calls)]
    for t in [scored[0], scored[-1], *denied, *[t for t in trajs if t.tool_calls], *trajs]:
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
        from searchrl.models.io import load_tokenizer  # transformers: only when spans are decoded

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
    stage_labels = {s.name: s.label for s in reader.layout.stages} if reader.layout is not None else {}
    if reader.kind == "trajectories":
        raise RunTargetError(
            f"{reader.target}: searchrl report needs a run directory or a demo directory, not one trajectories "
            f"file; read a file with `searchrl view {reader.target}` or `searchrl audit --run {reader.target}`"
        )
    root = reader.require_run("searchrl report")
    out = Path(out) if out is not None else reader.report_path()
    metrics = reader.metrics()
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
        glance_section(
            metrics, reader.trainer_label, summary, evals, _eval_audits(reader, audit), stage_labels
        ),
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
