"""Command arguments and reply parsing shared by the sync and asyncio clients (no I/O here)."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from . import results

Arg = str | int | bytes


def to_str(value: Any) -> str:
    """A bulk or simple string reply as str (redis-py gives bytes unless decode_responses)."""
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="surrogateescape")
    return str(value)


def to_int(value: Any) -> int:
    """An integer reply as int."""
    if isinstance(value, bool):
        return int(value)
    if isinstance(value, int):
        return value
    return int(to_str(value))


def opt_str(value: Any) -> str | None:
    """A bulk string or nil."""
    return None if value is None else to_str(value)


def _seq(value: Any, n: int | None, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple) or (n is not None and len(value) != n):
        raise ValueError(f"unexpected {what} reply: {value!r}")
    return value


def reserve_args(key: str, amount: int, id: str | None, ttl_ms: int | None) -> list[Arg]:
    args: list[Arg] = ["QUOTA.RESERVE", key, amount]
    if id is not None:
        args += ["ID", id]
    if ttl_ms is not None:
        args += ["TTL", ttl_ms]
    return args


def parse_reservation(reply: Any, key: str, amount: int) -> results.Reservation:
    r = _seq(reply, 4, "QUOTA.RESERVE")
    return results.Reservation(
        key, amount, to_int(r[0]) == 1, opt_str(r[1]), to_int(r[2]), to_int(r[3])
    )


def parse_settlement(reply: Any, key: str, id: str) -> results.Settlement:
    r = _seq(reply, 3, "QUOTA.SETTLE")
    return results.Settlement(key, id, to_str(r[0]), to_int(r[1]), to_int(r[2]))


def parse_rollback(reply: Any, key: str, id: str) -> results.Rollback:
    r = _seq(reply, 3, "QUOTA.ROLLBACK")
    return results.Rollback(key, id, to_str(r[0]), to_int(r[1]), to_int(r[2]))


def charge_args(key: str, amount: int, id: str | None, force: bool) -> list[Arg]:
    args: list[Arg] = ["QUOTA.CHARGE", key, amount]
    if id is not None:
        args += ["ID", id]
    if force:
        args.append("FORCE")
    return args


def parse_charge(reply: Any, key: str, amount: int) -> results.Charge:
    r = _seq(reply, 3, "QUOTA.CHARGE")
    return results.Charge(key, amount, to_int(r[0]) == 1, to_int(r[1]), to_int(r[2]))


def window_args(
    key: str,
    limit: int | None,
    window_ms: int | None,
    cost: int,
    precision_ms: int | None,
    peek: bool,
) -> list[Arg]:
    if (limit is None) != (window_ms is None):
        raise ValueError("give both limit and window_ms, or neither (a configured window key)")
    args: list[Arg] = ["QUOTA.WINDOW", key]
    if limit is not None and window_ms is not None:
        args += [limit, window_ms]
    args += ["COST", cost]
    if precision_ms is not None:
        args += ["PRECISION", precision_ms]
    if peek:
        args.append("PEEK")
    return args


def parse_window(reply: Any, key: str, cost: int) -> results.WindowResult:
    r = _seq(reply, 4, "QUOTA.WINDOW")
    return results.WindowResult(
        key, cost, to_int(r[0]) == 1, to_int(r[1]), to_int(r[2]), to_int(r[3])
    )


def set_budget_args(
    key: str,
    *,
    limit: int | None,
    used: int | None,
    overdraft: int | None,
    max_reserve: int | None,
    ttl_ms: int | None,
    period: str | None,
    tz: str | None,
    anchor_ms: int | None,
    nx: bool,
    xx: bool,
) -> list[Arg]:
    args: list[Arg] = ["QUOTA.SET", key]
    for name, value in (
        ("LIMIT", limit),
        ("USED", used),
        ("OVERDRAFT", overdraft),
        ("MAXRESERVE", max_reserve),
        ("TTL", ttl_ms),
        ("PERIOD", period),
        ("TZ", tz),
        ("ANCHOR", anchor_ms),
    ):
        if value is not None:
            args += [name, value]
    if nx:
        args.append("NX")
    if xx:
        args.append("XX")
    return args


def set_window_args(
    key: str, limit: int, window_ms: int, precision_ms: int | None, nx: bool, xx: bool
) -> list[Arg]:
    args: list[Arg] = ["QUOTA.SET", key, "WINDOW", limit, window_ms]
    if precision_ms is not None:
        args += ["PRECISION", precision_ms]
    if nx:
        args.append("NX")
    if xx:
        args.append("XX")
    return args


def _fields(reply: Any) -> dict[str, Any]:
    if isinstance(reply, Mapping):  # RESP3
        return {to_str(k): v for k, v in reply.items()}
    r = _seq(reply, None, "QUOTA.INFO")
    return {to_str(r[i]): r[i + 1] for i in range(0, len(r) - 1, 2)}


def parse_info(reply: Any, key: str) -> results.BudgetInfo | results.WindowInfo | None:
    if reply is None:
        return None
    f = _fields(reply)
    if "window_ms" in f:
        conv: dict[str, int | str] = {
            k: (to_int(v) if isinstance(v, int) else to_str(v)) for k, v in f.items()
        }
        return results.WindowInfo(
            key,
            to_int(f["limit"]),
            to_int(f["window_ms"]),
            to_int(f["precision_ms"]),
            to_int(f["counted"]),
            to_int(f["remaining"]),
            to_int(f["reset_after_ms"]),
            conv,
        )
    return results.BudgetInfo(
        key=key,
        limit=to_int(f["limit"]),
        used=to_int(f["used"]),
        reserved=to_int(f["reserved"]),
        available=to_int(f["available"]),
        overdraft=to_int(f["overdraft"]),
        max_reserve=to_int(f["max_reserve"]),
        default_ttl_ms=to_int(f["default_ttl_ms"]),
        pending=to_int(f["pending"]),
        overrun=to_int(f["overrun"]),
        period=to_str(f["period"]),
        tz=to_str(f["tz"]),
        period_start_ms=to_int(f["period_start_ms"]),
        period_end_ms=to_int(f["period_end_ms"]),
        on_expire=to_str(f["on_expire"]) if "on_expire" in f else "RELEASE",
        unit=to_str(f["unit"]) if "unit" in f else "none",
    )


def parse_pending(reply: Any) -> list[results.PendingReservation]:
    out = []
    for entry in _seq(reply, None, "QUOTA.PENDING"):
        # Six fields since issue 22 (start, last heartbeat); four from earlier servers.
        e = _seq(entry, None, "QUOTA.PENDING entry")
        if len(e) not in (4, 6):
            raise ValueError(f"unexpected QUOTA.PENDING entry reply: {e!r}")
        start = to_int(e[4]) if len(e) == 6 else None
        heartbeat = to_int(e[5]) if len(e) == 6 and to_int(e[5]) != -1 else None
        out.append(
            results.PendingReservation(
                to_str(e[0]), to_int(e[1]), to_int(e[2]), to_int(e[3]), start, heartbeat
            )
        )
    return out


def check_multi(keys: Sequence[str], values: Sequence[int] | None, what: str) -> None:
    if not keys:
        raise ValueError("at least one key")
    if values is not None and len(values) != len(keys):
        raise ValueError(f"one {what} per key: {len(keys)} keys, {len(values)} {what}s")


def mreserve_args(
    keys: Sequence[str], amounts: Sequence[int], id: str | None, ttl_ms: int | None
) -> list[Arg]:
    check_multi(keys, amounts, "amount")
    args: list[Arg] = ["QUOTA.MRESERVE", len(keys), *keys, *amounts]
    if id is not None:
        args += ["ID", id]
    if ttl_ms is not None:
        args += ["TTL", ttl_ms]
    return args


def parse_mreservation(
    reply: Any, keys: Sequence[str], amounts: Sequence[int]
) -> results.MultiReservation:
    r = _seq(reply, 5, "QUOTA.MRESERVE")
    values = tuple(to_int(v) for v in _seq(r[4], len(keys), "QUOTA.MRESERVE values"))
    return results.MultiReservation(
        tuple(keys),
        tuple(amounts),
        to_int(r[0]) == 1,
        opt_str(r[1]),
        to_int(r[2]),
        to_int(r[3]),
        values,
    )


def msettle_args(keys: Sequence[str], id: str, actuals: Sequence[int]) -> list[Arg]:
    check_multi(keys, actuals, "actual")
    return ["QUOTA.MSETTLE", len(keys), *keys, id, *actuals]


def mrollback_args(keys: Sequence[str], id: str) -> list[Arg]:
    check_multi(keys, None, "")
    return ["QUOTA.MROLLBACK", len(keys), *keys, id]


def mextend_args(keys: Sequence[str], id: str, ttl_ms: int) -> list[Arg]:
    check_multi(keys, None, "")
    return ["QUOTA.MEXTEND", len(keys), *keys, id, ttl_ms]


def parse_outcomes(reply: Any, keys: Sequence[str], what: str) -> list[results.KeyOutcome]:
    entries = _seq(reply, len(keys), what)
    out = []
    for key, entry in zip(keys, entries, strict=True):
        e = _seq(entry, 3, f"{what} entry")
        out.append(results.KeyOutcome(key, to_str(e[0]), to_int(e[1]), to_int(e[2])))
    return out


def parse_mextend(reply: Any) -> list[int | None]:
    """One ttl_ms per key (None for a key with nothing to extend, such as a window key)."""
    if not isinstance(reply, list | tuple):
        return [to_int(reply)]
    return [None if v is None else to_int(v) for v in reply]
