"""PPO against GRPO (TRL's tool loop, and our rollout engine) from one SFT warm start, on equal budgets.

Is PPO's critic worth it on this task? From a finished demo run (`searchrl demo --out RUN`: its data,
BM25 index and SFT warm start `RUN/sft/policy`), this trains three policies one after another:

- `ppo`: the demo's PPO stage (`searchrl.demo.pipeline`'s `PPOTrainer`, critic from the SFT backbone);
- `grpo_trl_loop`: TRL 1.16's GRPOTrainer with its own tool loop over our environment;
- `grpo_our_rollout`: the same GRPOTrainer with our batched engine as `rollout_func`;

each from the same SFT weights, with the same environment, rollout limits, sampling, episodes per
optimizer step, learning rate and episode budget (`--episodes N`; `--grpo-episodes M` gives the GRPO
trainers a budget of their own, for a comparison at equal wall-clock rather than equal episodes): GRPO copies
the sections it shares with the demo's `PPOConfig` (`searchrl.grpo.warm_start.train_grpo_from_warm_start`).
During training each one evaluates on the dev split at step 0, every `eval_steps` steps and at its last
step (greedy, our engine, `RUN/eval/step-N.json`); at the end each final policy is evaluated once on the
hidden test split with `searchrl.evaluation.loop.evaluate_with_ppo_limits` (bootstrap 95% intervals),
as the demo evaluates PPO.

The x axes are `episode` and `time/train_s` (wall-clock minus evaluation time): a trainer is not charged
for being evaluated. Both trainers write these fields into their eval files themselves. The trainers
run one after another, never in parallel, so that they share the machine on equal terms; the collapse
guard is off for PPO (GRPO has none), as in the KL-sweep experiment.

Writes `--json OUT` (per trainer: the dev curve, the final dev and test EM, wall-clock, episodes,
seconds per step), `--plot PNG` (default OUT with .png: dev EM against training seconds and against
episodes) and `WORK/report.html` (the report's trainers-side-by-side section).

Run: `python benchmarks/compare_trainers.py --run runs/demo --json OUT.json --episodes 640`.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import shutil
import sys
import time
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
warnings.filterwarnings("ignore")
sys.path.insert(0, str(Path(__file__).resolve().parent))  # _experiment_common, when run as a script

from _experiment_common import (  # noqa: E402
    DemoRun,
    load_backend,
    load_demo_run,
    ppo_args,
    pyplot,
    save_figure,
    set_threads,
    train_from_warm_start,
    write_json,
)

from searchrl.evaluation.compare import TrainerCurve, read_trainer_curve  # noqa: E402
from searchrl.evaluation.report import write_report  # noqa: E402
from searchrl.ppo.config import PPOConfig  # noqa: E402
from searchrl.run.writer import write_evaluation  # noqa: E402

# name -> (label in plots and report, GRPO mode or None for PPO)
TRAINERS: dict[str, tuple[str, str | None]] = {
    "ppo": ("PPO", None),
    "grpo_trl_loop": ("GRPO (TRL loop)", "trl_loop"),
    "grpo_our_rollout": ("GRPO (our rollout)", "our_rollout"),
}
TEST_FILE = "test-final.json"


# ---------------------------------------------------------------------------------------------------
# PPO: the demo's stage; PPOTrainer writes episode, time/train_s and the step-0 point itself
# ---------------------------------------------------------------------------------------------------
def train_ppo(run: DemoRun, args: PPOConfig, backend: Any) -> Any:
    """The demo's PPO stage from the warm start; dev evaluation at step 0, every eval_steps and at the end."""
    args = dataclasses.replace(args, eval_on_start=True)
    trainer = train_from_warm_start(run, args, backend, run.dev_rows)
    if not trainer.run.eval_file(trainer.global_step).exists():
        trainer.evaluate()  # the last step, so every trainer ends on a measured point
    return trainer


# ---------------------------------------------------------------------------------------------------
# one trainer end to end: train, then the hidden test split
# ---------------------------------------------------------------------------------------------------
def test_split(policy: Any, tok: Any, run: DemoRun, args: PPOConfig, env_factory: Any, rubric: Any) -> dict:
    """The demo's test evaluation (greedy, PPO's rollout limits, bootstrap CIs) of a final policy."""
    from searchrl.evaluation.loop import evaluate_with_ppo_limits

    result = evaluate_with_ppo_limits(
        policy, tok, run.test_rows, env_factory, args, rubric=rubric, seed=run.config.seed
    )
    return result.summary


