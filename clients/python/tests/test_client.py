"""The sync client against a real server: replies, typed errors, context manager, heartbeat."""

from __future__ import annotations

import time

import pytest
import redis

from redis_quota import (
    BudgetInfo,
    CommandError,
    ConflictError,
    NoQuotaError,
    NoReservationError,
    PendingLimitError,
    Quota,
    QuotaDeniedError,
    Reservation,
    Settlement,
    TooLargeError,
    WrongTypeError,
)


def info(q: Quota, key: str) -> BudgetInfo:
    i = q.info(key)
    assert isinstance(i, BudgetInfo)
    return i


def test_reserve_settle_exact(q: Quota) -> None:
    assert q.set_budget("b", limit=10_000, period="DAY", tz="UTC") is True
    assert q.set_budget("b", limit=10_000) is False
    res = q.reserve("b", 4096, id="req-1", ttl_ms=60_000)
    assert res == Reservation("b", 4096, True, "req-1", 5904, 0)
    assert q.reserve("b", 4096, id="req-1", ttl_ms=60_000).available == 5904  # retry
    s = q.settle("b", "req-1", 1873)
    assert s == Settlement("b", "req-1", "settled", 1873, 8127)
    assert q.settle("b", "req-1", 1873).status == "duplicate"
    i = info(q, "b")
    assert (i.used, i.reserved, i.available, i.period) == (1873, 0, 8127, "DAY")
    assert i.limit == i.used + i.reserved + i.available


def test_generated_id_rollback_extend(q: Quota) -> None:
    q.set_budget("b", limit=100)
    res = q.reserve("b", 30)
    assert res.granted and res.id is not None and "-" in res.id
    assert q.extend("b", res.id, 5000) == 5000
    assert q.pending("b")[0].amount == 30
    rb = q.rollback("b", res.id)
    assert (rb.status, rb.released, rb.available) == ("rolledback", 30, 100)
    assert q.rollback("b", res.id).status == "duplicate"


def test_denial_is_a_reply(q: Quota) -> None:
    q.set_budget("b", limit=100)
    d = q.reserve("b", 101)
    assert not d.granted and d.id is None and d.available == 100 and d.retry_after_ms == -1
    c = q.charge("b", 60, id="c1")
    assert c.charged and c.available == 40
    assert q.charge("b", 60).charged is False
    assert q.charge("b", 60, force=True).available == -20


def test_window(q: Quota) -> None:
    a = q.window("rpm", 2, 60_000)
    assert a.allowed and a.remaining == 1 and a.retry_after_ms == 0 and a.reset_after_ms > 0
    q.window("rpm", 2, 60_000)
    d = q.window("rpm", 2, 60_000)
    assert not d.allowed and d.retry_after_ms > 0
    assert q.window("tpm", 100, 60_000, cost=200).retry_after_ms == -1
    with pytest.raises(ValueError):
        q.window("rpm", 2)


def test_typed_errors(q: Quota, r: redis.Redis) -> None:
    with pytest.raises(NoQuotaError):
        q.reserve("missing", 1)
    q.set_budget("b", limit=100, max_reserve=50)
    with pytest.raises(TooLargeError):
        q.reserve("b", 51)
    q.reserve("b", 5, id="x")
    with pytest.raises(ConflictError) as conflict:
        q.reserve("b", 6, id="x")
    assert conflict.value.code == "CONFLICT" and "pending" in conflict.value.message
    with pytest.raises(NoReservationError):
        q.settle("b", "nope", 1)
    r.set("s", "v")
    with pytest.raises(WrongTypeError):
        q.reserve("s", 1)
    with pytest.raises(CommandError):
        q.set_budget("new", used=1)  # ERR LIMIT is required ...: ERR, not the LIMIT code
    r.config_set("quota.max-pending", 1)
    with pytest.raises(PendingLimitError):
        q.reserve("b", 1)
    # a window key's cap counts its remembered ids: the same typed error
    q.set_window("w", 100, 60_000)
    assert q.mreserve(["w"], [1]).granted
    with pytest.raises(PendingLimitError) as remembered:
        q.mreserve(["w"], [1])
    assert "remembered ids" in remembered.value.message
    # typed errors are still redis-py ResponseErrors
    with pytest.raises(redis.ResponseError):
        q.reserve("missing", 1)


