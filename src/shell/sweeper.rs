//! Active expiry of reservations: a timer that, on the master only, releases expired
//! reservations (and forgets stale finished ids) in keys nobody touches.
//!
//! - A module-wide index orders keys by their next due time (soonest reservation deadline or
//!   id-forget time), so a tick never scans the keyspace: it pops due keys, soonest first.
//! - Each tick does bounded work: at most `quota.sweep-effort` releases and forgets, then it
//!   yields.
//! - Each release is an ordinary effect, replicated as `QUOTA.APPLY` and published as a
//!   `quota.expire` keyspace event. Replicas never sweep: they apply the master's effects.
//! - Nothing is replicated while `RM_AvoidReplicaTraffic()` says so (failover, CLIENT PAUSE).
//! - Timers are not persisted: the timer is armed at load and re-armed by every tick on every
//!   role; the index is rebuilt from RDB loads, AOF replays and replicated writes, so a restart,
//!   a failover or DEBUG RELOAD leaves it complete.
//!
//! The index is a hint: an entry whose key was deleted, renamed or changed type is dropped when
//! it comes due; a renamed key is indexed again under its new name by the keyspace event hook.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use redis_module::{raw, Context, ContextFlags, NotifyEvent, RedisString};

use crate::core::ledger::Budget;
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::key::ModuleKey;
use crate::shell::{apply, clock, config, stats};

/// How often the sweeper runs (ms): an expired reservation is released within about this long
/// after its deadline while each tick keeps up.
pub const SWEEP_INTERVAL_MS: u64 = 50;

/// The gap before the next tick when a tick used its whole effort and keys are still due (a
/// storm of expiries): each tick stays within `quota.sweep-effort`, but they come back to back
/// with a 1 ms gap for clients, like Redis's fast expire cycle, until the backlog is gone.
pub const CATCH_UP_INTERVAL_MS: u64 = 1;

/// Keys by next due time, and each key's entry (per db, looked up without allocating).
struct Index {
    by_due: BTreeSet<(i64, i32, Vec<u8>)>,
    by_key: BTreeMap<i32, HashMap<Vec<u8>, i64>>,
    keys: usize,
}

static INDEX: Mutex<Index> = Mutex::new(Index {
    by_due: BTreeSet::new(),
    by_key: BTreeMap::new(),
    keys: 0,
});

fn index() -> MutexGuard<'static, Index> {
    // Only the main thread uses the index; a poisoned lock still holds consistent data.
    INDEX.lock().unwrap_or_else(|e| e.into_inner())
}

/// The index's epoch. It moves whenever an entry changes other than through [`track`]: a due
/// key popped; keys renamed, moved, copied, restored, flushed or swapped. A budget's
/// [`IndexTag`](crate::core::ledger::IndexTag) (the entry [`track`] left for its key) holds only
/// within the epoch it was written in. DEL and a new `quota.finished-ttl` need none: they leave
/// the entries as they were (a new value starts with no note). Starts at 1: 0 is "never indexed".
static EPOCH: AtomicU64 = AtomicU64::new(1);

fn new_epoch() {
    EPOCH.fetch_add(1, Ordering::Relaxed);
}

/// Records that `key` in `db` next has cleanup due at `due` (`None`: nothing to do); returns
/// the due time the index now holds for the key.
fn track(db: i32, key: &[u8], due: Option<i64>) -> Option<i64> {
    let mut ix = index();
    let current = ix.by_key.get(&db).and_then(|m| m.get(key)).copied();
    if covers(current, due) {
        return current;
    }
    let ix = &mut *ix;
    let keys = ix.by_key.entry(db).or_default();
    if let Some(old) = current {
        keys.remove(key);
        ix.by_due.remove(&(old, db, key.to_vec()));
        ix.keys = ix.keys.saturating_sub(1);
    }
    if let Some(due) = due {
        keys.insert(key.to_vec(), due);
        ix.by_due.insert((due, db, key.to_vec()));
        ix.keys = ix.keys.saturating_add(1);
    }
    publish_indexed_keys(ix.keys);
    due
}

/// Does an index entry at `indexed` serve a key next due at `due`? The same time, or an earlier
/// one: the sweeper pops it early, finds nothing due and indexes the key again at its real time.
/// So a due time that only moved later is left as it is — the common case: settling or rolling
/// back the oldest reservation moves the soonest deadline later on every write.
fn covers(indexed: Option<i64>, due: Option<i64>) -> bool {
    match (indexed, due) {
        (Some(indexed), Some(due)) => indexed <= due,
        (indexed, due) => indexed == due,
    }
}

/// Indexes a budget after a change. Most writes leave its due time where the index has it; the
/// budget's [`IndexTag`](crate::core::ledger::IndexTag) says so without locking, hashing or
/// searching the index.
pub fn track_budget(db: i32, key: &[u8], budget: &Budget) {
    let due = budget.next_due(config::policy().keep_ms);
    let epoch = EPOCH.load(Ordering::Relaxed);
    let tag = budget.index_tag();
    let (tagged_epoch, indexed) = tag.get();
    if tagged_epoch == epoch && covers(indexed, due) {
        return;
    }
    let indexed = track(db, key, due);
    tag.set(epoch, indexed);
}

/// Is some key due at `now`?
fn any_due(now: i64) -> bool {
    index().by_due.first().is_some_and(|first| first.0 <= now)
}

fn pop_due(now: i64) -> Option<(i64, i32, Vec<u8>)> {
    let mut ix = index();
    let first = ix.by_due.first()?.clone();
    if first.0 > now {
        return None;
    }
    ix.by_due.remove(&first);
    new_epoch();
    if let Some(m) = ix.by_key.get_mut(&first.1) {
        if m.remove(&first.2).is_some() {
            ix.keys = ix.keys.saturating_sub(1);
            // The gauge follows every change of the count (a swept key that is done leaves it).
            publish_indexed_keys(ix.keys);
        }
    }
    Some(first)
}

