//! Key positions of the multi-key commands (`QUOTA.MRESERVE`, `MSETTLE`, `MROLLBACK`,
//! `MEXTEND`): `numkeys` at argv[1], then that many keys. The legacy (first, last, step) triple
//! cannot say this, so the commands are created without key positions and declare them twice:
//!
//! - a key spec (begin search at index 1, find keys by keynum: the count at offset 0, the first
//!   key at offset 1, step 1), set with the rest of their documentation by
//!   [`crate::shell::command_docs`] (Redis takes a command's info once). `COMMAND GETKEYS`,
//!   `COMMAND INFO` and ACL key patterns read it;
//! - the `getkeys-api` flag, answered by [`answer_key_positions`] at the top of each handler:
//!   Redis 7.0's cluster routing (CROSSSLOT, MOVED, CLUSTERDOWN) asks the command itself
//!   (`getKeysFromCommand`), never its key specs, for a command without legacy positions.

use std::os::raw::c_int;

use redis_module::{raw, Context};

/// If Redis is only asking for the command's key positions (`getkeys-api`), declares them —
/// `numkeys` at argv[1] (1 to `max` of them; another value declares none, and the command
/// itself then refuses it), the keys after it — and returns true: the handler must then return
/// without replying or doing anything else.
pub fn answer_key_positions(ctx: &Context, args: &[redis_module::RedisString], max: usize) -> bool {
    // SAFETY: copies of pointers written once by RedisModule_Init.
    let (Some(is_request), Some(key_at)) =
        (unsafe { raw::RedisModule_IsKeysPositionRequest }, unsafe {
            raw::RedisModule_KeyAtPos
        })
    else {
        return false;
    };
    // SAFETY: the command's live context.
    if unsafe { is_request(ctx.ctx) } == 0 {
        return false;
    }
    let n = args
        .get(1)
        .and_then(|a| crate::shell::args::parse_canonical_i64(a.as_slice()))
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=max).contains(n))
        .unwrap_or(0);
    for pos in (2..n.saturating_add(2)).take_while(|&p| p < args.len()) {
        if let Ok(pos) = c_int::try_from(pos) {
            // SAFETY: the live context of a key position request; `pos` is an argument index.
            unsafe { key_at(ctx.ctx, pos) };
        }
    }
    true
}
