"""One plan per command, shared by the sync and asyncio clients: the arguments, how to read the
reply, and the degrade-mode answer from the local limiter. The clients only do the I/O."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import redis.exceptions

from . import _protocol as p
from . import results
from .errors import QuotaError, QuotaUnavailableError, from_response_error
from .policy import FailurePolicy, LocalLimiter, QuotaStats

T = TypeVar("T")


@dataclass(frozen=True)
class Call(Generic[T]):
    """A command to send: ``args``, ``parse`` for its reply, and for degrade mode ``local``
    (the answer when Redis fails; None: none, the call fails closed) and ``local_first`` (an
    answer without asking Redis at all, for ids the local limiter granted; None to ask)."""

    args: list[p.Arg]
    parse: Callable[[Any], T]
    local: Callable[[LocalLimiter], T] | None = None
    local_first: Callable[[LocalLimiter], T | None] | None = None


def _rem(values: Sequence[int], i: int) -> int:
    return values[i] if i < len(values) else -1


class Plans:
    """Builds a :class:`Call` per command; counts degrade-mode outcomes in ``stats``."""

    def __init__(self, stats: QuotaStats) -> None:
        self.stats = stats

    def local_first(self, call: Call[T], pol: FailurePolicy) -> T | None:
        """The answer without asking Redis (an id the local limiter granted), or None to ask."""
        if pol.limiter is None or call.local_first is None:
            return None
        return call.local_first(pol.limiter)

    def unavailable(self, call: Call[T], pol: FailurePolicy, err: BaseException) -> T:
        """Redis failed with ``err`` (one of ``UNAVAILABLE_ERRORS``): the degrade-mode answer,
        or :class:`QuotaUnavailableError` when the call fails closed. Counted in ``stats``."""
        closed = pol.limiter is None or call.local is None
        name = p.to_str(call.args[0])
        self.stats.record_failure(name, err, closed)
        if pol.limiter is None or call.local is None:
            raise QuotaUnavailableError(f"{name}: {err}") from err
        return call.local(pol.limiter)

    def refused(self, err: redis.exceptions.ResponseError) -> QuotaError:
        """The typed exception to raise for an error reply (Redis answered: counted as ok)."""
        self.stats.record_ok()
        return from_response_error(err)

    def parse(self, call: Call[T], reply: Any) -> T:
        """The result of ``call`` from its reply."""
        self.stats.record_ok()
        return call.parse(reply)

    def _granted(self, ok: bool) -> None:
        self.stats.add("degraded_grants" if ok else "degraded_denials")

    def reserve(
        self, key: str, amount: int, id: str | None, ttl_ms: int | None
    ) -> Call[results.Reservation]:
        def local(lim: LocalLimiter) -> results.Reservation:
            got, _, rem = lim.reserve([key], [amount], id, ttl_ms)
            self._granted(got is not None)
            retry = 0 if got is not None else lim.retry_after_ms()
            return results.Reservation(
                key, amount, got is not None, got, rem[0], retry, degraded=True
            )

        return Call(
            p.reserve_args(key, amount, id, ttl_ms),
            lambda r: p.parse_reservation(r, key, amount),
            local,
        )

    def settle(self, key: str, id: str, actual: int) -> Call[results.Settlement]:
        def first(lim: LocalLimiter) -> results.Settlement | None:
            rem = lim.settle(id, {key: actual})
            return (
                None
                if rem is None
                else results.Settlement(key, id, "settled", actual, rem[0], True)
            )

        def local(lim: LocalLimiter) -> results.Settlement:
            self.stats.add("unrecorded")
            _, rem = lim.count(key, actual, check=False)
            return results.Settlement(key, id, "unrecorded", actual, rem, degraded=True)

        return Call(
            ["QUOTA.SETTLE", key, id, actual],
            lambda r: p.parse_settlement(r, key, id),
            local,
            first,
        )

    def rollback(self, key: str, id: str) -> Call[results.Rollback]:
        def first(lim: LocalLimiter) -> results.Rollback | None:
            rem = lim.settle(id, None)
            return None if rem is None else results.Rollback(key, id, "rolledback", 0, rem[0], True)

        def local(lim: LocalLimiter) -> results.Rollback:
            self.stats.add("unrecorded")
            return results.Rollback(key, id, "unrecorded", 0, -1, degraded=True)

        return Call(
            ["QUOTA.ROLLBACK", key, id],
            lambda r: p.parse_rollback(r, key, id),
            local,
            first,
        )

    def extend(self, key: str, id: str, ttl_ms: int) -> Call[int]:
        def first(lim: LocalLimiter) -> int | None:
            return ttl_ms if lim.extend(id, ttl_ms) else None

        def local(lim: LocalLimiter) -> int:
            return ttl_ms  # the module's reservation keeps its deadline; nothing to do locally

        return Call(["QUOTA.EXTEND", key, id, ttl_ms], p.to_int, local, first)

    def charge(self, key: str, amount: int, id: str | None, force: bool) -> Call[results.Charge]:
        def local(lim: LocalLimiter) -> results.Charge:
            ok, rem = lim.count(key, amount, check=not force)
            self._granted(ok)
            return results.Charge(key, amount, ok, rem, 0 if ok else lim.retry_after_ms(), True)

        return Call(
            p.charge_args(key, amount, id, force),
            lambda r: p.parse_charge(r, key, amount),
            local,
        )

    def window(
        self,
        key: str,
        limit: int | None,
        window_ms: int | None,
        cost: int,
        precision_ms: int | None,
        peek: bool,
    ) -> Call[results.WindowResult]:
        def local(lim: LocalLimiter) -> results.WindowResult:
            ok, rem = lim.count(key, 0 if peek else cost, check=True)
            self._granted(ok)
            retry = 0 if ok else lim.retry_after_ms()
            return results.WindowResult(key, cost, ok, rem, retry, lim.retry_after_ms(), True)

        return Call(
            p.window_args(key, limit, window_ms, cost, precision_ms, peek),
            lambda r: p.parse_window(r, key, cost),
            local,
        )

    def info(self, key: str) -> Call[results.BudgetInfo | results.WindowInfo | None]:
        return Call(["QUOTA.INFO", key], lambda r: p.parse_info(r, key))

    def pending(self, key: str, count: int | None) -> Call[list[results.PendingReservation]]:
        args: list[p.Arg] = ["QUOTA.PENDING", key]
        if count is not None:
            args += ["COUNT", count]
        return Call(args, p.parse_pending)

    def set(self, args: list[p.Arg]) -> Call[bool]:
        return Call(args, lambda r: p.to_int(r) == 1)

    def mreserve(
        self, keys: Sequence[str], amounts: Sequence[int], id: str | None, ttl_ms: int | None
    ) -> Call[results.MultiReservation]:
        args = p.mreserve_args(keys, amounts, id, ttl_ms)

        def local(lim: LocalLimiter) -> results.MultiReservation:
            got, denied, rem = lim.reserve(keys, amounts, id, ttl_ms)
            self._granted(got is not None)
            retry = 0 if got is not None else lim.retry_after_ms()
            return results.MultiReservation(
                tuple(keys), tuple(amounts), got is not None, got, denied, retry, tuple(rem), True
            )

        return Call(args, lambda r: p.parse_mreservation(r, keys, amounts), local)

    def msettle(
        self, keys: Sequence[str], id: str, actuals: Sequence[int]
    ) -> Call[list[results.KeyOutcome]]:
        args = p.msettle_args(keys, id, actuals)
        by_key = dict(zip(keys, actuals, strict=True))

        def first(lim: LocalLimiter) -> list[results.KeyOutcome] | None:
            rem = lim.settle(id, by_key)
            if rem is None:
                return None
            return [
                results.KeyOutcome(k, "settled", a, _rem(rem, i), True)
                for i, (k, a) in enumerate(zip(keys, actuals, strict=True))
            ]

        def local(lim: LocalLimiter) -> list[results.KeyOutcome]:
            self.stats.add("unrecorded")
            out = []
            for k, a in zip(keys, actuals, strict=True):
                _, rem = lim.count(k, a, check=False)
                out.append(results.KeyOutcome(k, "unrecorded", a, rem, True))
            return out

        return Call(args, lambda r: p.parse_outcomes(r, keys, "QUOTA.MSETTLE"), local, first)

    def mrollback(self, keys: Sequence[str], id: str) -> Call[list[results.KeyOutcome]]:
        def first(lim: LocalLimiter) -> list[results.KeyOutcome] | None:
            rem = lim.settle(id, None)
            if rem is None:
                return None
            return [
                results.KeyOutcome(k, "rolledback", 0, _rem(rem, i), True)
                for i, k in enumerate(keys)
            ]

        def local(lim: LocalLimiter) -> list[results.KeyOutcome]:
            self.stats.add("unrecorded")
            return [results.KeyOutcome(k, "unrecorded", 0, -1, True) for k in keys]

        return Call(
            p.mrollback_args(keys, id),
            lambda r: p.parse_outcomes(r, keys, "QUOTA.MROLLBACK"),
            local,
            first,
        )

    def mextend(self, keys: Sequence[str], id: str, ttl_ms: int) -> Call[list[int | None]]:
        def first(lim: LocalLimiter) -> list[int | None] | None:
            return [ttl_ms for _ in keys] if lim.extend(id, ttl_ms) else None

        def local(lim: LocalLimiter) -> list[int | None]:
            return [ttl_ms for _ in keys]

        return Call(p.mextend_args(keys, id, ttl_ms), p.parse_mextend, local, first)
