//! `QUOTA.WAPPLY key <packed>`: the internal command that carries one admitted `QUOTA.WINDOW`
//! call to replicas and the AOF. `<packed>` is `at_ms window_ms precision_ms cost expire_at_ms`
//! in one string ([`crate::shell::effects::Packed`]); the six-argument form of earlier versions
//! still loads.
//!
//! Every value is resolved on the master: its time, the precision (default applied), the cost
//! and the key's absolute expiry (unix ms; `-1` = the key holds nothing afterwards and is
//! deleted). The limit is absent on purpose: the master decided, and a replica records the call
//! unconditionally ([`crate::core::window::Window::record`]), so the same stream applied to the
//! same state gives the same state, and the same expiry, on any server, whatever its clock.
//!
//! The effect form `QUOTA.WAPPLY key <at_ms EFFECT args ...>` (configured keys and the ids of
//! multi-key reservations) is described in [`crate::shell::window_effects`].
//!
//! Accepted only from the master link or while loading (a client could otherwise forge state).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::window::WindowParams;
use crate::shell::apply_cmds::{from_replication_or_loading, internal_only};
use crate::shell::args::{parse_i64, Args};
use crate::shell::clock::MAX_AT_MS;
use crate::shell::key::ModuleKey;
use crate::shell::reply::error_reply;
use crate::shell::window_cmds::{record_at_key, Record, EVENT, NO_EXPIRY, WAPPLY};
use crate::shell::{effects, events, window_effects};

/// `QUOTA.WAPPLY key <packed>` (the five integers in one [`crate::shell::effects::Packed`]
/// string) or `QUOTA.WAPPLY key at_ms window_ms precision_ms cost expire_at_ms` → OK.
pub fn quota_wapply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !from_replication_or_loading(ctx) {
        return Err(internal_only(WAPPLY));
    }
    let mut a = Args::new(&args, 2)?;
    let key_name = a.next_string()?;
    let packed;
    let ints: Vec<&[u8]> = if args.len() == 3 {
        packed = a.next_bytes()?;
        effects::unpack(packed)?
    } else {
        args.iter().skip(2).map(RedisString::as_slice).collect()
    };
    // The effect form (a configured key, multi-key reservations): a word after at_ms.
    if let [at, op, rest @ ..] = ints.as_slice() {
        if parse_i64(op).is_err() {
            let at_ms = parse_i64(at)?;
            if !(0..=MAX_AT_MS).contains(&at_ms) {
                return Err(RedisError::Str("ERR QUOTA.WAPPLY: bad at_ms"));
            }
            let effects = window_effects::decode(std::iter::once(*op).chain(rest.iter().copied()))?;
            let mut key = ModuleKey::open_writable(ctx, key_name)?;
            let (applied, error) =
                window_effects::apply_at_key(ctx, &mut key, key_name, at_ms, &effects);
            drop(key);
            if applied > 0 {
                // Feeds this server's own AOF and sub-replicas (they stop at the same point).
                ctx.replicate_verbatim();
            }
            return match error {
                Some(e) => Err(e),
                None => Ok(RedisValue::SimpleStringStatic("OK")),
            };
        }
    }
    let [at_ms, window_ms, precision_ms, cost, expire_at] = ints.as_slice() else {
        return Err(RedisError::WrongArity);
    };
    let [at_ms, window_ms, precision_ms, cost] =
        [at_ms, window_ms, precision_ms, cost].map(|t| parse_i64(t));
    let (at_ms, window_ms, precision_ms, cost) = (at_ms?, window_ms?, precision_ms?, cost?);
    // A master's time (wall clock or AT) is never outside this; a forged line could be.
    if !(0..=MAX_AT_MS).contains(&at_ms) {
        return Err(RedisError::Str("ERR QUOTA.WAPPLY: bad at_ms"));
    }
    let expire_at = match parse_i64(expire_at)? {
        NO_EXPIRY => None,
        ms if ms >= 0 => Some(ms),
        _ => return Err(RedisError::Str("ERR QUOTA.WAPPLY: bad expire_at_ms")),
    };
    // The limit plays no part in recording; 0 only satisfies validation.
    let params =
        WindowParams::parse(0, window_ms, Some(cost), Some(precision_ms)).map_err(error_reply)?;
    let mut key = ModuleKey::open_writable(ctx, key_name)?;
    record_at_key(&mut key, &params, at_ms, Record::Replicated(expire_at))?;
    drop(key);
    events::publish(ctx, key_name, EVENT);
    // Feeds this server's own AOF and sub-replicas.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