def run_trainer(name: str, run: DemoRun, args: PPOConfig, backend: Any, out_dir: Path) -> dict[str, Any]:
    """Train `name` into `out_dir` (fresh), evaluate its final policy on test; the trainer's JSON entry."""
    from searchrl.env.environment import SearchEnvironment
    from searchrl.grpo.warm_start import final_policy_dir, train_grpo_from_warm_start
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.rewards.combine import default_rubric

    label, mode = TRAINERS[name]
    if out_dir.exists():
        shutil.rmtree(out_dir)  # a run of its own: no lines or eval files from an earlier one
    tok = load_tokenizer(run.policy_dir)
    rubric = default_rubric()
    env_config = args.env_config()

    def env_factory() -> SearchEnvironment:
        return SearchEnvironment(backend, env_config, tokenizer=tok)

    t0 = time.perf_counter()
    if mode is None:
        trainer = train_ppo(run, dataclasses.replace(args, output_dir=str(out_dir)), backend)
        policy = trainer.policy
    else:
        run_dir = train_grpo_from_warm_start(
            run.policy_dir,
            tok,
            run.train_rows,
            run.dev_rows,
            backend,
            rubric,
            mode=mode,
            total_episodes=int(args.total_episodes),
            out_dir=out_dir,
            ppo_config=args,
        )
        policy = load_policy(final_policy_dir(run_dir))
    wall = time.perf_counter() - t0
    summary = test_split(policy, tok, run, args, env_factory, rubric)
    write_evaluation(out_dir / "eval" / TEST_FILE, {"split": "test", "trainer": name, **summary})
    curve = read_trainer_curve(label, out_dir)
    return entry(name, curve, summary, wall)


def entry(name: str, curve: TrainerCurve, test: dict[str, Any], wall: float) -> dict[str, Any]:
    return {
        "label": curve.label,
        "run_dir": str(curve.run_dir),
        "curve": {
            "step": curve.steps,
            "episode": curve.episodes,
            "train_s": curve.train_s,
            "dev_exact_match": curve.exact_match,
        },
        "final": {
            "dev_exact_match": curve.final_exact_match,
            "test_exact_match": test.get("exact_match"),
            "test_exact_match_ci95": (test.get("ci95") or {}).get("exact_match"),
            "test_f1": test.get("f1"),
            "test_searches_per_question": test.get("searches_per_question"),
            "test_n": test.get("n"),
            "steps": curve.final_step,
            "episodes": curve.final_episodes,
            "train_s": curve.final_train_s,
            "seconds_per_step": curve.seconds_per_step,
            "wall_seconds": wall,
        },
    }


# ---------------------------------------------------------------------------------------------------
# the figure
# ---------------------------------------------------------------------------------------------------
def budget_title(episodes: int, grpo_episodes: int) -> str:
    if episodes == grpo_episodes:
        return f"{episodes} episodes each"
    return f"PPO {episodes} episodes, GRPO {grpo_episodes} episodes"


