"""Typed exceptions for QUOTA.* error replies and for an unreachable or slow Redis.

An error reply from the module starts with a code (docs/commands.md, "Error codes"); each code
maps to one class below. A denial (not enough quota) is a reply, not an error: it raises only
through the context managers (:class:`QuotaDeniedError`).
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

import redis.exceptions

if TYPE_CHECKING:
    from .results import MultiReservation, Reservation


class QuotaError(Exception):
    """Base class of every exception this package raises."""


# A multi-key command's error ends with the listed key at fault: `... (key 'quota:{t}:rpm')`,
# the name shown as ids are (at most 64 bytes then `...`; `\xNN` for other than visible ASCII,
# and for `'` and `\`).
_KEY_AT_FAULT = re.compile(r" \(key '([^']*)'\)$")
_ESCAPED_BYTE = re.compile(rb"\\x([0-9a-f]{2})")


def _key_at_fault(message: str) -> str | None:
    """The key named at the end of ``message``, unescaped (``None`` if none is)."""
    match = _KEY_AT_FAULT.search(message)
    if match is None:
        return None
    shown = match.group(1).encode("utf-8", "backslashreplace")
    raw = _ESCAPED_BYTE.sub(lambda m: bytes([int(m.group(1), 16)]), shown)
    return raw.decode("utf-8", "replace")


class QuotaReplyError(QuotaError, redis.exceptions.ResponseError):
    """The module answered with an error reply; the command changed nothing.

    ``code`` is the reply's first word (``ERR`` for syntax and validation errors). ``key`` is
    the listed key at fault of a multi-key command's error (``WRONGTYPE``, ``NOQUOTA``,
    ``NORESERVATION``, ``CONFLICT``, ...: the reply ends with ``(key '<key>')``), else ``None``;
    a name over 64 bytes is cut there and ends with ``...``.
    """

    code = "ERR"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message
        self.key = _key_at_fault(message)


class CommandError(QuotaReplyError):
    """``ERR ...``: a malformed call, a bad argument, an overflow (or any code not listed here)."""


class NoQuotaError(QuotaReplyError):
    """``NOQUOTA``: no budget at the key (create it with ``QUOTA.SET``)."""

    code = "NOQUOTA"


class ConflictError(QuotaReplyError):
    """``CONFLICT``: the id is known but its state forbids the call (e.g. already settled)."""

    code = "CONFLICT"


class NoReservationError(QuotaReplyError):
    """``NORESERVATION``: the id was never reserved on the key, or has been forgotten."""

    code = "NORESERVATION"


class TooLargeError(QuotaReplyError):
    """``TOOLARGE``: the amount is above the key's ``MAXRESERVE``."""

    code = "TOOLARGE"


class PendingLimitError(QuotaReplyError):
    """``LIMIT``: the key already holds ``quota.max-pending`` live reservations (a window key:
    remembered ids, finished ones included until their bucket leaves the window)."""

    code = "LIMIT"


class WrongTypeError(QuotaReplyError):
    """``WRONGTYPE``: the key holds another type (a window for a budget command, ...)."""

    code = "WRONGTYPE"


class QuotaUnavailableError(QuotaError):
    """Redis could not be reached or did not answer in time, and the call site fails closed.

    The original exception is the ``__cause__``.
    """


class QuotaDeniedError(QuotaError):
    """Raised by the ``reservation()`` / ``mreservation()`` context managers on a denial.

    ``result`` is the denied reply (its ``retry_after_ms`` tells when to try again).
    """

    def __init__(self, result: Reservation | MultiReservation) -> None:
        super().__init__(f"quota denied (retry_after_ms={result.retry_after_ms})")
        self.result = result


_BY_CODE: dict[str, type[QuotaReplyError]] = {
    cls.code: cls
    for cls in (NoQuotaError, ConflictError, NoReservationError, TooLargeError, WrongTypeError)
}


def from_response_error(err: redis.exceptions.ResponseError) -> QuotaReplyError:
    """Maps a redis-py error reply to its typed exception, by the code that starts it.

    redis-py strips the ``ERR `` prefix of ``ERR`` replies, so ``LIMIT`` is recognised by its
    full line (``ERR LIMIT is required ...`` would otherwise look like the ``LIMIT`` code).
    """
    if isinstance(err, QuotaReplyError):
        return err
    message = str(err)
    code = message.split(" ", 1)[0]
    if message.startswith(("LIMIT too many pending", "LIMIT too many remembered")):
        return PendingLimitError(message)
    cls = _BY_CODE.get(code, CommandError)
    return cls(message)
