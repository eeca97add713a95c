"""Which levers make the real loop learn: PPO variants from one SFT warm start, measured on the DEV split only.

Issue 25 asks which levers matter for SmolLM2 on HotpotQA + SQuAD (`searchrl demo --config
configs/demo_real.yaml`): the reward (F1, exact match, staged, a retrieval term), PPO's batch, steps and
learning rates, the KL, LoRA or a full fine-tune, bf16 or float32, truncated importance sampling, more
demonstrations, the model. This script runs the real loop's warm start (import, data, index, expert
demonstrations, SFT: `searchrl.demo.real`) once per distinct warm-start setting, evaluates the SFT policy on
`--dev-questions` dev questions, then each lever's PPO stage from that SFT policy with its own dev evaluation
every `--eval-steps` steps on `--curve-questions` dev questions (the learning curve, step 0 is the warm
start), and finally the PPO policy on the same `--dev-questions` dev questions, compared with its SFT policy
question by question (paired bootstrap, `searchrl.evaluation.statistics.paired_comparison`). The test split
is never read: choose here, then run the demo itself for the test figures.

    .venv/bin/python benchmarks/real_levers.py --config configs/demo_real.yaml --seed 0 \\
        --work-dir runs/real-levers --json docs/figures/real_levers.json --plot docs/figures/real_levers_dev_f1.png
    .venv/bin/python benchmarks/real_levers.py --warm runs/demo-real ...   # reuse a finished demo's SFT policy
    .venv/bin/python benchmarks/real_levers.py ... --levers recipe reward_staged lr_1e-4 --lever-file more.yaml

A lever is `{warm: {...}, ppo: {...}, note: "..."}`: dotted `RealDemoConfig` keys; `warm` changes the warm start
too (it gets its own SFT, e.g. more demonstrations or another model_dir), `ppo` only the PPO stage. `--lever-file`
adds or replaces levers from a YAML mapping of that shape. Every warm start and PPO run is a job under
`--work-dir` (reused when it finished with the same spec, so a killed sweep continues); `--jobs 2` runs two PPO
runs at once with one torch thread each (on 2 cores, about the same throughput as one at a time).

Output: the JSON (per lever: dev EM / F1 with 95% intervals, PPO - SFT on dev paired, the dev curve, KL, train
seconds, peak RSS, wall seconds) and a PNG of dev F1 against the PPO step, one line per lever.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path
from typing import Any

import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _experiment_common import clean_json, pyplot, run_jobs, save_figure, worker_main, write_json  # noqa: E402

from searchrl.common.config import load_config, save_config  # noqa: E402
from searchrl.demo.configs import RealDemoConfig  # noqa: E402

R = "configs/real/"
LEVERS: dict[str, dict[str, Any]] = {
    "recipe": {"note": "the config as given (the reference line)"},
    "reward_em": {
        "ppo": {"reward_config_path": R + "rewards_em.yaml"},
        "note": "exact match as the main term",
    },
    "reward_staged": {
        "ppo": {"reward_config_path": R + "rewards_staged.yaml"},
        "note": "format > retrieval > F1",
    },
    "reward_retrieval": {
        "ppo": {"reward_config_path": R + "rewards_retrieval.yaml"},
        "note": "F1 + 0.3 retrieval",
    },
    "steps_16": {"ppo": {"ppo.total_episodes": 256}, "note": "16 PPO steps of 16 episodes (twice the steps)"},
    "batch_32": {
        "ppo": {"ppo.gradient_accumulation_steps": 8, "ppo.total_episodes": 256},
        "note": "8 steps of 32 episodes",
    },
    "lr_1e-4": {"ppo": {"ppo.learning_rate": 1e-4}, "note": "LoRA learning rate 1e-4 (5e-5)"},
    # A fresh PPO adapter starts at B = 0: 16 Adam updates at 5e-5 move it by about 1e-3 (max weight change
    # 4e-4 in seed 0's run), so the policy barely leaves SFT; these two let it move (KL 0.1-0.9 a step).
    "lr_5e-4": {"ppo": {"ppo.learning_rate": 5e-4}, "note": "LoRA learning rate 5e-4 (5e-5)"},
    "lr_1e-3": {"ppo": {"ppo.learning_rate": 1e-3}, "note": "LoRA learning rate 1e-3 (5e-5)"},
    "steps_16_lr_5e-4": {
        "ppo": {"ppo.learning_rate": 5e-4, "ppo.total_episodes": 256},
        "note": "16 PPO steps at LoRA learning rate 5e-4 (twice the episodes)",
    },
    "lr_5e-4_t1": {
        "ppo": {"ppo.learning_rate": 5e-4, "generation.temperature": 1.0},
        "note": "LoRA learning rate 5e-4, sampling temperature 1.0 (0.8): more exploration",
    },
    "lr_2e-5": {"ppo": {"ppo.learning_rate": 2e-5}, "note": "LoRA learning rate 2e-5 (5e-5)"},
    "kl_0.01": {"ppo": {"ppo.kl_coef": 0.01}, "note": "KL coefficient 0.01 (0.05)"},
    "float32": {
        "ppo": {"ppo.mixed_precision": "no", "bf16_rollouts": False},
        "note": "float32 rollouts and PPO passes (bf16 autocast)",
    },
    "ppo_full": {"ppo": {"finetune": "full", "ppo.learning_rate": 3e-6}, "note": "full fine-tune in PPO"},
    "tis": {
        "ppo": {"ppo.rollout_is_mode": "token_truncate", "ppo.rollout_is_clip_max": 2.0},
        "note": "truncated importance sampling, C = 2",
    },
    "demos_600": {
        "warm": {"train_questions": {"hotpotqa": 37, "squad": 563}},
        "note": "600 train questions (about 440 demonstrations): its own SFT",
    },
}
DEFAULT_LEVERS = [name for name in LEVERS if name != "demos_600"]


# -- jobs -----------------------------------------------------------------------------------------------------


def _config(path: str | Path, overrides: dict[str, Any]) -> RealDemoConfig:
    return load_config(RealDemoConfig, path, overrides)


def _rows(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]


def _open_stages(cfg: RealDemoConfig, warm: Path, runner: Any, governor: Any) -> Any:
    """The real loop's shared pieces over a finished warm start (its data, index, SFT tokenizer), without its
    test split: nothing here can read it."""
    from searchrl.data.realqa import RealQATask
    from searchrl.demo.real import RealStages, real_rubric
    from searchrl.models.io import load_tokenizer
    from searchrl.search.index import open_backend

    splits = {
        "train": _rows(warm / "data" / "train.jsonl"),
        "dev": _rows(warm / "data" / "dev.jsonl"),
        "test": [],
    }
    task = RealQATask([], splits, {})
    backend = open_backend(warm / "index")
    backend.search(["warm up"], 1)
    tok = load_tokenizer(warm / "sft" / "policy")
    env_config = cfg.environment.env_config()
    return RealStages(
        cfg, Path(cfg.out_dir), runner, tok, real_rubric(cfg), backend, env_config, [], governor,
        warm / "sft" / "policy", False, task,
    )  # fmt: skip


def _runner(cfg: RealDemoConfig) -> tuple[Any, Any]:
    from searchrl.demo.stages import StageRunner
    from searchrl.demo.threads import ThreadGovernor

    governor = ThreadGovernor(cfg.num_threads)
    return StageRunner(False, on_stage_start=governor.decide), governor


def _dev_eval(stages: Any, name: str, policy: Any, rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list]:
    from searchrl.demo.baselines import write_eval
    from searchrl.demo.summary import headline

    summary, trajs = stages.evaluate(name, policy, rows=rows)
    write_eval(
        stages.out, name.replace(" ", "-"), summary, trajs, {"split": "dev", "num_questions": len(rows)}
    )
    return headline(summary), trajs


def warm_job(spec: dict[str, Any]) -> dict[str, Any]:
    """A warm start: the real loop's stages 1-3, 5-6 (no baselines, no test evaluation), then SFT on dev."""
    from searchrl.demo.real import prepare_real_stages, real_rubric, real_warm_start
    from searchrl.models.io import load_policy

    out = Path(spec["out_dir"])
    cfg = _config(spec["config"], {**spec["warm"], "out_dir": str(out), "progress_bar": False})
    save_config(cfg, out / "demo_config.yaml")
    runner, governor = _runner(cfg)
    stages = prepare_real_stages(cfg, runner, governor, real_rubric(cfg))
    sft_policy, sft_info, demos, kept = real_warm_start(stages, load_policy(stages.base_dir))
    dev = stages.dev_rows[: spec["dev_questions"]]
    sft_dev, _ = _dev_eval(stages, "sft dev", sft_policy, dev)
    return {
        "sft_dev": sft_dev,
        "demonstrations": len(demos),
        "demonstrations_trained": len(kept),
        "sft_final_loss": sft_info.get("final_loss"),
        "stages_seconds": dict(runner.timings),
        "threads": governor.summary(),
    }


