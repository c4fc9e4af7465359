"""The synchronous client: :class:`Quota` over a ``redis.Redis``."""

from __future__ import annotations

import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from typing import Any, TypeVar

import redis
import redis.exceptions

from . import _protocol as p
from . import results
from ._core import Call, Plans
from .errors import (
    ConflictError,
    NoReservationError,
    QuotaDeniedError,
)
from .policy import FAIL_CLOSED, UNAVAILABLE_ERRORS, FailurePolicy, QuotaStats, log

T = TypeVar("T")


class Quota:
    """QUOTA.* commands over a ``redis.Redis`` (any ``decode_responses``, RESP2 or RESP3).

    ``policy`` is the default :class:`~redis_quota.policy.FailurePolicy` (fail closed); every
    call takes its own ``policy=`` to override it per call site. Bound a slow Redis with
    redis-py's ``socket_timeout`` / ``socket_connect_timeout`` (e.g. 0.2 s for a gateway).
    Error replies raise the typed exceptions of :mod:`redis_quota.errors`.
    """

    def __init__(self, client: redis.Redis, policy: FailurePolicy = FAIL_CLOSED) -> None:
        self.redis = client
        self.policy = policy
        self.stats = QuotaStats()
        self._plans = Plans(self.stats)

    def _run(self, call: Call[T], policy: FailurePolicy | None) -> T:
        pol = policy or self.policy
        answer = self._plans.local_first(call, pol)
        if answer is not None:
            return answer
        try:
            send: Any = self.redis.execute_command  # untyped in redis-py
            reply: Any = send(*call.args)
        except UNAVAILABLE_ERRORS as err:
            return self._plans.unavailable(call, pol, err)
        except redis.exceptions.ResponseError as err:
            raise self._plans.refused(err) from None
        return self._plans.parse(call, reply)

    # --- budgets ---------------------------------------------------------------------------

    def set_budget(
        self,
        key: str,
        *,
        limit: int | None = None,
        used: int | None = None,
        overdraft: int | None = None,
        max_reserve: int | None = None,
        ttl_ms: int | None = None,
        period: str | None = None,
        tz: str | None = None,
        anchor_ms: int | None = None,
        nx: bool = False,
        xx: bool = False,
    ) -> bool:
        """QUOTA.SET: creates or updates a budget; True if it was created."""
        args = p.set_budget_args(
            key,
            limit=limit,
            used=used,
            overdraft=overdraft,
            max_reserve=max_reserve,
            ttl_ms=ttl_ms,
            period=period,
            tz=tz,
            anchor_ms=anchor_ms,
            nx=nx,
            xx=xx,
        )
        return self._run(self._plans.set(args), FAIL_CLOSED)

    def set_window(
        self,
        key: str,
        limit: int,
        window_ms: int,
        *,
        precision_ms: int | None = None,
        nx: bool = False,
        xx: bool = False,
    ) -> bool:
        """``QUOTA.SET key WINDOW limit window_ms``: a window key that stores its limit."""
        args = p.set_window_args(key, limit, window_ms, precision_ms, nx, xx)
        return self._run(self._plans.set(args), FAIL_CLOSED)

    def info(self, key: str) -> results.BudgetInfo | results.WindowInfo | None:
        """QUOTA.INFO: None if the key does not exist. Never degrades (fails closed)."""
        return self._run(self._plans.info(key), FAIL_CLOSED)

    def pending(self, key: str, count: int | None = None) -> list[results.PendingReservation]:
        """QUOTA.PENDING: live reservations, soonest deadline first."""
        return self._run(self._plans.pending(key, count), FAIL_CLOSED)

    def reserve(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        policy: FailurePolicy | None = None,
    ) -> results.Reservation:
        """QUOTA.RESERVE: holds ``amount`` if it fits. Give ``id`` to make retries safe."""
        return self._run(self._plans.reserve(key, amount, id, ttl_ms), policy)

    def settle(
        self, key: str, id: str, actual: int, *, policy: FailurePolicy | None = None
    ) -> results.Settlement:
        """QUOTA.SETTLE: charges the real usage and releases the reservation."""
        return self._run(self._plans.settle(key, id, actual), policy)

    def rollback(
        self, key: str, id: str, *, policy: FailurePolicy | None = None
    ) -> results.Rollback:
        """QUOTA.ROLLBACK: releases the reservation, charging nothing."""
        return self._run(self._plans.rollback(key, id), policy)

    def extend(self, key: str, id: str, ttl_ms: int, *, policy: FailurePolicy | None = None) -> int:
        """QUOTA.EXTEND: the reservation now expires ``ttl_ms`` from now; returns ``ttl_ms``."""
        return self._run(self._plans.extend(key, id, ttl_ms), policy)

    def charge(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        force: bool = False,
        policy: FailurePolicy | None = None,
    ) -> results.Charge:
        """QUOTA.CHARGE: one-phase check-and-deduct (``force``: no check)."""
        return self._run(self._plans.charge(key, amount, id, force), policy)

    def window(
        self,
        key: str,
        limit: int | None = None,
        window_ms: int | None = None,
        *,
        cost: int = 1,
        precision_ms: int | None = None,
        peek: bool = False,
        policy: FailurePolicy | None = None,
    ) -> results.WindowResult:
        """QUOTA.WINDOW: a sliding-window rate limit. Omit ``limit``/``window_ms`` for a key
        configured with :meth:`set_window`."""
        call = self._plans.window(key, limit, window_ms, cost, precision_ms, peek)
        return self._run(call, policy)

    # --- several limits at once -------------------------------------------------------------

    def mreserve(
        self,
        keys: Sequence[str],
        amounts: Sequence[int],
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        policy: FailurePolicy | None = None,
    ) -> results.MultiReservation:
        """QUOTA.MRESERVE: one amount per key, granted on every key or on none."""
        return self._run(self._plans.mreserve(keys, amounts, id, ttl_ms), policy)

    def msettle(
        self,
        keys: Sequence[str],
        id: str,
        actuals: Sequence[int],
        *,
        policy: FailurePolicy | None = None,
    ) -> list[results.KeyOutcome]:
        """QUOTA.MSETTLE: settles ``id`` on every key, one actual per key."""
        return self._run(self._plans.msettle(keys, id, actuals), policy)

    def mrollback(
        self, keys: Sequence[str], id: str, *, policy: FailurePolicy | None = None
    ) -> list[results.KeyOutcome]:
        """QUOTA.MROLLBACK: releases ``id`` on every key."""
        return self._run(self._plans.mrollback(keys, id), policy)

    def mextend(
        self, keys: Sequence[str], id: str, ttl_ms: int, *, policy: FailurePolicy | None = None
    ) -> list[int | None]:
        """QUOTA.MEXTEND: a heartbeat for every budget of a multi-key reservation."""
        return self._run(self._plans.mextend(keys, id, ttl_ms), policy)

    # --- helpers ----------------------------------------------------------------------------

    def heartbeat(
        self,
        keys: str | Sequence[str],
        id: str,
        ttl_ms: int,
        every_s: float,
        *,
        policy: FailurePolicy | None = None,
    ) -> Heartbeat:
        """A started :class:`Heartbeat` (QUOTA.EXTEND, or MEXTEND for several keys) every
        ``every_s`` seconds; use it as a context manager or call ``stop()``."""
        if isinstance(keys, str):
            key = keys

            def beat() -> None:
                self.extend(key, id, ttl_ms, policy=policy)
        else:
            many = list(keys)

            def beat() -> None:
                self.mextend(many, id, ttl_ms, policy=policy)

        return Heartbeat(beat, every_s).start()

    @contextmanager
    def reservation(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        heartbeat_s: float | None = None,
        policy: FailurePolicy | None = None,
    ) -> Iterator[Held]:
        """Reserve, run the body, then settle what it reported (``held.report(actual)``;
        the whole amount if it reported nothing), or roll back if it raised.

        Raises :class:`QuotaDeniedError` on a denial. With ``heartbeat_s`` (and ``ttl_ms``) a
        :class:`Heartbeat` extends the reservation while the body runs.
        """
        r = self.reserve(key, amount, id=id, ttl_ms=ttl_ms, policy=policy)
        with self._holding(key, r, [amount], ttl_ms, heartbeat_s, policy) as held:
            yield held

    @contextmanager
    def mreservation(
        self,
        keys: Sequence[str],
        amounts: Sequence[int],
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        heartbeat_s: float | None = None,
        policy: FailurePolicy | None = None,
    ) -> Iterator[Held]:
        """:meth:`reservation` over several keys (MRESERVE, then MSETTLE or MROLLBACK); the
        body reports one actual per key (``held.report(*actuals)``)."""
        r = self.mreserve(keys, amounts, id=id, ttl_ms=ttl_ms, policy=policy)
        with self._holding(keys, r, amounts, ttl_ms, heartbeat_s, policy) as held:
            yield held

    @contextmanager
    def _holding(
        self,
        keys: str | Sequence[str],
        r: results.Reservation | results.MultiReservation,
        amounts: Sequence[int],
        ttl_ms: int | None,
        heartbeat_s: float | None,
        policy: FailurePolicy | None,
    ) -> Iterator[Held]:
        """The body of :meth:`reservation` (``keys`` one key) and :meth:`mreservation`."""
        if not r.granted or r.id is None:
            raise QuotaDeniedError(r)
        id = r.id
        held = Held(id, amounts, r)
        hb = None
        if heartbeat_s is not None:
            hb = self.heartbeat(keys, id, ttl_ms or 60_000, heartbeat_s, policy=policy)
        try:
            yield held
        except BaseException:
            if hb is not None:
                hb.stop()
            if isinstance(keys, str):
                self.rollback(keys, id, policy=policy)
            else:
                self.mrollback(keys, id, policy=policy)
            raise
        if hb is not None:
            hb.stop()
        if isinstance(keys, str):
            self.settle(keys, id, held.actuals[0], policy=policy)
        else:
            self.msettle(keys, id, held.actuals, policy=policy)


