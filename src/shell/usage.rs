//! The usage log (issue 21): one Redis Stream entry per event that finishes a reservation or
//! changes `used`, written by the master in the same command as the ledger change.
//!
//! Entries are derived here, in one place, from the effects a master applies
//! ([`crate::shell::apply`] calls [`apply_logged`] and [`write`]): every command, the sweeper
//! and QUOTA.SET log through it. Each entry has the same fields, in this order:
//!
//! | field | value |
//! |---|---|
//! | `key` | the budget key |
//! | `event` | `settle`, `late_settle`, `rollback`, `expire`, `charge`, `forced_charge`, `reset`, `adjust` |
//! | `id` | the reservation or charge id; empty for a charge without ID, a reset, an adjustment |
//! | `held` | the reservation's amount (settle, late settle, rollback, expire); -1 otherwise |
//! | `charged` | what `used` grew by: the actual, the charge, the adjustment's delta; 0 for a rollback, an expiry, a reset |
//! | `used` | `used` after the event; for a `reset`, the closing `used` of the period that ended |
//! | `period_start` | start (unix ms) of the period `used` belongs to (for a `reset`: the one that ended); -1 without a period |
//! | `at` | the master's time of the command (unix ms) |
//!
//! So for every budget key, the sum of `charged` over the entries whose `period_start` is the
//! current period's start equals `used` (QUOTA.INFO).
//!
//! The entry is added on the master through the stream module API (`RedisModule_StreamAdd`
//! with an id the server picks, then `RedisModule_StreamTrimByLength`, approximate), with the
//! keyspace events an XADD fires. No command is run and no XADD replicated (issue 21's cost
//! goal): the entry's id and the stream's length after the trim go in the command's own
//! `QUOTA.APPLY` / `QUOTA.MAPPLY` line as `LOGGED ms seq len` after the effect that logged it
//! ([`crate::shell::effects::Logged`]), and replicas and AOF replays derive the same entry from
//! the same effect ([`rebuild`]), add it with the master's id and trim to exactly the master's
//! length: they never pick an id or read a clock. Lines of earlier builds carry no `LOGGED`
//! and were followed by the XADD they replicated, which loads as it is. Where the server lacks
//! the stream API the XADD runs through `RedisModule_Call` with `!`, which replicates it.

use std::os::raw::{c_char, c_int, c_longlong};

use redis_module::{raw, Context, KeyType, RedisError, RedisString};

use crate::core::book::{Entry as BookEntry, Id, Outcome};
use crate::core::id::ParsedId;
use crate::core::ledger::{Budget, Effect, UsageLog};
use crate::shell::apply::Applied;
use crate::shell::effects::Logged;
use crate::shell::reply::error_reply;
use crate::shell::stats;

/// One usage event, before it is written (see the module docs for the fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    /// One of [`EVENTS`].
    pub event: &'static str,
    /// The reservation or charge id; empty where none applies.
    pub id: Id,
    /// The reservation's amount; -1 where none applies.
    pub held: i64,
    /// What the event added to `used` (may be negative for an adjustment).
    pub charged: i64,
    /// `used` after the event (a reset: the closing `used`).
    pub used: i64,
    /// Start of the period the entry counts in (unix ms); -1 without a period.
    pub period_start: i64,
    /// Index, in the effects applied, of the effect that logged it.
    pub effect: usize,
}

/// The `LOGGED` marks of one write's entries (rarely more than one).
pub type Marks = smallvec::SmallVec<[Logged; 2]>;

/// Could applying `effects` to `budget` log anything? Only if the budget has a log (or the
/// effects turn one on) and some effect [`logs`]: a RESERVE's grant or an EXTEND skips the
/// stream altogether (no key check, no entry vector), as it adds no entry.
pub fn may_log(budget: &Budget, effects: &[Effect]) -> bool {
    (budget.usage().is_some()
        || effects
            .iter()
            .any(|e| matches!(e, Effect::Usage { log: Some(_) })))
        && effects.iter().any(logs)
}

/// Can this effect add a usage entry? Exactly the effects [`entry_of`] may log for (a
/// `Configure` only when `used` changes, known once applied: counted as logging).
pub fn logs(e: &Effect) -> bool {
    match e {
        Effect::Settle { .. }
        | Effect::SettleLate { .. }
        | Effect::Rollback { .. }
        | Effect::Release { .. }
        | Effect::Charge { .. }
        | Effect::Reset { .. }
        | Effect::Configure { .. } => true,
        Effect::Grant { .. }
        | Effect::Extend { .. }
        | Effect::Forget { .. }
        | Effect::Usage { .. } => false,
    }
}

