"""The critic learns what it can see: returns that depend on the question are told apart by its values.

The world is conftest.py's `world` (tiny Qwen2 policy, Varnholt index). The reward here depends on the
question alone: 1 for the two "Who/Where ... founder" questions (they stand in for two-hop questions), 0
for the other two (one-hop), whatever the policy does, so the ideal value at the first action token is 1 or
0 and the Monte-Carlo returns are exactly predictable from the prompt. The policy's learning rate is ~0, so
the returns stay what they are while the critic learns.

With the recipe (`value_lam` 1, no value clip, critic learning rate 3e-3, `value_replay_steps` 2) the
critic must separate the two kinds within 16 steps (measured: explained variance 0 for the first four steps,
while it learns the mean, then 0.3 by step 10 and 0.85 at step 16); with TRL's critic settings (lambda 0.95
targets, value clip 0.2, no replay) every question's value is still the mean, 0.5, after the same 16 steps:
the cause docs/ppo.md ("The critic") measured on the demo.
"""

from __future__ import annotations

import copy

import pytest
import torch
from test_ppo_trainer import QA, env_factory, make_args
from test_ppo_trainer_runs import KillAt, Killed, read_metrics

from searchrl.ppo.config import PPOConfig
from searchrl.ppo.trainer import PPOTrainer
from searchrl.ppo.value_replay import ValueReplay, fit_critic_on_replay

FOUNDER_QUESTIONS = {"q2", "q3"}
RECIPE = dict(value_lam=1.0, cliprange_value=None, value_replay_steps=2)


class FounderQuestions:
    """1 for the founder questions, 0 for the others: a return the critic can read off the prompt."""

    def score(self, traj) -> tuple[float, dict[str, float]]:
        value = 1.0 if traj.question_id in FOUNDER_QUESTIONS else 0.0
        traj.reward, traj.reward_breakdown = value, {"founder": value}
        return value, {"founder": value}


def critic_trainer(world, tmp_path, steps: int = 16, callbacks=None, **kw) -> PPOTrainer:
    base = dict(
        per_device_train_batch_size=4,
        gradient_accumulation_steps=2,  # 8 episodes a step: each question twice
        num_mini_batches=2,
        num_ppo_epochs=2,
        total_episodes=8 * steps,
        learning_rate=1e-12,  # the policy stays put: the returns depend on the question only
        value_learning_rate=3e-3,
        kl_coef=0.0,
        save_steps=2,
        seed=5,
    )
    base.update(kw)
    return PPOTrainer(
        make_args(tmp_path, **base),
        world["tok"],
        copy.deepcopy(world["policy"]),
        None,
        None,
        QA * 2,  # each question twice a step
        reward_funcs=FounderQuestions(),
        environment=env_factory(world),
        callbacks=callbacks or [],
    )


def first_action_values(trainer: PPOTrainer) -> dict[str, float]:
    """The critic's value at each question's first action token, from the step's own rollouts."""
    from searchrl.ppo.batch import collate_trajectories

    trajs = trainer.last_trajectories
    batch = collate_trajectories(trajs, trainer.tokenizer.pad_token_id)
    with torch.no_grad():
        values = trainer.model.critic_values(batch["input_ids"], batch["attention_mask"])
    out: dict[str, list[float]] = {}
    for i, t in enumerate(trajs):
        first = int(batch["action_mask"][i].nonzero()[0])
        out.setdefault(t.question_id, []).append(float(values[i, first]))
    return {q: sum(v) / len(v) for q, v in out.items()}


def separation(values: dict[str, float]) -> float:
    founder = [v for q, v in values.items() if q in FOUNDER_QUESTIONS]
    others = [v for q, v in values.items() if q not in FOUNDER_QUESTIONS]
    return min(founder) - max(others)


