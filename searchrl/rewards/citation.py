"""Citation support: does a cited document exist in this episode, and does it say the answer?

A search agent that cites is checkable: each cited id must be one the trajectory actually received
(`traj.retrieved`, doc_id -> "title\\ntext") and that document must contain the normalised answer. Each
citation is one of

- supported: retrieved, and it contains the answer;
- unsupported: retrieved, but it does not contain the answer;
- fabricated: never retrieved in this episode (an invented or remembered id); penalised, because a
  citation the policy could not have read is the "spurious grounding" of `rl_methods.md` §4.1;

and an answer with no citation is "none". This reads retrieved documents by design, and only those the
trajectory received; it does not judge whether the answer is correct (that is `qa`'s job).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from searchrl.common.trajectory import Trajectory
from searchrl.rewards.qa import contains_answer

CITATION_STATUSES = ("supported", "unsupported", "fabricated", "none")


def classify_citation(doc_id: str, answer: str | None, retrieved: dict[str, str]) -> str:
    """The status of one cited document id: supported, unsupported or fabricated."""
    if doc_id not in retrieved:
        return "fabricated"
    if answer is not None and contains_answer(retrieved[doc_id], answer):
        return "supported"
    return "unsupported"


def classify_citations(traj: Trajectory) -> list[tuple[str, str]]:
    """(doc_id, status) for every distinct citation, in the order cited."""
    seen: dict[str, str] = {}
    for doc_id in traj.citations:
        if doc_id not in seen:
            seen[doc_id] = classify_citation(doc_id, traj.answer, traj.retrieved)
    return list(seen.items())


def citation_status(traj: Trajectory) -> str:
    """One word for the whole answer: fabricated beats everything, then supported, unsupported, none."""
    statuses = [s for _, s in classify_citations(traj)]
    if not statuses:
        return "none"
    if "fabricated" in statuses:
        return "fabricated"
    if "supported" in statuses:
        return "supported"
    return "unsupported"


@dataclass(frozen=True)
class CitationReward:
    """Mean over distinct citations of supported / unsupported / fabricated values; `none` without citations.

    A mean, not a max, so citing every retrieved document in the hope that one supports the answer pays
    less than citing the one that does.
    """

    supported: float = field(default=1.0, metadata={"help": "Value of a citation that supports the answer."})
    unsupported: float = field(
        default=0.0, metadata={"help": "Value of a retrieved citation that does not contain the answer."}
    )
    fabricated: float = field(
        default=-1.0, metadata={"help": "Value of a citation never retrieved in this episode (a penalty)."}
    )
    none: float = field(default=0.0, metadata={"help": "Value of an answer without any citation."})

    def __call__(self, traj: Trajectory) -> float:
        classified = classify_citations(traj)
        if not classified:
            return self.none
        values = {"supported": self.supported, "unsupported": self.unsupported, "fabricated": self.fabricated}
        return sum(values[status] for _, status in classified) / len(classified)


@dataclass(frozen=True)
class FabricationCount:
    """How many distinct cited ids were never retrieved (a metric: give it weight 0)."""

    def __call__(self, traj: Trajectory) -> float:
        return float(sum(1 for _, s in classify_citations(traj) if s == "fabricated"))
