//! Active expiry of reservations: a timer that, on the master only, releases expired
//! reservations (and forgets stale finished ids) in keys nobody touches, and forgets the ids
//! of multi-key reservations whose bucket left a window key's window.
//!
//! - A module-wide index ([`crate::shell::sweep_index`]) orders keys by their next due time
//!   (soonest reservation deadline or id-forget time; a window's oldest id leaving the window),
//!   so a tick never scans the keyspace: it pops due keys, soonest first.
//! - Each tick does bounded work: at most `quota.sweep-effort` releases and forgets, then it
//!   yields.
//! - Each release is an ordinary effect, replicated as `QUOTA.APPLY` and published as a
//!   `quota.expire` keyspace event. Replicas never sweep: they apply the master's effects.
//! - Nothing is replicated while `RM_AvoidReplicaTraffic()` says so (failover, CLIENT PAUSE).
//! - Timers are not persisted: the timer is armed at load and re-armed by every tick on every
//!   role; the index is rebuilt from RDB loads, AOF replays and replicated writes, so a restart,
//!   a failover or DEBUG RELOAD leaves it complete.

use std::time::Duration;

use redis_module::{raw, Context, ContextFlags, NotifyEvent, RedisString};

use crate::core::ledger::Budget;
use crate::core::window::{Window, WindowEffect};
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::key::ModuleKey;
use crate::shell::sweep_index::{
    any_due, new_epoch, pop_due, select_db, selected_db, track_budget, track_window,
};
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{apply, clock, config, stats, window_effects};

/// How often the sweeper runs (ms): an expired reservation is released within about this long
/// after its deadline while each tick keeps up.
pub const SWEEP_INTERVAL_MS: u64 = 50;

/// The gap before the next tick when a tick used its whole effort and keys are still due (a
/// storm of expiries): each tick stays within `quota.sweep-effort`, but they come back to back
/// with a 1 ms gap for clients, like Redis's fast expire cycle, until the backlog is gone.
pub const CATCH_UP_INTERVAL_MS: u64 = 1;

fn avoid_replica_traffic() -> bool {
    // SAFETY: plain API call, no arguments.
    unsafe {
        raw::RedisModule_AvoidReplicaTraffic
            .map(|f| f() != 0)
            .unwrap_or(false)
    }
}

/// Arms the first tick (called at module load).
pub fn start(ctx: &Context) {
    ctx.create_timer(Duration::from_millis(SWEEP_INTERVAL_MS), tick, ());
}

/// One tick, then the next one armed: soon if this one left keys due (see
/// [`CATCH_UP_INTERVAL_MS`]), else after [`SWEEP_INTERVAL_MS`].
fn tick(ctx: &Context, _: ()) {
    let next = if sweep(ctx) {
        CATCH_UP_INTERVAL_MS
    } else {
        SWEEP_INTERVAL_MS
    };
    ctx.create_timer(Duration::from_millis(next), tick, ());
}

/// Releases expired reservations and forgets stale ids, at most `quota.sweep-effort` of them,
/// soonest due keys first, on a master. True if it used its whole effort and keys are still due.
fn sweep(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    if !flags.contains(ContextFlags::MASTER)
        || flags.contains(ContextFlags::LOADING)
        || avoid_replica_traffic()
    {
        return false;
    }
    let effort = config::sweep_effort();
    if effort == 0 {
        return false;
    }
    let now = clock::wall_ms();
    let keep = config::policy().keep_ms;
    let mut left = effort;
    let mut lag = 0i64;
    let mut current_db = 0;
    while left > 0 {
        let Some((_, db, name)) = pop_due(now) else {
            break;
        };
        if db != current_db {
            if !select_db(ctx, db) {
                continue;
            }
            current_db = db;
        }
        let (work, key_lag) = sweep_key(ctx, db, &name, now, keep, left);
        left = left.saturating_sub(work.max(1));
        lag = lag.max(key_lag);
    }
    if current_db != 0 {
        select_db(ctx, 0);
    }
    stats::bump(&stats::SWEEP_RUNS);
    stats::set(&stats::SWEEP_LAST_RUN_MS, now);
    stats::set(&stats::SWEEP_LAG_MS, lag);
    stats::raise(&stats::SWEEP_MAX_LAG_MS, lag);
    left == 0 && any_due(now)
}

