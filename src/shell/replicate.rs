//! Replication of effects: one `QUOTA.APPLY key <packed>` per write (and `QUOTA.WAPPLY key
//! <packed>` per counted window call), which Redis sends to replicas and the AOF (wrapped in
//! MULTI/EXEC with anything else the call replicates).
//!
//! This is on every write's path: the tokens are packed into one buffer
//! ([`crate::shell::effects::Packed`]) and handed to `RedisModule_Replicate` with the format
//! `sb` (the key by reference, the buffer copied once by Redis). Before issue 5's work each
//! token was its own Redis string: three to six allocations and frees more per write.

use std::ffi::CStr;
use std::os::raw::c_char;

use redis_module::{raw, Context, RedisString};

use crate::core::ledger::Effect;
use crate::shell::effects::{self, Packed, TokenSink};

/// Name of the internal command carrying ledger effects.
pub const APPLY: &CStr = c"QUOTA.APPLY";

/// Replicates `effects` for `key` at `at_ms`, with the usage entries the master added for
/// them (`logged`, see [`effects::Logged`]). Logs (never panics) if Redis refuses, which would
/// mean a misspelt command name: replicas would silently miss the write.
pub fn replicate_effects(
    ctx: &Context,
    key: &RedisString,
    at_ms: i64,
    list: &[Effect],
    logged: &[effects::Logged],
) {
    if list.is_empty() {
        return;
    }
    with_buffer(|packed| {
        packed.int(at_ms);
        effects::write_all(list, logged, packed);
        replicate_packed(ctx, APPLY, key, packed);
    });
}

/// The packed argument of `QUOTA.APPLY`: `at_ms`, then each effect's tokens.
pub fn pack_effects(at_ms: i64, list: &[Effect]) -> Packed {
    let mut packed = Packed::with_capacity(64);
    packed.int(at_ms);
    effects::write_all(list, &[], &mut packed);
    packed
}

/// Replicates `command key <ints packed>`.
pub fn replicate_key_ints(ctx: &Context, command: &CStr, key: &RedisString, ints: &[i64]) {
    with_buffer(|packed| {
        for &n in ints {
            packed.int(n);
        }
        replicate_packed(ctx, command, key, packed);
    });
}

/// Replicates `command key <packed>`, the packed string written by `fill`.
pub fn replicate_key_with(
    ctx: &Context,
    command: &CStr,
    key: &RedisString,
    fill: impl FnOnce(&mut Packed),
) {
    with_buffer(|packed| {
        fill(packed);
        replicate_packed(ctx, command, key, packed);
    });
}

std::thread_local! {
    /// One buffer reused by every write (only the main thread replicates): no allocation per
    /// write once it has grown to the longest packed string.
    static BUFFER: std::cell::RefCell<Packed> = std::cell::RefCell::new(Packed::with_capacity(256));
}

/// Runs `f` with an empty packed buffer: the reused one, or a fresh one if that is in use
/// (never in practice) or gone (thread exit).
pub(crate) fn with_buffer(f: impl FnOnce(&mut Packed)) {
    let mut f = Some(f);
    let _ = BUFFER.try_with(|b| {
        if let Ok(mut packed) = b.try_borrow_mut() {
            packed.clear();
            if let Some(f) = f.take() {
                f(&mut packed);
            }
            // A rare very long string (a CONFIG with a long zone, many releases) is not kept.
            packed.shrink_to(4096);
        }
    });
    if let Some(f) = f.take() {
        f(&mut Packed::with_capacity(64));
    }
}

/// `RedisModule_Replicate(ctx, command, "sb", key, bytes, len)`, checking the status.
fn replicate_packed(ctx: &Context, command: &CStr, key: &RedisString, packed: &Packed) {
    let bytes = packed.as_bytes();
    // SAFETY: a live context, key string and buffer for the duration of the call; "sb" takes
    // (RedisModuleString*, const char*, size_t) and Redis copies the buffer.
    let status = unsafe {
        match raw::RedisModule_Replicate {
            Some(f) => f(
                ctx.ctx,
                command.as_ptr(),
                c"sb".as_ptr(),
                key.inner,
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            ),
            None => raw::REDISMODULE_ERR as i32,
        }
    };
    if status != raw::REDISMODULE_OK as i32 {
        ctx.log_warning("quota: replication of an effect was refused by Redis");
    }
}

/// Most keys [`replicate_keys_packed`] names (the multi-key commands' `numkeys`).
pub const MAX_REPLICATED_KEYS: usize = 16;

std::thread_local! {
    /// `numkeys` as Redis strings `"1"` to `"16"`, made once (without a context) and kept for
    /// the life of the process, like [`crate::shell::usage`]'s shared words: replicated by
    /// reference (`s`), where an `l` makes and frees a string on every call. `None` if one
    /// could not be made (then `l` is used).
    static NUMKEYS: std::cell::OnceCell<Option<NumkeysStrings>> =
        const { std::cell::OnceCell::new() };
}

type NumkeysStrings = [*mut raw::RedisModuleString; MAX_REPLICATED_KEYS];

