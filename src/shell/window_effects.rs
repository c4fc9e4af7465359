//! Window effects beyond a plain counted call (issue 19: stored configurations and the ids of
//! multi-key reservations): their wire form inside `QUOTA.WAPPLY key <packed>`, and applying
//! them to a key with what follows (the key's expiry, keyspace events, replication).
//!
//! Wire form, after `at_ms`, one or more of:
//! - `CONFIG limit window_ms precision_ms` (`QUOTA.SET key WINDOW ...`)
//! - `COUNT window_ms precision_ms cost` · `COUNTID window_ms precision_ms cost id`
//! - `SETTLE id actual` · `ROLLBACK id` · `FORGET`
//!
//! The form of earlier versions, five integers `at_ms window_ms precision_ms cost expire_at_ms`
//! (a plain counted call on a key without configuration), is still what an unconfigured key's
//! call replicates, and still loads. A line in this form is told apart by its second token: a
//! word, not an integer.
//!
//! A configured key never expires: after these effects the key's expiry is removed (a key that
//! had one, from calls made before it was configured, loses it), on the master and on replicas
//! alike.

use std::ffi::CStr;

use redis_module::{Context, RedisError, RedisString};

use crate::core::book::Id;
use crate::core::window::{Window, WindowConfig, WindowEffect, WindowParams};
use crate::shell::args::{check_id, parse_i64, syntax_error};
use crate::shell::config::MAX_ID_LENGTH_RANGE;
use crate::shell::effects::TokenSink;
use crate::shell::key::ModuleKey;
use crate::shell::reply::error_reply;
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{events, replicate, stats, sweep_index};

/// Writes the tokens of one window effect.
pub fn write(effect: &WindowEffect, out: &mut impl TokenSink) {
    match effect {
        WindowEffect::Configure(c) => {
            out.word("CONFIG");
            out.int(c.limit);
            out.int(c.window_ms);
            out.int(c.precision_ms);
        }
        WindowEffect::Count {
            window_ms,
            precision_ms,
            cost,
            id,
        } => {
            out.word(if id.is_some() { "COUNTID" } else { "COUNT" });
            out.int(*window_ms);
            out.int(*precision_ms);
            out.int(*cost);
            if let Some(id) = id {
                out.bytes(id);
            }
        }
        WindowEffect::Settle { id, actual } => {
            out.word("SETTLE");
            out.bytes(id);
            out.int(*actual);
        }
        WindowEffect::Rollback { id } => {
            out.word("ROLLBACK");
            out.bytes(id);
        }
        WindowEffect::Forget => out.word("FORGET"),
    }
}

fn effect_id(token: &[u8]) -> Result<Id, RedisError> {
    check_id(token, MAX_ID_LENGTH_RANGE.1)?;
    Ok(token.into())
}

/// Parses window effects from tokens (everything after `at_ms`).
pub fn decode<'a>(
    tokens: impl IntoIterator<Item = &'a [u8]>,
) -> Result<Vec<WindowEffect>, RedisError> {
    let mut it = tokens.into_iter();
    let mut out = Vec::new();
    let missing = || RedisError::Str("ERR QUOTA.WAPPLY: an effect is missing an argument");
    let mut next = move || it.next();
    while let Some(op) = next() {
        let mut arg = || next().ok_or_else(missing);
        let effect = match op {
            b"CONFIG" => {
                let (limit, window_ms, precision_ms) =
                    (parse_i64(arg()?)?, parse_i64(arg()?)?, parse_i64(arg()?)?);
                WindowEffect::Configure(
                    WindowConfig::parse(limit, window_ms, Some(precision_ms))
                        .map_err(error_reply)?,
                )
            }
            b"COUNT" | b"COUNTID" => {
                let (window_ms, precision_ms, cost) =
                    (parse_i64(arg()?)?, parse_i64(arg()?)?, parse_i64(arg()?)?);
                let id = if op == b"COUNTID" {
                    Some(effect_id(arg()?)?)
                } else {
                    None
                };
                WindowEffect::Count {
                    window_ms,
                    precision_ms,
                    cost,
                    id,
                }
            }
            b"SETTLE" => WindowEffect::Settle {
                id: effect_id(arg()?)?,
                actual: parse_i64(arg()?)?,
            },
            b"ROLLBACK" => WindowEffect::Rollback {
                id: effect_id(arg()?)?,
            },
            b"FORGET" => WindowEffect::Forget,
            other => return Err(syntax_error(other)),
        };
        out.push(effect);
    }
    Ok(out)
}

