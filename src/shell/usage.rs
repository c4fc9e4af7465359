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
//! The entry is added with `XADD stream MAXLEN ~ n * field value ...` through `RedisModule_Call`
//! with the `!` flag: Redis picks the entry id on the master and propagates the XADD it
//! executed, rewritten with the explicit id and an exact trim (`MAXLEN = length`), to replicas
//! and the AOF, in the same MULTI/EXEC as the command's `QUOTA.APPLY`. Replicas and AOF replays
//! never log themselves: they apply the master's XADD.

use std::os::raw::c_int;

use redis_module::{
    raw, CallOptionsBuilder, CallResult, Context, KeyType, RedisError, RedisString,
};

use crate::core::book::{Entry as BookEntry, Id, Outcome};
use crate::core::ledger::{Budget, Effect, UsageLog};
use crate::shell::apply::Applied;
use crate::shell::reply::error_reply;
use crate::shell::stats;

/// One usage event, before it is written (see the module docs for the fields).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UsageEntry {
    pub event: &'static str,
    /// Empty where no id applies.
    pub id: Id,
    pub held: i64,
    pub charged: i64,
    pub used: i64,
    pub period_start: i64,
}

/// Could applying `effects` to `budget` log anything? (It has a log, or the effects turn one on.)
pub fn may_log(budget: &Budget, effects: &[Effect]) -> bool {
    budget.usage().is_some()
        || effects
            .iter()
            .any(|e| matches!(e, Effect::Usage { log: Some(_) }))
}

/// The amount a reservation held, before an effect on it is applied (-1: no id, or unknown).
fn held_before(b: &Budget, e: &Effect) -> i64 {
    let id = match e {
        Effect::Settle { id, .. }
        | Effect::SettleLate { id, .. }
        | Effect::Rollback { id }
        | Effect::Release { id } => id,
        _ => return -1,
    };
    match b.book().get(id) {
        Some(BookEntry::Pending(r)) => r.amount,
        Some(BookEntry::Finished(f)) => match f.outcome {
            Outcome::Expired { amount } => amount,
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
    let used = after.stored_used();
    let period_start = start_of(after.stored_bounds());
    let entry = |event, id: &Id, held, charged| UsageEntry {
        event,
        id: Id::from_slice(id),
        held,
        charged,
        used,
        period_start,
    };
    let none = Id::from_slice(b"");
    // What the effect added to `used` (the actual of a settle, a charge's amount, 0 for a
    // rollback or a releasing expiry): read from the ledger, so the entries always add up.
    let grew = used.checked_sub(used_before).unwrap_or(0);
    Some(match e {
        Effect::Settle { id, .. } => entry("settle", id, held, grew),
        Effect::SettleLate { id, .. } => entry("late_settle", id, held, grew),
        Effect::Rollback { id } => entry("rollback", id, held, grew),
        Effect::Release { id } => entry("expire", id, held, grew),
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
pub fn apply_logged(
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
    mut log: Option<&mut Vec<UsageEntry>>,
) -> Applied {
    for (i, e) in effects.iter().enumerate() {
        let before = log.as_ref().map(|_| {
            (
                held_before(budget, e),
                budget.stored_used(),
                budget.stored_bounds(),
            )
        });
        if let Err(err) = budget.apply(at, e) {
            return Applied {
                applied: i,
                error: Some(error_reply(err)),
            };
        }
        if let (Some(log), Some((held, used, bounds))) = (log.as_deref_mut(), before) {
            log.extend(entry_of(e, held, used, bounds, budget));
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
    let stream = effects
        .iter()
        .rev()
        .find_map(|e| match e {
            Effect::Usage { log } => Some(log.as_ref()),
            _ => None,
        })
        .unwrap_or(budget.usage());
    match stream {
        Some(log) => check_stream_key(ctx, &log.stream),
        None => Ok(()),
    }
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
        _ => Err(RedisError::Str(
            "WRONGTYPE the usage stream key holds a value that is not a stream",
        )),
    }
}

/// Adds `entries` of budget `key` at master time `at` to the budget's usage stream, one XADD
/// each, propagated by Redis. A failed XADD (never expected: the type was checked) is logged
/// and counted (`INFO quota` `usage_stream_errors`), never a crash.
pub fn write(ctx: &Context, key: &RedisString, log: &UsageLog, at: i64, entries: &[UsageEntry]) {
    if entries.is_empty() {
        return;
    }
    let options = CallOptionsBuilder::new()
        .replicate()
        .errors_as_replies()
        .build();
    let max_len = itoa::Buffer::new().format(log.max_len).to_string();
    let at = itoa::Buffer::new().format(at).to_string();
    for e in entries {
        let (mut b1, mut b2, mut b3, mut b4) = (
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
            itoa::Buffer::new(),
        );
        let fields: [&[u8]; 16] = [
            b"key",
            key.as_slice(),
            b"event",
            e.event.as_bytes(),
            b"id",
            &e.id,
            b"held",
            b1.format(e.held).as_bytes(),
            b"charged",
            b2.format(e.charged).as_bytes(),
            b"used",
            b3.format(e.used).as_bytes(),
            b"period_start",
            b4.format(e.period_start).as_bytes(),
            b"at",
            at.as_bytes(),
        ];
        let mut args: Vec<&[u8]> = Vec::with_capacity(21);
        args.push(&log.stream);
        if log.max_len > 0 {
            args.extend_from_slice(&[b"MAXLEN", b"~", max_len.as_bytes()]);
        }
        args.push(b"*");
        args.extend_from_slice(&fields);
        let reply: CallResult = ctx.call_ext("XADD", &options, args.as_slice());
        match reply {
            Ok(_) => stats::bump(&stats::USAGE_ENTRIES),
            Err(_) => {
                stats::bump(&stats::USAGE_ERRORS);
                ctx.log_warning("quota: a usage stream entry could not be added (XADD failed)");
            }
        }
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
}
