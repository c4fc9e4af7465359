"""docs/migration-from-lua.md, "Moving a live tenant over", run against a real server: old state
made by the Lua scripts the module replaces (bench/lua), moved with the documented steps."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import redis

from redis_quota import BudgetInfo, Quota, WindowInfo

LUA = Path(__file__).resolve().parents[3] / "bench" / "lua"
OLD = "quota:t_1001"
NEW = "quota:{t_1001}:org:month"


def cmd(r: redis.Redis, *args: str | int) -> Any:
    """A raw command (redis-py's types for EVAL, HMGET, ... are too narrow to say this)."""
    send: Any = r.execute_command
    return send(*args)


def lua(name: str) -> str:
    return (LUA / f"{name}.lua").read_text()


def budget(q: Quota, key: str) -> BudgetInfo:
    i = q.info(key)
    assert isinstance(i, BudgetInfo)
    return i


def test_move_a_live_tenant(q: Quota, r: redis.Redis) -> None:
    reserve, settle = lua("reserve"), lua("settle")
    cmd(r, "HSET", OLD, "total", 100_000, "used", 0, "reserved", 0)
    assert cmd(r, "EVAL", reserve, 2, OLD, "quota_reserve:a", 5000) == 1
    assert cmd(r, "EVAL", settle, 2, OLD, "quota_reserve:a", 4000) == 1
    assert (
        cmd(r, "EVAL", reserve, 2, OLD, "quota_reserve:b", 3000) == 1
    )  # still in flight at the copy

    # 1. copy the current numbers; re-running changes nothing (USED overwrites)
    total, used_at_copy = (int(v) for v in cmd(r, "HMGET", OLD, "total", "used"))
    for _ in range(2):
        q.set_budget(NEW, limit=total, used=used_at_copy, period="MONTH", tz="Europe/Paris")
    i = budget(q, NEW)
    assert (i.limit, i.used, i.reserved, i.available) == (100_000, 4000, 0, 96_000)

    # 2. the gateway switches: new requests use the module
    assert q.reserve(NEW, 1000, id="new-1").granted
    q.settle(NEW, "new-1", 800)

    # the old path settles its own in-flight request on the old hash
    assert cmd(r, "EVAL", settle, 2, OLD, "quota_reserve:b", 2500) == 1

    # 3. carry over what the old path settled after the copy, once (the id makes it idempotent)
    delta = int(cmd(r, "HGET", OLD, "used")) - used_at_copy
    for _ in range(2):
        assert q.charge(NEW, delta, id="migrate:t_1001", force=True).charged
    i = budget(q, NEW)
    assert i.used == 4000 + 800 + 2500 and i.limit == i.used + i.reserved + i.available

    # a daily INCR + PEXPIREAT counter becomes a DAY budget with its count as USED
    old_day = "quota:{t_1001}:key:k9:20250114"
    for _ in range(3):
        cmd(r, "EVAL", lua("daily"), 1, old_day, 1000)
    day = "quota:{t_1001}:key:k9:day"
    q.set_budget(day, limit=1000, used=int(cmd(r, "GET", old_day)), period="DAY", tz="Europe/Paris")
    assert budget(q, day).used == 3

    # 4. a window seeded with what the old ZSET holds in the last minute
    old_rpm = "rl:t_1001:rpm"
    now = int(time.time() * 1000)
    for n in range(2):
        assert cmd(r, "EVAL", lua("window"), 1, old_rpm, 10, 60_000, f"m{n}") == 1
    seen = int(cmd(r, "ZCOUNT", old_rpm, f"({now - 60_000}", "+inf"))
    rpm = "quota:{t_1001}:rpm"
    q.set_window(rpm, 10, 60_000)
    assert q.window(rpm, cost=seen).remaining == 8
    w = q.info(rpm)
    assert isinstance(w, WindowInfo) and w.counted == 2
