"""The retriever at 100k / 300k / 1M passages: build, size, memory and speed, and growth fitted to wiki-18's 21M.

What: generates a Wikipedia-like corpus of `--size` passages (80-120 words, a title; each passage draws half its
words from one real SQuAD / HotpotQA paragraph, its "topic", and half from a Zipf vocabulary whose head is the
real paragraphs' words and whose tail is made-up words, so vocabulary keeps growing with the corpus as
Wikipedia's does), then measures, in one run:

* BM25: `searchrl index` (streamed, `--memory-mb`) in a child process: wall time, passages/s, peak RSS; the
  same corpus through bm25s' one-shot build (`--one-shot`) for comparison; the index size on disk; batched
  queries/s of searchrl's `BM25Backend` and of raw bm25s on the same index files, interleaved batch by batch
  (their ratio is the figure to read on a shared machine); p50/p99 of single queries in process; the resident
  memory of one `searchrl serve` worker after a load (documents left mmap'd, as wiki-18's would be).
* Dense, at the full size: random unit vectors of 768 dimensions stand in for e5's (encoding a million
  passages with e5 on this CPU would take days): flat, IVF-flat and IVF-PQ built by searchrl's own
  `faiss_build.fill_index` in a child process (time, peak RSS, size on disk), batched queries/s.
* Dense recall (`--recall-sample N`): the first N passages embedded for real with the bundled MiniLM, SQuAD /
  HotpotQA questions as queries; recall@3 against flat of HNSW, IVF-flat and IVF-PQ at several settings.
  Random vectors have no neighbourhoods, so recall is only reported on real embeddings.

`--fit A.json B.json ...` reads runs of several sizes, fits each figure as a * size^b (log-log least squares) and
extrapolates to 21M passages; the assumptions are printed beside it.

Usage: ``python benchmarks/bench_scale.py --size 100000 --json .bench/scale-100000.json`` (`make bench SIZE=...`).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_search import batches, free_port, make_vocab, per_batch_best  # noqa: E402

REALQA = next(
    (p for p in (ROOT / "shared/data/realqa", ROOT.parent / "shared/data/realqa") if p.is_dir()),
    ROOT / "shared/data/realqa",
)
WIKI18 = 21_015_324  # passages of Search-R1's wiki-18 (DPR's 100-word split)
K = 3


# --- the corpus ---------------------------------------------------------------------------------------------


def real_text(realqa: Path) -> tuple[list[tuple[str, str]], list[str]]:
    """(title, paragraph) pairs and questions of the SQuAD / HotpotQA slices in `realqa`."""
    paragraphs, questions = [], []
    squad = json.loads((realqa / "squad-v1.1-dev-20articles.json").read_text())
    for article in squad["data"]:
        for p in article["paragraphs"]:
            paragraphs.append((article["title"].replace("_", " "), p["context"]))
            questions += [q["question"] for q in p["qas"]]
    for row in json.loads((realqa / "hotpot_dev_distractor_v1-first53.json").read_text()):
        paragraphs += [(title, " ".join(sents)) for title, sents in row["context"]]
        questions.append(row["question"])
    return list(dict.fromkeys(paragraphs)), questions


def fresh_word(i: int) -> str:
    """The `i`-th made-up word of `--new-words`: letters only (BM25's tokenizer keeps it whole), distinct for
    every i, never a real or Zipf-tail word (those have no "qx" prefix)."""
    letters = []
    while True:
        i, r = divmod(i, 26)
        letters.append(chr(97 + r))
        if i == 0:
            return "qx" + "".join(letters)


def generate_corpus(path: Path, n: int, realqa: Path, seed: int = 0, new_words: int = 0) -> list[str]:
    """Write `n` passages to `path` (JSONL, streamed); returns the queries (the real questions).

    `new_words` adds that many never-seen words to every passage, so that the vocabulary reaches wiki-18's
    millions of terms at a size this machine can build (the generator's own vocabulary saturates at ~410k)."""
    rng = np.random.default_rng(seed)
    paragraphs, questions = real_text(realqa)
    words = [re.findall(r"[\w'-]+", text) for _, text in paragraphs]
    counts: dict[str, int] = {}
    for ws in words:
        for w in ws:
            counts[w] = counts.get(w, 0) + 1
    head = sorted(counts, key=lambda w: -counts[w])
    tail = [w for w in make_vocab(len(head) + 400_000, rng) if w not in counts][:400_000]
    vocab = np.array(head + tail)
    zipf = 1.0 / np.arange(1, len(vocab) + 1) ** 1.0
    cdf = np.cumsum(zipf / zipf.sum())
    topic_words = [np.array(ws) for ws in words]
    with open(path, "w") as f:
        for start in range(0, n, 50_000):
            m = min(50_000, n - start)
            lengths = rng.integers(80, 121, size=m)
            topics = rng.integers(0, len(paragraphs), size=m)
            background = vocab[np.searchsorted(cdf, rng.random(int(lengths.sum()) // 2 + m))]
            pos, lines = 0, []
            for i in range(m):
                own = topic_words[topics[i]]
                half = int(lengths[i]) // 2
                picked = [*own[rng.integers(0, len(own), size=half)], *background[pos : pos + half]]
                pos += half
                first = (start + i) * new_words
                picked += [fresh_word(j) for j in range(first, first + new_words)]
                title = paragraphs[topics[i]][0]
                row = {"id": f"p{start + i}", "title": title, "contents": " ".join(picked)}
                lines.append(json.dumps(row, ensure_ascii=False))
            f.write("\n".join(lines) + "\n")
    return questions


# --- measuring a child process ------------------------------------------------------------------------------


def run_measured(cmd: list[str], env: dict | None = None) -> dict:
    """Run `cmd`; its wall time, peak RSS in MB, peak anonymous RSS in MB and stdout.

    The peak is the child's VmHWM, read every 50 ms while it runs (it only grows, and exec resets it; wait4's
    ru_maxrss would also count the RSS this process had when it forked the child). VmHWM also counts the pages
    of files the child maps (a streamed build reads its chunk files by mmap), which the kernel can drop under
    pressure; RssAnon, sampled at the same times, is the memory it cannot: `peak_anon_mb`."""
    t = time.perf_counter()
    proc = subprocess.Popen(
        cmd, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT), **(env or {})}, stdout=subprocess.PIPE
    )
    chunks: list[bytes] = []
    reader = threading.Thread(target=lambda: chunks.append(proc.stdout.read() if proc.stdout else b""))
    reader.start()
    peak_kb = anon_kb = 0
    while proc.poll() is None:
        try:
            status = Path(f"/proc/{proc.pid}/status").read_text()
            peak_kb = max(peak_kb, int(re.search(r"VmHWM:\s+(\d+)", status).group(1)))
            anon_kb = max(anon_kb, int(re.search(r"RssAnon:\s+(\d+)", status).group(1)))
        except (OSError, AttributeError):
            pass
        time.sleep(0.05)
    reader.join()
    if proc.returncode != 0:
        raise RuntimeError(f"{cmd[:4]} failed with status {proc.returncode}")
    return {
        "seconds": round(time.perf_counter() - t, 1),
        "peak_rss_mb": round(peak_kb / 1024, 1),
        "peak_anon_mb": round(anon_kb / 1024, 1),
        "stdout": b"".join(chunks).decode(),
    }


def dir_mb(path: Path) -> float:
    return round(sum(p.stat().st_size for p in path.rglob("*") if p.is_file()) / 2**20, 1)


ONE_SHOT = """
import sys, bm25s
from searchrl.search.bm25 import BM25Params, index_text, make_tokenizer
from searchrl.search.corpus import load_corpus
docs = load_corpus(sys.argv[1])
tok = make_tokenizer(BM25Params())
ids = tok.tokenize([index_text(d) for d in docs], return_as="ids", show_progress=False)
bm25s.BM25(method="lucene", backend="numba").index((ids, tok.get_vocab_dict()), show_progress=False)
"""


# --- BM25 ---------------------------------------------------------------------------------------------------


def bench_bm25(corpus: Path, index: Path, queries: list[str], a: argparse.Namespace) -> dict:
    out: dict = {}
    cli = [sys.executable, "-m", "searchrl.cli", "index", "--corpus", str(corpus), "--out", str(index)]
    build = run_measured([*cli, "--memory-mb", str(a.memory_mb), "--quiet", "--overwrite"])
    out["build_s"], out["build_peak_rss_mb"] = build["seconds"], build["peak_rss_mb"]
    out["build_peak_anon_mb"] = build["peak_anon_mb"]  # without the chunk files' mmap'd pages
    out["build_passages_per_s"] = round(a.size / build["seconds"])
    out["build_memory_mb_setting"] = a.memory_mb
    if a.one_shot:
        one = run_measured([sys.executable, "-c", ONE_SHOT, str(corpus)])
        out["one_shot_bm25s_build_s"], out["one_shot_bm25s_peak_rss_mb"] = one["seconds"], one["peak_rss_mb"]
        out["one_shot_bm25s_peak_anon_mb"] = one["peak_anon_mb"]
    out["disk_mb"] = {"bm25": dir_mb(index / "bm25"), "docs": dir_mb(index / "docs")}
    out["vocab_terms"] = len(json.loads((index / "bm25" / "vocab.index.json").read_text()))

    import bm25s

    from searchrl.search.bm25 import make_tokenizer
    from searchrl.search.index import load_index

    ours = load_index(index)
    raw = bm25s.BM25.load(str(index / "bm25"), mmap=True, load_vocab=True)
    raw.backend = "numba"
    tok = make_tokenizer(ours.params)
    tok.load_vocab(str(index / "bm25"))
    qs = (queries * (1 + 2048 // len(queries)))[:2048]

    def raw_ids(qb: list[str]) -> None:
        ids = tok.tokenize(qb, update_vocab=False, return_as="ids", show_progress=False)
        raw.retrieve(ids, k=K, return_as="tuple", show_progress=False, n_threads=1)

    def ours_batch(qb: list[str]) -> None:
        ours.search(qb, K)

    fns = {"raw_ids": raw_ids, "ours": ours_batch}
    for fn in fns.values():  # numba JIT and page-cache warm-up
        fn(qs[:256])
    best = per_batch_best(fns, batches(qs, 256), a.rounds)
    out["ours_qps"] = round(len(qs) / best["ours"], 1)
    out["bm25s_raw_ids_only_qps"] = round(len(qs) / best["raw_ids"], 1)
    out["ours_vs_bm25s_ids_only"] = round(best["raw_ids"] / best["ours"], 3)
    lat = []
    for q in qs[:400]:
        t = time.perf_counter()
        ours.search([q], K)
        lat.append((time.perf_counter() - t) * 1000)
    out["single_p50_ms"] = round(float(np.percentile(lat, 50)), 2)
    out["single_p99_ms"] = round(float(np.percentile(lat, 99)), 2)
    out["serve"] = serve_rss(index, qs)
    return out


def serve_rss(index: Path, queries: list[str]) -> dict:
    """One `searchrl serve` worker, documents mmap'd: its RSS (private and file-backed) after 2,048 queries."""
    import httpx

    port = free_port()
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SEARCHRL_DOCS_IN_MEMORY_MB": "0"}
    cmd = [sys.executable, "-m", "searchrl.search.server", "--index", str(index), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline:
            try:
                if httpx.get(url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.3)
        with httpx.Client(base_url=url, timeout=120) as http:
            for qb in batches(queries, 64):
                http.post("/retrieve", json={"queries": qb, "topk": K}).raise_for_status()
            return http.get("/health").json()["memory"]
    finally:
        proc.kill()
        proc.wait(timeout=30)


# --- dense --------------------------------------------------------------------------------------------------


DENSE_CHILD = """
import json, sys, time
from pathlib import Path
import faiss, numpy as np
from searchrl.search.faiss_build import auto_nlist, fill_index, new_index
files, kind, out, pq_m = sorted(Path(sys.argv[1]).glob("v-*.npy")), sys.argv[2], sys.argv[3], int(sys.argv[4])
n = sum(np.load(f, mmap_mode="r").shape[0] for f in files)
t = time.perf_counter()
index = new_index(768, kind, nlist=auto_nlist(n), pq_m=pq_m)
fill_index(index, files, train_size=max(64 * getattr(index, "nlist", 1), 10_000))
faiss.write_index(index, out)
print(json.dumps({"build_s": round(time.perf_counter() - t, 1), "nlist": getattr(index, "nlist", None)}))
"""


def bench_dense_random(tmp: Path, n: int, a: argparse.Namespace) -> dict:
    vec_dir = tmp / "vecs"
    vec_dir.mkdir()
    rng = np.random.default_rng(1)
    for start in range(0, n, 100_000):  # written in chunks, as a streamed build's stage 1 leaves them
        v = rng.standard_normal((min(100_000, n - start), 768), dtype=np.float32)
        np.save(vec_dir / f"v-{start:09d}.npy", v / np.linalg.norm(v, axis=1, keepdims=True))
    queries = rng.standard_normal((256, 768), dtype=np.float32)
    queries /= np.linalg.norm(queries, axis=1, keepdims=True)
    import faiss

    out = {"vectors": "random unit, 768-d (stand-in for e5)"}
    for kind, pq_m in (("flat", 0), ("ivf_flat", 0), ("ivf_pq", 192)):
        if kind == "flat" and n > a.flat_max:
            continue
        path = tmp / f"{kind}.faiss"
        run = run_measured([sys.executable, "-c", DENSE_CHILD, str(vec_dir), kind, str(path), str(pq_m)])
        info = json.loads(run["stdout"])
        index = faiss.read_index(str(path), faiss.IO_FLAG_MMAP | faiss.IO_FLAG_READ_ONLY)
        if hasattr(index, "nprobe"):
            index.nprobe = 32
        index.search(queries[:8], K)
        t = time.perf_counter()
        index.search(queries, K)
        qps = len(queries) / (time.perf_counter() - t)
        out[kind] = {
            **info,
            "build_peak_rss_mb": run["peak_rss_mb"],
            "build_peak_anon_mb": run["peak_anon_mb"],
            "disk_mb": round(path.stat().st_size / 2**20, 1),
            "bytes_per_passage": round(path.stat().st_size / n, 1),
            "batched_qps_nprobe32": round(qps, 1),
        }
        path.unlink()
    return out


def bench_recall(corpus: Path, queries: list[str], n: int) -> dict:
    """Recall@3 against flat on real MiniLM embeddings of the first `n` passages."""
    import faiss

    from searchrl.search.corpus import document_from_row
    from searchrl.search.dense import DenseParams, encode, load_encoder, passage_text
    from searchrl.search.faiss_build import auto_nlist, new_index, recall_at_k, rerank_exact

    params = DenseParams()
    with open(corpus) as f:
        docs = [document_from_row(json.loads(next(f)), "") for _ in range(n)]
    encoder = load_encoder()
    t = time.perf_counter()
    vecs = encode(encoder, [passage_text(d, params) for d in docs], batch_size=64, normalize=True)
    encode_s = time.perf_counter() - t
    qv = encode(encoder, queries[:500], batch_size=64, normalize=True)
    dim = vecs.shape[1]
    flat = faiss.IndexFlatIP(dim)
    flat.add(vecs)
    _, exact = flat.search(qv, K)
    nlist = auto_nlist(n)
    out: dict = {"passages": n, "queries": len(qv), "dim": dim, "nlist": nlist, "model": "all-MiniLM-L6-v2"}
    out["encode_passages_per_s"] = round(n / encode_s, 1)
    hnsw = new_index(dim, "hnsw", hnsw_m=32)
    hnsw.add(vecs)
    for ef in (64, 128):
        hnsw.hnsw.efSearch = ef
        out[f"hnsw_m32_ef{ef}"] = round(recall_at_k(exact, hnsw.search(qv, K)[1], K), 4)
    sample = vecs[
        np.sort(np.random.default_rng(0).choice(n, size=min(n, max(64 * nlist, 10_000)), replace=False))
    ]
    stored = vecs.astype(np.float16)  # what `--rerank` re-scores from
    for kind, pq_m in (("ivf_flat", 0), ("ivf_pq", dim // 8), ("ivf_pq", dim // 4), ("ivf_pq", dim // 2)):
        index = new_index(dim, kind, nlist=nlist, pq_m=pq_m)
        index.train(sample)
        index.add(vecs)
        name = kind if kind == "ivf_flat" else f"ivf_pq_m{pq_m}"
        for nprobe in (8, 32, 128):
            index.nprobe = nprobe
            out[f"{name}_nprobe{nprobe}"] = round(recall_at_k(exact, index.search(qv, K)[1], K), 4)
        if kind == "ivf_pq":
            index.nprobe = 32
            for depth in (16, 32, 64):
                _, ids = rerank_exact(stored, qv, index.search(qv, depth)[1], K)
                out[f"{name}_nprobe32_rerank{depth}"] = round(recall_at_k(exact, ids, K), 4)
    return out


# --- the fit ------------------------------------------------------------------------------------------------


FIT_KEYS = {
    "bm25.build_peak_rss_mb": "BM25 build peak RSS (MB)",
    "bm25.build_peak_anon_mb": "BM25 build peak anonymous RSS (MB)",
    "bm25.build_s": "BM25 build (s)",
    "bm25.disk_mb.bm25": "BM25 matrix on disk (MB)",
    "bm25.disk_mb.docs": "document store on disk (MB)",
    "bm25.serve.rss_mb": "serving worker RSS (MB)",
    "bm25.serve.rss_anon_mb": "serving worker private RSS (MB)",
    "bm25.vocab_terms": "BM25 vocabulary (terms)",
    "bm25.ours_qps": "BM25 batched queries/s",
    "dense.ivf_pq.disk_mb": "IVF-PQ (192 B) index (MB)",
    "dense.ivf_pq.build_peak_rss_mb": "IVF-PQ build peak RSS (MB)",
    "dense.ivf_pq.build_peak_anon_mb": "IVF-PQ build peak anonymous RSS (MB)",
}


def _get(d: dict, dotted: str):
    for part in dotted.split("."):
        if not isinstance(d, dict) or part not in d:
            return None
        d = d[part]
    return d


PER_TERM_KEYS = {
    "bm25.build_peak_anon_mb": "BM25 build peak anonymous RSS",
    "bm25.serve.rss_anon_mb": "serving worker private RSS",
}


def per_term(runs: list[dict]) -> dict:
    """Bytes per vocabulary term: the slope of each figure against `vocab_terms` over runs of one size that
    differ only in `--new-words` (the passages, hence everything else, stay the same)."""
    out = {}
    for size in sorted({r["size"] for r in runs}):
        same = [r for r in runs if r["size"] == size and _get(r, "bm25.vocab_terms")]
        if len({_get(r, "bm25.vocab_terms") for r in same}) < 2:
            continue
        for key, label in PER_TERM_KEYS.items():
            pts = [(_get(r, "bm25.vocab_terms"), _get(r, key)) for r in same if _get(r, key)]
            if len(pts) >= 2:
                slope, _ = np.polyfit([p[0] for p in pts], [p[1] * 2**20 for p in pts], 1)
                out[f"{label} at {size} passages (B per term)"] = round(float(slope), 1)
    return out


def fit(paths: list[Path]) -> dict:
    every = [json.loads(p.read_text()) for p in paths]
    # Growth with the corpus from the runs of the generator's own text; `--new-words` runs give bytes per term.
    runs = [r for r in every if not r.get("new_words_per_passage")]
    out: dict = {"per_term": per_term(every)}
    for key, label in FIT_KEYS.items():
        pts = [(r["size"], _get(r, key)) for r in runs if _get(r, key)]
        if len(pts) < 2:
            continue
        x, y = np.log([p[0] for p in pts]), np.log([p[1] for p in pts])
        b, log_a = np.polyfit(x, y, 1)
        out[label] = {
            "measured": {str(s): v for s, v in pts},
            "exponent": round(float(b), 3),
            "at_21M": round(float(np.exp(log_a) * WIKI18**b), 1),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--size", type=int, default=100_000, help="passages (100000, 300000, 1000000)")
    ap.add_argument("--json", type=Path, help="write the results here")
    ap.add_argument("--memory-mb", type=int, default=1024, help="`searchrl index --memory-mb` of the build")
    ap.add_argument("--one-shot", action="store_true", help="also time bm25s' one-shot build (all in memory)")
    ap.add_argument("--no-dense", action="store_true", help="BM25 only")
    ap.add_argument("--flat-max", type=int, default=1_000_000, help="largest size that builds a flat index")
    ap.add_argument("--recall-sample", type=int, default=0, help="passages embedded for real for recall@3")
    ap.add_argument("--rounds", type=int, default=3, help="timing rounds (per-batch best is kept)")
    ap.add_argument(
        "--new-words",
        type=int,
        default=0,
        help="never-seen words added to every passage: a vocabulary of millions of terms (BM25's per-term cost)",
    )
    ap.add_argument(
        "--realqa", type=Path, default=REALQA, help="the SQuAD / HotpotQA slices seeding the text"
    )
    ap.add_argument("--tmp", type=Path, default=None, help="scratch folder (default: a temporary one)")
    ap.add_argument("--keep", type=Path, default=None, help="copy the BM25 index and queries.txt here")
    ap.add_argument("--fit", type=Path, nargs="+", help="fit these runs' growth and extrapolate to 21M")
    a = ap.parse_args()
    if a.fit:
        result = fit(a.fit)
        print(json.dumps(result, indent=2))
        if a.json:
            a.json.write_text(json.dumps(result, indent=2) + "\n")
        return
    out: dict = {
        "size": a.size,
        "machine": f"{platform.processor() or platform.machine()}, {os.cpu_count()} cpu",
        "load_avg_1m_start": round(os.getloadavg()[0], 2),
        "new_words_per_passage": a.new_words,
    }
    with tempfile.TemporaryDirectory(dir=a.tmp) as tmp:
        tmp = Path(tmp)
        t = time.perf_counter()
        queries = generate_corpus(tmp / "corpus.jsonl", a.size, a.realqa, new_words=a.new_words)
        out["corpus_gen_s"] = round(time.perf_counter() - t, 1)
        out["corpus_mb"] = round((tmp / "corpus.jsonl").stat().st_size / 2**20, 1)
        out["bm25"] = bench_bm25(tmp / "corpus.jsonl", tmp / "index", queries, a)
        print(json.dumps(out["bm25"], indent=2), flush=True)
        if a.keep:  # for load_search.py --index DIR/index --queries DIR/queries.txt
            shutil.copytree(tmp / "index", a.keep / "index", dirs_exist_ok=True)
            (a.keep / "queries.txt").write_text("\n".join(q.replace("\n", " ") for q in queries) + "\n")
        if a.recall_sample:
            out["recall_at_3_real"] = bench_recall(tmp / "corpus.jsonl", queries, a.recall_sample)
            print(json.dumps(out["recall_at_3_real"], indent=2), flush=True)
        if not a.no_dense:
            out["dense"] = bench_dense_random(tmp, a.size, a)
    out["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
    text = json.dumps(out, indent=2)
    print(text)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
