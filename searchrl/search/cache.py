"""A SQLite result cache that can freeze any backend into a reproducible snapshot.

Keys are sha256(backend fingerprint, normalised query, k, principal), so a cache file can hold several
indexes and never answers a query with another index's results, nor one principal's query with what another
principal may read (a query without a principal keeps the key it had before principals existed: public
documents only). Modes:

* ``off``: pass through (still de-duplicates identical queries within a batch);
* ``read_write``: answer hits from the cache, search misses and store them;
* ``replay``: answer only from the cache, never call the backend; a miss raises `CacheMiss`. A
  training run in replay mode sees exactly the results recorded earlier, even if the live backend
  (a remote wiki-18 server, a web API) has changed or is gone.

Normalisation is NFKC + collapsed white space + strip, and the *normalised* query is what the backend
is sent, so two spellings that share a key are guaranteed to share results. Case is kept: some
backends are case-sensitive and the cache must never change what a backend would have answered.
"""

from __future__ import annotations

import hashlib
import json
import os
import sqlite3
import threading
import unicodedata
from collections.abc import Sequence
from pathlib import Path

from searchrl.search.acl import check_principals
from searchrl.search.base import Backend, Hit, SearchError, search_as

CACHE_MODES = ("off", "read_write", "replay")


class CacheMiss(SearchError):
    """Replay mode was asked a query the snapshot does not hold."""

    kind = "cache_miss"


def normalize_query(query: str) -> str:
    """NFKC, every run of white space turned into one space, and no leading/trailing space."""
    return " ".join(unicodedata.normalize("NFKC", query).split())


def cache_key(fingerprint: str, query: str, k: int, principal: str | None = None) -> str:
    """The row key of one query; a principal's queries never share a key with another's or public ones."""
    parts: list[object] = [fingerprint, normalize_query(query), int(k)]
    if principal is not None:
        parts.append({"principal": principal})
    payload = json.dumps(parts, ensure_ascii=False)
    return hashlib.sha256(payload.encode("utf-8")).hexdigest()


_SCHEMA = """
CREATE TABLE IF NOT EXISTS results (
    key TEXT PRIMARY KEY,
    fingerprint TEXT NOT NULL,
    query TEXT NOT NULL,
    k INTEGER NOT NULL,
    hits TEXT NOT NULL
);
"""


class CachedBackend:
    """A `Backend` in front of another one (which may be None in replay mode)."""

    def __init__(
        self,
        backend: Backend | None,
        path: str | os.PathLike,
        mode: str = "read_write",
        fingerprint: str | None = None,
    ):
        if mode not in CACHE_MODES:
            raise ValueError(f"cache mode {mode!r} is unknown; choose one of {', '.join(CACHE_MODES)}")
        if backend is None and mode != "replay":
            raise ValueError(f"cache mode {mode!r} needs a backend; only 'replay' works without one")
        self.backend = backend
        self.mode = mode
        self.path = Path(path)
        self._lock = threading.Lock()
        self.stats = {"hits": 0, "misses": 0, "backend_queries": 0, "deduplicated": 0}
        self._conn = self._open()
        self._fingerprint = fingerprint or (
            backend.fingerprint if backend is not None else self._only_fingerprint()
        )

    def _open(self) -> sqlite3.Connection | None:
        if self.mode == "off":
            return None
        if self.mode == "replay":
            if not self.path.exists():
                raise FileNotFoundError(
                    f"{self.path}: replay cache not found; record one with mode='read_write'"
                )
            # Read-only: a replay run must not be able to change its own snapshot.
            conn = sqlite3.connect(f"file:{self.path}?mode=ro", uri=True, check_same_thread=False)
        else:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            conn = sqlite3.connect(str(self.path), check_same_thread=False)
            conn.execute("PRAGMA journal_mode=WAL")
            conn.executescript(_SCHEMA)
            conn.commit()
        return conn

    def _only_fingerprint(self) -> str:
        assert self._conn is not None
        rows = self._conn.execute("SELECT DISTINCT fingerprint FROM results LIMIT 2").fetchall()
        if len(rows) != 1:
            raise ValueError(
                f"{self.path}: holds {'no' if not rows else 'several'} index fingerprints; pass "
                f"fingerprint=... to say which snapshot to replay"
            )
        return rows[0][0]

    @property
    def fingerprint(self) -> str:
        return self._fingerprint

    def close(self) -> None:
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """Each query's hits for its principal (None: public only), from the snapshot or the backend."""
        owners = check_principals(principals, len(queries))
        requests = [(normalize_query(q), p) for q, p in zip(queries, owners, strict=True)]
        unique = list(dict.fromkeys(requests))
        self.stats["deduplicated"] += len(requests) - len(unique)
        found = self._lookup(unique, k)
        missing = [r for r in unique if r not in found]
        if missing:
            found.update(self._fill(missing, k))
        return [list(found[r]) for r in requests]

    def _lookup(
        self, unique: list[tuple[str, str | None]], k: int
    ) -> dict[tuple[str, str | None], list[Hit]]:
        if self._conn is None:
            return {}
        keys = {cache_key(self._fingerprint, q, k, p): (q, p) for q, p in unique}
        found: dict[tuple[str, str | None], list[Hit]] = {}
        with self._lock:
            key_list = list(keys)
            # SQLite's parameter limit is 32766 in modern builds; chunk well under it.
            for start in range(0, len(key_list), 500):
                chunk = key_list[start : start + 500]
                marks = ",".join("?" * len(chunk))
                for key, hits in self._conn.execute(
                    f"SELECT key, hits FROM results WHERE key IN ({marks})", chunk
                ):
                    found[keys[key]] = [Hit.from_dict(h) for h in json.loads(hits)]
        self.stats["hits"] += len(found)
        self.stats["misses"] += len(unique) - len(found)
        return found

    def _fill(self, missing: list[tuple[str, str | None]], k: int) -> dict[tuple[str, str | None], list[Hit]]:
        if self.mode == "replay":
            shown = ", ".join(repr(q) for q, _ in missing[:3])
            raise CacheMiss(
                f"replay cache {self.path} has no result for {len(missing)} quer"
                f"{'y' if len(missing) == 1 else 'ies'} at k={k} (e.g. {shown}); record them with "
                f"mode='read_write' first"
            )
        assert self.backend is not None
        results = search_as(self.backend, [q for q, _ in missing], k, [p for _, p in missing])
        self.stats["backend_queries"] += len(missing)
        if self._conn is not None:
            rows = [
                (
                    cache_key(self._fingerprint, q, k, p),
                    self._fingerprint,
                    q,
                    k,
                    json.dumps([h.to_dict() for h in hits]),
                )
                for (q, p), hits in zip(missing, results, strict=True)
            ]
            with self._lock:
                self._conn.executemany("INSERT OR REPLACE INTO results VALUES (?, ?, ?, ?, ?)", rows)
                self._conn.commit()
        return dict(zip(missing, results, strict=True))