/// The amount a reservation held, before an effect on it is applied (-1: no id, or unknown).
fn held_before(b: &Budget, e: &Effect) -> i64 {
    let id = match e {
        Effect::Settle { id, .. }
        | Effect::SettleLate { id, .. }
        | Effect::Rollback { id }
        | Effect::Release { id, .. } => id,
        _ => return -1,
    };
    match b.book().get(id) {
        Some(BookEntry::Pending(r)) => r.amount,
        Some(BookEntry::Finished(f)) => match f.outcome {
            Outcome::Expired { amount, .. } => amount,
            _ => -1,
        },
        None => -1,
    }
}

fn start_of(bounds: Option<(i64, i64)>) -> i64 {
    bounds.map_or(-1, |b| b.0)
}

/// The entry an applied effect logs, from the budget before (`used_before`, `bounds_before`,
/// `held`) and after it.
fn entry_of(
    e: &Effect,
    held: i64,
    used_before: i64,
    bounds_before: Option<(i64, i64)>,
    after: &Budget,
) -> Option<UsageEntry> {
    // Consistent with `may_log` by construction: nothing logs that it skips.
    if !logs(e) {
        return None;
    }
    let used = after.stored_used();
    let period_start = start_of(after.stored_bounds());
    let entry = |event, id: &Id, held, charged| UsageEntry {
        event,
        id: Id::from_slice(id),
        held,
        charged,
        used,
        period_start,
        effect: 0,
    };
    let none = Id::from_slice(b"");
    // What the effect added to `used` (the actual of a settle, a charge's amount, 0 for a
    // rollback or a releasing expiry): read from the ledger, so the entries always add up.
    let grew = used.checked_sub(used_before).unwrap_or(0);
    Some(match e {
        Effect::Settle { id, .. } => entry("settle", id, held, grew),
        Effect::SettleLate { id, .. } => entry("late_settle", id, held, grew),
        Effect::Rollback { id } => entry("rollback", id, held, grew),
        Effect::Release { id, .. } => entry("expire", id, held, grew),
        Effect::Charge { id, forced, .. } => entry(
            if *forced { "forced_charge" } else { "charge" },
            id.as_ref().unwrap_or(&none),
            -1,
            grew,
        ),
        Effect::Reset { .. } => UsageEntry {
            event: "reset",
            id: none,
            held: -1,
            charged: 0,
            used: used_before,
            period_start: start_of(bounds_before),
            effect: 0,
        },
        Effect::Configure { .. } => {
            // A new period (the rule changed, or the budget is new) starts from 0 in the log:
            // what it carries over is its adjustment.
            let same_period = bounds_before.is_some() == after.stored_bounds().is_some()
                && start_of(bounds_before) == period_start;
            let base = if same_period { used_before } else { 0 };
            let delta = used.checked_sub(base)?;
            if delta == 0 {
                return None;
            }
            entry("adjust", &none, -1, delta)
        }
        Effect::Grant { .. }
        | Effect::Extend { .. }
        | Effect::Forget { .. }
        | Effect::Usage { .. } => return None,
    })
}

/// Applies effects in order like [`crate::shell::apply::apply_all`], and appends to `log` the
/// usage entries of the ones applied (only while `log` is `Some`: replicas pass `None`).
/// Ids are read through `ids` ([`Budget::apply_seen`]).
pub fn apply_logged(
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
    mut log: Option<&mut Vec<UsageEntry>>,
    ids: &mut ParsedId,
) -> Applied {
    for (i, e) in effects.iter().enumerate() {
        let before = log.as_ref().map(|_| {
            (
                held_before(budget, e),
                budget.stored_used(),
                budget.stored_bounds(),
            )
        });
        if let Err(err) = budget.apply_seen(at, e, ids) {
            return Applied {
                applied: i,
                error: Some(error_reply(err)),
            };
        }
        if let (Some(log), Some((held, used, bounds))) = (log.as_deref_mut(), before) {
            log.extend(
                entry_of(e, held, used, bounds, budget).map(|en| UsageEntry { effect: i, ..en }),
            );
        }
    }
    Applied {
        applied: effects.len(),
        error: None,
    }
}

/// Refuses (before anything is applied) a write whose usage entries could not be added: the
/// stream key holds another type. The ledger and its log must not diverge.
pub fn check_stream(ctx: &Context, budget: &Budget, effects: &[Effect]) -> Result<(), RedisError> {
    match stream_of(budget, effects) {
        Some(log) => check_stream_key(ctx, &log.stream),
        None => Ok(()),
    }
}

/// The usage log a budget has once `effects` are applied.
fn stream_of<'a>(budget: &'a Budget, effects: &'a [Effect]) -> Option<&'a UsageLog> {
    effects
        .iter()
        .rev()
        .find_map(|e| match e {
            Effect::Usage { log } => Some(log.as_ref()),
            _ => None,
        })
        .unwrap_or(budget.usage())
}

