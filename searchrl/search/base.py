"""The search contract every backend speaks: a batch of queries in, a ranked list of hits per query out.

Backends (BM25, dense, HTTP client, cache, fault injection) all satisfy `Backend`, so the environment
and the rollout engine never know which one they talk to. Errors are typed so the environment can turn
each kind into an observation the policy can learn from (never a crash).

Who may read what (`searchrl.search.acl`): `search` takes an optional `principals`, one principal id (or
None) per query, so one backend serves many users in one batch; each query gets the best k documents its
principal may read, filtered before the top-k cut, and None reads public documents only. `search_as` is how
callers pass principals: it calls `search(queries, k)` exactly as before when no query has one, so a backend
that knows nothing of principals still serves public search, and refuses (a `TypeError`, which the
environment reports as a failed search) a principal it cannot enforce.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Protocol, runtime_checkable


@dataclass(frozen=True)
class Hit:
    """One retrieved document: its id, the backend's score, and its title and text."""

    doc_id: str
    score: float
    title: str
    text: str

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_dict(cls, d: dict) -> Hit:
        return cls(
            doc_id=str(d["doc_id"]), score=float(d["score"]), title=str(d["title"]), text=str(d["text"])
        )


_new_object = object.__new__


def make_hit(doc_id: str, score: float, title: str, text: str) -> Hit:
    """Build a Hit without the frozen-dataclass `__init__` (about 40% cheaper per hit).

    Backends build tens of thousands of hits per second, and the frozen `__init__`'s four
    `object.__setattr__` calls are a measurable share of BM25's time. The result is an ordinary,
    equal-comparing, immutable Hit; only trusted backend code with already-typed values uses this.
    """
    hit = _new_object(Hit)
    hit.__dict__.update(doc_id=doc_id, score=score, title=title, text=text)
    return hit


@runtime_checkable
class Backend(Protocol):
    """A search engine. `search` takes the whole batch so a backend can vectorise or send one request."""

    def search(self, queries: list[str], k: int) -> list[list[Hit]]:
        """Return, for each query in order, at most `k` hits ranked best first.

        A backend that enforces document ACLs also takes `principals: Sequence[str | None] | None = None`
        (one per query; see the module docstring and `search_as`)."""
        ...

    @property
    def fingerprint(self) -> str:
        """A stable id of what answers: corpus hash + backend + parameters (keys the cache)."""
        ...


def search_as(
    backend: Backend, queries: list[str], k: int, principals: Sequence[str | None] | None = None
) -> list[list[Hit]]:
    """`backend.search` for queries made on behalf of `principals` (one per query; None: public only).

    Without any principal this is the plain `search(queries, k)` call; with one it passes `principals=`, which
    a backend that cannot enforce ACLs refuses (`TypeError`) rather than answering with every document."""
    if principals is None or all(p is None for p in principals):
        return backend.search(queries, k)
    return backend.search(queries, k, principals=list(principals))  # type: ignore[call-arg]


class SearchError(Exception):
    """Base class of every search failure the environment turns into an observation."""

    kind = "error"


class SearchTimeout(SearchError):
    """The backend did not answer within the deadline."""

    kind = "timeout"


class SearchUnavailable(SearchError):
    """The backend cannot be reached (refused connection, 5xx after retries, circuit open)."""

    kind = "unavailable"


class BadSearchRequest(SearchError):
    """The request itself is wrong (4xx): retrying the same request cannot help."""

    kind = "bad_request"
