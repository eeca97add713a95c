"""The search service as a real process: Search-R1 / FlashRAG wire formats, 4xx for every bad request, auth."""

from __future__ import annotations

import json

import httpx
import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.search import TOY_SERVER_TOKEN

from searchrl.search.corpus import split_search_r1_contents
from searchrl.search.index import read_meta

TOKEN = TOY_SERVER_TOKEN
AUTH = {"Authorization": f"Bearer {TOKEN}"}


@pytest.fixture(scope="module")
def served(toy_server, toy_bm25, toy_index_dir):
    return toy_server, toy_bm25, toy_index_dir


def post(server, path: str, body, headers=AUTH, raw: bytes | None = None) -> httpx.Response:
    content = raw if raw is not None else json.dumps(body).encode()
    return httpx.post(
        server.url + path,
        content=content,
        headers={**headers, "Content-Type": "application/json"},
        timeout=30,
    )


def test_retrieve_with_scores_is_search_r1_format(served):
    server, backend, _ = served
    r = post(
        server, "/retrieve", {"queries": ["capital of Veland", "film"], "topk": 2, "return_scores": True}
    )
    assert r.status_code == 200
    result = r.json()["result"]
    expected = backend.search(["capital of Veland", "film"], 2)
    assert len(result) == 2
    for items, hits in zip(result, expected, strict=True):
        assert [it["document"]["id"] for it in items] == [h.doc_id for h in hits]
        assert [it["score"] for it in items] == pytest.approx([h.score for h in hits])
        for it, h in zip(items, hits, strict=True):
            doc = it["document"]
            assert set(doc) == {"id", "contents", "title", "text"}
            assert (
                split_search_r1_contents(doc["contents"]) == (h.title, h.text) == (doc["title"], doc["text"])
            )


def test_retrieve_without_scores_returns_bare_documents_and_default_topk(served):
    server, backend, _ = served
    r = post(server, "/retrieve", {"queries": ["rivers"], "return_scores": False})
    assert r.status_code == 200
    docs = r.json()["result"][0]
    assert [d["id"] for d in docs] == [h.doc_id for h in backend.search(["rivers"], 3)[0]]
    assert all("score" not in d and "document" not in d for d in docs)
    # Omitted return_scores means false, as in Search-R1.
    assert post(server, "/retrieve", {"queries": ["rivers"]}).json() == r.json()


def test_skyrl_single_query_and_flashrag_endpoints(served):
    server, backend, _ = served
    hits = backend.search(["Glass Harbor"], 2)[0]
    one = post(server, "/retrieve", {"query": "Glass Harbor", "topk": 2, "return_scores": True}).json()[
        "result"
    ]
    assert [it["document"]["id"] for it in one[0]] == [h.doc_id for h in hits]
    docs, scores = post(
        server, "/batch_search", {"query": ["Glass Harbor"], "top_n": 2, "return_score": True}
    ).json()
    assert [d["id"] for d in docs[0]] == [h.doc_id for h in hits]
    assert scores[0] == pytest.approx([h.score for h in hits])
    plain = post(server, "/batch_search", {"query": ["Glass Harbor"], "top_n": 2}).json()
    assert plain == docs
    single = post(server, "/search", {"query": "Glass Harbor", "top_n": 2}).json()
    assert single == docs[0]


