"""CLI of the evaluation room: `searchrl eval`, `searchrl audit` and `searchrl report`.

Each command prints a rich table for people and writes JSON (or HTML) into the run directory for
machines and for the report, so what a person saw and what a script reads are the same numbers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from searchrl.common.io import atomic_write_json
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.run.reader import RunReader

VERDICT_STYLE = {"pass": "green", "warn": "yellow", "fail": "bold red", "skipped": "dim"}

_TABLE_METRICS = (
    *HEADLINE_METRICS,
    "action_tokens_per_question",
    "tokens_per_question",
    "reward",
)


def _eval_table(summary: dict[str, Any], title: str) -> Any:
    hops = sorted(summary.get("by_hops", {}))
    table = Table(title=title)
    table.add_column("metric")
    table.add_column(f"all (n={summary['n']})", justify="right")
    table.add_column("95% CI", justify="right")
    for h in hops:
        table.add_column(f"{h}-hop (n={summary['by_hops'][h]['n']})", justify="right")
    ci = summary.get("ci95", {})
    for name in _TABLE_METRICS:
        if name not in summary:
            continue
        lo, hi = ci.get(name, [float("nan"), float("nan")])
        cells = [f"{summary['by_hops'][h].get(name, float('nan')):.3f}" for h in hops]
        table.add_row(name, f"{summary[name]:.3f}", f"[{lo:.3f}, {hi:.3f}]", *cells)
    timing = summary.get("timing", {})
    if "latency_s_per_question" in timing:
        lo, hi = timing.get("latency_s_per_question_ci", [0.0, 0.0])
        cells = [
            f"{timing['by_hops'][h]['latency_s_per_question']:.3f}"
            for h in hops
            if h in timing.get("by_hops", {})
        ]
        table.add_row(
            "latency_s_per_question",
            f"{timing['latency_s_per_question']:.3f}",
            f"[{lo:.3f}, {hi:.3f}]",
            *cells,
        )
    for reason, share in summary.get("termination", {}).items():
        if share:
            lo, hi = ci.get(f"termination/{reason}", [share, share])
            cells = [f"{summary['by_hops'][h]['termination'].get(reason, 0.0):.3f}" for h in hops]
            table.add_row(f"termination/{reason}", f"{share:.3f}", f"[{lo:.3f}, {hi:.3f}]", *cells)
    return table


def eval_command(
    run: Annotated[
        Path | None,
        typer.Option(
            "--run",
            help="Run directory (PPO or GRPO) or demo directory: its prompt, protocol, citation style, budgets "
            "and rubric, and by default its checkpoint, data and index. Optional with --model, --data and "
            "--index/--corpus.",
        ),
    ] = None,
    split: Annotated[
        str, typer.Option("--split", help="Split to evaluate: <data dir>/<split>.jsonl (test, dev...).")
    ] = "test",
    checkpoint: Annotated[
        str | None,
        typer.Option(
            "--checkpoint",
            help="Checkpoint of the run: 'latest' (default), 'step-N', N, 'best' (the best dev evaluation by the "
            "run's best_metric, see RUN/best_checkpoint.json), or 'initial' (the policy the run started from: "
            "policy_model_path, or a demo's sft/policy).",
        ),
    ] = None,
    model: Annotated[
        Path | None,
        typer.Option(
            "--model",
            help="Any model folder (policy + tokenizer: a base model, the SFT policy, a checkpoint).",
        ),
    ] = None,
    data: Annotated[
        Path | None,
        typer.Option(
            "--data",
            help="Folder of <split>.jsonl files, or one JSONL file of questions (id, question, golds); default: "
            "the run's.",
        ),
    ] = None,
    index: Annotated[
        Path | None,
        typer.Option("--index", help="Search index folder (`searchrl index`); default: the run's index_dir."),
    ] = None,
    corpus: Annotated[
        Path | None,
        typer.Option(
            "--corpus",
            help="A JSONL corpus (id, title, contents) to index with BM25 for this evaluation, instead of --index.",
        ),
    ] = None,
    out: Annotated[
        Path | None, typer.Option("--out", help="JSON output (default RUN/eval/<split>-<checkpoint>.json).")
    ] = None,
    batch_size: Annotated[int, typer.Option("--batch-size", help="Questions decoded together.", min=1)] = 16,
    limit: Annotated[
        int | None, typer.Option("--limit", help="Evaluate only the first N questions.", min=1)
    ] = None,
    seed: Annotated[int, typer.Option("--seed", help="Seed of rollouts and of the bootstrap.")] = 0,
    bootstrap: Annotated[
        int, typer.Option("--bootstrap", help="Bootstrap resamples for the 95% CIs.", min=1)
    ] = 1000,
    benchmarks: Annotated[
        Path | None,
        typer.Option(
            "--benchmarks",
            help="Evaluate on Search-R1's seven QA sets instead of one split: a folder of <set>/test.jsonl or "
            "<set>/dev.jsonl (FlashRAG's layout; test where present, else dev, as Search-R1) for nq, triviaqa, "
            "popqa, hotpotqa, 2wikimultihopqa, musique, bamboogle. Writes RUN/eval/benchmarks-<checkpoint>.json "
            "with EM, F1 and searches per question per set and their unweighted average, with 95% CIs.",
        ),
    ] = None,
    sets: Annotated[
        str | None,
        typer.Option(
            "--sets",
            help="With --benchmarks: comma-separated set names to evaluate (default: all seven, each required).",
        ),
    ] = None,
    question_mark: Annotated[
        bool,
        typer.Option(
            "--question-mark/--no-question-mark",
            help="With --benchmarks: strip each question and end it with '?', as Search-R1's data processing "
            "does (default), or keep the file's text.",
        ),
    ] = True,
) -> None:
    """Evaluate a checkpoint or any model (greedy, the run's prompt, protocol and budgets) on any split and index,
    or on Search-R1's seven QA sets (--benchmarks)."""
    from searchrl.evaluation.targets import evaluate_run  # torch: when the command runs, not for --help

    if run is None and model is None:
        raise typer.BadParameter("give --run DIR (a training run or a demo) or --model PATH (a model folder)")
    if benchmarks is not None:
        if data is not None:
            raise typer.BadParameter("--benchmarks and --data both name the questions; give one of them")
        _eval_benchmarks(
            run,
            benchmarks,
            sets,
            checkpoint,
            model,
            index,
            corpus,
            out,
            batch_size,
            limit,
            seed,
            bootstrap,
            question_mark,
        )
        return
    if sets is not None:
        raise typer.BadParameter("--sets picks sets of --benchmarks DIR; pass --benchmarks too")
    try:
        result, path = evaluate_run(
            run,
            split,
            checkpoint,
            model,
            data,
            index,
            out,
            batch_size=batch_size,
            limit=limit,
            seed=seed,
            n_resamples=bootstrap,
            corpus=corpus,
        )
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    console = Console()
    console.print(_eval_table(result.summary, f"{split} split · {path.stem}"))
    console.print(f"wrote {path}")


def benchmarks_table(payload: dict[str, Any], title: str) -> Any:
    """Search-R1's Table 3 layout: one column per set (dagger: trained on), then the unweighted average."""
    table = Table(title=title)
    table.add_column("metric")
    sets = payload["benchmarks"]
    for result in sets.values():
        mark = "†" if result.get("in_domain") else ""
        note = "" if result.get("matches_search_r1_split") else " (!)"
        table.add_column(
            f"{result['label']}{mark}\n{result['split']}, n={result['n']}{note}", justify="right"
        )
    table.add_column("Avg", justify="right")
    average = payload["average"]
    for metric in ("exact_match", "f1", "searches_per_question"):
        cells = [f"{r[metric]:.3f}" for r in sets.values()]
        table.add_row(metric, *cells, f"{average[metric]:.3f}")
    ci_cells = ["[{:.2f}, {:.2f}]".format(*r["ci95"]["exact_match"]) for r in sets.values()]
    table.add_row("EM 95% CI", *ci_cells, "[{:.2f}, {:.2f}]".format(*average["ci95"]["exact_match"]))
    return table


def _eval_benchmarks(
    run: Path | None,
    benchmarks: Path,
    sets: str | None,
    checkpoint: str | None,
    model: Path | None,
    index: Path | None,
    corpus: Path | None,
    out: Path | None,
    batch_size: int,
    limit: int | None,
    seed: int,
    bootstrap: int,
    question_mark: bool,
) -> None:
    from searchrl.evaluation.benchmarks import evaluate_benchmarks  # torch, as above

    names = [s for s in (sets or "").split(",") if s.strip()] or None
    try:
        payload, path = evaluate_benchmarks(
            run,
            benchmarks,
            names,
            checkpoint,
            model,
            index,
            out,
            batch_size=batch_size,
            limit=limit,
            seed=seed,
            n_resamples=bootstrap,
            corpus=corpus,
            question_mark=question_mark,
        )
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    console = Console()
    console.print(
        benchmarks_table(payload, f"benchmarks · {payload['checkpoint']} · EM (Search-R1's metric)")
    )
    if not all(r["matches_search_r1_split"] for r in payload["benchmarks"].values()):
        console.print(
            "(!) not the split Search-R1 evaluated (NQ, TriviaQA, PopQA, Bamboogle: test; others: dev)"
        )
    console.print(f"wrote {path}")


def _audit_table(report: Any, title: str | None = None) -> Any:
    table = Table(
        title=title
        or f"reward-hacking audit · verdict: {report.own_verdict} · {report.num_trajectories} trajectories"
    )
    table.add_column("check", no_wrap=True)
    table.add_column("verdict", no_wrap=True)
    table.add_column("value", justify="right", no_wrap=True)
    table.add_column("threshold")
    table.add_column("flagged", justify="right", no_wrap=True)
    table.add_column("evidence", overflow="fold")
    for c in report.checks:
        style = VERDICT_STYLE.get(c.verdict, "")
        value = "" if c.value is None else f"{c.value:.3f}"
        evidence = ", ".join(c.evidence[:4]) + (" ..." if len(c.evidence) > 4 else "")
        table.add_row(
            c.name,
            f"[{style}]{c.verdict}[/]",
            value,
            c.threshold,
            f"{c.num_flagged}/{c.num_checked}",
            evidence,
        )
    return table


def audit_command(
    run: Annotated[
        Path,
        typer.Option(
            "--run",
            help="What to audit: a run directory (PPO or GRPO), a demo directory (its PPO run and its hidden-test "
            "evaluations) or one trajectories file (*.jsonl.gz, *.jsonl).",
        ),
    ],
    json_out: Annotated[
        Path | None,
        typer.Option(
            "--json",
            help="Where to write the audit JSON (default DEMO/audit.json, RUN/audit.json or FILE.audit.json).",
        ),
    ] = None,
    last_steps: Annotated[
        int,
        typer.Option("--last-steps", help="Audit the trajectories of the last N steps; 0 audits all.", min=0),
    ] = 10,
    strict: Annotated[
        bool,
        typer.Option(
            "--strict",
            help="Exit 1 when any check fails, evaluations included (default: always 0, it is a report).",
        ),
    ] = False,
    trajectories: Annotated[
        list[Path] | None,
        typer.Option(
            "--trajectories",
            help="Audit these .jsonl.gz files instead of the training ones (e.g. RUN/eval/*.trajectories.jsonl.gz).",
        ),
    ] = None,
) -> None:
    """Check for reward hacking: each check with its threshold, verdict and evidence (trajectory ids)."""
    from searchrl.evaluation.audit import audit_run  # numpy: not for --help

    try:
        reader = RunReader(run)
        report = audit_run(run, last_steps=last_steps or None, trajectory_files=trajectories)
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    path = json_out or reader.audit_path()
    atomic_write_json(path, report.to_dict())
    console = Console()
    label = report.label or "audit"
    console.print(
        _audit_table(
            report,
            f"reward-hacking audit · {label} · verdict: {report.own_verdict} · {report.num_trajectories} trajectories",
        )
    )
    for sub in report.evaluations.values():
        console.print(
            _audit_table(
                sub,
                f"evaluation · {sub.label} · verdict: {sub.verdict} · {sub.num_trajectories} trajectories",
            )
        )
    if report.evaluations:
        console.print(f"overall verdict: {report.verdict}")
    console.print(f"wrote {path}")
    if strict and report.verdict == "fail":
        raise typer.Exit(code=1)


def report_command(
    run: Annotated[
        Path,
        typer.Option(
            "--run",
            help="A run directory (PPO or GRPO) or a demo directory (its PPO run, summary.json, hidden-test "
            "evaluations and, after --compare-grpo, the trainers side by side).",
        ),
    ],
    out: Annotated[
        Path | None, typer.Option("--out", help="HTML output (default DEMO/report.html or RUN/report.html).")
    ] = None,
    summary: Annotated[
        Path | None,
        typer.Option("--summary", help="A summary JSON to show (default: the demo's or RUN/summary.json)."),
    ] = None,
    trajectories: Annotated[
        int, typer.Option("--trajectories", help="Full trajectories to render.", min=0)
    ] = 3,
    compare: Annotated[
        list[str] | None,
        typer.Option(
            "--compare",
            help="LABEL=DIR: a run drawn in the trainers-side-by-side plots (dev EM against wall-clock and "
            'episodes); repeatable, e.g. --compare PPO=runs/demo/ppo --compare "GRPO (our rollout)"=runs/g. '
            "A demo directory with GRPO runs compares them without it.",
        ),
    ] = None,
) -> None:
    """Write one self-contained report.html: curves, headline figures, eval tables, audit, trajectories."""
    from searchrl.evaluation.report import write_report  # numpy (matplotlib when it draws): not for --help

    data = json.loads(summary.read_text(encoding="utf-8")) if summary is not None else None
    runs = parse_compare(compare or [])
    try:
        path = write_report(run, out, summary=data, num_trajectories=trajectories, compare=runs or None)
    except (FileNotFoundError, ValueError) as e:
        raise typer.BadParameter(str(e)) from None
    typer.echo(f"wrote {path}")


def parse_compare(pairs: list[str]) -> dict[str, Path]:
    """`["PPO=runs/a", "GRPO=runs/b"]` -> `{"PPO": Path("runs/a"), ...}` in order; bad pairs named."""
    runs: dict[str, Path] = {}
    for pair in pairs:
        label, sep, folder = pair.partition("=")
        if not sep or not label.strip() or not folder.strip():
            raise typer.BadParameter(f"--compare {pair!r}: write LABEL=DIR, e.g. --compare PPO=runs/demo/ppo")
        if label.strip() in runs:
            raise typer.BadParameter(f"--compare {pair!r}: the label {label.strip()!r} is given twice")
        runs[label.strip()] = Path(folder.strip())
    return runs


def register(app: typer.Typer) -> None:
    app.command("eval")(eval_command)
    app.command("audit")(audit_command)
    app.command("report")(report_command)
