"""The asyncio client: :class:`AsyncQuota` over a ``redis.asyncio.Redis``."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable, Sequence
from contextlib import asynccontextmanager
from typing import Any, TypeVar

import redis.asyncio
import redis.exceptions

from . import _protocol as p
from . import results
from ._core import Call, Plans
from .client import Held
from .errors import (
    ConflictError,
    NoReservationError,
    QuotaDeniedError,
)
from .policy import FAIL_CLOSED, UNAVAILABLE_ERRORS, FailurePolicy, QuotaStats, log

T = TypeVar("T")


class AsyncQuota:
    """The asyncio twin of :class:`redis_quota.Quota` over a ``redis.asyncio.Redis``.

    Same methods, replies and errors, awaited. A policy's ``timeout_s`` bounds each call here
    (``asyncio.timeout``): a call that takes longer counts as a failure of Redis.
    """

    def __init__(self, client: redis.asyncio.Redis, policy: FailurePolicy = FAIL_CLOSED) -> None:
        self.redis = client
        self.policy = policy
        self.stats = QuotaStats()
        self._plans = Plans(self.stats)

    async def _run(self, call: Call[T], policy: FailurePolicy | None) -> T:
        pol = policy or self.policy
        answer = self._plans.local_first(call, pol)
        if answer is not None:
            return answer
        try:
            reply: Any = await self._send(call.args, pol)
        except UNAVAILABLE_ERRORS as err:
            return self._plans.unavailable(call, pol, err)
        except redis.exceptions.ResponseError as err:
            raise self._plans.refused(err) from None
        return self._plans.parse(call, reply)

    # --- budgets ---------------------------------------------------------------------------

    async def set_budget(
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
        return await self._run(self._plans.set(args), FAIL_CLOSED)

    async def set_window(
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
        return await self._run(self._plans.set(args), FAIL_CLOSED)

    async def info(self, key: str) -> results.BudgetInfo | results.WindowInfo | None:
        """QUOTA.INFO: None if the key does not exist. Never degrades (fails closed)."""
        return await self._run(self._plans.info(key), FAIL_CLOSED)

    async def pending(self, key: str, count: int | None = None) -> list[results.PendingReservation]:
        """QUOTA.PENDING: live reservations, soonest deadline first."""
        return await self._run(self._plans.pending(key, count), FAIL_CLOSED)

    async def reserve(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        policy: FailurePolicy | None = None,
    ) -> results.Reservation:
        """QUOTA.RESERVE: holds ``amount`` if it fits. Give ``id`` to make retries safe."""
        return await self._run(self._plans.reserve(key, amount, id, ttl_ms), policy)

    async def settle(
        self, key: str, id: str, actual: int, *, policy: FailurePolicy | None = None
    ) -> results.Settlement:
        """QUOTA.SETTLE: charges the real usage and releases the reservation."""
        return await self._run(self._plans.settle(key, id, actual), policy)

    async def rollback(
        self, key: str, id: str, *, policy: FailurePolicy | None = None
    ) -> results.Rollback:
        """QUOTA.ROLLBACK: releases the reservation, charging nothing."""
        return await self._run(self._plans.rollback(key, id), policy)

    async def extend(
        self, key: str, id: str, ttl_ms: int, *, policy: FailurePolicy | None = None
    ) -> int:
        """QUOTA.EXTEND: the reservation now expires ``ttl_ms`` from now; returns ``ttl_ms``."""
        return await self._run(self._plans.extend(key, id, ttl_ms), policy)

    async def charge(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        force: bool = False,
        policy: FailurePolicy | None = None,
    ) -> results.Charge:
        """QUOTA.CHARGE: one-phase check-and-deduct (``force``: no check)."""
        return await self._run(self._plans.charge(key, amount, id, force), policy)

    async def window(
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
        return await self._run(call, policy)

    # --- several limits at once -------------------------------------------------------------

    async def mreserve(
        self,
        keys: Sequence[str],
        amounts: Sequence[int],
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        policy: FailurePolicy | None = None,
    ) -> results.MultiReservation:
        """QUOTA.MRESERVE: one amount per key, granted on every key or on none."""
        return await self._run(self._plans.mreserve(keys, amounts, id, ttl_ms), policy)

    async def msettle(
        self,
        keys: Sequence[str],
        id: str,
        actuals: Sequence[int],
        *,
        policy: FailurePolicy | None = None,
    ) -> list[results.KeyOutcome]:
        """QUOTA.MSETTLE: settles ``id`` on every key, one actual per key."""
        return await self._run(self._plans.msettle(keys, id, actuals), policy)

    async def mrollback(
        self, keys: Sequence[str], id: str, *, policy: FailurePolicy | None = None
    ) -> list[results.KeyOutcome]:
        """QUOTA.MROLLBACK: releases ``id`` on every key."""
        return await self._run(self._plans.mrollback(keys, id), policy)

    async def mextend(
        self, keys: Sequence[str], id: str, ttl_ms: int, *, policy: FailurePolicy | None = None
    ) -> list[int | None]:
        """QUOTA.MEXTEND: a heartbeat for every budget of a multi-key reservation."""
        return await self._run(self._plans.mextend(keys, id, ttl_ms), policy)

    async def _send(self, args: list[p.Arg], pol: FailurePolicy) -> Any:
        send: Any = self.redis.execute_command  # untyped in redis-py
        if pol.timeout_s is None:
            return await send(*args)
        async with asyncio.timeout(pol.timeout_s):
            return await send(*args)

    # --- helpers ----------------------------------------------------------------------------

    def heartbeat(
        self,
        keys: str | Sequence[str],
        id: str,
        ttl_ms: int,
        every_s: float,
        *,
        policy: FailurePolicy | None = None,
    ) -> AsyncHeartbeat:
        """A started :class:`AsyncHeartbeat` (QUOTA.EXTEND, or MEXTEND for several keys)
        every ``every_s`` seconds; ``async with`` it or ``await hb.stop()``."""
        if isinstance(keys, str):
            key = keys

            async def beat() -> None:
                await self.extend(key, id, ttl_ms, policy=policy)
        else:
            many = list(keys)

            async def beat() -> None:
                await self.mextend(many, id, ttl_ms, policy=policy)

        return AsyncHeartbeat(beat, every_s).start()

    @asynccontextmanager
    async def reservation(
        self,
        key: str,
        amount: int,
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        heartbeat_s: float | None = None,
        policy: FailurePolicy | None = None,
    ) -> AsyncIterator[Held]:
        """Reserve, run the body, then settle what it reported (``held.report(actual)``;
        the whole amount if it reported nothing), or roll back if it raised (cancellation
        included). Raises :class:`QuotaDeniedError` on a denial."""
        r = await self.reserve(key, amount, id=id, ttl_ms=ttl_ms, policy=policy)
        async with self._holding(key, r, [amount], ttl_ms, heartbeat_s, policy) as held:
            yield held

    @asynccontextmanager
    async def mreservation(
        self,
        keys: Sequence[str],
        amounts: Sequence[int],
        *,
        id: str | None = None,
        ttl_ms: int | None = None,
        heartbeat_s: float | None = None,
        policy: FailurePolicy | None = None,
    ) -> AsyncIterator[Held]:
        """:meth:`reservation` over several keys (MRESERVE, then MSETTLE or MROLLBACK)."""
        r = await self.mreserve(keys, amounts, id=id, ttl_ms=ttl_ms, policy=policy)
        async with self._holding(keys, r, amounts, ttl_ms, heartbeat_s, policy) as held:
            yield held

    @asynccontextmanager
    async def _holding(
        self,
        keys: str | Sequence[str],
        r: results.Reservation | results.MultiReservation,
        amounts: Sequence[int],
        ttl_ms: int | None,
        heartbeat_s: float | None,
        policy: FailurePolicy | None,
    ) -> AsyncIterator[Held]:
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
                await hb.stop()
            if isinstance(keys, str):
                await asyncio.shield(self.rollback(keys, id, policy=policy))
            else:
                await asyncio.shield(self.mrollback(keys, id, policy=policy))
            raise
        if hb is not None:
            await hb.stop()
        if isinstance(keys, str):
            await self.settle(keys, id, held.actuals[0], policy=policy)
        else:
            await self.msettle(keys, id, held.actuals, policy=policy)


class AsyncHeartbeat:
    """Awaits ``beat`` every ``every_s`` seconds in a task until ``await stop()``.

    As :class:`redis_quota.Heartbeat`: ``CONFLICT``/``NORESERVATION`` end it (``finished``),
    other failures are counted and the next beat tries again.
    """

    def __init__(self, beat: Callable[[], Awaitable[None]], every_s: float) -> None:
        if every_s <= 0:
            raise ValueError("every_s must be positive")
        self._beat = beat
        self._every_s = every_s
        self._task: asyncio.Task[None] | None = None
        self._stopping = False
        self.beats = 0
        self.failures = 0
        self.last_error: BaseException | None = None
        self.finished = False

    def start(self) -> AsyncHeartbeat:
        self._task = asyncio.get_running_loop().create_task(self._loop())
        return self

    async def _loop(self) -> None:
        # The flag, not only the cancellation, ends the loop: on Python 3.11 a cancel that
        # meets an expiring asyncio.timeout() inside a beat can surface as a TimeoutError.
        while not self._stopping:
            await asyncio.sleep(self._every_s)
            if self._stopping:
                return
            try:
                await self._beat()
                self.beats += 1
            except (ConflictError, NoReservationError) as err:
                self.last_error = err
                self.finished = True
                return
            except Exception as err:  # keep beating: the next one may get through
                self.failures += 1
                self.last_error = err
                log.debug("redis-quota: heartbeat failed: %r", err)

    async def stop(self) -> None:
        """Stops beating (cancels a beat in progress) and waits for the task to end.
        Idempotent. Safe in a ``finally`` of a cancelled task (under a shield)."""
        self._stopping = True
        task, self._task = self._task, None
        while task is not None and not task.done():
            task.cancel()
            # never raises the task's CancelledError into the caller
            await asyncio.wait([task], timeout=1.0)

    async def __aenter__(self) -> AsyncHeartbeat:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.stop()