/// `NOPERM` unless the calling user's ACL key patterns allow writing `stream` (QUOTA.SET ...
/// STREAM: the stream key is not a key of the command, so Redis cannot check it). Allowed when
/// there is no calling user (AOF load, a timer) or the server lacks the ACL module API.
pub fn check_stream_acl(ctx: &Context, stream: &[u8]) -> Result<(), RedisError> {
    // SAFETY: plain API calls with a live context; every pointer is checked for null, and
    // what the calls return is freed once (the user name string, the user).
    unsafe {
        let (Some(current), Some(from_name), Some(check), Some(free_user), Some(free_string)) = (
            raw::RedisModule_GetCurrentUserName,
            raw::RedisModule_GetModuleUserFromUserName,
            raw::RedisModule_ACLCheckKeyPermissions,
            raw::RedisModule_FreeModuleUser,
            raw::RedisModule_FreeString,
        ) else {
            return Ok(());
        };
        let name = current(ctx.ctx);
        if name.is_null() {
            return Ok(());
        }
        let user = from_name(name);
        free_string(ctx.ctx, name);
        if user.is_null() {
            return Ok(());
        }
        let key = RedisString::create_from_slice(ctx.ctx, stream);
        let flags = raw::REDISMODULE_CMD_KEY_INSERT | raw::REDISMODULE_CMD_KEY_UPDATE;
        let status = check(user, key.inner, flags as c_int);
        free_user(user);
        if status == raw::REDISMODULE_OK as c_int {
            Ok(())
        } else {
            Err(RedisError::Str(
                "NOPERM this user has no permissions to write the usage stream key",
            ))
        }
    }
}

/// WRONGTYPE unless `stream` is missing or a stream.
pub fn check_stream_key(ctx: &Context, stream: &[u8]) -> Result<(), RedisError> {
    let name = RedisString::create_from_slice(ctx.ctx, stream);
    match ctx.open_key(&name).key_type() {
        KeyType::Empty | KeyType::Stream => Ok(()),
        _ => Err(wrong_stream_type()),
    }
}

/// Names and words every XADD uses, created once (Redis strings without a context) and kept
/// for the life of the process: no allocation per entry for them.
struct Words {
    maxlen: *mut raw::RedisModuleString,
    approx: *mut raw::RedisModuleString,
    auto_id: *mut raw::RedisModuleString,
    /// The values most entries share: -1 (no period, no reservation), 0 (a rollback's or an
    /// expiry's charge), "" (no id): no string made and freed per entry for them.
    minus_one: *mut raw::RedisModuleString,
    zero: *mut raw::RedisModuleString,
    empty: *mut raw::RedisModuleString,
    /// key, event, id, held, charged, used, period_start, at.
    fields: [*mut raw::RedisModuleString; 8],
}

/// Every `event` value, each kept as a Redis string like [`Words`].
const EVENTS: [&str; 8] = [
    "settle",
    "late_settle",
    "rollback",
    "expire",
    "charge",
    "forced_charge",
    "reset",
    "adjust",
];

std::thread_local! {
    /// Only the main thread writes usage entries.
    static WORDS: std::cell::OnceCell<Option<(Words, [*mut raw::RedisModuleString; 8])>> =
        const { std::cell::OnceCell::new() };
}

/// A Redis string without a context (freed by whoever owns it).
fn string(bytes: &[u8]) -> *mut raw::RedisModuleString {
    // SAFETY: plain API call; Redis copies the bytes.
    unsafe {
        match raw::RedisModule_CreateString {
            Some(f) => f(std::ptr::null_mut(), bytes.as_ptr().cast(), bytes.len()),
            None => std::ptr::null_mut(),
        }
    }
}

fn int_string(n: i64) -> *mut raw::RedisModuleString {
    string(itoa::Buffer::new().format(n).as_bytes())
}

fn words() -> Option<(Words, [*mut raw::RedisModuleString; 8])> {
    let mut fields = [std::ptr::null_mut(); 8];
    let mut events = [std::ptr::null_mut(); 8];
    for (slot, name) in fields.iter_mut().zip(FIELDS) {
        *slot = string(name.as_bytes());
    }
    for (slot, name) in events.iter_mut().zip(EVENTS) {
        *slot = string(name.as_bytes());
    }
    let w = Words {
        maxlen: string(b"MAXLEN"),
        approx: string(b"~"),
        auto_id: string(b"*"),
        minus_one: string(b"-1"),
        zero: string(b"0"),
        empty: string(b""),
        fields,
    };
    let all_made = [w.maxlen, w.approx, w.auto_id, w.minus_one, w.zero, w.empty]
        .iter()
        .chain(fields.iter())
        .chain(events.iter())
        .all(|p| !p.is_null());
    all_made.then_some((w, events))
}

/// The field names, in the order every entry carries them.
pub const FIELDS: [&str; 8] = [
    "key",
    "event",
    "id",
    "held",
    "charged",
    "used",
    "period_start",
    "at",
];

