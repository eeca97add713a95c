"""Who may read what, tested like a security boundary through every search path a user can reach.

The leak test runs the same checks through in-process BM25, dense (faiss flat and HNSW), the SQLite cache, a
replayed snapshot and the HTTP service with its client: as principal A, queries made of B's private words
return none of B's documents and still k results from what A may read; A finds its own; no principal (and an
unknown one) sees public documents only. Then the adversarial inputs (principal ids with odd characters,
empty and ill-typed ACLs, a principal spoofed in the query string or sent twice), the index keeping its ACLs,
and hypothesis property tests: the filtered top-k equals brute force over the readable documents.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pytest
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.search import ServerProcess
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.search.acl import AccessControl, PrincipalError, check_principal, parse_acl
from searchrl.search.base import BadSearchRequest, Hit, search_as
from searchrl.search.bm25 import BM25Backend, BM25Params
from searchrl.search.cache import CachedBackend, CacheMiss
from searchrl.search.client import HTTPBackend
from searchrl.search.corpus import CorpusError, DocStore, Document, corpus_hash, load_corpus
from searchrl.search.dense import DenseBackend
from searchrl.search.faults import FaultInjectingBackend
from searchrl.search.index import IndexFormatError, build_index, load_index, read_meta
from searchrl.search.server import create_app

CORPUS = [
    {"id": "pub1", "title": "Returns policy", "contents": "An order may be returned within thirty days."},
    {
        "id": "pub2",
        "title": "Shipping policy",
        "contents": "Every order ships within two days with tracking.",
    },
    {"id": "pub3", "title": "Kettle care", "contents": "Descale a kettle monthly; order vinegar for it."},
    {"id": "pub4", "title": "Lamp guide", "contents": "Each lamp order includes a manual and a bulb."},
    {
        "id": "a1",
        "title": "Order A-100",
        "contents": "Alice order: blue kettle by Parcelo, note marigoldwhisper.",
        "acl": ["alice"],
    },
    {
        "id": "a2",
        "title": "Order A-101",
        "contents": "Alice order: reading lamp, not shipped.",
        "acl": ["alice"],
    },
    {
        "id": "b1",
        "title": "Order B-200",
        "contents": "Bob order: zephyrine quokkaberry kettle, tracking xylotrack.",
        "acl": ["bob"],
    },
    {
        "id": "b2",
        "title": "Order B-201",
        "contents": "Bob order: quokkaberry lamp, zephyrine note.",
        "acl": ["bob"],
    },
    {
        "id": "s1",
        "title": "Shared order",
        "contents": "Alice and Bob order a toaster together.",
        "acl": ["alice", "bob"],
    },
    {"id": "n1", "title": "Archived", "contents": "zephyrine marigoldwhisper archived order", "acl": []},
    {"id": "w1", "title": "Star order", "contents": "zephyrine order for the star principal", "acl": ["*"]},
]
PUBLIC = {"pub1", "pub2", "pub3", "pub4"}
READABLE = {
    None: PUBLIC,
    "alice": PUBLIC | {"a1", "a2", "s1"},
    "bob": PUBLIC | {"b1", "b2", "s1"},
    "*": PUBLIC | {"w1"},
}
BOB_PRIVATE_QUERIES = [
    "zephyrine quokkaberry order",
    "xylotrack zephyrine kettle order",
    "quokkaberry lamp order",
]
ALICE_OWN_QUERY = "marigoldwhisper blue kettle Parcelo"
BOB_OWN_QUERY = "zephyrine quokkaberry kettle xylotrack"
PUBLIC_QUERY = "order kettle lamp"
# Principals that must not read anything but public documents: unknown, case-changed, list-like, wildcard-like.
OUTSIDERS = ["mallory", "ALICE", "Alice", "alice,bob", "alice bob", "%", "**", "alicex", "bob'--"]
STAR_QUERY = "zephyrine order star principal"
K = 3


def write_rows(path: Path, rows: list[dict[str, Any]]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


# -- the search paths ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def acl_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("acl")
    write_rows(d / "corpus.jsonl", CORPUS)
    build_index(d / "corpus.jsonl", d / "bm25")
    return d


@pytest.fixture(scope="module")
def bm25(acl_dir: Path) -> Any:
    return load_index(acl_dir / "bm25")


@pytest.fixture(scope="module")
def dense_dirs(acl_dir: Path) -> dict[str, Path]:
    out = {}
    for kind in ("flat", "hnsw"):
        build_index(acl_dir / "corpus.jsonl", acl_dir / f"dense_{kind}", backend="dense", index_type=kind)
        out[kind] = acl_dir / f"dense_{kind}"
    return out


LEAK_PRINCIPALS = [None, "alice", "bob", "*", *OUTSIDERS]
LEAK_QUERIES = [*BOB_PRIVATE_QUERIES, ALICE_OWN_QUERY, BOB_OWN_QUERY, PUBLIC_QUERY, STAR_QUERY]


@pytest.fixture(scope="module")
def server(acl_dir: Path) -> Any:
    with ServerProcess(acl_dir / "bm25") as srv:
        yield srv


@pytest.fixture(params=["bm25", "dense_flat", "dense_hnsw", "cache", "replay", "faults", "http"])
def path(request: pytest.FixtureRequest, bm25: Any, acl_dir: Path, tmp_path: Path) -> Any:
    """One search path a user can reach, over the same ACL corpus."""
    kind = request.param
    if kind == "bm25":
        return bm25
    if kind.startswith("dense"):
        return load_index(request.getfixturevalue("dense_dirs")[kind.split("_")[1]])
    if kind == "cache":
        return CachedBackend(bm25, tmp_path / "cache.sqlite", mode="read_write")
    if kind == "replay":
        record = CachedBackend(bm25, tmp_path / "snap.sqlite", mode="read_write")
        for principal in LEAK_PRINCIPALS:
            for k in (K, 10):
                search_as(record, LEAK_QUERIES, k, [principal] * len(LEAK_QUERIES))
        record.close()
        return CachedBackend(None, tmp_path / "snap.sqlite", mode="replay")
    if kind == "faults":
        return FaultInjectingBackend(bm25, seed=3, latency_ms=1)
    return HTTPBackend(request.getfixturevalue("server").url, max_retries=0)


def as_(backend: Any, principal: str | None, queries: list[str], k: int = K) -> list[list[Hit]]:
    return search_as(backend, queries, k, [principal] * len(queries))


def ids(hits: list[Hit]) -> list[str]:
    return [h.doc_id for h in hits]


def test_a_never_sees_bs_documents_and_still_gets_k_results(path: Any) -> None:
    for hits in as_(path, "alice", BOB_PRIVATE_QUERIES):
        assert len(hits) == K, ids(hits)  # filtered before the cut: still k documents
        assert set(ids(hits)) <= READABLE["alice"], ids(hits)
        text = " ".join(f"{h.title} {h.text}" for h in hits)
        assert "quokkaberry" not in text and "xylotrack" not in text and "zephyrine" not in text


def test_each_principal_finds_its_own(path: Any) -> None:
    assert ids(as_(path, "alice", [ALICE_OWN_QUERY])[0])[0] == "a1"
    assert ids(as_(path, "bob", [BOB_OWN_QUERY])[0])[0] == "b1"
    star = as_(path, "*", [STAR_QUERY], 10)[0]
    assert "w1" in ids(star) and set(ids(star)) <= READABLE["*"]


def test_no_principal_and_outsiders_see_public_documents_only(path: Any) -> None:
    for principal in [None, *OUTSIDERS]:
        for hits in as_(path, principal, [*BOB_PRIVATE_QUERIES, ALICE_OWN_QUERY, PUBLIC_QUERY], 10):
            assert set(ids(hits)) <= PUBLIC, (principal, ids(hits))
    assert len(path.search([PUBLIC_QUERY], 10)[0]) == len(PUBLIC)  # the plain call is public search


def test_one_batch_serves_many_principals(path: Any) -> None:
    principals = ["alice", "bob", None, "alice", "mallory"]
    queries = [ALICE_OWN_QUERY, BOB_OWN_QUERY, ALICE_OWN_QUERY, BOB_PRIVATE_QUERIES[0], BOB_OWN_QUERY]
    results = search_as(path, queries, K, principals)
    for principal, hits in zip(principals, results, strict=True):
        assert set(ids(hits)) <= READABLE.get(principal, PUBLIC)
    assert ids(results[0])[0] == "a1" and ids(results[1])[0] == "b1"
    assert "a1" not in ids(results[2]) and "b1" not in ids(results[4])


def test_invalid_principals_are_refused(path: Any) -> None:
    for bad in ["", " alice", "alice ", "ali\u0000ce", "a\nb", "alice\u200b", "x" * 257, 7, ["alice"]]:
        with pytest.raises((PrincipalError, BadSearchRequest, ValueError, TypeError)):
            search_as(path, ["order"], K, [bad])  # type: ignore[list-item]


# -- the cache and replay keys ------------------------------------------------------------------------


def test_cache_keys_hold_the_principal(bm25: Any, tmp_path: Path) -> None:
    cache = CachedBackend(bm25, tmp_path / "c.sqlite", mode="read_write")
    assert ids(as_(cache, "bob", [BOB_OWN_QUERY])[0])[0] == "b1"
    assert "b1" not in ids(as_(cache, "alice", [BOB_OWN_QUERY])[0])  # not bob's cached answer
    assert "b1" not in ids(cache.search([BOB_OWN_QUERY], K)[0])
    assert cache.stats["hits"] == 0  # three principals, three keys
    cache.close()
    replay = CachedBackend(None, tmp_path / "c.sqlite", mode="replay")
    assert ids(as_(replay, "bob", [BOB_OWN_QUERY])[0])[0] == "b1"
    with pytest.raises(CacheMiss):  # never another principal's snapshot
        as_(replay, "carol", [BOB_OWN_QUERY])


# -- the HTTP service -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def client(bm25: Any) -> TestClient:
    return TestClient(create_app(bm25, token="t0k"), headers={"Authorization": "Bearer t0k"})


def _retrieve(
    client: TestClient, body: Any, url: str = "/retrieve", raw: bytes | None = None
) -> httpx.Response:
    if raw is not None:
        return client.post(url, content=raw, headers={"content-type": "application/json"})
    return client.post(url, json=body)


def test_service_filters_by_the_principal_field(client: TestClient) -> None:
    assert client.get("/health").json()["principals"] is True
    body = {"queries": [BOB_OWN_QUERY], "topk": 10, "return_scores": True}
    as_bob = _retrieve(client, {**body, "principal": "bob"}).json()["result"][0]
    assert as_bob[0]["document"]["id"] == "b1"
    for extra in ({}, {"principal": None}, {"principal": "mallory"}, {"principal": "BOB"}):
        hits = _retrieve(client, {**body, **extra}).json()["result"][0]
        assert {h["document"]["id"] for h in hits} <= PUBLIC, extra
    flash = _retrieve(
        client, {"query": [BOB_OWN_QUERY], "top_n": 3, "principal": "bob"}, "/batch_search"
    ).json()
    assert flash[0][0]["id"] == "b1"
    one = _retrieve(client, {"query": BOB_OWN_QUERY, "principal": "alice"}, "/search").json()
    assert "b1" not in {d["id"] for d in one}


def test_service_refuses_bad_and_ambiguous_principals(client: TestClient) -> None:
    base = {"queries": [BOB_OWN_QUERY], "topk": 3}
    for bad in ["", " bob", "bob\t", "b\u0000ob", 7, True, ["bob"], {"id": "bob"}, "x" * 300]:
        r = _retrieve(client, {**base, "principal": bad})
        assert r.status_code == 422 and "principal" in r.json()["error"], (bad, r.text)
    twice = b'{"queries": ["zephyrine"], "topk": 3, "principal": "alice", "principal": "bob"}'
    r = _retrieve(client, None, raw=twice)
    assert r.status_code == 400 and "more than once" in r.json()["error"]
    spoofed = client.post("/retrieve?principal=bob", json={**base, "return_scores": False})
    assert spoofed.status_code == 200 and not {d["id"] for d in spoofed.json()["result"][0]} - PUBLIC
    r = _retrieve(client, {**base, "principals": ["bob"]})  # a near-miss field name is not ignored
    assert r.status_code == 422 and "unknown field" in r.json()["error"]


def test_service_over_a_backend_without_acls_refuses_principals() -> None:
    class Plain:
        fingerprint = "plain"

        def search(self, queries: list[str], k: int) -> list[list[Hit]]:
            return [[Hit("secret", 1.0, "t", "everything")] for _ in queries]

    client = TestClient(create_app(Plain()))
    assert client.get("/health").json()["principals"] is False
    r = client.post("/retrieve", json={"queries": ["q"], "principal": "alice"})
    assert r.status_code == 422 and "does not enforce" in r.json()["error"]


def test_client_refuses_to_send_a_principal_to_a_server_that_would_ignore_it() -> None:
    seen: list[str] = []

    def handler(request: httpx.Request) -> httpx.Response:
        seen.append(request.url.path)
        if request.url.path == "/health":
            return httpx.Response(200, json={"status": "ok"})  # Search-R1's server says nothing of ACLs
        return httpx.Response(
            200, json={"result": [[{"document": {"id": "b1", "contents": "x"}, "score": 1}]]}
        )

    client = HTTPBackend("http://search.invalid:8000", max_retries=0)
    client._client = httpx.Client(transport=httpx.MockTransport(handler))
    with pytest.raises(BadSearchRequest, match="does not say it enforces"):
        client.search(["q"], 3, principals=["alice"])
    assert seen == ["/health"]  # the query never went out
    assert len(client.search(["q"], 3)[0]) == 1  # public search still works


def test_client_sends_one_request_per_principal(server: Any) -> None:
    client = HTTPBackend(server.url, max_retries=0)
    before = client.stats["requests"]
    results = client.search([BOB_OWN_QUERY] * 3, K, principals=["bob", "alice", "bob"])
    assert client.stats["requests"] - before == 2
    assert ids(results[0])[0] == "b1" == ids(results[2])[0] and "b1" not in ids(results[1])


# -- the command line and the index ------------------------------------------------------------------


def test_cli_search_takes_a_principal(acl_dir: Path) -> None:
    runner = CliRunner()
    base = ["search", "--index", str(acl_dir / "bm25"), "--k", "3", "--json", BOB_OWN_QUERY]
    as_bob = json.loads(runner.invoke(app, [*base, "--principal", "bob"]).output)
    assert as_bob[0][0]["doc_id"] == "b1"
    public = json.loads(runner.invoke(app, base).output)
    assert {h["doc_id"] for h in public[0]} <= PUBLIC
    r = runner.invoke(app, [*base, "--principal", " bob"])
    assert r.exit_code == 2 and "--principal" in r.output


@pytest.mark.parametrize(
    ("acl", "says"),
    [
        ("bob", "field 'acl' must be a list"),
        ({"bob": True}, "field 'acl' must be a list"),
        (7, "field 'acl' must be a list"),
        ([1], "field 'acl[0]'"),
        (["bob", ""], "field 'acl[1]'"),
        ([" bob"], "white space"),
        (["b\u0000ob"], "control"),
        ([None], "field 'acl[0]'"),
        ([["bob"]], "field 'acl[0]'"),
    ],
)
def test_malformed_acl_fails_with_file_line_and_field(tmp_path: Path, acl: Any, says: str) -> None:
    corpus = write_rows(tmp_path / "c.jsonl", [CORPUS[0], {"id": "x", "contents": "text", "acl": acl}])
    with pytest.raises(CorpusError, match=f"c.jsonl:2: .*{re.escape(says)}"):
        load_corpus(corpus)
    r = CliRunner().invoke(app, ["index", "--corpus", str(corpus), "--out", str(tmp_path / "idx")])
    assert r.exit_code == 2 and "c.jsonl:2" in r.output and "acl" in r.output


def test_acl_forms_that_are_accepted(tmp_path: Path) -> None:
    rows = [
        {"id": "p", "contents": "public text", "acl": None},
        {"id": "e", "contents": "nobody text", "acl": []},
        {"id": "d", "contents": "dup text", "acl": ["b", "a", "b"]},
        {"id": "u", "contents": "unicode text", "acl": ["客户-7", "*"]},
    ]
    docs = load_corpus(write_rows(tmp_path / "c.jsonl", rows))
    assert [d.acl for d in docs] == [None, (), ("a", "b"), ("*", "客户-7")]
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "c.parquet")
    assert [d.acl for d in load_corpus(tmp_path / "c.parquet")] == [None, (), ("a", "b"), ("*", "客户-7")]
    backend = build_index(tmp_path / "c.jsonl", tmp_path / "idx")
    for principal in (None, "a", "b", "*", "客户-7", "nobody"):
        assert "e" not in ids(as_(backend, principal, ["nobody text"], 10)[0])  # [] is no one, not everyone
    assert ids(as_(backend, "客户-7", ["unicode text"], 1)[0]) == ["u"]


def test_index_keeps_acls_and_the_fingerprint_follows_them(acl_dir: Path, tmp_path: Path) -> None:
    meta = read_meta(acl_dir / "bm25")
    assert meta["acl"] == {"restricted_docs": 7, "principals": 3}
    acl = AccessControl.load(acl_dir / "bm25", meta["num_docs"])
    assert acl is not None and acl.readable("alice").sum() == len(READABLE["alice"])
    changed = [dict(r, acl=["alice"]) if r["id"] == "b1" else r for r in CORPUS]
    other = build_index(write_rows(tmp_path / "c.jsonl", changed), tmp_path / "idx")
    assert other.fingerprint != load_index(acl_dir / "bm25").fingerprint
    assert ids(as_(other, "alice", [BOB_OWN_QUERY])[0])[0] == "b1"
    (tmp_path / "idx" / "acl.json").unlink()
    with pytest.raises(IndexFormatError, match="acl.json is missing"):  # fail closed, never all-public
        load_index(tmp_path / "idx")


def test_a_corpus_without_acls_hashes_as_before() -> None:
    import hashlib

    docs = [Document("d1", "Title", "text"), Document("d2", "", "more")]
    h = hashlib.sha256()  # the corpus hash as it was before ACLs existed
    for d in docs:
        for part in (d.id, d.title, d.text):
            b = part.encode("utf-8")
            h.update(len(b).to_bytes(8, "little"))
            h.update(b)
    assert corpus_hash(docs) == h.hexdigest()
    assert corpus_hash([Document("d1", "Title", "text", ("a",)), docs[1]]) != h.hexdigest()


def test_principal_rules() -> None:
    assert check_principal(None) is None and check_principal("*") == "*"
    assert parse_acl(None, "w") is None and parse_acl([], "w") == ()
    for bad in ("", " x", "x\n", "\u202ex", 3):
        with pytest.raises(PrincipalError):
            check_principal(bad)


# -- property tests: the filtered top-k equals brute force over the readable documents ----------------

WORDS = ["apple", "brick", "cider", "delta", "ember", "fjord", "grove", "harbor"]
ACLS = st.one_of(st.none(), st.just([]), st.lists(st.sampled_from(["a", "b", "c"]), min_size=1, max_size=3))
DOCS = st.lists(
    st.tuples(st.lists(st.sampled_from(WORDS), min_size=1, max_size=6), ACLS), min_size=1, max_size=14
)
QUERY = st.lists(st.sampled_from(WORDS), min_size=1, max_size=3).map(" ".join)
PRINCIPAL = st.sampled_from([None, "a", "b", "c", "d"])


def _readable(acls: list[Any], principal: str | None) -> list[bool]:
    return [acl is None or (principal is not None and principal in acl) for acl in acls]


def _check_against_brute_force(hits: list[Hit], scores: dict[str, float], readable: set[str], k: int) -> None:
    """`hits` are the best k readable documents with a positive score, ties in any order."""
    expected = sorted((s for d, s in scores.items() if d in readable and s > 0), reverse=True)[:k]
    assert [h.score for h in hits] == pytest.approx(expected, abs=1e-5)
    assert {h.doc_id for h in hits} <= readable
    for h in hits:
        assert h.score == pytest.approx(scores[h.doc_id], abs=1e-5)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=DOCS, queries=st.lists(QUERY, min_size=1, max_size=4), principal=PRINCIPAL, k=st.integers(1, 6))
def test_bm25_filtered_topk_equals_brute_force(
    docs: list[Any], queries: list[str], principal: Any, k: int
) -> None:
    rows = [
        {"id": f"d{i}", "title": "", "contents": " ".join(words), **({"acl": acl} if acl is not None else {})}
        for i, (words, acl) in enumerate(docs)
    ]
    acls = [acl for _, acl in docs]
    readable = {r["id"] for r, ok in zip(rows, _readable(acls, principal), strict=True) if ok}
    with tempfile.TemporaryDirectory() as d:
        backend = build_index(write_rows(Path(d) / "c.jsonl", rows), Path(d) / "idx", stemmer=None)
        open_ = BM25Backend(
            backend._retriever, backend._tokenizer, backend._docs, BM25Params(), "x"
        )  # no ACLs
        everything = open_.search(queries, len(rows))
        filtered = as_(backend, principal, queries, k)
    for all_hits, hits in zip(everything, filtered, strict=True):
        _check_against_brute_force(hits, {h.doc_id: h.score for h in all_hits}, readable, k)


class HashEncoder:
    """Deterministic unit vectors from each text's words: a dense encoder without a model."""

    def encode(self, texts: list[str], **_: Any) -> np.ndarray:
        out = np.zeros((len(texts), 16), np.float32)
        for i, text in enumerate(texts):
            for word in text.lower().replace(".", " ").split():
                out[i] += np.random.default_rng(abs(hash(word)) % 2**32).standard_normal(16)
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-6)
        return out


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(docs=DOCS, query=QUERY, principal=PRINCIPAL, k=st.integers(1, 6), hnsw=st.booleans())
def test_dense_filtered_topk_equals_brute_force(
    docs: list[Any], query: str, principal: Any, k: int, hnsw: bool
) -> None:
    import faiss

    encoder = HashEncoder()
    texts = [" ".join(words) for words, _ in docs]
    acls = [None if acl is None else tuple(acl) for _, acl in docs]
    vecs = encoder.encode(texts)
    index = faiss.IndexHNSWFlat(16, 4, faiss.METRIC_INNER_PRODUCT) if hnsw else faiss.IndexFlatIP(16)
    index.add(vecs)
    with tempfile.TemporaryDirectory() as d:
        DocStore.write(Path(d), [Document(f"d{i}", "", t) for i, t in enumerate(texts)])
        backend = DenseBackend(index, encoder, DocStore(Path(d)), "x", acl=AccessControl.from_acls(acls))
        hits = as_(backend, principal, [query], k)[0]
    sims = (encoder.encode([query]) @ vecs.T)[0]
    readable_mask = _readable(acls, principal)
    readable = {f"d{i}" for i, ok in enumerate(readable_mask) if ok}
    if all(readable_mask) and hnsw:
        return  # no filter: the HNSW graph's own (approximate) answer, as before ACLs
    expected = sorted((float(s) for s, ok in zip(sims, readable_mask, strict=True) if ok), reverse=True)[:k]
    assert [h.score for h in hits] == pytest.approx(expected, abs=1e-4)
    assert {h.doc_id for h in hits} <= readable


