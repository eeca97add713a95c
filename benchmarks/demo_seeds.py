"""The demo across seeds, side by side: one table and one figure from finished `searchrl demo` runs.

A figure that holds on one seed is an anecdote, so the README reports the demo per seed and the mean. This
reads finished demo directories (`searchrl demo --seed N --out DIR`, nothing is rerun) and gathers, per
seed, what a reader should see together: SFT and PPO hidden-test exact match with their 95% bootstrap
intervals, by hop count, citation support, the audit's verdict and fabricated-citation share (the audit
of the demo directory, run here: its training trajectories and each hidden-test evaluation), the KL to the reference and the
sampling-vs-training log-probability gap from `ppo/metrics.jsonl`, the dev curve, the wall-clock and peak
RSS. The test split is only read here; nothing is chosen from it.

    .venv/bin/python benchmarks/demo_seeds.py --run runs/demo-s0 runs/demo-s1 runs/demo-s2 \\
        --json docs/figures/demo_seeds.json --plot docs/figures/demo_seeds.png

The PNG has two panels: dev exact match against the PPO step (one line per seed), and hidden-test exact
match after SFT and after PPO per seed, with the 95% intervals as whiskers.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _experiment_common import pyplot, save_figure, write_json  # noqa: E402

from searchrl.common.trajectory import read_trajectories  # noqa: E402
from searchrl.demo.summary import paired_figures  # noqa: E402
from searchrl.evaluation.audit import audit_run  # noqa: E402
from searchrl.evaluation.plots import second_half_mean  # noqa: E402
from searchrl.run.reader import RunReader  # noqa: E402
from searchrl.run.writer import SUMMARY_FILE  # noqa: E402


def seed_figures(run: Path) -> dict[str, Any]:
    """Everything one demo directory says about its result; ValueError naming what is missing."""
    if not (run / SUMMARY_FILE).exists():
        raise ValueError(f"{run}: no summary.json; pass a finished `searchrl demo --out {run}` directory")
    reader = RunReader(run)  # the demo, read through its layout: its summary and its PPO run's metrics
    summary = reader.summary() or {}
    if "ppo" not in summary:
        raise ValueError(
            f"{run}: summary.json has no figures yet (the demo is running or stopped); let it finish"
        )
    sft, ppo = summary["sft"]["test"], summary["ppo"]["test"]
    metrics = reader.metrics()
    kl = [m["objective/kl"] for m in metrics if "objective/kl" in m]
    gap = [m["rollout/logprob_max_abs_diff"] for m in metrics if "rollout/logprob_max_abs_diff" in m]
    dev = [(int(m["step"]), float(m["eval/exact_match"])) for m in metrics if "eval/exact_match" in m]
    out: dict[str, Any] = {
        "run": str(run),
        "seed": summary["manifest"]["seeds"]["seed"],
        "sft_exact_match": sft["exact_match"],
        "sft_exact_match_ci95": sft["ci95"]["exact_match"],
        "ppo_exact_match": ppo["exact_match"],
        "ppo_exact_match_ci95": ppo["ci95"]["exact_match"],
        "improvement": round(ppo["exact_match"] - sft["exact_match"], 4),
        # paired over the same test questions (a demo older than the summary's own figure: from its files)
        "paired_improvement": (summary.get("ppo_minus_sft") or _paired(run))["test"]["exact_match"],
        "ppo_f1": ppo["f1"],
        "by_hops_exact_match": {
            hops: {"sft": sft["by_hops"][hops]["exact_match"], "ppo": ppo["by_hops"][hops]["exact_match"]}
            for hops in sorted(ppo["by_hops"])
        },
        "searches_per_question": {"sft": sft["searches_per_question"], "ppo": ppo["searches_per_question"]},
        "citation_support": {"sft": sft["citation_support"], "ppo": ppo["citation_support"]},
        "closed_book_exact_match": summary["sft"]["closed_book_test"]["exact_match"],
        "kl_nonzero_steps": sum(abs(v) > 1e-6 for v in kl),
        "kl_steps": len(kl),
        "kl_min": min(kl, default=None),
        "kl_max": max(kl, default=None),
        "kl_last": kl[-1] if kl else None,
        "logprob_gap_max": max(gap, default=None),
        "dev_curve": dev,
        "wall_seconds": summary["wall_seconds"],
        "peak_rss_mb": summary["peak_rss_mb"],
        "ppo_seconds": summary["stages_seconds"].get("ppo"),
        # issue 25: the critic's explained variance (second half of PPO) and the learning check
        "explained_variance_2nd_half": _rounded(second_half_mean(metrics, "val/explained_variance")),
        "not_learning": any(m.get("eval/not_learning") for m in metrics),
        "warm_start_reused": bool(summary.get("warm_start", {}).get("reused")),
    }
    # The audit is run here (the same call as `searchrl audit --run DIR`), so every row has it: the training
    # trajectories' checks and each hidden-test evaluation's (SFT and PPO), fabricated citations included.
    audit = audit_run(run)
    out["audit_verdict"] = audit.verdict
    out["fabricated_citations_training"] = audit.fabricated_citation_rate()
    out["evaluation_verdicts"] = {name: e.verdict for name, e in audit.evaluations.items()}
    out["fabricated_citations_evaluations"] = {
        name: e.fabricated_citation_rate() for name, e in audit.evaluations.items()
    }
    return out


def _paired(run: Path) -> dict[str, Any]:
    """PPO minus SFT on the demo's test questions, paired by question, from its evaluation trajectories."""
    trajs = {
        stage: read_trajectories(run / "eval" / f"{stage}-test.trajectories.jsonl.gz")
        for stage in ("ppo", "sft")
    }
    return paired_figures(trajs)["ppo_minus_sft"]


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def mean_of(seeds: list[dict[str, Any]]) -> dict[str, float]:
    keys = ("sft_exact_match", "ppo_exact_match", "improvement", "ppo_f1")
    out = {k: round(statistics.fmean(s[k] for s in seeds), 4) for k in keys}
    out["ppo_citation_support"] = round(statistics.fmean(s["citation_support"]["ppo"] for s in seeds), 4)
    evs = [
        s["explained_variance_2nd_half"] for s in seeds if s.get("explained_variance_2nd_half") is not None
    ]
    if evs:
        out["explained_variance_2nd_half"] = round(statistics.fmean(evs), 4)
    return out


