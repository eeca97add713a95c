"""The search service: any `Backend` over HTTP, in the wire formats existing RL stacks already speak.

* ``POST /retrieve`` — Search-R1's format: ``{"queries": [...], "topk": k, "return_scores": bool}`` →
  ``{"result": [[{"document": doc, "score": s}, ...], ...]}``, or with ``return_scores: false`` the
  same lists of bare documents (both shapes work, unlike Search-R1's own server). A SkyRL-style body
  with one ``"query": str`` instead of ``"queries"`` is accepted too (answered as a batch of one).
* ``POST /batch_search`` and ``POST /search`` — FlashRAG / ReSearch's format:
  ``{"query": [...] | str, "top_n": k, "return_score": bool}`` → documents, or ``[documents, scores]``.
* ``GET /health`` — status, index fingerprint, document count, and the answering worker's pid and resident
  memory (``memory``: RSS, its private and its file-backed part, in MB). OpenAPI at ``/openapi.json``.

A document is ``{"id", "contents", "title", "text"}``: ``contents`` is Search-R1's ``"Title"\\ntext``
so Search-R1 / verl / SkyRL clients parse it unchanged, and ``title`` / ``text`` are there for clients
that want them separately without re-parsing.

Bodies are parsed and validated by hand rather than by FastAPI's model binding, so every bad request
(malformed JSON, a body that is not an object, a missing or wrongly typed field, an empty or oversized
batch, an overlong query, an out-of-range topk) gets a 4xx whose message says what was wrong and how
to fix it — never a 5xx. 5xx is kept for failures of the server itself (503: the backend failed), which
is exactly what a client should retry. With a token, the search endpoints need
``Authorization: Bearer <token>`` (compared in constant time); ``/health`` and the OpenAPI spec stay
open for probes. The default bind is 127.0.0.1.

Principals (`searchrl.search.acl`): every search endpoint takes an optional ``"principal": "<id>"`` beside its
wire format's fields, and answers with the best k documents that principal may read (filtered before the
top-k cut); a request without one (or with ``null``) sees public documents only. A principal that is not a
valid id is a 422, and so is a JSON body that names a field twice (``{"principal": "a", "principal": "b"}``:
no parser may read another principal than this one). The server trusts the principal its caller names: it is
the training environment's backend, authenticated by the bearer token, not a service for end users.
`/health` says ``"principals": true`` when the backend enforces ACLs, which the client checks before it
sends a principal.
"""

from __future__ import annotations

import argparse
import hmac
import inspect
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from typing import Any

from fastapi import FastAPI, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from searchrl.search.acl import principal_problem
from searchrl.search.base import Backend, Hit, SearchError, search_as
from searchrl.search.corpus import join_search_r1_contents

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class ServerLimits:
    """Per-request limits; anything beyond them is a 4xx, not a slow request or a crash."""

    max_queries: int = field(default=1024, metadata={"help": "Most queries in one request."})
    max_query_chars: int = field(default=4096, metadata={"help": "Most characters in one query."})
    max_topk: int = field(default=100, metadata={"help": "Largest topk / top_n a request may ask for."})
    default_topk: int = field(
        default=3, metadata={"help": "topk when a request does not say (Search-R1: 3)."}
    )
    max_body_bytes: int = field(default=8 * 1024 * 1024, metadata={"help": "Largest request body, in bytes."})

    def __post_init__(self) -> None:
        if not 1 <= self.default_topk <= self.max_topk:
            raise ValueError(
                f"default_topk must be in [1, max_topk={self.max_topk}], got {self.default_topk}"
            )
        if min(self.max_queries, self.max_query_chars, self.max_topk, self.max_body_bytes) < 1:
            raise ValueError("every server limit must be >= 1")


class BadRequest(Exception):
    """A request the client must change; carries the HTTP status and the message for the client."""

    def __init__(self, message: str, status: int = 422):
        super().__init__(message)
        self.status = status


def _json_response(payload: Any, status: int = 200) -> Response:
    # json.dumps straight to bytes: FastAPI's jsonable_encoder walks every value and costs more
    # than the search itself for a 256-query batch.
    return Response(
        content=json.dumps(payload, ensure_ascii=False), status_code=status, media_type="application/json"
    )


