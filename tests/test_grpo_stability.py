"""The stability kit for GRPO, as tests/test_ppo_stability.py checks it for PPO: the health monitors in
metrics.jsonl under PPO's names, a NaN counted, the best dev checkpoint kept by `best_metric` and never
pruned, and the run layer's cadence (logging_steps, evaluation at the last step, samples)."""

from __future__ import annotations

import json
import math

import pytest
from test_grpo_trainer import read_metrics
from worlds import grpo_config

from searchrl.common.trajectory import Trajectory
from searchrl.grpo.reward import RubricReward
from searchrl.grpo.trainer import build_grpo_trainer
from searchrl.models.io import load_policy
from searchrl.run.reader import RunReader


def test_health_monitors_and_the_best_checkpoint_in_a_tiny_grpo_run(grpo_world):
    cfg = grpo_config(
        grpo_world.root,
        "our_rollout",
        max_steps=3,
        logging_steps=2,
        eval_steps=2,
        eval_on_start=True,
        save_steps=1,
        save_total_limit=1,
        num_sample_generations=1,
    )
    policy = load_policy(grpo_world.policy_dir).train()
    trainer = build_grpo_trainer(
        cfg, policy, grpo_world.tokenizer, grpo_world.backend, grpo_world.train_rows, grpo_world.dev_rows
    )
    trainer.train()
    run = cfg.run_dir
    # Every 2nd step, and always the last one; step 0 is the evaluation before training. (transformers'
    # end-of-training summary, `train_runtime` and the mean loss, follows as a line of its own.)
    lines = [m for m in read_metrics(run) if "train_runtime" not in m]
    assert [m["step"] for m in lines] == [0, 2, 3]
    for m in lines[1:]:
        assert m["health/nonfinite_logprobs"] == 0.0
        assert m["objective/logprob_per_token"] < 0.0  # the sampled tokens' own likelihood
        assert m["objective/entropy_per_token"] == m["entropy"] > 0.0  # TRL's figure under PPO's name
    evals = {
        json.loads(p.read_text())["step"]: json.loads(p.read_text())["eval/reward"]
        for p in (run / "eval").glob("step-*.json")
    }
    assert sorted(evals) == [0, 2, 3]  # eval_steps and the last step
    best = json.loads((run / "best_checkpoint.json").read_text())
    first_max = min(s for s, v in evals.items() if v == max(evals.values()))
    assert best["step"] == first_max and best["metric"] == "eval/reward"
    assert best["value"] == pytest.approx(evals[first_max])
    kept = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert kept == sorted({f"step-{first_max}", "step-3"})  # pruned to 1, but the best stays
    policy_dir, name = RunReader(run).checkpoint_policy("best")
    assert name == f"step-{first_max}" and (policy_dir / "config.json").is_file()
    state = json.loads((run / "checkpoints" / "step-3" / "trainer_state.json").read_text())
    assert state["best"]["step"] == first_max  # a resumed run knows its best
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert {s["step"] for s in samples} == {3} and all(s["question"] and s["episode"] for s in samples)


def _traj(logprobs, answer="Paris", golds=("Paris",), sampled=True):
    n = len(logprobs)
    traj = Trajectory(
        id="t", question_id="q", question="?", golds=list(golds), input_ids=[1] * (n + 1),
        action_mask=[0] + [1] * n, logprobs=[0.0, *logprobs], prompt_length=1, answer=answer,
    )  # fmt: skip
    traj.reward, traj.reward_breakdown = 1.0, {}
    traj.metadata["sampling_logprobs"] = sampled
    return traj


def test_a_nan_logprob_is_counted_and_episodes_without_sampling_logprobs_are_left_out():
    healthy = RubricReward.batch_metrics([_traj([-1.0, -1.0]), _traj([-3.0, -3.0], answer="Lyon")])
    assert healthy["health/nonfinite_logprobs"] == 0.0
    assert healthy["objective/logprob_per_token"] == pytest.approx(-2.0)
    assert healthy["objective/logprob_per_token_correct"] == pytest.approx(-1.0)
    broken = RubricReward.batch_metrics([_traj([-1.0, float("nan")]), _traj([-3.0, -3.0])])
    assert broken["health/nonfinite_logprobs"] == 1.0 and math.isfinite(broken["objective/logprob_per_token"])
    # TRL's transformers generation returns no logprobs (trl_loop without vLLM): no made-up zeros.
    partial = RubricReward.batch_metrics([_traj([0.0, 0.0], sampled=False), _traj([-3.0, -3.0])])
    assert partial["objective/logprob_per_token"] == pytest.approx(-3.0)
    assert "objective/logprob_per_token" not in RubricReward.batch_metrics([_traj([0.0], sampled=False)])
