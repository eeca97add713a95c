"""Seeded fault injection around any backend, for tests and for robustness training.

A real search service is slow sometimes, times out, fails, and returns partial or reordered results.
`FaultInjectingBackend` reproduces each of those at a given rate, drawn from its own seeded RNG, so a
run with faults is as reproducible as one without: the same seed and the same sequence of calls give
the same faults. Per call (one batch) it may add latency, time out or fail; per query it may drop
results or shuffle them. `counters` says how many of each were injected.

`FindsNothing` is the extreme case, a backend on its own: every query finds no document. The closed-book
evaluations of both demos search with it, so the policy answers from what it knows without reading.
"""

from __future__ import annotations

import random
import threading
import time
from collections.abc import Sequence

from searchrl.search.base import Backend, Hit, SearchTimeout, SearchUnavailable, search_as


def _check_rate(name: str, value: float) -> float:
    if not 0.0 <= value <= 1.0:
        raise ValueError(f"{name} must be a probability in [0, 1], got {value}")
    return float(value)


class FaultInjectingBackend:
    """A `Backend` that perturbs another backend's answers at seeded rates."""

    def __init__(
        self,
        backend: Backend,
        seed: int = 0,
        latency_ms: float = 0.0,
        latency_jitter_ms: float = 0.0,
        timeout_rate: float = 0.0,
        error_rate: float = 0.0,
        drop_rate: float = 0.0,
        shuffle_rate: float = 0.0,
        timeout_s: float = 0.0,
    ):
        if latency_ms < 0 or latency_jitter_ms < 0 or timeout_s < 0:
            raise ValueError("latency_ms, latency_jitter_ms and timeout_s must be >= 0")
        self.backend = backend
        self.seed = seed
        self.latency_ms = float(latency_ms)
        self.latency_jitter_ms = float(latency_jitter_ms)
        self.timeout_rate = _check_rate("timeout_rate", timeout_rate)
        self.error_rate = _check_rate("error_rate", error_rate)
        self.drop_rate = _check_rate("drop_rate", drop_rate)
        self.shuffle_rate = _check_rate("shuffle_rate", shuffle_rate)
        # How long an injected timeout waits before raising, like a client that waited for nothing.
        self.timeout_s = float(timeout_s)
        self._rng = random.Random(seed)
        self._lock = threading.Lock()
        self.counters = {
            "calls": 0,
            "timeouts": 0,
            "errors": 0,
            "dropped": 0,
            "shuffled": 0,
            "delayed_ms": 0.0,
        }

    @property
    def fingerprint(self) -> str:
        # Faults do not change what a successful answer contains in identity terms: cache under the
        # wrapped backend's fingerprint (drops/shuffles are meant to be seen, not cached, in tests).
        return self.backend.fingerprint

    def _draw_call_faults(self, n_queries: int) -> tuple[float, str | None, list[tuple[bool, bool, int]]]:
        # All random draws for one call happen under the lock, in a fixed order, so the fault
        # sequence depends only on the seed and the call order, not on thread timing.
        with self._lock:
            rng = self._rng
            delay = self.latency_ms + (
                rng.uniform(0, self.latency_jitter_ms) if self.latency_jitter_ms else 0.0
            )
            fault = None
            u = rng.random()
            if u < self.timeout_rate:
                fault = "timeout"
            elif u < self.timeout_rate + self.error_rate:
                fault = "error"
            per_query = [
                (rng.random() < self.drop_rate, rng.random() < self.shuffle_rate, rng.randrange(2**31))
                for _ in range(n_queries)
            ]
            self.counters["calls"] += 1
            self.counters["delayed_ms"] += delay
        return delay, fault, per_query

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """The wrapped backend's answer (for each query's principal), perturbed at the seeded rates."""
        delay_ms, fault, per_query = self._draw_call_faults(len(queries))
        if delay_ms:
            time.sleep(delay_ms / 1000.0)
        if fault == "timeout":
            # Counted when injected, not after the hang: a caller that gave up at its deadline may
            # read the counters while this thread still sleeps.
            self._count("timeouts")
            if self.timeout_s:
                time.sleep(self.timeout_s)
            raise SearchTimeout(f"injected timeout (fault injection, seed {self.seed})")
        if fault == "error":
            self._count("errors")
            raise SearchUnavailable(f"injected backend error (fault injection, seed {self.seed})")
        results = search_as(self.backend, queries, k, principals)
        return [
            self._perturb(hits, drop, shuffle, sub_seed)
            for hits, (drop, shuffle, sub_seed) in zip(results, per_query, strict=True)
        ]

    def _perturb(self, hits: list[Hit], drop: bool, shuffle: bool, sub_seed: int) -> list[Hit]:
        hits = list(hits)
        if drop and hits:
            # Dropping keeps a random subset in rank order: anywhere from none to all but one hit.
            rng = random.Random(sub_seed)
            keep = rng.randrange(len(hits))
            hits = sorted(rng.sample(hits, keep), key=hits.index)
            self._count("dropped")
        if shuffle and len(hits) > 1:
            random.Random(sub_seed ^ 0x5EED).shuffle(hits)
            self._count("shuffled")
        return hits

    def _count(self, name: str) -> None:
        with self._lock:
            self.counters[name] += 1


class FindsNothing:
    """A `Backend` that returns no document for any query: the closed-book evaluation (what the policy knows
    alone, through the same environment, prompt and protocol as every other evaluation)."""

    fingerprint = "finds-nothing"

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        return [[] for _ in queries]