/// Adds `entries` of budget `key` at master time `at` to the budget's usage stream, one entry
/// each (see the module docs for how), and returns the `LOGGED` marks to replicate with the
/// effects (the id given to each entry, the length after its trim). A failed add (never
/// expected: the type was checked) is logged and counted (`INFO quota`
/// `usage_stream_errors`), never a crash, and has no mark.
pub fn write(
    ctx: &Context,
    key: &RedisString,
    log: &UsageLog,
    at: i64,
    entries: &[UsageEntry],
    held: Option<HeldStream>,
) -> Marks {
    let mut marks = Marks::new();
    if entries.is_empty() {
        return marks;
    }
    let failed = WORDS
        .try_with(|cell| match cell.get_or_init(words) {
            Some((w, events)) => xadd_all(
                ctx, key, log, at, entries, None, held, w, events, &mut marks,
            ),
            None => entries.len(),
        })
        .unwrap_or(entries.len());
    count(ctx, key, log, entries.len(), failed);
    marks
}

/// A budget's usage stream key, checked by [`hold_stream`] and left open for the entries of
/// the same write (one open of the key instead of two). Closed when dropped unused.
pub struct HeldStream {
    parts: Option<(*mut raw::RedisModuleString, OpenStream)>,
}

impl HeldStream {
    /// The key name and handle, if this is the key of `stream` (otherwise closed).
    fn take(mut self, stream: &[u8]) -> Option<(*mut raw::RedisModuleString, OpenStream)> {
        let (name, _) = self.parts.as_ref()?;
        // SAFETY: a live string made by [`string`].
        let same = unsafe {
            raw::RedisModule_StringPtrLen.is_some_and(|f| {
                let mut len: usize = 0;
                let ptr = f(*name, &mut len);
                !ptr.is_null() && std::slice::from_raw_parts(ptr.cast::<u8>(), len) == stream
            })
        };
        if same {
            self.parts.take()
        } else {
            None
        }
    }
}

impl Drop for HeldStream {
    fn drop(&mut self) {
        if let Some((name, open)) = self.parts.take() {
            // SAFETY: the handle opened by `hold_stream`, closed once here; nothing was added.
            unsafe { (open.api.close)(open.key) };
            free_string(name);
        }
    }
}

/// [`check_stream`] for a write on one budget: refuses (WRONGTYPE, before anything is
/// applied) a stream key of another type, and returns it open for the write's entries (None:
/// no stream, or the server lacks the stream API; then checked as [`check_stream`] does).
/// Only where no other handle on the stream key can be open (one budget per command: two
/// handles on one key can crash Redis).
pub fn hold_stream(
    ctx: &Context,
    budget: &Budget,
    effects: &[Effect],
) -> Result<Option<HeldStream>, RedisError> {
    let Some(log) = stream_of(budget, effects) else {
        return Ok(None);
    };
    let Some(api) = StreamApi::get() else {
        return check_stream_key(ctx, &log.stream).map(|()| None);
    };
    let name = string(&log.stream);
    let Some(open) = (!name.is_null()).then(|| api.open(ctx, name)).flatten() else {
        free_string(name);
        return check_stream_key(ctx, &log.stream).map(|()| None);
    };
    let held = HeldStream {
        parts: Some((name, open)),
    };
    let kind = held
        .parts
        .as_ref()
        // SAFETY: the handle just opened.
        .map(|(_, o)| unsafe { (api.key_type)(o.key) });
    if kind == Some(raw::REDISMODULE_KEYTYPE_EMPTY as c_int)
        || kind == Some(raw::REDISMODULE_KEYTYPE_STREAM as c_int)
    {
        Ok(Some(held))
    } else {
        Err(wrong_stream_type())
    }
}

fn wrong_stream_type() -> RedisError {
    RedisError::Str("WRONGTYPE the usage stream key holds a value that is not a stream")
}

/// Replica and AOF replay: adds the entries the master added (`marks`, from a replicated
/// line) with the master's ids, each followed by a trim to exactly the master's length.
/// `entries` are the ones derived from the same effects on the same state. An entry the marks
/// name but the effects did not derive, or an add Redis refuses (a stream whose last id is not
/// below the master's: never with identical state), is logged and counted, never a crash.
pub fn rebuild(
    ctx: &Context,
    key: &RedisString,
    log: &UsageLog,
    at: i64,
    entries: &[UsageEntry],
    marks: &[Logged],
) {
    if marks.is_empty() {
        return;
    }
    let failed = WORDS
        .try_with(|cell| match cell.get_or_init(words) {
            Some((w, events)) => xadd_all(
                ctx,
                key,
                log,
                at,
                entries,
                Some(marks),
                None,
                w,
                events,
                &mut Marks::new(),
            ),
            None => marks.len(),
        })
        .unwrap_or(marks.len());
    count(ctx, key, log, marks.len(), failed);
}

