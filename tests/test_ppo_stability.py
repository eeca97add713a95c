"""The stability kit: health monitors in the metrics, NaN updates skipped, the best checkpoint kept, and
the F1 reward's no-answer penalty (what users of GRPO/PPO search agents hit: Search-R1 #88/#89, LLDS,
Search-R1++)."""

from __future__ import annotations

import json
import math

import pytest
import torch
from test_ppo_trainer import QA, make_trainer, snapshot

from searchrl.common.health import likelihood_metrics
from searchrl.common.trajectory import Trajectory
from searchrl.rewards.combine import default_rubric
from searchrl.rewards.qa import F1Reward
from searchrl.run.reader import RunReader


class NaNReward:
    """A broken reward function: every score is NaN (what a bad judge or a 0/0 in a rubric produces)."""

    def score(self, traj) -> tuple[float, dict[str, float]]:
        traj.reward, traj.reward_breakdown = float("nan"), {"nan": float("nan")}
        return traj.reward, traj.reward_breakdown


def test_health_metrics_report_the_likelihood_of_sampled_and_of_correct_episodes(world, tmp_path):
    trainer = make_trainer(world, tmp_path, reward=default_rubric())
    metrics = trainer.step()
    assert metrics["health/nonfinite_logprobs"] == 0.0 and metrics["health/skipped_updates"] == 0.0
    assert metrics["objective/logprob_per_token"] < 0.0
    # On a crafted batch: two episodes right, one wrong; the "correct" figure averages the right ones only.
    logprobs = torch.tensor([[0.0, -1.0, -1.0], [0.0, -3.0, -3.0], [0.0, -2.0, -2.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0]] * 3)
    correct = [True, False, True]
    health = likelihood_metrics(logprobs, mask, correct, logprobs.clone())
    assert health["objective/logprob_per_token"] == pytest.approx(-2.0)
    assert health["objective/logprob_per_token_correct"] == pytest.approx(-1.5)
    broken = logprobs.clone()
    broken[1, 2] = float("nan")
    health = likelihood_metrics(broken, mask, correct, logprobs)
    assert health["health/nonfinite_logprobs"] == 1.0 and math.isfinite(health["objective/logprob_per_token"])
    ref_broken = likelihood_metrics(logprobs, mask, correct, broken)  # a NaN in the reference counts too
    assert ref_broken["health/nonfinite_logprobs"] == 1.0
    assert (
        broken[0, 0] == 0.0
        and likelihood_metrics(broken, torch.zeros_like(mask))["health/nonfinite_logprobs"] == 0
    )
    assert "objective/logprob_per_token_correct" not in likelihood_metrics(logprobs[1:2], mask[1:2], [False])


def test_a_nan_update_is_skipped_and_the_guard_says_why(world, tmp_path):
    trainer = make_trainer(world, tmp_path, reward=NaNReward(), collapse_guard=True, collapse_window=1)
    before = snapshot(trainer.policy)
    metrics = trainer.step()
    assert metrics["health/skipped_updates"] == metrics["health/skipped_updates"] > 0
    after = snapshot(trainer.policy)
    assert all(torch.equal(before[n], after[n]) for n in before), "a NaN gradient must not reach the weights"
    assert all(torch.isfinite(p).all() for p in trainer.policy.parameters())
    reason = trainer.guard.check(metrics)
    assert reason is not None and "health/skipped_updates" in reason


def test_the_best_dev_checkpoint_is_kept_named_and_evaluable(world, tmp_path):
    trainer = make_trainer(
        world,
        tmp_path,
        reward=default_rubric(),
        eval_dataset=QA,
        eval_steps=1,
        eval_on_start=True,
        num_eval_questions=4,
        save_steps=1,
        save_total_limit=1,
        total_episodes=12,
        learning_rate=5e-2,
        max_new_tokens_per_turn=16,
    )
    trainer.train()
    run = tmp_path / "run"
    evals = {
        int(json.loads(p.read_text())["step"]): json.loads(p.read_text())["eval/reward"]
        for p in (run / "eval").glob("step-*.json")
    }
    assert sorted(evals) == [0, 1, 2, 3]
    best = json.loads((run / "best_checkpoint.json").read_text())
    first_max = min(s for s, v in evals.items() if v == max(evals.values()))
    assert best["step"] == first_max and best["metric"] == "eval/reward"
    assert best["value"] == pytest.approx(evals[first_max])
    kept = sorted(p.name for p in (run / "checkpoints").glob("step-*"))
    assert f"step-{first_max}" in kept and "step-3" in kept  # pruned to 1, but the best stays
    policy_dir, name = RunReader(run).checkpoint_policy("best")
    assert name == f"step-{first_max}" and (policy_dir / "config.json").is_file()
    state = json.loads((run / "checkpoints" / "step-3" / "trainer_state.json").read_text())
    assert state["best"]["step"] == first_max  # a resumed run knows its best


def test_best_metric_must_be_an_eval_metric(tmp_path):
    from searchrl.ppo.config import PPOConfig

    with pytest.raises(ValueError, match="best_metric"):
        PPOConfig(output_dir=str(tmp_path), best_metric="loss/policy_avg")
    assert PPOConfig(output_dir=str(tmp_path), best_metric=None).best_metric is None


def _traj(answer, golds=("Paris",)):
    return Trajectory(
        id="t", question_id="q", question="?", golds=list(golds), input_ids=[1], action_mask=[1],
        logprobs=[0.0], prompt_length=0, answer=answer,
    )  # fmt: skip


def test_f1_no_answer_penalty():
    traj = _traj
    assert F1Reward()(traj(None)) == 0.0
    assert F1Reward(no_answer=-0.1)(traj(None)) == -0.1
    assert F1Reward(no_answer=-0.1)(traj("London")) == 0.0  # a wrong answer still beats none
    assert F1Reward(no_answer=-0.1, max_answer_words=2)(traj("a b c d")) == -0.1  # over the cap: none
    assert F1Reward(no_answer=-0.1)(traj("Paris")) == 1.0


def test_logging_steps_samples_betas_and_run_name_are_honoured(world, tmp_path):
    trainer = make_trainer(
        world,
        tmp_path,
        total_episodes=20,  # 5 steps of 4
        logging_steps=2,
        num_sample_generations=2,
        adam_beta1=0.8,
        adam_beta2=0.95,
        run_name="my-run",
        eval_dataset=QA,
        eval_steps=3,
        num_eval_questions=2,
    )
    trainer.train()
    run = tmp_path / "run"
    steps = [json.loads(line)["step"] for line in (run / "metrics.jsonl").read_text().splitlines()]
    assert steps == [2, 3, 4, 5]  # every 2nd step, the evaluated step 3, and the last one
    samples = [json.loads(line) for line in (run / "samples.jsonl").read_text().splitlines()]
    assert sorted({s["step"] for s in samples}) == [2, 4, 5]  # every 5 // 2 steps, and the end
    assert all(s["episode"] and s["question"] for s in samples)
    assert {g["betas"] for g in trainer.optimizer.param_groups} == {(0.8, 0.95)}
    assert trainer.hf_args.run_name == "my-run"
