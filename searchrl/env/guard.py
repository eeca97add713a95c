"""Call a search backend or a tool safely: a hard per-call deadline, bounded retries and a circuit breaker.

A backend may hang, refuse connections or fail for a while. The rollout must not hang with it and must
not hammer it, so every batched search the environment sends goes through a `BackendGuard`, and every call
of a user-defined tool through its tool's `ToolGuard` (the same `Breaker`, one per tool, each call its own
`Flight`):

- the backend runs in a daemon worker thread and the caller waits at most ``timeout_s``; a backend that
  ignores its own deadline cannot stall a rollout (its late answer is dropped);
- `SearchUnavailable` (transient: refused, 5xx after the client's own retries) is retried up to
  ``max_retries`` times inside the deadline, with exponential back-off; timeouts and bad requests are
  not retried (the deadline is spent; the same bad request fails again);
- after ``failure_threshold`` consecutive failed batches the circuit opens for ``reset_s`` seconds: calls
  get status ``circuit_open`` without touching the backend; then one trial batch is let through.

One guard per backend object is shared by every environment that uses it (`guard_for`), and one per tool
(`tool_guard_for`), so the breaker sees the failures of the whole batch of rollouts, not one episode's. For
a tool, `ToolUnavailable` is the transient failure that is retried; `ToolPermissionError` is an answer (status
``permission_denied``), not a failure of the tool.
"""

from __future__ import annotations

import logging
import threading
import time
import weakref
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from searchrl.env.tools import ToolPermissionError, ToolSpec, ToolUnavailable
from searchrl.search.base import (
    Backend,
    BadSearchRequest,
    Hit,
    SearchError,
    SearchTimeout,
    SearchUnavailable,
    search_as,
)

log = logging.getLogger(__name__)

# Statuses that count as the backend failing (a bad request is the caller's fault, not the backend's).
BACKEND_FAILURES = frozenset({"timeout", "unavailable", "error"})


@dataclass
class BatchOutcome:
    """What one batched search produced: hits per query on success, else a status and a message."""

    status: str
    hits: list[list[Hit]] | None = None
    error: str | None = None
    latency_ms: float = 0.0
    value: Any = None  # what a tool's executor returned (status "ok")


@dataclass
class GuardMetrics:
    """Counters for the training metrics (read them, don't write them)."""

    batches: int = 0
    backend_calls: int = 0
    failed_batches: int = 0
    retries: int = 0
    circuit_opened: int = 0
    circuit_rejected_batches: int = 0
    statuses: dict[str, int] = field(default_factory=dict)


class Breaker:
    """The circuit breaker and the retry loop every guard shares; `launch` starts one guarded call."""

    def __init__(self, failure_threshold: int = 3, reset_s: float = 30.0) -> None:
        if failure_threshold < 1:
            raise ValueError(f"failure_threshold must be >= 1, got {failure_threshold}")
        if reset_s < 0:
            raise ValueError(f"reset_s must be >= 0, got {reset_s}")
        self.failure_threshold = failure_threshold
        self.reset_s = reset_s
        self.metrics = GuardMetrics()
        self._lock = threading.Lock()
        self._consecutive_failures = 0
        self._opened_at: float | None = None

    # -- circuit breaker ---------------------------------------------------------------------------
    @property
    def circuit_open(self) -> bool:
        with self._lock:
            return self._is_open(time.monotonic())

    def _is_open(self, now: float) -> bool:
        return self._opened_at is not None and now - self._opened_at < self.reset_s

    def _record(self, status: str) -> None:
        with self._lock:
            self.metrics.statuses[status] = self.metrics.statuses.get(status, 0) + 1
            if status in BACKEND_FAILURES:
                self.metrics.failed_batches += 1
                self._consecutive_failures += 1
                if self._consecutive_failures >= self.failure_threshold:
                    # Opening again after a failed trial batch restarts the wait.
                    self._opened_at = time.monotonic()
                    self.metrics.circuit_opened += 1
            else:
                self._consecutive_failures = 0
                self._opened_at = None

    # -- execution ---------------------------------------------------------------------------------
    def launch(
        self,
        call: Callable[[], Any],
        check: Callable[[Any, float], BatchOutcome],
        on_error: Callable[[BaseException, float], BatchOutcome],
        timeout_s: float | None,
        max_retries: int = 0,
        backoff_s: float = 0.05,
        transient: tuple[type[BaseException], ...] = (SearchUnavailable,),
        what: str = "the search backend",
    ) -> Flight:
        """Start `call` in a worker thread (or refuse it while the circuit is open); `Flight.wait()` collects it
        within the deadline, `check` judging a result and `on_error` an exception."""
        with self._lock:
            self.metrics.batches += 1
            rejected = self._is_open(time.monotonic())
            if rejected:
                self.metrics.circuit_rejected_batches += 1
        if rejected:
            return Flight.finished(
                BatchOutcome(
                    status="circuit_open",
                    error=f"{what} failed {self.failure_threshold} times in a row and is paused "
                    f"for {self.reset_s:g} s",
                )
            )
        return Flight(self, call, check, on_error, timeout_s, max_retries, backoff_s, transient)

    def _call_with_retries(
        self,
        call: Callable[[], Any],
        max_retries: int,
        backoff_s: float,
        transient: tuple[type[BaseException], ...],
    ) -> Any:
        for attempt in range(max_retries + 1):
            with self._lock:
                self.metrics.backend_calls += 1
            try:
                return call()
            except transient:
                if attempt == max_retries:
                    raise
                with self._lock:
                    self.metrics.retries += 1
                time.sleep(backoff_s * (2**attempt))
        raise AssertionError("unreachable")