/// Counts `n` entries of which `failed` failed (INFO), warning once per write if any did,
/// naming the budget `key` and its stream (printable, escaped for the log).
fn count(ctx: &Context, key: &RedisString, log: &UsageLog, n: usize, failed: usize) {
    stats::add(
        &stats::USAGE_ENTRIES,
        i64::try_from(n.saturating_sub(failed)).unwrap_or(0),
    );
    if failed > 0 {
        stats::add(&stats::USAGE_ERRORS, i64::try_from(failed).unwrap_or(0));
        ctx.log_warning(&crate::shell::log_safe(&stream_failure(
            key.as_slice(),
            &log.stream,
        )));
    }
}

/// The log line for a write whose usage entries could not all be added: the budget key and
/// the stream key, printable (non-printable bytes escaped).
fn stream_failure(key: &[u8], stream: &[u8]) -> String {
    format!(
        "quota: a usage stream entry could not be added (budget '{}', stream '{}')",
        crate::core::error::printable_id(key),
        crate::core::error::printable_id(stream)
    )
}

/// The entries of [`write`] (`given` None: ids picked here, marks pushed to `marks`) or of
/// [`rebuild`] (`given`: the master's ids and lengths), added one by one; returns how many
/// failed.
#[allow(clippy::too_many_arguments)]
fn xadd_all(
    ctx: &Context,
    key: &RedisString,
    log: &UsageLog,
    at: i64,
    entries: &[UsageEntry],
    given: Option<&[Logged]>,
    held: Option<HeldStream>,
    w: &Words,
    events: &[*mut raw::RedisModuleString; 8],
    marks: &mut Marks,
) -> usize {
    // The rows to add: every entry (master), or the ones the master's marks name, in order.
    let mut rows: smallvec::SmallVec<[(&UsageEntry, Option<&Logged>); 2]> =
        smallvec::SmallVec::new();
    let mut missing: usize = 0;
    match given {
        None => rows.extend(entries.iter().map(|e| (e, None))),
        Some(given) => {
            for m in given {
                match entries.iter().find(|e| e.effect == m.after) {
                    Some(e) => rows.push((e, Some(m))),
                    None => missing = missing.saturating_add(1),
                }
            }
        }
    }
    // Made once per write, shared by its entries; the stream key as the check left it open.
    let (stream, held) = match held.and_then(|h| h.take(&log.stream)) {
        Some((stream, open)) => (stream, Some(open)),
        None => (string(&log.stream), None),
    };
    let at_s = int_string(at);
    let failed = if stream.is_null() || at_s.is_null() {
        if let Some(open) = held {
            open.close(ctx, stream, false);
        }
        rows.len()
    } else if let Some(api) = StreamApi::get() {
        match held.or_else(|| api.open(ctx, stream)) {
            Some(open) => {
                let failed = each_row(key, at_s, &rows, w, events, |(e, m), row| {
                    match open.add(ctx, stream, log.max_len, row, m.copied()) {
                        Some(mark) => {
                            if m.is_none() {
                                marks.push(Logged {
                                    after: e.effect,
                                    ..mark
                                });
                            }
                            true
                        }
                        None => false,
                    }
                });
                open.close(ctx, stream, failed < rows.len());
                failed
            }
            None => rows.len(),
        }
    } else if given.is_some() || !xadd_known(ctx) {
        // Without the stream API a replica has no way to add an entry with a given id
        // (the master, lacking it too, never sends marks).
        rows.len()
    } else {
        let max_len = int_string(log.max_len);
        let failed = each_row(key, at_s, &rows, w, events, |_, row| {
            call_xadd_row(ctx, stream, log.max_len, max_len, row, w)
        });
        free_string(max_len);
        failed
    };
    free_string(stream);
    free_string(at_s);
    failed.saturating_add(missing)
}

std::thread_local! {
    /// [`xadd_known`]'s answer, once asked.
    static XADD_KNOWN: std::cell::Cell<Option<bool>> = const { std::cell::Cell::new(None) };
}

/// Is `XADD` a command of this server? Only asked on the fallback path (no stream API), which
/// runs XADD: with XADD renamed away (`rename-command XADD ...`) no entry is added there (each
/// counted as a failed entry). Asked once (rename-command is fixed at startup):
/// `RedisModule_Call` of XADD without arguments runs nothing, failing with `ENOENT` for an
/// unknown command and `EINVAL` (arity) for a known one.
fn xadd_known(ctx: &Context) -> bool {
    if let Ok(Some(known)) = XADD_KNOWN.try_with(std::cell::Cell::get) {
        return known;
    }
    // SAFETY: a live context; no arguments after the format. A reply (never expected) is
    // freed once.
    let known = unsafe {
        let (Some(call), Some(free)) = (raw::RedisModule_Call, raw::RedisModule_FreeCallReply)
        else {
            return false;
        };
        let reply = call(ctx.ctx, c"XADD".as_ptr(), c"".as_ptr());
        if reply.is_null() {
            std::io::Error::last_os_error().raw_os_error() != Some(libc::ENOENT)
        } else {
            free(reply);
            true
        }
    };
    let _ = XADD_KNOWN.try_with(|k| k.set(Some(known)));
    known
}