def _error(status: int, message: str) -> Response:
    return _json_response({"error": message, "detail": message}, status)


def document_dict(hit: Hit) -> dict[str, str]:
    return {
        "id": hit.doc_id,
        "contents": join_search_r1_contents(hit.title, hit.text),
        "title": hit.title,
        "text": hit.text,
    }


def _unique_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    """A JSON object whose every key appears once (two parsers must never read two different principals)."""
    seen: dict[str, Any] = {}
    for key, value in pairs:
        if key in seen:
            raise BadRequest(f"field {key!r} appears more than once in a JSON object; send it once", 400)
        seen[key] = value
    return seen


def _parse_object(raw: bytes) -> dict[str, Any]:
    try:
        body = json.loads(raw, object_pairs_hook=_unique_keys)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise BadRequest(f"request body is not valid JSON ({e}); send a JSON object", 400) from None
    if not isinstance(body, dict):
        raise BadRequest(f"request body must be a JSON object, got a JSON {type(body).__name__}", 400)
    return body


def _check_keys(body: dict[str, Any], allowed: tuple[str, ...]) -> None:
    unknown = sorted(set(body) - set(allowed))
    if unknown:
        raise BadRequest(
            f"unknown field(s) {', '.join(map(repr, unknown))}; this endpoint accepts {', '.join(allowed)}"
        )


def _check_queries(value: Any, field: str, limits: ServerLimits) -> list[str]:
    if not isinstance(value, list):
        raise BadRequest(f"'{field}' must be a list of strings, got {type(value).__name__}")
    if not value:
        raise BadRequest(f"'{field}' is empty; send at least one query")
    if len(value) > limits.max_queries:
        raise BadRequest(
            f"'{field}' has {len(value)} queries; at most {limits.max_queries} per request (split the batch)"
        )
    for i, q in enumerate(value):
        if not isinstance(q, str):
            raise BadRequest(f"'{field}[{i}]' must be a string, got {type(q).__name__}")
        if len(q) > limits.max_query_chars:
            raise BadRequest(
                f"'{field}[{i}]' has {len(q)} characters; at most {limits.max_query_chars} allowed"
            )
    return value


def _check_topk(value: Any, field: str, limits: ServerLimits) -> int:
    if value is None:
        return limits.default_topk
    # bool is an int subclass in Python; `true` is not a valid k.
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadRequest(f"'{field}' must be an integer, got {type(value).__name__}")
    if not 1 <= value <= limits.max_topk:
        raise BadRequest(f"'{field}' is {value}; it must be between 1 and {limits.max_topk}")
    return value


def check_request_principal(body: dict[str, Any]) -> str | None:
    """The request's optional ``principal`` (None: public documents only); a bad one is a 422."""
    value = body.get("principal")
    if value is None:
        return None
    problem = principal_problem(value)
    if problem is not None:
        raise BadRequest(f"'principal': {problem}; leave it out (or null) to search public documents only")
    return value


def _check_bool(value: Any, field: str) -> bool:
    if value is None:
        return False
    if not isinstance(value, bool):
        raise BadRequest(f"'{field}' must be true or false, got {type(value).__name__}")
    return value


def parse_retrieve(body: dict[str, Any], limits: ServerLimits) -> tuple[list[str], int, bool]:
    """Validate a Search-R1 (or SkyRL one-query) /retrieve body → (queries, topk, return_scores); its
    principal is read by `check_request_principal`."""
    _check_keys(body, ("queries", "query", "topk", "return_scores", "principal"))
    if ("queries" in body) == ("query" in body):
        raise BadRequest("send exactly one of 'queries' (a list of strings) or 'query' (one string)")
    if "query" in body:
        if not isinstance(body["query"], str):
            raise BadRequest(
                f"'query' must be a string, got {type(body['query']).__name__}; use 'queries' for a list"
            )
        queries = _check_queries([body["query"]], "query", limits)
    else:
        queries = _check_queries(body["queries"], "queries", limits)
    return (
        queries,
        _check_topk(body.get("topk"), "topk", limits),
        _check_bool(body.get("return_scores"), "return_scores"),
    )


