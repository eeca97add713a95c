"""A short PPO run raises the dev-split reward over its first steps (fixed seeds, CPU, seconds).

Honest scope: an untrained tiny model cannot earn the QA rubric (it never writes an answer), so the
reward here is the learnable `LikedTokens` stand-in from `test_ppo_trainer.py` (the share of sampled
tokens whose id is a multiple of 4). Everything else is the real pipeline: real rollouts through the
search environment, GAE over action tokens, clipped updates, the KL penalty to the reference. The dev
questions are never trained on; the dev reward is measured with the same sampling seeds before and after.
"""

from __future__ import annotations

import copy

import pytest
from test_ppo_trainer import QA, LikedTokens, build_world, env_factory, make_args

from searchrl.ppo.trainer import PPOTrainer

DEV = [
    {"id": "v1", "question": "Who was born in Tiberk?", "golds": ["Amsel Drov"]},
    {"id": "v2", "question": "What is the capital of Quessa?", "golds": ["Orlenn"]},
    {"id": "v3", "question": "When was Orlenn founded?", "golds": ["1288"]},
    {"id": "v4", "question": "What kind of place is Tiberk?", "golds": ["fishing village"]},
]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    return build_world(tmp_path_factory.mktemp("ppo_world"))


def dev_reward(trainer: PPOTrainer, seeds=range(100, 108)) -> float:
    """Mean reward over the dev questions, sampled at the training temperature with fixed seeds.

    The same seeds before and after training (common random numbers): a change in the score comes from
    the policy, not from the sampling noise.
    """
    scores = []
    for seed in seeds:
        trajs, _ = trainer.rollout(DEV, seed=seed)
        scores += [LikedTokens().score(t)[0] for t in trajs]
    return sum(scores) / len(scores)


def test_short_ppo_run_raises_the_dev_reward_over_its_first_steps(world, tmp_path):
    # Two sampled tokens per episode and 8 episodes per step: enough signal per token for a few steps.
    args = make_args(
        tmp_path,
        total_episodes=64,
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,
        num_ppo_epochs=4,
        learning_rate=1e-2,
        lr_scheduler_type="constant",
        max_new_tokens_per_turn=2,
        max_episode_tokens=48,
        kl_coef=0.01,
    )
    train_rows = [dict(q, id=f"{q['id']}-{k}") for k in range(2) for q in QA]
    trainer = PPOTrainer(
        args,
        world["tok"],
        copy.deepcopy(world["policy"]),
        None,
        None,
        train_rows,
        reward_funcs=LikedTokens(),
        environment=env_factory(world),
    )
    curve = [dev_reward(trainer)]  # dev reward before training, after 4 steps, after 8 steps
    for step in range(1, trainer.num_total_batches + 1):
        trainer.step()
        if step % 4 == 0:
            curve.append(dev_reward(trainer))
    print("dev reward at steps 0, 4, 8:", [round(c, 3) for c in curve])
    # The share of liked tokens starts near chance (a quarter of the vocabulary) and rises.
    assert 0.1 < curve[0] < 0.4, curve
    assert curve[0] < curve[1] < curve[2], curve
    assert curve[2] > curve[0] + 0.05, curve  # measured: 0.219 -> 0.281 -> 0.328
