"""Indexing at scale: the streamed build equals the one-shot one, a killed build resumes to the same index, ACLs
survive chunking, and IVF-flat / IVF-PQ build, search and filter before the top-k cut."""

from __future__ import annotations

import contextlib
import functools
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from searchrl.search.acl import AccessControl
from searchrl.search.base import search_as
from searchrl.search.bm25 import BM25Backend, BM25Params, make_tokenizer
from searchrl.search.bm25_build import BM25ChunkIndexer
from searchrl.search.build import StreamSettings
from searchrl.search.chunks import BUILD_DIR, PROGRESS_FILE
from searchrl.search.corpus import CorpusError, DocStore, Document, corpus_hash, load_corpus
from searchrl.search.dense import DenseBackend
from searchrl.search.faiss_build import auto_nlist, auto_pq_m, new_index, recall_at_k
from searchrl.search.index import build_index, compute_fingerprint, load_index, read_meta

ROOT = Path(__file__).resolve().parents[1]
BM25_FILES = ("data.csc.index.npy", "indices.csc.index.npy", "indptr.csc.index.npy")
TEXT_FILES = ("vocab.index.json", "params.index.json", "vocab.tokenizer.json")


def make_rows(n: int, seed: int = 0) -> list[dict[str, Any]]:
    rng = np.random.default_rng(seed)
    words = [f"w{i}q" for i in range(2000)] + ["the", "and", "running", "runs", "ran"]
    rows = []
    for i in range(n):
        text = " ".join(rng.choice(words, size=int(rng.integers(0, 40))))  # some passages are empty
        row: dict[str, Any] = {"id": f"d{i}", "title": f"Title {i % 97}", "contents": text}
        if i % 11 == 3:
            row["acl"] = ["alice"] if i % 2 else ["bob", "alice"]
        rows.append(row)
    return rows


