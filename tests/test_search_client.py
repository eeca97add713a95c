"""The HTTP client against real servers: three wire formats, typed errors, retries, deadlines, replay."""

from __future__ import annotations

import json
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from support.search import TOY_SERVER_TOKEN, ServerProcess

from searchrl.search.base import BadSearchRequest, SearchTimeout, SearchUnavailable
from searchrl.search.cache import CachedBackend
from searchrl.search.client import HTTPBackend

TOKEN = TOY_SERVER_TOKEN
QUERIES = ["capital of Veland", "rivers bridges", "Glass Harbor", "zzz nothing"]


def fast_client(url: str, **kw) -> HTTPBackend:
    opts = {"connect_timeout": 0.5, "read_timeout": 1.0, "max_retries": 2, "backoff_base": 0.05, "seed": 0}
    return HTTPBackend(url, **{**opts, **kw})


@pytest.mark.parametrize("protocol", ["search_r1", "flashrag", "skyrl"])
def test_every_protocol_returns_what_the_index_returns(toy_bm25, toy_server, protocol):
    backend = toy_bm25
    client = HTTPBackend(toy_server.url, protocol=protocol, token=TOKEN)
    got = client.search(QUERIES, 3)
    want = backend.search(QUERIES, 3)
    assert [[(h.doc_id, h.title, h.text) for h in hits] for hits in got] == [
        [(h.doc_id, h.title, h.text) for h in hits] for hits in want
    ]
    assert [[h.score for h in hits] for hits in got] == [
        [h.score for h in hits] for hits in want
    ]  # JSON floats round-trip
    # Search-R1 and FlashRAG send the whole batch in one request; SkyRL's format allows one query.
    assert client.stats["requests"] == (len(QUERIES) if protocol == "skyrl" else 1)
    assert client.fingerprint == backend.fingerprint  # read from the server's /health
    assert HTTPBackend(toy_server.url, fingerprint="pinned").fingerprint == "pinned"


def test_full_endpoint_url_is_accepted(toy_server):
    client = HTTPBackend(toy_server.url + "/retrieve", token=TOKEN)
    assert client.endpoint == "/retrieve" and client.search(["rivers"], 1)[0]


def test_4xx_is_never_retried(toy_server):
    client = fast_client(toy_server.url, token=TOKEN)
    with pytest.raises(BadSearchRequest, match="HTTP 422.*between 1 and 100"):
        client.search(["rivers"], 1000)
    assert client.stats["requests"] == 1 and client.stats["retries"] == 0
    no_token = fast_client(toy_server.url)
    with pytest.raises(BadSearchRequest, match="HTTP 401"):
        no_token.search(["rivers"], 1)
    assert no_token.stats["requests"] == 1


def test_server_killed_mid_run_gives_unavailable_and_the_cache_still_replays(
    toy_bm25, toy_index_dir, tmp_path
):
    with ServerProcess(toy_index_dir) as victim:
        client = fast_client(victim.url)
        recorder = CachedBackend(client, tmp_path / "snap.sqlite", mode="read_write")
        recorded = recorder.search(QUERIES, 3)
        assert recorder.fingerprint == toy_bm25.fingerprint
        recorder.close()
        victim.stop()
        before = client.stats["requests"]
        t = time.monotonic()
        with pytest.raises(SearchUnavailable, match="3 attempt"):
            client.search(["rivers"], 2)
        assert client.stats["requests"] - before == client.attempts == 3
        assert time.monotonic() - t <= client.deadline_s
    # The snapshot answers with the server gone and no backend at all.
    replay = CachedBackend(None, tmp_path / "snap.sqlite", mode="replay")
    assert replay.fingerprint == toy_bm25.fingerprint
    assert replay.search(QUERIES, 3) == recorded


def test_refused_connection_is_unavailable(tmp_path):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    client = fast_client(f"http://127.0.0.1:{port}", max_retries=1)
    with pytest.raises(SearchUnavailable):
        client.search(["q"], 1)
    assert client.stats["requests"] == 2


