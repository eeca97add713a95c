"""The demos' figures: one headline per evaluation, the stage measurements, the real loop's summary.json.

What: `headline(summary)` keeps, of an evaluation summary (`searchrl.evaluation.statistics.summarise`), what a
demo's `summary.json` reports per stage: the number of questions, the headline metrics with their 95%
intervals, the termination shares, and the same per hop count (and, for the real loop, per question type and
the share of well-formed tool calls). `stage_figures(runner)` is each stage's wall and CPU seconds and peak
RSS. `real_demo_summary` assembles the real loop's summary: baselines, SFT, PPO, the improvement, the targets
of issue 17 and the run manifest.

Why here: both demos reported their evaluations through their own copy of the headline; one function keeps
the two summaries' stage entries the same shape, so the report and the benchmarks read them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from searchrl.common.trajectory import Trajectory
from searchrl.demo.configs import REAL_KIND, RealDemoConfig
from searchrl.demo.stages import StageRunner
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.run.manifest import build_manifest


def headline_group(summary: dict[str, Any]) -> dict[str, Any]:
    """The question count and the headline metrics with their 95% intervals."""
    out: dict[str, Any] = {"n": summary["n"]}
    out.update({k: summary[k] for k in HEADLINE_METRICS if k in summary})
    out["ci95"] = {k: summary["ci95"][k] for k in HEADLINE_METRICS if k in summary.get("ci95", {})}
    return out


def headline(summary: dict[str, Any]) -> dict[str, Any]:
    """What a demo's summary.json reports of one evaluation (module docstring)."""
    out = headline_group(summary)
    out["termination"] = summary.get("termination", {})
    for key in ("well_formed_calls", "by_type"):  # the real loop's evaluations add these
        if key in summary:
            out[key] = summary[key]
    out["by_hops"] = {h: headline_group(g) for h, g in summary.get("by_hops", {}).items()}
    return out


# The customer-service task's own figures (`searchrl.data.support_access.task_metrics`), beside the headline ones.
TASK_METRICS = ("task_success", "permission_denied_rate", "leaked_observations")


def support_headline(summary: dict[str, Any]) -> dict[str, Any]:
    """What the customer-service demo's summary.json reports of one evaluation: the headline, the task's figures
    with their 95% intervals, and both per question type."""
    out = headline(summary)
    out.update({k: summary[k] for k in TASK_METRICS})
    out["ci95"].update({k: summary["ci95"][k] for k in TASK_METRICS})
    out["by_type"] = summary.get("by_type", {})
    return out


def stage_figures(runner: StageRunner) -> dict[str, dict[str, float]]:
    """Per stage: wall seconds, CPU seconds and the process's peak RSS (MB) when it ended."""
    return {
        "stages_seconds": dict(runner.timings),
        "stages_cpu_seconds": dict(runner.cpu),
        "peak_rss_mb_after_stage": dict(runner.peak_rss),
    }


def type_counts(rows: Sequence[dict[str, Any]]) -> dict[str, int]:
    """Questions per type (bridge, comparison, squad)."""
    counts: dict[str, int] = {}
    for row in rows:
        counts[str(row.get("type"))] = counts.get(str(row.get("type")), 0) + 1
    return counts


def _demonstration_kinds(demos: Sequence[Trajectory]) -> dict[str, int]:
    kinds: dict[str, int] = {}
    for d in demos:
        key = f"{d.metadata.get('type')}/{'supported' if d.metadata.get('supported') else 'unsupported'}"
        kinds[key] = kinds.get(key, 0) + 1
    return kinds


def real_demo_summary(
    cfg: RealDemoConfig,
    runner: StageRunner,
    baselines: dict[str, Any],
    sft_summary: dict[str, Any],
    sft_info: dict[str, Any],
    ppo_summary: dict[str, Any],
    trainer: Any,
    ppo_metrics: list[dict[str, Any]],
    ppo_change: float,
    demos: list[Trajectory],
    kept: list[Trajectory],
    fingerprint: str | None = None,
) -> dict[str, Any]:
    """The real loop's summary.json without its run facts (threads, data, totals: `run_real_demo` adds them)."""
    steps = [m for m in ppo_metrics if m.get("step", 0) >= 1 and "objective/kl" in m]
    kl = [float(m["objective/kl"]) for m in steps]
    sft_test, ppo_test = headline(sft_summary), headline(ppo_summary)
    rag = baselines.get("naive_rag", {}).get("test", {})
    targets = {
        "sft_format_valid_ge_0.95": sft_test["format_valid"] >= 0.95,
        "sft_well_formed_calls_ge_0.95": (sft_test["well_formed_calls"] or 0.0) >= 0.95,
        "ppo_em_ge_sft": ppo_test["exact_match"] >= sft_test["exact_match"],
        "ppo_f1_ge_sft": ppo_test["f1"] >= sft_test["f1"],
        "ppo_em_ge_naive_rag": ppo_test["exact_match"] >= rag.get("exact_match", 0.0),
        "ppo_f1_ge_naive_rag": ppo_test["f1"] >= rag.get("f1", 0.0),
        "ppo_no_collapse": ppo_test["format_valid"] >= sft_test["format_valid"] - 0.1
        and trainer.rollbacks == 0,
        "ppo_kl_nonzero_after_step_1": sum(k != 0.0 for k in kl[1:]) >= max(1, (len(kl) - 1) // 2),
    }
    return {
        "kind": REAL_KIND,
        "baselines": baselines,
        "sft": {
            "test": sft_test,
            **{k: v for k, v in sft_info.items() if k not in ("losses", "trainer_metrics")},
            "num_demonstrations": len(demos),
            "demonstrations_trained": len(kept),
            "demonstrations_by_kind": _demonstration_kinds(demos),
        },
        "ppo": {
            "test": ppo_test,
            "steps": trainer.global_step,
            "episodes": trainer.episode,
            "rollbacks": trainer.rollbacks,
            "max_weight_change": ppo_change,
            "objective/kl": kl,
            "objective/scores": [float(m["objective/scores"]) for m in steps],
            "kl_nonzero_steps": sum(k != 0.0 for k in kl),
        },
        "improvement": {
            "exact_match": ppo_test["exact_match"] - sft_test["exact_match"],
            "f1": ppo_test["f1"] - sft_test["f1"],
        },
        "targets": targets,
        "finetune": cfg.finetune,
        **stage_figures(runner),
        "manifest": build_manifest(
            seeds={"seed": cfg.seed}, tokenizer=trainer.tokenizer, index_fingerprint=fingerprint
        ),
    }
