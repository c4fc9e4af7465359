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

/// The arguments a multi-key command needs after its keys: `per_key` values for each of the
/// `numkeys` keys (amounts, actuals) and `fixed` more (the id, a TTL).
#[derive(Clone, Copy)]
pub struct After {
    pub per_key: usize,
    pub fixed: usize,
}

impl After {
    /// `QUOTA.MRESERVE`: an amount per key.
    pub const MRESERVE: After = After {
        per_key: 1,
        fixed: 0,
    };
    /// `QUOTA.MSETTLE`: the id, an actual per key.
    pub const MSETTLE: After = After {
        per_key: 1,
        fixed: 1,
    };
    /// `QUOTA.MROLLBACK`: the id.
    pub const MROLLBACK: After = After {
        per_key: 0,
        fixed: 1,
    };
    /// `QUOTA.MEXTEND`: the id and `ttl_ms`.
    pub const MEXTEND: After = After {
        per_key: 0,
        fixed: 2,
    };
}

/// If Redis is only asking for the command's key positions (`getkeys-api`), declares them —
/// `numkeys` at argv[1], the keys after it — and returns true: the handler must then return
/// without replying or doing anything else.
///
/// Declares none unless `numkeys` is 1 to `max` and argv holds the keys and everything
/// `after` them: otherwise the keys would be guessed from amounts or ids (so cluster routing
/// would answer `CROSSSLOT` or `MOVED` for a garbage key), while with none Redis lets the
/// command run and reply with its own arity or syntax error (as Redis does for `EVAL` with a
/// bad numkeys).
pub fn answer_key_positions(
    ctx: &Context,
    args: &[redis_module::RedisString],
    max: usize,
    after: After,
) -> bool {
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
    let numkeys = args
        .get(1)
        .and_then(|a| crate::shell::args::parse_canonical_i64(a.as_slice()));
    for pos in key_positions(numkeys, args.len(), max, after) {
        if let Ok(pos) = c_int::try_from(pos) {
            // SAFETY: the live context of a key position request; `pos` is an argument index.
            unsafe { key_at(ctx.ctx, pos) };
        }
    }
    true
}

/// The argv indexes of the keys of a multi-key command with `argc` arguments (its name
/// included) and `numkeys` at argv[1]: `2..2 + numkeys`, or none if `numkeys` is not 1 to
/// `max` or argv is too short for the keys and what comes `after` them.
pub fn key_positions(
    numkeys: Option<i64>,
    argc: usize,
    max: usize,
    after: After,
) -> std::ops::Range<usize> {
    let n = numkeys
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=max).contains(n))
        .unwrap_or(0);
    let needed = n
        .checked_mul(after.per_key.saturating_add(1))
        .and_then(|k| k.checked_add(after.fixed))
        .and_then(|k| k.checked_add(2));
    match needed {
        Some(needed) if n > 0 && needed <= argc => 2..n.saturating_add(2),
        _ => 0..0,
    }
}

#[cfg(test)]
mod tests {
    use super::{key_positions, After};

    const MRESERVE: After = After::MRESERVE;
    const MSETTLE: After = After::MSETTLE;
    const MROLLBACK: After = After::MROLLBACK;

    #[test]
    fn keys_are_declared_only_when_argv_holds_them_and_what_follows() {
        // QUOTA.MRESERVE 2 a b 1 1 [options]
        assert_eq!(key_positions(Some(2), 6, 16, MRESERVE), 2..4);
        assert_eq!(key_positions(Some(2), 8, 16, MRESERVE), 2..4);
        // An amount missing, numkeys above the arguments, out of range, not a number.
        assert_eq!(key_positions(Some(2), 5, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(Some(3), 5, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(Some(0), 6, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(Some(-1), 6, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(Some(17), 40, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(None, 6, 16, MRESERVE), 0..0);
        assert_eq!(key_positions(Some(i64::MAX), 6, usize::MAX, MRESERVE), 0..0);
        // QUOTA.MSETTLE 2 a b id 1 1; QUOTA.MROLLBACK 2 a b id.
        assert_eq!(key_positions(Some(2), 7, 16, MSETTLE), 2..4);
        assert_eq!(key_positions(Some(2), 6, 16, MSETTLE), 0..0);
        assert_eq!(key_positions(Some(2), 5, 16, MROLLBACK), 2..4);
        assert_eq!(key_positions(Some(2), 4, 16, MROLLBACK), 0..0);
    }
}
