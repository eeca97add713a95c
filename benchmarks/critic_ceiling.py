"""How much of PPO's returns could a critic explain? The ideal value's share, estimated from rollouts.

Issue 25 asks for `val/explained_variance` >= 0.3 over the second half of training, or a measured argument
that the returns leave less to explain and a critic that reaches most of it. Explained variance depends on
the returns as much as on the critic: when the policy answers almost everything right, what is left of the
returns' spread is the luck of sampling, which no value function can predict before the tokens are drawn.

What this measures, for a finished demo run and one of its PPO checkpoints (policy and critic at step N):
`--prompts` training questions, each rolled out `--samples` times by the checkpoint's policy exactly as PPO
samples (same environment, temperature, rubric, missing-EOS penalty, KL penalty against the SFT reference
with the coefficient the run had reached). Per episode, G0 is the Monte-Carlo return at its first action
token (gamma 1, lambda 1: what `val/explained_variance_mc` uses); the best any critic can do at that token is
the expected return given the question, estimated by the mean over its samples. Its share of G0's variance:

    ideal = (Var(per-question means) - mean within-question variance / samples) / Var(G0)

(the subtraction removes the sampling noise of a mean of `samples` draws). Beside it, the checkpoint's critic
at the same token (`critic_first_token`: 1 - Var(G0 - V0) / Var(G0)) and over every action token
(`critic_all_tokens`, pooled over these episodes: the trainer's metric, over more questions than a batch). A critic at the ceiling at the first
token has learned what the question tells; later tokens know more (what was searched and read), so the
all-token figure may exceed the first-token ceiling.

    .venv/bin/python benchmarks/critic_ceiling.py --run runs/demo --step 20 --json runs/critic_ceiling.json

Nothing here touches the test split.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
from _experiment_common import load_backend, load_demo_run, ppo_args, set_threads, write_json  # noqa: E402


def variance_shares(g0: list[float], v0: list[float], groups: list[list[int]]) -> dict[str, float]:
    """The ideal share of Var(G0) (noise-corrected between-question variance) and the critic's, at one token."""
    total = statistics.pvariance(g0)
    means = [statistics.fmean(g0[i] for i in idx) for idx in groups]
    # Unbiased within-question variance (n - 1): a mean of n draws carries within / n of sampling noise.
    within = statistics.fmean(statistics.variance([g0[i] for i in idx]) for idx in groups)
    samples = statistics.fmean(len(idx) for idx in groups)
    # E[Var(means)] = Var_between + within / samples (population variances), hence the correction.
    between = statistics.pvariance(means) - within / samples
    residual = statistics.pvariance([g - v for g, v in zip(g0, v0, strict=True)])
    return {
        "return_variance": total,
        "ideal_first_token": between / total if total > 0 else float("nan"),
        "critic_first_token": 1.0 - residual / total if total > 0 else float("nan"),
    }


def pooled_explained_variance(values: Any, returns: Any) -> float:
    """1 - Var(returns - values) / Var(returns) over every action token of every episode."""
    total = float(returns.var(unbiased=False))
    return 1.0 - float((returns - values).var(unbiased=False)) / total if total > 0 else float("nan")


def bootstrap_shares(
    g0: list[float], v0: list[float], groups: list[list[int]], draws: int = 1000, seed: int = 0
) -> dict[str, list[float]]:
    """95% intervals of both shares, resampling questions (with all their samples) with replacement."""
    from searchrl.evaluation.statistics import bootstrap_statistic_ci

    def share_of(key: str) -> Any:
        def statistic(picked: Any) -> float:
            chosen = [groups[int(q)] for q in picked]
            flat = [i for idx in chosen for i in idx]
            offsets = [list(range(k * len(idx), (k + 1) * len(idx))) for k, idx in enumerate(chosen)]
            return variance_shares([g0[i] for i in flat], [v0[i] for i in flat], offsets)[key]

        return statistic

    keys = ("ideal_first_token", "critic_first_token")
    return {key: list(bootstrap_statistic_ci(len(groups), share_of(key), draws, seed)) for key in keys}


