"""The e5 dense path (Search-R1's retriever recipe) with the bundled MiniLM standing in for e5-base-v2.

- The e5 mode's vectors equal a hand-written reference (transformers `AutoModel`, one text at a time:
  "query: " / "passage: " prefixes, Search-R1's '"Title"\\ntext' passages, mean pooling over the attention
  mask, L2 norm), so prefixes, passage format, padding and pooling are each checked.
- HNSW answers what the exact flat index answers on a small corpus; an existing faiss index (written
  here in corpus order, as Search-R1's index builder does) is linked instead of re-encoding, and one that
  does not fit the corpus is refused.
- A real `searchrl serve` process on 127.0.0.1 serves the e5 index over Search-R1's `/retrieve`, and the
  client gets exactly the in-process hits; the client also reads a server that answers the way Search-R1's
  own retrieval_server.py does (documents with `id` and `contents` only, no /health).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import httpx
import numpy as np
import pytest
import torch
from support.processes import ROOT, free_port
from support.search import TOY_DOCS, write_corpus
from typer.testing import CliRunner

from searchrl.cli import app
from searchrl.search.client import HTTPBackend
from searchrl.search.corpus import load_corpus
from searchrl.search.dense import DenseConfigError, DenseParams, resolve_model_path
from searchrl.search.index import build_index, load_index, read_meta

runner = CliRunner()
QUERIES = ["where was Varnel Oskar born", "capital of Veland", "a film about harbors", "who founded Quell"]


def reference_vectors(texts: list[str], pooling: str = "mean") -> np.ndarray:
    """e5's recipe by hand, one text at a time (no padding at all), on the bundled MiniLM."""
    from transformers import AutoModel, AutoTokenizer

    path = resolve_model_path()
    tok = AutoTokenizer.from_pretrained(path, local_files_only=True)
    model = AutoModel.from_pretrained(path, local_files_only=True).eval()
    out = []
    with torch.inference_mode():
        for text in texts:
            enc = tok(text, truncation=True, max_length=256, return_tensors="pt")
            states = model(**enc).last_hidden_state[0]
            vec = states.mean(dim=0) if pooling == "mean" else states[0]
            out.append((vec / vec.norm()).numpy())
    return np.stack(out)


def passages(rows=TOY_DOCS) -> list[str]:
    texts = []
    for doc in load_corpus_rows(rows):
        body = f'"{doc.title}"\n{doc.text}' if doc.title else doc.text
        texts.append("passage: " + body)
    return texts


def load_corpus_rows(rows):
    from searchrl.search.corpus import document_from_row

    return [document_from_row(r, "test") for r in rows]


@pytest.fixture(scope="module")
def e5_index(tmp_path_factory):
    d = tmp_path_factory.mktemp("e5")
    write_corpus(d / "corpus.jsonl")
    result = runner.invoke(
        app,
        ["index", "--corpus", str(d / "corpus.jsonl"), "--out", str(d / "e5"), "--backend", "dense"]
        + ["--encoder", "e5"],
    )
    assert result.exit_code == 0, result.output
    return d, load_index(d / "e5")


def test_e5_mode_records_its_recipe_and_differs_from_the_plain_model(e5_index, tmp_path):
    d, backend = e5_index
    params = read_meta(d / "e5")["params"]
    assert params["encoder"] == "e5"
    assert (params["query_prefix"], params["passage_prefix"]) == ("query: ", "passage: ")
    assert params["max_length"] == 256 and params["passage_format"] == "contents"
    assert backend.params == DenseParams.preset("e5")
    plain = build_index(d / "corpus.jsonl", tmp_path / "plain", backend="dense")
    assert plain.fingerprint != backend.fingerprint  # the recipe is part of what answers
    assert "encoder" not in read_meta(tmp_path / "plain")["params"]  # defaults: fingerprint as before


def test_e5_vectors_equal_the_hand_written_recipe(e5_index):
    _, backend = e5_index
    docs = reference_vectors(passages())
    queries = reference_vectors(["query: " + q for q in QUERIES])
    # Batched, padded encoding in the backend equals one-at-a-time encoding by hand.
    assert np.allclose(backend.encode_queries(QUERIES), queries, atol=1e-5)
    sims = queries @ docs.T
    for qi, hits in enumerate(backend.search(QUERIES, 3)):
        order = np.argsort(-sims[qi], kind="stable")[:3]
        assert [h.doc_id for h in hits] == [TOY_DOCS[i]["id"] for i in order]
        assert [h.score for h in hits] == pytest.approx(sims[qi][order].tolist(), abs=1e-5)
    # Without the prefixes the vectors are different: the check above would notice a missing prefix.
    assert not np.allclose(reference_vectors(QUERIES), queries, atol=1e-3)