def parse_flashrag(body: dict[str, Any], limits: ServerLimits, batch: bool) -> tuple[list[str], int, bool]:
    """Validate a FlashRAG /batch_search (list) or /search (one string) body."""
    _check_keys(body, ("query", "top_n", "return_score", "principal"))
    if "query" not in body:
        raise BadRequest("missing field 'query'" + (" (a list of strings)" if batch else " (a string)"))
    if batch:
        queries = _check_queries(body["query"], "query", limits)
    else:
        if not isinstance(body["query"], str):
            raise BadRequest(
                f"'query' must be a string, got {type(body['query']).__name__}; use /batch_search for lists"
            )
        queries = _check_queries([body["query"]], "query", limits)
    return (
        queries,
        _check_topk(body.get("top_n"), "top_n", limits),
        _check_bool(body.get("return_score"), "return_score"),
    )


_PRINCIPAL_SCHEMA = {
    "type": ["string", "null"],
    "minLength": 1,
    "description": "Search as this principal: only documents it may read (absent or null: public only).",
}
_RETRIEVE_SCHEMA = {
    "type": "object",
    "properties": {
        "queries": {"type": "array", "items": {"type": "string"}, "description": "Batch of queries."},
        "query": {"type": "string", "description": "One query (SkyRL clients); exclusive with 'queries'."},
        "topk": {"type": "integer", "minimum": 1, "description": "Hits per query."},
        "return_scores": {"type": "boolean", "default": False},
        "principal": _PRINCIPAL_SCHEMA,
    },
}
_FLASHRAG_SCHEMA = {
    "type": "object",
    "required": ["query"],
    "properties": {
        "query": {"oneOf": [{"type": "array", "items": {"type": "string"}}, {"type": "string"}]},
        "top_n": {"type": "integer", "minimum": 1},
        "return_score": {"type": "boolean", "default": False},
        "principal": _PRINCIPAL_SCHEMA,
    },
}


def _body_spec(schema: dict) -> dict:
    return {"requestBody": {"required": True, "content": {"application/json": {"schema": schema}}}}


def process_memory() -> dict[str, float]:
    """This process' resident memory in MB: all of it, its private part (anon) and its file-backed part (the
    mmap'd index pages it has touched, which every worker shares through the page cache)."""
    fields = {
        "VmRSS": "rss_mb",
        "RssAnon": "rss_anon_mb",
        "RssFile": "rss_file_mb",
        "RssShmem": "rss_shmem_mb",
    }
    out: dict[str, float] = {}
    try:
        with open("/proc/self/status") as f:
            for line in f:
                key, _, value = line.partition(":")
                if key in fields:
                    out[fields[key]] = round(int(value.split()[0]) / 1024, 1)
    except OSError:  # not Linux: RSS only
        import resource

        out["rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    return out


def backend_takes_principals(backend: Backend) -> bool:
    """Does `backend.search` take `principals` (and so enforce document ACLs)?"""
    try:
        return "principals" in inspect.signature(backend.search).parameters
    except (TypeError, ValueError):
        return False


class _CatchAll:
    """Pure ASGI middleware: an unexpected exception becomes a JSON 500 with a message.

    The last line of defence; bad requests never get here (they are `BadRequest`, raised before the
    backend runs). Plain ASGI rather than `@app.middleware("http")`, whose per-request cost is a
    visible share of a one-query request.
    """

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        started = False

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, receive, tracking_send)
        except Exception as exc:
            log.error("unexpected error serving %s: %r", scope.get("path"), exc)
            if started:  # too late for a clean answer; the server closes the connection
                raise
            message = f"internal error: {type(exc).__name__}: {exc}"
            body = json.dumps({"error": message, "detail": message}).encode()
            await send(
                {
                    "type": "http.response.start",
                    "status": 500,
                    "headers": [(b"content-type", b"application/json")],
                }
            )
            await send({"type": "http.response.body", "body": body})


