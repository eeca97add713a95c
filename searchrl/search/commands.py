"""CLI commands of the search room: `searchrl index`, `searchrl search`, `searchrl serve`."""

from __future__ import annotations

import json
import os
from enum import StrEnum
from pathlib import Path

import typer

from searchrl.search.acl import principal_problem
from searchrl.search.base import SearchError, search_as


class BackendName(StrEnum):
    bm25 = "bm25"
    dense = "dense"


class DenseEncoder(StrEnum):
    sentence_transformers = "sentence-transformers"
    e5 = "e5"


def _fail(message: str) -> typer.Exit:
    # Plain text on stderr rather than typer's boxed error: long paths in messages stay whole.
    typer.echo(f"error: {message}", err=True)
    return typer.Exit(2)


def _none_word(value: str | None) -> str | None:
    # On the command line "none" means "switch this off" (no stemmer, no stop words).
    return None if value is None or value.lower() in ("none", "null", "off", "") else value


def index_command(
    corpus: Path = typer.Option(
        ..., "--corpus", help="Corpus file: .jsonl, .jsonl.gz or .parquet rows with id + contents."
    ),
    out: Path = typer.Option(..., "--out", help="Directory to write the index into."),
    backend: BackendName = typer.Option(
        BackendName.bm25,
        "--backend",
        help="bm25 (bm25s, numba) or dense (an encoder + faiss; see --encoder).",
    ),
    k1: float = typer.Option(0.9, "--k1", help="BM25 k1 (Pyserini / Search-R1 default 0.9)."),
    b: float = typer.Option(0.4, "--b", help="BM25 b (Pyserini / Search-R1 default 0.4)."),
    method: str = typer.Option(
        "lucene", "--method", help="BM25 variant: robertson, lucene, atire, bm25l, bm25+."
    ),
    stemmer: str = typer.Option("english", "--stemmer", help="PyStemmer language, or 'none'."),
    stopwords: str = typer.Option("en", "--stopwords", help="Stop-word list ('en'), or 'none'."),
    model_path: Path | None = typer.Option(
        None, "--model-path", help="Dense model dir (default: $SEARCHRL_DENSE_MODEL, else bundled MiniLM)."
    ),
    encoder: DenseEncoder = typer.Option(
        DenseEncoder.sentence_transformers,
        "--encoder",
        help="Dense: 'sentence-transformers' (the model's own pooling; 'Title. text') or 'e5' (Search-R1's "
        "recipe: 'query: '/'passage: ' prefixes, mean pooling, L2 norm, 256 tokens, '\"Title\"\\ntext').",
    ),
    query_prefix: str | None = typer.Option(
        None, "--query-prefix", help="Dense: text put before every query (e5 default 'query: ')."
    ),
    passage_prefix: str | None = typer.Option(
        None, "--passage-prefix", help="Dense: text put before every passage (e5 default 'passage: ')."
    ),
    pooling: str | None = typer.Option(
        None, "--pooling", help="Dense e5: 'mean' over the attention mask (default) or 'cls' (first token)."
    ),
    max_length: int | None = typer.Option(
        None, "--max-length", min=1, help="Dense e5: tokens per query and passage (default 256)."
    ),
    passage_format: str | None = typer.Option(
        None,
        "--passage-format",
        help="Dense: 'title_text' ('Title. text') or 'contents' (Search-R1's '\"Title\"\\ntext'; e5 default).",
    ),
    index_type: str = typer.Option(
        "flat",
        "--index-type",
        help="Dense: 'flat' (exact inner product, 4 bytes per dimension), 'hnsw' (approximate graph, flat's memory "
        "and more), 'ivf_flat' (inverted lists, exact vectors) or 'ivf_pq' (inverted lists of PQ codes: --pq-m bytes "
        "per passage; the wiki-18 choice on one machine).",
    ),
    hnsw_m: int = typer.Option(64, "--hnsw-m", min=2, help="Dense hnsw: links per node (Search-R1: 64)."),
    hnsw_ef_search: int = typer.Option(
        128, "--hnsw-ef-search", min=1, help="Dense hnsw: search breadth (higher: better recall, slower)."
    ),
    ivf_nlist: int = typer.Option(
        0,
        "--ivf-nlist",
        min=0,
        help="Dense ivf_*: inverted lists (0: the power of two nearest sqrt(passages)).",
    ),
    pq_m: int = typer.Option(
        0,
        "--pq-m",
        min=0,
        help="Dense ivf_pq: bytes per passage (0: one per 4 dimensions; must divide the dimension).",
    ),
    pq_nbits: int = typer.Option(8, "--pq-nbits", help="Dense ivf_pq: bits per PQ code (8 is the usual)."),
    nprobe: int = typer.Option(
        32, "--nprobe", min=1, help="Dense ivf_*: lists searched per query (higher: better recall, slower)."
    ),
    rerank: int = typer.Option(
        0,
        "--rerank",
        min=0,
        help="Dense ivf_pq: re-score this many PQ candidates per query exactly, from the passage vectors kept "
        "beside the index (float16, read by mmap; 0: off). 16-32 gives flat's recall@3 (docs/search.md).",
    ),
    train_size: int = typer.Option(
        0,
        "--train-size",
        min=0,
        help="Dense ivf_*: passages sampled to train on (0: 64 per list, >= 10,000).",
    ),
    memory_mb: int = typer.Option(
        2048,
        "--memory-mb",
        min=64,
        help="Memory budget of the build in MB (chunk size and BM25 merge buffer; see docs/search.md 'At wiki-18 "
        "scale'). The corpus is read in chunks; a killed build started again goes on from its last chunk.",
    ),
    chunk_docs: int = typer.Option(
        0, "--chunk-docs", min=0, help="Passages per chunk (0: from --memory-mb)."
    ),
    quiet: bool = typer.Option(False, "--quiet", help="No progress bar."),
    faiss_index: Path | None = typer.Option(
        None,
        "--faiss-index",
        help="Dense: use this existing faiss index (e.g. Search-R1's e5_Flat.index over wiki-18.jsonl, built "
        "with the same encoder) instead of encoding the corpus; linked, not copied. Row i must be document i.",
    ),
    batch_size: int = typer.Option(64, "--batch-size", min=1, help="Dense: passages encoded together."),
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty output directory."),
) -> None:
    """Build a search index from a corpus file (or link an existing faiss index to it)."""
    from searchrl.search.build import StreamSettings
    from searchrl.search.index import build_index, read_meta  # bm25s and numba: not for --help

    if backend == BackendName.bm25:
        params = {
            "k1": k1,
            "b": b,
            "method": method,
            "stemmer": _none_word(stemmer),
            "stopwords": _none_word(stopwords),
        }
    else:
        params = {
            "model_path": str(model_path) if model_path else None,
            "encoder": encoder.value,
            "query_prefix": query_prefix,
            "passage_prefix": passage_prefix,
            "pooling": pooling,
            "max_length": max_length,
            "passage_format": passage_format,
            "index_type": index_type,
            "hnsw_m": hnsw_m,
            "hnsw_ef_search": hnsw_ef_search,
            "ivf_nlist": ivf_nlist,
            "pq_m": pq_m,
            "pq_nbits": pq_nbits,
            "nprobe": nprobe,
            "train_size": train_size,
            "rerank": rerank,
            "faiss_index": str(faiss_index) if faiss_index else None,
            "batch_size": batch_size,
        }
    try:
        stream = StreamSettings(memory_mb=memory_mb, chunk_docs=chunk_docs, progress=not quiet)
        build_index(corpus, out, backend=backend.value, overwrite=overwrite, stream=stream, **params)
    except (ValueError, FileNotFoundError) as e:
        raise _fail(str(e)) from None
    meta = read_meta(out)
    resumed = (
        f" (resumed after {meta['resumed_after_docs']} documents)" if meta.get("resumed_after_docs") else ""
    )
    typer.echo(
        f"indexed {meta['num_docs']} documents ({meta['backend']}) into {out} in {meta['build_seconds']} s"
        f"{resumed}; fingerprint {meta['fingerprint'][:16]}"
    )


