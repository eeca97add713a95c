"""Rewards for what a search found: a retrieval term, and a staged reward (format, then retrieval, then answer).

What: `answer_retrieved(traj)` is True when a document the policy was shown holds a gold answer (whole words,
normalised; `rewards.qa.contains_answer`): the paragraph a question needs was found. For SQuAD that is the
question's own paragraph (or another of its article that states the answer), for a HotpotQA bridge question
the second hop's paragraph. Yes/no golds never count (a "no" occurs in many paragraphs). `RetrievalReward` pays
it as a term of its own; `StagedReward` pays three levels in order, each only when the one before is met:
a well-formed final answer (`format`), then a shown document holding the answer (`retrieval`), then the answer's
F1 or exact match (`answer` times it; a right answer is paid whether or not its document was found, so a
yes/no comparison can still earn it).

Why: F1 and exact match say nothing until the answer is right; a policy that searched well and answered
wrong gets what one that never searched gets. R1-Searcher (Song et al. 2025) first trains retrieval and format
alone, then the answer; `StagedReward` is the stateless form of that order inside one episode, and
`RetrievalReward` the retrieval term beside any rubric. Both read only the documents the trajectory received
(`traj.retrieved`) and its golds: no supporting-paragraph labels, so they work with any question file and in
any trainer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from searchrl.common.trajectory import Trajectory
from searchrl.rewards.qa import contains_answer, exact_match, f1_score, normalize_answer
from searchrl.rewards.shaping import is_well_formed

YES_NO = ("yes", "no")


def answer_retrieved(traj: Trajectory) -> bool:
    """A document shown in the episode holds a (non yes/no) gold answer, as whole words after normalisation."""
    golds = [g for g in traj.golds if normalize_answer(g) and normalize_answer(g) not in YES_NO]
    return any(contains_answer(text, g) for text in traj.retrieved.values() for g in golds)


@dataclass(frozen=True)
class RetrievalReward:
    """`hit` when a shown document holds a gold answer (`answer_retrieved`), else `miss`."""

    hit: float = field(default=1.0, metadata={"help": "Value when a shown document holds a gold answer."})
    miss: float = field(default=0.0, metadata={"help": "Value when none does (or the golds are yes/no)."})

    def __call__(self, traj: Trajectory) -> float:
        return self.hit if answer_retrieved(traj) else self.miss


@dataclass(frozen=True)
class StagedReward:
    """Format, then retrieval, then answer: `fail` for an episode without one well-formed final answer; else
    `format`, plus `retrieval` when a shown document holds a gold, plus `answer` times the answer's score."""

    fail: float = field(
        default=0.0, metadata={"help": "Value of an episode without a well-formed final answer (e.g. -0.5)."}
    )
    format: float = field(default=0.1, metadata={"help": "Paid for a well-formed final answer."})
    retrieval: float = field(
        default=0.3,
        metadata={"help": "Added when the answer is well formed and a shown document holds a gold."},
    )
    answer: float = field(
        default=1.0, metadata={"help": "Weight of the answer's score (added when well formed)."}
    )
    metric: Literal["f1", "exact_match"] = field(
        default="f1", metadata={"help": "The answer's score: token F1 or exact match against the best gold."}
    )

    def __post_init__(self) -> None:
        if self.metric not in ("f1", "exact_match"):
            raise ValueError(f"metric: {self.metric!r} is not one of ['f1', 'exact_match']")

    def __call__(self, traj: Trajectory) -> float:
        if traj.termination != "answered" or traj.answer is None or not is_well_formed(traj.final_text):
            return self.fail
        score = (f1_score if self.metric == "f1" else exact_match)(traj.answer, traj.golds)
        return self.format + (self.retrieval if answer_retrieved(traj) else 0.0) + self.answer * score
