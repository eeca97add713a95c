"""EM and F1 exactly as SQuAD v1.1 (DESIGN.md's contract), on tricky cases and as properties."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from searchrl.common.trajectory import Trajectory
from searchrl.rewards.qa import (
    ContainsReward,
    ExactMatchReward,
    F1Reward,
    contains_answer,
    exact_match,
    f1_score,
    normalize_answer,
)

# (prediction, golds, exact match, F1)
TRICKY = [
    ("The Eiffel Tower", "eiffel tower", 1.0, 1.0),  # article and case
    ("  Paris\n\t", "paris", 1.0, 1.0),  # white space
    ("Paris!", "Paris", 1.0, 1.0),  # punctuation
    ("a cat", "the cat", 1.0, 1.0),  # articles are dropped on both sides
    ("Anna Theron", "anna theron", 1.0, 1.0),  # "an" inside a word is not an article
    ("U.S.A.", "USA", 1.0, 1.0),  # punctuation is deleted, not turned into a space
    ("rock-n-roll", "rocknroll", 1.0, 1.0),
    ("Paris", ["London", "paris"], 1.0, 1.0),  # several golds: the best one counts
    ("Paris France", "Paris", 0.0, 2 / 3),
    ("paris paris", "paris", 0.0, 2 / 3),  # multiset overlap: repeating a word does not help
    ("New York City", ["York", "New York"], 0.0, 0.8),
    ("London", "Paris", 0.0, 0.0),
    ("Café", "cafe", 0.0, 0.0),  # SQuAD v1.1 does not fold accents
    ("", "", 1.0, 0.0),  # both empty: an exact match without a common token (SQuAD v1.1's F1 is 0)
    ("the", "a", 1.0, 0.0),  # both normalise to empty
    ("a an the", "the", 1.0, 0.0),
    ("", "Paris", 0.0, 0.0),  # empty prediction
    ("Paris", "", 0.0, 0.0),  # empty gold
    ("", ["", "Paris"], 1.0, 0.0),
]


@pytest.mark.parametrize(("prediction", "golds", "em", "f1"), TRICKY)
def test_exact_match_and_f1_on_tricky_cases(prediction, golds, em, f1):
    assert exact_match(prediction, golds) == em
    assert f1_score(prediction, golds) == pytest.approx(f1)


def test_normalize_answer_follows_squad():
    assert normalize_answer("  The  Quick, brown FOX!  ") == "quick brown fox"
    assert normalize_answer("An apple a day") == "apple day"
    assert normalize_answer("") == ""


def test_bad_gold_lists_are_refused():
    with pytest.raises(ValueError, match="ground_truths is empty"):
        exact_match("x", [])
    with pytest.raises(TypeError, match="must hold strings"):
        f1_score("x", ["a", 3])  # type: ignore[list-item]


def test_contains_answer_matches_whole_words_only():
    assert contains_answer("Alda Korin was born in Port Velmora.", "port velmora")
    assert contains_answer("It is also called Velmora.", "Velmora")
    assert not contains_answer("the Velmoran coast", "Velmora")
    assert not contains_answer("anything", "the")  # an answer that normalises to nothing supports nothing


# Pieces that exercise every normalisation step: letters, case, punctuation, white space and articles.
_pieces = st.sampled_from(list("abcAB .,!-\t") + ["the ", "an ", "A ", "Paris ", "ana"])
text = st.lists(_pieces, max_size=12).map("".join)


@given(text)
def test_normalisation_is_idempotent(s):
    assert normalize_answer(normalize_answer(s)) == normalize_answer(s)


@given(text, text)
def test_f1_is_a_symmetric_score_between_zero_and_one_and_em_implies_f1_unless_empty(a, b):
    f1 = f1_score(a, b)
    assert 0.0 <= f1 <= 1.0
    assert f1 == pytest.approx(f1_score(b, a))
    empty = normalize_answer(a) == ""
    if exact_match(a, b) == 1.0:
        assert f1 == (0.0 if empty else 1.0)  # SQuAD v1.1: two empty answers share no token
    assert exact_match(a, a) == 1.0 and f1_score(a, a) == (0.0 if empty else 1.0)


@given(text, st.lists(text, min_size=1, max_size=4), text)
def test_more_golds_never_lower_the_score(prediction, golds, extra):
    assert exact_match(prediction, [*golds, extra]) >= exact_match(prediction, golds)
    assert f1_score(prediction, [*golds, extra]) >= f1_score(prediction, golds)
    assert f1_score(prediction, golds) == max(f1_score(prediction, g) for g in golds)


@given(
    text, text, st.sampled_from([str.upper, str.lower, str.title, lambda s: f"  {s}\n", lambda s: f"{s}."])
)
def test_scores_are_invariant_to_case_and_white_space_of_the_gold(prediction, gold, change):
    assert exact_match(prediction, change(gold)) == exact_match(prediction, gold)
    assert f1_score(prediction, change(gold)) == pytest.approx(f1_score(prediction, gold))


def _traj(answer: str | None, golds: list[str]) -> Trajectory:
    return Trajectory(id="t", question_id="q", question="Where?", golds=golds, answer=answer)


def test_trajectory_correctness_rewards_read_the_answer_and_cap_its_length():
    golds = ["Port Velmora", "Velmora"]
    assert ExactMatchReward()(_traj("port velmora", golds)) == 1.0
    assert ExactMatchReward()(_traj("Velmora.", golds)) == 1.0
    assert F1Reward()(_traj("Port Kesh", golds)) == pytest.approx(0.5)
    assert ExactMatchReward()(_traj(None, golds)) == 0.0 and F1Reward()(_traj(None, golds)) == 0.0
    long = "Velmora " + " ".join(f"w{i}" for i in range(20))
    assert F1Reward(max_answer_words=16)(_traj(long, golds)) == 0.0
    assert F1Reward(max_answer_words=0)(_traj(long, golds)) > 0.0  # 0 switches the cap off
    assert ContainsReward()(_traj(long, golds)) == 1.0  # the hackable one pays for it
