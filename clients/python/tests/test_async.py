"""The asyncio client against a real server (each test runs its own event loop)."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable

import pytest
import redis.asyncio

from redis_quota import (
    AsyncHeartbeat,
    AsyncQuota,
    BudgetInfo,
    NoQuotaError,
    QuotaDeniedError,
    WrongTypeError,
)
from redis_quota.testing import RedisServer


async def _client(server: RedisServer) -> AsyncQuota:
    r = redis.asyncio.Redis(port=server.port)  # bytes replies: the client decodes them
    await r.flushall()
    return AsyncQuota(r)


async def _info(q: AsyncQuota, key: str) -> BudgetInfo:
    i = await q.info(key)
    assert isinstance(i, BudgetInfo)
    return i


async def _until(cond: Callable[[], Awaitable[bool]], timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if await cond():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_async_commands(server: RedisServer) -> None:
    async def main() -> None:
        q = await _client(server)
        assert await q.set_budget("b", limit=1000, ttl_ms=30_000)
        res = await q.reserve("b", 400, id="a1")
        assert res.granted and res.id == "a1" and res.available == 600
        assert await q.extend("b", "a1", 10_000) == 10_000
        s = await q.settle("b", "a1", 250)
        assert (s.status, s.charged, s.available) == ("settled", 250, 750)
        c = await q.charge("b", 50)
        assert c.charged and c.available == 700
        w = await q.window("w", 5, 1000, cost=2)
        assert w.allowed and w.remaining == 3
        with pytest.raises(NoQuotaError):
            await q.reserve("nobody", 1)
        with pytest.raises(WrongTypeError):
            await q.reserve("w", 1)
        assert (await _info(q, "b")).used == 300
        await q.redis.aclose()

    asyncio.run(main())


def test_async_context_manager(server: RedisServer) -> None:
    async def main() -> None:
        q = await _client(server)
        await q.set_budget("b", limit=1000)
        async with q.reservation("b", 300) as held:
            held.report(120)
        assert (await _info(q, "b")).used == 120
        with pytest.raises(ValueError, match="boom"):
            async with q.reservation("b", 300, id="x"):
                assert (await _info(q, "b")).reserved == 300
                raise ValueError("boom")
        i = await _info(q, "b")
        assert (i.used, i.reserved) == (120, 0)
        with pytest.raises(QuotaDeniedError):
            async with q.reservation("b", 5000):
                pass
        await q.redis.aclose()

    asyncio.run(main())


def test_async_cancellation_rolls_back(server: RedisServer) -> None:
    async def main() -> None:
        q = await _client(server)
        await q.set_budget("b", limit=1000)
        entered = asyncio.Event()

        async def work() -> None:
            async with q.reservation("b", 300, id="c"):
                entered.set()
                await asyncio.sleep(3600)

        task = asyncio.create_task(work())
        await entered.wait()
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert (await q.rollback("b", "c")).status == "duplicate"
        assert (await _info(q, "b")).reserved == 0
        await q.redis.aclose()

    asyncio.run(main())


def test_async_heartbeat(server: RedisServer) -> None:
    async def main() -> None:
        q = await _client(server)
        await q.set_budget("b", limit=1000)
        await q.reserve("b", 100, id="s", ttl_ms=300)
        start = time.monotonic()
        hb = q.heartbeat("b", "s", ttl_ms=300, every_s=0.05)

        async def long_enough() -> bool:
            return time.monotonic() - start > 1.0 and hb.beats >= 5

        await _until(long_enough)
        assert [p.id for p in await q.pending("b")] == ["s"]
        await hb.stop()
        await hb.stop()  # idempotent

        async def gone() -> bool:
            return await q.pending("b") == []

        await _until(gone)
        await q.redis.aclose()

    asyncio.run(main())


def test_async_heartbeat_stops_when_a_beat_swallows_the_cancel() -> None:
    """On Python 3.11 a cancel that meets an expiring asyncio.timeout() inside a beat can come
    out as TimeoutError; stop() must still end the heartbeat (no server needed)."""

    async def main() -> None:
        started = asyncio.Event()

        async def beat() -> None:
            started.set()
            try:
                await asyncio.sleep(3600)
            except asyncio.CancelledError:
                raise TimeoutError from None  # what asyncio.timeout() may turn it into

        hb = AsyncHeartbeat(beat, 0.01).start()
        await started.wait()
        await asyncio.wait_for(hb.stop(), timeout=10)
        assert hb.failures == 1

    asyncio.run(main())