def create_app(
    backend: Backend,
    token: str | None = None,
    limits: ServerLimits | None = None,
    num_docs: int | None = None,
    inline_max_queries: int = 8,
) -> FastAPI:
    """A FastAPI app serving `backend`; `token` turns on bearer auth for the search endpoints."""
    limits = limits or ServerLimits()
    expected_auth = f"Bearer {token}".encode() if token else None
    if num_docs is None:
        num_docs = len(backend) if hasattr(backend, "__len__") else None  # type: ignore[arg-type]
    app = FastAPI(
        title="searchrl search service",
        version="1",
        description="Search-R1 /retrieve and FlashRAG /batch_search over a searchrl index.",
    )
    app.state.backend = backend
    app.state.limits = limits

    async def read_body(request: Request) -> dict[str, Any]:
        if expected_auth is not None:
            given = request.headers.get("authorization", "").encode()
            if not hmac.compare_digest(given, expected_auth):
                raise BadRequest("missing or wrong bearer token; send 'Authorization: Bearer <token>'", 401)
        declared = request.headers.get("content-length")
        if declared is not None and declared.isdigit() and int(declared) > limits.max_body_bytes:
            raise BadRequest(
                f"request body of {declared} bytes exceeds the {limits.max_body_bytes}-byte limit", 413
            )
        raw = await request.body()
        if len(raw) > limits.max_body_bytes:
            raise BadRequest(
                f"request body of {len(raw)} bytes exceeds the {limits.max_body_bytes}-byte limit", 413
            )
        return _parse_object(raw)

    inline_ok = bool(getattr(backend, "fast_inline", False))
    enforces_acl = backend_takes_principals(backend)

    async def run_search(queries: list[str], k: int, principal: str | None = None) -> list[list[Hit]]:
        # The backend is synchronous (numba, faiss, torch); a long batch runs off the event loop so
        # /health and new connections stay responsive. A few queries on a backend that answers in
        # well under a millisecond (BM25) run inline: the thread hop would cost more than the search.
        if principal is not None and not enforces_acl:
            raise BadRequest("this server's backend does not enforce document ACLs; send no 'principal'")
        principals = None if principal is None else [principal] * len(queries)
        if inline_ok and len(queries) <= inline_max_queries:
            return search_as(backend, queries, k, principals)
        return await run_in_threadpool(search_as, backend, queries, k, principals)

    @app.exception_handler(BadRequest)
    async def _bad_request(_: Request, exc: BadRequest) -> Response:
        headers = {"WWW-Authenticate": "Bearer"} if exc.status == 401 else None
        resp = _error(exc.status, str(exc))
        if headers:
            resp.headers.update(headers)
        return resp

    @app.exception_handler(SearchError)
    async def _search_error(_: Request, exc: SearchError) -> Response:
        # 503 tells clients to retry; a wrapped backend's own "bad request" or a replay-cache miss
        # will fail the same way again, so those are 422.
        status = 422 if exc.kind in ("bad_request", "cache_miss") else 503
        return _error(status, f"search backend failed ({exc.kind}): {exc}")

    @app.exception_handler(RequestValidationError)
    async def _validation(_: Request, exc: RequestValidationError) -> Response:
        return _error(422, f"invalid request: {exc.errors()}")

    @app.exception_handler(StarletteHTTPException)
    async def _http(_: Request, exc: StarletteHTTPException) -> Response:
        return _error(exc.status_code, str(exc.detail))

    @app.get("/health")
    async def health() -> Response:
        return _json_response(
            {
                "status": "ok",
                "fingerprint": backend.fingerprint,
                "num_docs": num_docs,
                "limits": asdict(limits),
                "principals": enforces_acl,
                "pid": os.getpid(),
                "memory": process_memory(),
            }
        )

    @app.post("/retrieve", openapi_extra=_body_spec(_RETRIEVE_SCHEMA))
    async def retrieve(request: Request) -> Response:
        body = await read_body(request)
        queries, k, with_scores = parse_retrieve(body, limits)
        results = await run_search(queries, k, check_request_principal(body))
        if with_scores:
            payload = [[{"document": document_dict(h), "score": h.score} for h in hits] for hits in results]
        else:
            payload = [[document_dict(h) for h in hits] for hits in results]
        return _json_response({"result": payload})

    async def flashrag(request: Request, batch: bool) -> Response:
        body = await read_body(request)
        queries, k, with_scores = parse_flashrag(body, limits, batch)
        results = await run_search(queries, k, check_request_principal(body))
        docs = [[document_dict(h) for h in hits] for hits in results]
        scores = [[h.score for h in hits] for hits in results]
        if not batch:
            docs, scores = docs[0], scores[0]
        return _json_response([docs, scores] if with_scores else docs)

    @app.post("/batch_search", openapi_extra=_body_spec(_FLASHRAG_SCHEMA))
    async def batch_search(request: Request) -> Response:
        return await flashrag(request, batch=True)

    @app.post("/search", openapi_extra=_body_spec(_FLASHRAG_SCHEMA))
    async def search_one(request: Request) -> Response:
        return await flashrag(request, batch=False)

    app.add_middleware(_CatchAll)
    return app


