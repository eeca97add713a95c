"""Answer correctness: SQuAD v1.1 normalisation, exact match and token F1, and the rewards built on them.

The string functions follow the SQuAD v1.1 evaluation script, which Search-R1, FlashRAG and most search-
agent papers use, so our numbers compare with theirs: lower case, drop ASCII punctuation, drop the
articles a/an/the, collapse white space. `exact_match` and `f1_score` take one gold or a list of gold
aliases and return the maximum over them.

Empty strings follow the official SQuAD v1.1 script to the letter: two strings that both normalise to ""
are an exact match (EM 1.0) but share no token, so their F1 is 0.0 (the script returns 0 when no token is
common); "a an the" against "the" is EM 1, F1 0. (SQuAD v2's script scores that F1 1; we follow v1.1, as
Search-R1 and FlashRAG do.) One empty side is EM 0 and F1 0. An empty list of golds is a data error and
raises.

The trajectory rewards (`ExactMatchReward`, `F1Reward`, `ContainsReward`) read only `traj.answer`, never
observation text, and score 0 when the answer is longer than `max_answer_words`: listing candidates must
not pay (see `rl_methods.md` §4.3). `ContainsReward` is Search-R1's sub-EM; it is deliberately gameable
and exists so the reward-hacking audit has something to catch.
"""

from __future__ import annotations

import re
import string
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from searchrl.common.trajectory import Trajectory

_PUNCTUATION = frozenset(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")


def normalize_answer(s: str) -> str:
    """SQuAD v1.1 normalisation: lower case, no punctuation, no articles, single spaces."""
    lowered = s.lower()
    no_punct = "".join(ch for ch in lowered if ch not in _PUNCTUATION)
    no_articles = _ARTICLES.sub(" ", no_punct)
    return " ".join(no_articles.split())


def _as_gold_list(ground_truths: str | list[str]) -> list[str]:
    if isinstance(ground_truths, str):
        return [ground_truths]
    golds = list(ground_truths)
    if not golds:
        raise ValueError("ground_truths is empty; give at least one gold answer (a str or a list of str)")
    for g in golds:
        if not isinstance(g, str):
            raise TypeError(f"ground_truths must hold strings, got {type(g).__name__}: {g!r}")
    return golds


def _exact_match_one(prediction: str, gold: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(gold))


def _f1_one(prediction: str, gold: str) -> float:
    pred_tokens = normalize_answer(prediction).split()
    gold_tokens = normalize_answer(gold).split()
    # SQuAD v1.1: no common token -> 0, which includes both sides empty (EM is 1 there).
    overlap = sum((Counter(pred_tokens) & Counter(gold_tokens)).values())
    if overlap == 0:
        return 0.0
    precision = overlap / len(pred_tokens)
    recall = overlap / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str, ground_truths: str | list[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0."""
    return max(_exact_match_one(prediction, g) for g in _as_gold_list(ground_truths))


def f1_score(prediction: str, ground_truths: str | list[str]) -> float:
    """Token-level F1 (multiset overlap) after normalisation, the maximum over golds."""
    return max(_f1_one(prediction, g) for g in _as_gold_list(ground_truths))


def answered_right(trajectories: Sequence[Trajectory]) -> list[bool]:
    """Per trajectory: it gave a final answer that exactly matches one of its golds (False without golds); the
    likelihood monitors' `correct` (`searchrl.common.health`)."""
    return [
        t.answer is not None and bool(t.golds) and bool(exact_match(t.answer, t.golds)) for t in trajectories
    ]


def contains_answer(text: str, answer: str) -> bool:
    """True if the normalised `answer` occurs in the normalised `text` as whole words.

    Whole words, so "Velmora" is not found inside "Velmoran"; an answer that normalises to "" is never
    contained (an empty answer supports nothing).
    """
    needle = normalize_answer(answer)
    if not needle:
        return False
    return f" {needle} " in f" {normalize_answer(text)} "


def answer_word_count(answer: str) -> int:
    """Words in the normalised answer: the unit of the anti-stuffing length cap."""
    return len(normalize_answer(answer).split())


def _capped_answer(traj: Trajectory, max_answer_words: int) -> str | None:
    """The trajectory's answer, or None if it has none or it is over the length cap."""
    if traj.answer is None:
        return None
    if max_answer_words > 0 and answer_word_count(traj.answer) > max_answer_words:
        return None
    return traj.answer


@dataclass(frozen=True)
class ExactMatchReward:
    """1.0 if the final answer exactly matches a gold alias (after normalisation), else 0.0."""

    max_answer_words: int = field(
        default=16, metadata={"help": "Answers with more normalised words than this score 0 (0 = no cap)."}
    )

    def __call__(self, traj: Trajectory) -> float:
        answer = _capped_answer(traj, self.max_answer_words)
        return 0.0 if answer is None else exact_match(answer, traj.golds)


@dataclass(frozen=True)
class F1Reward:
    """Token F1 of the final answer against the best gold alias; its precision term penalises stuffing.

    `no_answer` is the value of an episode without a (capped) answer. Search-R1++ (arXiv 2602.19526) reports
    that an F1 reward alone collapses into not answering: a partial answer costs as much as none, and
    searching on is cheaper than committing. A negative `no_answer` (e.g. -0.1) makes ending without an
    answer cost more than a wrong one; 0 keeps F1 as it is.
    """

    max_answer_words: int = field(
        default=16, metadata={"help": "Answers with more normalised words than this score 0 (0 = no cap)."}
    )
    no_answer: float = field(
        default=0.0,
        metadata={
            "help": "Value when the episode has no answer (or one over the cap); negative = the action penalty "
            "that keeps an F1-trained policy from learning not to answer."
        },
    )

    def __call__(self, traj: Trajectory) -> float:
        answer = _capped_answer(traj, self.max_answer_words)
        return self.no_answer if answer is None else f1_score(answer, traj.golds)


@dataclass(frozen=True)
class ContainsReward:
    """Search-R1's sub-EM: 1.0 if any gold occurs in the answer. Gameable by listing candidates, on purpose."""

    max_answer_words: int = field(
        default=0,
        metadata={"help": "Length cap in normalised words (0 = none, which is what makes it hackable)."},
    )

    def __call__(self, traj: Trajectory) -> float:
        answer = _capped_answer(traj, self.max_answer_words)
        if answer is None:
            return 0.0
        return float(any(contains_answer(answer, g) for g in traj.golds))