def test_the_critic_separates_questions_whose_returns_differ(world, tmp_path):
    recipe = critic_trainer(world, tmp_path / "recipe", **RECIPE)
    recipe.train()
    trl = critic_trainer(world, tmp_path / "trl")
    trl.train()
    recipe_values, trl_values = first_action_values(recipe), first_action_values(trl)
    # The returns differ by 1; the recipe's critic tells every founder question from every other one.
    assert separation(recipe_values) > 0.5, recipe_values
    assert recipe.last_metrics["val/explained_variance"] > 0.5
    # TRL's settings in the same steps: the clip lets each value move 0.2 a step around a mean it is still
    # climbing to, and lambda 0.95 targets at the first token are mostly its own guess.
    assert separation(trl_values) < separation(recipe_values) - 0.3, (trl_values, recipe_values)
    assert trl.last_metrics["val/explained_variance_mc"] < recipe.last_metrics["val/explained_variance_mc"]
    # With value_lam 1 the critic's targets are the Monte-Carlo returns: the two variances agree.
    assert recipe.last_metrics["val/explained_variance"] == pytest.approx(
        recipe.last_metrics["val/explained_variance_mc"]
    )
    assert recipe.last_metrics["val/replay_steps"] == 2 * 2 * 2  # 2 epochs x 2 batches x 2 mini-batches


def test_replay_trains_the_critic_alone_and_leaves_the_policy_and_its_schedule(world, tmp_path):
    # A constant schedule: after a linear one the learning rates would be 0 at the end of training.
    trainer = critic_trainer(
        world, tmp_path, steps=1, learning_rate=1e-3, lr_scheduler_type="constant", **RECIPE
    )
    trainer.train()  # one step: the replay now holds that batch
    assert len(trainer.value_replay) == 1
    policy_before = {n: p.detach().clone() for n, p in trainer.model.policy.named_parameters()}
    critic_before = {n: p.detach().clone() for n, p in trainer.model.value_model.named_parameters()}
    lrs_before = trainer.lr_scheduler.get_last_lr()
    stats = fit_critic_on_replay(
        trainer.model,
        trainer.optimizer,
        trainer.value_replay,
        trainer.args,
        trainer.device,
        trainer._autocast,
        torch.Generator().manual_seed(0),
    )
    assert stats["val/replay_steps"] == 4 and stats["val/replay_loss"] > 0
    assert all(p.equal(policy_before[n]) for n, p in trainer.model.policy.named_parameters())
    assert any(not p.equal(critic_before[n]) for n, p in trainer.model.value_model.named_parameters())
    assert trainer.lr_scheduler.get_last_lr() == lrs_before


def test_the_replay_keeps_its_last_batches_and_round_trips_through_a_state_dict():
    replay = ValueReplay(2)
    for step in range(3):
        batch = {k: torch.full((2, 3), step) for k in ("input_ids", "attention_mask", "action_mask")}
        replay.add(batch, torch.full((2, 3), float(step)))
    assert len(replay) == 2 and [int(b["returns"][0, 0]) for b in replay.batches] == [1, 2]
    copy_ = ValueReplay(2)
    copy_.load_state_dict(replay.state_dict())
    assert [int(b["input_ids"][0, 0]) for b in copy_.batches] == [1, 2]
    off = ValueReplay(0)
    off.add({k: torch.zeros(1, 1) for k in ("input_ids", "attention_mask", "action_mask")}, torch.zeros(1, 1))
    assert len(off) == 0


def test_a_resumed_run_with_replay_matches_the_uninterrupted_one(world, tmp_path):
    straight = critic_trainer(world, tmp_path / "a", steps=4, **RECIPE)
    straight.train()
    with pytest.raises(Killed):
        critic_trainer(world, tmp_path / "b", steps=4, callbacks=[KillAt("on_save", 2)], **RECIPE).train()
    assert (tmp_path / "b" / "run" / "checkpoints" / "step-2" / "value_replay.pt").is_file()
    resumed = critic_trainer(world, tmp_path / "b", steps=4, **RECIPE)
    resumed.train(resume=True)
    assert read_metrics(tmp_path / "b") == read_metrics(tmp_path / "a")
    for (name, p), (_, q) in zip(
        straight.model.named_parameters(), resumed.model.named_parameters(), strict=True
    ):
        assert p.equal(q), name


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"value_lam": 1.5}, "value_lam"),
        ({"cliprange_value": 0.0}, "cliprange_value"),
        ({"value_replay_steps": -1}, "value_replay_steps"),
        ({"value_replay_steps": 2, "value_mode": "shared_backbone"}, "value_mode"),
    ],
)
def test_the_critic_settings_are_checked(fields, message):
    with pytest.raises(ValueError, match=message):
        PPOConfig(output_dir="x", **fields)