class Held:
    """What the body of a ``reservation()`` sees: the grant, and ``report()`` for the usage."""

    def __init__(
        self,
        id: str,
        amounts: Sequence[int],
        result: results.Reservation | results.MultiReservation,
    ) -> None:
        self.id = id
        self.result = result
        self.actuals = list(amounts)
        self.reported = False

    def report(self, *actuals: int) -> None:
        """The real usage, one value per key (settled when the body ends)."""
        if len(actuals) != len(self.actuals):
            raise ValueError(f"report {len(self.actuals)} actual(s), got {len(actuals)}")
        self.actuals = list(actuals)
        self.reported = True


class Heartbeat:
    """Calls ``beat`` every ``every_s`` seconds on a daemon thread until ``stop()``.

    A beat that finds the reservation finished (``CONFLICT``/``NORESERVATION``) ends the
    heartbeat; any other failure is counted (``failures``, ``last_error``) and the next beat
    tries again. ``beats`` counts the successful ones.
    """

    def __init__(self, beat: Any, every_s: float) -> None:
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self._beat = beat
        self._every_s = every_s
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._loop, name="redis-quota-heartbeat", daemon=True
        )
        self.beats = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.finished = False

    def start(self) -> Heartbeat:
        self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self._every_s):
            try:
                self._beat()
                self.beats += 1
            except (ConflictError, NoReservationError) as err:
                self.last_error = err
                self.finished = True
                return
            except Exception as err:  # keep beating: the next one may get through
                self.failures += 1
                self.last_error = err
                log.debug("redis-quota: heartbeat failed: %r", err)

    def stop(self) -> None:
        """Stops beating and waits for a beat in progress to end. Idempotent."""
        self._stop.set()
        if self._thread.is_alive() and self._thread is not threading.current_thread():
            self._thread.join()

    def __enter__(self) -> Heartbeat:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()
