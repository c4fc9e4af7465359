//! The sweeper's index (active expiry): a module-wide index of `(db, key)` by next due time —
//! a budget's soonest reservation deadline or id-forget time, a window key's oldest remembered
//! id leaving its window — kept in step by every change of a value (the commands, the
//! replicated effects, RDB loads, keyspace hooks and server events), and popped by the
//! sweeper ([`crate::shell::sweeper`]).
//!
//! Its own module so that what changes values (`apply.rs`, the data types) and the sweeper
//! that acts on them both depend on it, not on each other.
//!
//! The index is a hint: an entry whose key was deleted, renamed or changed type is dropped when
//! it comes due; a renamed key is indexed again under its new name by the keyspace event hook.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::raw::c_int;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Mutex, MutexGuard};

use redis_module::{raw, Context, RedisString};

use crate::core::ledger::Budget;
use crate::core::window::Window;
use crate::shell::{config, stats};

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

pub(crate) fn new_epoch() {
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

/// Indexes a window key after a change: due when its oldest remembered id leaves the window.
/// A key without ids is left alone unless it `had_ids` before the change (its entry goes).
/// Most writes (a new id behind the oldest) leave the due time where the index has it: the
/// window's [`IndexTag`](crate::core::ledger::IndexTag) says so, as a budget's does.
pub fn track_window(db: i32, key: &[u8], window: &Window, had_ids: bool) {
    track_window_at(|| (db, key), window, had_ids);
}

/// [`track_window`], asking `place` for the key's database and name only when the index
/// changes (a command's write: usually not, and each costs a module API call).
pub fn track_window_at<'k>(
    place: impl FnOnce() -> (i32, &'k [u8]),
    window: &Window,
    had_ids: bool,
) {
    if !had_ids && window.remembered().is_empty() {
        return;
    }
    let due = window.ids_due_ms();
    let Some(tag) = window.index_tag() else {
        let (db, key) = place();
        track(db, key, due);
        return;
    };
    let epoch = EPOCH.load(Ordering::Relaxed);
    let (tagged_epoch, indexed) = tag.get();
    if tagged_epoch == epoch && covers(indexed, due) {
        return;
    }
    let (db, key) = place();
    let indexed = track(db, key, due);
    tag.set(epoch, indexed);
}

/// Is some key due at `now`?
pub(crate) fn any_due(now: i64) -> bool {
    index().by_due.first().is_some_and(|first| first.0 <= now)
}

pub(crate) fn pop_due(now: i64) -> Option<(i64, i32, Vec<u8>)> {
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

pub(crate) fn select_db(ctx: &Context, db: i32) -> bool {
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
