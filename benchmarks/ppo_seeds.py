"""A PPO recipe across seeds, chosen on the dev split: the demo's PPO stage from each seed's warm start.

Issue 25 asks the demo to learn on every seed. A recipe (PPOConfig changes, `--set FIELD=VALUE`) is judged
here on the dev split only: from each finished `searchrl demo --seed N` directory (its data, index and SFT
warm start), the demo's PPO stage is rerun with the recipe, its own dev evaluation every `eval_steps` on
`--dev-questions` dev questions (greedy at `eval_temperature`, as the demo), and the figures the issue
names are read back from the run: the dev exact-match curve (step 0 is the warm start), the critic's
explained variance (mean over the second half of training, against the critic's targets and against
Monte-Carlo returns), the KL, the clip fraction and whether the collapse guard rolled back. The hidden test
split is not read: the chosen recipe is then run as `searchrl demo` itself, whose test figures the README
reports (`benchmarks/demo_seeds.py`).

    .venv/bin/python benchmarks/ppo_seeds.py --runs runs/s0 runs/s1 ... --label recipe-a \\
        --set value_lam=1.0 --set value_replay_steps=2 --json runs/ppo_seeds/recipe-a.json --jobs 2

Each seed's PPO run is a job under `--work-dir/<label>/seed-N` (reused when it finished with the same spec
and warm start, so a killed sweep continues); `--jobs 2` runs two at once, one torch thread each.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _experiment_common import (  # noqa: E402
    curve,
    load_backend,
    load_demo_run,
    parse_set,
    ppo_args,
    read_evals,
    read_metrics,
    run_jobs,
    threads_per_job,
    train_from_warm_start,
    warm_start_id,
    worker_main,
    write_json,
)

from searchrl.evaluation.plots import second_half_mean  # noqa: E402
from searchrl.run.reader import RunReader  # noqa: E402


def run_seed(spec: dict[str, Any]) -> dict[str, Any]:
    """One seed: the demo's PPO stage with the recipe, evaluated on dev; the figures read back from the run."""
    run = load_demo_run(spec["run"])
    dev_rows = run.dev_rows[: spec["dev_questions"]]
    args = ppo_args(
        run,
        Path(spec["out_dir"]) / "ppo",
        seed=run.config.seed,
        episodes=spec["episodes"],
        keep_guard=True,  # the demo's guard stays on: the recipe must work as the demo runs it
        eval_on_start=True,
        num_eval_questions=len(dev_rows),
        **spec["overrides"],
    )
    train_from_warm_start(run, args, load_backend(run), eval_rows=dev_rows)
    rows = read_metrics(args.output_dir)
    steps = [r for r in rows if "objective/kl" in r]
    evals = read_evals(args.output_dir)

    def mean_of(key: str, of: list[dict[str, Any]]) -> float | None:
        values = [float(r[key]) for r in of if isinstance(r.get(key), int | float) and r[key] == r[key]]
        return round(statistics.fmean(values), 4) if values else None

    return {
        "seed": run.config.seed,
        "dev_exact_match": curve(evals, "eval/exact_match"),
        "dev_steps": [e.get("step") for e in evals],
        "dev_start": evals[0]["eval/exact_match"] if evals else None,
        "dev_final": evals[-1]["eval/exact_match"] if evals else None,
        "explained_variance_2nd_half": _rounded(second_half_mean(steps, "val/explained_variance")),
        "explained_variance_mc_2nd_half": _rounded(second_half_mean(steps, "val/explained_variance_mc")),
        "explained_variance": curve(steps, "val/explained_variance_mc"),
        "kl_mean": mean_of("objective/kl", steps),
        "clipfrac_mean": mean_of("policy/clipfrac_avg", steps),
        "rollbacks": len(RunReader(args.output_dir).rollbacks()),
        "train_seconds": steps[-1].get("time/train_s") if steps else None,
    }


def _rounded(value: float | None) -> float | None:
    return None if value is None else round(value, 4)


def main(argv: list[str]) -> None:
    if worker_main(argv, run_seed):
        return
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs", nargs="+", required=True, help="Finished demo directories, one per seed.")
    p.add_argument("--label", required=True, help="The recipe's name (its folder under --work-dir).")
    p.add_argument("--set", dest="set_", action="append", default=[], metavar="FIELD=VALUE",
                   help="A PPOConfig change of the recipe (repeatable).")  # fmt: skip
    p.add_argument("--json", required=True, help="Where to write the per-seed figures and their summary.")
    p.add_argument("--work-dir", default="runs/ppo_seeds", help="Where the PPO runs go.")
    p.add_argument("--episodes", type=int, default=None, help="total_episodes (default: the demo's).")
    p.add_argument("--dev-questions", type=int, default=100, help="Dev questions of every evaluation.")
    p.add_argument("--jobs", type=int, default=2, help="Seeds trained at once (worker processes).")
    p.add_argument("--threads", type=int, default=2, help="torch threads in total.")
    p.add_argument("--fresh", action="store_true", help="Rerun jobs that finished with the same spec.")
    a = p.parse_args(argv)
    overrides = parse_set(a.set_)
    specs = []
    for run_dir in a.runs:
        run = load_demo_run(run_dir)
        specs.append(
            {
                "name": f"{a.label} seed {run.config.seed}",
                "run": str(run_dir),
                "warm_start": warm_start_id(run),
                "out_dir": str(Path(a.work_dir) / a.label / f"seed-{run.config.seed}"),
                "overrides": overrides,
                "episodes": a.episodes,
                "dev_questions": a.dev_questions,
                "threads": threads_per_job(a.threads, a.jobs),
            }
        )
    results = run_jobs(specs, run_seed, __file__, a.jobs, reuse=not a.fresh)
    finals = [r["dev_final"] for r in results if r["dev_final"] is not None]
    gains = [r["dev_final"] - r["dev_start"] for r in results if r["dev_final"] is not None]
    evs = [
        r["explained_variance_mc_2nd_half"]
        for r in results
        if r["explained_variance_mc_2nd_half"] is not None
    ]
    summary = {
        "label": a.label,
        "overrides": overrides,
        "seeds": [r["seed"] for r in results],
        "dev_final_mean": round(statistics.fmean(finals), 4) if finals else None,
        "dev_final_min": min(finals) if finals else None,
        "dev_gain_min": round(min(gains), 4) if gains else None,
        "explained_variance_mc_2nd_half_min": min(evs) if evs else None,
    }
    write_json(a.json, {"summary": summary, "results": results})
    for r in results:
        print(
            f"seed {r['seed']}: dev {r['dev_start']:.2f} -> {r['dev_final']:.2f} "
            f"EV(2nd half) {r['explained_variance_mc_2nd_half']} KL {r['kl_mean']} clip {r['clipfrac_mean']} "
            f"rollbacks {r['rollbacks']} train {r['train_seconds']} s"
        )
    print(summary)


if __name__ == "__main__":
    main(sys.argv[1:])
