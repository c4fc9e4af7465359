"""Multi-key commands and configured window keys (QUOTA.MRESERVE & co., QUOTA.SET WINDOW)."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from redis_quota import (
    BudgetInfo,
    CommandError,
    ConflictError,
    KeyOutcome,
    MultiReservation,
    NoReservationError,
    Quota,
    QuotaDeniedError,
    WindowInfo,
    WrongTypeError,
)


def has_command(r: redis.Redis, name: str) -> bool:
    send: Any = r.execute_command
    try:
        return bool(send("COMMAND", "INFO", name))
    except TypeError:  # redis-py cannot parse COMMAND INFO's nil for an unknown command
        return False


KEYS = ["quota:{t}:key", "quota:{t}:org", "quota:{t}:rpm", "quota:{t}:tpm", "quota:{t}:conc"]


@pytest.fixture
def mq(q: Quota, r: redis.Redis) -> Quota:
    if not has_command(r, "quota.mreserve"):
        pytest.fail("the module has no QUOTA.MRESERVE: build the branch with issue 19")
    q.set_budget(KEYS[0], limit=1000, period="DAY")
    q.set_budget(KEYS[1], limit=5000, period="MONTH")
    q.set_window(KEYS[2], 2, 60_000)
    q.set_window(KEYS[3], 2000, 60_000)
    q.set_budget(KEYS[4], limit=1)
    return q


def test_window_keys_store_their_configuration(mq: Quota) -> None:
    w = mq.info(KEYS[2])
    assert isinstance(w, WindowInfo)
    assert (w.limit, w.window_ms, w.counted, w.remaining) == (2, 60_000, 0, 2)
    assert w.precision_ms == 1000
    a = mq.window(KEYS[2])  # the configured form: no limit / window_ms
    assert a.allowed and a.remaining == 1
    with pytest.raises(WrongTypeError):
        mq.set_budget(KEYS[2], limit=5)


def test_mreserve_msettle(mq: Quota) -> None:
    res = mq.mreserve(KEYS, [600, 600, 1, 600, 1], id="req-1", ttl_ms=30_000)
    assert res.granted and res.id == "req-1" and res.denied_index == -1 and res.denied_key is None
    assert res.values == (400, 4400, 1, 1400, 0)
    # a retry takes nothing more
    assert mq.mreserve(KEYS, [600, 600, 1, 600, 1], id="req-1", ttl_ms=30_000).values == res.values
    assert mq.mextend(KEYS, "req-1", 60_000) == [60_000, 60_000, None, None, 60_000]
    out = mq.msettle(KEYS, "req-1", [250, 250, 1, 250, 0])
    assert out == [
        KeyOutcome(KEYS[0], "settled", 250, 750),
        KeyOutcome(KEYS[1], "settled", 250, 4750),
        KeyOutcome(KEYS[2], "corrected", 1, 1),
        KeyOutcome(KEYS[3], "corrected", 250, 1750),
        KeyOutcome(KEYS[4], "settled", 0, 1),
    ]
    tpm = mq.info(KEYS[3])
    assert isinstance(tpm, WindowInfo) and tpm.counted == 250
    key = mq.info(KEYS[0])
    assert isinstance(key, BudgetInfo) and (key.used, key.reserved) == (250, 0)


def test_mreserve_denial_takes_nothing(mq: Quota) -> None:
    mq.mreserve(KEYS, [10, 10, 1, 10, 1], id="a")
    d = mq.mreserve(KEYS, [10, 10, 1, 10, 1], id="b")  # concurrency 1 is taken
    assert not d.granted and d.id is None and d.denied_index == 4 and d.denied_key == KEYS[4]
    assert d.retry_after_ms == -1
    rpm = mq.info(KEYS[2])
    assert isinstance(rpm, WindowInfo) and rpm.counted == 1  # b counted nowhere
    rb = mq.mrollback(KEYS, "a")
    assert [o.status for o in rb] == [
        "rolledback",
        "rolledback",
        "rolledback",
        "rolledback",
        "rolledback",
    ]
    assert rb[0].amount == 10 and rb[0].value == 1000


def test_multi_errors(mq: Quota, r: redis.Redis) -> None:
    mq.mreserve(KEYS, [10, 10, 1, 10, 1], id="x")
    # Each error names the listed key at fault (the first, if several are).
    with pytest.raises(ConflictError) as conflict:
        mq.mreserve(KEYS, [10, 11, 1, 10, 1], id="x")
    assert conflict.value.key == KEYS[1], conflict.value.message
    with pytest.raises(NoReservationError) as unknown:
        mq.msettle(KEYS, "never", [1, 1, 1, 1, 0])
    assert unknown.value.key == KEYS[0], unknown.value.message
    odd = "quota:{t}:s é'"  # shown escaped in the reply, unescaped in .key
    r.set(odd, "1")
    with pytest.raises(WrongTypeError) as wrongtype:
        mq.mreserve([KEYS[0], odd], [1, 1])
    assert wrongtype.value.key == odd, wrongtype.value.message
    with pytest.raises(CommandError) as twice:
        mq.mreserve([KEYS[0], KEYS[0]], [1, 1])  # a key listed twice
    assert twice.value.key is None
    with pytest.raises(ValueError):
        mq.mreserve(KEYS, [1, 2])  # one amount per key, checked before sending


def test_mreservation_context_manager(mq: Quota) -> None:
    with mq.mreservation(KEYS, [500, 500, 1, 500, 1], ttl_ms=30_000) as held:
        held.report(120, 120, 1, 120, 0)
    key = mq.info(KEYS[0])
    assert isinstance(key, BudgetInfo) and key.used == 120
    with pytest.raises(KeyError), mq.mreservation(KEYS, [500, 500, 1, 500, 1]):
        raise KeyError("model down")
    org = mq.info(KEYS[1])
    assert isinstance(org, BudgetInfo) and (org.used, org.reserved) == (120, 0)
    tpm = mq.info(KEYS[3])
    assert isinstance(tpm, WindowInfo) and tpm.counted == 120  # the window gave back 500
    rpm = mq.info(KEYS[2])
    assert isinstance(rpm, WindowInfo) and rpm.counted == 1  # the rollback gave its call back
    with pytest.raises(QuotaDeniedError) as denied, mq.mreservation(KEYS, [900, 1, 1, 1, 1]):
        pass
    # 880 left today: the key budget denies; 900 fits tomorrow
    result = denied.value.result
    assert isinstance(result, MultiReservation)
    assert result.denied_index == 0 and result.retry_after_ms > 0


def test_mextend_heartbeat(mq: Quota) -> None:
    mq.mreserve(KEYS, [10, 10, 1, 10, 1], id="s", ttl_ms=300)
    start = time.monotonic()
    with mq.heartbeat(KEYS, "s", ttl_ms=300, every_s=0.05) as hb:
        while time.monotonic() - start < 1.0 or hb.beats < 5:
            time.sleep(0.01)
        conc = mq.info(KEYS[4])
        assert isinstance(conc, BudgetInfo) and conc.reserved == 1
    assert hb.failures == 0
