//! `QUOTA.WAPPLY key at_ms window_ms precision_ms cost expire_at_ms`: the internal command that
//! carries one admitted `QUOTA.WINDOW` call to replicas and the AOF.
//!
//! Every value is resolved on the master: its time, the precision (default applied), the cost
//! and the key's absolute expiry (unix ms; `-1` = the key holds nothing afterwards and is
//! deleted). The limit is absent on purpose: the master decided, and a replica records the call
//! unconditionally ([`crate::core::window::Window::record`]), so the same stream applied to the
//! same state gives the same state, and the same expiry, on any server, whatever its clock.
//!
//! Accepted only from the master link or while loading (a client could otherwise forge state).

use redis_module::{Context, NotifyEvent, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::window::WindowParams;
use crate::shell::apply_cmds::{from_replication_or_loading, internal_only};
use crate::shell::args::Args;
use crate::shell::window_cmds::{record_at_key, window_err, EVENT, NO_EXPIRY, WAPPLY};
use crate::shell::window_key::WindowKey;

/// `QUOTA.WAPPLY key at_ms window_ms precision_ms cost expire_at_ms` → OK.
pub fn quota_wapply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !from_replication_or_loading(ctx) {
        return Err(internal_only(WAPPLY));
    }
    let mut a = Args::new(&args, 6)?;
    let key_name = a.next_string()?;
    let at_ms = a.next_i64()?;
    let window_ms = a.next_i64()?;
    let precision_ms = a.next_i64()?;
    let cost = a.next_i64()?;
    let expire_at = match a.next_i64()? {
        NO_EXPIRY => None,
        ms if ms >= 0 => Some(ms),
        _ => return Err(RedisError::Str("ERR QUOTA.WAPPLY: bad expire_at_ms")),
    };
    if !a.is_empty() {
        return Err(RedisError::WrongArity);
    }
    // The limit plays no part in recording; 0 only satisfies validation.
    let params =
        WindowParams::parse(0, window_ms, Some(cost), Some(precision_ms)).map_err(window_err)?;
    let mut key = WindowKey::open_writable(ctx, key_name)?;
    record_at_key(&mut key, &params, at_ms, Some(expire_at))?;
    drop(key);
    ctx.notify_keyspace_event(NotifyEvent::MODULE, EVENT, key_name);
    // Feeds this server's own AOF and sub-replicas.
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