def search_command(
    queries: list[str] = typer.Argument(..., help="One or more queries (quote each one)."),
    index: Path | None = typer.Option(None, "--index", help="Index directory to search."),
    url: str | None = typer.Option(
        None, "--url", help="Or: a retrieval server URL (e.g. http://127.0.0.1:8000)."
    ),
    protocol: str = typer.Option(
        "search_r1", "--protocol", help="Server wire format: search_r1, flashrag, skyrl."
    ),
    token: str | None = typer.Option(None, "--token", help="Bearer token for the server."),
    k: int = typer.Option(3, "--k", min=1, help="Hits per query."),
    principal: str | None = typer.Option(
        None,
        "--principal",
        help="Search as this principal: only documents whose acl names it, and public ones (default: public "
        "documents only).",
    ),
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON (one list of hits per query) instead of text."
    ),
) -> None:
    """Search an index (or a server) and print the hits."""
    from searchrl.search.index import SearchConfig, open_backend  # bm25s and numba, as above

    if (index is None) == (url is None):
        raise _fail("give exactly one of --index or --url")
    problem = None if principal is None else principal_problem(principal)
    if problem is not None:
        raise _fail(f"--principal: {problem}")
    try:
        backend = open_backend(
            SearchConfig(index=str(index) if index else None, url=url, protocol=protocol, token=token)
        )
        principals = None if principal is None else [principal] * len(queries)
        results = search_as(backend, list(queries), k, principals)
    except (ValueError, SearchError) as e:
        typer.echo(f"search failed: {e}", err=True)
        raise typer.Exit(1) from None
    if as_json:
        typer.echo(
            json.dumps([[h.to_dict() for h in hits] for hits in results], ensure_ascii=False, indent=2)
        )
        return
    for q, hits in zip(queries, results, strict=True):
        typer.echo(f"# {q}")
        if not hits:
            typer.echo("  (no hits)")
        for rank, h in enumerate(hits, start=1):
            snippet = h.text if len(h.text) <= 160 else h.text[:157] + "..."
            typer.echo(f"  {rank}. [{h.doc_id}] {h.title} ({h.score:.3f}): {snippet}")