def test_cls_pooling_and_hnsw_index(e5_index, tmp_path):
    d, flat = e5_index
    cls_backend = build_index(
        d / "corpus.jsonl", tmp_path / "cls", backend="dense", encoder="e5", pooling="cls"
    )
    assert np.allclose(
        cls_backend.encode_queries(QUERIES[:2]),
        reference_vectors(["query: " + q for q in QUERIES[:2]], "cls"),
        atol=1e-5,
    )
    hnsw = build_index(
        d / "corpus.jsonl", tmp_path / "hnsw", backend="dense", encoder="e5", index_type="hnsw"
    )
    meta = read_meta(tmp_path / "hnsw")
    assert meta["faiss"]["class"] == "IndexHNSWFlat" and meta["params"]["index_type"] == "hnsw"
    # Eight documents and efSearch 128: the graph search visits everything, so it is exact here.
    for a, b in zip(hnsw.search(QUERIES, 3), flat.search(QUERIES, 3), strict=True):
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    assert (
        load_index(tmp_path / "hnsw").search(QUERIES[:1], 2)[0][0].doc_id
        == flat.search(QUERIES[:1], 2)[0][0].doc_id
    )


def test_an_existing_faiss_index_is_linked_not_reencoded(e5_index, tmp_path):
    import faiss

    d, flat = e5_index
    # A faiss file built outside searchrl, in corpus order (Search-R1's index_builder: row i = document i).
    index = faiss.IndexFlatIP(384)
    index.add(reference_vectors(passages()).astype(np.float32))
    faiss.write_index(index, str(tmp_path / "e5_Flat.index"))
    args = ["index", "--corpus", str(d / "corpus.jsonl"), "--backend", "dense", "--encoder", "e5"]
    result = runner.invoke(
        app, [*args, "--out", str(tmp_path / "linked"), "--faiss-index", str(tmp_path / "e5_Flat.index")]
    )
    assert result.exit_code == 0, result.output
    assert (tmp_path / "linked" / "dense.faiss").is_symlink()
    meta = read_meta(tmp_path / "linked")
    assert meta["faiss"]["linked_from"] == str((tmp_path / "e5_Flat.index").resolve())
    assert meta["params"]["faiss_index"]["ntotal"] == len(TOY_DOCS)
    linked = load_index(tmp_path / "linked")
    for a, b in zip(linked.search(QUERIES, 3), flat.search(QUERIES, 3), strict=True):
        assert [h.doc_id for h in a] == [h.doc_id for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-5)
    # One document more than the index has vectors: refused, saying both counts.
    write_corpus(tmp_path / "bigger.jsonl", [*TOY_DOCS, {"id": "z9", "title": "Z", "contents": "zed"}])
    result = runner.invoke(
        app,
        ["index", "--corpus", str(tmp_path / "bigger.jsonl"), "--backend", "dense", "--encoder", "e5"]
        + ["--out", str(tmp_path / "bad"), "--faiss-index", str(tmp_path / "e5_Flat.index")],
    )
    assert result.exit_code == 2
    assert "holds 8 vectors but the corpus has 9 documents" in result.output
    l2 = faiss.IndexFlatL2(384)
    l2.add(reference_vectors(passages()).astype(np.float32))
    faiss.write_index(l2, str(tmp_path / "l2.index"))
    with pytest.raises(DenseConfigError, match="metric is L2"):
        build_index(
            d / "corpus.jsonl",
            tmp_path / "bad2",
            backend="dense",
            encoder="e5",
            faiss_index=tmp_path / "l2.index",
        )


def test_bad_dense_settings_are_refused_with_what_to_change(tmp_path):
    write_corpus(tmp_path / "c.jsonl")
    with pytest.raises(DenseConfigError, match="apply to the e5 encoder"):
        build_index(tmp_path / "c.jsonl", tmp_path / "a", backend="dense", max_length=128)
    with pytest.raises(DenseConfigError, match="pooling='max' is not one of"):
        build_index(tmp_path / "c.jsonl", tmp_path / "b", backend="dense", encoder="e5", pooling="max")
    with pytest.raises(DenseConfigError, match="unknown dense parameters"):
        build_index(tmp_path / "c.jsonl", tmp_path / "c", backend="dense", prefix="query: ")