def measure(run_dir: str, step: int, prompts: int, samples: int, batch: int) -> dict[str, Any]:
    from searchrl.env.environment import SearchEnvironment
    from searchrl.models.io import load_policy, load_tokenizer
    from searchrl.ppo.trainer import PPOTrainer
    from searchrl.rewards.combine import default_rubric

    run = load_demo_run(run_dir)
    checkpoint = Path(run_dir) / "ppo" / "checkpoints" / f"step-{step}"
    if not (checkpoint / "value").is_dir():
        raise FileNotFoundError(
            f"{checkpoint}: no such PPO checkpoint with a critic (steps: ppo/checkpoints/)"
        )
    backend = load_backend(run)
    tok = load_tokenizer(run.policy_dir)
    with tempfile.TemporaryDirectory(prefix="critic-ceiling-") as scratch:
        args = ppo_args(run, scratch, run.config.seed, None)
        env_config = args.env_config()
        trainer = PPOTrainer(
            args, tok, load_policy(run.policy_dir), None, None, run.train_rows,
            reward_funcs=default_rubric(),
            environment=lambda: SearchEnvironment(backend, env_config, tokenizer=tok),
        )  # fmt: skip
        trainer.load_checkpoint(checkpoint, restore_clock=False)
        return _roll_and_compare(trainer, run_dir, step, prompts, samples, batch)


def _roll_and_compare(trainer: Any, run_dir: str, step: int, prompts: int, samples: int, batch: int) -> dict:
    import torch

    from searchrl.ppo.batch import collate_trajectories

    tok = trainer.tokenizer
    rows = [row for row in trainer.train_rows[:prompts] for _ in range(samples)]
    g0: list[float] = []
    v0: list[float] = []
    token_values: list[torch.Tensor] = []
    token_returns: list[torch.Tensor] = []
    for start in range(0, len(rows), batch):
        trajs, _ = trainer.rollout(rows[start : start + batch], seed=10_000 + start)
        data = collate_trajectories(trajs, tok.pad_token_id)
        mask = data["action_mask"]
        est = trainer.estimate(data, trainer.score(trajs, data))  # PPOTrainer.step's steps 2-5, no update
        values, returns = est["values"], est["mc_returns"]
        first = mask.float().argmax(dim=1)
        rows_idx = torch.arange(len(trajs))
        g0 += returns[rows_idx, first].tolist()
        v0 += values[rows_idx, first].tolist()
        token_values.append(values[mask.bool()])
        token_returns.append(returns[mask.bool()])
    groups = [list(range(i * samples, (i + 1) * samples)) for i in range(prompts)]
    shares = variance_shares(g0, v0, groups)
    shares["ci95"] = bootstrap_shares(g0, v0, groups)
    return {
        "run": str(run_dir),
        "step": step,
        "prompts": prompts,
        "samples": samples,
        **shares,
        # pooled over every episode (a batch holds few questions here, unlike a PPO batch)
        "critic_all_tokens": pooled_explained_variance(torch.cat(token_values), torch.cat(token_returns)),
        "mean_return": statistics.fmean(g0),
        "first_token_returns": g0,  # the raw figures, so that intervals can be recomputed
        "first_token_values": v0,
        "critic_share_of_ideal": shares["critic_first_token"] / shares["ideal_first_token"]
        if shares["ideal_first_token"] > 0
        else None,
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument(
        "--run", nargs="+", required=True, help="Finished demo run directories (searchrl demo --out RUN)."
    )
    p.add_argument("--step", type=int, nargs="+", default=[20], help="PPO checkpoint steps to measure.")
    p.add_argument("--prompts", type=int, default=64, help="Training questions rolled out.")
    p.add_argument("--samples", type=int, default=8, help="Rollouts per question (>= 2).")
    p.add_argument("--batch", type=int, default=32, help="Episodes per rollout batch.")
    p.add_argument("--threads", type=int, default=2, help="torch threads.")
    p.add_argument("--json", required=True, help="Where to write the results.")
    a = p.parse_args(argv)
    if a.samples < 2 or a.prompts < 2:
        p.error("--samples and --prompts must be >= 2 (a variance within and between questions)")
    set_threads(a.threads)
    results = []
    for run in a.run:
        for step in a.step:
            row = measure(run, step, a.prompts, a.samples, a.batch)
            shown = {k: v for k, v in row.items() if not k.startswith("first_token_")}
            print({k: round(v, 3) if isinstance(v, float) else v for k, v in shown.items()}, flush=True)
            results.append(row)
    write_json(a.json, {"settings": vars(a), "results": results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
