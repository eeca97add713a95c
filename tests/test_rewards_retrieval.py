"""The retrieval term and the staged reward (`searchrl.rewards.retrieval`), alone and from a rubric YAML."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from searchrl.common.config import ConfigError
from searchrl.common.trajectory import Trajectory
from searchrl.rewards.combine import REWARD_FUNCTIONS, load_rubric
from searchrl.rewards.retrieval import RetrievalReward, StagedReward, answer_retrieved

ROOT = Path(__file__).resolve().parents[1]


def episode(answer, golds, retrieved, well_formed=True):
    final = f"<answer>{answer} [1]</answer>" if answer is not None else ""
    if answer is not None and not well_formed:
        final += "<answer>again</answer>"
    return Trajectory(
        id="t",
        question_id="q",
        question="Where was Rhen born?",
        golds=golds,
        retrieved=retrieved,
        answer=answer,
        final_text=final,
        termination="answered" if answer is not None else "max_turns",
    )


FOUND = {"d1": "Rhen\nRhen was born in Port Velmora in 1801."}
MISSED = {"d2": "Kesh\nKesh is a town on the coast."}


def test_answer_retrieved_reads_the_shown_documents_as_whole_words():
    assert answer_retrieved(episode("x", ["Port Velmora"], FOUND))
    assert answer_retrieved(
        episode("x", ["nobody", "the Port Velmora"], {**MISSED, **FOUND})
    )  # any gold, any doc
    assert not answer_retrieved(episode("x", ["Port Velmora"], MISSED))
    assert not answer_retrieved(episode("x", ["Velmor"], FOUND))  # whole words only
    assert not answer_retrieved(episode("x", ["no"], {"d": "There is no town here."}))  # yes/no never counts
    assert not answer_retrieved(episode("x", ["Port Velmora"], {}))


def test_retrieval_reward_pays_a_find_whatever_the_answer():
    reward = RetrievalReward()
    assert reward(episode("Kesh", ["Port Velmora"], FOUND)) == 1.0  # found it, answered wrong: still paid
    assert reward(episode(None, ["Port Velmora"], FOUND)) == 1.0
    assert reward(episode("Port Velmora", ["Port Velmora"], MISSED)) == 0.0
    assert RetrievalReward(hit=0.5, miss=-0.1)(episode("Kesh", ["Port Velmora"], MISSED)) == -0.1


def test_staged_reward_pays_format_then_retrieval_then_answer():
    staged = StagedReward()  # fail 0, format 0.1, retrieval 0.3, answer 1.0 x F1
    golds = ["Port Velmora"]
    assert staged(episode(None, golds, FOUND)) == 0.0  # no answer: nothing, even with the document found
    assert staged(episode("Port Velmora", golds, FOUND, well_formed=False)) == 0.0
    assert staged(episode("Kesh", golds, MISSED)) == pytest.approx(0.1)
    assert staged(episode("Kesh", golds, FOUND)) == pytest.approx(0.4)
    assert staged(episode("Velmora", golds, FOUND)) == pytest.approx(0.4 + 2 / 3)  # F1 2/3
    assert staged(episode("Port Velmora", golds, FOUND)) == pytest.approx(1.4)
    assert staged(episode("Port Velmora", golds, MISSED)) == pytest.approx(1.1)  # right without the find
    em = StagedReward(metric="exact_match", fail=-0.5)
    assert em(episode("Velmora", golds, FOUND)) == pytest.approx(0.4)
    assert em(episode(None, golds, FOUND)) == -0.5
    with pytest.raises(ValueError, match="metric"):
        StagedReward(metric="bleu")


@settings(max_examples=80, deadline=None)
@given(
    answer=st.one_of(st.none(), st.sampled_from(["Port Velmora", "Velmora", "Kesh", "Port Velmora, Kesh"])),
    found=st.booleans(),
    well_formed=st.booleans(),
)
def test_staged_levels_are_ordered(answer, found, well_formed):
    """A level never pays less than the one below it: a well-formed answer beats none, a find beats no find,
    and a better answer beats a worse one with the same find."""
    staged, golds = StagedReward(), ["Port Velmora"]
    docs = FOUND if found else MISSED
    value = staged(episode(answer, golds, docs, well_formed))
    assert staged(episode(None, golds, docs)) <= value <= 1.4
    if answer is not None and well_formed:
        assert value >= 0.1
        assert staged(episode(answer, golds, FOUND)) >= staged(episode(answer, golds, MISSED))
        assert staged(episode("Port Velmora", golds, docs)) >= value


def test_rubric_yamls_for_the_real_loop_build(tmp_path):
    assert REWARD_FUNCTIONS["retrieval"] is RetrievalReward and REWARD_FUNCTIONS["staged"] is StagedReward
    for name in ("rewards_em.yaml", "rewards_staged.yaml", "rewards_retrieval.yaml"):
        rubric = load_rubric(ROOT / "configs" / "real" / name)
        assert rubric.reward_names, name
        total, breakdown = rubric.evaluate(episode("Port Velmora", ["Port Velmora"], FOUND))
        assert total > 0 and breakdown, name
    bad = tmp_path / "bad.yaml"
    bad.write_text("terms:\n  - function: staged\n    params: {metric: bleu}\n")
    with pytest.raises(ConfigError, match="bleu"):
        load_rubric(bad)
