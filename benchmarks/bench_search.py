"""Search side by side: our BM25 wrapper vs raw bm25s vs rank-bm25, and HTTP vs in-process.

Generates its own synthetic corpus (fictional words with a Zipf distribution, so term statistics look
like text), builds a searchrl BM25 index, and measures in one run:

* ``wrapper_vs_bm25s``: our `BM25Backend.search` QPS / raw bm25s (same tokenizer, `retrieve` with the
  numba backend) QPS, same queries and batches (target >= 0.9);
* ``vs_rank_bm25``: our QPS / rank-bm25 `BM25Okapi` QPS, the latter timed on a small query sample
  because it scans every document in Python (target >= 100);
* ``http_batched_vs_inprocess``: QPS of 256-query requests to `searchrl serve` over loopback / the
  same batches in process (target >= 0.3);
* ``http_single_p50_ms`` / ``http_single_p99_ms``: one query per request (target p50 <= 2 ms).

Usage: ``python benchmarks/bench_search.py --json OUT [--docs 100000]``. Prints a table, writes JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from searchrl.search.client import HTTPBackend  # noqa: E402
from searchrl.search.index import build_index  # noqa: E402

SYLLABLES = [a + b for a in "bdfgklmnprstvz" for b in ("a", "e", "i", "o", "u", "ar", "en", "ol", "ux")]


def make_vocab(n: int, rng: np.random.Generator) -> list[str]:
    words: set[str] = set()
    while len(words) < n:
        words.add("".join(rng.choice(SYLLABLES, size=rng.integers(2, 4))))
    return sorted(words)


def make_corpus(n_docs: int, seed: int) -> tuple[list[dict], list[str]]:
    rng = np.random.default_rng(seed)
    vocab = np.array(make_vocab(30_000, rng))
    weights = 1.0 / np.arange(1, len(vocab) + 1) ** 1.05
    weights /= weights.sum()
    lengths = rng.integers(40, 121, size=n_docs)
    tokens = rng.choice(len(vocab), size=int(lengths.sum()), p=weights)
    rows, start = [], 0
    for i, n in enumerate(lengths.tolist()):
        words = vocab[tokens[start : start + n]]
        start += n
        rows.append({"id": f"doc{i}", "title": " ".join(words[:2]).title(), "contents": " ".join(words[2:])})
    # Queries: 3-6 mid-frequency words (ranks 100..5000), like an entity name plus a relation.
    mid = vocab[100:5000]
    queries = [" ".join(rng.choice(mid, size=rng.integers(3, 7))) for _ in range(1000)]
    return rows, queries


def per_batch_best(fns: dict, query_batches: list[list[str]], rounds: int) -> dict[str, float]:
    """Sum over batches of each method's best time on that batch, methods interleaved batch by batch.

    On a shared machine a preempted batch can take 10x longer; the per-batch minimum over rounds
    drops those spikes, and interleaving makes drifts in machine load hit every method alike.
    """
    best = {name: [float("inf")] * len(query_batches) for name in fns}
    for _ in range(rounds):
        for i, qb in enumerate(query_batches):
            for name, fn in fns.items():
                t = time.perf_counter()
                fn(qb)
                best[name][i] = min(best[name][i], time.perf_counter() - t)
    return {name: sum(times) for name, times in best.items()}


def batches(items: list[str], size: int) -> list[list[str]]:
    return [items[i : i + size] for i in range(0, len(items), size)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(index_dir: Path) -> tuple[subprocess.Popen, str]:
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "searchrl.search.server", "--index", str(index_dir), "--port", str(port)],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    url = f"http://127.0.0.1:{port}"
    import httpx

    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                return proc, url
        except httpx.HTTPError:
            time.sleep(0.2)
    proc.kill()
    raise RuntimeError("server did not come up within 60 s")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", required=True, help="write the results here")
    ap.add_argument("--docs", type=int, default=100_000, help="synthetic corpus size")
    ap.add_argument("--rank-bm25-queries", type=int, default=20, help="queries timed for rank-bm25")
    ap.add_argument("--single-requests", type=int, default=1000, help="one-query requests for p50/p99")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rounds", type=int, default=5, help="timing rounds (per-batch best is kept)")
    args = ap.parse_args()
    k = 10
    out: dict = {
        "docs": args.docs,
        "k": k,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpu",
        # Shared machines: record how busy the CPUs were, since latency figures depend on it.
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
    }

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        rows, queries = make_corpus(args.docs, args.seed)
        corpus_path = tmp / "corpus.jsonl"
        corpus_path.write_text("".join(json.dumps(r) + "\n" for r in rows))
        out["corpus_gen_s"] = round(time.perf_counter() - t, 2)

        t = time.perf_counter()
        backend = build_index(corpus_path, tmp / "index", backend="bm25")
        out["index_build_s"] = round(time.perf_counter() - t, 2)
        out["index_docs_per_s"] = round(args.docs / out["index_build_s"])

        # Raw bm25s: what a user would write by hand with the same index files and tokenizer.
        import bm25s

        from searchrl.search.bm25 import make_tokenizer

        raw = bm25s.BM25.load(str(tmp / "index" / "bm25"), mmap=True, load_vocab=True)
        raw.backend = "numba"
        tok = make_tokenizer(backend.params)
        tok.load_vocab(str(tmp / "index" / "bm25"))
        query_batches = batches(queries, 256)
        # bm25s returns documents when given the corpus; an object array of row dicts is its
        # fastest path (one fancy-indexing op). That is the like-for-like baseline: our wrapper
        # also returns each hit's id, title and text.
        corpus_array = np.empty(len(rows), dtype=object)
        corpus_array[:] = rows

        def raw_batch(qb: list[str]) -> None:
            ids = tok.tokenize(qb, update_vocab=False, return_as="ids", show_progress=False)
            raw.retrieve(ids, corpus=corpus_array, k=k, return_as="tuple", show_progress=False, n_threads=1)

        def raw_ids_batch(qb: list[str]) -> None:
            ids = tok.tokenize(qb, update_vocab=False, return_as="ids", show_progress=False)
            raw.retrieve(ids, k=k, return_as="tuple", show_progress=False, n_threads=1)

        def ours_batch(qb: list[str]) -> None:
            backend.search(qb, k)

        for qb in query_batches[:1]:  # JIT warm-up
            ours_batch(qb), raw_batch(qb)
        best = per_batch_best(
            {"raw": raw_batch, "raw_ids": raw_ids_batch, "ours": ours_batch}, query_batches, args.rounds
        )
        t_raw, t_raw_ids, t_ours = best["raw"], best["raw_ids"], best["ours"]
        out["bm25s_raw_qps"] = round(len(queries) / t_raw, 1)
        out["bm25s_raw_ids_only_qps"] = round(len(queries) / t_raw_ids, 1)
        out["ours_qps"] = round(len(queries) / t_ours, 1)
        out["wrapper_vs_bm25s"] = round(t_raw / t_ours, 3)
        out["wrapper_vs_bm25s_ids_only"] = round(t_raw_ids / t_ours, 3)

        # One query per call in process: the floor under the one-query HTTP latency below.
        lat = []
        for q in queries[:300]:
            t = time.perf_counter()
            backend.search([q], k)
            lat.append((time.perf_counter() - t) * 1000)
        out["inprocess_single_p50_ms"] = round(float(np.percentile(lat, 50)), 3)

        # rank-bm25 on the same tokens (as strings), timed on a sample of queries.
        from rank_bm25 import BM25Okapi

        t = time.perf_counter()
        corpus_tokens = tok.tokenize(
            [f"{r['title']}\n{r['contents']}" for r in rows],
            update_vocab=False,
            return_as="string",
            show_progress=False,
        )
        okapi = BM25Okapi(corpus_tokens, k1=backend.params.k1, b=backend.params.b)
        out["rank_bm25_build_s"] = round(time.perf_counter() - t, 2)
        sample = queries[: args.rank_bm25_queries]
        sample_tokens = tok.tokenize(sample, update_vocab=False, return_as="string", show_progress=False)
        t = time.perf_counter()
        for qt in sample_tokens:
            scores = okapi.get_scores(qt)
            np.argpartition(-scores, k)[:k]
        t_rank = time.perf_counter() - t
        out["rank_bm25_qps"] = round(len(sample) / t_rank, 2)
        out["rank_bm25_queries_timed"] = len(sample)
        out["vs_rank_bm25"] = round(out["ours_qps"] / out["rank_bm25_qps"], 1)
        del okapi, corpus_tokens

        # HTTP: the same 256-query batches over loopback, then one query per request.
        proc, url = start_server(tmp / "index")
        try:
            client = HTTPBackend(url, read_timeout=60)

            def http_batch(qb: list[str]) -> None:
                client.search(qb, k)

            http_batch(query_batches[0])
            best = per_batch_best({"http": http_batch, "ours": ours_batch}, query_batches, args.rounds)
            t_http, t_ours_again = best["http"], best["ours"]
            out["http_batched_qps"] = round(len(queries) / t_http, 1)
            out["http_batched_vs_inprocess"] = round(t_ours_again / t_http, 3)

            lat = []
            for i in range(args.single_requests):
                q = queries[i % len(queries)]
                t = time.perf_counter()
                client.search([q], k)
                lat.append((time.perf_counter() - t) * 1000)
            lat_arr = np.array(lat[50:])  # the first requests warm connections and caches
            out["http_single_p50_ms"] = round(float(np.percentile(lat_arr, 50)), 3)
            out["http_single_p99_ms"] = round(float(np.percentile(lat_arr, 99)), 3)
            client.close()
        finally:
            proc.terminate()
            proc.wait(timeout=10)

    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    targets = {
        "wrapper_vs_bm25s": (">=", 0.9),
        "vs_rank_bm25": (">=", 100),
        "http_batched_vs_inprocess": (">=", 0.3),
        "http_single_p50_ms": ("<=", 2.0),
    }
    out["targets"] = {key: f"{op} {v}" for key, (op, v) in targets.items()}
    out["targets_met"] = {
        key: (out[key] >= v if op == ">=" else out[key] <= v) for key, (op, v) in targets.items()
    }
    rows_out = [
        ("index build (s)", out["index_build_s"], ""),
        ("raw bm25s QPS (with documents)", out["bm25s_raw_qps"], ""),
        ("raw bm25s QPS (ids only)", out["bm25s_raw_ids_only_qps"], ""),
        ("searchrl BM25 QPS", out["ours_qps"], ""),
        ("rank-bm25 QPS", out["rank_bm25_qps"], f"({len(sample)} queries)"),
        ("HTTP batched QPS (256/req)", out["http_batched_qps"], ""),
        ("wrapper_vs_bm25s", out["wrapper_vs_bm25s"], ">= 0.9"),
        ("wrapper_vs_bm25s_ids_only", out["wrapper_vs_bm25s_ids_only"], ""),
        ("vs_rank_bm25", out["vs_rank_bm25"], ">= 100"),
        ("http_batched_vs_inprocess", out["http_batched_vs_inprocess"], ">= 0.3"),
        ("in-process single query p50 (ms)", out["inprocess_single_p50_ms"], ""),
        ("http_single_p50_ms", out["http_single_p50_ms"], "<= 2"),
        ("http_single_p99_ms", out["http_single_p99_ms"], ""),
    ]
    print(f"\nsearch benchmark: {args.docs} docs, k={k}, {out['machine']}, load {out['load_avg_1m_start']}")
    print(f"{'measure':32s} {'value':>12s}  target")
    for name, value, target in rows_out:
        print(f"{name:32s} {value:>12}  {target}")
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(out, indent=2) + "\n")


if __name__ == "__main__":
    main()