def reuse_warm_job(spec: dict[str, Any]) -> dict[str, Any]:
    """A finished demo's warm start (`--warm DIR`): only its SFT policy's dev evaluation is run, into the job."""
    from searchrl.models.io import load_policy

    warm, out = Path(spec["warm_dir"]), Path(spec["out_dir"])
    cfg = _config(warm / "demo_config.yaml", {"out_dir": str(out), "progress_bar": False})
    runner, governor = _runner(cfg)
    stages = _open_stages(cfg, warm, runner, governor)
    sft_dev, _ = _dev_eval(
        stages, "sft dev", load_policy(warm / "sft" / "policy"), stages.dev_rows[: spec["dev_questions"]]
    )
    return {"sft_dev": sft_dev, "warm_dir": str(warm), "stages_seconds": dict(runner.timings)}


def ppo_job(spec: dict[str, Any]) -> dict[str, Any]:
    """One lever: PPO from the warm start's SFT policy, its dev curve, then the final policy on dev, paired."""
    import torch

    from searchrl.common.trajectory import read_trajectories
    from searchrl.demo.real import train_real_ppo
    from searchrl.demo.stages import peak_rss_mb
    from searchrl.evaluation.statistics import paired_comparison
    from searchrl.models.io import load_policy
    from searchrl.run.reader import RunReader

    warm, out = Path(spec["warm_dir"]), Path(spec["out_dir"])
    overrides = {
        **spec["overrides"],
        "out_dir": str(out),
        "progress_bar": False,
        "num_threads": spec["threads"] if spec["jobs"] > 1 else 0,
        "ppo.eval_on_start": True,
        "ppo.eval_steps": spec["eval_steps"],
        "ppo.num_eval_questions": spec["curve_questions"],
    }
    cfg = _config(warm / "demo_config.yaml", overrides)
    save_config(cfg, out / "demo_config.yaml")
    runner, governor = _runner(cfg)
    stages = _open_stages(cfg, warm, runner, governor)
    torch.manual_seed(cfg.seed)
    sft_dir = (warm / "sft" / "policy").resolve()
    policy = load_policy(sft_dir)
    policy.config._name_or_path = policy.name_or_path = str(sft_dir)  # the adapter's recorded base
    dev = stages.dev_rows[: spec["dev_questions"]]
    trainer = runner.run("ppo", lambda: train_real_ppo(stages, policy, dev[: spec["curve_questions"]], []))
    final = trainer.policy.merge_and_unload() if cfg.finetune == "lora" else trainer.policy
    final.eval()
    ppo_dev, ppo_trajs = _dev_eval(stages, "ppo dev", final, dev)
    sft_trajs = read_trajectories(Path(spec["sft_eval_dir"]) / "eval" / "sft-dev.trajectories.jsonl.gz")
    metrics = RunReader(out / "ppo").metrics()
    steps = [m for m in metrics if "objective/kl" in m]
    curve = [
        {k: m.get(k) for k in ("step", "eval/exact_match", "eval/f1", "eval/reward", "time/train_s")}
        for m in metrics
        if "eval/f1" in m
    ]
    return {
        "ppo_dev": ppo_dev,
        "ppo_minus_sft_dev": paired_comparison(ppo_trajs, sft_trajs, seed=cfg.seed),
        "dev_curve": curve,
        "objective/kl": [m["objective/kl"] for m in steps],
        "objective/scores": [m.get("objective/scores") for m in steps],
        "steps": trainer.global_step,
        "rollbacks": trainer.rollbacks,
        "train_s": steps[-1].get("time/train_s") if steps else None,
        "ppo_stage_s": runner.timings.get("ppo"),
        "peak_rss_mb": round(peak_rss_mb(), 1),
        "threads": governor.summary(),
    }