/// Sweeps one key with at most `max` effects (releases and forgets); returns (effects applied,
/// largest lag in ms).
fn sweep_key(ctx: &Context, db: i32, name: &[u8], now: i64, keep: i64, max: usize) -> (usize, i64) {
    // Not `ctx.create_string`: it goes through `CString::new(..).unwrap()` and panics on a key
    // name containing a NUL byte, which is a valid Redis key.
    let key_name = RedisString::create_from_slice(ctx.ctx, name);
    // One writable open: a stale entry (key deleted, renamed, retyped) or a key with nothing
    // due writes nothing and is declared unchanged, so WATCH and client tracking see nothing.
    let Ok(mut key) = ModuleKey::open_writable(ctx, &key_name) else {
        return (0, 0);
    };
    let effects = match key.value::<Budget>(&BUDGET_TYPE) {
        Ok(Some(budget)) => {
            let effects = budget.plan_sweep(budget.now(now), keep, max);
            if effects.is_empty() {
                track_budget(db, name, budget);
            }
            effects
        }
        Ok(None) => Default::default(),
        Err(_) => return sweep_window(ctx, key, &key_name, db, now),
    };
    if effects.is_empty() {
        key.unchanged();
        return (0, 0);
    }
    let Ok(Some(budget)) = key.value_mut::<Budget>(&BUDGET_TYPE) else {
        key.unchanged();
        return (0, 0);
    };
    let at = budget.now(now);
    // Releases go soonest deadline first: the largest lag is the soonest deadline's.
    let lag = match budget.book().first_deadline() {
        Some(d) if apply::releases(&effects) > 0 => at.saturating_sub(d).max(0),
        _ => 0,
    };
    // A sweep is not a command: its releases move the key's time only to their deadlines and
    // its forgets not at all (`Budget::apply`), as a write's own cleanup does, so a swept key
    // and an unswept one answer every later command alike. The effects that apply are
    // replicated and counted (INFO's expired) as any write's lazy releases are.
    let result = apply::apply_and_replicate(ctx, &key_name, budget, at, &effects);
    let released = apply::releases(effects.get(..result.applied).unwrap_or(&[]));
    stats::add(&stats::SWEEP_RELEASED, released);
    (result.applied, lag)
}

/// Forgets the ids of a window key whose bucket left the window (one `FORGET` effect,
/// replicated; counted as one unit of effort per id). Returns (ids forgotten, lag 0).
fn sweep_window(
    ctx: &Context,
    mut key: ModuleKey,
    key_name: &RedisString,
    db: i32,
    now: i64,
) -> (usize, i64) {
    let stale = match key.value::<Window>(&WINDOW_TYPE) {
        Ok(Some(w)) => {
            let stale = w.stale_ids(now);
            if stale == 0 {
                track_window(db, key_name.as_slice(), w, true);
            }
            stale
        }
        _ => 0,
    };
    if stale == 0 {
        key.unchanged();
        return (0, 0);
    }
    match window_effects::apply_and_propagate(ctx, &mut key, key_name, now, &[WindowEffect::Forget])
    {
        Ok(()) => (stale, 0),
        Err(_) => (0, 0),
    }
}

/// Keyspace hook: a budget (or a window key with ids) that arrives under a new name (RENAME,
/// MOVE, COPY, RESTORE) is indexed under it.
pub fn on_keyspace_event(ctx: &Context, _event_type: NotifyEvent, event: &str, key: &[u8]) {
    if !matches!(event, "rename_to" | "move_to" | "copy_to" | "restore") {
        return;
    }
    // A renamed or moved budget's tag names its former key.
    new_epoch();
    // NUL-safe, as in `sweep_key`: this hook sees every renamed, moved, copied or restored key.
    let key_name = RedisString::create_from_slice(ctx.ctx, key);
    let k = ctx.open_key(&key_name);
    if let Ok(Some(budget)) = k.get_value::<Budget>(&BUDGET_TYPE) {
        track_budget(selected_db(ctx), key, budget);
    } else if let Ok(Some(window)) = k.get_value::<Window>(&WINDOW_TYPE) {
        track_window(selected_db(ctx), key, window, false);
    }
}
