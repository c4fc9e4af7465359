//! Module configs (`CONFIG GET/SET quota.*`, or `loadmodule ... name value`).
//!
//! Each is an atomic read on the command path. They shape decisions on the master only: replicas
//! and AOF replays apply effects that already carry every resolved value.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::core::ledger::{Policy, DEFAULT_KEEP_MS, DEFAULT_TTL_MS};

/// Defaults of the integer configs, for the statics below and their registration in
/// `src/lib.rs`: ms, ms, reservations, bytes, releases per tick.
pub const DEFAULT_TTL_DEFAULT: i64 = DEFAULT_TTL_MS;
pub const FINISHED_TTL_DEFAULT: i64 = DEFAULT_KEEP_MS;
pub const MAX_PENDING_DEFAULT: i64 = 1_000_000;
pub const MAX_ID_LENGTH_DEFAULT: i64 = 128;
pub const SWEEP_EFFORT_DEFAULT: i64 = 1000;

/// `quota.default-ttl` (ms): reservation TTL of keys created without `TTL`.
pub static DEFAULT_TTL: AtomicI64 = AtomicI64::new(DEFAULT_TTL_DEFAULT);
/// `quota.finished-ttl` (ms): how long settled / rolled back / expired / charged ids are remembered.
pub static FINISHED_TTL: AtomicI64 = AtomicI64::new(FINISHED_TTL_DEFAULT);
/// `quota.max-pending`: most pending reservations per key; RESERVE beyond it fails with `-LIMIT`.
pub static MAX_PENDING: AtomicI64 = AtomicI64::new(MAX_PENDING_DEFAULT);
/// `quota.max-id-length` (bytes).
pub static MAX_ID_LENGTH: AtomicI64 = AtomicI64::new(MAX_ID_LENGTH_DEFAULT);
/// `quota.sweep-effort`: most releases and forgets the active sweeper makes per tick; 0 turns the
/// sweeper off (expired reservations are then released lazily, by writes to their key).
pub static SWEEP_EFFORT: AtomicI64 = AtomicI64::new(SWEEP_EFFORT_DEFAULT);
/// `quota.test-clock`: when on, time-dependent commands accept `AT unix_ms`. Unsafe in production.
pub static TEST_CLOCK: AtomicBool = AtomicBool::new(false);

/// Ranges (min, max) of the integer configs: their registration in `src/lib.rs` and the check
/// of `loadmodule` arguments ([`check_module_args`]) use the same bounds. `quota.default-ttl`
/// (ms).
pub const DEFAULT_TTL_RANGE: (i64, i64) = (1, crate::core::ledger::MAX_TTL_MS);
/// `quota.finished-ttl` (ms).
pub const FINISHED_TTL_RANGE: (i64, i64) = (0, i64::MAX);
/// `quota.max-pending` (reservations per key).
pub const MAX_PENDING_RANGE: (i64, i64) = (1, i64::MAX);
/// `quota.max-id-length` (bytes).
pub const MAX_ID_LENGTH_RANGE: (i64, i64) = (1, 65_536);
/// `quota.sweep-effort` (releases and forgets per tick; 0: no active expiry).
pub const SWEEP_EFFORT_RANGE: (i64, i64) = (0, 1_000_000);