def run_spec(spec: dict[str, Any]) -> dict[str, Any]:
    return {"warm": warm_job, "reuse_warm": reuse_warm_job, "ppo": ppo_job}[spec["kind"]](spec)


# -- the sweep ------------------------------------------------------------------------------------------------


def _digest(value: Any) -> str:
    return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()[:10]


def plan(args: argparse.Namespace, levers: dict[str, dict[str, Any]]) -> tuple[list[dict], list[dict]]:
    """(warm-start specs, PPO specs): one warm start per distinct `warm` setting, one PPO run per lever."""
    work = Path(args.work_dir)
    warm_specs: dict[str, dict[str, Any]] = {}
    ppo_specs = []
    threads = max(1, args.threads // max(1, args.jobs))
    common = {"dev_questions": args.dev_questions, "threads": threads, "jobs": args.jobs}
    for name in args.levers:
        lever = levers[name]
        warm = {"seed": args.seed, **lever.get("warm", {})}
        key = _digest(warm)
        if key not in warm_specs:
            out = work / f"warm-{key}"
            if args.warm and not lever.get("warm"):
                warm_specs[key] = {"name": f"warm {key} (reused {args.warm})", "kind": "reuse_warm",
                                   "warm_dir": str(Path(args.warm).resolve()), "out_dir": str(out), **common}  # fmt: skip
            else:
                warm_specs[key] = {"name": f"warm {key}", "kind": "warm", "config": str(Path(args.config).resolve()),
                                   "warm": warm, "out_dir": str(out), **common}  # fmt: skip
        ws = warm_specs[key]
        ppo_specs.append(
            {
                "name": name,
                "kind": "ppo",
                "warm_dir": ws.get("warm_dir", ws["out_dir"]),
                "sft_eval_dir": ws["out_dir"],
                "overrides": {**lever.get("warm", {}), **lever.get("ppo", {})},
                "out_dir": str(work / "levers" / name),
                "eval_steps": args.eval_steps,
                "curve_questions": args.curve_questions,
                **common,
            }
        )
    return list(warm_specs.values()), ppo_specs


def plot(levers: list[dict[str, Any]], path: Path) -> None:
    plt = pyplot()
    fig, ax = plt.subplots(figsize=(8, 4.5))
    for lever in levers:
        points = [(c["step"], c["eval/f1"]) for c in lever["dev_curve"] if c.get("eval/f1") is not None]
        if points:
            steps, f1 = zip(*points, strict=True)
            ax.plot(steps, f1, marker="o", label=lever["name"])
    ax.set(
        xlabel="PPO step (0: the SFT warm start)",
        ylabel="dev F1",
        title="real loop: dev F1 during PPO, per lever",
    )
    ax.legend(fontsize=8, ncol=2)
    save_figure(fig, path)


def table(warm: list[dict[str, Any]], levers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per lever: dev F1 and EM after PPO, PPO - SFT on dev (paired), KL, seconds."""
    rows = []
    for lever in levers:
        diff = lever["ppo_minus_sft_dev"]
        rows.append(
            {
                "lever": lever["name"],
                "note": lever["note"],
                "dev_f1": lever["ppo_dev"]["f1"],
                "dev_em": lever["ppo_dev"]["exact_match"],
                "ppo_minus_sft_f1": diff["f1"]["mean"],
                "ppo_minus_sft_f1_ci95": diff["f1"]["ci95"],
                "ppo_minus_sft_em": diff["exact_match"]["mean"],
                "ppo_minus_sft_em_ci95": diff["exact_match"]["ci95"],
                "kl_last": lever["objective/kl"][-1] if lever["objective/kl"] else None,
                "train_s": lever["train_s"],
            }
        )
    return rows


def main(argv: list[str]) -> int:
    if worker_main(argv, run_spec):
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--config", default="configs/demo_real.yaml", help="The real loop's config (RealDemoConfig)."
    )
    p.add_argument("--seed", type=int, default=0, help="Seed of the split, SFT and PPO.")
    p.add_argument(
        "--warm", default=None, help="Reuse a finished demo directory's SFT policy (no SFT run here)."
    )
    p.add_argument("--levers", nargs="+", default=DEFAULT_LEVERS, help=f"Levers to run (of {list(LEVERS)}).")
    p.add_argument("--lever-file", default=None, help="YAML {name: {warm: {...}, ppo: {...}, note: ...}}.")
    p.add_argument("--dev-questions", type=int, default=200, help="Dev questions of the final comparison.")
    p.add_argument(
        "--curve-questions", type=int, default=64, help="Dev questions of PPO's periodic evaluation."
    )
    p.add_argument("--eval-steps", type=int, default=2, help="PPO steps between dev evaluations (the curve).")
    p.add_argument("--work-dir", default="runs/real-levers", help="Where the warm starts and PPO runs go.")
    p.add_argument("--json", required=True, help="Where to write the results.")
    p.add_argument("--plot", required=True, help="Where to write the dev-F1 curves (PNG).")
    p.add_argument("--jobs", type=int, default=1, help="PPO runs at once (worker processes).")
    p.add_argument("--threads", type=int, default=2, help="torch threads in total (with --jobs > 1).")
    p.add_argument("--fresh", action="store_true", help="Rerun jobs that finished with the same spec.")
    a = p.parse_args(argv)
    levers = dict(LEVERS)
    if a.lever_file:
        levers.update(yaml.safe_load(Path(a.lever_file).read_text(encoding="utf-8")) or {})
    unknown = [n for n in a.levers if n not in levers]
    if unknown:
        p.error(f"unknown lever(s) {unknown}; known: {sorted(levers)} (or add them with --lever-file)")
    base_config = Path(a.warm) / "demo_config.yaml" if a.warm else Path(a.config)
    for name in a.levers:  # every lever's settings load before anything runs
        lever = levers[name]
        _config(base_config, {**lever.get("warm", {}), **lever.get("ppo", {})})
    warm_specs, ppo_specs = plan(a, levers)
    script = Path(__file__).resolve()
    warm_results = run_jobs(warm_specs, run_spec, script, jobs=1, reuse=not a.fresh)  # SFT: one at a time
    results = run_jobs(ppo_specs, run_spec, script, jobs=a.jobs, reuse=not a.fresh)
    lever_rows = [
        {"name": s["name"], "note": levers[s["name"]].get("note", ""), "warm": s["warm_dir"], **r}
        for s, r in zip(ppo_specs, results, strict=True)
    ]
    warm_rows = [
        {"name": s["name"], "out_dir": s["out_dir"], **r}
        for s, r in zip(warm_specs, warm_results, strict=True)
    ]
    payload = {
        "config": str(base_config),
        "seed": a.seed,
        "split": "dev",
        "dev_questions": a.dev_questions,
        "curve_questions": a.curve_questions,
        "warm_starts": warm_rows,
        "levers": lever_rows,
        "table": table(warm_rows, lever_rows),
    }
    write_json(a.json, clean_json(payload))
    plot(lever_rows, Path(a.plot))
    for row in payload["table"]:
        print(
            f"{row['lever']:<18} dev F1 {row['dev_f1']:.3f}  PPO-SFT F1 {row['ppo_minus_sft_f1']:+.3f} "
            f"{row['ppo_minus_sft_f1_ci95']}  EM {row['ppo_minus_sft_em']:+.3f}  train {row['train_s']} s"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