/// The keyspace event of a window effect (`None`: silent).
fn event_of(effect: &WindowEffect) -> Option<&'static CStr> {
    match effect {
        WindowEffect::Configure(_) => Some(c"quota.set"),
        WindowEffect::Count { .. } => Some(crate::shell::window_cmds::EVENT),
        WindowEffect::Settle { .. } => Some(c"quota.settle"),
        WindowEffect::Rollback { .. } => Some(c"quota.rollback"),
        WindowEffect::Forget => None,
    }
}

/// Applies `effects` at `at_ms` to the window at `key` (creating it for a first `CONFIG` or
/// `COUNT`), removes the key's expiry if it ends configured, and publishes the effects' events.
/// Shared by the master and replicas; replication is the caller's ([`replicate_effects`] on a
/// master, verbatim on a replica). Returns how many effects applied and the error that stopped
/// the next one (nothing of it applied).
pub fn apply_at_key(
    ctx: &Context,
    key: &mut ModuleKey,
    key_name: &RedisString,
    at_ms: i64,
    effects: &[WindowEffect],
) -> (usize, Option<RedisError>) {
    // The value is looked up once: applied to and indexed through the same reference.
    let existing = match key.value_mut::<Window>(&WINDOW_TYPE) {
        Ok(existing) => existing,
        Err(e) => {
            key.unchanged();
            return (0, Some(e));
        }
    };
    let (applied, error, configured) = match existing {
        Some(w) => {
            let had_ids = !w.remembered().is_empty();
            let (applied, error) = apply_each(w, at_ms, effects);
            if applied == 0 {
                key.unchanged();
                return (0, error);
            }
            track_window(ctx, key_name, w, had_ids);
            (applied, error, w.config().is_some())
        }
        None => {
            let Some(first) = effects.first() else {
                key.unchanged();
                return (0, None);
            };
            let Some(mut w) = new_window(first, at_ms) else {
                key.unchanged();
                return (
                    0,
                    Some(RedisError::Str(
                        "ERR effect does not apply: no window at this key",
                    )),
                );
            };
            let (applied, error) = apply_each(&mut w, at_ms, effects);
            if applied == 0 {
                key.unchanged();
                return (0, error);
            }
            let configured = w.config().is_some();
            if let Err(e) = key.set_value(&WINDOW_TYPE, w) {
                key.unchanged();
                return (0, Some(e));
            }
            stats::bump(&stats::WINDOW_KEYS);
            if let Ok(Some(w)) = key.value::<Window>(&WINDOW_TYPE) {
                track_window(ctx, key_name, w, false);
            }
            (applied, error, configured)
        }
    };
    if configured {
        if let Err(e) = key.remove_expire() {
            redis_module::logging::log_warning(crate::shell::log_safe(&format!(
                "quota: window key expiry not removed: {e}"
            )));
        }
    }
    let mut last = None;
    for e in effects.iter().take(applied) {
        if let Some(name) = event_of(e) {
            if last != Some(name) {
                events::publish(ctx, key_name, name);
                last = Some(name);
            }
        }
    }
    (applied, error)
}

