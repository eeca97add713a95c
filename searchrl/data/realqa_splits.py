"""How a real question set is split so that no test question is trained on (`split_questions`).

The unit of splitting is a group of questions that share a key: for SQuAD the article (its title), for
HotpotQA a supporting paragraph. SQuAD asks five or so questions about each paragraph and an article's
paragraphs share their facts, so a split by question would train on the very paragraph a test question is
about; split by article, no test question's paragraph, nor any paragraph of its article, is the subject of a
training question. HotpotQA questions each have their own two supporting paragraphs, so its unit is the
question, except that questions sharing a supporting paragraph are kept together (none of the shipped 53
do; `meta.json` counts dev/test questions whose supporting document a train question also uses: 0 by
construction). Units are ranked by sha256(seed, source, name), the name being the article title (SQuAD) or
the smallest question id of the unit (HotpotQA), so the assignment depends on the seed and the data only,
never on file order. In that order test takes units while each brings it closer to `test_fraction` of the
questions (whole units, so for SQuAD's ~200-question articles the fraction is approximate), then dev to
`dev_fraction`, and train keeps the rest.

The retrieval corpus is shared by all splits, as in Search-R1, whose wiki-18 corpus serves training and
test alike: the corpus is the environment the policy searches, not a training signal. Training updates
come from train questions, their golds and the rewards on them; no dev or test question, nor its
supporting-document labels, is ever trained on. That a test paragraph can be retrieved during a training
episode is what happens with any real search engine; a policy that memorises the corpus instead of
searching it shows up as closed-book accuracy (evaluate with a search engine that finds nothing), which
hiding documents would not prevent. HotpotQA's distractor paragraphs stay in the corpus too: each
question's ten paragraphs are all searchable.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any

from searchrl.data.realqa_formats import SOURCES

SPLITS: tuple[str, ...] = ("train", "dev", "test")
# The row field whose values tie questions into one split unit.
_UNIT_KEY = {"hotpotqa": "supporting_doc_ids", "squad": "supporting_titles"}
SPLIT_RULES: dict[str, str] = {
    "hotpotqa": (
        "by question; questions sharing a supporting paragraph stay in one split; units ranked by "
        "sha256(seed, source, smallest question id of the unit)"
    ),
    "squad": (
        "by article (title): all questions on an article's paragraphs stay in one split; articles ranked "
        "by sha256(seed, source, article title)"
    ),
}


def seeded_rank(seed: int, source: str, key: str) -> str:
    """The sort key of `key` (a unit name or question id) of `source` under `seed`: a sha256 hex digest."""
    return hashlib.sha256(f"{seed}\x00{source}\x00{key}".encode()).hexdigest()


def split_units(rows: Sequence[dict[str, Any]], source: str) -> list[list[dict[str, Any]]]:
    """Questions grouped into split units: connected by a shared key (`_UNIT_KEY[source]`) of their rows.

    SQuAD: rows sharing an article title; HotpotQA: rows sharing a supporting paragraph. Each unit's rows
    keep their input order; units come out in no particular order (callers rank them).
    """
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    key_owner: dict[str, str] = {}
    for row in rows:
        parent.setdefault(row["id"], row["id"])
        for key in row[_UNIT_KEY[source]]:
            if key in key_owner:
                a, b = find(row["id"]), find(key_owner[key])
                if a != b:
                    parent[max(a, b)] = min(a, b)
            else:
                key_owner[key] = row["id"]
    units: dict[str, list[dict[str, Any]]] = {}
    for row in rows:
        units.setdefault(find(row["id"]), []).append(row)
    return list(units.values())


def _unit_name(unit: Sequence[dict[str, Any]], source: str) -> str:
    """What a unit is ranked by: its article title (SQuAD), its smallest question id (HotpotQA)."""
    if source == "squad":
        return min(t for r in unit for t in r["supporting_titles"])
    return min(r["id"] for r in unit)


def _check_fraction(name: str, value: float) -> None:
    if not 0.0 <= value < 1.0:
        raise ValueError(f"{name} must be in [0, 1), got {value}")


def split_questions(
    rows: Sequence[dict[str, Any]],
    source: str,
    seed: int = 0,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.2,
    max_sizes: dict[str, int | None] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """train / dev / test rows of one dataset, by whole units (see the module docstring for the rule).

    Deterministic from `seed` and the question ids: input order changes nothing, rows inside a split are
    ordered by sha256(seed, id). A fraction above 0 gets at least one unit. `max_sizes` caps a split's
    question count (the first N in that order), e.g. `{"train": 500}`; the cap never moves a question
    to another split.
    """
    if source not in SOURCES:
        raise ValueError(f"unknown source {source!r}; choose one of {', '.join(SOURCES)}")
    _check_fraction("dev_fraction", dev_fraction)
    _check_fraction("test_fraction", test_fraction)
    if dev_fraction + test_fraction >= 1.0:
        raise ValueError(
            f"dev_fraction + test_fraction must leave questions for training, got {dev_fraction} + {test_fraction}"
        )
    units = split_units(rows, source)
    units.sort(key=lambda unit: seeded_rank(seed, source, _unit_name(unit, source)))
    n = len(rows)
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    position = 0
    for split, fraction in (("test", test_fraction), ("dev", dev_fraction)):
        target = max(1, round(n * fraction)) if fraction > 0 else 0
        # In rank order, take a unit while it brings the split closer to its target (at least one unit).
        while target and position < len(units):
            size, have = len(units[position]), len(splits[split])
            if have and abs(have + size - target) >= abs(have - target):
                break
            splits[split].extend(units[position])
            position += 1
    for unit in units[position:]:
        splits["train"].extend(unit)
    if not splits["train"]:
        raise ValueError(
            f"{source}: {len(units)} split units ({n} questions) leave none for training with "
            f"dev_fraction {dev_fraction} and test_fraction {test_fraction}; lower the fractions"
        )
    for split in SPLITS:
        splits[split].sort(key=lambda r: seeded_rank(seed, source, r["id"]))
        cap = (max_sizes or {}).get(split)
        if cap is not None:
            if cap < 1:
                raise ValueError(f"max size of {split} must be at least 1, got {cap}")
            del splits[split][cap:]
    return splits
