"""The demo's SFT warm start across seeds, judged on the dev split: does a recipe learn to copy on every seed?

Each job runs the demo's first five stages exactly as `searchrl demo` does (`searchrl.demo.pipeline.
prepare_world`, then `run_sft` with the demo's SFT settings), for one seed and one recipe (`--set` changes
DemoConfig fields, e.g. `sft.max_steps=600` or `model.num_attention_heads=8`), then evaluates the warm start
greedily on the first `--dev-questions` dev questions with the PPO stage's limits. Nothing here touches the
test split: recipes are chosen on dev only.

    .venv/bin/python benchmarks/warm_start_seeds.py --out runs/ws --seeds 0 1 2 --jobs 2 \
        [--set sft.first_turn_steps=400 ...] [--label NAME]

Writes `OUT/<label>/seed-N/result.json` (dev EM and F1 with 95% CIs, by hops, citation support, format,
SFT seconds, final loss, the first/second word of two-word answers) and `OUT/<label>.json` with all seeds
and their mean. A job that finished with the same settings is reused.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _experiment_common import clean_json, run_jobs, write_json  # noqa: E402

from searchrl.common.config import load_config  # noqa: E402


def demo_config(seed: int, out_dir: Path, overrides: dict[str, Any]) -> Any:
    from searchrl.demo.configs import DemoConfig

    cfg = load_config(DemoConfig, None, overrides) if overrides else DemoConfig()
    return dataclasses.replace(cfg, seed=seed, out_dir=str(out_dir), progress_bar=False)


def two_word_copy(trajs: list[Any]) -> dict[str, float]:
    """Among gold answers of two words: the share whose first word, and whose second, the answer got right."""
    first = second = n = 0
    for t in trajs:
        gold = (t.golds or [""])[0].split()
        if len(gold) != 2:
            continue
        got = (t.answer or "").split()
        n += 1
        first += len(got) > 0 and got[0] == gold[0]
        second += len(got) > 1 and got[1] == gold[1]
    return {
        "two_word_answers": n,
        "first_word_right": first / max(1, n),
        "second_word_right": second / max(1, n),
    }


def copy_probe(world: Any, cfg: Any, questions: int, every: int, log: list[dict[str, Any]]) -> Any:
    """A TrainerCallback that evaluates the policy greedily on `questions` dev questions every `every` steps of
    each SFT phase: when does copying switch on (exact match, first and second word of two-word answers)?"""
    from transformers import TrainerCallback

    from searchrl.evaluation.loop import evaluate_with_ppo_limits

    dev = world.dev_rows[:questions]
    phase = {"index": -1}

    class CopyProbe(TrainerCallback):
        def on_train_begin(self, args: Any, state: Any, control: Any, **kw: Any) -> None:
            phase["index"] += 1

        def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kw: Any) -> None:
            if state.global_step % every:
                return
            was_training = model.training
            result = evaluate_with_ppo_limits(
                model, world.tokenizer, dev, world.env_factory, cfg.ppo_config(), seed=0
            )
            model.train(was_training)
            row = {
                "phase": phase["index"],
                "step": state.global_step,
                "exact_match": result.summary["exact_match"],
            }
            row.update(two_word_copy(result.trajectories))
            row["query_copy"] = query_copy(result.trajectories, dev)
            log.append(row)
            print(json.dumps(row), flush=True)

    return CopyProbe()


def query_copy(trajs: list[Any], rows: list[dict[str, Any]]) -> float:
    """Share of episodes whose first search query starts with the question's subject name, copied exactly."""
    by_id = {str(r.get("id")): r for r in rows}
    hits = n = 0
    for t in trajs:
        subject = str(by_id.get(t.question_id, {}).get("subject", ""))
        if not subject:
            continue
        n += 1
        query = str(t.tool_calls[0].arguments.get("query", "")) if t.tool_calls else ""
        hits += query.startswith(subject)
    return hits / max(1, n)


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from searchrl.demo.configs import check_demo_config
    from searchrl.demo.pipeline import prepare_world
    from searchrl.demo.stages import StageRunner
    from searchrl.evaluation.loop import evaluate_with_ppo_limits
    from searchrl.models.io import save_model_dir
    from searchrl.rewards.combine import default_rubric
    from searchrl.sft.warm_start import run_sft

    out = Path(spec["out_dir"])
    cfg = demo_config(spec["seed"], out, spec["overrides"])
    check_demo_config(cfg)
    torch.manual_seed(cfg.seed)
    runner = StageRunner(False)
    world = prepare_world(cfg, out, runner)
    sft_cfg = dataclasses.replace(cfg.sft, seed=cfg.seed, output_dir=str(out / "sft" / "trainer"))
    probes: list[dict[str, Any]] = []
    callbacks = []
    if spec.get("probe_every"):
        callbacks.append(copy_probe(world, cfg, spec["probe_questions"], spec["probe_every"], probes))
    t0 = time.perf_counter()
    sft = run_sft(world.policy, world.tokenizer, world.demos, sft_cfg, callbacks=callbacks)
    sft_seconds = time.perf_counter() - t0
    save_model_dir(sft.policy, world.tokenizer, out / "sft" / "policy")
    dev = world.dev_rows[: spec["dev_questions"]]
    result = evaluate_with_ppo_limits(
        sft.policy,
        world.tokenizer,
        dev,
        world.env_factory,
        cfg.ppo_config(),
        rubric=default_rubric(),
        seed=cfg.seed,
    )
    summary = result.summary
    keys = ("exact_match", "f1", "citation_support", "format_valid", "searches_per_question")
    return {
        "seed": cfg.seed,
        "dev_questions": len(dev),
        **{k: summary.get(k) for k in keys},
        "ci95": {k: summary.get("ci95", {}).get(k) for k in ("exact_match", "f1")},
        "by_hops": {h: {k: g.get(k) for k in keys} for h, g in summary.get("by_hops", {}).items()},
        **two_word_copy(result.trajectories),
        "query_copy": query_copy(result.trajectories, dev),
        "sft_seconds": round(sft_seconds, 1),
        "expert_seconds": runner.timings.get("expert"),
        "final_loss": sft.losses[-1] if sft.losses else None,
        "copy_gate": sft.copy_gate,
        "losses": sft.losses,
        "probes": probes,
        "num_demonstrations": len(world.demos),
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out", help="Output directory of the experiment (required).")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2], help="Demo seeds to run.")
    parser.add_argument("--set", dest="sets", action="append", default=[], help="DemoConfig FIELD=VALUE.")
    parser.add_argument("--label", default="", help="Name of this recipe (default: from --set).")
    parser.add_argument("--dev-questions", type=int, default=100, help="Dev questions evaluated.")
    parser.add_argument("--jobs", type=int, default=1, help="Seeds run at once (worker processes).")
    parser.add_argument(
        "--probe-every", type=int, default=0, help="Evaluate on dev every N SFT steps of each phase (0: off)."
    )
    parser.add_argument("--probe-questions", type=int, default=48, help="Dev questions per probe.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads in all, split over jobs.")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.worker:
        spec = json.loads(Path(args.worker).read_text(encoding="utf-8"))
        from _experiment_common import run_job_here

        run_job_here(worker, spec)
        return 0
    if not args.out:
        parser.error("--out is required: the directory the experiment writes")
    from searchrl.demo.configs import DemoConfig
    from searchrl.ppo.commands import parse_set_options

    overrides = parse_set_options(args.sets)
    load_config(DemoConfig, None, overrides)  # an unknown field or a bad value fails here, named
    label = args.label or ("_".join(s.replace("=", "-") for s in args.sets) or "shipped")
    root = Path(args.out) / label
    threads = max(1, args.threads // max(1, args.jobs))
    specs = [
        {
            "name": f"{label} seed {seed}",
            "out_dir": str(root / f"seed-{seed}"),
            "seed": seed,
            "overrides": overrides,
            "dev_questions": args.dev_questions,
            "probe_every": args.probe_every,
            "probe_questions": args.probe_questions,
            "threads": threads,
        }
        for seed in args.seeds
    ]
    results = run_jobs(specs, worker, __file__, args.jobs)
    ems = [r["exact_match"] for r in results]
    table = {
        "label": label,
        "overrides": overrides,
        "seeds": args.seeds,
        "dev_exact_match": ems,
        "mean_dev_exact_match": sum(ems) / len(ems),
        "results": [{k: v for k, v in r.items() if k not in ("losses", "probes")} for r in results],
    }
    write_json(Path(args.out) / f"{label}.json", table)
    print(json.dumps(clean_json({k: table[k] for k in ("label", "dev_exact_match", "mean_dev_exact_match")})))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
