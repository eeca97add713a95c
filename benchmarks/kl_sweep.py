"""How to set the KL coefficient: the demo's PPO stage once per `kl_coef`, everything else equal (issue 6).

From a finished `searchrl demo` run directory (its data, index, SFT warm start and `demo_config.yaml`)
this reruns the demo's PPO stage once per setting: fixed `kl_coef` values (default 0, 0.01, 0.05, 0.2)
and `adaptive`, Ziegler et al.'s controller (`kl_target`, `kl_horizon`, starting at `--adaptive-init`).
The runs share the warm start, the training questions, the seed, the sampling seeds and every other
PPO setting; only the KL penalty differs. Over the steps it records, from the trainer's own logs:

- hidden-split (test) exact match: `PPOTrainer.evaluate` every `eval_steps` steps with `eval_dataset` =
  the demo's test questions (its periodic evaluation, near-greedy at `eval_temperature`), plus once
  before the first update (step 0, the warm start) and once after the last step if that step was not
  an evaluation step. The test split is only measured here: nothing is chosen from it (the final
  values are the last step's, not the best);
- KL to the reference (`objective/kl`: per trajectory, summed over action tokens, batch mean), the
  coefficient used in the step's rewards (`kl_coef`) and the updated one (`kl_coef_next`), entropy
  (`objective/entropy`, summed over action tokens; and per token), answer length in words, the score.

It writes one JSON (per setting: the curves and the final values) and one PNG with four panels (EM,
KL, entropy, answer length against the step; one line per setting).

    .venv/bin/python benchmarks/kl_sweep.py --run runs/demo --json runs/kl_sweep.json \\
        --plot runs/kl_sweep.png [--kl 0 0.01 0.05 0.2 adaptive] [--episodes N] [--seed S] [--jobs 5]

Each setting is one PPO run directory under `--work-dir` (default `RUN/experiments/kl_sweep/`);
a run that finished with the same settings (and the same warm start) is reused, so a killed sweep
continues where it stopped (`--fresh` reruns everything). `--jobs N` runs N settings at once in
worker processes with `--threads / N` torch threads each: the settings are independent, so on a
machine with enough cores the sweep takes about as long as one run.

The collapse guard is off unless `--keep-guard`: its rollbacks would undo exactly the drift that a
too-small coefficient causes, and the sweep is there to see it.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from _experiment_common import (  # noqa: E402
    add_run_arguments,
    curve,
    load_backend,
    load_demo_run,
    parse_set,
    ppo_args,
    pyplot,
    read_evals,
    read_metrics,
    run_jobs,
    save_figure,
    threads_per_job,
    train_from_warm_start,
    warm_start_id,
    worker_main,
    write_json,
)

DEFAULT_KL = ("0", "0.01", "0.05", "0.2", "adaptive")
DEFAULT_ADAPTIVE_INIT = 0.05  # TRL 1.12's default kl_coef, the middle of the fixed sweep
DEFAULT_KL_TARGET = 3.0  # nats per trajectory (summed over action tokens); see --kl-target's help

# Training-log keys of the curves: JSON name -> metrics.jsonl name (TRL 1.12's names where they exist).
TRAIN_CURVES = {
    "kl": "objective/kl",
    "kl_coef": "kl_coef",
    "kl_coef_next": "kl_coef_next",
    "entropy": "objective/entropy",
    "entropy_per_token": "objective/entropy_per_token",
    "answer_length": "answer/length_words",
    "score": "objective/scores",
    "non_score_reward": "objective/non_score_reward",
}
EVAL_CURVES = {
    "exact_match": "eval/exact_match",
    "f1": "eval/f1",
    "searches_per_question": "eval/searches_per_question",
}


@dataclass
class Setting:
    """One KL configuration of the sweep."""

    name: str
    kl_coef: float
    kl_target: float | None = None
    kl_horizon: float | None = None

    @property
    def adaptive(self) -> bool:
        return self.kl_target is not None


def parse_settings(
    values: Sequence[str], adaptive_init: float, kl_target: float, kl_horizon: float
) -> list[Setting]:
    """`["0", "0.05", "adaptive"]` -> settings; a bad value raises ValueError saying what is allowed."""
    if not values:
        raise ValueError("--kl: give at least one setting, e.g. --kl 0 0.05 adaptive")
    settings: list[Setting] = []
    for value in values:
        if str(value).strip().lower() == "adaptive":
            settings.append(Setting("adaptive", adaptive_init, kl_target, kl_horizon))
            continue
        try:
            coef = float(value)
        except ValueError:
            raise ValueError(
                f"--kl {value!r}: each setting is a coefficient >= 0 (e.g. 0.05) or the word 'adaptive'"
            ) from None
        if not math.isfinite(coef) or coef < 0:
            raise ValueError(f"--kl {value!r}: a fixed KL coefficient must be a finite number >= 0")
        settings.append(Setting(f"{coef:g}", coef))
    names = [s.name for s in settings]
    if len(set(names)) != len(names):
        raise ValueError(f"--kl {list(values)}: a setting appears twice ({names})")
    return settings


# ---------------------------------------------------------------------------------------------------
# one setting = one PPO run (in this process or in a worker process)
# ---------------------------------------------------------------------------------------------------
def run_setting(spec: dict[str, Any]) -> dict[str, Any]:
    """Train one setting from the warm start, evaluating on the test rows at step 0, every eval_steps and
    at the end; the curves are read back from the run directory afterwards."""
    run = load_demo_run(spec["run"], spec["overrides"])
    eval_rows = run.test_rows[: spec["eval_questions"]]
    changes: dict[str, Any] = {
        "kl_coef": spec["kl_coef"],
        "kl_target": spec["kl_target"],
        "eval_steps": spec["eval_steps"],
        "num_eval_questions": len(eval_rows),
    }
    if spec["kl_horizon"] is not None:
        changes["kl_horizon"] = spec["kl_horizon"]
    args = ppo_args(
        run,
        Path(spec["out_dir"]),
        spec["seed"],
        spec["episodes"],
        keep_guard=spec["keep_guard"],
        save_trajectories=spec["save_trajectories"],
        **changes,
    )
    backend = load_backend(run)
    # Step 0: the warm start itself, measured by the same trainer code on the same rows and seeds.
    trainer = train_from_warm_start(run, args, backend, eval_rows, before_train=lambda t: t.evaluate())
    if trainer.global_step % args.eval_steps != 0:
        trainer.evaluate()  # the last step, so every setting ends on a measured point
    return {
        "steps": trainer.global_step,
        "episodes": trainer.episode,
        "batch_size": args.batch_size,
        "kl_controller": trainer.kl_ctl.state_dict(),
    }


def _summarise_setting(setting: Setting, spec: dict[str, Any], result: dict[str, Any]) -> dict[str, Any]:
    out_dir = Path(spec["out_dir"])
    rows = read_metrics(out_dir)
    evals = read_evals(out_dir)
    curves: dict[str, Any] = {"step": [int(r["step"]) for r in rows]}
    curves.update({name: curve(rows, key) for name, key in TRAIN_CURVES.items()})
    eval_curve: dict[str, Any] = {"step": [int(e["step"]) for e in evals]}
    eval_curve.update({name: curve(evals, key) for name, key in EVAL_CURVES.items()})
    last, last_eval = rows[-1], evals[-1]
    final = {name: curves[name][-1] for name in TRAIN_CURVES}
    final.update({name: eval_curve[name][-1] for name in EVAL_CURVES})
    final["step"] = int(last["step"])
    final["eval_step"] = int(last_eval["step"])
    return {
        "kl_coef": setting.kl_coef,
        "adaptive": setting.adaptive,
        "kl_target": setting.kl_target,
        "kl_horizon": setting.kl_horizon,
        "curves": curves,
        "eval": eval_curve,
        "final": final,
        "max_kl": max(v for v in curves["kl"] if v is not None),
        "steps": result["steps"],
        "episodes": result["episodes"],
        "kl_controller": result["kl_controller"],
        "wall_seconds": result.get("wall_seconds"),
        "run_dir": str(out_dir),
    }


# ---------------------------------------------------------------------------------------------------
# the plot
# ---------------------------------------------------------------------------------------------------
def plot(payload: dict[str, Any], path: str | Path) -> None:
    plt = pyplot()
    fig, axes = plt.subplots(2, 2, figsize=(11, 7.5))
    panels = [
        (axes[0][0], "eval", "exact_match", "test exact match (PPOTrainer.evaluate)"),
        (axes[0][1], "curves", "kl", "KL to the reference (nats / trajectory)"),
        (axes[1][0], "curves", "entropy", "entropy (nats / trajectory, action tokens)"),
        (axes[1][1], "curves", "answer_length", "answer length (words)"),
    ]
    for name in payload["settings_order"]:
        setting = payload["settings"][name]
        label = (
            f"adaptive (init {setting['kl_coef']:g}, target {setting['kl_target']:g})"
            if setting["adaptive"]
            else f"kl_coef = {name}"
        )
        for ax, block, key, _ in panels:
            xs, ys = setting[block]["step"], setting[block][key]
            points = [(x, y) for x, y in zip(xs, ys, strict=True) if y is not None]
            ax.plot([p[0] for p in points], [p[1] for p in points], marker="o", markersize=3, label=label)
    for ax, _, _, title in panels:
        ax.set_title(title, fontsize=10)
        ax.set_xlabel("PPO step")
        ax.xaxis.get_major_locator().set_params(integer=True)
        ax.grid(alpha=0.3)
    axes[0][0].legend(fontsize=8)
    title = (
        f"KL coefficient sweep: {payload['steps']} PPO steps x {payload['batch_size']} episodes, "
        f"seed {payload['seed']}, {payload['evaluation']['questions']} test questions"
    )
    save_figure(fig, path, suptitle=title)


# ---------------------------------------------------------------------------------------------------
# main
# ---------------------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="kl_sweep.py",
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawTextHelpFormatter,
    )
    add_run_arguments(
        p,
        experiment="kl_sweep",
        unit="setting",
        plot_help="Where to write the 4-panel PNG.",
        guard_help="Keep the demo's collapse guard (off by default, see above).",
        fresh_help="Rerun settings even if a finished run with the same settings exists.",
    )
    p.add_argument(
        "--kl", nargs="+", default=list(DEFAULT_KL), help="Settings: coefficients >= 0 and/or 'adaptive'."
    )
    p.add_argument(
        "--episodes",
        type=int,
        default=None,
        help="Training episodes per setting (default: the demo's total_episodes).",
    )
    p.add_argument(
        "--seed", type=int, default=None, help="PPO seed of every setting (default: the demo's seed)."
    )
    p.add_argument(
        "--adaptive-init",
        type=float,
        default=DEFAULT_ADAPTIVE_INIT,
        help="Initial coefficient of 'adaptive'.",
    )
    p.add_argument(
        "--kl-target",
        type=float,
        default=None,
        help=f"Adaptive target in nats per trajectory, summed over action tokens (default: the demo's kl_target, "
        f"else {DEFAULT_KL_TARGET:g}); read the fixed runs' KL curves to pick it.",
    )
    p.add_argument(
        "--kl-horizon",
        type=float,
        default=None,
        help="Adaptive horizon in episodes (default: max(0.2 * episodes, batch size), so the coefficient can move "
        "by up to a factor of about e over the run; TRL's 10000 would barely move it in a demo-sized run).",
    )
    p.add_argument(
        "--eval-steps",
        type=int,
        default=None,
        help="Evaluate every N steps (default: the demo's eval_steps).",
    )
    p.add_argument(
        "--eval-questions",
        type=int,
        default=None,
        help="Test questions per evaluation (default: all of the demo's).",
    )
    return p  # fmt: skip


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the sweep; returns the JSON payload (also written to --json, the plot to --plot)."""
    t0 = time.perf_counter()
    a = build_parser().parse_args(argv)
    overrides = parse_set(a.set_)
    run = load_demo_run(a.run, overrides)
    for flag, value in (
        ("--eval-steps", a.eval_steps),
        ("--eval-questions", a.eval_questions),
        ("--jobs", a.jobs),
    ):
        if value is not None and value < 1:
            raise ValueError(f"{flag} {value}: must be >= 1")  # fmt: skip
    base = run.config.ppo_config()
    seed = run.config.seed if a.seed is None else a.seed
    probe = ppo_args(run, "unused", seed, a.episodes).finalize(num_train_rows=len(run.train_rows))
    total, batch = int(probe.total_episodes), int(probe.batch_size)
    kl_target = a.kl_target if a.kl_target is not None else (base.kl_target or DEFAULT_KL_TARGET)
    kl_horizon = a.kl_horizon if a.kl_horizon is not None else max(0.2 * total, float(batch))
    if kl_target <= 0 or kl_horizon < batch:
        raise ValueError(
            f"--kl-target {kl_target:g} must be > 0 and --kl-horizon {kl_horizon:g} at least one batch ({batch} "
            "episodes): the adaptive controller refuses a horizon shorter than the batch it measures"
        )
    if a.adaptive_init <= 0:
        raise ValueError(
            f"--adaptive-init {a.adaptive_init:g}: the adaptive controller needs a coefficient > 0"
        )
    settings = parse_settings(a.kl, a.adaptive_init, kl_target, kl_horizon)
    eval_questions = min(a.eval_questions or len(run.test_rows), len(run.test_rows))
    eval_steps = a.eval_steps or base.eval_steps
    threads = a.threads or run.config.num_threads
    work = Path(a.work_dir) if a.work_dir else run.run_dir / "experiments" / "kl_sweep"
    jobs = min(a.jobs, len(settings))
    specs = [
        {
            "name": f"kl={s.name}",
            "out_dir": str(work / f"kl-{s.name}"),
            "threads": threads_per_job(threads, jobs),
            "run": str(run.run_dir),
            "warm_start": warm_start_id(run),
            "overrides": overrides,
            "seed": seed,
            "episodes": a.episodes,
            "kl_coef": s.kl_coef,
            "kl_target": s.kl_target,
            "kl_horizon": s.kl_horizon,
            "eval_steps": eval_steps,
            "eval_questions": eval_questions,
            "keep_guard": bool(a.keep_guard),
            "save_trajectories": bool(a.save_trajectories),
        }
        for s in settings
    ]
    log = lambda msg: print(f"[kl_sweep] {msg}", file=sys.stderr, flush=True)  # noqa: E731
    results = run_jobs(specs, run_setting, __file__, jobs, reuse=not a.fresh, log=log)
    summaries = {
        s.name: _summarise_setting(s, spec, result)
        for s, spec, result in zip(settings, specs, results, strict=True)
    }
    payload: dict[str, Any] = {
        "experiment": "kl_sweep",
        "run": str(run.run_dir),
        "warm_start": str(run.policy_dir),
        "seed": seed,
        "episodes": total,
        "batch_size": batch,
        "steps": max(s["steps"] for s in summaries.values()),
        "eval_steps": eval_steps,
        "settings_order": [s.name for s in settings],
        "evaluation": {
            "split": "test",
            "questions": eval_questions,
            "how": "PPOTrainer.evaluate with eval_dataset = the demo's test rows, every eval_steps steps, plus "
            "step 0 (before the first update) and the last step; sampling at eval_temperature "
            f"{base.eval_temperature:g} with fixed seeds",
            "used_for_selection": False,
            "final_values": "the last step's (not the best step's)",
        },
        "adaptive": {
            "init_kl_coef": a.adaptive_init,
            "kl_target": kl_target,
            "kl_horizon": kl_horizon,
            "rule": "error = clip(kl / target - 1, -0.2, 0.2); kl_coef *= 1 + error * batch_episodes / horizon",
        },
        "kl_unit": "objective/kl: per trajectory, summed over action tokens, batch mean (nats)",
        "kl_estimator": base.kl_estimator,
        "collapse_guard": bool(base.collapse_guard and a.keep_guard),
        "ppo_overrides": overrides,
        "settings": summaries,
        "wall_seconds": round(time.perf_counter() - t0, 1),
    }
    write_json(a.json, payload)
    plot(payload, a.plot)
    return payload


if __name__ == "__main__":
    if worker_main(sys.argv[1:], run_setting):
        sys.exit(0)
    try:
        out = main()
    except (ValueError, FileNotFoundError) as e:  # ConfigError is a ValueError
        print(f"kl_sweep.py: error: {e}", file=sys.stderr)
        sys.exit(2)
    print({name: s["final"] for name, s in out["settings"].items()})
