"""HTTP client backend: train against a search service that is already running somewhere.

Speaks three wire formats, so an existing wiki-18 retrieval server can be used as is:

* ``search_r1`` (default): ``POST /retrieve {"queries", "topk", "return_scores"}`` — Search-R1, verl's
  SearchTool servers, ASearcher, and `searchrl serve`;
* ``flashrag``: ``POST /batch_search {"query": [...], "top_n", "return_score"}`` — FlashRAG / ReSearch;
* ``skyrl``: ``POST /retrieve {"query": str, "topk", "return_scores"}`` — SkyRL's one-query server,
  which necessarily costs one request per query.

Every batch is one request (except skyrl). Failures are typed: a 4xx is `BadSearchRequest` and is
never retried (the same request would fail again); a refused connection, a timeout, a dropped
connection or a 5xx is transient and retried with exponential backoff and jitter, then becomes
`SearchTimeout` (if the last failure was a timeout) or `SearchUnavailable`. A call never takes longer
than `deadline_s` = attempts x (connect + read timeout) + the largest possible backoff total.

Principals (`searchrl.search.acl`): `search(queries, k, principals=[...])` sends each distinct principal's
queries in their own request with ``"principal": "<id>"`` beside the wire format's fields (a query without one
is sent without the field: public documents only). Before the first principal goes out, the client checks that
the server says ``"principals": true`` on `/health`: a server that would ignore the field (Search-R1's own,
an older searchrl) is refused with `BadSearchRequest` instead of answering with every document.

`AsyncHTTPBackend` adds `asearch` / `asearch_many` coroutines with the same semantics and a concurrency
limit, for callers that keep many batches in flight against one shared service.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
import threading
import time
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import httpx

from searchrl.search.acl import check_principals, group_by_principal
from searchrl.search.base import (
    BadSearchRequest,
    Hit,
    SearchError,
    SearchTimeout,
    SearchUnavailable,
    make_hit,
)
from searchrl.search.corpus import split_search_r1_contents

_RETRY = object()  # `_answer`'s mark for a transient (5xx) answer

PROTOCOL_PATHS = {"search_r1": "/retrieve", "flashrag": "/batch_search", "skyrl": "/retrieve"}


def _hit_from_document(doc: Any, score: Any, where: str) -> Hit:
    if not isinstance(doc, dict):
        raise SearchUnavailable(f"{where}: expected a document object, got {type(doc).__name__}")
    doc_id = doc.get("id", doc.get("doc_id", ""))
    title, text = doc.get("title"), doc.get("text")
    if isinstance(title, str) and isinstance(text, str):
        pass  # searchrl servers send both; no need to re-parse `contents`
    else:
        title, text = split_search_r1_contents(str(doc.get("contents", doc.get("text", ""))))
    try:
        value = float(score) if score is not None else 0.0
    except (TypeError, ValueError):
        raise SearchUnavailable(f"{where}: score {score!r} is not a number") from None
    return make_hit(str(doc_id), value, title, text)


def _parse_search_r1_lists(lists: Any, where: str) -> list[list[Hit]]:
    if not isinstance(lists, list) or not all(isinstance(x, list) for x in lists):
        raise SearchUnavailable(f"{where}: 'result' must be a list of lists")
    out = []
    for hits in lists:
        row = []
        for item in hits:
            if isinstance(item, dict) and "document" in item:
                row.append(_hit_from_document(item["document"], item.get("score"), where))
            else:
                row.append(_hit_from_document(item, None, where))
        out.append(row)
    return out


class HTTPBackend:
    """A `Backend` that sends each batch to a retrieval server over HTTP."""

    def __init__(
        self,
        url: str,
        protocol: str = "search_r1",
        connect_timeout: float = 2.0,
        read_timeout: float = 30.0,
        max_retries: int = 3,
        backoff_base: float = 0.2,
        backoff_max: float = 5.0,
        token: str | None = None,
        seed: int | None = None,
        fingerprint: str | None = None,
    ):
        if protocol not in PROTOCOL_PATHS:
            raise ValueError(f"unknown protocol {protocol!r}; choose one of {', '.join(PROTOCOL_PATHS)}")
        if connect_timeout <= 0 or read_timeout <= 0:
            raise ValueError("connect_timeout and read_timeout must be > 0 seconds")
        if max_retries < 0 or backoff_base < 0 or backoff_max < 0:
            raise ValueError("max_retries, backoff_base and backoff_max must be >= 0")
        self.protocol = protocol
        self.base_url, self.endpoint = self._split_url(url, protocol)
        self.connect_timeout = connect_timeout
        self.read_timeout = read_timeout
        self.max_retries = max_retries
        self.backoff_base = backoff_base
        self.backoff_max = backoff_max
        self._rng = random.Random(seed)
        self._rng_lock = threading.Lock()
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._client = httpx.Client(headers=headers, timeout=self._timeout(read_timeout))
        # Pass `fingerprint` to pin the cache key; otherwise it is read from the server's /health.
        self._fingerprint: str | None = fingerprint
        self._enforces_acl: bool | None = None  # read from /health before the first principal is sent
        self.stats = {"requests": 0, "retries": 0, "failures": 0}

    @staticmethod
    def _split_url(url: str, protocol: str) -> tuple[str, str]:
        """Accept a base URL (`http://h:p`) or a full endpoint URL (`http://h:p/retrieve`)."""
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError(f"search URL {url!r} must look like http://HOST:PORT[/path]")
        path = parts.path.rstrip("/")
        base = urlunsplit((parts.scheme, parts.netloc, "", "", ""))
        if path.endswith(("/retrieve", "/batch_search")):
            prefix, _, last = path.rpartition("/")
            return base + prefix, f"/{last}"
        return base + path, PROTOCOL_PATHS[protocol]

    def _timeout(self, read: float) -> httpx.Timeout:
        return httpx.Timeout(connect=self.connect_timeout, read=read, write=read, pool=self.connect_timeout)

    @property
    def attempts(self) -> int:
        return 1 + self.max_retries

    @property
    def deadline_s(self) -> float:
        """The longest one request (with all its retries) may take."""
        backoff_total = sum(self._backoff_cap(i) for i in range(self.max_retries))
        return self.attempts * (self.connect_timeout + self.read_timeout) + backoff_total

    def _backoff_cap(self, retry: int) -> float:
        return min(self.backoff_max, self.backoff_base * (2**retry))

    def _backoff(self, retry: int) -> float:
        # "Equal jitter": half the exponential step is fixed, half random, so retries from many
        # clients that failed together spread out instead of hammering the server in lockstep.
        cap = self._backoff_cap(retry)
        with self._rng_lock:
            return cap / 2 + self._rng.uniform(0, cap / 2)

    @property
    def fingerprint(self) -> str:
        """The server's index fingerprint from /health when it offers one, else one derived from the URL."""
        if self._fingerprint is None:
            fp = None
            try:
                r = self._client.get(
                    self.base_url + "/health", timeout=self._timeout(min(self.read_timeout, 5.0))
                )
                if r.status_code == 200:
                    body = r.json()
                    fp = body.get("fingerprint") if isinstance(body, dict) else None
            except (httpx.HTTPError, ValueError):
                fp = None
            if not fp:
                fp = (
                    "http-"
                    + hashlib.sha256(f"{self.base_url}{self.endpoint}|{self.protocol}".encode()).hexdigest()
                )
            self._fingerprint = str(fp)
        return self._fingerprint

    def close(self) -> None:
        self._client.close()

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """Each query's hits for its principal (None: public only); one request per distinct principal."""
        if k < 1:
            raise BadSearchRequest(f"k must be >= 1, got {k}")
        groups = self._principal_groups(queries, principals)
        out: list[list[Hit]] = [[] for _ in queries]
        for principal, positions in groups.items():
            batch = [queries[i] for i in positions]
            bodies = self._bodies(batch, k, principal)
            for i, hits in zip(
                positions, self._hits((self._post(b) for b in bodies), len(batch)), strict=True
            ):
                out[i] = hits
        return out

    def _principal_groups(
        self, queries: list[str], principals: Sequence[str | None] | None
    ) -> dict[str | None, list[int]]:
        """Query positions by principal, after checking each id and that the server enforces ACLs."""
        try:
            owners = check_principals(principals, len(queries))
        except ValueError as e:
            raise BadSearchRequest(str(e)) from None
        groups = group_by_principal(owners)
        if any(p is not None for p in groups) and not self.enforces_acl:
            raise BadSearchRequest(
                f"{self.base_url} does not say it enforces document ACLs (its /health has no "
                "'principals': true); refusing to send a principal's query to a server that may ignore it"
            )
        return groups

    @property
    def enforces_acl(self) -> bool:
        """Does the server say (GET /health: ``"principals": true``) that it filters by principal?"""
        if self._enforces_acl is None:
            try:
                r = self._client.get(
                    self.base_url + "/health", timeout=self._timeout(min(self.read_timeout, 5.0))
                )
                body = r.json() if r.status_code == 200 else {}
            except (httpx.HTTPError, ValueError):
                raise SearchUnavailable(
                    f"{self.base_url}/health: no answer; cannot check ACL support"
                ) from None
            self._enforces_acl = isinstance(body, dict) and body.get("principals") is True
        return self._enforces_acl

    def _bodies(self, queries: list[str], k: int, principal: str | None = None) -> list[dict[str, Any]]:
        """The request bodies of one batch: one per query in the skyrl format, else one for the whole batch;
        each with the `principal` field when the batch is made for one."""
        if self.protocol == "skyrl":
            bodies = [{"query": q, "topk": k, "return_scores": True} for q in queries]
        elif self.protocol == "flashrag":
            bodies = [{"query": queries, "top_n": k, "return_score": True}]
        else:
            bodies = [{"queries": queries, "topk": k, "return_scores": True}]
        if principal is not None:
            for body in bodies:
                body["principal"] = principal
        return bodies

    def _hits(self, answers: Iterable[Any], n_queries: int) -> list[list[Hit]]:
        """The hits of each query from the answers to `_bodies`' requests, read one by one as they come."""
        if self.protocol == "skyrl":
            return [self._parse(answer, 1)[0] for answer in answers]
        return self._parse(next(iter(answers)), n_queries)

    def _post(self, body: dict[str, Any]) -> Any:
        url = self.base_url + self.endpoint
        deadline = time.monotonic() + self.deadline_s
        last: Exception | None = None
        timed_out = False
        for attempt in range(self.attempts):
            if attempt:
                pause = min(self._backoff(attempt - 1), max(0.0, deadline - time.monotonic()))
                time.sleep(pause)
                self.stats["retries"] += 1
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            self.stats["requests"] += 1
            try:
                r = self._client.post(
                    url, json=body, timeout=self._timeout(min(self.read_timeout, remaining))
                )
            except httpx.TimeoutException as e:
                last, timed_out = e, True
                continue
            except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                # Refused connection, reset, or a server that died mid-response.
                last, timed_out = e, False
                continue
            answer = self._answer(url, r)
            if answer is _RETRY:
                last, timed_out = RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}"), False
                continue
            return answer
        raise self._exhausted(url, last, timed_out)

    def _answer(self, url: str, r: httpx.Response) -> Any:
        """The JSON of a final answer; `_RETRY` for a 5xx; a 4xx or a non-JSON body raises (never retried)."""
        if r.status_code >= 500:
            return _RETRY
        if r.status_code >= 400:
            self.stats["failures"] += 1
            raise BadSearchRequest(f"{url} rejected the request with HTTP {r.status_code}: {r.text[:500]}")
        try:
            return r.json()
        except ValueError:
            self.stats["failures"] += 1
            raise SearchUnavailable(
                f"{url} answered HTTP {r.status_code} with a body that is not JSON"
            ) from None

    def _exhausted(self, url: str, last: Exception | None, timed_out: bool) -> SearchError:
        """The error for a call whose retry budget or deadline ran out."""
        self.stats["failures"] += 1
        detail = f"{type(last).__name__}: {last}" if last else "deadline reached"
        msg = f"{url}: no answer after {self._attempts_message()} ({detail})"
        return SearchTimeout(msg) if timed_out else SearchUnavailable(msg)

    def _attempts_message(self) -> str:
        return f"{self.attempts} attempt(s) within {self.deadline_s:.1f} s"

    def _parse(self, data: Any, n_queries: int) -> list[list[Hit]]:
        where = f"{self.base_url}{self.endpoint} ({self.protocol} format)"
        if self.protocol == "flashrag":
            if not (isinstance(data, list) and len(data) == 2 and isinstance(data[0], list)):
                raise SearchUnavailable(f"{where}: expected [documents, scores]")
            docs, scores = data
            if len(docs) != len(scores):
                raise SearchUnavailable(f"{where}: {len(docs)} document lists but {len(scores)} score lists")
            hits = []
            for row_docs, row_scores in zip(docs, scores, strict=True):
                if (
                    not isinstance(row_docs, list)
                    or not isinstance(row_scores, list)
                    or len(row_docs) != len(row_scores)
                ):
                    raise SearchUnavailable(
                        f"{where}: each query needs a list of documents and one of scores, equally long"
                    )
                hits.append(
                    [_hit_from_document(d, s, where) for d, s in zip(row_docs, row_scores, strict=True)]
                )
        else:
            if not isinstance(data, dict) or "result" not in data:
                raise SearchUnavailable(f"{where}: expected an object with 'result'")
            hits = _parse_search_r1_lists(data["result"], where)
        if len(hits) != n_queries:
            raise SearchUnavailable(f"{where}: sent {n_queries} queries but got {len(hits)} result lists")
        return hits


