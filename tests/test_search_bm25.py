"""BM25 agrees with a brute-force Lucene BM25 written here; save/load; stemming, stop words, edge cases."""

from __future__ import annotations

import json
import math
import re
from collections import Counter

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from support.search import TOY_DOCS, write_corpus

from searchrl.search.base import Backend, Hit
from searchrl.search.index import IndexFormatError, build_index, load_index, read_meta

TOKEN = re.compile(r"(?u)\b\w\w+\b")  # bm25s' default splitter: words of two or more characters


def brute_force_bm25(docs: list[dict], query: str, k1: float, b: float) -> dict[str, float]:
    """Lucene BM25 from the formula: idf = ln(1 + (N - df + 0.5) / (df + 0.5)), tf / (tf + k1 (1 - b + b dl/avgdl))."""
    texts = [
        TOKEN.findall(f"{d['title']}\n{d['contents']}".lower() if d.get("title") else d["contents"].lower())
        for d in docs
    ]
    n = len(texts)
    avgdl = sum(map(len, texts)) / n
    df = Counter(t for toks in texts for t in set(toks))
    scores = {}
    for d, toks in zip(docs, texts, strict=True):
        tf = Counter(toks)
        s = 0.0
        for term in TOKEN.findall(query.lower()):
            if tf[term]:
                idf = math.log(1 + (n - df[term] + 0.5) / (df[term] + 0.5))
                s += idf * tf[term] / (tf[term] + k1 * (1 - b + b * len(toks) / avgdl))
        scores[str(d["id"])] = s
    return scores


def assert_matches_brute_force(hits: list[Hit], expected: dict[str, float], k: int) -> None:
    # Tie-robust: every returned score is the true score of that document, and the returned scores
    # are exactly the k best positive true scores.
    for h in hits:
        assert h.score == pytest.approx(expected[h.doc_id], rel=1e-4, abs=1e-6)
    best = sorted((s for s in expected.values() if s > 0), reverse=True)[:k]
    assert [h.score for h in hits] == pytest.approx(best, rel=1e-4, abs=1e-6)


@pytest.fixture(scope="module")
def plain_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("bm25")
    corpus = write_corpus(d / "corpus.jsonl")
    return build_index(corpus, d / "index", backend="bm25", k1=1.2, b=0.75, stemmer=None, stopwords=None), d


def _toy_with_titles() -> list[dict]:
    from searchrl.search.corpus import split_search_r1_contents

    rows = []
    for r in TOY_DOCS:
        if "title" in r:
            rows.append(r)
        else:
            title, text = split_search_r1_contents(r["contents"])
            rows.append({"id": r["id"], "title": title, "contents": text})
    return rows


@pytest.mark.parametrize(
    "query", ["capital of Veland", "rivers bridges", "Glass Harbor film", "Brask founded Quell"]
)
def test_toy_ranking_equals_brute_force(plain_index, query):
    backend, _ = plain_index
    expected = brute_force_bm25(_toy_with_titles(), query, k1=1.2, b=0.75)
    for k in (1, 3, 8):
        assert_matches_brute_force(backend.search([query], k)[0], expected, k)


_words = st.sampled_from(["alpha", "beta", "gamma", "delta", "eps", "zeta", "eta", "theta"])


@settings(max_examples=25, deadline=None)
@given(
    docs=st.lists(st.lists(_words, min_size=1, max_size=12), min_size=2, max_size=15),
    query=st.lists(_words, min_size=1, max_size=4),
    k1=st.sampled_from([0.9, 1.2, 2.0]),
    b=st.sampled_from([0.0, 0.4, 0.75, 1.0]),
    k=st.integers(1, 6),
)
def test_random_corpora_equal_brute_force(tmp_path_factory, docs, query, k1, b, k):
    d = tmp_path_factory.mktemp("rand")
    rows = [{"id": f"d{i}", "title": "", "contents": " ".join(ws)} for i, ws in enumerate(docs)]
    backend = build_index(
        write_corpus(d / "c.jsonl", rows), d / "idx", k1=k1, b=b, stemmer=None, stopwords=None
    )
    q = " ".join(query)
    assert_matches_brute_force(backend.search([q], k)[0], brute_force_bm25(rows, q, k1, b), k)


