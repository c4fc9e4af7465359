"""Replies of the QUOTA.* commands as dataclasses (shapes: docs/commands.md).

Amounts are integers in the tenant's own unit; times and durations are milliseconds.
``degraded`` is true when the answer came from the local fallback limiter because Redis was
unreachable or slow (see :mod:`redis_quota.policy`), not from the module.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Reservation:
    """QUOTA.RESERVE: ``[granted, id, available, retry_after_ms]``.

    ``id`` is None on a denial. ``retry_after_ms`` is 0 on a grant; on a denial the ms until
    the budget's period ends, or -1 when waiting for the period would not help.
    """

    key: str
    amount: int
    granted: bool
    id: str | None
    available: int
    retry_after_ms: int
    degraded: bool = False


@dataclass(frozen=True)
class Settlement:
    """QUOTA.SETTLE: ``[status, charged, available]``; status ``settled``, ``late`` or
    ``duplicate`` (``unrecorded`` in degrade mode: Redis could not be told)."""

    key: str
    id: str
    status: str
    charged: int
    available: int
    degraded: bool = False


@dataclass(frozen=True)
class Rollback:
    """QUOTA.ROLLBACK: ``[status, released, available]``; status ``rolledback``,
    ``duplicate`` or ``expired`` (``unrecorded`` in degrade mode)."""

    key: str
    id: str
    status: str
    released: int
    available: int
    degraded: bool = False


@dataclass(frozen=True)
class Charge:
    """QUOTA.CHARGE: ``[charged, available, retry_after_ms]``."""

    key: str
    amount: int
    charged: bool
    available: int
    retry_after_ms: int
    degraded: bool = False


@dataclass(frozen=True)
class WindowResult:
    """QUOTA.WINDOW: ``[allowed, remaining, retry_after_ms, reset_after_ms]``.

    ``retry_after_ms`` is -1 when the cost can never fit under the limit.
    """

    key: str
    cost: int
    allowed: bool
    remaining: int
    retry_after_ms: int
    reset_after_ms: int
    degraded: bool = False


@dataclass(frozen=True)
class BudgetInfo:
    """QUOTA.INFO of a budget key (15 fields; ``period_*_ms`` -1 without a period).

    ``on_expire`` (RELEASE, CHARGE, ELAPSED) and ``unit`` (ms, s, min, none) are the defaults
    when an earlier server did not send them.
    """

    key: str
    limit: int
    used: int
    reserved: int
    available: int
    overdraft: int
    max_reserve: int
    default_ttl_ms: int
    pending: int
    overrun: int
    period: str
    tz: str
    period_start_ms: int
    period_end_ms: int
    on_expire: str = "RELEASE"
    unit: str = "none"


@dataclass(frozen=True)
class WindowInfo:
    """QUOTA.INFO of a configured window key (``QUOTA.SET key WINDOW limit window_ms``).

    ``fields`` keeps every field the server sent, for fields added later.
    """

    key: str
    limit: int
    window_ms: int
    precision_ms: int
    counted: int
    remaining: int
    reset_after_ms: int
    fields: dict[str, int | str] = field(default_factory=dict)


@dataclass(frozen=True)
class PendingReservation:
    """One entry of QUOTA.PENDING: ``[id, amount, age_ms, ttl_ms, start_ms, heartbeat_ms]``.

    ``start_ms``: the grant time (``None`` from a server before issue 22); ``heartbeat_ms``: the
    last EXTEND (``None`` if none).
    """

    id: str
    amount: int
    age_ms: int
    ttl_ms: int
    start_ms: int | None = None
    heartbeat_ms: int | None = None


@dataclass(frozen=True)
class MultiReservation:
    """QUOTA.MRESERVE: ``[granted, id, denied_index, retry_after_ms, [value per key]]``.

    ``denied_index`` is -1 on a grant, else the index of the first key that denied;
    ``retry_after_ms`` is that key's; each value is a budget's available or a window's
    remaining after the call.
    """

    keys: tuple[str, ...]
    amounts: tuple[int, ...]
    granted: bool
    id: str | None
    denied_index: int
    retry_after_ms: int
    values: tuple[int, ...]
    degraded: bool = False

    @property
    def denied_key(self) -> str | None:
        """The key that denied, or None on a grant."""
        if 0 <= self.denied_index < len(self.keys):
            return self.keys[self.denied_index]
        return None


@dataclass(frozen=True)
class KeyOutcome:
    """One key's part of QUOTA.MSETTLE / QUOTA.MROLLBACK: ``[status, amount, value]``.

    MSETTLE: a budget answers as QUOTA.SETTLE (``settled``/``late``/``duplicate``, charged,
    available), a window ``corrected`` or ``skipped``, the actual, its remaining. MROLLBACK:
    as QUOTA.ROLLBACK (``rolledback``/``duplicate``/``expired``, released, value).
    """

    key: str
    status: str
    amount: int
    value: int
    degraded: bool = False
