//! Module-wide counters for `INFO quota` (fields are prefixed `quota_` by Redis).
//!
//! Outcome counters count decisions made on this server while it was master. Totals of pending
//! reservations, remembered ids and keys follow every value created, changed and freed; they are
//! atomics because `free` may run on Redis's lazy-free thread.

use std::os::raw::c_int;
use std::sync::atomic::{AtomicI64, Ordering};

use redis_module::raw;

macro_rules! counters {
    ($($name:ident => $field:literal: $doc:literal,)*) => {
        $(#[doc = $doc] pub static $name: AtomicI64 = AtomicI64::new(0);)*
        /// Every counter with its INFO field name.
        fn all() -> Vec<(&'static str, i64)> {
            vec![$(($field, $name.load(Ordering::Relaxed)),)*]
        }
    };
}

counters! {
    GRANTED => "reserve_granted": "RESERVE calls that granted (retries of a pending id included).",
    DENIED => "reserve_denied": "RESERVE calls denied for lack of budget.",
    SETTLED => "settled": "SETTLE calls that charged a pending reservation.",
    LATE => "settled_late": "SETTLE calls that charged an already expired reservation.",
    ROLLED_BACK => "rolled_back": "ROLLBACK calls that released a pending reservation.",
    EXPIRED => "expired": "Reservations released because their TTL passed (lazily or by the sweeper).",
    EXPIRED_CHARGE => "expired_charge": "Of `expired`: released under ONEXPIRE CHARGE.",
    EXPIRED_ELAPSED => "expired_elapsed": "Of `expired`: released under ONEXPIRE ELAPSED.",
    EXPIRY_CHARGED => "expiry_charged": "Units charged to `used` by expiries (CHARGE and ELAPSED).",
    CHARGED => "charged": "CHARGE calls that charged (forced ones included).",
    CHARGE_DENIED => "charge_denied": "CHARGE calls denied for lack of budget.",
    WINDOW_ALLOWED => "window_allowed": "QUOTA.WINDOW calls admitted.",
    WINDOW_DENIED => "window_denied": "QUOTA.WINDOW calls denied.",
    MRESERVE_GRANTED => "mreserve_granted": "QUOTA.MRESERVE calls that granted (retries included).",
    MRESERVE_DENIED => "mreserve_denied": "QUOTA.MRESERVE calls denied by one of their keys.",
    MSETTLED => "msettled": "Keys settled or corrected by QUOTA.MSETTLE.",
    MSETTLED_LATE => "msettled_late": "Budget keys QUOTA.MSETTLE settled after their reservation expired.",
    MROLLED_BACK => "mrolled_back": "Keys QUOTA.MROLLBACK rolled back.",
    MEXTENDED => "mextended": "QUOTA.MEXTEND calls that extended.",
    PENDING => "pending_reservations": "Pending reservations held in all budgets.",
    REMEMBERED => "remembered_ids": "Finished ids remembered in all budgets.",
    BUDGET_KEYS => "budget_keys": "Keys of type rq-budget.",
    WINDOW_KEYS => "window_keys": "Keys of type rq-window.",
    SWEEP_RUNS => "sweeper_runs": "Sweeper ticks that ran on a master.",
    SWEEP_RELEASED => "sweeper_released": "Reservations released by the sweeper.",
    SWEEP_LAST_RUN_MS => "sweeper_last_run_ms": "Unix ms of the last sweeper tick that ran.",
    SWEEP_LAG_MS => "sweeper_lag_ms": "Largest (release time - deadline) of the last tick, ms.",
    SWEEP_MAX_LAG_MS => "sweeper_max_lag_ms": "Largest lag ever seen, ms.",
    SWEEP_INDEXED_KEYS => "sweeper_indexed_keys": "Keys in the sweeper's deadline index.",
    USAGE_ENTRIES => "usage_entries": "Usage stream entries added (QUOTA.SET ... STREAM) on this server as master.",
    USAGE_ERRORS => "usage_stream_errors": "Usage stream entries that could not be added (see the log).",
}

/// Adds one to a counter.
pub fn bump(c: &AtomicI64) {
    c.fetch_add(1, Ordering::Relaxed);
}

/// Adds a (possibly negative) delta to a counter.
pub fn add(c: &AtomicI64, delta: i64) {
    // A locked add waits for every pending store; most calls add nothing.
    if delta != 0 {
        c.fetch_add(delta, Ordering::Relaxed);
    }
}

/// Raises a counter to at least `v`.
pub fn raise(c: &AtomicI64, v: i64) {
    c.fetch_max(v, Ordering::Relaxed);
}

/// Sets a counter.
pub fn set(c: &AtomicI64, v: i64) {
    c.store(v, Ordering::Relaxed);
}

/// Module INFO callback: one section, `# quota`.
pub extern "C" fn info_callback(ctx: *mut raw::RedisModuleInfoCtx, _for_crash_report: c_int) {
    // A nameless section is named after the module: `INFO quota`.
    raw::add_info_section(ctx, None);
    for (field, value) in all() {
        raw::add_info_field_long_long(ctx, field, value);
    }
}
