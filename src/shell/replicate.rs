//! Replication of effects: one `QUOTA.APPLY key at_ms EFFECT ...` per write, which Redis sends to
//! replicas and the AOF (wrapped in MULTI/EXEC with anything else the call replicates).
//!
//! This is on every write's path, so the arguments go to `RedisModule_Replicate` as one vector
//! of Redis strings built directly: the key is the command's own string (Redis only takes a
//! reference), every other argument is one small allocation, and nothing is formatted or copied
//! on the Rust side first. The wire format is [`crate::shell::effects`]' (its `encode` is the
//! reference; a unit test checks both agree).

use std::ffi::CStr;
use std::os::raw::c_char;
use std::sync::atomic::{AtomicPtr, Ordering};

use redis_module::{raw, Context, RedisString};

use crate::core::ledger::Effect;

/// Replicates `effects` for `key` at `at_ms`. Logs (never panics) if Redis refuses, which would
/// mean a misspelt command name: replicas would silently miss the write.
pub fn replicate_effects(ctx: &Context, key: &RedisString, at_ms: i64, list: &[Effect]) {
    if list.is_empty() {
        return;
    }
    let mut argv = Argv::with_capacity(list.len().saturating_mul(4).saturating_add(2));
    argv.borrowed(key.inner);
    argv.int(at_ms);
    for e in list {
        push_effect(&mut argv, e);
    }
    argv.replicate(ctx, c"QUOTA.APPLY");
}

/// Replicates `command key ints...` (the key by reference, each integer one Redis string).
pub fn replicate_key_ints(ctx: &Context, command: &CStr, key: &RedisString, ints: &[i64]) {
    let mut argv = Argv::with_capacity(ints.len().saturating_add(1));
    argv.borrowed(key.inner);
    for &n in ints {
        argv.int(n);
    }
    argv.replicate(ctx, command);
}

/// Replicates `command tokens...` checking the status.
pub fn replicate_tokens(ctx: &Context, command: &str, tokens: &[Vec<u8>]) {
    let Ok(name) = std::ffi::CString::new(command) else {
        ctx.log_warning("quota: replication of an effect was refused by Redis");
        return;
    };
    let mut argv = Argv::with_capacity(tokens.len());
    for t in tokens {
        argv.bytes(t);
    }
    argv.replicate(ctx, &name);
}

/// Where the tokens of an effect go: Redis strings, or byte vectors (tests).
trait Sink {
    fn bytes(&mut self, b: &[u8]);
    fn int(&mut self, n: i64);

    /// An effect name.
    fn name(&mut self, name: Name) {
        self.bytes(name.bytes());
    }

    /// `-` for none.
    fn opt(&mut self, n: Option<i64>) {
        match n {
            Some(n) => self.int(n),
            None => self.bytes(b"-"),
        }
    }
}