def test_health_and_openapi(served):
    server, _, index_dir = served
    health = httpx.get(server.url + "/health").json()  # open without a token: load balancers probe it
    meta = read_meta(index_dir)
    assert health["status"] == "ok"
    assert health["fingerprint"] == meta["fingerprint"] and health["num_docs"] == meta["num_docs"]
    spec = httpx.get(server.url + "/openapi.json", headers=AUTH).json()
    assert {"/retrieve", "/batch_search", "/health"} <= set(spec["paths"])
    schema = spec["paths"]["/retrieve"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert {"queries", "topk", "return_scores"} <= set(schema["properties"])


BAD_REQUESTS = [
    ("invalid JSON", None, b'{"queries": ["a"', "not valid JSON"),
    ("not an object", ["a"], None, "must be a JSON object"),
    ("a bare string", "hello", None, "must be a JSON object"),
    ("missing queries", {"topk": 3}, None, "exactly one of 'queries'"),
    ("queries not a list", {"queries": "abc"}, None, "must be a list of strings"),
    ("query item not a string", {"queries": ["ok", 7]}, None, "'queries[1]' must be a string"),
    ("empty list", {"queries": []}, None, "is empty"),
    ("10,000 queries", {"queries": ["q"] * 10_000}, None, "at most 1024"),
    ("100 kB query", {"queries": ["x" * 100_000]}, None, "at most 4096"),
    ("topk 0", {"queries": ["a"], "topk": 0}, None, "between 1 and 100"),
    ("topk 10,000", {"queries": ["a"], "topk": 10_000}, None, "between 1 and 100"),
    ("topk a string", {"queries": ["a"], "topk": "3"}, None, "'topk' must be an integer"),
    ("topk a float", {"queries": ["a"], "topk": 2.5}, None, "'topk' must be an integer"),
    ("topk a bool", {"queries": ["a"], "topk": True}, None, "'topk' must be an integer"),
    ("return_scores not a bool", {"queries": ["a"], "return_scores": "yes"}, None, "true or false"),
    ("both query and queries", {"queries": ["a"], "query": "b"}, None, "exactly one of"),
    ("unknown field", {"queries": ["a"], "top_k": 3}, None, "unknown field(s) 'top_k'"),
]


@pytest.mark.parametrize(("name", "body", "raw", "message"), BAD_REQUESTS, ids=[b[0] for b in BAD_REQUESTS])
def test_bad_requests_get_4xx_with_a_message(served, name, body, raw, message):
    server, _, _ = served
    r = post(server, "/retrieve", body, raw=raw)
    assert 400 <= r.status_code < 500, (name, r.status_code, r.text)
    assert message in r.json()["error"]


def test_flashrag_bad_requests_and_oversized_body(served):
    server, _, _ = served
    r = post(server, "/batch_search", {"query": "not a list", "top_n": 2})
    assert r.status_code == 422 and "list of strings" in r.json()["error"]
    r = post(server, "/batch_search", {"top_n": 2})
    assert r.status_code == 422 and "missing field 'query'" in r.json()["error"]
    r = post(server, "/retrieve", None, raw=b'{"queries": ["' + b"x" * (9 * 1024 * 1024) + b'"]}')
    assert r.status_code == 413 and "exceeds" in r.json()["error"]
    assert httpx.get(server.url + "/retrieve", headers=AUTH).status_code == 405
    assert httpx.get(server.url + "/nope", headers=AUTH).status_code == 404


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_bodies = st.one_of(
    _json_values,
    st.fixed_dictionaries(
        {},
        optional={
            "queries": st.one_of(st.lists(st.text(max_size=30), max_size=5), _json_values),
            "query": _json_values,
            "topk": st.one_of(st.integers(-5, 200), _json_values),
            "return_scores": _json_values,
        },
    ),
)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(body=_bodies, path=st.sampled_from(["/retrieve", "/batch_search", "/search"]))
def test_random_bodies_never_get_5xx(served, body, path):
    server, _, _ = served
    r = post(server, path, body)
    assert r.status_code < 500, r.text
    if r.status_code != 200:
        assert r.json()["error"]


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_random_bytes_never_get_5xx(served, raw):
    server, _, _ = served
    assert post(server, "/retrieve", None, raw=raw).status_code < 500


def test_token_auth(served):
    server, _, _ = served
    body = {"queries": ["rivers"], "topk": 1}
    missing = post(server, "/retrieve", body, headers={})
    wrong = post(server, "/retrieve", body, headers={"Authorization": "Bearer wrong"})
    not_bearer = post(server, "/retrieve", body, headers={"Authorization": TOKEN})
    for r in (missing, wrong, not_bearer):
        assert r.status_code == 401 and "bearer token" in r.json()["error"]
    assert post(server, "/batch_search", {"query": ["a"]}, headers={}).status_code == 401
    assert post(server, "/retrieve", body).status_code == 200


def test_binds_loopback_only_by_default(served):
    server, _, _ = served
    listening = [
        c.laddr
        for c in psutil.Process(server.proc.pid).net_connections(kind="tcp")
        if c.status == psutil.CONN_LISTEN
    ]
    assert listening and all(addr.ip == "127.0.0.1" for addr in listening)


class _BrokenBackend:
    """A backend whose engine fails: first with a typed search error, then with a plain bug."""

    fingerprint = "broken"

    def __init__(self, exc: Exception):
        self.exc = exc

    def search(self, queries, k):
        raise self.exc


def test_backend_failures_are_5xx_with_a_message_and_bad_requests_still_4xx():
    from fastapi.testclient import TestClient

    from searchrl.search.base import SearchUnavailable
    from searchrl.search.server import create_app

    typed = TestClient(
        create_app(_BrokenBackend(SearchUnavailable("disk gone"))), raise_server_exceptions=False
    )
    r = typed.post("/retrieve", json={"queries": ["a"]})
    assert r.status_code == 503 and "disk gone" in r.json()["error"]
    bug = TestClient(create_app(_BrokenBackend(RuntimeError("oops"))), raise_server_exceptions=False)
    r = bug.post("/retrieve", json={"queries": ["a"]})
    assert r.status_code == 500 and "RuntimeError: oops" in r.json()["error"]
    # Validation happens before the backend is touched, so a bad request is 4xx even here.
    assert bug.post("/retrieve", json={"queries": []}).status_code == 422


def test_non_retryable_backend_errors_are_4xx():
    from fastapi.testclient import TestClient

    from searchrl.search.cache import CacheMiss
    from searchrl.search.server import create_app

    replay = TestClient(
        create_app(_BrokenBackend(CacheMiss("no result for 'q'"))), raise_server_exceptions=False
    )
    r = replay.post("/retrieve", json={"queries": ["q"]})
    assert r.status_code == 422 and "cache_miss" in r.json()["error"]


def test_concurrent_clients_get_their_own_correct_answers(served):
    from concurrent.futures import ThreadPoolExecutor

    server, backend, _ = served
    # Big batches go to the server's thread pool, small ones run inline: mix both.
    workloads = [["rivers"] * 20, ["capital of Veland"], ["Glass Harbor film", "Brask"] * 8, ["Tirrow"]] * 4

    def ask(queries):
        r = post(server, "/retrieve", {"queries": queries, "topk": 3, "return_scores": True})
        return [[it["document"]["id"] for it in items] for items in r.json()["result"]]

    with ThreadPoolExecutor(8) as pool:
        answers = list(pool.map(ask, workloads))
    for queries, got in zip(workloads, answers, strict=True):
        assert got == [[h.doc_id for h in hits] for hits in backend.search(queries, 3)]