/// The shared `numkeys` string for `n` keys (1..=16), or null (none: use `l`).
fn numkeys_string(n: usize) -> *mut raw::RedisModuleString {
    let made = NUMKEYS.try_with(|cell| {
        *cell.get_or_init(|| {
            let mut all: NumkeysStrings = [std::ptr::null_mut(); MAX_REPLICATED_KEYS];
            for (i, slot) in (1usize..).zip(all.iter_mut()) {
                let mut digits = itoa::Buffer::new();
                let digits = digits.format(i).as_bytes();
                // SAFETY: plain API call without a context; Redis copies the bytes. The string
                // is never freed (one per count, for the life of the process).
                *slot = unsafe {
                    match raw::RedisModule_CreateString {
                        Some(f) => f(std::ptr::null_mut(), digits.as_ptr().cast(), digits.len()),
                        None => std::ptr::null_mut(),
                    }
                };
            }
            all.iter().all(|p| !p.is_null()).then_some(all)
        })
    });
    match made {
        Ok(Some(all)) => n
            .checked_sub(1)
            .and_then(|i| all.get(i).copied())
            .unwrap_or(std::ptr::null_mut()),
        _ => std::ptr::null_mut(),
    }
}

/// `RedisModule_Replicate(ctx, command, "s" + "s"×n + "b", numkeys, key..., packed)`:
/// `command numkeys key [key ...] <packed>` in one call (one command lookup, one entry in the
/// stream), checking the status. `numkeys` is a shared string (`l`, a number Redis turns into
/// a string, if it could not be made). Each key is its own `s`: Redis sizes its argv from the
/// format, where a `v` list would make it grow the argv twice. More than
/// [`MAX_REPLICATED_KEYS`] keys (never: the commands refuse them) is not replicated, and
/// logged.
pub fn replicate_keys_packed(
    ctx: &Context,
    command: &CStr,
    keys: &[&RedisString],
    packed: &Packed,
) {
    let n = keys.len();
    let mut k = [std::ptr::null_mut::<raw::RedisModuleString>(); MAX_REPLICATED_KEYS];
    for (slot, key) in k.iter_mut().zip(keys) {
        *slot = key.inner;
    }
    let shared = numkeys_string(n);
    // "s" (or "l"), then one "s" per key, then "b", NUL-terminated.
    let mut format = [0u8; MAX_REPLICATED_KEYS + 3];
    format[0] = if shared.is_null() { b'l' } else { b's' };
    for c in format.iter_mut().skip(1).take(n) {
        *c = b's';
    }
    if let Some(c) = format.get_mut(n.saturating_add(1)) {
        *c = b'b';
    }
    let bytes = packed.as_bytes();
    let (p, len) = (bytes.as_ptr().cast::<c_char>(), bytes.len());
    let numkeys = std::os::raw::c_longlong::try_from(n).unwrap_or(0);
    let fmt = format.as_ptr().cast::<c_char>();
    let cmd = command.as_ptr();
    /// One call with `numkeys` (shared or a long long), the first `n` keys, then the buffer,
    /// for each `n` listed.
    macro_rules! with_keys {
        ($f:expr; $($n:literal => [$($i:literal),+]),+ $(,)?) => {
            match (n, shared.is_null()) {
                $(($n, false) => $f(ctx.ctx, cmd, fmt, shared, $(k[$i],)+ p, len),
                  ($n, true) => $f(ctx.ctx, cmd, fmt, numkeys, $(k[$i],)+ p, len),)+
                _ => raw::REDISMODULE_ERR as i32,
            }
        };
    }
    // SAFETY: a live context, strings and buffer for the duration of the call. The format
    // names exactly the variadic arguments passed: the shared numkeys RedisModuleString* (or a
    // long long), `n` RedisModuleString* (Redis takes a reference to each), then (const char*,
    // size_t) (Redis copies the buffer).
    let status = unsafe {
        match raw::RedisModule_Replicate {
            Some(f) => with_keys!(f;
                1 => [0],
                2 => [0, 1],
                3 => [0, 1, 2],
                4 => [0, 1, 2, 3],
                5 => [0, 1, 2, 3, 4],
                6 => [0, 1, 2, 3, 4, 5],
                7 => [0, 1, 2, 3, 4, 5, 6],
                8 => [0, 1, 2, 3, 4, 5, 6, 7],
                9 => [0, 1, 2, 3, 4, 5, 6, 7, 8],
                10 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9],
                11 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10],
                12 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11],
                13 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12],
                14 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13],
                15 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14],
                16 => [0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15],
            ),
            None => raw::REDISMODULE_ERR as i32,
        }
    };
    if status != raw::REDISMODULE_OK as i32 {
        ctx.log_warning("quota: replication of an effect was refused by Redis");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ledger::{OnExpire, Settings};
    use crate::core::period::Period;

    #[test]
    fn packed_form_unpacks_to_the_token_form() {
        let id = crate::core::book::Id::from_slice(b"r 1:x");
        let effects = [
            Effect::Configure {
                settings: Box::new(Settings::plain(5, 1, None, 9)),
                used: 2,
                period: Box::new(Period::none()),
                bounds: None,
            },
            Effect::Configure {
                settings: Box::new(Settings {
                    on_expire: OnExpire::Elapsed,
                    unit_ms: Some(1000),
                    ..Settings::plain(5, 1, Some(3), 9)
                }),
                used: 2,
                period: Box::new(Period::none()),
                bounds: None,
            },
            Effect::Configure {
                settings: Box::new(Settings {
                    on_expire: OnExpire::Charge,
                    ..Settings::plain(5, 1, Some(3), 9)
                }),
                used: 2,
                period: Box::new(Period::none()),
                bounds: None,
            },
            Effect::Reset {
                start_ms: 1,
                end_ms: 2,
            },
            Effect::Grant {
                id: id.clone(),
                amount: -3,
                deadline_ms: i64::MAX,
            },
            Effect::Settle {
                id: id.clone(),
                actual: 4,
            },
            Effect::SettleLate {
                id: id.clone(),
                actual: 5,
            },
            Effect::Rollback { id: id.clone() },
            Effect::Release {
                id: id.clone(),
                on_expire: OnExpire::Release,
                charge: 0,
            },
            Effect::Release {
                id: id.clone(),
                on_expire: OnExpire::Charge,
                charge: 8,
            },
            Effect::Release {
                id: id.clone(),
                on_expire: OnExpire::Elapsed,
                charge: 0,
            },
            Effect::Extend {
                id: id.clone(),
                deadline_ms: 6,
            },
            Effect::Charge {
                amount: 7,
                overrun: 0,
                id: None,
                forced: false,
            },
            Effect::Charge {
                amount: 7,
                overrun: 1,
                id: Some(id.clone()),
                forced: false,
            },
            Effect::Charge {
                amount: 8,
                overrun: 2,
                id: None,
                forced: true,
            },
            Effect::Charge {
                amount: 8,
                overrun: 2,
                id: Some(id.clone()),
                forced: true,
            },
            Effect::Usage {
                log: Some(crate::core::ledger::UsageLog {
                    stream: b"{t} usage:1".to_vec(),
                    max_len: 10,
                }),
            },
            Effect::Usage { log: None },
            Effect::Forget { id },
        ];
        let packed = pack_effects(i64::MIN, &effects);
        let mut reference = vec![i64::MIN.to_string().into_bytes()];
        for e in &effects {
            effects::write(e, &mut reference);
        }
        let unpacked = effects::unpack(packed.as_bytes()).unwrap();
        assert_eq!(unpacked, reference);
        assert_eq!(
            effects::decode(unpacked.into_iter().skip(1)).unwrap(),
            effects
        );
    }

    #[test]
    fn packed_grant_reads_well() {
        let grant = Effect::Grant {
            id: b"1764485000000-0"[..].into(),
            amount: 5,
            deadline_ms: 1764488600000,
        };
        let packed = pack_effects(1764485000000, &[grant]);
        assert_eq!(
            packed.as_bytes(),
            b"1764485000000 GRANT 15:1764485000000-0 5 1764488600000"
        );
    }

    #[test]
    fn policy_tails_read_well_and_default_forms_are_unchanged() {
        let release = |on_expire, charge| Effect::Release {
            id: b"a"[..].into(),
            on_expire,
            charge,
        };
        let packed = pack_effects(
            7,
            &[
                release(OnExpire::Release, 0),
                release(OnExpire::Elapsed, 3),
                Effect::Charge {
                    amount: 1,
                    overrun: 0,
                    id: None,
                    forced: false,
                },
            ],
        );
        assert_eq!(
            packed.as_bytes(),
            b"7 RELEASE 1:a RELEASE 1:a ONEXPIRE ELAPSED 3 CHARGE 1 0"
        );
        let configure = Effect::Configure {
            settings: Box::new(Settings {
                on_expire: OnExpire::Charge,
                unit_ms: Some(60000),
                ..Settings::plain(5, 0, None, 9)
            }),
            used: 0,
            period: Box::new(Period::none()),
            bounds: None,
        };
        assert_eq!(
            pack_effects(7, &[configure]).as_bytes(),
            b"7 CONFIG 5 0 0 -1 9 NONE 3:UTC - - - ONEXPIRE CHARGE UNIT 60000"
        );
    }

    #[test]
    fn malformed_packed_strings_are_refused() {
        for bad in [
            &b" 1"[..],
            b"1 ",
            b"1  2",
            b"3:ab",
            b"3:abcd",
            b":x",
            b"x:ab",
            b"-1:",
            b"99999999999999999999999:x",
            b"01:x",
            b"00:",
        ] {
            assert!(effects::unpack(bad).is_err(), "{:?}", bad);
        }
        assert_eq!(effects::unpack(b"").unwrap(), Vec::<&[u8]>::new());
        assert_eq!(effects::unpack(b"0: 2:a ").unwrap(), vec![&b""[..], b"a "]);
        assert_eq!(
            effects::unpack(b"0: 2:a  -").unwrap(),
            vec![&b""[..], b"a ", b"-"]
        );
    }
}
