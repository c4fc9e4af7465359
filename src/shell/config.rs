//! Module configs (`CONFIG GET/SET quota.*`, or `loadmodule ... name value`).
//!
//! Each is an atomic read on the command path. They shape decisions on the master only: replicas
//! and AOF replays apply effects that already carry every resolved value.

use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use crate::core::ledger::{Policy, DEFAULT_KEEP_MS, DEFAULT_TTL_MS};

/// `quota.default-ttl` (ms): reservation TTL of keys created without `TTL`.
pub static DEFAULT_TTL: AtomicI64 = AtomicI64::new(DEFAULT_TTL_MS);
/// `quota.finished-ttl` (ms): how long settled / rolled back / expired / charged ids are remembered.
pub static FINISHED_TTL: AtomicI64 = AtomicI64::new(DEFAULT_KEEP_MS);
/// `quota.max-pending`: most pending reservations per key; RESERVE beyond it fails with `-LIMIT`.
pub static MAX_PENDING: AtomicI64 = AtomicI64::new(1_000_000);
/// `quota.max-id-length` (bytes).
pub static MAX_ID_LENGTH: AtomicI64 = AtomicI64::new(128);
/// `quota.sweep-effort`: most reservations the active sweeper releases per tick; 0 turns the
/// sweeper off (expired reservations are then released lazily, by writes to their key).
pub static SWEEP_EFFORT: AtomicI64 = AtomicI64::new(1000);
/// `quota.test-clock`: when on, time-dependent commands accept `AT unix_ms`. Unsafe in production.
pub static TEST_CLOCK: AtomicBool = AtomicBool::new(false);

/// The policy for one command, read from the configs.
pub fn policy() -> Policy {
    Policy {
        keep_ms: FINISHED_TTL.load(Ordering::Relaxed),
        max_pending: MAX_PENDING.load(Ordering::Relaxed),
    }
}

pub fn max_id_length() -> i64 {
    MAX_ID_LENGTH.load(Ordering::Relaxed)
}

pub fn default_ttl() -> i64 {
    DEFAULT_TTL.load(Ordering::Relaxed)
}

pub fn test_clock() -> bool {
    TEST_CLOCK.load(Ordering::Relaxed)
}
