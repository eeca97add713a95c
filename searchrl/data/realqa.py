"""Real questions over their own Wikipedia paragraphs (HotpotQA distractor, SQuAD v1.1) as a task to write.

The synthetic task proves the loop learns; these slices check it on real text, offline. `build_realqa` loads
the files (`searchrl.data.realqa_files`: the repository's `data/realqa/` slices, or files given; parsed by
`searchrl.data.realqa_formats`), splits each dataset so that no test question is trained on
(`searchrl.data.realqa_splits`, where the rule is explained), joins them and records their provenance;
`RealQATask.write` writes the corpus, the splits and `meta.json` the way `searchrl data synth` writes the
synthetic task. `supporting_recall` checks that a search backend finds the questions' supporting paragraphs.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from searchrl.common.io import atomic_write_json, write_jsonl
from searchrl.data.datasets import DatasetError
from searchrl.data.realqa_files import load_sources
from searchrl.data.realqa_splits import SPLIT_RULES, SPLITS, seeded_rank, split_questions, split_units
from searchrl.search.base import Backend
from searchrl.search.corpus import join_search_r1_contents

CORPUS_FORMATS: tuple[str, ...] = ("searchrl", "search-r1")
META_FORMAT = "searchrl-realqa/1"
LICENCE = "CC BY-SA 4.0 (Wikipedia text); keep the attribution with any copy"
ATTRIBUTION: dict[str, str] = {
    "hotpotqa": (
        "Yang et al., 2018, HotpotQA: A Dataset for Diverse, Explainable Multi-hop Question Answering "
        "(dev, distractor setting)"
    ),
    "squad": "Rajpurkar et al., 2016, SQuAD: 100,000+ Questions for Machine Comprehension of Text (v1.1 dev)",
}


@dataclass
class RealQATask:
    """A real-question data set ready to write: corpus rows, question splits and provenance."""

    corpus: list[dict[str, str]]
    splits: dict[str, list[dict[str, Any]]]
    meta: dict[str, Any]

    def write(self, out_dir: str | Path, corpus_format: str = "searchrl") -> dict[str, Path]:
        """Write corpus.jsonl, train/dev/test.jsonl and meta.json (atomically, each); returns the paths.

        `corpus_format` "searchrl" writes `{"id", "title", "contents"}` with the body in `contents` (what
        `searchrl data synth` writes); "search-r1" writes Search-R1's `{"id", "contents": '"Title"\\ntext'}`,
        which Search-R1's own retriever reads too. `searchrl.search.corpus` reads both to the same documents.
        """
        if corpus_format not in CORPUS_FORMATS:
            raise ValueError(
                f"unknown corpus format {corpus_format!r}; choose one of {', '.join(CORPUS_FORMATS)}"
            )
        out = Path(out_dir)
        out.mkdir(parents=True, exist_ok=True)
        rows: list[dict[str, str]] = self.corpus
        if corpus_format == "search-r1":
            rows = [
                {"id": d["id"], "contents": join_search_r1_contents(d["title"], d["contents"])} for d in rows
            ]
        paths = {"corpus": out / "corpus.jsonl"}
        write_jsonl(paths["corpus"], rows)
        for split in SPLITS:
            paths[split] = out / f"{split}.jsonl"
            write_jsonl(paths[split], self.splits[split])
        meta = dict(self.meta)
        meta["corpus_format"] = corpus_format
        meta["written_files_sha256"] = {
            p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in paths.values()
        }
        paths["meta"] = out / "meta.json"
        atomic_write_json(paths["meta"], meta)
        return paths


def _support_shared_with_train(splits: dict[str, list[dict[str, Any]]]) -> dict[str, int]:
    train_docs = {d for r in splits["train"] for d in r["supporting_doc_ids"]}
    return {
        s: sum(any(d in train_docs for d in r["supporting_doc_ids"]) for r in splits[s])
        for s in ("dev", "test")
    }


def build_realqa(
    source: str = "both",
    files: Iterable[str | Path] | None = None,
    seed: int = 0,
    dev_fraction: float = 0.1,
    test_fraction: float = 0.2,
    max_sizes: dict[str, int | None] | None = None,
) -> RealQATask:
    """Load `source` ('hotpotqa', 'squad' or 'both'), split each dataset by its rule, and join them.

    With 'both', each dataset is split on its own (HotpotQA by question, SQuAD by article) and the splits
    are joined, interleaved by sha256(seed, source, id); `max_sizes` caps each dataset's split. The corpus is the union,
    sorted by id. Question ids must be unique across datasets.
    """
    loaded = load_sources(source, files)
    splits: dict[str, list[dict[str, Any]]] = {s: [] for s in SPLITS}
    sources_meta: dict[str, Any] = {}
    corpus: dict[str, dict[str, str]] = {}
    owner: dict[str, str] = {}
    for name, data in loaded.items():
        for row in data.questions:
            if row["id"] in owner:
                raise DatasetError(f"question id {row['id']!r} is in both {owner[row['id']]} and {name}")
            owner[row["id"]] = name
        part = split_questions(data.questions, name, seed, dev_fraction, test_fraction, max_sizes)
        for split in SPLITS:
            splits[split].extend(part[split])
        for d in data.documents:
            corpus.setdefault(d["id"], d)
        units = {split: len(split_units(part[split], name)) for split in SPLITS}
        sources_meta[name] = {
            "files": data.files,
            "attribution": ATTRIBUTION[name],
            "questions": len(data.questions),
            "paragraphs_listed": data.paragraph_slots,
            "documents": len(data.documents),
            "split_rule": SPLIT_RULES[name],
            "split_questions": {split: len(part[split]) for split in SPLITS},
            "split_units": units,
            "types": {
                t: sum(r["type"] == t for r in data.questions)
                for t in sorted({r["type"] for r in data.questions})
            },
            "dev_test_questions_sharing_a_supporting_doc_with_train": _support_shared_with_train(part),
        }
    for split in SPLITS:  # the datasets interleaved, each in its own order (the key split_questions sorts by)
        splits[split].sort(key=lambda r: seeded_rank(seed, r["source"], r["id"]))
    meta = {
        "format": META_FORMAT,
        "source": source,
        "seed": seed,
        "dev_fraction": dev_fraction,
        "test_fraction": test_fraction,
        "max_sizes": {s: (max_sizes or {}).get(s) for s in SPLITS},
        "licence": LICENCE,
        "corpus_rule": "one document per paragraph, shared by all splits; id = prefix + sha256(title, text)[:12]",
        "counts": {"documents": len(corpus), **{s: len(splits[s]) for s in SPLITS}},
        "sources": sources_meta,
    }
    return RealQATask([corpus[k] for k in sorted(corpus)], splits, meta)


# -- retrieval check ----------------------------------------------------------------------------------------


def supporting_recall(
    backend: Backend, rows: Sequence[dict[str, Any]], ks: Sequence[int] = (1, 3), batch_size: int = 256
) -> dict[str, float]:
    """How often the question, used as the query, ranks its supporting documents in the top k.

    `backend` is any search backend (BM25, dense, HTTP client, cache). Returns `n` and, for each k, `any@k` (at least one
    supporting document in the top k) and `all@k` (every one; the same as any@k for single-hop rows).
    """
    if not rows:
        raise ValueError("supporting_recall needs at least one row")
    depth = max(ks)
    found: dict[str, int] = {f"{kind}@{k}": 0 for k in ks for kind in ("any", "all")}
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        results = backend.search([r["question"] for r in batch], depth)
        for row, hits in zip(batch, results, strict=True):
            ranked = [h.doc_id for h in hits]
            gold = set(row["supporting_doc_ids"])
            for k in ks:
                top = set(ranked[:k])
                found[f"any@{k}"] += bool(gold & top)
                found[f"all@{k}"] += gold <= top
    return {"n": float(len(rows)), **{name: count / len(rows) for name, count in found.items()}}