class BackendGuard(Breaker):
    """Wraps a `Backend` with a deadline, retries and a circuit breaker. Itself a `Backend`."""

    def __init__(self, backend: Backend, failure_threshold: int = 3, reset_s: float = 30.0) -> None:
        super().__init__(failure_threshold, reset_s)
        self.backend = backend

    # -- Backend protocol ------------------------------------------------------------------------
    @property
    def fingerprint(self) -> str:
        return str(getattr(self.backend, "fingerprint", type(self.backend).__name__))

    def search(
        self, queries: list[str], k: int, principals: Sequence[str | None] | None = None
    ) -> list[list[Hit]]:
        """Plain `Backend.search` through the breaker (no deadline); raises `SearchError` on failure."""
        outcome = self.run(queries, k, timeout_s=None, principals=principals)
        if outcome.status == "ok":
            assert outcome.hits is not None
            return outcome.hits
        error = {"timeout": SearchTimeout, "bad_request": BadSearchRequest}.get(
            outcome.status, SearchUnavailable
        )
        raise error(outcome.error or outcome.status)

    def run(
        self,
        queries: list[str],
        k: int,
        timeout_s: float | None,
        max_retries: int = 0,
        backoff_s: float = 0.05,
        principals: Sequence[str | None] | None = None,
    ) -> BatchOutcome:
        """One batched search under the deadline. Never raises."""
        return self.start(queries, k, timeout_s, max_retries, backoff_s, principals).wait()

    def start(
        self,
        queries: list[str],
        k: int,
        timeout_s: float | None,
        max_retries: int = 0,
        backoff_s: float = 0.05,
        principals: Sequence[str | None] | None = None,
    ) -> Flight:
        """Start a batched search (each query for its principal, None: public documents only) in a worker
        thread; `Flight.wait()` collects it within the deadline."""
        batch = list(queries)
        owners = None if principals is None else list(principals)

        def call() -> Any:
            return search_as(self.backend, list(batch), k, owners)

        def check(result: Any, latency_ms: float) -> BatchOutcome:
            return _outcome_of_result(result, batch, k, latency_ms)

        return self.launch(call, check, _outcome_of_exception, timeout_s, max_retries, backoff_s)


class ToolGuard(Breaker):
    """The breaker of one user-defined tool: each call runs its executor in a `Flight` under the deadline."""

    def __init__(self, spec: ToolSpec, failure_threshold: int = 3, reset_s: float = 30.0) -> None:
        super().__init__(failure_threshold, reset_s)
        self.spec = spec

    def start(
        self, call: Callable[[], Any], timeout_s: float | None, max_retries: int = 0, backoff_s: float = 0.05
    ) -> Flight:
        """Start one executor call; `ToolUnavailable` is retried, a permission error is an answer."""
        return self.launch(
            call,
            _tool_result,
            _outcome_of_tool_exception,
            timeout_s,
            max_retries,
            backoff_s,
            transient=(ToolUnavailable,),
            what=f"the tool {self.spec.name!r}",
        )


class Flight:
    """A guarded call running in a daemon thread."""

    def __init__(
        self,
        guard: Breaker | None,
        call: Callable[[], Any] | None,
        check: Callable[[Any, float], BatchOutcome] | None,
        on_error: Callable[[BaseException, float], BatchOutcome] | None,
        timeout_s: float | None,
        max_retries: int,
        backoff_s: float,
        transient: tuple[type[BaseException], ...] = (SearchUnavailable,),
    ) -> None:
        self._guard = guard
        self._check = check
        self._on_error = on_error
        self._outcome: BatchOutcome | None = None
        self._result: Any = None
        self._exception: BaseException | None = None
        self._started = time.perf_counter()
        self._deadline = None if timeout_s is None else self._started + timeout_s
        self._timeout_s = timeout_s
        self._thread: threading.Thread | None = None
        if guard is not None and call is not None:
            self._thread = threading.Thread(
                target=self._work,
                args=(guard, call, max_retries, backoff_s, transient),
                name="searchrl-search",
                daemon=True,
            )
            self._thread.start()

    @classmethod
    def finished(cls, outcome: BatchOutcome) -> Flight:
        flight = cls(None, None, None, None, None, 0, 0.0)
        flight._outcome = outcome
        return flight

    def _work(
        self,
        guard: Breaker,
        call: Callable[[], Any],
        max_retries: int,
        backoff_s: float,
        transient: tuple[type[BaseException], ...],
    ) -> None:
        try:
            self._result = guard._call_with_retries(call, max_retries, backoff_s, transient)
        except BaseException as exc:  # reported as an outcome; a worker thread must not die silently
            self._exception = exc

    def wait(self) -> BatchOutcome:
        """Block until the call ends or the deadline passes; then report (and feed the breaker)."""
        if self._outcome is not None:
            return self._outcome
        assert self._thread is not None and self._guard is not None
        assert self._check is not None and self._on_error is not None
        remaining = None if self._deadline is None else max(0.0, self._deadline - time.perf_counter())
        self._thread.join(remaining)
        latency_ms = (time.perf_counter() - self._started) * 1000.0
        if self._thread.is_alive():
            outcome = BatchOutcome(
                status="timeout", error=f"no answer within {self._timeout_s:g} s", latency_ms=latency_ms
            )
        elif self._exception is not None:
            outcome = self._on_error(self._exception, latency_ms)
        else:
            outcome = self._check(self._result, latency_ms)
        self._guard._record(outcome.status)
        self._outcome = outcome
        return outcome