/// Frees a string made by [`string`] (null: nothing).
fn free_string(s: *mut raw::RedisModuleString) {
    if s.is_null() {
        return;
    }
    // SAFETY: created without a context by [`string`]; each caller frees its string once.
    unsafe {
        if let Some(free) = raw::RedisModule_FreeString {
            free(std::ptr::null_mut(), s);
        }
    }
}

/// Calls `add` with each entry's 16 field and value strings (on the stack: no allocation but
/// the values' strings), freeing the values after; returns how many entries failed (a string
/// that could not be made, or `add` returning false).
fn each_row<'e>(
    key: &RedisString,
    at_s: *mut raw::RedisModuleString,
    rows: &[(&'e UsageEntry, Option<&'e Logged>)],
    w: &Words,
    events: &[*mut raw::RedisModuleString; 8],
    mut add: impl FnMut(
        &(&'e UsageEntry, Option<&'e Logged>),
        &mut [*mut raw::RedisModuleString; 16],
    ) -> bool,
) -> usize {
    let mut failed: usize = 0;
    for r in rows {
        let e = r.0;
        let known = EVENTS
            .iter()
            .position(|n| *n == e.event)
            .and_then(|i| events.get(i).copied());
        let made_event = match known {
            Some(_) => std::ptr::null_mut(),
            None => string(e.event.as_bytes()),
        };
        // Strings made for this entry (null where a shared one is used), freed after.
        let num = |n: i64| match n {
            -1 | 0 => std::ptr::null_mut(),
            n => int_string(n),
        };
        let per_entry = [
            if e.id.is_empty() {
                std::ptr::null_mut()
            } else {
                string(&e.id)
            },
            num(e.held),
            num(e.charged),
            num(e.used),
            num(e.period_start),
        ];
        let shared = |made: *mut raw::RedisModuleString, n: i64| match n {
            -1 => w.minus_one,
            0 => w.zero,
            _ => made,
        };
        let values = [
            key.inner,
            known.unwrap_or(made_event),
            if e.id.is_empty() {
                w.empty
            } else {
                per_entry[0]
            },
            shared(per_entry[1], e.held),
            shared(per_entry[2], e.charged),
            shared(per_entry[3], e.used),
            shared(per_entry[4], e.period_start),
            at_s,
        ];
        let mut row = [std::ptr::null_mut(); 16];
        for (pair, (f, v)) in row.chunks_exact_mut(2).zip(w.fields.iter().zip(values)) {
            pair.copy_from_slice(&[*f, v]);
        }
        if row.iter().any(|p| p.is_null()) || !add(r, &mut row) {
            failed = failed.saturating_add(1);
        }
        // Redis took its own references (the stream copies, replication and calls retain).
        for s in per_entry {
            free_string(s);
        }
        free_string(made_event);
    }
    failed
}

/// The stream module API (Redis ≥ 6.2, Valkey), when the server exports every function used.
#[derive(Clone, Copy)]
struct StreamApi {
    open: unsafe extern "C" fn(
        *mut raw::RedisModuleCtx,
        *mut raw::RedisModuleString,
        c_int,
    ) -> *mut raw::RedisModuleKey,
    close: unsafe extern "C" fn(*mut raw::RedisModuleKey),
    key_type: unsafe extern "C" fn(*mut raw::RedisModuleKey) -> c_int,
    length: unsafe extern "C" fn(*mut raw::RedisModuleKey) -> usize,
    delete: unsafe extern "C" fn(*mut raw::RedisModuleKey) -> c_int,
    signal_modified:
        unsafe extern "C" fn(*mut raw::RedisModuleCtx, *mut raw::RedisModuleString) -> c_int,
    add: unsafe extern "C" fn(
        *mut raw::RedisModuleKey,
        c_int,
        *mut raw::RedisModuleStreamID,
        *mut *mut raw::RedisModuleString,
        i64,
    ) -> c_int,
    trim: unsafe extern "C" fn(*mut raw::RedisModuleKey, c_int, c_longlong) -> c_longlong,
    notify: unsafe extern "C" fn(
        *mut raw::RedisModuleCtx,
        c_int,
        *const c_char,
        *mut raw::RedisModuleString,
    ) -> c_int,
}

/// A stream key open for writing through [`StreamApi`]; [`OpenStream::close`] closes it.
struct OpenStream {
    api: StreamApi,
    key: *mut raw::RedisModuleKey,
    was_empty: bool,
}

