"""CLI commands of the search room: `searchrl index`, `searchrl search`, `searchrl serve`."""

from __future__ import annotations

import json
from enum import StrEnum
from pathlib import Path

import typer


class BackendName(StrEnum):
    bm25 = "bm25"
    dense = "dense"


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
        BackendName.bm25, "--backend", help="bm25 (bm25s, numba) or dense (MiniLM + faiss)."
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
    overwrite: bool = typer.Option(False, "--overwrite", help="Replace a non-empty output directory."),
) -> None:
    """Build a search index from a corpus file."""
    from searchrl.search.index import build_index, read_meta

    if backend == BackendName.bm25:
        params = {
            "k1": k1,
            "b": b,
            "method": method,
            "stemmer": _none_word(stemmer),
            "stopwords": _none_word(stopwords),
        }
    else:
        params = {"model_path": str(model_path) if model_path else None}
    try:
        build_index(corpus, out, backend=backend.value, overwrite=overwrite, **params)
    except (ValueError, FileNotFoundError) as e:
        raise _fail(str(e)) from None
    meta = read_meta(out)
    typer.echo(
        f"indexed {meta['num_docs']} documents ({meta['backend']}) into {out} in {meta['build_seconds']} s; "
        f"fingerprint {meta['fingerprint'][:16]}"
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
    as_json: bool = typer.Option(
        False, "--json", help="Print JSON (one list of hits per query) instead of text."
    ),
) -> None:
    """Search an index (or a server) and print the hits."""
    from searchrl.search.base import SearchError
    from searchrl.search.index import SearchConfig, open_backend

    if (index is None) == (url is None):
        raise _fail("give exactly one of --index or --url")
    try:
        backend = open_backend(
            SearchConfig(index=str(index) if index else None, url=url, protocol=protocol, token=token)
        )
        results = backend.search(list(queries), k)
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
        1, "--workers", min=1, help="uvicorn worker processes (each opens the index, mmap)."
    ),
    max_queries: int = typer.Option(1024, "--max-queries", min=1, help="Most queries per request."),
    max_query_chars: int = typer.Option(4096, "--max-query-chars", min=1, help="Most characters per query."),
    max_topk: int = typer.Option(100, "--max-topk", min=1, help="Largest topk a request may ask for."),
    default_topk: int = typer.Option(3, "--default-topk", min=1, help="topk when a request does not say."),
) -> None:
    """Serve an index over HTTP: Search-R1 POST /retrieve, FlashRAG POST /batch_search, GET /health."""
    from searchrl.search.index import IndexFormatError
    from searchrl.search.server import ServerLimits, serve

    try:
        limits = ServerLimits(max_queries, max_query_chars, max_topk, default_topk)
        serve(str(index), host=host, port=port, token=token, workers=workers, limits=limits)
    except (IndexFormatError, ValueError) as e:
        raise _fail(str(e)) from None


def register(app: typer.Typer) -> None:
    app.command("index", help="Build a search index (bm25 or dense) from a corpus file.")(index_command)
    app.command("search", help="Search an index or a retrieval server from the command line.")(search_command)
    app.command("serve", help="Serve an index over HTTP (Search-R1 wire format).")(serve_command)
