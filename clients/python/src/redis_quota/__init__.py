"""Typed Python client for the redis-quota module (QUOTA.* commands), sync and asyncio.

    import redis
    from redis_quota import Quota

    q = Quota(redis.Redis(socket_timeout=0.2))
    with q.reservation("quota:{t1}:budget", 4096, ttl_ms=60_000) as held:
        tokens = call_the_model()
        held.report(tokens)          # settled on exit; an exception rolls back

See clients/python/README.md and docs/gateway.md.
"""

from .aio import AsyncHeartbeat, AsyncQuota
from .client import Heartbeat, Held, Quota
from .errors import (
    CommandError,
    ConflictError,
    NoQuotaError,
    NoReservationError,
    PendingLimitError,
    QuotaDeniedError,
    QuotaError,
    QuotaReplyError,
    QuotaUnavailableError,
    TooLargeError,
    WrongTypeError,
)
from .policy import FAIL_CLOSED, FailurePolicy, LocalLimiter, QuotaStats
from .results import (
    BudgetInfo,
    Charge,
    KeyOutcome,
    MultiReservation,
    PendingReservation,
    Reservation,
    Rollback,
    Settlement,
    WindowInfo,
    WindowResult,
)

__all__ = [
    "FAIL_CLOSED",
    "AsyncHeartbeat",
    "AsyncQuota",
    "BudgetInfo",
    "Charge",
    "CommandError",
    "ConflictError",
    "FailurePolicy",
    "Heartbeat",
    "Held",
    "KeyOutcome",
    "LocalLimiter",
    "MultiReservation",
    "NoQuotaError",
    "NoReservationError",
    "PendingLimitError",
    "PendingReservation",
    "Quota",
    "QuotaDeniedError",
    "QuotaError",
    "QuotaReplyError",
    "QuotaStats",
    "QuotaUnavailableError",
    "Reservation",
    "Rollback",
    "Settlement",
    "TooLargeError",
    "WindowInfo",
    "WindowResult",
    "WrongTypeError",
]
