"""The synthetic task's questions: every answerable question of a world, sampled into train, dev and test.

A question is a single-hop fact question or a two-hop chain (`synthetic_text.TWO_HOP_CHAINS`: the film's
director's birthplace...), asked with a template about the entity it names. It belongs to the split of its
answer entity, and a train question never names a dev or test entity, so the test split's answers never
appear in train questions or train answers. Each split takes `two_hop_share` two-hop questions where the
world has enough (single-hop ones fill the rest).
"""

from __future__ import annotations

from typing import Any

from searchrl.common.config import ConfigError
from searchrl.data.synthetic_text import SINGLE_HOP_QUESTIONS, TWO_HOP_CHAINS
from searchrl.data.synthetic_world import SPLITS, SynthConfig, WorldBuilder, doc_id

_ANSWER_TYPES = {"city": "place", "country": "place", "org": "organisation", "person": "person"}


def _candidates(builder: WorldBuilder) -> list[dict[str, Any]]:
    """Every answerable question of the world, with its answer entity and the entity its text names."""
    rng = builder.rng
    doc_of = {(f.relation, f.subject): doc_id(f.doc_index) for f in builder.facts}
    out: list[dict[str, Any]] = []
    for fact in builder.facts:
        out.append(
            {
                "relation": fact.relation,
                "hops": 1,
                "subject": fact.subject,
                "answer": fact.obj,
                "template": rng.choice(SINGLE_HOP_QUESTIONS[fact.relation]),
                "supporting_doc_ids": [doc_of[(fact.relation, fact.subject)]],
                "bridge": None,
            }
        )
    for name, first, second, templates in TWO_HOP_CHAINS:
        for (relation, subject), middle in builder.relation.items():
            if relation != first:
                continue
            answer = builder.relation[(second, middle)]
            out.append(
                {
                    "relation": name,
                    "hops": 2,
                    "subject": subject,
                    "answer": answer,
                    "template": rng.choice(templates),
                    "supporting_doc_ids": [doc_of[(first, subject)], doc_of[(second, middle)]],
                    "bridge": middle,
                }
            )
    return out


def _split_of(builder: WorldBuilder, cand: dict[str, Any]) -> str | None:
    """The split a candidate question may go to, or None (a train-answer question naming a held-out entity)."""
    answer_split = builder.entities[cand["answer"]].split
    if answer_split == "train" and builder.entities[cand["subject"]].split != "train":
        return None
    return answer_split


def _take(pool: list[dict[str, Any]], others: list[dict[str, Any]], n: int) -> list[dict[str, Any]]:
    taken = pool[:n]
    if len(taken) < n:  # not enough of this kind: fill with the other kind rather than fail
        taken += others[: n - len(taken)]
    return taken


def _sample_split(
    builder: WorldBuilder, split: str, cands: list[dict[str, Any]], n: int
) -> list[dict[str, Any]]:
    if len(cands) < n:
        raise ConfigError(
            f"asked for {n} {split} questions but this world supports only {len(cands)}; "
            f"lower {split}_questions or raise num_people / num_works / {split}_entity_share"
        )
    builder.rng.shuffle(cands)
    two = [c for c in cands if c["hops"] == 2]
    one = [c for c in cands if c["hops"] == 1]
    n_two = round(n * builder.cfg.two_hop_share)
    chosen_two = _take(two, [], n_two)
    chosen_one = _take(one, two[len(chosen_two) :], n - len(chosen_two))
    chosen = chosen_one + chosen_two
    builder.rng.shuffle(chosen)
    return chosen


def _row(builder: WorldBuilder, split: str, index: int, cand: dict[str, Any]) -> dict[str, Any]:
    subject, answer = builder.entities[cand["subject"]], builder.entities[cand["answer"]]
    return {
        "id": f"{split}-{index:05d}",
        "question": cand["template"].format(s=subject.name),
        "golds": answer.golds,
        "hops": cand["hops"],
        "supporting_doc_ids": cand["supporting_doc_ids"],
        "answer_type": _ANSWER_TYPES[answer.kind],
        "relation": cand["relation"],
        "subject": subject.name,
        "bridge": builder.entities[cand["bridge"]].name if cand["bridge"] else None,
    }


def question_splits(builder: WorldBuilder, config: SynthConfig) -> dict[str, list[dict[str, Any]]]:
    """The question rows of each split, as many as `config` asks for (ConfigError when the world has too few)."""
    by_split: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    for cand in _candidates(builder):
        split = _split_of(builder, cand)
        if split is not None:
            by_split[split].append(cand)
    wanted = {"train": config.train_questions, "dev": config.dev_questions, "test": config.test_questions}
    return {
        split: [
            _row(builder, split, i, c)
            for i, c in enumerate(_sample_split(builder, split, by_split[split], n))
        ]
        for split, n in wanted.items()
    }