def _outcome_of_exception(exc: BaseException, latency_ms: float) -> BatchOutcome:
    message = str(exc) or type(exc).__name__
    if isinstance(exc, SearchTimeout):
        status = "timeout"
    elif isinstance(exc, SearchUnavailable):
        status = "unavailable"
    elif isinstance(exc, BadSearchRequest):
        status = "bad_request"
    elif isinstance(exc, SearchError):
        status = "error"
    else:
        status = "error"
        message = f"{type(exc).__name__}: {message}"
    return BatchOutcome(status=status, error=message, latency_ms=latency_ms)


def _outcome_of_result(result: Any, queries: list[str], k: int, latency_ms: float) -> BatchOutcome:
    if not isinstance(result, list) or len(result) != len(queries):
        got = len(result) if isinstance(result, list) else type(result).__name__
        return BatchOutcome(
            status="error",
            error=f"the backend returned {got} result lists for {len(queries)} queries",
            latency_ms=latency_ms,
        )
    hits: list[list[Hit]] = []
    for ranked in result:
        if not isinstance(ranked, list) or not all(isinstance(h, Hit) for h in ranked):
            return BatchOutcome(
                status="error",
                error="the backend returned something other than lists of Hit",
                latency_ms=latency_ms,
            )
        hits.append(ranked[:k])
    return BatchOutcome(status="ok", hits=hits, latency_ms=latency_ms)


def _tool_result(value: Any, latency_ms: float) -> BatchOutcome:
    """An executor's return value; whether it is usable text is the environment's call (`executors.py`)."""
    return BatchOutcome(status="ok", value=value, latency_ms=latency_ms)


def _outcome_of_tool_exception(exc: BaseException, latency_ms: float) -> BatchOutcome:
    """What an executor's exception tells the policy: a denial's reason, a transient failure's message, and
    for anything else only the exception's type (its message may quote data the policy must not see)."""
    if isinstance(exc, ToolPermissionError):
        return BatchOutcome(status="permission_denied", error=exc.reason, latency_ms=latency_ms)
    if isinstance(exc, ToolUnavailable):
        return BatchOutcome(status="unavailable", error=str(exc) or "unavailable", latency_ms=latency_ms)
    log.warning("a tool's executor raised %s", type(exc).__name__, exc_info=exc)  # for people, not the policy
    return BatchOutcome(status="error", error=f"the tool raised {type(exc).__name__}", latency_ms=latency_ms)


_GUARDS: weakref.WeakKeyDictionary[Any, BackendGuard] = weakref.WeakKeyDictionary()
_GUARDS_BY_ID: dict[int, tuple[Any, BackendGuard]] = {}
_GUARDS_LOCK = threading.Lock()


def guard_for(backend: Backend, failure_threshold: int = 3, reset_s: float = 30.0) -> BackendGuard:
    """The one shared guard of `backend` (created with these settings on first use)."""
    if isinstance(backend, BackendGuard):
        return backend
    with _GUARDS_LOCK:
        try:
            guard = _GUARDS.get(backend)
            if guard is None:
                guard = BackendGuard(backend, failure_threshold, reset_s)
                _GUARDS[backend] = guard
            return guard
        except TypeError:  # not weak-referenceable: keep it alive with its guard
            entry = _GUARDS_BY_ID.get(id(backend))
            if entry is None or entry[0] is not backend:
                entry = (backend, BackendGuard(backend, failure_threshold, reset_s))
                _GUARDS_BY_ID[id(backend)] = entry
            return entry[1]


_TOOL_GUARDS: dict[int, tuple[ToolSpec, ToolGuard]] = {}


def tool_guard_for(spec: ToolSpec, failure_threshold: int = 3, reset_s: float = 30.0) -> ToolGuard:
    """The one shared guard of the tool `spec` (created with these settings on first use)."""
    with _GUARDS_LOCK:
        entry = _TOOL_GUARDS.get(id(spec))
        if entry is None or entry[0] is not spec:
            entry = (spec, ToolGuard(spec, failure_threshold, reset_s))
            _TOOL_GUARDS[id(spec)] = entry
        return entry[1]