/// The tokens of one effect, as [`crate::shell::effects::encode`] writes them.
fn push_effect(argv: &mut impl Sink, effect: &Effect) {
    match effect {
        Effect::Configure {
            settings,
            used,
            period,
            bounds,
        } => {
            argv.name(Name::Config);
            argv.int(settings.limit);
            argv.int(*used);
            argv.int(settings.overdraft);
            argv.int(settings.max_reserve.unwrap_or(-1));
            argv.int(settings.default_ttl_ms);
            argv.bytes(period.kind.as_str().as_bytes());
            argv.bytes(period.tz.as_bytes());
            argv.opt(period.anchor_ms);
            argv.opt(bounds.map(|b| b.0));
            argv.opt(bounds.map(|b| b.1));
        }
        Effect::Reset { start_ms, end_ms } => {
            argv.name(Name::Reset);
            argv.int(*start_ms);
            argv.int(*end_ms);
        }
        Effect::Grant {
            id,
            amount,
            deadline_ms,
        } => {
            argv.name(Name::Grant);
            argv.bytes(id);
            argv.int(*amount);
            argv.int(*deadline_ms);
        }
        Effect::Settle { id, actual } => {
            argv.name(Name::Settle);
            argv.bytes(id);
            argv.int(*actual);
        }
        Effect::SettleLate { id, actual } => {
            argv.name(Name::Late);
            argv.bytes(id);
            argv.int(*actual);
        }
        Effect::Rollback { id } => {
            argv.name(Name::Rollback);
            argv.bytes(id);
        }
        Effect::Release { id } => {
            argv.name(Name::Release);
            argv.bytes(id);
        }
        Effect::Extend { id, deadline_ms } => {
            argv.name(Name::Extend);
            argv.bytes(id);
            argv.int(*deadline_ms);
        }
        Effect::Charge {
            amount,
            overrun,
            id: None,
        } => {
            argv.name(Name::Charge);
            argv.int(*amount);
            argv.int(*overrun);
        }
        Effect::Charge {
            amount,
            overrun,
            id: Some(id),
        } => {
            argv.name(Name::ChargeId);
            argv.int(*amount);
            argv.int(*overrun);
            argv.bytes(id);
        }
        Effect::Forget { id } => {
            argv.name(Name::Forget);
            argv.bytes(id);
        }
    }
}

/// Arguments for `RedisModule_Replicate(ctx, name, "v", argv, argc)`: strings this owns (freed
/// on drop; Redis keeps its own reference) and borrowed ones.
struct Argv {
    strings: Vec<*mut raw::RedisModuleString>,
    /// How many leading entries are borrowed (not freed).
    borrowed: usize,
}

impl Argv {
    fn with_capacity(n: usize) -> Argv {
        Argv {
            strings: Vec::with_capacity(n),
            borrowed: 0,
        }
    }

    /// A string owned elsewhere that outlives the call (the command's key argument). Only
    /// before any owned argument.
    fn borrowed(&mut self, s: *mut raw::RedisModuleString) {
        if self.strings.len() == self.borrowed {
            self.strings.push(s);
            self.borrowed = self.borrowed.saturating_add(1);
        }
    }

    fn owned(&mut self, s: Option<*mut raw::RedisModuleString>) {
        // A null string (out of memory is fatal in Redis, so never in practice) is skipped by
        // `replicate`, which then refuses the whole call.
        self.strings.push(s.unwrap_or(std::ptr::null_mut()));
    }

    fn replicate(&self, ctx: &Context, command: &CStr) {
        let complete = !self.strings.iter().any(|s| s.is_null());
        // SAFETY: every pointer is a live Redis string; "v" takes (array, count).
        let status = unsafe {
            match raw::RedisModule_Replicate {
                Some(f) if complete => f(
                    ctx.ctx,
                    command.as_ptr(),
                    c"v".as_ptr(),
                    self.strings.as_ptr(),
                    self.strings.len(),
                ),
                _ => raw::REDISMODULE_ERR as i32,
            }
        };
        if status != raw::REDISMODULE_OK as i32 {
            ctx.log_warning("quota: replication of an effect was refused by Redis");
        }
    }
}

impl Sink for Argv {
    fn bytes(&mut self, b: &[u8]) {
        // SAFETY: plain API call; a null context makes the string ours to free.
        let s = unsafe {
            raw::RedisModule_CreateString
                .map(|f| f(std::ptr::null_mut(), b.as_ptr().cast::<c_char>(), b.len()))
        };
        self.owned(s);
    }

    fn int(&mut self, n: i64) {
        // SAFETY: plain API call; a null context makes the string ours to free.
        let s = unsafe {
            raw::RedisModule_CreateStringFromLongLong.map(|f| f(std::ptr::null_mut(), n))
        };
        self.owned(s);
    }