impl StreamApi {
    fn get() -> Option<StreamApi> {
        // SAFETY: copies of function pointers written once by RedisModule_Init (null, i.e.
        // `None`, where the server does not export the function).
        unsafe {
            Some(StreamApi {
                open: raw::RedisModule_OpenKey?,
                close: raw::RedisModule_CloseKey?,
                key_type: raw::RedisModule_KeyType?,
                length: raw::RedisModule_ValueLength?,
                delete: raw::RedisModule_DeleteKey?,
                signal_modified: raw::RedisModule_SignalModifiedKey?,
                add: raw::RedisModule_StreamAdd?,
                trim: raw::RedisModule_StreamTrimByLength?,
                notify: raw::RedisModule_NotifyKeyspaceEvent?,
            })
        }
    }

    /// Opens `stream` for writing (None: Redis refused).
    fn open(&self, ctx: &Context, stream: *mut raw::RedisModuleString) -> Option<OpenStream> {
        // SAFETY: a live context and key string; the handle is closed once by `close`.
        let key = unsafe { (self.open)(ctx.ctx, stream, raw::REDISMODULE_WRITE as c_int) };
        if key.is_null() {
            return None;
        }
        // SAFETY: the handle just opened.
        let was_empty = unsafe { (self.key_type)(key) } == raw::REDISMODULE_KEYTYPE_EMPTY as c_int;
        Some(OpenStream {
            api: *self,
            key,
            was_empty,
        })
    }
}

impl OpenStream {
    /// Adds one entry (`row`: 8 field/value pairs) without running a command. On a master
    /// (`given` None) as `XADD stream MAXLEN ~ max_len * ...` would (no trim when `max_len` is
    /// 0): `RedisModule_StreamAdd` with an id the server picks, then the approximate trim; on
    /// a replica (`given`: the master's mark) with the master's id, then a trim to exactly the
    /// master's length. Fires the keyspace events XADD fires (`xadd`, and `xtrim` if the trim
    /// removed entries). Nothing is replicated here: the returned mark (the id, the length
    /// after the trim; `after` is the caller's) goes with the effects. None if Redis refused
    /// the add.
    fn add(
        &self,
        ctx: &Context,
        stream: *mut raw::RedisModuleString,
        max_len: i64,
        row: &mut [*mut raw::RedisModuleString; 16],
        given: Option<Logged>,
    ) -> Option<Logged> {
        let api = self.api;
        let (flags, mut id) = match given {
            Some(m) => (
                0,
                raw::RedisModuleStreamID {
                    ms: m.ms,
                    seq: m.seq,
                },
            ),
            None => (
                raw::REDISMODULE_STREAM_ADD_AUTOID as c_int,
                raw::RedisModuleStreamID { ms: 0, seq: 0 },
            ),
        };
        // SAFETY: a key open for writing; `row` holds 8 live field/value pairs, which Redis
        // copies into the stream.
        let added = unsafe { (api.add)(self.key, flags, &mut id, row.as_mut_ptr(), 8) };
        if added != raw::REDISMODULE_OK as c_int {
            return None;
        }
        // SAFETY: a live context, event name and key string.
        unsafe {
            (api.notify)(
                ctx.ctx,
                raw::REDISMODULE_NOTIFY_STREAM,
                c"xadd".as_ptr(),
                stream,
            );
        }
        // What to trim to, if anything: approximately `max_len` (master), exactly the
        // master's length (replica).
        let (target, approx) = match given {
            Some(m) => (m.len, false),
            None => (max_len, true),
        };
        // SAFETY: a key open for writing that holds a stream (the add succeeded).
        let mut length = unsafe { (api.length)(self.key) };
        // A stream no longer than the target is left as it is by the trim (Redis returns
        // before changing anything): skip the call.
        if target > 0 && u64::try_from(length).map_or(true, |n| n > target.unsigned_abs()) {
            let mode = if approx {
                raw::REDISMODULE_STREAM_TRIM_APPROX as c_int
            } else {
                0
            };
            // SAFETY: as above.
            let trimmed = unsafe { (api.trim)(self.key, mode, c_longlong::from(target)) };
            if trimmed > 0 {
                // SAFETY: as for `xadd`.
                unsafe {
                    (api.notify)(
                        ctx.ctx,
                        raw::REDISMODULE_NOTIFY_STREAM,
                        c"xtrim".as_ptr(),
                        stream,
                    );
                }
            }
            // SAFETY: as above.
            length = unsafe { (api.length)(self.key) };
        }
        Some(Logged {
            after: 0,
            ms: id.ms,
            seq: id.seq,
            len: i64::try_from(length).unwrap_or(i64::MAX),
        })
    }