# --- running it ---------------------------------------------------------------------------------

_ENV_INDEX = "SEARCHRL_SERVE_INDEX"
_ENV_TOKEN = "SEARCHRL_SERVE_TOKEN"
_ENV_LIMITS = "SEARCHRL_SERVE_LIMITS"


def app_from_env() -> FastAPI:
    """App factory for uvicorn's multi-worker mode: each worker process opens the index itself."""
    from searchrl.search.index import load_index, read_meta  # bm25s and numba: in the worker process

    index_dir = os.environ[_ENV_INDEX]
    limits = ServerLimits(**json.loads(os.environ.get(_ENV_LIMITS, "{}")))
    backend = load_index(index_dir)
    # One search before accepting connections: numba compiles the BM25 scorer on first use (seconds),
    # and that cost belongs to start-up, not to the first client's read timeout. /health answering
    # therefore means ready to search at full speed.
    warm_up = getattr(backend, "warm_up", None)
    if warm_up is not None:
        warm_up()
    return create_app(
        backend,
        token=os.environ.get(_ENV_TOKEN) or None,
        limits=limits,
        num_docs=read_meta(index_dir)["num_docs"],
    )


def serve(
    index_dir: str,
    host: str = "127.0.0.1",
    port: int = 8000,
    token: str | None = None,
    workers: int = 1,
    limits: ServerLimits | None = None,
    log_level: str = "warning",
) -> None:
    """Serve an index directory with uvicorn until interrupted."""
    import uvicorn

    from searchrl.search.index import read_meta  # bm25s and numba: when the server starts

    read_meta(index_dir)  # fail here, clearly, rather than inside every worker
    if workers < 1:
        raise ValueError(f"workers must be >= 1, got {workers}")
    # The token travels by environment, not argv, so it does not show in `ps`.
    os.environ[_ENV_INDEX] = str(index_dir)
    os.environ[_ENV_LIMITS] = json.dumps(asdict(limits or ServerLimits()))
    if token:
        os.environ[_ENV_TOKEN] = token
    else:
        os.environ.pop(_ENV_TOKEN, None)
    uvicorn.run(
        "searchrl.search.server:app_from_env",
        factory=True,
        host=host,
        port=port,
        workers=workers,
        log_level=log_level,
        access_log=False,
        # The same event loop and HTTP parser whatever extras are installed (trackio pulls uvloop and
        # httptools in through uvicorn[standard]): the load figures in docs/search.md were measured so.
        loop="asyncio",
        http="h11",
    )


def main(argv: list[str] | None = None) -> None:
    """`python -m searchrl.search.server --index DIR [--port P]` (the CLI's `searchrl serve` is the same)."""
    p = argparse.ArgumentParser(description="Serve a searchrl index over HTTP (Search-R1 /retrieve).")
    p.add_argument("--index", required=True, help="index directory built by `searchrl index`")
    p.add_argument("--host", default="127.0.0.1", help="bind address (default 127.0.0.1: local only)")
    p.add_argument("--port", type=int, default=8000, help="TCP port")
    p.add_argument(
        "--token", default=os.environ.get(_ENV_TOKEN), help="require 'Authorization: Bearer TOKEN'"
    )
    p.add_argument("--workers", type=int, default=1, help="uvicorn worker processes")
    d = ServerLimits()
    p.add_argument("--max-queries", type=int, default=d.max_queries, help="queries per request")
    p.add_argument("--max-query-chars", type=int, default=d.max_query_chars, help="characters per query")
    p.add_argument("--max-topk", type=int, default=d.max_topk, help="largest topk")
    p.add_argument("--default-topk", type=int, default=d.default_topk, help="topk when not given")
    a = p.parse_args(argv)
    limits = ServerLimits(a.max_queries, a.max_query_chars, a.max_topk, a.default_topk)
    serve(a.index, host=a.host, port=a.port, token=a.token, workers=a.workers, limits=limits)


if __name__ == "__main__":
    main()
