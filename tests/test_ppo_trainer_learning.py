"""A short PPO run raises the dev-split reward over its first steps (fixed seeds, CPU).

Two runs, each a real pipeline: rollouts through the search environment, GAE over action tokens,
clipped updates, the KL penalty to the reference, dev questions never trained on and scored with the
same sampling before and after.

1. The synthetic task under the QA rubric (about a minute): `searchrl train --config
   configs/ppo_tiny.yaml` through the CLI, on the demo's world (`searchrl data synth --size small`),
   from the demo's SFT warm start shipped in tests/fixtures/demo_warm_start (see its
   `refresh_demo_warm_start.py` for why it is shipped rather than trained here, and `make fixtures` to
   rebuild it). The dev reward is the trainer's own evaluation of the first 64 dev questions.
2. An untrained tiny model on the learnable `LikedTokens` stand-in from `test_ppo_trainer.py` (the share
   of sampled tokens whose id is a multiple of 4; seconds): the same trainer with no warm start at all.
"""

from __future__ import annotations

import copy
import hashlib
import json
from pathlib import Path

from test_ppo_trainer import QA, LikedTokens, env_factory, make_args
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.common.io import read_jsonl
from searchrl.data.synthetic import generate, preset_config
from searchrl.ppo.trainer import PPOTrainer

REPO = Path(__file__).resolve().parents[1]
WARM_START = REPO / "tests" / "fixtures" / "demo_warm_start"

DEV = [
    {"id": "v1", "question": "Who was born in Tiberk?", "golds": ["Amsel Drov"]},
    {"id": "v2", "question": "What is the capital of Quessa?", "golds": ["Orlenn"]},
    {"id": "v3", "question": "When was Orlenn founded?", "golds": ["1288"]},
    {"id": "v4", "question": "What kind of place is Tiberk?", "golds": ["fishing village"]},
]


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


def synthesise_the_demo_world(data_dir: Path) -> None:
    """What `searchrl data synth --size small --seed 0` and the demo's data stage write."""
    generate(preset_config("small", seed=0)).write(data_dir)


def assert_the_warm_start_was_trained_for(data_dir: Path) -> None:
    provenance = json.loads((WARM_START / "provenance.json").read_text())
    for name, digest in provenance["data_sha256"].items():
        actual = hashlib.sha256((data_dir / name).read_bytes()).hexdigest()
        assert actual == digest, (
            f"the synthetic generator now writes a different {name} than the one the shipped warm start "
            "was trained on; rebuild the fixture with `make fixtures` (runs the demo, about 15 minutes)"
        )


def test_short_ppo_run_on_the_synthetic_task_raises_the_dev_reward_under_the_qa_rubric(tmp_path):
    data = tmp_path / "data"
    synthesise_the_demo_world(data)
    assert_the_warm_start_was_trained_for(data)
    train, dev = read_jsonl(data / "train.jsonl"), read_jsonl(data / "dev.jsonl")
    assert not {r["question"] for r in train} & {r["question"] for r in dev}  # dev is held out
    values = {
        "policy_model_path": WARM_START,
        "train_file": data / "train.jsonl",
        "dev_file": data / "dev.jsonl",
        "corpus_path": data / "corpus.jsonl",
        "index_dir": tmp_path / "index",
        "output_dir": tmp_path / "run",
        "reward_config_path": REPO / "configs" / "rewards_default.yaml",
        # The shipped config's settings, with 10 steps instead of 20 and a learning rate to match
        # (measured with 3e-5: the dev reward does not move in 10 steps).
        "total_episodes": 320,
        "learning_rate": 1e-4,
        "seed": 0,
        "eval_steps": 5,
        "num_eval_questions": 64,
        "save_steps": 1000,
        "save_trajectories": "false",
        "progress_bar": "false",
    }
    sets = [arg for k, v in values.items() for arg in ("--set", f"{k}={v}")]
    result = CliRunner().invoke(app, ["train", "--config", str(REPO / "configs" / "ppo_tiny.yaml"), *sets])
    assert result.exit_code == 0, result.output

    evals = {r["step"]: r for r in read_jsonl(tmp_path / "run" / "metrics.jsonl") if "eval/reward" in r}
    assert sorted(evals) == [0, 5, 10]
    reward = [evals[s]["eval/reward"] for s in (0, 5, 10)]
    em = [evals[s]["eval/exact_match"] for s in (0, 5, 10)]
    searches = [evals[s]["eval/searches_per_question"] for s in (0, 5, 10)]
    print("dev reward, exact match, searches at steps 0, 5, 10:", reward, em, searches)
    # Measured with the warm start of commit 75d4942 (seed 0): reward 0.938 -> 1.075 -> 1.158, exact
    # match 0.64 -> 0.80 -> 0.875, searches 1.0 -> 1.25 -> 1.34. The rubric pays F1 (1.0) plus a cited,
    # retrieved source (0.2) and the format (0.1), so a reward near 1.3 is a right, cited answer.
    assert 0.7 < reward[0] < 1.1, reward  # the warm start answers (and cites) a good share already
    assert reward[0] <= reward[1] < reward[2], reward
    assert reward[2] > reward[0] + 0.1, reward
    # The rise is the task, not a loophole in the rubric: more answers are right, and they come from
    # more searching (the second hop of two-hop questions the warm start answers after one).
    assert em[2] > em[0] + 0.1, em
    assert searches[0] <= searches[1] <= searches[2] and searches[2] > searches[0], searches