/// `quota_sweeper_indexed_keys` in INFO.
fn publish_indexed_keys(keys: usize) {
    stats::set(
        &stats::SWEEP_INDEXED_KEYS,
        i64::try_from(keys).unwrap_or(i64::MAX),
    );
}

/// The database a command runs in.
pub fn selected_db(ctx: &Context) -> i32 {
    // SAFETY: plain API call on a live context.
    unsafe {
        raw::RedisModule_GetSelectedDb
            .map(|f| f(ctx.ctx))
            .unwrap_or(0)
    }
}

fn select_db(ctx: &Context, db: i32) -> bool {
    // SAFETY: plain API call on a live context.
    unsafe {
        raw::RedisModule_SelectDb
            .map(|f| f(ctx.ctx, db) == raw::REDISMODULE_OK as c_int)
            .unwrap_or(false)
    }
}

/// Key name and db of a value being loaded from RDB (RESTORE and DEBUG RELOAD included).
///
/// # Safety
/// `io` must be the live load context Redis passed to `rdb_load`.
pub unsafe fn key_of_io(io: *mut raw::RedisModuleIO) -> Option<(i32, Vec<u8>)> {
    unsafe {
        let name = raw::RedisModule_GetKeyNameFromIO?(io);
        if name.is_null() {
            return None;
        }
        let db = raw::RedisModule_GetDbIdFromIO.map(|f| f(io)).unwrap_or(0);
        Some((db, RedisString::string_as_slice(name).to_vec()))
    }
}

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
        _ => Default::default(),
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

/// Keyspace hook: a budget that arrives under a new name (RENAME, MOVE, COPY, RESTORE) is
/// indexed under it.
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
    }
}

/// Subscribes to FLUSHDB/FLUSHALL and SWAPDB, which move or drop keys without keyspace events
/// the index could follow: a flush drops the flushed databases' entries, a swap exchanges two
/// databases' entries, so swapped budgets keep being swept. Returns false if Redis refused.
pub fn subscribe_db_events(ctx: &Context) -> bool {
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToServerEvent }) else {
        return false;
    };
    let events = [
        (raw::REDISMODULE_EVENT_FLUSHDB, on_flush as DbEventFn),
        (raw::REDISMODULE_EVENT_SWAPDB, on_swapdb as DbEventFn),
    ];
    events.into_iter().all(|(id, cb)| {
        let event = raw::RedisModuleEvent { id, dataver: 1 };
        // SAFETY: a live load context and a callback with the C signature Redis expects.
        unsafe { subscribe(ctx.ctx, event, Some(cb)) == raw::REDISMODULE_OK as c_int }
    })
}

type DbEventFn = unsafe extern "C" fn(
    *mut raw::RedisModuleCtx,
    raw::RedisModuleEvent,
    u64,
    *mut std::os::raw::c_void,
);

/// FLUSHDB / FLUSHALL (dbnum −1): forget the flushed databases' entries.
unsafe extern "C" fn on_flush(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    subevent: u64,
    data: *mut std::os::raw::c_void,
) {
    // The data is only read at the start of the flush (subevent 0).
    if subevent != 0 {
        return;
    }
    let Some(info) = data.cast::<raw::RedisModuleFlushInfo>().as_ref() else {
        return;
    };
    let db = info.dbnum;
    new_epoch();
    let mut ix = index();
    let ix = &mut *ix;
    ix.by_due.retain(|(_, d, _)| db != -1 && *d != db);
    if db == -1 {
        ix.by_key.clear();
    } else {
        ix.by_key.remove(&db);
    }
    ix.keys = ix
        .by_key
        .values()
        .map(HashMap::len)
        .fold(0usize, usize::saturating_add);
    publish_indexed_keys(ix.keys);
}

/// SWAPDB a b: the two databases' entries change places.
unsafe extern "C" fn on_swapdb(
    _ctx: *mut raw::RedisModuleCtx,
    _event: raw::RedisModuleEvent,
    _subevent: u64,
    data: *mut std::os::raw::c_void,
) {
    let Some(info) = data.cast::<raw::RedisModuleSwapDbInfo>().as_ref() else {
        return;
    };
    let (a, b) = (info.dbnum_first, info.dbnum_second);
    new_epoch();
    let swap = |d: i32| {
        if d == a {
            b
        } else if d == b {
            a
        } else {
            d
        }
    };
    let mut ix = index();
    let ix = &mut *ix;
    let by_due = std::mem::take(&mut ix.by_due);
    ix.by_due = by_due
        .into_iter()
        .map(|(due, d, key)| (due, swap(d), key))
        .collect();
    let first = ix.by_key.remove(&a);
    let second = ix.by_key.remove(&b);
    if let Some(m) = first {
        ix.by_key.insert(b, m);
    }
    if let Some(m) = second {
        ix.by_key.insert(a, m);
    }
}

#[cfg(test)]
mod tests {
    use super::covers;

    #[test]
    fn an_entry_serves_a_key_due_at_or_after_it() {
        assert!(covers(None, None));
        assert!(covers(Some(5), Some(5)));
        assert!(covers(Some(5), Some(9)));
        // Due sooner than indexed: the entry would fire late.
        assert!(!covers(Some(9), Some(5)));
        // Indexed but nothing due (the entry goes), or due but not indexed.
        assert!(!covers(Some(5), None));
        assert!(!covers(None, Some(5)));
    }
}