def test_save_load_round_trip_and_mmap(plain_index):
    backend, d = plain_index
    queries = ["capital of Veland", "film rivers", "Quell", "nothing-matches-this"]
    before = backend.search(queries, 5)
    for mmap in (True, False):
        loaded = load_index(d / "index", mmap=mmap)
        assert isinstance(loaded, Backend)
        assert loaded.fingerprint == backend.fingerprint == read_meta(d / "index")["fingerprint"]
        assert loaded.search(queries, 5) == before
    assert before[-1] == []
    assert before[0][0].doc_id == "c1" and before[0][0].title == "Tirrow"
    assert before[0][0].text.startswith("Tirrow is the capital")


def test_batch_equals_one_by_one_and_edge_cases(plain_index):
    backend, _ = plain_index
    queries = ["rivers", "", "Tirrow born", "rivers", "zzzz qqqq"]
    batched = backend.search(queries, 3)
    assert batched == [backend.search([q], 3)[0] for q in queries]
    assert batched[1] == [] and batched[4] == []
    assert backend.search([], 3) == []
    assert len(backend.search(["rivers"], 1000)[0]) <= len(TOY_DOCS)
    with pytest.raises(ValueError, match="k must be >= 1"):
        backend.search(["rivers"], 0)


def test_stemming_and_stop_words_are_configurable(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    stemmed = build_index(corpus, tmp_path / "stem", stemmer="english", stopwords="en")
    plain = build_index(corpus, tmp_path / "plain", stemmer=None, stopwords=None)
    # "runs" stems to "run", which matches "running"/"runner"... only with the stemmer.
    assert {h.doc_id for h in stemmed.search(["run"], 8)[0]} >= {"x2", "w1"}
    assert plain.search(["run"], 8)[0] == []
    # A query made only of stop words matches nothing with the stop-word list, something without.
    assert stemmed.search(["the and of"], 3)[0] == []
    assert plain.search(["the and of"], 3)[0] != []
    assert stemmed.fingerprint != plain.fingerprint


def test_fingerprint_tracks_parameters_and_corpus(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    a = build_index(corpus, tmp_path / "a", k1=0.9, b=0.4)
    again = build_index(corpus, tmp_path / "again", k1=0.9, b=0.4)
    other_k1 = build_index(corpus, tmp_path / "k1", k1=1.5, b=0.4)
    changed = write_corpus(tmp_path / "c2.jsonl", [*TOY_DOCS[:-1], {"id": "x3", "contents": "changed"}])
    other_corpus = build_index(changed, tmp_path / "c2", k1=0.9, b=0.4)
    assert a.fingerprint == again.fingerprint
    assert len({a.fingerprint, other_k1.fingerprint, other_corpus.fingerprint}) == 3
    meta = json.loads((tmp_path / "a" / "meta.json").read_text())
    assert meta["num_docs"] == len(TOY_DOCS) and meta["params"]["k1"] == 0.9 and meta["backend"] == "bm25"


def test_bad_parameters_and_unfinished_index_have_clear_errors(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    with pytest.raises(ValueError, match="method 'okapi' is unknown"):
        build_index(corpus, tmp_path / "m", method="okapi")
    with pytest.raises(ValueError, match="b must be in"):
        build_index(corpus, tmp_path / "b", b=2.0)
    with pytest.raises(ValueError, match="unknown stemmer"):
        build_index(corpus, tmp_path / "s", stemmer="klingon")
    build_index(corpus, tmp_path / "ok")
    with pytest.raises(IndexFormatError, match="not empty"):
        build_index(corpus, tmp_path / "ok")
    (tmp_path / "ok" / "meta.json").unlink()
    with pytest.raises(IndexFormatError, match="no meta.json"):
        load_index(tmp_path / "ok")


def test_overwrite_never_deletes_a_directory_that_is_not_an_index(tmp_path):
    corpus = write_corpus(tmp_path / "c.jsonl")
    build_index(corpus, tmp_path / "idx")
    rebuilt = build_index(corpus, tmp_path / "idx", overwrite=True, k1=1.1)
    assert read_meta(tmp_path / "idx")["params"]["k1"] == 1.1 and rebuilt.search(["rivers"], 1)[0]
    precious = tmp_path / "home"
    precious.mkdir()
    (precious / "thesis.tex").write_text("years of work")
    with pytest.raises(IndexFormatError, match=r"not part of an index \(thesis.tex\)"):
        build_index(corpus, precious, overwrite=True)
    assert (precious / "thesis.tex").read_text() == "years of work"
