"""What a call site does when Redis is unreachable or slow: fail closed, or fail open.

* ``FailurePolicy.closed()`` raises :class:`~redis_quota.errors.QuotaUnavailableError`.
* ``FailurePolicy.open(limiter)`` ("degrade mode") answers from a :class:`LocalLimiter`: the
  process keeps counting locally with conservative per-key limits, so an API stays up while the
  quota store blinks. Replies from it have ``degraded=True``.

Either way each failure is counted in :class:`QuotaStats` and logged on the ``redis_quota``
logger (a WARNING when degrade mode starts, INFO when Redis answers again, DEBUG for each).

What counts as a failure: a connection error or timeout (``redis.ConnectionError``,
``redis.TimeoutError``, ``OSError``, the asyncio client's ``timeout_s``), and the replies that
mean the server cannot serve writes right now (``READONLY`` during a failover, ``LOADING``,
``OOM``, ``MASTERDOWN``, ``CLUSTERDOWN``, ``TRYAGAIN``). Error replies of the module itself
(``NOQUOTA``, ``CONFLICT``, ...) are answers, never failures: they always raise.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

import redis.exceptions

log = logging.getLogger("redis_quota")

UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (
    redis.exceptions.ConnectionError,  # includes BusyLoadingError (LOADING)
    redis.exceptions.TimeoutError,
    redis.exceptions.ReadOnlyError,
    redis.exceptions.OutOfMemoryError,
    redis.exceptions.MasterDownError,
    redis.exceptions.ClusterDownError,
    redis.exceptions.TryAgainError,
    OSError,
    TimeoutError,  # asyncio.wait_for's (asyncio.TimeoutError is TimeoutError on 3.11)
)


@dataclass
class QuotaStats:
    """Failure counters of one client, safe to read from any thread (e.g. a /metrics page).

    ``degraded`` is true from a failure until the next call that Redis answers.
    """

    calls: int = 0
    failures: int = 0
    fail_closed: int = 0
    degraded_grants: int = 0
    degraded_denials: int = 0
    unrecorded: int = 0
    degraded: bool = False
    last_error: str | None = None
    last_failure_unix_ms: int | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def snapshot(self) -> dict[str, int | bool | str | None]:
        """The counters as a plain dict (for JSON)."""
        with self._lock:
            return {
                "calls": self.calls,
                "failures": self.failures,
                "fail_closed": self.fail_closed,
                "degraded_grants": self.degraded_grants,
                "degraded_denials": self.degraded_denials,
                "unrecorded": self.unrecorded,
                "degraded": self.degraded,
                "last_error": self.last_error,
                "last_failure_unix_ms": self.last_failure_unix_ms,
            }

    def record_ok(self) -> None:
        with self._lock:
            self.calls += 1
            was = self.degraded
            self.degraded = False
        if was:
            log.info("redis-quota: Redis answers again; degrade mode ends")

    def record_failure(self, command: str, err: BaseException, closed: bool) -> None:
        with self._lock:
            self.calls += 1
            self.failures += 1
            if closed:
                self.fail_closed += 1
            was = self.degraded
            self.degraded = True
            self.last_error = f"{command}: {type(err).__name__}: {err}"
            self.last_failure_unix_ms = int(time.time() * 1000)
        mode = "failing closed" if closed else "degrade mode (local limits)"
        if not was:
            log.warning("redis-quota: %s failed (%r); %s", command, err, mode)
        else:
            log.debug("redis-quota: %s failed (%r); %s", command, err, mode)

    def add(self, name: str, n: int = 1) -> None:
        with self._lock:
            setattr(self, name, getattr(self, name) + n)


@dataclass
class _Held:
    keys: tuple[str, ...]
    amounts: tuple[int, ...]
    deadline: float


class LocalLimiter:
    """An in-process stand-in for the quota store while it is unreachable (degrade mode).

    Each key admits at most its local limit per ``window_s``: what local reservations hold
    now plus what was settled or charged in the current fixed window. ``limits`` gives a key's
    local limit (exact key names), ``limit_for`` computes one (e.g. from a key pattern), and
    ``default_limit`` applies to the rest (``None``: unlimited, only counted). So a
    concurrency budget (amount 1, settled 0) keeps bounding in-flight requests, a window keeps
    a rate, and a budget gets at most its local limit per window. Limits are per process: set
    them to this process's share. Local reservations expire after their TTL (default
    ``default_ttl_s``), as the module's do. Thread-safe.
    """

    def __init__(
        self,
        limits: Mapping[str, int] | None = None,
        *,
        default_limit: int | None = None,
        limit_for: Callable[[str], int | None] | None = None,
        window_s: float = 60.0,
        default_ttl_s: float = 3600.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._limits = dict(limits or {})
        self._default = default_limit
        self._limit_for = limit_for
        self._window_s = window_s
        self._default_ttl_s = default_ttl_s
        self._clock = clock
        self._lock = threading.Lock()
        self._window_start = clock()
        self._counted: dict[str, int] = {}
        self._held: dict[str, _Held] = {}
        self._held_sum: dict[str, int] = {}  # per key: what live local reservations hold

    def _take(self, id: str, h: _Held) -> None:
        self._held[id] = h
        for k, a in zip(h.keys, h.amounts, strict=True):
            self._held_sum[k] = self._held_sum.get(k, 0) + a

    def _release(self, id: str) -> _Held | None:
        h = self._held.pop(id, None)
        if h is not None:
            for k, a in zip(h.keys, h.amounts, strict=True):
                left = self._held_sum.get(k, 0) - a
                if left:
                    self._held_sum[k] = left
                else:
                    self._held_sum.pop(k, None)
        return h

    def limit(self, key: str) -> int | None:
        """The local limit of ``key`` (None: unlimited)."""
        if key in self._limits:
            return self._limits[key]
        if self._limit_for is not None:
            found = self._limit_for(key)
            if found is not None:
                return found
        return self._default

    def _tick(self) -> float:
        now = self._clock()
        if now - self._window_start >= self._window_s:
            self._counted.clear()
            self._window_start = now
        for id in [i for i, h in self._held.items() if h.deadline <= now]:
            self._release(id)
        return now

    def _in_use(self, key: str) -> int:
        return self._counted.get(key, 0) + self._held_sum.get(key, 0)

    def _remaining(self, key: str) -> int:
        lim = self.limit(key)
        return -1 if lim is None else lim - self._in_use(key)

    def retry_after_ms(self) -> int:
        """Ms until the current local window ends."""
        return max(1, int((self._window_start + self._window_s - self._clock()) * 1000))

    def reserve(
        self, keys: Sequence[str], amounts: Sequence[int], id: str | None, ttl_ms: int | None
    ) -> tuple[str | None, int, list[int]]:
        """All or nothing over ``keys``: ``(id or None, denied_index, remaining per key)``.

        Remaining is -1 for a key without a local limit.
        """
        with self._lock:
            now = self._tick()
            if id is not None and id in self._held:
                return id, -1, [self._remaining(k) for k in keys]
            for i, (k, a) in enumerate(zip(keys, amounts, strict=True)):
                lim = self.limit(k)
                if lim is not None and self._in_use(k) + a > lim:
                    return None, i, [self._remaining(k) for k in keys]
            new_id = id if id is not None else f"local-{uuid.uuid4().hex}"
            ttl_s = self._default_ttl_s if ttl_ms is None else ttl_ms / 1000
            self._take(new_id, _Held(tuple(keys), tuple(amounts), now + ttl_s))
            return new_id, -1, [self._remaining(k) for k in keys]

    def holds(self, id: str) -> bool:
        """Whether ``id`` is a live local reservation."""
        with self._lock:
            self._tick()
            return id in self._held

    def settle(self, id: str, actuals: Mapping[str, int] | None) -> list[int] | None:
        """Ends a local reservation: each key counts its actual (``None``: roll back).

        Returns the remaining per key of the reservation, or None if the id is not held.
        """
        with self._lock:
            self._tick()
            h = self._release(id)
            if h is None:
                return None
            for k in h.keys:
                if actuals is not None:
                    self._counted[k] = self._counted.get(k, 0) + actuals.get(k, 0)
            return [self._remaining(k) for k in h.keys]

    def extend(self, id: str, ttl_ms: int) -> bool:
        """A heartbeat for a local reservation; False if it is not held."""
        with self._lock:
            now = self._tick()
            h = self._held.get(id)
            if h is None:
                return False
            h.deadline = now + ttl_ms / 1000
            return True

    def count(self, key: str, amount: int, check: bool) -> tuple[bool, int]:
        """A one-phase charge or window call: ``(admitted, remaining)``."""
        with self._lock:
            self._tick()
            lim = self.limit(key)
            if check and lim is not None and self._in_use(key) + amount > lim:
                return False, self._remaining(key)
            self._counted[key] = self._counted.get(key, 0) + amount
            return True, self._remaining(key)


@dataclass(frozen=True)
class FailurePolicy:
    """A call site's answer to an unreachable or slow Redis.

    ``limiter`` None means fail closed. ``timeout_s`` bounds each call of the asyncio client
    (the sync client's bound is redis-py's ``socket_timeout``/``socket_connect_timeout``).
    """

    limiter: LocalLimiter | None = None
    timeout_s: float | None = None

    @classmethod
    def closed(cls, timeout_s: float | None = None) -> FailurePolicy:
        """Raise :class:`~redis_quota.errors.QuotaUnavailableError` (the default)."""
        return cls(None, timeout_s)

    @classmethod
    def open(cls, limiter: LocalLimiter, timeout_s: float | None = None) -> FailurePolicy:
        """Degrade mode: answer from ``limiter`` and mark the reply ``degraded``."""
        return cls(limiter, timeout_s)

    @property
    def fails_open(self) -> bool:
        return self.limiter is not None


FAIL_CLOSED = FailurePolicy.closed()