ANY_PRINCIPAL = st.one_of(
    st.text(max_size=12),
    st.sampled_from(["alice", "bob", "*", "alice ", "ALICE", "alice\u0000", "al\u200bice", "бob", "b" * 300]),
    st.integers(),
    st.none(),
    st.lists(st.text(max_size=3), max_size=2),
)


@settings(max_examples=150, deadline=None)
@given(principal=ANY_PRINCIPAL)
def test_any_principal_is_refused_or_reads_only_what_it_may(bm25: Any, principal: Any) -> None:
    try:
        hits = as_(bm25, principal, [BOB_OWN_QUERY, ALICE_OWN_QUERY, STAR_QUERY], 10)
    except PrincipalError:
        assert principal is not None
        return
    for row in hits:
        assert set(ids(row)) <= READABLE.get(principal, PUBLIC), principal


@settings(max_examples=100, deadline=None)
@given(principal=ANY_PRINCIPAL)
def test_the_service_answers_any_principal_with_a_4xx_or_only_what_it_may_read(
    client: TestClient, principal: Any
) -> None:
    r = _retrieve(client, {"queries": [BOB_OWN_QUERY, ALICE_OWN_QUERY], "topk": 10, "principal": principal})
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        for row in r.json()["result"]:
            assert {d["id"] for d in row} <= READABLE.get(principal, PUBLIC), principal