def test_context_manager_settles_reported(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    with q.reservation("b", 500, id="cm-1") as held:
        assert info(q, "b").reserved == 500
        held.report(123)
    i = info(q, "b")
    assert (i.used, i.reserved) == (123, 0)


def test_context_manager_unreported_settles_amount(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    with q.reservation("b", 200):
        pass
    assert info(q, "b").used == 200


def test_context_manager_rolls_back_on_exception(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    with pytest.raises(RuntimeError, match="model failed"), q.reservation("b", 500, id="cm-2"):
        assert info(q, "b").reserved == 500
        raise RuntimeError("model failed")
    i = info(q, "b")
    assert (i.used, i.reserved, i.available) == (0, 0, 1000)
    assert q.rollback("b", "cm-2").status == "duplicate"  # it was rolled back, not expired


def test_context_manager_denied(q: Quota) -> None:
    q.set_budget("b", limit=10)
    ran = False
    with pytest.raises(QuotaDeniedError) as denied, q.reservation("b", 11):
        ran = True
    assert not ran and isinstance(denied.value.result, Reservation)
    assert info(q, "b").used == 0


def _wait_until(cond: object, timeout_s: float = 10.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if callable(cond) and cond():
            return
        time.sleep(0.01)
    raise AssertionError("condition not reached in time")


def test_heartbeat_keeps_reservation_alive(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    q.reserve("b", 100, id="long", ttl_ms=400)
    start = time.monotonic()
    with q.heartbeat("b", "long", ttl_ms=400, every_s=0.05) as hb:
        # well past the first deadline (and several later ones): still pending
        _wait_until(lambda: time.monotonic() - start > 1.2 and hb.beats >= 5)
        assert [p.id for p in q.pending("b")] == ["long"]
    assert hb.failures == 0 and not hb.finished
    # stopped: it now expires on its own
    _wait_until(lambda: q.pending("b") == [])
    assert q.rollback("b", "long").status == "expired"


def test_heartbeat_ends_when_reservation_finished(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    q.reserve("b", 100, id="done", ttl_ms=60_000)
    q.settle("b", "done", 10)
    hb = q.heartbeat("b", "done", ttl_ms=60_000, every_s=0.02)
    _wait_until(lambda: hb.finished)
    hb.stop()
    assert isinstance(hb.last_error, ConflictError) and hb.beats == 0


def test_context_manager_with_heartbeat(q: Quota) -> None:
    q.set_budget("b", limit=1000)
    start = time.monotonic()
    with q.reservation("b", 100, id="hb", ttl_ms=300, heartbeat_s=0.05) as held:
        _wait_until(lambda: time.monotonic() - start > 0.8)
        assert [p.id for p in q.pending("b")] == ["hb"]  # alive past its 300 ms TTL
        held.report(42)
    assert info(q, "b").used == 42


def test_resp3_replies(q: Quota, server: object) -> None:
    """QUOTA.INFO is a map in RESP3; nil is RESP3's null."""
    from redis_quota.testing import RedisServer

    assert isinstance(server, RedisServer)
    q.set_budget("b3", limit=50, period="HOUR")
    r3 = redis.Redis(port=server.port, protocol=3)
    q3 = Quota(r3)
    i = q3.info("b3")
    assert isinstance(i, BudgetInfo) and (i.limit, i.period) == (50, "HOUR")
    assert q3.info("missing") is None
    g = q3.reserve("b3", 40, id="r3")
    assert g.granted and g.id == "r3"
    assert q3.settle("b3", "r3", 40).status == "settled"
    d = q3.reserve("b3", 20)  # fits in the next hour
    assert not d.granted and d.id is None and d.retry_after_ms > 0
    r3.close()
