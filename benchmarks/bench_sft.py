"""SFT step cost side by side: batch size, TRL's loss or the plain loss, bf16 autocast or float32.

The demo's warm start is most of its wall-clock time, and a tiny model's step cost is mostly fixed
overhead, not arithmetic: this measures, in one process and one run (ratios; the machine is noisy), the
seconds per optimizer step and per thousand trained (labelled) tokens of `run_sft` on the demo's own
demonstrations for each setting, with the demo's model shape.

    .venv/bin/python benchmarks/bench_sft.py --run runs/demo [--steps 20] [--batches 16 32 64] \
        [--json OUT.json]

`--run` is a finished `searchrl demo` directory (its `sft/expert.jsonl.gz` and tokenizer in `sft/policy`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _experiment_common import write_json  # noqa: E402


def measure(run: Path, steps: int, batch: int, trl_loss: bool, bf16: bool, threads: int) -> dict:
    import torch

    from searchrl.common.config import load_config
    from searchrl.common.trajectory import read_trajectories
    from searchrl.demo.configs import DemoConfig
    from searchrl.models.io import load_tokenizer
    from searchrl.models.tiny import build_policy
    from searchrl.sft.warm_start import run_sft

    torch.set_num_threads(threads)
    cfg = load_config(DemoConfig, run / "demo_config.yaml")
    tok = load_tokenizer(run / "sft" / "policy")
    demos = read_trajectories(run / "sft" / "expert.jsonl.gz")
    sft = dataclasses.replace(
        cfg.sft,
        max_steps=steps,
        per_device_train_batch_size=batch,
        first_turn_steps=0,
        answer_turn_steps=0,
        warmup_ratio=0.0,
        lr_scheduler_type="constant",
        trl_loss=trl_loss,
        bf16=bf16,
        logging_steps=steps,
    )
    policy = build_policy(tok, cfg.model)
    t0 = time.perf_counter()
    out = run_sft(policy, tok, demos[: steps * batch], sft)
    seconds = time.perf_counter() - t0
    labelled = out.trained_tokens
    return {
        "batch": batch,
        "trl_loss": trl_loss,
        "bf16": bf16,
        "steps": steps,
        "seconds": round(seconds, 2),
        "seconds_per_step": round(seconds / steps, 3),
        "seconds_per_1k_labelled_tokens": round(1000 * seconds / max(1, labelled), 3),
        "final_loss": out.losses[-1] if out.losses else None,
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--run", required=True, help="A finished demo run directory.")
    parser.add_argument("--steps", type=int, default=20, help="Optimizer steps per setting.")
    parser.add_argument("--batches", type=int, nargs="+", default=[16, 32, 64], help="Batch sizes.")
    parser.add_argument("--threads", type=int, default=2, help="torch threads.")
    parser.add_argument("--json", help="Write the results here.")
    args = parser.parse_args(argv)
    rows = []
    for batch in args.batches:
        for trl_loss, bf16 in ((True, True), (True, False), (False, False), (False, True)):
            row = measure(Path(args.run), args.steps, batch, trl_loss, bf16, args.threads)
            print(json.dumps(row), flush=True)
            rows.append(row)
    base = next(r for r in rows if r["batch"] == args.batches[0] and r["trl_loss"] and r["bf16"])
    for r in rows:
        r["relative_seconds_per_step"] = round(r["seconds_per_step"] / base["seconds_per_step"], 3)
    if args.json:
        write_json(args.json, {"run": args.run, "threads": args.threads, "rows": rows})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
