"""Bounded loopback load on the search service: N concurrent clients for S seconds, latency percentiles.

What: starts `searchrl serve` on a synthetic corpus or on `--index DIR` (or uses `--url`), then runs
`--clients` threads, each with its own keep-alive HTTP connection, posting Search-R1 `/retrieve` requests of
`--batch` queries back to back for `--seconds`. Meanwhile a probe hits `/health` every 0.5 s, to show the
service keeps answering under load, and the server's worker processes are sampled for their resident memory.
With `--kill-worker-after S` one worker is killed (SIGKILL) S seconds in: the others keep serving, uvicorn
starts a new one, and with `--client retrying` (searchrl's `HTTPBackend`: retries with backoff) the clients
see no error. Reports requests/s, queries/s, p50/p90/p99/max latency, errors by kind, retries, the slowest
health probe and each worker's peak RSS, as JSON (`--json OUT`) and on stdout.

Why: the trainer's deadline is per search batch; the latency tail under concurrency is what decides
whether rollouts hit it. The load is bounded (time and clients) and loopback only.

    .venv/bin/python benchmarks/load_search.py --clients 64 --seconds 30 --json load.json
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parents[1]


def percentile(values: list[float], q: float) -> float:
    if not values:
        return 0.0
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100.0
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def synthetic_index(workdir: Path) -> tuple[Path, list[str]]:
    """The synthetic task's corpus as a BM25 index, and its questions as queries."""
    sys.path.insert(0, str(ROOT))
    from searchrl.common.io import write_jsonl
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.search.index import build_index

    task = generate(preset_config("small", seed=0))
    write_jsonl(workdir / "corpus.jsonl", task.corpus)
    build_index(workdir / "corpus.jsonl", workdir / "index", overwrite=True)
    return workdir / "index", [row["question"] for split in task.splits.values() for row in split]


def scale_index(workdir: Path, size: int) -> tuple[Path, list[str]]:
    """`bench_scale.py`'s Wikipedia-like corpus of `size` passages as a BM25 index, and its real questions."""
    sys.path.insert(0, str(ROOT))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from bench_scale import REALQA, generate_corpus

    from searchrl.search.index import build_index

    queries = generate_corpus(workdir / "corpus.jsonl", size, REALQA)
    build_index(workdir / "corpus.jsonl", workdir / "index", overwrite=True)
    (workdir / "corpus.jsonl").unlink()
    return workdir / "index", queries


def start_server(
    index: Path, token: str | None, workers: int, extra_env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, str]:
    """`python -m searchrl.search.server` on `index`, on a free loopback port, once /health answers."""
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), **(extra_env or {})}
    if token:
        env["SEARCHRL_SERVE_TOKEN"] = token
    cmd = [sys.executable, "-m", "searchrl.search.server", "--index", str(index)]
    cmd += ["--port", str(port), "--workers", str(workers)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stderr=subprocess.PIPE)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited: {proc.stderr.read().decode()[-2000:]}")
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.HTTPError:
            time.sleep(0.2)
    # Every worker answers only once it has loaded the index; give the others the same time.
    if workers > 1:
        wait_for_workers(proc, workers, deadline)
    return proc, url


def wait_for_workers(proc: subprocess.Popen, workers: int, deadline: float) -> None:
    while time.monotonic() < deadline and len(worker_pids(proc.pid)) < workers:
        time.sleep(0.2)
    time.sleep(min(30.0, 3.0 * workers))  # each opens the index and runs its warm-up search


