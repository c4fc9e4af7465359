//! Typed errors of the pure core. Each renders as a Redis error line whose first word is the
//! error code (`ERR`, `TOOLARGE`, `NORESERVATION`, `CONFLICT`, ...), so the shell replies with
//! `to_string()` unchanged.

use std::fmt;

/// What a ledger command can fail with. Every variant leaves the budget unchanged.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum LedgerError {
    /// A single reservation or charge above the key's MAXRESERVE (`TOOLARGE`).
    TooLarge { amount: i64, max: i64 },
    /// The id was never seen or has been forgotten (`NORESERVATION`).
    NoReservation { id: Vec<u8> },
    /// The id is known but in a state that forbids the call (`CONFLICT`); `state` names it:
    /// `pending`, `settled`, `rolledback`, `expired`, `charged`.
    Conflict {
        id: Vec<u8>,
        state: &'static str,
        why: &'static str,
    },
    /// A sum would leave the 64-bit range (`ERR`): nothing is wrapped.
    Overflow,
    /// The per-key pending cap was reached (`LIMIT`).
    TooManyPending { max: i64 },
    /// A window key holds as many remembered ids as the cap allows (`LIMIT`): finished ones
    /// count until their bucket leaves the window.
    TooManyRemembered { max: i64 },
    /// An effect replayed on a replica or from the AOF does not fit the state (`ERR`): a sign
    /// that the stream was produced from another state. Nothing is applied.
    BadEffect(&'static str),
    /// A stored budget (loaded from an RDB, RESTORE or `QUOTA.LOAD`) breaks an invariant
    /// (`ERR`); it is refused.
    Corrupt(&'static str),
    /// Invalid argument value caught by the core (`ERR`).
    Invalid(&'static str),
    /// A calendar period error, already rendered with its code (`ERR ...`).
    Period(String),
}

/// Shows at most 64 bytes of an id in an error line (then `...`), escaping as `\xNN` every byte
/// that is not visible ASCII, and `'` and `\`, so the line stays a valid RESP simple error (no
/// CR/LF, no NUL) and the quoted id reads back unambiguously.
pub fn printable_id(id: &[u8]) -> String {
    let mut out = String::new();
    for &b in id.iter().take(64) {
        // The quotes around the id and the escape character are escaped too: unambiguous.
        if b.is_ascii_graphic() && b != b'\'' && b != b'\\' {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("\\x{b:02x}"));
        }
    }
    if id.len() > 64 {
        out.push_str("...");
    }
    out
}

impl fmt::Display for LedgerError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LedgerError::TooLarge { amount, max } => {
                write!(f, "TOOLARGE amount {amount} exceeds MAXRESERVE {max}")
            }
            LedgerError::NoReservation { id } => {
                write!(
                    f,
                    "NORESERVATION no reservation with id '{}'",
                    printable_id(id)
                )
            }
            LedgerError::Conflict { id, state, why } => {
                write!(f, "CONFLICT id '{}' is {state}: {why}", printable_id(id))
            }
            LedgerError::Overflow => write!(f, "ERR amount out of range: the sum would overflow"),
            LedgerError::TooManyPending { max } => {
                write!(
                    f,
                    "LIMIT too many pending reservations on this key (max {max})"
                )
            }
            LedgerError::TooManyRemembered { max } => {
                write!(
                    f,
                    "LIMIT too many remembered ids on this window key (max {max}, finished \
                     ones included until their bucket leaves the window)"
                )
            }
            LedgerError::BadEffect(why) => write!(f, "ERR effect does not apply: {why}"),
            LedgerError::Corrupt(why) => write!(f, "ERR corrupt budget value: {why}"),
            LedgerError::Invalid(why) => write!(f, "ERR {why}"),
            LedgerError::Period(msg) => write!(f, "{msg}"),
        }
    }
}

impl std::error::Error for LedgerError {}

#[cfg(test)]
#[allow(clippy::unwrap_used, clippy::indexing_slicing)]
mod tests {
    use super::printable_id;

    #[test]
    fn ids_are_shown_unambiguously() {
        assert_eq!(printable_id(b"req-42"), "req-42");
        assert_eq!(
            printable_id(b"a b'c\\d\r\n\0\xff"),
            "a\\x20b\\x27c\\x5cd\\x0d\\x0a\\x00\\xff"
        );
        assert_eq!(printable_id(&[b'x'; 65]), format!("{}...", "x".repeat(64)));
    }
}