    /// Effect names are a handful of constant strings: made once, shared by every call
    /// (Redis takes its own reference while it propagates).
    fn name(&mut self, name: Name) {
        match cached_name(name) {
            Some(s) => {
                // SAFETY: a live cached string; our extra reference is dropped with the others.
                unsafe {
                    if let Some(retain) = raw::RedisModule_RetainString {
                        retain(std::ptr::null_mut(), s);
                    }
                }
                self.owned(Some(s));
            }
            None => self.bytes(name.bytes()),
        }
    }
}

/// The effect names; the discriminant is the cache slot.
#[derive(Clone, Copy)]
enum Name {
    Config,
    Reset,
    Grant,
    Settle,
    Late,
    Rollback,
    Release,
    Extend,
    Charge,
    ChargeId,
    Forget,
}

impl Name {
    fn bytes(self) -> &'static [u8] {
        match self {
            Name::Config => b"CONFIG",
            Name::Reset => b"RESET",
            Name::Grant => b"GRANT",
            Name::Settle => b"SETTLE",
            Name::Late => b"LATE",
            Name::Rollback => b"ROLLBACK",
            Name::Release => b"RELEASE",
            Name::Extend => b"EXTEND",
            Name::Charge => b"CHARGE",
            Name::ChargeId => b"CHARGEID",
            Name::Forget => b"FORGET",
        }
    }
}

/// One Redis string per name in [`NAMES`], created on first use and kept for the life of the
/// process (only the main thread replicates).
static NAME_CACHE: [AtomicPtr<raw::RedisModuleString>; 11] =
    [const { AtomicPtr::new(std::ptr::null_mut()) }; 11];

fn cached_name(name: Name) -> Option<*mut raw::RedisModuleString> {
    let slot = NAME_CACHE.get(name as usize)?;
    let cached = slot.load(Ordering::Relaxed);
    if !cached.is_null() {
        return Some(cached);
    }
    // SAFETY: plain API call; a null context makes the string ours (never freed).
    let bytes = name.bytes();
    let made = unsafe {
        raw::RedisModule_CreateString.map(|f| {
            f(
                std::ptr::null_mut(),
                bytes.as_ptr().cast::<c_char>(),
                bytes.len(),
            )
        })
    }
    .filter(|p| !p.is_null())?;
    slot.store(made, Ordering::Relaxed);
    Some(made)
}

impl Drop for Argv {
    fn drop(&mut self) {
        for &s in self.strings.iter().skip(self.borrowed) {
            if !s.is_null() {
                // SAFETY: created above with a null context, freed once.
                unsafe {
                    if let Some(free) = raw::RedisModule_FreeString {
                        free(std::ptr::null_mut(), s);
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::ledger::Settings;
    use crate::core::period::Period;

    impl Sink for Vec<Vec<u8>> {
        fn bytes(&mut self, b: &[u8]) {
            self.push(b.to_vec());
        }

        fn int(&mut self, n: i64) {
            self.push(n.to_string().into_bytes());
        }
    }

    #[test]
    fn tokens_are_the_wire_format() {
        let id: Box<[u8]> = b"r-1"[..].into();
        let effects = [
            Effect::Configure {
                settings: Settings {
                    limit: 5,
                    overdraft: 1,
                    max_reserve: None,
                    default_ttl_ms: 9,
                },
                used: 2,
                period: Period::none(),
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
            Effect::Release { id: id.clone() },
            Effect::Extend {
                id: id.clone(),
                deadline_ms: 6,
            },
            Effect::Charge {
                amount: 7,
                overrun: 0,
                id: None,
            },
            Effect::Charge {
                amount: 7,
                overrun: 1,
                id: Some(id.clone()),
            },
            Effect::Forget { id },
        ];
        for e in &effects {
            let mut ours: Vec<Vec<u8>> = Vec::new();
            push_effect(&mut ours, e);
            let mut reference = Vec::new();
            crate::shell::effects::encode(e, &mut reference);
            assert_eq!(ours, reference, "{e:?}");
        }
    }
}
