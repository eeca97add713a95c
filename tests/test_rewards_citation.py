"""Citation support: supported, unsupported, fabricated, none, and mixtures."""

from __future__ import annotations

import pytest

from searchrl.common.trajectory import Trajectory
from searchrl.rewards.citation import (
    CitationReward,
    FabricationCount,
    citation_status,
    classify_citations,
)

RETRIEVED = {
    "d000001": "Alda Korin\nAlda Korin was born in Port Velmora.",
    "d000002": "Alda Korin\nA review of The Kesh Song mentions Alda Korin in passing.",
    "d000003": "Port Velmora\nPort Velmora is a city in the country of Drasia. It is also called Velmora.",
}


def _traj(answer: str | None, citations: list[str], retrieved=None) -> Trajectory:
    return Trajectory(
        id="t",
        question_id="q",
        question="Where was Alda Korin born?",
        golds=["Port Velmora", "Velmora"],
        answer=answer,
        citations=citations,
        retrieved=dict(RETRIEVED if retrieved is None else retrieved),
    )


@pytest.mark.parametrize(
    ("answer", "citations", "status", "reward"),
    [
        ("Port Velmora", ["d000001"], "supported", 1.0),
        ("port velmora.", ["d000001"], "supported", 1.0),  # the answer is matched after normalisation
        ("Port Velmora", ["d000002"], "unsupported", 0.0),  # retrieved, but it does not say so
        ("Port Velmora", ["d999999"], "fabricated", -1.0),  # never retrieved in this episode
        ("Port Velmora", [], "none", 0.0),
    ],
)
def test_the_four_citation_cases(answer, citations, status, reward):
    traj = _traj(answer, citations)
    assert citation_status(traj) == status
    assert CitationReward()(traj) == reward


def test_a_document_in_the_corpus_but_not_retrieved_here_is_still_a_fabrication():
    traj = _traj("Port Velmora", ["d000001"], retrieved={"d000002": RETRIEVED["d000002"]})
    assert citation_status(traj) == "fabricated"
    assert FabricationCount()(traj) == 1.0


def test_citing_everything_pays_less_than_citing_the_support():
    precise = _traj("Port Velmora", ["d000001"])
    everything = _traj("Port Velmora", ["d000001", "d000002", "d000003"])
    assert classify_citations(everything) == [
        ("d000001", "supported"),
        ("d000002", "unsupported"),
        ("d000003", "supported"),
    ]
    assert CitationReward()(everything) == pytest.approx(2 / 3)
    assert CitationReward()(everything) < CitationReward()(precise)
    # A fabricated id anywhere marks the answer as fabricated and drags the mean down.
    mixed = _traj("Port Velmora", ["d000001", "d404"])
    assert citation_status(mixed) == "fabricated" and CitationReward()(mixed) == 0.0


def test_repeated_citations_count_once_and_no_answer_supports_nothing():
    assert CitationReward()(_traj("Port Velmora", ["d000002", "d000002", "d000001"])) == pytest.approx(0.5)
    assert citation_status(_traj(None, ["d000001"])) == "unsupported"
    assert citation_status(_traj("", ["d000001"])) == "unsupported"


def test_values_are_configurable():
    reward = CitationReward(supported=2.0, unsupported=-0.5, fabricated=-3.0, none=-0.1)
    assert reward(_traj("Port Velmora", ["d000001"])) == 2.0
    assert reward(_traj("Port Velmora", ["d000002"])) == -0.5
    assert reward(_traj("Port Velmora", ["d7"])) == -3.0
    assert reward(_traj("Port Velmora", [])) == -0.1


def test_a_substring_of_a_longer_word_is_not_support():
    retrieved = {"d1": "Velmoran\nThe Velmoran coast is long."}
    assert citation_status(_traj("Velmora", ["d1"], retrieved=retrieved)) == "unsupported"
