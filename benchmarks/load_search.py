"""Bounded loopback load on the search service: N concurrent clients for S seconds, latency percentiles.

What: starts `searchrl serve` on a synthetic corpus (or uses `--url`), then runs `--clients` threads,
each with its own keep-alive HTTP connection, posting Search-R1 `/retrieve` requests of `--batch`
queries back to back for `--seconds`. Meanwhile a probe hits `/health` every 0.5 s, to show the
service keeps answering under load. Reports requests/s, queries/s, p50/p90/p99/max latency, errors by
kind and the slowest health probe, as JSON (`--json OUT`) and on stdout.

Why: the trainer's deadline is per search batch; the latency tail under concurrency is what decides
whether rollouts hit it. The load is bounded (time and clients) and loopback only.

    .venv/bin/python benchmarks/load_search.py --clients 64 --seconds 30 --json load.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
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


def start_server(workdir: Path, token: str | None, workers: int) -> tuple[subprocess.Popen, str, list[str]]:
    """Synthetic corpus -> BM25 index -> `python -m searchrl.search.server` on a free loopback port."""
    sys.path.insert(0, str(ROOT))
    from searchrl.common.io import write_jsonl
    from searchrl.data.synthetic import generate, preset_config
    from searchrl.search.index import build_index

    task = generate(preset_config("small", seed=0))
    write_jsonl(workdir / "corpus.jsonl", task.corpus)
    build_index(workdir / "corpus.jsonl", workdir / "index", overwrite=True)
    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    if token:
        env["SEARCHRL_SERVE_TOKEN"] = token
    cmd = [sys.executable, "-m", "searchrl.search.server", "--index", str(workdir / "index")]
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
    queries = [row["question"] for split in task.splits.values() for row in split]
    return proc, url, queries


def run_load(
    url: str, queries: list[str], clients: int, seconds: float, batch: int, k: int, token: str | None
) -> dict:
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    # Connections are made before the clock starts (an httpx client builds an SSL context, tens of
    # ms each): the measured window is load only, and every client starts at the same moment.
    https = [httpx.Client(base_url=url, headers=headers, timeout=30.0) for _ in range(clients + 1)]
    ready = threading.Barrier(clients + 2)
    stop_at = float("inf")
    latencies: list[list[float]] = [[] for _ in range(clients)]
    errors: list[dict[str, int]] = [{} for _ in range(clients)]
    health: list[float] = []

    def client(i: int) -> None:
        rng = random.Random(i)
        with https[i] as http:
            ready.wait()
            while time.monotonic() < stop_at:
                body = {"queries": rng.sample(queries, batch), "topk": k, "return_scores": True}
                t0 = time.perf_counter()
                try:
                    r = http.post("/retrieve", json=body)
                    kind = None if r.status_code == 200 else f"http_{r.status_code}"
                    if kind is None and len(r.json()["result"]) != batch:
                        kind = "wrong_shape"
                except httpx.HTTPError as e:
                    kind = type(e).__name__
                latencies[i].append((time.perf_counter() - t0) * 1000.0)
                if kind:
                    errors[i][kind] = errors[i].get(kind, 0) + 1

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
        "clients_finished": sum(1 for t in threads if not t.is_alive()),
    }


def main(argv: list[str] | None = None) -> dict:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--url", help="an already running service (default: start one on a synthetic corpus)")
    p.add_argument("--clients", type=int, default=64, help="concurrent clients (threads)")
    p.add_argument("--seconds", type=float, default=30.0, help="how long the load runs")
    p.add_argument("--batch", type=int, default=4, help="queries per request")
    p.add_argument("--k", type=int, default=3, help="topk per query")
    p.add_argument("--workers", type=int, default=1, help="uvicorn workers of the started server")
    p.add_argument("--token", default=None, help="bearer token (also given to the started server)")
    p.add_argument("--json", type=Path, default=None, help="write the report here")
    a = p.parse_args(argv)
    if a.clients < 1 or a.seconds <= 0 or a.batch < 1:
        p.error("--clients and --batch must be >= 1 and --seconds > 0")
    proc = None
    with tempfile.TemporaryDirectory(prefix="searchrl-load-") as tmp:
        try:
            if a.url:
                url, queries = a.url, [f"query number {i}" for i in range(1000)]
            else:
                proc, url, queries = start_server(Path(tmp), a.token, a.workers)
            report = run_load(url, queries, a.clients, a.seconds, a.batch, a.k, a.token)
            report["workers"] = a.workers if proc else None
        finally:
            if proc is not None:
                proc.kill()
                proc.wait(timeout=10)
    text = json.dumps(report, indent=2)
    print(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")
    return report


if __name__ == "__main__":
    main()