def write_jsonl(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def assert_same_index(a: Path, b: Path) -> None:
    for name in BM25_FILES:
        x, y = np.load(a / "bm25" / name), np.load(b / "bm25" / name)
        assert x.dtype == y.dtype and np.array_equal(x, y), name
    for name in TEXT_FILES:
        assert (a / "bm25" / name).read_text() == (b / "bm25" / name).read_text(), name
    for name in sorted(p.name for p in (a / "docs").iterdir()):
        assert (a / "docs" / name).read_bytes() == (b / "docs" / name).read_bytes(), name
    assert (a / "acl.json").read_text() == (b / "acl.json").read_text()
    assert read_meta(a)["fingerprint"] == read_meta(b)["fingerprint"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_jsonl(tmp_path_factory.mktemp("corpus") / "c.jsonl", make_rows(3000))


@pytest.mark.parametrize(
    ("method", "stemmer"), [("lucene", "english"), ("bm25+", "english"), ("lucene", None)]
)
def test_streamed_bm25_equals_bm25s_one_shot_bit_for_bit(
    corpus: Path, tmp_path: Path, method: str, stemmer: str | None
) -> None:
    params = BM25Params(method=method, stemmer=stemmer)
    docs = load_corpus(corpus)
    BM25Backend.build(docs, tmp_path / "ref", params)
    BM25ChunkIndexer.postings_per_pass = 5000  # many term ranges in the merge
    try:
        build_index(
            corpus, tmp_path / "s", stream=StreamSettings(chunk_docs=337), method=method, stemmer=stemmer
        )
    finally:
        BM25ChunkIndexer.postings_per_pass = None
    for name in BM25_FILES:
        assert np.array_equal(np.load(tmp_path / "ref/bm25" / name), np.load(tmp_path / "s/bm25" / name)), (
            name
        )
    for name in TEXT_FILES:
        assert (tmp_path / "ref/bm25" / name).read_text() == (tmp_path / "s/bm25" / name).read_text(), name
    DocStore.write(tmp_path / "ref-docs", docs)
    for name in sorted(p.name for p in (tmp_path / "ref-docs").iterdir()):
        assert (tmp_path / "ref-docs" / name).read_bytes() == (tmp_path / "s/docs" / name).read_bytes(), name
    meta = read_meta(tmp_path / "s")
    assert meta["corpus_sha256"] == corpus_hash(docs)
    assert meta["fingerprint"] == compute_fingerprint(corpus_hash(docs), "bm25", params.to_dict())
    assert not (tmp_path / "s" / BUILD_DIR).exists()


def test_a_stemmed_build_keeps_only_the_stems_and_searches_the_words_it_dropped(tmp_path: Path) -> None:
    rows = [
        {"id": "a", "contents": "running shoes for the marathon"},
        {"id": "b", "contents": "he runs every morning"},
        {"id": "c", "contents": ""},
        {"id": "d", "contents": "a quiet library at night"},
    ] * 3
    rows = [{**r, "id": f"{r['id']}{i}"} for i, r in enumerate(rows)]
    backend = build_index(
        write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "i", stream=StreamSettings(chunk_docs=3)
    )
    vocab = json.loads((tmp_path / "i/bm25/vocab.tokenizer.json").read_text())
    # The surface forms are caches of stem -> id: only the empty word (a document with no token) stays.
    assert vocab["word_to_id"] == {"": vocab["stem_to_sid"][""]} and vocab["word_to_stem"] == {"": ""}
    assert {"run", "marathon", "librari"} <= set(vocab["stem_to_sid"])
    assert vocab["stem_to_sid"] == json.loads((tmp_path / "i/bm25/vocab.index.json").read_text())
    hits = backend.search(["running", "ran runs", "libraries"], 6)
    assert {h.doc_id[0] for h in hits[0]} == {"a", "b"} and {h.doc_id[0] for h in hits[1]} == {"a", "b"}
    assert {h.doc_id[0] for h in hits[2]} == {"d"}


def test_a_loaded_index_keeps_one_vocabulary_and_the_same_token_ids(corpus: Path, tmp_path: Path) -> None:
    import bm25s

    build_index(corpus, tmp_path / "i")
    full = make_tokenizer(BM25Params())
    full.load_vocab(str(tmp_path / "i" / "bm25"))
    backend = BM25Backend.load(tmp_path / "i", BM25Params(), "x")
    assert len(backend._tokenizer.word_to_id) <= 1 and len(backend._retriever.vocab_dict) <= 1  # dropped
    assert isinstance(backend._retriever.unique_token_ids_set, range)
    queries = ["running w5q w17q", "the and", "", "ran RUNS unknownzz", "Title 3", "!!"] + [
        " ".join(r.split()[:6]) for r in corpus.read_text().splitlines()[:50]
    ]
    for _ in range(2):  # and again once the query-time caches hold the words
        assert backend.tokenize(queries) == full.tokenize(queries, update_vocab=False, return_as="ids")
    raw = bm25s.BM25.load(str(tmp_path / "i" / "bm25"), mmap=True, load_vocab=True)
    assert raw.unique_token_ids_set == set(backend._retriever.unique_token_ids_set)


@pytest.mark.parametrize(
    ("vocab", "expected"),
    [
        ({}, range(0)),
        ({"": 0, "run": 2, "shoe": 1}, range(3)),
        ({"a": 0, "b": 2}, {0, 2}),  # a gap: not 0..n-1
        ({"a": 1, "b": 1}, {1}),  # a repeated id
        ({"a": -1, "b": 0}, {-1, 0}),
    ],
)
def test_known_token_ids_is_a_range_only_for_the_ids_0_to_n(vocab: dict, expected) -> None:
    from searchrl.search.bm25 import known_token_ids

    got = known_token_ids(vocab)
    assert type(got) is type(expected) and got == expected


def test_chunk_size_and_file_format_do_not_change_the_index(corpus: Path, tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows = [json.loads(line) for line in corpus.read_text().splitlines()]
    table = pa.Table.from_pylist([{**r, "acl": r.get("acl")} for r in rows])
    pq.write_table(table, tmp_path / "c.parquet", row_group_size=500)
    build_index(corpus, tmp_path / "one", stream=StreamSettings(chunk_docs=10_000))
    build_index(tmp_path / "c.parquet", tmp_path / "many", stream=StreamSettings(chunk_docs=250))
    assert_same_index(tmp_path / "one", tmp_path / "many")


def test_acls_survive_chunking(corpus: Path, tmp_path: Path) -> None:
    backend = build_index(corpus, tmp_path / "i", stream=StreamSettings(chunk_docs=100))
    acls = [d.acl for d in load_corpus(corpus)]
    expected = AccessControl.from_acls(acls).to_dict()
    assert json.loads((tmp_path / "i" / "acl.json").read_text()) == expected
    public = {f"d{i}" for i, a in enumerate(acls) if a is None}
    for hits in search_as(backend, ["w5q w17q", "running title"], 50):
        assert len(hits) == 50 and {h.doc_id for h in hits} <= public  # filtered before the cut: still 50
    alice = {f"d{i}" for i, a in enumerate(acls) if a is None or "alice" in a}
    hits = search_as(backend, ["w5q w17q"], 50, ["alice"])[0]
    assert {h.doc_id for h in hits} <= alice and any(h.doc_id not in public for h in hits)


def test_duplicate_ids_in_different_chunks_are_refused(tmp_path: Path) -> None:
    rows = make_rows(500)
    rows[420]["id"] = rows[17]["id"]
    corpus = write_jsonl(tmp_path / "c.jsonl", rows)
    with pytest.raises(CorpusError, match=r"duplicate document id 'd17' \(rows 18 and 421\)"):
        build_index(corpus, tmp_path / "i", stream=StreamSettings(chunk_docs=100))
    with pytest.raises(CorpusError, match="no documents"):
        build_index(write_jsonl(tmp_path / "e.jsonl", []), tmp_path / "e")


def test_ids_whose_hashes_collide_are_told_apart_by_the_ids(tmp_path: Path, monkeypatch) -> None:
    import searchrl.search.chunks as chunks

    monkeypatch.setattr(chunks, "_id_hash", len)  # "d1".."d9" share a hash, "d10".."d99" another, ...
    rows = make_rows(500)
    build_index(
        write_jsonl(tmp_path / "c.jsonl", rows), tmp_path / "i", stream=StreamSettings(chunk_docs=100)
    )
    rows[420]["id"] = rows[37]["id"]
    with pytest.raises(CorpusError, match=r"duplicate document id 'd37' \(rows 38 and 421\)"):
        build_index(
            write_jsonl(tmp_path / "d.jsonl", rows), tmp_path / "j", stream=StreamSettings(chunk_docs=100)
        )


def test_a_build_that_dies_mid_way_resumes_to_the_same_index(
    corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    build_index(corpus, tmp_path / "one", stream=StreamSettings(chunk_docs=10_000))
    original = BM25ChunkIndexer.add_chunk

    def dies_at_chunk_4(self: BM25ChunkIndexer, index: int, start: int, docs: list[Document]) -> None:
        original(self, index, start, docs)
        if index == 4:
            raise KeyboardInterrupt("killed")

    monkeypatch.setattr(BM25ChunkIndexer, "add_chunk", dies_at_chunk_4)
    with pytest.raises(KeyboardInterrupt):
        build_index(corpus, tmp_path / "r", stream=StreamSettings(chunk_docs=400))
    progress = json.loads((tmp_path / "r" / BUILD_DIR / PROGRESS_FILE).read_text())
    assert len(progress["chunks"]) == 4  # chunk 4 wrote its files but was never recorded as done
    monkeypatch.setattr(BM25ChunkIndexer, "add_chunk", original)
    with pytest.raises(CorpusError, match="other settings"):
        build_index(corpus, tmp_path / "r", stream=StreamSettings(chunk_docs=500))
    build_index(corpus, tmp_path / "r", stream=StreamSettings(chunk_docs=400))
    assert read_meta(tmp_path / "r")["resumed_after_docs"] == 1600
    assert_same_index(tmp_path / "one", tmp_path / "r")


KILLED_BUILD = """
import sys, time
from searchrl.search.bm25_build import BM25ChunkIndexer
from searchrl.search.build import StreamSettings
from searchrl.search.index import build_index
original = BM25ChunkIndexer.add_chunk
def slow(self, *a):
    original(self, *a)
    time.sleep(0.4)
BM25ChunkIndexer.add_chunk = slow
build_index(sys.argv[1], sys.argv[2], stream=StreamSettings(chunk_docs=300))
"""


def test_kill_9_and_resume_gives_the_same_index_as_one_run(corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "killed"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_BUILD, str(corpus), str(out)], env=env, cwd=ROOT)
    progress = out / BUILD_DIR / PROGRESS_FILE
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if progress.is_file() and len(json.loads(progress.read_text())["chunks"]) >= 3:
            break
        time.sleep(0.02)
    assert proc.poll() is None, "the build finished before it could be killed"
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait(timeout=30)
    assert not (out / "meta.json").exists()
    build_index(corpus, out, stream=StreamSettings(chunk_docs=300))
    assert read_meta(out)["resumed_after_docs"] >= 900
    build_index(corpus, tmp_path / "one", stream=StreamSettings(chunk_docs=300))
    assert_same_index(tmp_path / "one", out)


# --- IVF-flat and IVF-PQ -------------------------------------------------------------------------------------


class RandomEncoder:
    """Fixed unit vectors per text (a dense encoder without a model)."""

    dim = 16

    def encode(self, texts: list[str], **_: Any) -> np.ndarray:
        out = np.stack([np.random.default_rng(abs(hash(t)) % 2**32).standard_normal(self.dim) for t in texts])
        return (out / np.linalg.norm(out, axis=1, keepdims=True)).astype(np.float32)


TRAIN = np.random.default_rng(7).standard_normal((1000, 16)).astype(np.float32)
TRAIN /= np.linalg.norm(TRAIN, axis=1, keepdims=True)


def ivf(kind: str, vecs: np.ndarray, nprobe: int):
    index = new_index(16, kind, nlist=8, pq_m=4, pq_nbits=4)
    index.train(TRAIN)
    index.add(vecs)
    index.nprobe = nprobe
    return index


def acl_tuples_and_readable(acls: list[Any], principal: str | None) -> tuple[list[Any], np.ndarray]:
    """The ACLs as the index keeps them, and which documents `principal` may read (no ACL: public)."""
    acl_tuples = [None if a is None else tuple(a) for a in acls]
    readable = np.array([a is None or (principal is not None and principal in a) for a in acl_tuples])
    return acl_tuples, readable


@contextlib.contextmanager
def acl_dense_backend(
    index: Any, encoder: Any, texts: list[str], acl_tuples: list[Any], params: Any, rerank_vectors: Any = None
) -> Iterator[DenseBackend]:
    """A dense backend over `index` whose documents d0, d1, ... hold `texts` under `acl_tuples`."""
    with tempfile.TemporaryDirectory() as d:
        DocStore.write(Path(d), [Document(f"d{i}", "", t) for i, t in enumerate(texts)])
        yield DenseBackend(
            index,
            encoder,
            DocStore(Path(d)),
            "x",
            params=params,
            acl=AccessControl.from_acls(acl_tuples),
            rerank_vectors=rerank_vectors,
        )


ACLS = st.one_of(st.none(), st.just([]), st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3))


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    acls=st.lists(ACLS, min_size=1, max_size=40),
    principal=st.sampled_from([None, "a", "b", "d"]),
    k=st.integers(1, 8),
    kind=st.sampled_from(["ivf_flat", "ivf_pq"]),
    nprobe=st.sampled_from([1, 2, 8]),
)
def test_ivf_filtered_topk_is_the_best_k_readable(
    acls: list[Any], principal: str | None, k: int, kind: str, nprobe: int
) -> None:
    encoder = RandomEncoder()
    texts = [f"passage {i}" for i in range(len(acls))]
    vecs = encoder.encode(texts)
    index = ivf(kind, vecs, nprobe)
    acl_tuples, readable = acl_tuples_and_readable(acls, principal)
    from searchrl.search.dense import DenseParams

    with acl_dense_backend(
        index, encoder, texts, acl_tuples, DenseParams(index_type=kind, nprobe=nprobe)
    ) as backend:
        principals = None if principal is None else [principal]
        hits = search_as(backend, ["the query"], k, principals)[0]
        index.nprobe = index.nlist  # every list probed: exact over the index' own codes
        all_probed = search_as(backend, ["the query"], k, principals)[0]
    allowed = {f"d{i}" for i in np.flatnonzero(readable)}
    assert {h.doc_id for h in hits} <= allowed
    assert len(hits) == min(k, int(readable.sum()))  # never fewer than k while k readable documents exist
    index.make_direct_map()
    decoded = np.stack([index.reconstruct(i) for i in range(len(texts))])
    sims = (encoder.encode(["the query"]) @ decoded.T)[0]
    if readable.all():
        return  # no filter: faiss' own approximate answer, as before ACLs
    expected = sorted(sims[readable].tolist(), reverse=True)[:k]
    assert [h.score for h in all_probed] == pytest.approx(expected, abs=1e-4)


def test_ivf_sizes_are_chosen_from_the_corpus() -> None:
    assert auto_nlist(10) == 1 and auto_nlist(1_000_000) == 1024 and auto_nlist(21_000_000) == 4096
    assert auto_pq_m(384) == 96 and auto_pq_m(768) == 192 and auto_pq_m(10) == 2
    exact = np.array([[1, 2, 3], [4, 5, 6]])
    assert recall_at_k(exact, np.array([[3, 2, 9], [7, 8, 9]]), 3) == pytest.approx(1 / 3)


@pytest.mark.parametrize("kind", ["ivf_pq", "ivf_flat"])
def test_ivf_dense_index_builds_streams_and_searches(tmp_path: Path, kind: str) -> None:
    from searchrl.data.synthetic import generate, preset_config

    task = generate(preset_config("tiny", seed=0))
    corpus = write_jsonl(tmp_path / "c.jsonl", task.corpus)
    flat = build_index(corpus, tmp_path / "flat", backend="dense")
    approx = build_index(
        corpus,
        tmp_path / kind,
        backend="dense",
        index_type=kind,
        ivf_nlist=4,
        nprobe=4,
        stream=StreamSettings(chunk_docs=max(50, len(task.corpus) // 3)),
    )
    meta = read_meta(tmp_path / kind)
    assert meta["faiss"]["class"] == {"ivf_pq": "IndexIVFPQ", "ivf_flat": "IndexIVFFlat"}[kind]
    assert meta["params"]["index_type"] == kind and meta["faiss"]["ntotal"] == len(task.corpus)
    assert read_meta(tmp_path / "flat")["fingerprint"] != meta["fingerprint"]
    queries = [row["question"] for row in task.splits["dev"][:20]]
    exact = [[h.doc_id for h in hits] for hits in flat.search(queries, 3)]
    got = [[h.doc_id for h in hits] for hits in approx.search(queries, 3)]
    recall = np.mean([len(set(e) & set(g)) / 3 for e, g in zip(exact, got, strict=True)])
    assert recall >= (0.999 if kind == "ivf_flat" else 0.6), recall  # every list probed


@functools.cache
def coarse_pq_over_40_passages() -> tuple[list[str], np.ndarray, Any]:
    texts = [f"passage {i}" for i in range(40)]
    vecs = RandomEncoder().encode(texts)
    return texts, vecs, ivf("ivf_pq", vecs, 1)  # 4 codes of 4 bits: a coarse ranking on its own


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    acls=st.lists(ACLS, min_size=40, max_size=40),
    principal=st.sampled_from([None, "a", "b"]),
    k=st.integers(1, 8),
    nprobe=st.sampled_from([1, 8]),
)
def test_rerank_gives_the_exact_best_k_readable_among_the_candidates(
    acls: list[Any], principal: str | None, k: int, nprobe: int
) -> None:
    from searchrl.search.dense import DenseParams

    encoder = RandomEncoder()
    texts, vecs, index = coarse_pq_over_40_passages()
    index.nprobe = nprobe
    acl_tuples, readable = acl_tuples_and_readable(acls, principal)
    params = DenseParams(index_type="ivf_pq", nprobe=nprobe, rerank=40)  # every document a candidate
    with acl_dense_backend(index, encoder, texts, acl_tuples, params, vecs.astype(np.float16)) as backend:
        hits = search_as(backend, ["the query"], k, None if principal is None else [principal])[0]
    assert {h.doc_id for h in hits} <= {f"d{i}" for i in np.flatnonzero(readable)}
    assert len(hits) == min(k, int(readable.sum()))
    if nprobe == index.nlist:  # every list probed, every readable document re-scored: exact
        sims = (encoder.encode(["the query"]) @ vecs.astype(np.float16).astype(np.float32).T)[0]
        expected = sorted(sims[readable].tolist(), reverse=True)[:k]
        assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)


def test_a_streamed_ivf_pq_index_with_rerank_keeps_its_vectors_and_finds_flat_answers(tmp_path: Path) -> None:
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.search.dense import VECTORS_FILE, DenseConfigError

    task = generate(preset_config("tiny", seed=0))
    corpus = write_jsonl(tmp_path / "c.jsonl", task.corpus)
    flat = build_index(corpus, tmp_path / "flat", backend="dense")
    common = {
        "backend": "dense",
        "index_type": "ivf_pq",
        "ivf_nlist": 4,
        "nprobe": 4,
        "pq_m": 8,
        "pq_nbits": 4,
    }
    stream = StreamSettings(chunk_docs=max(50, len(task.corpus) // 3))
    coarse = build_index(corpus, tmp_path / "pq", stream=stream, **common)
    # Every document a candidate (nprobe = nlist, rerank >= the corpus): re-scoring gives flat's answers exactly.
    fine = build_index(corpus, tmp_path / "rr", stream=stream, rerank=len(task.corpus), **common)
    vectors = np.load(tmp_path / "rr" / VECTORS_FILE, mmap_mode="r")
    assert vectors.dtype == np.float16 and vectors.shape[0] == len(task.corpus)
    assert not (tmp_path / "pq" / VECTORS_FILE).exists()
    assert read_meta(tmp_path / "rr")["params"]["rerank"] == len(task.corpus)
    queries = [row["question"] for row in task.splits["dev"][:30]]

    def recall(backend: Any) -> float:
        exact = [[h.doc_id for h in hits] for hits in flat.search(queries, 3)]
        got = [[h.doc_id for h in hits] for hits in backend.search(queries, 3)]
        return float(np.mean([len(set(e) & set(g)) / 3 for e, g in zip(exact, got, strict=True)]))

    assert recall(fine) >= 0.99 and recall(coarse) < 0.9, (recall(fine), recall(coarse))
    (tmp_path / "rr" / VECTORS_FILE).unlink()
    with pytest.raises(DenseConfigError, match="vectors.f16.npy is missing"):
        load_index(tmp_path / "rr")
    with pytest.raises(DenseConfigError, match="applies to index_type 'ivf_pq'"):
        build_index(corpus, tmp_path / "x", backend="dense", rerank=8)
    with pytest.raises(DenseConfigError, match="comes without them"):
        build_index(
            corpus, tmp_path / "y", rerank=8, faiss_index=str(tmp_path / "pq" / "dense.faiss"), **common
        )


class CountingEncoder(RandomEncoder):
    """A `RandomEncoder` that records every text it was asked to encode."""

    def __init__(self) -> None:
        self.seen: list[str] = []

    def encode(self, texts: list[str], **kw: Any) -> np.ndarray:
        self.seen += list(texts)
        return super().encode(texts, **kw)


def test_query_cache_encodes_each_distinct_query_once_with_its_prefix(tmp_path: Path) -> None:
    from searchrl.search.dense import DenseParams

    texts = [f"passage {i}" for i in range(50)]
    DocStore.write(tmp_path, [Document(f"d{i}", "", t) for i, t in enumerate(texts)])
    index = new_index(16, "flat")
    index.add(RandomEncoder().encode(texts))
    encoder = CountingEncoder()
    params = DenseParams.preset("e5")
    backend = DenseBackend(index, encoder, DocStore(tmp_path), "x", params=params, query_cache_size=3)
    group = ["who", "what", "who", "who"]  # a GRPO group repeats its queries
    first = backend.search(group, 3)
    assert encoder.seen == ["query: who", "query: what"]  # each distinct query once, e5's prefix on it
    again = backend.search(["what", "who"], 3)
    assert encoder.seen == ["query: who", "query: what"]  # from the cache
    assert [h.doc_id for h in again[1]] == [h.doc_id for h in first[0]]
    uncached = DenseBackend(
        index, RandomEncoder(), DocStore(tmp_path), "x", params=params, query_cache_size=0
    )
    assert np.array_equal(backend.encode_queries(group), uncached.encode_queries(group))
    backend.search(["a", "b", "c"], 1)  # the cache holds 3: "who" and "what" are dropped, oldest first
    backend.search(["who"], 1)
    assert encoder.seen[-1] == "query: who" and encoder.seen.count("query: who") == 2