class ServeProcess:
    """`searchrl serve` (the CLI entry point itself) on a free 127.0.0.1 port."""

    def __init__(self, args: list[str]):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        cmd = [sys.executable, "-m", "searchrl.cli", "serve", *args, "--port", str(self.port)]
        env = {**os.environ, "PYTHONPATH": str(ROOT)}
        env.pop("SEARCHRL_SERVE_TOKEN", None)
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE, start_new_session=True)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"serve exited early: {self.proc.stderr.read().decode()[-2000:]}")
            try:
                if httpx.get(self.url + "/health", timeout=0.5).status_code == 200:
                    return
            except httpx.HTTPError:
                time.sleep(0.2)
        self.close()
        raise RuntimeError("serve did not become healthy within 120 s")

    def close(self) -> None:
        import signal

        try:
            os.killpg(self.proc.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        try:
            self.proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(timeout=10)


def test_searchrl_serve_answers_search_r1_retrieve_from_the_e5_index(e5_index):
    d, backend = e5_index
    server = ServeProcess(["--index", str(d / "e5"), "--model-path", str(resolve_model_path())])
    try:
        health = httpx.get(server.url + "/health", timeout=5).json()
        assert health["fingerprint"] == backend.fingerprint
        client = HTTPBackend(server.url + "/retrieve")  # the URL a PPO config's search_url takes
        assert client.fingerprint == backend.fingerprint
        for remote, local in zip(client.search(QUERIES, 3), backend.search(QUERIES, 3), strict=True):
            assert [h.doc_id for h in remote] == [h.doc_id for h in local]
            assert [h.score for h in remote] == pytest.approx([h.score for h in local], abs=1e-5)
            assert [(h.title, h.text) for h in remote] == [(h.title, h.text) for h in local]
        # The raw wire format, as Search-R1's generation loop posts it.
        body = {"queries": QUERIES[:2], "topk": 3, "return_scores": True}
        result = httpx.post(server.url + "/retrieve", json=body, timeout=30).json()["result"]
        assert [len(r) for r in result] == [3, 3]
        doc = result[1][0]["document"]
        assert doc["contents"] == f'"{doc["title"]}"\n{doc["text"]}'
    finally:
        server.close()


def test_client_reads_a_search_r1_retrieval_server_answer():
    """Search-R1's retrieval_server.py: POST /retrieve only, documents as {id, contents}, no /health."""
    seen: list[dict] = []

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_GET(self):
            self.send_response(404)
            self.end_headers()

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            seen.append(body)
            docs = [{"id": "17", "contents": '"Tirrow"\nTirrow is the capital of Veland.'}]
            payload = json.dumps(
                {"result": [[{"document": docs[0], "score": 0.91}] for _ in body["queries"]]}
            )
            data = payload.encode()
            self.send_response(200 if self.path == "/retrieve" else 404)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            self.wfile.write(data)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    try:
        url = f"http://127.0.0.1:{httpd.server_address[1]}/retrieve"
        hits = HTTPBackend(url).search(["capital of Veland", "Tirrow"], 3)
        assert seen == [{"queries": ["capital of Veland", "Tirrow"], "topk": 3, "return_scores": True}]
        assert [[(h.doc_id, h.title, h.text, h.score) for h in q] for q in hits] == [
            [("17", "Tirrow", "Tirrow is the capital of Veland.", 0.91)]
        ] * 2
        assert HTTPBackend(url).fingerprint  # no /health: derived from the URL, still a cache key
    finally:
        httpd.shutdown()


def test_serve_refuses_a_missing_model_folder(e5_index, tmp_path):
    d, _ = e5_index
    result = runner.invoke(app, ["serve", "--index", str(d / "e5"), "--model-path", str(tmp_path / "nope")])
    assert result.exit_code == 2 and "no such folder" in result.output


def test_corpus_order_is_index_order(e5_index):
    d, backend = e5_index
    docs = load_corpus(d / "corpus.jsonl")
    assert [backend._docs.doc_id(i) for i in range(len(docs))] == [doc.id for doc in docs]