/// Checks `loadmodule path name value ...` arguments. Redis 7.0 takes them as the configs'
/// defaults without checking their bounds (`max-id-length 0` would refuse every id, a negative
/// `sweep-effort` would silently stop the sweeper, `test-clock maybe` would read as `no`), so
/// the module refuses to load instead: every argument must be a known config, once, with a
/// value `CONFIG SET` would accept.
pub fn check_module_args(args: &[&[u8]]) -> Result<(), String> {
    let shown = crate::core::error::printable_id;
    if args.len() % 2 != 0 {
        return Err("module arguments must be pairs: name value ...".to_string());
    }
    let mut seen: Vec<&[u8]> = Vec::new();
    for pair in args.chunks(2) {
        let (Some(&name), Some(&value)) = (pair.first(), pair.get(1)) else {
            continue;
        };
        if seen.contains(&name) {
            return Err(format!("config '{}' given twice", shown(name)));
        }
        seen.push(name);
        let range = match name {
            b"default-ttl" => DEFAULT_TTL_RANGE,
            b"finished-ttl" => FINISHED_TTL_RANGE,
            b"max-pending" => MAX_PENDING_RANGE,
            b"max-id-length" => MAX_ID_LENGTH_RANGE,
            b"sweep-effort" => SWEEP_EFFORT_RANGE,
            b"test-clock" => {
                if value != b"yes" && value != b"no" {
                    return Err(format!(
                        "test-clock must be 'yes' or 'no', got '{}'",
                        shown(value)
                    ));
                }
                continue;
            }
            _ => return Err(format!("unknown config '{}'", shown(name))),
        };
        // Canonical spellings only, as `CONFIG SET` takes them (`007`, `+5`, `-0` refused).
        let n = crate::shell::args::parse_canonical_i64(value);
        match n {
            Some(n) if n >= range.0 && n <= range.1 => {}
            _ => {
                return Err(format!(
                    "{} must be an integer between {} and {}, got '{}'",
                    shown(name),
                    range.0,
                    range.1,
                    shown(value)
                ))
            }
        }
    }
    Ok(())
}

/// The policy for one command, read from the configs.
pub fn policy() -> Policy {
    Policy {
        keep_ms: FINISHED_TTL.load(Ordering::Relaxed),
        max_pending: MAX_PENDING.load(Ordering::Relaxed),
    }
}

/// `quota.max-id-length` now (bytes).
pub fn max_id_length() -> i64 {
    MAX_ID_LENGTH.load(Ordering::Relaxed)
}

/// `quota.default-ttl` now (ms).
pub fn default_ttl() -> i64 {
    DEFAULT_TTL.load(Ordering::Relaxed)
}

/// `quota.test-clock` now: do time-dependent commands accept `AT`?
pub fn test_clock() -> bool {
    TEST_CLOCK.load(Ordering::Relaxed)
}

/// `quota.sweep-effort` now (releases and forgets per sweeper tick; 0: no active expiry).
pub fn sweep_effort() -> usize {
    usize::try_from(SWEEP_EFFORT.load(Ordering::Relaxed)).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(args: &[&str]) -> Result<(), String> {
        let raw: Vec<&[u8]> = args.iter().map(|a| a.as_bytes()).collect();
        check_module_args(&raw)
    }

    #[test]
    fn module_args_are_checked_like_config_set() {
        assert_eq!(check(&[]), Ok(()));
        let good = [
            "default-ttl",
            "1",
            "finished-ttl",
            "0",
            "max-pending",
            "9223372036854775807",
            "max-id-length",
            "65536",
            "sweep-effort",
            "0",
            "test-clock",
            "yes",
        ];
        assert_eq!(check(&good), Ok(()));
        for bad in [
            &["max-id-length", "0"][..],
            &["max-id-length", "65537"],
            &["sweep-effort", "-1"],
            &["sweep-effort", "1000001"],
            &["max-pending", "0"],
            &["default-ttl", "0"],
            &["finished-ttl", "-1"],
            &["default-ttl", "1e3"],
            &["default-ttl", " 5"],
            &["sweep-effort", "007"],
            &["sweep-effort", "+5"],
            &["sweep-effort", "-0"],
            &["test-clock", "maybe"],
            &["test-clock", "YES"],
            &["sweep-efort", "5"],
            &["quota.sweep-effort", "5"],
            &["sweep-effort"],
            &["sweep-effort", "5", "sweep-effort", "6"],
        ] {
            assert!(check(bad).is_err(), "{bad:?}");
        }
        let msg = check(&["max-id-length", "0"]).unwrap_err();
        assert_eq!(
            msg,
            "max-id-length must be an integer between 1 and 65536, got '0'"
        );
    }
}
