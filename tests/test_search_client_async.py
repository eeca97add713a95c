"""The async HTTP client against a real `searchrl.search.server` subprocess (two uvicorn workers).

Checks what the sync client's tests check, through `asearch`: the same hits as the index, a 4xx never
retried, a refused connection and a silent server turned into typed errors within the deadline, and
the concurrency limit really bounding the requests on the wire. And the several-workers deployment
itself: `--workers 2` runs two worker processes, both answer requests, and when one is killed the other
keeps answering while uvicorn's supervisor starts a replacement.
"""

from __future__ import annotations

import asyncio
import socket
import subprocess
import threading
import time

import pytest
from support.search import ServerProcess

from searchrl.search.base import BadSearchRequest, SearchTimeout, SearchUnavailable
from searchrl.search.client import AsyncHTTPBackend


class PoolServer(ServerProcess):
    """A `--workers N` server: SIGTERM first, so uvicorn's supervisor stops its worker processes too
    (SIGKILL on the supervisor alone would leave the workers running)."""

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                super().stop()


TOKEN = "async-token"
QUERIES = ["capital of Veland", "rivers bridges", "Glass Harbor", "zzz nothing", "Quell Systems"]


@pytest.fixture(scope="module")
def server(toy_index_dir):
    with PoolServer(toy_index_dir, token=TOKEN, extra=["--workers", "2"]) as s:
        yield s


def fast(url: str, **kw) -> AsyncHTTPBackend:
    opts = {"connect_timeout": 0.5, "read_timeout": 1.0, "max_retries": 2, "backoff_base": 0.05, "seed": 0}
    return AsyncHTTPBackend(url, **{**opts, **kw})


def as_tuples(results):
    return [[(h.doc_id, h.title, h.text, h.score) for h in hits] for hits in results]


@pytest.mark.parametrize("protocol", ["search_r1", "flashrag", "skyrl"])
def test_concurrent_batches_return_what_the_index_returns_within_the_limit(toy_bm25, server, protocol):
    backend = toy_bm25
    client = AsyncHTTPBackend(
        server.url, protocol=protocol, token=TOKEN, max_concurrency=3, read_timeout=10.0
    )
    batches = [QUERIES[i % 5 :] + QUERIES[: i % 5] for i in range(12)]

    async def go():
        try:
            return await client.asearch_many(batches, 2)
        finally:
            await client.aclose()

    got = asyncio.run(go())
    assert [as_tuples(g) for g in got] == [as_tuples(backend.search(b, 2)) for b in batches]
    per_batch = len(QUERIES) if protocol == "skyrl" else 1
    assert client.stats["requests"] == 12 * per_batch and client.stats["retries"] == 0
    # gather() starts every batch at once: the semaphore is what keeps the wire at 3.
    assert client.stats["max_in_flight"] == 3


def test_sync_search_still_works_on_the_async_client(toy_bm25, server):
    client = AsyncHTTPBackend(server.url, token=TOKEN)
    assert as_tuples(client.search(QUERIES, 3)) == as_tuples(toy_bm25.search(QUERIES, 3))
    assert asyncio.run(client.asearch([], 3)) == []


def test_4xx_is_never_retried(server):
    client = fast(server.url, token=TOKEN)
    with pytest.raises(BadSearchRequest, match="HTTP 422"):
        asyncio.run(client.asearch(["rivers"], 1000))
    assert client.stats["requests"] == 1 and client.stats["retries"] == 0
    no_token = fast(server.url)
    with pytest.raises(BadSearchRequest, match="HTTP 401"):
        asyncio.run(no_token.asearch(["rivers"], 1))
    assert no_token.stats["requests"] == 1
    with pytest.raises(BadSearchRequest, match="k must be >= 1"):
        asyncio.run(client.asearch(["rivers"], 0))


def test_refused_connection_is_retried_then_unavailable():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed when the block ends: nothing listens there
    client = fast(f"http://127.0.0.1:{port}", max_retries=2)
    t = time.monotonic()
    with pytest.raises(SearchUnavailable, match="3 attempt"):
        asyncio.run(client.asearch(["q"], 1))
    assert client.stats["requests"] == 3 and client.stats["retries"] == 2
    assert time.monotonic() - t <= client.deadline_s


def test_silent_server_times_out_within_the_deadline():
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    sock.listen(16)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept_and_never_answer():
        sock.settimeout(0.1)
        while not stop.is_set():
            try:
                held.append(sock.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept_and_never_answer, daemon=True)
    thread.start()
    try:
        client = fast(f"http://127.0.0.1:{sock.getsockname()[1]}", read_timeout=0.3, max_retries=1)
        t = time.monotonic()
        with pytest.raises(SearchTimeout, match="2 attempt"):
            asyncio.run(client.asearch(["q"], 1))
        assert time.monotonic() - t <= client.deadline_s
        assert client.stats["requests"] == 2
    finally:
        stop.set()
        thread.join(timeout=2)
        for c in held:
            c.close()
        sock.close()


@pytest.mark.parametrize("bad", [0, -1, 2.5])
def test_bad_concurrency_limit_is_rejected_with_a_clear_error(bad):
    with pytest.raises(ValueError, match="max_concurrency must be an int >= 1"):
        AsyncHTTPBackend("http://127.0.0.1:1", max_concurrency=bad)


def _workers(server: ServerProcess, n: int, timeout: float = 30.0) -> list:
    """The supervisor's live worker processes, once there are `n` of them."""
    import psutil

    supervisor = psutil.Process(server.proc.pid)
    deadline = time.monotonic() + timeout
    while True:
        live = [
            c
            for c in supervisor.children()
            if c.is_running()
            and c.status() != psutil.STATUS_ZOMBIE
            and "resource_tracker" not in " ".join(c.cmdline())
        ]
        if len(live) == n or time.monotonic() > deadline:
            return live
        time.sleep(0.1)


def test_two_workers_share_the_load_and_the_service_outlives_one_of_them(toy_bm25, toy_index_dir):
    from searchrl.search.client import HTTPBackend

    # Its own server: this test kills a worker.
    backend, index_dir = toy_bm25, toy_index_dir
    with PoolServer(index_dir, token=TOKEN, extra=["--workers", "2"]) as s:
        workers = _workers(s, 2)
        assert len(workers) == 2, "searchrl serve --workers 2 should run two worker processes"
        # Clients that each keep their connection open: the worker holding a connection's server end is
        # the one that answered it. The kernel hands new connections to whichever worker accepts first.
        clients, served_by = [], set()
        try:
            for _ in range(64):
                client = HTTPBackend(s.url, token=TOKEN, read_timeout=10.0)
                clients.append(client)
                assert as_tuples(client.search(QUERIES, 2)) == as_tuples(backend.search(QUERIES, 2))
                for w in workers:
                    if any(c.laddr and c.laddr.port == s.port and c.raddr for c in w.net_connections("tcp")):
                        served_by.add(w.pid)
                if len(served_by) == 2:
                    break
        finally:
            for client in clients:
                client.close()
        assert served_by == {w.pid for w in workers}, "every request went to one worker"
        # A worker dies: the other keeps answering (the client retries a dropped connection), and the
        # supervisor starts a replacement.
        workers[0].kill()
        client = HTTPBackend(s.url, token=TOKEN, read_timeout=10.0, max_retries=3, backoff_base=0.05)
        try:
            for _ in range(5):
                assert as_tuples(client.search(QUERIES, 2)) == as_tuples(backend.search(QUERIES, 2))
        finally:
            client.close()
        again = _workers(s, 2)
        assert len(again) == 2 and workers[0].pid not in {w.pid for w in again}
