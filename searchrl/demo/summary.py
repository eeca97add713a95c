"""The demos' figures: one headline per evaluation, the stage measurements, the real loop's summary.json.

What: `headline(summary)` keeps, of an evaluation summary (`searchrl.evaluation.statistics.summarise`), what a
demo's `summary.json` reports per stage: the number of questions, the headline metrics with their 95%
intervals, the termination shares, and the same per hop count (and, for the real loop, per question type and
the share of well-formed tool calls). `stage_figures(runner)` is each stage's wall and CPU seconds and peak
RSS; `learning_figures(run)` whether its PPO run learned. `real_demo_summary` assembles the real loop's
summary: baselines, SFT, PPO, the improvement, the targets of issues 17 and 25 and the run manifest;
`paired_figures` the differences of two policies on the same test questions (paired bootstrap), `eval_timings`
each evaluation's questions per second.

Why here: both demos reported their evaluations through their own copy of the headline; one function keeps
the two summaries' stage entries the same shape, so the report and the benchmarks read them alike.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from searchrl.common.trajectory import Trajectory
from searchrl.demo.configs import REAL_KIND, RealDemoConfig
from searchrl.demo.stages import StageRunner
from searchrl.evaluation import HEADLINE_METRICS
from searchrl.evaluation.plots import second_half_mean
from searchrl.evaluation.statistics import paired_comparison
from searchrl.run.manifest import build_manifest
from searchrl.run.reader import RunReader


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


def learning_figures(run_dir: Path) -> dict[str, Any]:
    """Whether a PPO run learned (`searchrl.ppo.learning_check`), from its last dev evaluation and its
    metrics: the share of dev answers changed since the first evaluation, the not-learning flag, the dev
    exact match at the first and last evaluation, and the critic's explained variance over the second half."""
    reader = RunReader(run_dir)
    evals = reader.step_evaluations()
    if not evals:
        return {}
    first, last = evals[min(evals)], evals[max(evals)]
    return {
        "dev_exact_match_first": first.get("eval/exact_match"),
        "dev_exact_match_last": last.get("eval/exact_match"),
        "answers_changed": last.get("eval/answers_changed"),
        "not_learning": bool(last.get("eval/not_learning", 0.0)),
        "explained_variance_2nd_half": second_half_mean(reader.metrics(), "val/explained_variance"),
    }


# The paired differences summary.json reports: name -> (the first policy, the policy it is compared with).
PAIRED_COMPARISONS: dict[str, tuple[str, str]] = {
    "ppo_minus_sft": ("ppo", "sft"),
    "ppo_minus_naive_rag": ("ppo", "naive_rag"),
    "sft_minus_naive_rag": ("sft", "naive_rag"),
    "grpo_minus_sft": ("grpo", "sft"),
    "grpo_minus_ppo": ("grpo", "ppo"),
}


def paired_figures(
    test_trajectories: dict[str, Sequence[Trajectory]], seed: int = 0, n_resamples: int = 1000
) -> dict[str, dict[str, Any]]:
    """`{name: {"test": {"exact_match": {"mean", "ci95", "n"}, "f1": {...}}}}` for each of `PAIRED_COMPARISONS`
    whose two policies were evaluated (by name: a stage or a baseline), paired by question."""
    return {
        name: {
            "test": paired_comparison(
                test_trajectories[a], test_trajectories[b], n_resamples=n_resamples, seed=seed
            )
        }
        for name, (a, b) in PAIRED_COMPARISONS.items()
        if a in test_trajectories and b in test_trajectories
    }


def paired_targets(paired: dict[str, dict[str, Any]]) -> dict[str, bool]:
    """Issue 25's targets on the paired figures: PPO - SFT >= +0.05 exact match, with the paired intervals of
    exact match and F1 above 0 (empty when PPO or SFT was not evaluated)."""
    diff = paired.get("ppo_minus_sft", {}).get("test")
    if not diff:
        return {}
    return {
        "ppo_minus_sft_em_ge_0.05": diff["exact_match"]["mean"] >= 0.05,
        "ppo_minus_sft_em_ci_above_0": diff["exact_match"]["ci95"][0] > 0,
        "ppo_minus_sft_f1_ci_above_0": diff["f1"]["ci95"][0] > 0,
    }


def eval_timings(runner: StageRunner, questions: int) -> dict[str, dict[str, float]]:
    """Each evaluation stage's wall seconds and questions per second (the stages named `base ...`/`eval ...`)."""
    return {
        stage: {"seconds": seconds, "questions": questions, "questions_per_s": round(questions / seconds, 3)}
        for stage, seconds in runner.timings.items()
        if stage.startswith(("base ", "eval ")) and seconds > 0
    }


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
