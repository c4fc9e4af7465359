"""Failure policy: fail closed raises, fail open answers from the local limiter and counts."""

from __future__ import annotations

import asyncio
import logging
import threading

import pytest
import redis
import redis.asyncio
from redis.backoff import NoBackoff
from redis.retry import Retry

from redis_quota import (
    AsyncQuota,
    BudgetInfo,
    FailurePolicy,
    LocalLimiter,
    Quota,
    QuotaUnavailableError,
)
from redis_quota.testing import RedisServer


class FakeClock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def test_local_limiter_counts_held_and_settled() -> None:
    clock = FakeClock()
    lim = LocalLimiter({"conc": 2, "budget": 100}, window_s=60, default_ttl_s=10, clock=clock)
    a, denied, rem = lim.reserve(["budget", "conc"], [60, 1], None, None)
    assert a is not None and denied == -1 and rem == [40, 1]
    b, _, _ = lim.reserve(["budget", "conc"], [30, 1], "b", None)
    assert b == "b"
    # conc is full (2 in flight): all or nothing, the budget takes nothing either
    c, denied, rem = lim.reserve(["budget", "conc"], [1, 1], None, None)
    assert c is None and denied == 1 and rem == [10, 0]
    assert lim.settle(a, {"budget": 50, "conc": 0}) == [20, 1]
    assert lim.settle(a, None) is None  # already finished
    assert lim.settle("b", None) == [50, 2]  # rolled back: gives back its 30
    assert lim.limit("other") is None
    assert lim.count("other", 10**9, check=True) == (True, -1)
    # the window turns: what was settled no longer counts
    clock.t += 60
    assert lim.count("budget", 100, check=True) == (True, 0)
    assert lim.count("budget", 1, check=True) == (False, 0)
    # local reservations expire after their TTL
    d, _, _ = lim.reserve(["conc"], [2], None, 500)
    assert d is not None and lim.holds(d)
    clock.t += 0.5
    assert not lim.holds(d)


def test_fail_closed_raises_and_counts(own_server: RedisServer) -> None:
    q = Quota(redis.Redis(port=own_server.port, socket_timeout=0.5, socket_connect_timeout=0.5))
    q.set_budget("b", limit=10)
    own_server.stop()
    with pytest.raises(QuotaUnavailableError) as err:
        q.reserve("b", 1)
    assert isinstance(err.value.__cause__, redis.ConnectionError)
    snap = q.stats.snapshot()
    assert snap["failures"] == 1 and snap["fail_closed"] == 1 and snap["degraded"] is True
    assert "QUOTA.RESERVE" in str(snap["last_error"])


def test_fail_open_degrades_then_recovers(
    own_server: RedisServer, caplog: pytest.LogCaptureFixture
) -> None:
    limiter = LocalLimiter({"b": 100})
    q = Quota(
        redis.Redis(port=own_server.port, socket_timeout=0.5, socket_connect_timeout=0.5),
        policy=FailurePolicy.open(limiter),
    )
    q.set_budget("b", limit=1000)
    ok = q.reserve("b", 10, id="before")
    assert ok.granted and not ok.degraded
    own_server.stop()
    with caplog.at_level(logging.INFO, logger="redis_quota"):
        g = q.reserve("b", 60)
        assert g.granted and g.degraded and g.id is not None and g.available == 40
        d = q.reserve("b", 60)
        assert not d.granted and d.degraded and d.retry_after_ms > 0
        # a local reservation settles locally, without asking Redis
        s = q.settle("b", g.id, 30)
        assert s.degraded and s.status == "settled" and s.available == 70
        # a reservation Redis holds cannot be settled now: counted as unrecorded, no raise
        u = q.settle("b", "before", 5)
        assert u.degraded and u.status == "unrecorded"
        w = q.window("rpm", 5, 60_000)
        assert w.allowed and w.degraded
        # reads have nothing to degrade to: they fail closed
        with pytest.raises(QuotaUnavailableError):
            q.info("b")
        snap = q.stats.snapshot()
        assert snap["degraded"] is True
        assert snap["degraded_grants"] == 2 and snap["degraded_denials"] == 1
        assert snap["unrecorded"] == 1 and snap["failures"] == 5
        own_server.start()  # empty again (this test server keeps no data)
        q.set_budget("b", limit=1000)
        back = q.reserve("b", 1)
        assert not back.degraded
        assert isinstance(q.info("b"), BudgetInfo)
        assert q.stats.snapshot()["degraded"] is False
    messages = [rec.getMessage() for rec in caplog.records]
    assert any(
        "degrade mode" in m and rec.levelno == logging.WARNING
        for m, rec in zip(messages, caplog.records, strict=True)
    )
    assert any("answers again" in m for m in messages)


def test_per_call_site_policy(own_server: RedisServer) -> None:
    q = Quota(redis.Redis(port=own_server.port, socket_timeout=0.5, socket_connect_timeout=0.5))
    q.set_budget("b", limit=10)
    own_server.stop()
    open_policy = FailurePolicy.open(LocalLimiter(default_limit=None))
    assert q.reserve("b", 1, policy=open_policy).degraded  # this call site fails open
    with pytest.raises(QuotaUnavailableError):
        q.reserve("b", 1)  # the client's default: closed


def test_async_slow_redis_times_out_into_degrade_mode(own_server: RedisServer) -> None:
    """A Redis that answers too late (CLIENT PAUSE) counts as a failure of Redis."""

    async def main() -> None:
        sync = redis.Redis(port=own_server.port)
        q = AsyncQuota(
            redis.asyncio.Redis(port=own_server.port),
            policy=FailurePolicy.open(LocalLimiter({"b": 5}), timeout_s=0.1),
        )
        await q.set_budget("b", limit=1000)
        sync.client_pause(1000, all=True)
        try:
            res = await q.reserve("b", 5)
            assert res.granted and res.degraded
            denied = await q.reserve("b", 1)
            assert not denied.granted and denied.degraded
        finally:
            sync.client_unpause()
        assert q.stats.snapshot()["failures"] == 2
        ok = await q.reserve("b", 1)
        assert ok.granted and not ok.degraded
        await q.redis.aclose()
        sync.close()

    asyncio.run(main())


def test_stats_are_thread_safe() -> None:
    lim = LocalLimiter({"k": 10_000})
    q = Quota(redis.Redis(port=1, socket_connect_timeout=0.2), policy=FailurePolicy.open(lim))

    def worker() -> None:
        for _ in range(50):
            r = q.charge("k", 1)
            assert r.degraded

    threads = [threading.Thread(target=worker) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    snap = q.stats.snapshot()
    assert snap["failures"] == 200 and snap["degraded_grants"] == 200


def test_sync_slow_redis_times_out_into_degrade_mode(own_server: RedisServer) -> None:
    """The sync client's bound is redis-py's socket_timeout (no retries here: each would wait
    as long again)."""
    sync = redis.Redis(port=own_server.port)
    q = Quota(
        redis.Redis(port=own_server.port, socket_timeout=0.1, retry=Retry(NoBackoff(), 0)),
        policy=FailurePolicy.open(LocalLimiter({"b": 5})),
    )
    q.set_budget("b", limit=1000)
    sync.client_pause(1000, all=True)
    try:
        res = q.reserve("b", 5)
        assert res.granted and res.degraded
        assert isinstance(q.stats.snapshot()["last_error"], str)
        assert "TimeoutError" in str(q.stats.snapshot()["last_error"])
    finally:
        sync.client_unpause()
    assert not q.reserve("b", 1).degraded
    sync.close()