def stop_server(proc: subprocess.Popen) -> None:
    """Stop the server and its workers (killing only the supervisor would leave the workers running)."""
    import psutil

    try:
        children = [c.pid for c in psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        children = []
    proc.terminate()
    try:
        proc.wait(timeout=15)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(timeout=10)
    for pid in children:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def worker_pids(server_pid: int) -> list[int]:
    import psutil

    """uvicorn's worker processes (spawned by multiprocessing; not its resource tracker, also a child)."""
    pids = []
    try:
        children = psutil.Process(server_pid).children()
    except psutil.NoSuchProcess:
        return []
    for child in children:
        try:
            if "spawn_main" in " ".join(child.cmdline()):
                pids.append(child.pid)
        except psutil.NoSuchProcess:
            continue
    return pids


class MemorySampler:
    """Peak RSS of each process under `server_pid` (the supervisor and its workers), sampled every second."""

    def __init__(self, server_pid: int | None):
        self.server_pid = server_pid
        self.peak: dict[int, dict[str, float]] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        import psutil

        while not self._stop.is_set() and self.server_pid is not None:
            for pid in [self.server_pid, *worker_pids(self.server_pid)]:
                try:
                    info = psutil.Process(pid).memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                now = {
                    "rss_mb": info.rss / 2**20,
                    "uss_mb": info.uss / 2**20,
                    "shared_mb": info.shared / 2**20,
                }
                old = self.peak.setdefault(pid, now)
                for key, value in now.items():
                    old[key] = round(max(old[key], value), 1)
            self._stop.wait(1.0)

    def __enter__(self) -> MemorySampler:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join(timeout=10)


def _raw_call(http: httpx.Client, body: dict, batch: int) -> str | None:
    try:
        r = http.post("/retrieve", json=body)
        kind = None if r.status_code == 200 else f"http_{r.status_code}"
        if kind is None and len(r.json()["result"]) != batch:
            kind = "wrong_shape"
        return kind
    except httpx.HTTPError as e:
        return type(e).__name__


def run_load(
    url: str,
    queries: list[str],
    clients: int,
    seconds: float,
    batch: int,
    k: int,
    token: str | None,
    client_kind: str = "raw",
    kill_worker_after: float | None = None,
    server_pid: int | None = None,
) -> dict:
    sys.path.insert(0, str(ROOT))
    from searchrl.search.base import SearchError
    from searchrl.search.client import HTTPBackend

    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # Connections are made before the clock starts (an httpx client builds an SSL context, tens of
    # ms each): the measured window is load only, and every client starts at the same moment.
    https = [httpx.Client(base_url=url, headers=headers, timeout=30.0) for _ in range(clients + 1)]
    retrying = [
        HTTPBackend(url, token=token, read_timeout=30.0, max_retries=5, seed=i)
        if client_kind == "retrying"
        else None
        for i in range(clients)
    ]
    ready = threading.Barrier(clients + 2)
    stop_at = float("inf")
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[dict[str, int]] = [{} for _ in range(clients)]
    health: list[float] = []
    killed: dict[str, object] = {}

    def client(i: int) -> None:
        rng = random.Random(i)
        with https[i] as http:
            ready.wait()
            while time.monotonic() < stop_at:
                picked = rng.sample(queries, batch)
                t0 = time.perf_counter()
                if retrying[i] is not None:
                    try:
                        hits = retrying[i].search(picked, k)
                        kind = None if len(hits) == batch else "wrong_shape"
                    except SearchError as e:
                        kind = type(e).__name__
                else:
                    kind = _raw_call(http, {"queries": picked, "topk": k, "return_scores": True}, batch)
                latencies[i].append((time.perf_counter() - t0) * 1000.0)
                if kind:
                    errors[i][kind] = errors[i].get(kind, 0) + 1

    def killer() -> None:
        ready.wait()
        time.sleep(kill_worker_after or 0.0)
        pids = worker_pids(server_pid) if server_pid else []
        if pids:
            os.kill(pids[0], signal.SIGKILL)
            killed.update(pid=pids[0], at_s=kill_worker_after)

    def probe() -> None:
        with https[clients] as http:
            ready.wait()
            while time.monotonic() < stop_at:
                t0 = time.perf_counter()
                try:
                    ok = http.get("/health").status_code == 200
                except httpx.HTTPError:
                    ok = False
                health.append((time.perf_counter() - t0) * 1000.0 if ok else float("inf"))
                time.sleep(0.5)

    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
    threads.append(threading.Thread(target=probe, daemon=True))
    if kill_worker_after is not None:
        ready = threading.Barrier(clients + 3)
        threads.append(threading.Thread(target=killer, daemon=True))
    for t in threads:
        t.start()
    stop_at = time.monotonic() + seconds  # read by the threads only after the barrier
    started = time.perf_counter()
    ready.wait()
    for t in threads:
        t.join(timeout=seconds + 60)
    wall = time.perf_counter() - started
    lat = [x for per in latencies for x in per]
    errs: dict[str, int] = {}
    for per in errors:
        for kind, n in per.items():
            errs[kind] = errs.get(kind, 0) + n
    return {
        "clients": clients,
        "seconds": seconds,
        "batch": batch,
        "k": k,
        "requests": len(lat),
        "errors": errs,
        "error_count": sum(errs.values()),
        "requests_per_s": len(lat) / wall,
        "queries_per_s": len(lat) * batch / wall,
        "latency_ms": {
            "p50": percentile(lat, 50),
            "p90": percentile(lat, 90),
            "p99": percentile(lat, 99),
            "max": max(lat) if lat else 0.0,
        },
        "health_probes": len(health),
        "health_max_ms": max(health) if health else None,
        "clients_finished": sum(1 for t in threads[:clients] if not t.is_alive()),
        "probe_finished": not threads[
            clients
        ].is_alive(),  # the /health probe thread, right after the clients
        "client": client_kind,
        "retries": sum(int(r.stats["retries"]) for r in retrying if r is not None),
        "killed_worker": killed or None,
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an already running service (default: start one on a synthetic corpus)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (threads)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the load runs")
    p.add_argument("--batch", type=int, default=4, help="queries per request")
    p.add_argument("--k", type=int, default=3, help="topk per query")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of the started server")
    p.add_argument("--index", type=Path, default=None, help="serve this index (default: a synthetic one)")
    p.add_argument("--queries", type=Path, default=None, help="queries, one per line (with --index or --url)")
    p.add_argument(
        "--index-size", type=int, default=None, help="serve bench_scale.py's corpus of this many passages"
    )
    p.add_argument(
        "--client", choices=("raw", "retrying"), default="raw", help="raw httpx, or HTTPBackend with retries"
    )
    p.add_argument("--kill-worker-after", type=float, default=None, help="SIGKILL one worker after S seconds")
    p.add_argument(
        "--docs-in-memory-mb", type=float, default=None, help="the started server's document store threshold"
    )
    p.add_argument("--token", default=None, help="bearer token (also given to the started server)")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    a = p.parse_args(argv)
    if a.clients < 1 or a.seconds <= 0 or a.batch < 1:
        p.error("--clients and --batch must be >= 1 and --seconds > 0")
    proc = None
    extra_env = (
        {} if a.docs_in_memory_mb is None else {"SEARCHRL_DOCS_IN_MEMORY_MB": str(a.docs_in_memory_mb)}
    )
    with tempfile.TemporaryDirectory(prefix="searchrl-load-") as tmp:
        try:
            queries = [f"query number {i}" for i in range(1000)]
            if a.queries:
                queries = [q for q in a.queries.read_text().splitlines() if q.strip()]
            if a.url:
                url = a.url
            else:
                index = a.index
                if index is None and a.index_size:
                    index, queries = scale_index(Path(tmp), a.index_size)
                elif index is None:
                    index, queries = synthetic_index(Path(tmp))
                proc, url = start_server(index, a.token, a.workers, extra_env)
            with MemorySampler(proc.pid if proc else None) as memory:
                report = run_load(
                    url,
                    queries,
                    a.clients,
                    a.seconds,
                    a.batch,
                    a.k,
                    a.token,
                    a.client,
                    a.kill_worker_after,
                    proc.pid if proc else None,
                )
            report["workers"] = a.workers if proc else None
            report["memory_peak_by_pid"] = {str(pid): m for pid, m in memory.peak.items()}
        finally:
            if proc is not None:
                stop_server(proc)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
