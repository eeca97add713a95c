"""The "At a glance" section of `report.html`: the figures a reader should not have to dig for.

Next to exact match: the held-out evaluations' citation support and fabricated-citation rate (from the demo
summary and the audit of each evaluation's trajectories), the dev exact match, `rollout/logprob_max_abs_diff`
(max over the run and at the last step: the rollout engine's logprobs against the trainer's forward pass) and
`objective/kl` (mean and last), read from the metrics the run kept.
"""

from __future__ import annotations

import html
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.evaluation.audit import AuditReport
from searchrl.evaluation.plots import metric_series, second_half_mean
from searchrl.evaluation.tables import finite_number, fmt_cell, html_table
from searchrl.run.sources import EvalFile


def stages_with_test_metrics(summary: dict[str, Any]) -> list[str]:
    """Top-level keys (e.g. "sft", "ppo") whose value holds a `test` summary with an exact match (a number: a
    paired difference such as `ppo_minus_sft` holds `{"mean", "ci95"}` there and is not a stage)."""
    return [
        k
        for k, v in summary.items()
        if isinstance(v, dict)
        and isinstance(v.get("test"), dict)
        and isinstance(v["test"].get("exact_match"), int | float)
    ]


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
    stage_labels: Mapping[str, str] | None = None,
) -> list[HeldOutRow]:
    """The demo summary's stages with a `test` summary (SFT, PPO, ...), then every other test-split eval
    JSON: exact match [CI], citation support, fabricated-citation rate (the audit of its trajectories).
    `stage_labels` names a stage's policy (a demo's layout: "sft" -> "SFT policy"); a stage it does not name
    is its key in capitals ("ppo" -> "PPO policy")."""
    rows: list[HeldOutRow] = []
    covered: set[Path] = set()
    for stage in stages_with_test_metrics(summary or {}):
        test = summary[stage]["test"]  # type: ignore[index]
        match = next((e for e in evals if e.stage == stage and e.variant is None and e.split == "test"), None)
        audit = eval_audits.get(match.trajectories) if match is not None and match.trajectories else None
        if match is not None:
            covered.add(match.path)
        rate, detail = _fabricated(audit)
        label = (stage_labels or {}).get(stage) or f"{stage.upper()} policy"
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
    rows += learning_rows(metrics)
    return rows


def learning_rows(metrics: Sequence[dict[str, Any]]) -> list[list[str]]:
    """Is the run learning (`searchrl.ppo.learning_check`) and does its critic explain the returns? PPO runs
    only: the rows are left out where the metrics are not logged."""
    rows: list[list[str]] = []
    changed = _numbers(metrics, "eval/answers_changed")
    if changed:
        stalled = [step for step, flag in _numbers(metrics, "eval/not_learning") if flag]
        verdict = (
            f"NOT LEARNING since step {stalled[0]}: no dev answer changed, dev exact match flat, KL near 0; "
            "raise the policy's learning_rate"
            if stalled
            else "learning"
        )
        rows.append(["dev answers changed since the start (eval/answers_changed)",
                     f"{changed[-1][1]:.2f} at step {changed[-1][0]}", verdict])  # fmt: skip
    ev = _numbers(metrics, "val/explained_variance")
    if ev:
        settled = second_half_mean(metrics, "val/explained_variance")
        rows.append(["critic: val/explained_variance", f"mean {settled:.2f} over the second half",
                     f"last {ev[-1][1]:.2f} (step {ev[-1][0]})"])  # fmt: skip
    return rows


def glance_section(
    metrics: Sequence[dict[str, Any]],
    trainer_label: str,
    summary: dict[str, Any] | None,
    evals: Sequence[EvalFile],
    eval_audits: Mapping[Path, AuditReport],
    stage_labels: Mapping[str, str] | None = None,
) -> str:
    """The "At a glance" section: held-out results with their citation figures, and training diagnostics."""
    parts = ["<h2>At a glance</h2>"]
    rows = held_out_rows(summary, evals, eval_audits, stage_labels)
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