/// Applies `effects` to `w` in order until one does not apply: how many applied, and the error
/// of the one that did not (nothing of it applied).
// Inlined: its result, returned through memory, stalled MRESERVE (docs/benchmarks.md).
#[inline(always)]
fn apply_each(w: &mut Window, at_ms: i64, effects: &[WindowEffect]) -> (usize, Option<RedisError>) {
    let mut applied = 0usize;
    for e in effects {
        if let Err(err) = w.apply(at_ms, e) {
            return (
                applied,
                Some(RedisError::String(format!(
                    "ERR effect does not apply: {}",
                    err.to_string().trim_start_matches("ERR ")
                ))),
            );
        }
        applied = applied.saturating_add(1);
    }
    (applied, None)
}

/// Indexes the window at `key_name` for the sweeper after a change (its database and name
/// are asked for only when the index changes).
fn track_window(ctx: &Context, key_name: &RedisString, w: &Window, had_ids: bool) {
    sweep_index::track_window_at(
        || (sweep_index::selected_db(ctx), key_name.as_slice()),
        w,
        had_ids,
    );
}

/// A window for a key that holds none, if `first` may create one (a configuration or a count).
fn new_window(first: &WindowEffect, at_ms: i64) -> Option<Window> {
    let params = match first {
        WindowEffect::Configure(c) => c.params(0),
        WindowEffect::Count {
            window_ms,
            precision_ms,
            cost,
            ..
        } => WindowParams {
            limit: 0,
            window_ms: *window_ms,
            precision_ms: *precision_ms,
            cost: *cost,
        },
        _ => return None,
    };
    params.validate().ok()?;
    Some(Window::new(&params, at_ms))
}

/// Replicates `effects` for `key` at `at_ms` as one `QUOTA.WAPPLY key <packed>`.
pub fn replicate_effects(ctx: &Context, key: &RedisString, at_ms: i64, effects: &[WindowEffect]) {
    if effects.is_empty() {
        return;
    }
    replicate::replicate_key_with(ctx, crate::shell::window_cmds::WAPPLY_C, key, |packed| {
        packed.int(at_ms);
        for e in effects {
            write(e, packed);
        }
    });
}

/// Applies `effects` on the master and replicates the ones applied. Errors as
/// [`apply_at_key`].
pub fn apply_and_propagate(
    ctx: &Context,
    key: &mut ModuleKey,
    key_name: &RedisString,
    at_ms: i64,
    effects: &[WindowEffect],
) -> Result<(), RedisError> {
    let (applied, error) = apply_at_key(ctx, key, key_name, at_ms, effects);
    replicate_effects(ctx, key_name, at_ms, effects.get(..applied).unwrap_or(&[]));
    match error {
        Some(e) => Err(e),
        None => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::shell::effects::{unpack, Packed};

    #[test]
    fn window_effects_round_trip_through_the_packed_form() {
        let effects = vec![
            WindowEffect::Configure(WindowConfig::parse(5, 60_000, Some(1000)).unwrap()),
            WindowEffect::Count {
                window_ms: 60_000,
                precision_ms: 1000,
                cost: 3,
                id: None,
            },
            WindowEffect::Count {
                window_ms: 60_000,
                precision_ms: 1000,
                cost: 3,
                id: Some(Id::from_slice(b"a b:-")),
            },
            WindowEffect::Settle {
                id: Id::from_slice(b"-"),
                actual: 0,
            },
            WindowEffect::Rollback {
                id: Id::from_slice(b"1"),
            },
            WindowEffect::Forget,
        ];
        let mut packed = Packed::with_capacity(64);
        packed.int(7);
        for e in &effects {
            write(e, &mut packed);
        }
        let tokens = unpack(packed.as_bytes()).unwrap();
        assert_eq!(tokens[0], b"7");
        assert_eq!(decode(tokens[1..].iter().copied()).unwrap(), effects);
        assert!(decode([&b"SETTLE"[..], b"x"]).is_err());
        assert!(decode([&b"CONFIG"[..], b"1", b"0", b"1"]).is_err());
        assert!(decode([&b"NOPE"[..]]).is_err());
    }
}