    /// Closes the key. `added`: entries were added, so the key is signalled as modified
    /// (`WATCH`, client tracking: the module sets `NO_IMPLICIT_SIGNAL_MODIFIED`, so closing
    /// does not). Blocked readers (XREAD, XREADGROUP BLOCK) are woken by Redis on closing a
    /// key that got a StreamAdd (or on creating the stream). A stream this call created but
    /// could not add to is removed (Redis 7.0's StreamAdd leaves it; Valkey's removes it).
    fn close(self, ctx: &Context, stream: *mut raw::RedisModuleString, added: bool) {
        let api = self.api;
        // SAFETY: the handle opened by `StreamApi::open`, closed once here.
        unsafe {
            if added {
                (api.signal_modified)(ctx.ctx, stream);
            }
            if self.was_empty
                && (api.key_type)(self.key) == raw::REDISMODULE_KEYTYPE_STREAM as c_int
                && (api.length)(self.key) == 0
            {
                (api.delete)(self.key);
            }
            (api.close)(self.key);
        }
    }
}

/// The fallback where the server lacks the stream API: `XADD stream [MAXLEN ~ n] * ...` through
/// `RedisModule_Call` with `!` (Redis propagates the XADD it executed, rewritten with the id
/// and an exact trim). True if it replied without an error.
fn call_xadd_row(
    ctx: &Context,
    stream: *mut raw::RedisModuleString,
    max_len: i64,
    max_len_s: *mut raw::RedisModuleString,
    row: &[*mut raw::RedisModuleString; 16],
    w: &Words,
) -> bool {
    let mut argv: Vec<*mut raw::RedisModuleString> = Vec::with_capacity(21);
    argv.push(stream);
    if max_len > 0 {
        argv.extend([w.maxlen, w.approx, max_len_s]);
    }
    argv.push(w.auto_id);
    argv.extend_from_slice(row);
    !argv.iter().any(|p| p.is_null()) && call_xadd(ctx, &mut argv)
}

/// `RedisModule_Call(ctx, "XADD", "!Ev", argv, argc)`: true if it replied without an error.
fn call_xadd(ctx: &Context, argv: &mut [*mut raw::RedisModuleString]) -> bool {
    // SAFETY: a live context; `v` takes (RedisModuleString **, size_t) and Redis takes its own
    // references to the strings for the call. The reply is freed once.
    unsafe {
        let (Some(call), Some(kind), Some(free)) = (
            raw::RedisModule_Call,
            raw::RedisModule_CallReplyType,
            raw::RedisModule_FreeCallReply,
        ) else {
            return false;
        };
        let reply = call(
            ctx.ctx,
            c"XADD".as_ptr(),
            c"!Ev".as_ptr(),
            argv.as_mut_ptr(),
            argv.len(),
        );
        if reply.is_null() {
            return false;
        }
        let ok = kind(reply) != raw::REDISMODULE_REPLY_ERROR as c_int;
        free(reply);
        ok
    }
}

/// The Redis Cluster hash slot of `key`: CRC16 (XMODEM) of the hash tag — the part between
/// the first `{` and the next `}`, if not empty — or of the whole key, mod 16384. Redis 7.0
/// has no `RedisModule_ClusterKeySlot`.
pub fn key_slot(key: &[u8]) -> u16 {
    let tagged = key.iter().position(|&c| c == b'{').and_then(|open| {
        let rest = key.get(open.checked_add(1)?..)?;
        let close = rest.iter().position(|&c| c == b'}')?;
        (close > 0).then(|| rest.get(..close)).flatten()
    });
    crc16(tagged.unwrap_or(key)) & 0x3fff
}

/// CRC16-CCITT (XMODEM: polynomial 0x1021, init 0), as Redis Cluster uses.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc: u16 = 0;
    for &b in bytes {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn key_slots_match_redis_cluster() {
        // Values from CLUSTER KEYSLOT on Redis 7.0.
        assert_eq!(crc16(b"123456789"), 0x31c3);
        assert_eq!(key_slot(b"foo"), 12182);
        assert_eq!(key_slot(b"{user1000}.following"), key_slot(b"user1000"));
        assert_eq!(key_slot(b"foo{}{bar}"), key_slot(b"foo{}{bar}"));
        assert_ne!(key_slot(b"foo{}{bar}"), key_slot(b"bar"));
        assert_eq!(key_slot(b"foo{{bar}}zap"), key_slot(b"{bar"));
        assert_eq!(key_slot(b"foo{bar}{zap}"), key_slot(b"bar"));
        assert_eq!(key_slot(b""), 0);
    }

    #[test]
    fn a_failed_entry_is_logged_with_its_budget_and_stream_keys() {
        let line = crate::shell::log_safe(&stream_failure(b"{t}:b%s", b"{t}:use\n\0'"));
        assert_eq!(
            line,
            "quota: a usage stream entry could not be added (budget '{t}:b%%s', stream \
             '{t}:use\\x0a\\x00\\x27')"
        );
    }
}
