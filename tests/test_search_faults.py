"""Fault injection: seeded (same seed, same faults), rates as asked, perturbations well-formed, counters."""

from __future__ import annotations

import time

import pytest

from searchrl.env.config import EnvConfig
from searchrl.env.environment import SearchEnvironment
from searchrl.env.protocol import format_answer, format_tool_call
from searchrl.search.base import Backend, SearchError, SearchTimeout, SearchUnavailable
from searchrl.search.faults import FaultInjectingBackend, FindsNothing

QUERIES = ["rivers", "capital of Veland", "Glass Harbor film", "Quell Brask"]


def run(backend, calls: int) -> list:
    outcomes = []
    for _ in range(calls):
        try:
            outcomes.append([[h.doc_id for h in hits] for hits in backend.search(QUERIES, 5)])
        except SearchError as e:
            outcomes.append(type(e).__name__)
    return outcomes


def faulty(bm25, seed: int) -> FaultInjectingBackend:
    return FaultInjectingBackend(
        bm25, seed=seed, timeout_rate=0.2, error_rate=0.2, drop_rate=0.3, shuffle_rate=0.3
    )


def test_same_seed_same_faults_other_seed_other_faults(toy_bm25):
    a, b, c = faulty(toy_bm25, 7), faulty(toy_bm25, 7), faulty(toy_bm25, 8)
    out_a, out_b, out_c = run(a, 60), run(b, 60), run(c, 60)
    assert out_a == out_b and a.counters == b.counters
    assert out_a != out_c
    assert {"SearchTimeout", "SearchUnavailable"} <= {o for o in out_a if isinstance(o, str)}


def test_rates_are_respected(toy_bm25):
    backend = FaultInjectingBackend(toy_bm25, seed=1, timeout_rate=0.1, error_rate=0.3)
    run(backend, 500)
    c = backend.counters
    assert c["calls"] == 500
    # Binomial(500, p): these bounds are > 5 standard deviations wide.
    assert 20 <= c["timeouts"] <= 85
    assert 110 <= c["errors"] <= 190
    clean = FaultInjectingBackend(toy_bm25, seed=1)
    assert run(clean, 20) == [[[h.doc_id for h in hits] for hits in toy_bm25.search(QUERIES, 5)]] * 20


def test_drops_keep_order_and_shuffles_keep_the_hits(toy_bm25):
    truth = toy_bm25.search(QUERIES, 5)
    dropper = FaultInjectingBackend(toy_bm25, seed=3, drop_rate=1.0)
    for got, want in zip(dropper.search(QUERIES, 5), truth, strict=True):
        assert len(got) < len(want)
        assert [h for h in want if h in got] == got  # a subsequence: surviving hits keep their ranks
    shuffler = FaultInjectingBackend(toy_bm25, seed=3, shuffle_rate=1.0)
    outs = [shuffler.search(QUERIES, 5) for _ in range(5)]
    assert all(
        sorted(g, key=lambda h: h.doc_id) == sorted(w, key=lambda h: h.doc_id)
        for o in outs
        for g, w in zip(o, truth, strict=True)
    )
    assert any(g != w for o in outs for g, w in zip(o, truth, strict=True) if len(w) > 1)
    assert dropper.counters["dropped"] == len(QUERIES) and shuffler.counters["shuffled"] > 0


def test_latency_and_timeout_wait(toy_bm25):
    slow = FaultInjectingBackend(toy_bm25, seed=0, latency_ms=30)
    t = time.perf_counter()
    slow.search(["rivers"], 1)
    assert time.perf_counter() - t >= 0.029
    hang = FaultInjectingBackend(toy_bm25, seed=0, timeout_rate=1.0, timeout_s=0.05)
    t = time.perf_counter()
    with pytest.raises(SearchTimeout, match="injected timeout"):
        hang.search(["rivers"], 1)
    assert 0.049 <= time.perf_counter() - t < 2
    with pytest.raises(SearchUnavailable, match="injected backend error"):
        FaultInjectingBackend(toy_bm25, seed=0, error_rate=1.0).search(["rivers"], 1)


def test_bad_rates_are_rejected(toy_bm25):
    with pytest.raises(ValueError, match="drop_rate must be a probability"):
        FaultInjectingBackend(toy_bm25, drop_rate=1.5)
    with pytest.raises(ValueError, match=">= 0"):
        FaultInjectingBackend(toy_bm25, latency_ms=-1)


def test_finds_nothing_is_a_backend_whose_searches_find_no_document() -> None:
    backend = FindsNothing()
    assert isinstance(backend, Backend) and backend.fingerprint == "finds-nothing"
    assert backend.search(QUERIES, 5) == [[], [], [], []] and backend.search([], 3) == []
    # Through the environment (the closed-book evaluation): the call succeeds, shows nothing, nothing is read.
    env = SearchEnvironment(backend, EnvConfig())
    env.reset({"id": "q1", "question": "Where is Glass Harbor?", "golds": ["Veland"]})
    result = env.step(format_tool_call("search", {"query": "Glass Harbor"}))
    assert result.records[0].status == "ok" and result.records[0].doc_ids == []
    assert result.tool_messages[0]["content"].startswith('No documents found for "Glass Harbor".')
    final = env.step(format_answer("Veland", []))
    assert final.termination == "answered" and env.retrieved == {}
