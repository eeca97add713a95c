"""`searchrl serve --workers N`: every worker opens the same index and answers; /health says which worker answered
and its resident memory; a worker killed mid-run is replaced while the others serve, and the retrying client sees
no error."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path

import httpx
import psutil
from support.search import ServerProcess

from searchrl.search.client import HTTPBackend


def _answering_pids(url: str, tries: int = 200) -> set[int]:
    pids: set[int] = set()
    for _ in range(tries):
        # A new connection each time: the kernel hands it to whichever worker accepts first.
        pids.add(httpx.get(url + "/health", timeout=5).json()["pid"])
        if len(pids) >= 2:
            break
    return pids


def _worker_pids(server_pid: int) -> list[int]:
    """uvicorn's worker processes (spawned by multiprocessing; not its resource tracker, also a child)."""
    pids = []
    for child in psutil.Process(server_pid).children():
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


def _wait_workers(server: ServerProcess, n: int, timeout: float = 90.0) -> list[int]:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        pids = _worker_pids(server.proc.pid)
        if len(pids) >= n:
            return pids
        time.sleep(0.1)
    raise AssertionError(f"fewer than {n} workers after {timeout} s")


def test_two_workers_share_the_index_and_survive_a_killed_worker(toy_index_dir: Path) -> None:
    with ServerProcess(toy_index_dir, extra=["--workers", "2"]) as server:
        workers = _wait_workers(server, 2)
        deadline = time.monotonic() + 60
        pids: set[int] = set()
        while time.monotonic() < deadline and pids != set(workers):
            pids |= _answering_pids(server.url, 20)
        assert pids == set(workers), (pids, workers)  # both workers opened the index and answer
        health = httpx.get(server.url + "/health").json()
        assert health["memory"]["rss_mb"] > 0 and "rss_file_mb" in health["memory"]

        client = HTTPBackend(server.url, max_retries=8, backoff_base=0.05, seed=0)
        errors: list[BaseException] = []
        answered = [0]
        stop = threading.Event()

        def load() -> None:
            while not stop.is_set():
                try:
                    assert client.search(["Varnel Oskar born"], 2)[0][0].doc_id == "p1"
                    answered[0] += 1
                except BaseException as e:  # noqa: BLE001 - any failure is the test's failure
                    errors.append(e)

        thread = threading.Thread(target=load)
        thread.start()
        time.sleep(0.5)
        os.kill(workers[0], signal.SIGKILL)
        before = answered[0]
        time.sleep(1.5)
        assert answered[0] > before  # the other worker kept serving
        replaced = set(_wait_workers(server, 2)) - {workers[0]}
        stop.set()
        thread.join(timeout=30)
        assert not errors, errors[:3]
        assert len(replaced) == 2  # uvicorn started a new worker in place of the killed one