def plot(results: dict[str, dict[str, Any]], path: Path, budget: str) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for r in results.values():
        c = r["curve"]
        test = r["final"]["test_exact_match"]
        label = r["label"] + ("" if test is None else f" (test EM {test:.3f})")
        for ax, key in ((axes[0], "train_s"), (axes[1], "episode")):
            pts = [(x, y) for x, y in zip(c[key], c["dev_exact_match"], strict=True) if x is not None]
            if pts:
                ax.plot([p[0] for p in pts], [p[1] for p in pts], marker="o", markersize=3, label=label)
    for ax, xlabel in ((axes[0], "training wall-clock (s, evaluation excluded)"), (axes[1], "episodes")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("dev exact match")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(f"PPO against GRPO from one SFT warm start, {budget}")
    save_figure(fig, path)


def torch_threads() -> int:
    import torch

    return torch.get_num_threads()


# ---------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------
def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--run", required=True, help="A finished demo run directory (searchrl demo --out RUN).")
    p.add_argument("--json", required=True, help="Where to write the results JSON.")
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="Episode budget of every trainer (default: the demo PPO stage's total_episodes).",
    )
    p.add_argument(
        "--grpo-episodes",
        type=int,
        default=None,
        help="Episode budget of the GRPO trainers only (default: --episodes). For an equal wall-clock "
        "comparison give GRPO the episodes that fit PPO's training seconds (docs/grpo.md: PPO against GRPO).",
    )
    p.add_argument("--plot", default=None, help="The figure (PNG; default: the JSON path with .png).")
    p.add_argument(
        "--trainers",
        nargs="+",
        default=list(TRAINERS),
        choices=list(TRAINERS),
        help="Which trainers to run (default: all three).",
    )
    p.add_argument(
        "--work-dir", default=None, help="Where the runs go (default RUN/experiments/compare_trainers)."
    )
    p.add_argument(
        "--threads", type=int, default=None, help="torch threads (default: the demo's num_threads)."
    )
    p.add_argument("--seed", type=int, default=None, help="Seed of every trainer (default: the demo's).")
    args = p.parse_args(argv)
    for flag, value in (("--episodes", args.episodes), ("--grpo-episodes", args.grpo_episodes)):
        if value is not None and value < 1:
            p.error(f"{flag} {value}: must be >= 1")
    return args


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    a = parse_args(argv)
    run = load_demo_run(a.run)
    work = Path(a.work_dir) if a.work_dir else run.run_dir / "experiments" / "compare_trainers"
    set_threads(a.threads if a.threads is not None else run.config.num_threads)
    seed = run.config.seed if a.seed is None else a.seed
    args = ppo_args(run, work / "ppo", seed=seed, episodes=a.episodes)
    episodes = int(args.total_episodes)
    grpo_episodes = episodes if a.grpo_episodes is None else a.grpo_episodes
    budgets = {name: episodes if TRAINERS[name][1] is None else grpo_episodes for name in a.trainers}
    backend = load_backend(run)
    results: dict[str, dict[str, Any]] = {}
    for name in a.trainers:
        print(f"[compare] {name}: {budgets[name]} episodes -> {work / name}", flush=True)
        trainer_args = dataclasses.replace(args, total_episodes=budgets[name])
        results[name] = run_trainer(name, run, trainer_args, backend, work / name)
        f = results[name]["final"]
        print(
            f"[compare] {name}: test EM {f['test_exact_match']:.3f}, dev EM {f['dev_exact_match']:.3f}, "
            f"{f['wall_seconds']:.1f} s wall (training and evaluation)",
            flush=True,
        )
    plot_path = Path(a.plot) if a.plot else Path(a.json).with_suffix(".png")
    plot(results, plot_path, budget_title(episodes, grpo_episodes))
    compare = {results[n]["label"]: Path(results[n]["run_dir"]) for n in results}
    report = write_report(
        Path(results[a.trainers[0]]["run_dir"]),
        out=work / "report.html",
        compare=compare,
        title="PPO against GRPO",
        num_trajectories=0,
    )
    payload = {
        "run": str(run.run_dir),
        "episodes": episodes,
        "grpo_episodes": grpo_episodes,
        "seed": seed,
        "trainers_order": list(results),
        "trainers": results,
        "settings": {
            "episodes_per_step": args.per_device_train_batch_size * args.gradient_accumulation_steps,
            "learning_rate": args.learning_rate,
            "eval_steps": args.eval_steps,
            "num_eval_questions": args.num_eval_questions,
            "test_questions": len(run.test_rows),
            "train_questions": len(run.train_rows),
            "env": dataclasses.asdict(args.env_config()),
            "generation": dataclasses.asdict(args.generation_config()),
            "ppo_collapse_guard": args.collapse_guard,
        },
        "how": "each trainer from RUN/sft/policy in turn on this machine; dev EM from RUN/eval/step-N.json "
        "(greedy, our engine), test EM from evaluate_policy on the demo's test rows at the end; train_s = "
        "wall-clock minus evaluation time",
        "plot": str(plot_path),
        "report": str(report),
        "machine": {
            "python": platform.python_version(),
            "cpus": os.cpu_count(),
            "torch_threads": torch_threads(),
            "load_average_1m": os.getloadavg()[0],
        },
    }
    write_json(a.json, payload)
    print(f"[compare] wrote {a.json}, {plot_path} and {report}", flush=True)
    return payload


if __name__ == "__main__":
    main()