class _SilentServer:
    """Accepts TCP connections, reads the request, never answers: the slowest possible server."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(16)
        self.url = f"http://127.0.0.1:{self.sock.getsockname()[1]}"
        self.conns: list[socket.socket] = []
        self.accepted = 0
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            self.accepted += 1
            self.conns.append(conn)

    def close(self):
        self.sock.close()
        for c in self.conns:
            c.close()


def test_slow_server_gives_timeout_within_the_deadline():
    silent = _SilentServer()
    try:
        client = fast_client(silent.url, read_timeout=0.3, max_retries=1)
        t = time.monotonic()
        with pytest.raises(SearchTimeout, match="2 attempt"):
            client.search(["q"], 1)
        elapsed = time.monotonic() - t
        assert 0.6 <= elapsed <= client.deadline_s  # two full read timeouts, never more than the deadline
        assert client.stats["requests"] == 2
    finally:
        silent.close()


def _flaky_server(failures: int, status: int = 503):
    """A real HTTP server answering `status` `failures` times, then a valid Search-R1 response."""
    state = {"posts": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            state["posts"] += 1
            if state["posts"] <= failures:
                self.send_response(status)
                self.end_headers()
                self.wfile.write(b"overloaded")
                return
            doc = {"id": "d1", "contents": '"T"\nbody'}
            payload = json.dumps(
                {"result": [[{"document": doc, "score": 1.5}] for _ in body["queries"]]}
            ).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}", state


def test_5xx_is_retried_with_backoff_then_succeeds():
    httpd, url, state = _flaky_server(failures=2)
    try:
        client = fast_client(url, max_retries=3)
        hits = client.search(["a", "b"], 1)
        assert [[(h.doc_id, h.title, h.text, h.score) for h in row] for row in hits] == [
            [("d1", "T", "body", 1.5)]
        ] * 2
        assert state["posts"] == 3 and client.stats["retries"] == 2
    finally:
        httpd.shutdown()
    httpd, url, state = _flaky_server(failures=100, status=500)
    try:
        client = fast_client(url, max_retries=2)
        with pytest.raises(SearchUnavailable, match="HTTP 500"):
            client.search(["a"], 1)
        assert state["posts"] == 3
    finally:
        httpd.shutdown()


def test_backoff_grows_exponentially_with_bounded_jitter():
    client = HTTPBackend("http://127.0.0.1:9", backoff_base=0.1, backoff_max=0.5, max_retries=5, seed=1)
    for retry, cap in enumerate([0.1, 0.2, 0.4, 0.5, 0.5]):
        waits = [client._backoff(retry) for _ in range(50)]
        assert all(cap / 2 <= w <= cap for w in waits) and len(set(waits)) > 1


def test_bad_client_settings_are_rejected():
    with pytest.raises(ValueError, match="unknown protocol"):
        HTTPBackend("http://127.0.0.1:1", protocol="grpc")
    with pytest.raises(ValueError, match="must look like http"):
        HTTPBackend("127.0.0.1:8000")


def _fixed_answer_server(payload: bytes):
    """A real HTTP server that answers every POST with the same 200 body."""
    state = {"posts": 0}

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args):
            pass

        def do_POST(self):
            self.rfile.read(int(self.headers["Content-Length"]))
            state["posts"] += 1
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(payload)))
            self.end_headers()
            self.wfile.write(payload)

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()
    return httpd, f"http://127.0.0.1:{httpd.server_address[1]}", state


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        (b'{"foo": 1}', "expected an object with 'result'"),
        (b'{"result": [[]]}', "sent 2 queries but got 1 result lists"),
        (b'{"result": [["not a doc"], []]}', "expected a document object"),
        (b"not json", "not JSON"),
    ],
)
def test_malformed_answers_are_unavailable_and_not_retried(payload, message):
    httpd, url, state = _fixed_answer_server(payload)
    try:
        client = fast_client(url)
        with pytest.raises(SearchUnavailable, match=message):
            client.search(["a", "b"], 1)
        assert state["posts"] == 1
    finally:
        httpd.shutdown()