def serve_command(
    index: Path = typer.Option(..., "--index", help="Index directory to serve."),
    host: str = typer.Option(
        "127.0.0.1", "--host", help="Bind address; the default serves this machine only."
    ),
    port: int = typer.Option(8000, "--port", help="TCP port."),
    token: str | None = typer.Option(
        None,
        "--token",
        envvar="SEARCHRL_SERVE_TOKEN",
        help="Require 'Authorization: Bearer TOKEN' (or set the env var).",
    ),
    workers: int = typer.Option(
        1,
        "--workers",
        min=1,
        help="uvicorn worker processes, each opening the index by mmap (one copy in the page cache); a worker "
        "that dies is restarted, the others keep serving. /health reports each worker's pid and RSS.",
    ),
    max_queries: int = typer.Option(1024, "--max-queries", min=1, help="Most queries per request."),
    max_query_chars: int = typer.Option(4096, "--max-query-chars", min=1, help="Most characters per query."),
    max_topk: int = typer.Option(100, "--max-topk", min=1, help="Largest topk a request may ask for."),
    default_topk: int = typer.Option(3, "--default-topk", min=1, help="topk when a request does not say."),
    model_path: Path | None = typer.Option(
        None,
        "--model-path",
        help="Dense index: the encoder's local folder (e.g. e5-base-v2), the one the index was built with "
        "(default: $SEARCHRL_DENSE_MODEL, else the bundled MiniLM).",
    ),
    device: str | None = typer.Option(
        None, "--device", help="Dense index: where the query encoder runs, e.g. cuda (default: cpu)."
    ),
    docs_in_memory_mb: float | None = typer.Option(
        None,
        "--docs-in-memory-mb",
        min=0,
        help="Decode the documents into each worker's memory when their text is at most this many MB (default "
        "1024); a larger store stays mmap'd and is shared by all workers through the page cache.",
    ),
) -> None:
    """Serve an index over HTTP: Search-R1 POST /retrieve, FlashRAG POST /batch_search, GET /health."""
    # bm25s, numba, fastapi and the dense encoder's module: loaded when the server starts.
    from searchrl.search.corpus import DOCS_IN_MEMORY_ENV
    from searchrl.search.dense import DEVICE_ENV_VAR, MODEL_ENV_VAR
    from searchrl.search.index import IndexFormatError
    from searchrl.search.server import ServerLimits, serve

    # The workers open the index themselves; they inherit the encoder's folder and device by environment.
    if model_path is not None:
        if not model_path.is_dir():
            raise _fail(f"--model-path {model_path}: no such folder (a local encoder, nothing is downloaded)")
        os.environ[MODEL_ENV_VAR] = str(model_path.resolve())
    if device:
        os.environ[DEVICE_ENV_VAR] = device
    if docs_in_memory_mb is not None:
        os.environ[DOCS_IN_MEMORY_ENV] = str(docs_in_memory_mb)
    try:
        limits = ServerLimits(max_queries, max_query_chars, max_topk, default_topk)
        serve(str(index), host=host, port=port, token=token, workers=workers, limits=limits)
    except (IndexFormatError, ValueError) as e:
        raise _fail(str(e)) from None


def register(app: typer.Typer) -> None:
    app.command("index", help="Build a search index (bm25 or dense) from a corpus file.")(index_command)
    app.command("search", help="Search an index or a retrieval server from the command line.")(search_command)
    app.command("serve", help="Serve an index over HTTP (Search-R1 wire format).")(serve_command)
