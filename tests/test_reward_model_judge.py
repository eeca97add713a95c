"""The model-judge reward: a local seq-cls model scores (question, answer, retrieved documents).

It must be one weighted, separately logged entry of a Rubric (also from YAML), read only the documents the
trajectory received, stay frozen, and refuse what it cannot use.
"""

from __future__ import annotations

import math

import pytest
import torch
from worlds import TINY_ONE_LAYER

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.models.tiny import build_policy, build_value_model, train_tokenizer
from searchrl.rewards.combine import RewardSpec, Rubric, load_rubric
from searchrl.rewards.judge import ModelJudgeReward, judge_text
from searchrl.rewards.qa import ExactMatchReward
from searchrl.rewards.reward_model import save_reward_model

SCORER = TINY_ONE_LAYER
TEXTS = [
    "Question: Where was Alda Korin born?\nAnswer: Port Velmora [d1]\nDocuments:\n[d1] Alda Korin was born in Port Velmora.",
    "<answer>Port Velmora [d1]</answer> Alda Korin born city country capital",
] * 5


@pytest.fixture(scope="module")
def tok():
    return train_tokenizer(TEXTS, vocab_size=400)


@pytest.fixture(scope="module")
def judge_model(tok):
    torch.manual_seed(0)
    model = build_value_model(tok, SCORER)
    with torch.no_grad():  # a non-zero head, so scores differ between inputs
        model.score.weight.normal_(0, 1.0)
    return model


def traj(answer="Port Velmora", retrieved=None, citations=("d1",)) -> Trajectory:
    retrieved = {"d1": "Alda Korin\nAlda Korin was born in Port Velmora."} if retrieved is None else retrieved
    return Trajectory(
        id="t",
        question_id="q",
        question="Where was Alda Korin born?",
        golds=["Port Velmora"],
        answer=answer,
        citations=list(citations),
        retrieved=retrieved,
        termination="answered",
        final_text=f"<answer>{answer}</answer>",
    )


def test_judge_text_holds_question_answer_and_only_retrieved_documents():
    text = judge_text(traj())
    assert "Question: Where was Alda Korin born?" in text
    assert "Answer: Port Velmora [d1]" in text
    assert "[d1] Alda Korin Alda Korin was born in Port Velmora." in text
    assert "(none retrieved)" in judge_text(traj(retrieved={}))


def test_judge_scores_are_deterministic_depend_on_the_input_and_match_a_batch(judge_model, tok):
    judge = ModelJudgeReward(judge_model, tok)
    a, b = traj(), traj(answer="Lake Dosthosden")
    assert judge(a) == judge(a)
    assert judge(a) != judge(b), "a different answer must be able to change the score"
    assert judge.score_batch([a, b]) == pytest.approx([judge(a), judge(b)], abs=1e-5)
    other_docs = traj(retrieved={"d9": "Something else entirely."})
    assert judge(other_docs) != judge(a), "the judge reads the retrieved documents"
    squashed = ModelJudgeReward(judge_model, tok, squash=True)
    assert squashed(a) == pytest.approx(1 / (1 + math.exp(-judge(a))), rel=1e-5)


def test_judge_is_frozen_and_passes_no_gradient(judge_model, tok):
    judge = ModelJudgeReward(judge_model, tok)
    assert all(not p.requires_grad for p in judge.model.parameters())
    value = judge(traj())
    assert isinstance(value, float)
    assert all(p.grad is None for p in judge.model.parameters())


def test_judge_is_one_weighted_separately_logged_rubric_entry(judge_model, tok):
    judge = ModelJudgeReward(judge_model, tok)
    rubric = Rubric([RewardSpec("em", ExactMatchReward(), 1.0), RewardSpec("judge", judge, 0.25)])
    t = traj()
    total, breakdown = rubric.score(t)
    assert breakdown["judge"] == pytest.approx(0.25 * judge(t))
    assert breakdown["em"] == 1.0
    assert total == pytest.approx(breakdown["em"] + breakdown["judge"])
    metric_only = Rubric([RewardSpec("em", ExactMatchReward(), 1.0), RewardSpec("judge", judge, 0.0)])
    total, breakdown = metric_only.score(t)
    assert total == 1.0 and breakdown["metric/judge"] == pytest.approx(judge(t))


def test_judge_loads_from_a_local_directory_through_rubric_yaml(judge_model, tok, tmp_path):
    path = save_reward_model(judge_model, tok, tmp_path / "judge")
    (tmp_path / "rubric.yaml").write_text(
        "terms:\n"
        "  - {function: exact_match, weight: 1.0}\n"
        f"  - {{function: model_judge, name: judge, weight: 0.1, params: {{model_path_or_model: '{path}'}}}}\n"
    )
    rubric = load_rubric(tmp_path / "rubric.yaml")
    t = traj()
    _, breakdown = rubric.evaluate(t)
    assert breakdown["judge"] == pytest.approx(0.1 * ModelJudgeReward(judge_model, tok)(t), abs=1e-5)


def test_judge_refuses_what_it_cannot_use(tok, tmp_path):
    with pytest.raises(ValueError, match="num_labels=1"):
        ModelJudgeReward(build_policy(tok, SCORER), tok)  # a causal LM, not a scorer
    with pytest.raises(ValueError, match="tokenizer"):
        ModelJudgeReward(build_value_model(tok, SCORER))
    with pytest.raises(ValueError, match="not a local model directory"):
        ModelJudgeReward(tmp_path / "missing")
    (tmp_path / "bad.yaml").write_text(
        f"terms:\n  - {{function: model_judge, params: {{model_path_or_model: '{tmp_path / 'nope'}'}}}}\n"
    )
    with pytest.raises(ConfigError, match="model_judge"):
        load_rubric(tmp_path / "bad.yaml")
