"""Sync vs async search client against one `searchrl serve` process pool (loopback, bounded, ~30 s).

What: builds a BM25 index over the synthetic "small" corpus, starts the server with `--workers W`, and
sends the same `--batches` batches of `--batch` questions three ways: the sync `HTTPBackend` one batch
after another, and `AsyncHTTPBackend.asearch_many` with concurrency limits 1 and `--concurrency`.
Reports batches/s for each and checks that every way returned the same hits.

Why: with the service on its own host, a rollout loop that keeps several batches in flight hides the
network round trip; this measures how much that buys on this machine (a loopback figure: on a real
network the gain from overlap is larger, since each request waits longer on the wire).

    .venv/bin/python benchmarks/bench_async_search.py --workers 2 --concurrency 8 --json async.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))

from support.search import ServerProcess  # noqa: E402

from searchrl.common.io import write_jsonl  # noqa: E402
from searchrl.data.synthetic import generate, preset_config  # noqa: E402
from searchrl.search.client import AsyncHTTPBackend, HTTPBackend  # noqa: E402
from searchrl.search.index import build_index  # noqa: E402


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


def hits_key(results):
    return [[[h.doc_id for h in hits] for hits in batch] for batch in results]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--workers", type=int, default=2, help="uvicorn worker processes of the server")
    ap.add_argument("--concurrency", type=int, default=8, help="async client's max requests in flight")
    ap.add_argument("--batches", type=int, default=200, help="search batches to send each way")
    ap.add_argument("--batch", type=int, default=8, help="questions per batch")
    ap.add_argument("--topk", type=int, default=3, help="hits per question")
    ap.add_argument("--json", type=Path, default=None, help="write the figures here as JSON")
    a = ap.parse_args()

    task = generate(preset_config("small", seed=0))
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus.jsonl"
        write_jsonl(corpus, task.corpus)
        build_index(corpus, Path(tmp) / "index")
        questions = [r["question"] for r in task.splits["train"]]
        batches = [
            [questions[(i * a.batch + j) % len(questions)] for j in range(a.batch)] for i in range(a.batches)
        ]
        with PoolServer(Path(tmp) / "index", extra=["--workers", str(a.workers)]) as server:
            sync = HTTPBackend(server.url, read_timeout=30.0)
            sync.search(batches[0], a.topk)  # warm-up: JIT and keep-alive connection
            t = time.perf_counter()
            want = [sync.search(b, a.topk) for b in batches]
            figures = {"sync_batches_per_s": a.batches / (time.perf_counter() - t)}
            for limit in sorted({1, a.concurrency}):
                client = AsyncHTTPBackend(server.url, max_concurrency=limit, read_timeout=30.0)

                async def run(client=client):
                    try:
                        await client.asearch(batches[0], a.topk)
                        start = time.perf_counter()
                        got = await client.asearch_many(batches, a.topk)
                        return got, time.perf_counter() - start
                    finally:
                        await client.aclose()

                got, seconds = asyncio.run(run())
                if hits_key(got) != hits_key(want):
                    raise SystemExit(f"async (limit {limit}) returned other hits than the sync client")
                figures[f"async_limit_{limit}_batches_per_s"] = a.batches / seconds
                figures[f"async_limit_{limit}_max_in_flight"] = client.stats["max_in_flight"]
    out = {"workers": a.workers, "batches": a.batches, "batch": a.batch, **figures}
    print(json.dumps(out, indent=2))
    if a.json:
        a.json.write_text(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
