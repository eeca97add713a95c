"""The learned reward model: BT loss as TRL computes it, pairs from trajectories, training, freezing, datasets.

Real components: TRL 1.16's RewardTrainer trains a tiny Qwen2 sequence-classification model; pairs come
from expert trajectories run through the real environment, BM25 index and rollout engine.
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from datasets import Dataset
from hypothesis import given, settings
from hypothesis import strategies as st
from worlds import TINY_ONE_LAYER

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.models.io import load_value_model
from searchrl.models.tiny import build_policy, build_value_model, tokenizer_training_texts, train_tokenizer
from searchrl.rewards.reward_model import (
    FrozenRewardModel,
    PreferencePair,
    RewardModelConfig,
    bradley_terry_loss,
    build_preference_pairs,
    check_preference_dataset,
    judge_trajectory,
    load_preference_dataset,
    make_reward_trainer,
    pairs_dataset,
    pairwise_accuracy,
    right_pad,
    save_reward_model,
    split_pairs,
    train_reward_model,
)
from searchrl.sft.expert import ExpertConfig, ExpertPolicy
from searchrl.sft.pipeline import prompt_texts

SCORER = TINY_ONE_LAYER

# -- the loss (rl_methods.md §8 item 24) -------------------------------------------------------------

_REWARD = st.floats(-20, 20, allow_nan=False)


@settings(max_examples=100, deadline=None)
@given(r_c=_REWARD, r_r=_REWARD, m1=st.floats(0, 10), m2=st.floats(0, 10))
def test_bt_loss_is_monotone_increasing_in_the_margin(r_c, r_r, m1, m2):
    lo, hi = sorted((m1, m2))
    rc, rr = torch.tensor([r_c], dtype=torch.float64), torch.tensor([r_r], dtype=torch.float64)
    assert bradley_terry_loss(rc, rr, margin=lo) <= bradley_terry_loss(rc, rr, margin=hi) + 1e-12
    if hi - lo > 1e-3 and abs(r_c - r_r - lo) < 15:  # strictly where logsigmoid is not saturated
        assert bradley_terry_loss(rc, rr, margin=lo) < bradley_terry_loss(rc, rr, margin=hi)


@settings(max_examples=50, deadline=None)
@given(r=_REWARD, coef=st.floats(0.0, 1.0))
def test_bt_loss_is_log2_at_equal_rewards_and_centering_vanishes_at_opposite_rewards(r, coef):
    same = torch.tensor([r, -r], dtype=torch.float64)
    assert math.isclose(float(bradley_terry_loss(same, same)), math.log(2), rel_tol=1e-9)
    rc, rr = torch.tensor([r], dtype=torch.float64), torch.tensor([-r], dtype=torch.float64)
    plain = bradley_terry_loss(rc, rr)
    centred = bradley_terry_loss(rc, rr, center_rewards_coefficient=coef)
    assert math.isclose(float(plain), float(centred), rel_tol=1e-12, abs_tol=1e-12)
    # ...and is positive otherwise.
    shifted = bradley_terry_loss(rc + 1.0, rr + 1.0, center_rewards_coefficient=0.5)
    assert float(shifted) > float(bradley_terry_loss(rc + 1.0, rr + 1.0))


# -- a tiny world with expert trajectories --------------------------------------------------------


@pytest.fixture(scope="module")
def world(synthetic_index):
    torch.set_num_threads(1)
    synthetic = synthetic_index(5)
    task, backend = synthetic.task, synthetic.backend
    rows = task.splits["train"][:16]
    probe = SearchEnvironment(backend, EnvConfig())
    tok = train_tokenizer(
        tokenizer_training_texts(task.corpus, task.splits["train"]) + prompt_texts(probe, rows),
        vocab_size=1024,
    )
    policy = build_policy(tok, SCORER)
    trajs = []
    # The same questions twice: once solved cleanly, once with an imperfection (same question ids).
    for noise in (0.0, 1.0):
        envs = [SearchEnvironment(backend, EnvConfig(), tokenizer=tok) for _ in rows]
        config = ExpertConfig(noise=noise, k=1, noise_kinds=["no_search", "no_citation", "one_hop"])
        batch = ExpertPolicy(config).demonstrate(policy, tok, envs, rows)
        for t in batch:  # the engine numbers trajectories per call; keep the two runs' ids apart
            t.id = f"{t.id}/noise={noise}"
        trajs += batch
    return {"task": task, "tok": tok, "trajs": trajs, "rows": rows}


def test_pairs_pair_correct_supported_with_wrong_unsupported_or_malformed(world):
    pairs = build_preference_pairs(world["trajs"], with_margin=True)
    by_id = {t.id: t for t in world["trajs"]}
    assert len(pairs) == len(world["rows"]), "one clean and one imperfect trajectory per question"
    reasons = set()
    for pair in pairs:
        good, bad = by_id[pair.chosen_id], by_id[pair.rejected_id]
        assert good.question_id == bad.question_id == pair.question_id
        assert judge_trajectory(good) == "chosen"
        assert pair.rejected_reason == judge_trajectory(bad) != "chosen"
        assert pair.chosen_ids == good.input_ids and pair.rejected_ids == bad.input_ids
        assert pair.margin >= 0.0
        reasons.add(pair.rejected_reason)
        if pair.rejected_reason == "wrong":  # the rule reward (F1 first) separates these clearly
            assert pair.margin > 0.5
    assert reasons == {"wrong", "unsupported"}
    assert all(p.margin == 0.0 for p in build_preference_pairs(world["trajs"]))


def test_malformed_answers_are_rejected_and_questions_without_a_chosen_give_no_pair(world):
    traj = next(t for t in world["trajs"] if judge_trajectory(t) == "chosen")
    broken = type(traj).from_dict(
        {**traj.to_dict(), "id": "broken", "termination": "no_answer", "answer": None}
    )
    assert judge_trajectory(broken) == "malformed"
    assert build_preference_pairs([broken]) == []
    with pytest.raises(ValueError, match="no preference pairs"):
        pairs_dataset([])


def test_split_pairs_holds_out_whole_questions(world):
    pairs = build_preference_pairs(world["trajs"])
    train, held = split_pairs(pairs, 0.25, seed=0)
    assert held and train
    assert not {p.question_id for p in train} & {p.question_id for p in held}
    assert len(train) + len(held) == len(pairs)


def test_reward_trainer_compute_loss_equals_bradley_terry_loss(world, tmp_path):
    pairs = build_preference_pairs(world["trajs"], with_margin=True)[:4]
    dataset = pairs_dataset(pairs, with_margin=True)
    model = build_value_model(world["tok"], SCORER)
    config = RewardModelConfig(per_device_train_batch_size=4, center_rewards_coefficient=0.01, max_steps=1)
    trainer = make_reward_trainer(model, world["tok"], dataset, config=config, output_dir=str(tmp_path))
    batch = next(iter(trainer.get_train_dataloader()))
    assert "margin" in batch
    model.train()
    trl_loss = trainer.compute_loss(model, dict(batch))
    logits = model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits.squeeze(-1)
    r_c, r_r = torch.chunk(logits, 2)
    ours = bradley_terry_loss(r_c, r_r, margin=batch["margin"], center_rewards_coefficient=0.01)
    assert torch.allclose(trl_loss, ours, atol=1e-6)
    # The frozen scorer reads the same logit as the trainer's model (the last real token).
    frozen = FrozenRewardModel(model).score(batch["input_ids"], batch["attention_mask"])
    assert torch.allclose(frozen, logits.detach(), atol=1e-5)


def test_trajectory_pairs_train_through_reward_trainer(world):
    pairs = build_preference_pairs(world["trajs"])
    model = build_value_model(world["tok"], SCORER)
    before = [p.detach().clone() for p in model.parameters()]
    config = RewardModelConfig(max_steps=3, per_device_train_batch_size=4, learning_rate=1e-3)
    outcome = train_reward_model(model, world["tok"], pairs_dataset(pairs), config=config)
    assert len(outcome.losses) == 3 and all(math.isfinite(x) for x in outcome.losses)
    assert any(
        not torch.equal(a, b.detach()) for a, b in zip(before, outcome.model.parameters(), strict=True)
    )


# -- a separable synthetic preference set: accuracy on held-out pairs -------------------------------


def _text_pairs(rows: list[dict]) -> list[dict]:
    """Chosen: a tagged, cited answer. Rejected (one pair each): uncited, untagged, stuffed with candidates."""
    out = []
    for i, row in enumerate(rows):
        gold, doc = row["golds"][0], row["supporting_doc_ids"][-1]
        other = rows[(i + 1) % len(rows)]["golds"][0]
        prompt, chosen = f"Question: {row['question']}\n", f"<answer>{gold} [{doc}]</answer>"
        for rejected in (
            f"<answer>{gold}</answer>",
            f"{gold} [{doc}]",
            f"<answer>{other}, {gold}, {other} [{doc}]</answer>",
        ):
            out.append({"prompt": prompt, "chosen": chosen, "rejected": rejected})
    return out


def test_reward_model_reaches_high_held_out_accuracy_and_its_parameters_change(world, tmp_path):
    tok = world["tok"]
    rows = world["task"].splits["train"]
    train_rows, held_rows = _text_pairs(rows), _text_pairs(world["task"].splits["dev"])
    model = build_value_model(tok, SCORER)
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    config = RewardModelConfig(num_train_epochs=3, per_device_train_batch_size=8, learning_rate=3e-3)
    outcome = train_reward_model(
        model, tok, Dataset.from_list(train_rows), Dataset.from_list(held_rows), config
    )
    assert outcome.metrics["eval_accuracy"] >= 0.9, outcome.metrics
    changed = [n for n, p in outcome.model.named_parameters() if not torch.equal(before[n], p.detach())]
    assert len(changed) == len(before)

    # The same accuracy through the frozen scorer PPO uses (ids tokenised like TRL: text + EOS).
    def ids(text: str) -> list[int]:
        return tok(text + tok.eos_token)["input_ids"]

    held = [
        PreferencePair("q", ids(r["prompt"] + r["chosen"]), ids(r["prompt"] + r["rejected"]))
        for r in held_rows
    ]
    assert pairwise_accuracy(outcome.model, held) >= 0.9
    # Saved with save_pretrained, it loads back and scores the same.
    out = save_reward_model(outcome.model, tok, tmp_path / "rm")
    again = load_value_model(out)
    assert pairwise_accuracy(again, held) == pairwise_accuracy(outcome.model, held)


def test_frozen_scorer_gets_no_gradient(world):
    tok = world["tok"]
    model = build_value_model(tok, SCORER)
    scorer = FrozenRewardModel(model)
    assert all(not p.requires_grad for p in model.parameters())
    ids, mask = right_pad([[5, 6, 7, 8], [9, 10]], tok.pad_token_id)
    scores = scorer.score(ids, mask)
    assert not scores.requires_grad
    # A loss that mixes a trainable tensor with the RM score sends no gradient into the RM.
    weight = torch.ones(2, requires_grad=True)
    (weight * scores).sum().backward()
    assert weight.grad is not None
    assert all(p.grad is None for p in model.parameters())


# -- user preference datasets ------------------------------------------------------------------------


def test_text_conversational_and_pretokenised_datasets_are_accepted():
    check_preference_dataset(Dataset.from_list([{"prompt": "q", "chosen": "a", "rejected": "b"}]))
    check_preference_dataset(Dataset.from_list([{"chosen": "a", "rejected": "b", "margin": 1.0}]))
    conv = {
        "prompt": [{"role": "user", "content": "q"}],
        "chosen": [{"role": "assistant", "content": "a"}],
        "rejected": [{"role": "assistant", "content": "b"}],
    }
    check_preference_dataset(Dataset.from_list([conv]))
    check_preference_dataset(Dataset.from_list([{"chosen_ids": [1, 2], "rejected_ids": [3]}]))


@pytest.mark.parametrize(
    "rows, needles",
    [
        (
            [{"prompt": "q", "response": "a", "score": 0.7}],
            ["pair of texts", "not a score", "score", "convert"],
        ),
        ([{"prompt": "q", "chosen": "a", "chosen_score": 1, "rejected_score": 0}], ["rejected", "missing"]),
        ([{"prompt": "q", "chosen": "a"}], ["'rejected'", "missing", "pair of texts"]),
        ([{"chosen": "a", "rejected": "b", "rating": 3}], ["rating", "not a preference"]),
        ([{"chosen": 1, "rejected": 2}], ["'chosen'", "text or a list of chat messages"]),
    ],
)
def test_scored_or_incomplete_datasets_are_refused_with_how_to_convert(rows, needles):
    with pytest.raises(ValueError) as err:
        check_preference_dataset(Dataset.from_list(rows))
    for needle in needles:
        assert needle in str(err.value)


def test_trainer_refuses_a_scored_dataset_before_training(world):
    scored = Dataset.from_list([{"prompt": "q", "completion": "a", "score": 1.0}])
    with pytest.raises(ValueError, match="pair of texts"):
        make_reward_trainer(build_value_model(world["tok"], SCORER), world["tok"], scored)


def test_load_preference_dataset_reads_jsonl_and_checks_it(tmp_path):
    good = tmp_path / "prefs.jsonl"
    good.write_text(json.dumps({"prompt": "q", "chosen": "a", "rejected": "b"}) + "\n")
    assert load_preference_dataset(good).column_names == ["prompt", "chosen", "rejected"]
    bad = tmp_path / "scores.jsonl"
    bad.write_text(json.dumps({"prompt": "q", "response": "a", "reward": 0.2}) + "\n")
    with pytest.raises(ValueError, match="not a score"):
        load_preference_dataset(bad)
    with pytest.raises(ValueError, match="unsupported"):
        load_preference_dataset(tmp_path / "prefs.csv")


def test_a_conversational_preference_dataset_trains_end_to_end(world):
    rows = [
        {
            "prompt": [{"role": "user", "content": f"Where was person {i} born?"}],
            "chosen": [{"role": "assistant", "content": f"<answer>City{i} [d{i}]</answer>"}],
            "rejected": [{"role": "assistant", "content": f"City{i}"}],
        }
        for i in range(4)
    ]
    model = build_value_model(world["tok"], SCORER)
    config = RewardModelConfig(max_steps=2, per_device_train_batch_size=2)
    outcome = train_reward_model(model, world["tok"], Dataset.from_list(rows), config=config)
    assert len(outcome.losses) == 2 and all(math.isfinite(x) for x in outcome.losses)