class AsyncHTTPBackend(HTTPBackend):
    """`HTTPBackend` with an `asearch` coroutine: many batches in flight, at most `max_concurrency` at once.

    Why: one search service on its own host serves many rollout workers; an asyncio caller (a vLLM-style
    rollout loop, an evaluation sweep) should keep several requests in flight without opening an
    unbounded number of connections. The limit is an `asyncio.Semaphore` held only while a request is on
    the wire, not during a retry's backoff pause, so a failing server does not block the healthy slots.

    Same semantics as the sync client: a 4xx is `BadSearchRequest` and never retried; refused or dropped
    connections, timeouts and 5xx are retried with jittered exponential backoff within `deadline_s`, then
    become `SearchTimeout` (last failure a timeout) or `SearchUnavailable`. The inherited sync `search`
    still works. `stats["max_in_flight"]` records the most requests that were on the wire together.
    """

    def __init__(self, url: str, max_concurrency: int = 8, **kwargs: Any):
        if not isinstance(max_concurrency, int) or max_concurrency < 1:
            raise ValueError(
                f"max_concurrency must be an int >= 1 (requests on the wire at once), got {max_concurrency!r}"
            )
        super().__init__(url, **kwargs)
        self.max_concurrency = max_concurrency
        self._headers = dict(self._client.headers)
        # Both bind to the running event loop on first use, so they are made lazily inside it.
        self._aclient: httpx.AsyncClient | None = None
        self._semaphore: asyncio.Semaphore | None = None
        self._in_flight = 0
        self.stats["max_in_flight"] = 0

    def _async_parts(self) -> tuple[httpx.AsyncClient, asyncio.Semaphore]:
        if self._aclient is None or self._semaphore is None:
            limits = httpx.Limits(max_connections=self.max_concurrency)
            self._aclient = httpx.AsyncClient(
                headers=self._headers, timeout=self._timeout(self.read_timeout), limits=limits
            )
            self._semaphore = asyncio.Semaphore(self.max_concurrency)
        return self._aclient, self._semaphore

    async def aclose(self) -> None:
        if self._aclient is not None:
            await self._aclient.aclose()
            self._aclient, self._semaphore = None, None
        self.close()

    async def asearch(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """The async twin of `search`: one request per batch and principal (per query for skyrl)."""
        if k < 1:
            raise BadSearchRequest(f"k must be >= 1, got {k}")
        if self._enforces_acl is None and principals is not None and any(p is not None for p in principals):
            await asyncio.to_thread(lambda: self.enforces_acl)  # the one blocking /health read, off the loop
        groups = self._principal_groups(queries, principals)
        out: list[list[Hit]] = [[] for _ in queries]
        for principal, positions in groups.items():
            batch = [queries[i] for i in positions]
            bodies = self._bodies(batch, k, principal)
            answers = await asyncio.gather(*(self._apost(body) for body in bodies))
            for i, hits in zip(positions, self._hits(answers, len(batch)), strict=True):
                out[i] = hits
        return out

    async def asearch_many(self, batches: list[list[str]], k: int) -> list[list[list[Hit]]]:
        """Several batches concurrently (bounded by `max_concurrency`), answers in the order given."""
        return list(await asyncio.gather(*(self.asearch(b, k) for b in batches)))

    async def _apost(self, body: dict[str, Any]) -> Any:
        client, semaphore = self._async_parts()
        url = self.base_url + self.endpoint
        deadline = time.monotonic() + self.deadline_s
        last: Exception | None = None
        timed_out = False
        for attempt in range(self.attempts):
            if attempt:
                pause = min(self._backoff(attempt - 1), max(0.0, deadline - time.monotonic()))
                await asyncio.sleep(pause)
                self.stats["retries"] += 1
            async with semaphore:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    break
                self.stats["requests"] += 1
                self._in_flight += 1
                self.stats["max_in_flight"] = max(self.stats["max_in_flight"], self._in_flight)
                try:
                    r = await client.post(
                        url, json=body, timeout=self._timeout(min(self.read_timeout, remaining))
                    )
                except httpx.TimeoutException as e:
                    last, timed_out = e, True
                    continue
                except (httpx.TransportError, httpx.RemoteProtocolError) as e:
                    last, timed_out = e, False
                    continue
                finally:
                    self._in_flight -= 1
            answer = self._answer(url, r)
            if answer is _RETRY:
                last, timed_out = RuntimeError(f"HTTP {r.status_code}: {r.text[:300]}"), False
                continue
            return answer
        raise self._exhausted(url, last, timed_out)