def plot(seeds: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, (curves, bars) = plt.subplots(1, 2, figsize=(11, 4))
    for s in seeds:
        steps, em = zip(*s["dev_curve"], strict=True) if s["dev_curve"] else ((), ())
        curves.plot(steps, em, marker="o", label=f"seed {s['seed']}")
    curves.set(xlabel="PPO step", ylabel="dev exact match", title="dev exact match during PPO", ylim=(0, 1))
    curves.legend()
    width = 0.38
    for i, s in enumerate(seeds):
        for offset, stage, color in ((-width / 2, "sft", "tab:gray"), (width / 2, "ppo", "tab:blue")):
            value = s[f"{stage}_exact_match"]
            low, high = s[f"{stage}_exact_match_ci95"]
            bars.bar(i + offset, value, width, color=color, label=stage.upper() if i == 0 else None)
            bars.errorbar(i + offset, value, yerr=[[value - low], [high - value]], color="black", capsize=3)
    bars.set_xticks(range(len(seeds)), [f"seed {s['seed']}" for s in seeds])
    bars.set(ylabel="hidden-test exact match (95% CI)", title="SFT warm start → PPO, per seed", ylim=(0, 1))
    bars.legend()
    save_figure(fig, path)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", nargs="+", required=True, type=Path, help="Finished demo directories.")
    parser.add_argument("--json", required=True, type=Path, help="Where to write the per-seed table.")
    parser.add_argument("--plot", required=True, type=Path, help="Where to write the 2-panel PNG.")
    args = parser.parse_args(argv)
    seeds = [seed_figures(run) for run in args.run]
    write_json(args.json, {"seeds": seeds, "mean": mean_of(seeds)})
    plot(seeds, args.plot)
    for s in seeds:
        print(
            f"seed {s['seed']}: SFT {s['sft_exact_match']:.2f} -> PPO {s['ppo_exact_match']:.2f} "
            f"(citation {s['citation_support']['ppo']:.2f}, audit {s.get('audit_verdict', 'not run')}, "
            f"KL last {s['kl_last']}, gap {s['logprob_gap_max']}, EV 2nd half {s['explained_variance_2nd_half']})"
        )
    print("mean:", mean_of(seeds))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
