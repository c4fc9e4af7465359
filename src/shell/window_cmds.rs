//! `QUOTA.WINDOW key limit window_ms [COST n] [PRECISION ms] [PEEK] [AT ms]`: a sliding-window
//! rate limit on an `rq-window` key → `[allowed, remaining, retry_after_ms, reset_after_ms]`.
//! Semantics are the core's ([`crate::core::window`]); docs/commands.md (QUOTA.WINDOW) is the user reference.
//!
//! A counting call opens the key once and decides ([`Window::check`]); only an admitted call
//! changes it (and signals it modified): applies [`Window::record`], moves the key's absolute expiry to
//! [`Window::empty_at_ms`] and replicates the effect as
//! `QUOTA.WAPPLY key <at_ms window_ms precision_ms cost expire_at_ms>` (see
//! [`crate::shell::window_apply`]). PEEK and denied calls write nothing and replicate nothing.

use redis_module::{Context, RedisError, RedisResult, RedisString};

use redis_module::RedisValue;

use crate::core::window::{
    Window, WindowConfig, WindowDecision, WindowEffect, WindowError, WindowParams, MAX_WINDOW_MS,
};
use crate::shell::args::Args;
use crate::shell::key::ModuleKey;
use crate::shell::reply::{error_reply, reply_array, reply_fields, Field, Item};
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{clock, events, replicate, stats, window_effects};

/// Name of the internal command carrying a recorded call to replicas and the AOF.
pub const WAPPLY: &str = "QUOTA.WAPPLY";
pub(crate) const WAPPLY_C: &std::ffi::CStr = c"QUOTA.WAPPLY";

/// `expire_at_ms` of a `QUOTA.WAPPLY` whose key holds nothing afterwards (deleted).
pub const NO_EXPIRY: i64 = -1;

/// Keyspace event (class `d`) of every recorded call, on the master and on replicas alike.
pub const EVENT: &std::ffi::CStr = c"quota.window";

/// The error of a `window_ms` above [`MAX_WINDOW_MS`] (spelled out: a `&'static str`).
const WINDOW_TOO_LONG: &str = "ERR window_ms must be at most 1000000000000000";

/// A parsed `QUOTA.WINDOW` call.
struct Request<'a> {
    key: &'a RedisString,
    /// `None`: the config form (`QUOTA.WINDOW key [COST n] [PEEK]`), whose limit, window and
    /// precision are the key's stored configuration.
    params: Option<WindowParams>,
    cost: i64,
    peek: bool,
    at: Option<i64>,
}

fn parse(args: &[RedisString]) -> Result<Request<'_>, RedisError> {
    let mut a = Args::new(args, 1)?;
    let key = a.next_string()?;
    // The config form when the limit is absent: no argument, or one of its options where
    // the limit would be (anything else is read as a limit, so "ten" is still "not an
    // integer").
    let explicit = args.get(2).is_some_and(|t| {
        let t = t.as_slice();
        !(t.eq_ignore_ascii_case(b"COST")
            || t.eq_ignore_ascii_case(b"PEEK")
            || t.eq_ignore_ascii_case(b"AT"))
    });
    let (limit, window_ms) = if explicit {
        let third = args.get(2).map_or(&b""[..], |t| t.as_slice());
        if third.eq_ignore_ascii_case(b"PRECISION") {
            return Err(a.syntax_error(
                third,
                "PRECISION goes with limit and window_ms (without them the key's stored \
                 configuration is used, precision included)",
            ));
        }
        if args.len() < 4 {
            // A word alone where the limit would be is an unknown option, not a short call.
            return Err(match crate::shell::args::parse_canonical_i64(third) {
                Some(_) => a.wrong_arity(),
                None => a.unexpected(third),
            });
        }
        (a.next_i64()?, a.next_i64()?)
    } else {
        (0, 0)
    };
    let (mut cost, mut precision, mut peek, mut at) = (None, None, false, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        // Each occurrence's sign is checked (as the budget commands do), the kept value's
        // range by `WindowParams::parse`.
        if t.eq_ignore_ascii_case(b"COST") {
            let n = a.next_i64()?;
            if n < 0 {
                return Err(error_reply(WindowError::NegativeCost));
            }
            cost = Some(n);
        } else if t.eq_ignore_ascii_case(b"PRECISION") && explicit {
            let n = a.next_i64()?;
            if n <= 0 {
                return Err(error_reply(WindowError::PrecisionNotPositive));
            }
            precision = Some(n);
        } else if t.eq_ignore_ascii_case(b"PEEK") {
            peek = true;
        } else if t.eq_ignore_ascii_case(b"AT") {
            at = Some(a.next_i64()?);
        } else {
            return Err(a.unexpected(t));
        }
    }
    let params = if explicit {
        // Before the combined checks (bucket count), so that this error names the cause.
        if window_ms > MAX_WINDOW_MS {
            return Err(RedisError::Str(WINDOW_TOO_LONG));
        }
        Some(WindowParams::parse(limit, window_ms, cost, precision).map_err(error_reply)?)
    } else {
        None
    };
    Ok(Request {
        key,
        params,
        cost: cost.unwrap_or(1),
        peek,
        at,
    })
}

/// The error of the config form, or a multi-key command, on a key without a stored
/// configuration.
pub fn no_window_config() -> RedisError {
    RedisError::Str(
        "NOQUOTA no window configuration at this key (create it with QUOTA.SET key WINDOW limit window_ms)",
    )
}

fn reply(ctx: &Context, d: &WindowDecision) -> RedisResult {
    reply_array(
        ctx,
        &[
            Item::Int(i64::from(d.allowed)),
            Item::Int(d.remaining),
            Item::Int(d.retry_after_ms),
            Item::Int(d.reset_after_ms),
        ],
    )
}

/// `QUOTA.WINDOW key limit window_ms [COST n] [PRECISION ms] [PEEK] [AT ms]`
/// → `[allowed (1|0), remaining, retry_after_ms, reset_after_ms]`.
pub fn quota_window(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let req = parse(args)?;
    let now = clock::command_ms(req.at)?;
    // One writable open: a call that records nothing (PEEK, a denial, an error) declares the
    // key unchanged, so WATCH and client tracking see nothing.
    let mut key = ModuleKey::open_writable(ctx, req.key)?;
    let stored = match key.value::<Window>(&WINDOW_TYPE) {
        Ok(w) => w,
        Err(e) => {
            key.unchanged();
            return Err(e);
        }
    };
    let configured = stored.is_some_and(|w| w.config().is_some());
    let params = match (req.params, stored.and_then(Window::config)) {
        (Some(p), _) => p,
        (None, Some(c)) => c.params(req.cost),
        (None, None) => {
            key.unchanged();
            return Err(no_window_config());
        }
    };
    let checked = match stored {
        Some(w) => w.check(&params, now).map(|c| (c, true)),
        None => Window::new(&params, now)
            .check(&params, now)
            .map(|c| (c, false)),
    };
    let (checked, exists) = match checked {
        Ok(c) => c,
        Err(e) => {
            key.unchanged();
            return Err(error_reply(e));
        }
    };
    if !req.peek {
        stats::bump(if checked.allowed {
            &stats::WINDOW_ALLOWED
        } else {
            &stats::WINDOW_DENIED
        });
    }
    // Nothing to write: a PEEK, a denial, or a cost-0 call on a missing key (which would
    // create an empty window; its decision is the same as the check's).
    if req.peek || !checked.allowed || (!exists && params.cost == 0) {
        key.unchanged();
        return reply(ctx, &checked);
    }
    if configured {
        // What the record would refuse (the key holding, for a longer horizon, more than its
        // window counts: `ERR overflow`) is refused here as on an unconfigured key, before
        // the effect is applied (whose refusal would read as a replica's).
        if let Some(Err(e)) = stored.map(|w| w.record_fits(&params, now)) {
            key.unchanged();
            return Err(error_reply(e));
        }
        // A configured key: no expiry, and the effect form of QUOTA.WAPPLY.
        let effect = WindowEffect::Count {
            window_ms: params.window_ms,
            precision_ms: params.precision_ms,
            cost: params.cost,
            id: None,
        };
        window_effects::apply_and_propagate(ctx, &mut key, req.key, now, &[effect])?;
        let after = key
            .value::<Window>(&WINDOW_TYPE)?
            .map(|w| w.check(&WindowParams { cost: 0, ..params }, now));
        drop(key);
        let after = after.ok_or_else(no_window_config)?.map_err(error_reply)?;
        return reply(
            ctx,
            &WindowDecision {
                allowed: true,
                retry_after_ms: 0,
                ..after
            },
        );
    }
    let (decision, expire_at) = record_at_key(&mut key, &params, now, Record::Admitted(&checked))?;
    drop(key);
    events::publish(ctx, req.key, EVENT);
    replicate::replicate_key_ints(
        ctx,
        WAPPLY_C,
        req.key,
        &[
            now,
            params.window_ms,
            params.precision_ms,
            params.cost,
            expire_at.unwrap_or(NO_EXPIRY),
        ],
    );
    reply(ctx, &decision)
}

/// `QUOTA.SET key WINDOW limit window_ms [PRECISION ms] [NX|XX] [AT ms]` (the arguments after
/// `WINDOW` in `args`) → 1 if created, 0 otherwise. Stores the configuration in a window key
/// (created empty if missing); the counts are kept and follow the new precision and window as
/// a call with them would. A configured key never expires. `WRONGTYPE` on a budget; `WINDOW`
/// given twice is an error.
pub fn quota_set_window(ctx: &Context, key_name: &RedisString, args: &mut Args) -> RedisResult {
    // Both values, or the option's form (not the command's arity).
    match args.remaining() {
        0 => return Err(args.needs_value(b"WINDOW")),
        1 => return Err(args.needs(b"WINDOW", "window_ms after the limit")),
        _ => {}
    }
    let limit = args.next_i64_as("limit")?;
    let window_ms = args.next_i64_as("window_ms")?;
    let (mut precision, mut nx, mut xx, mut at) = (None, false, false, None);
    while !args.is_empty() {
        let t = args.next_bytes()?;
        if t.eq_ignore_ascii_case(b"PRECISION") {
            let n = args.next_i64()?;
            if n <= 0 {
                return Err(error_reply(WindowError::PrecisionNotPositive));
            }
            precision = Some(n);
        } else if t.eq_ignore_ascii_case(b"NX") {
            nx = true;
        } else if t.eq_ignore_ascii_case(b"XX") {
            xx = true;
        } else if t.eq_ignore_ascii_case(b"AT") {
            at = Some(args.next_i64()?);
        } else if t.eq_ignore_ascii_case(b"WINDOW") {
            // An error, not last-wins: a second configuration in one call is a client bug.
            return Err(args.syntax_error(t, "WINDOW is given twice (one configuration per call)"));
        } else if crate::shell::budget_cmds::is_budget_option(t) {
            return Err(crate::shell::budget_cmds::window_with_budget_option(
                args, t, t,
            ));
        } else {
            return Err(args.unexpected(t));
        }
    }
    if nx && xx {
        return Err(RedisError::Str(
            "ERR NX and XX options at the same time are not compatible",
        ));
    }
    if window_ms > MAX_WINDOW_MS {
        return Err(RedisError::Str(WINDOW_TOO_LONG));
    }
    let config = WindowConfig::parse(limit, window_ms, precision).map_err(error_reply)?;
    let now = clock::command_ms(at)?;
    let mut key = ModuleKey::open_writable(ctx, key_name)?;
    let (exists, same) = match key.value::<Window>(&WINDOW_TYPE) {
        Ok(Some(w)) => (true, w.config() == Some(&config)),
        Ok(None) => (false, false),
        Err(e) => {
            key.unchanged();
            return Err(e);
        }
    };
    // NX on a window key, XX on an empty one, or the configuration it already has: nothing.
    if (exists && (nx || same)) || (!exists && xx) {
        key.unchanged();
        return Ok(RedisValue::Integer(0));
    }
    window_effects::apply_and_propagate(
        ctx,
        &mut key,
        key_name,
        now,
        &[WindowEffect::Configure(config)],
    )?;
    Ok(RedisValue::Integer(i64::from(!exists)))
}

/// `QUOTA.INFO` of a window key: limit (-1 without a stored configuration), window_ms,
/// precision_ms, counted, remaining (-1 without a configuration), reset_after_ms, and
/// `remembered_ids` (ids of multi-key reservations still in the window).
pub fn window_info(ctx: &Context, w: &Window, now: i64) -> RedisResult {
    let (limit, window_ms, precision_ms) = match w.config() {
        Some(c) => (c.limit, c.window_ms, c.precision_ms),
        None => (-1, w.window_ms(), w.precision()),
    };
    let params = WindowParams {
        limit: limit.max(0),
        window_ms,
        precision_ms,
        cost: 0,
    };
    let d = w.check(&params, now).map_err(error_reply)?;
    let counted = w.counted(&params, now).map_err(error_reply)?;
    let remaining = if limit < 0 { -1 } else { d.remaining };
    let ids = i64::try_from(w.remembered().len()).unwrap_or(i64::MAX);
    reply_fields(
        ctx,
        &[
            ("limit", Field::Int(limit)),
            ("window_ms", Field::Int(window_ms)),
            ("precision_ms", Field::Int(precision_ms)),
            ("counted", Field::Int(counted)),
            ("remaining", Field::Int(remaining)),
            ("reset_after_ms", Field::Int(d.reset_after_ms)),
            ("remembered_ids", Field::Int(ids)),
        ],
    )
}

/// The effect of a recorded call on a writable key, shared by the master (`QUOTA.WINDOW`) and
/// replicas / AOF replay (`QUOTA.WAPPLY`): [`Window::record`] unconditionally (creating the
/// window if the key is empty), then set the key's absolute expiry, or delete the key if it
/// holds nothing.
///
/// `how`: on the master, [`Record::Admitted`] with the call's check (the expiry is computed:
/// [`Window::empty_at_ms`]); on a replica, [`Record::Replicated`] with the master's resolved
/// expiry (`None`: delete), which wins so both end the same.
/// Returns the decision after recording and the expiry set (`None`: the key was deleted or not
/// created). On error nothing was changed.
pub(crate) fn record_at_key(
    key: &mut ModuleKey,
    params: &WindowParams,
    at_ms: i64,
    how: Record<'_>,
) -> Result<(WindowDecision, Option<i64>), RedisError> {
    let recorded = record(key, params, at_ms, how);
    if recorded.is_err() {
        key.unchanged();
    }
    recorded
}

/// How a call is recorded: on the master after its check admitted it, or on a replica (AOF
/// replay) with the expiry the master set.
pub(crate) enum Record<'a> {
    /// The master's check of this call, with the same params and time.
    Admitted(&'a WindowDecision),
    /// A replicated record: the key's expiry as the master set it (`None`: deleted).
    Replicated(Option<i64>),
}

fn record(
    key: &mut ModuleKey,
    params: &WindowParams,
    at_ms: i64,
    how: Record<'_>,
) -> Result<(WindowDecision, Option<i64>), RedisError> {
    let apply = |w: &mut Window| match how {
        Record::Admitted(checked) => w.record_admitted(params, at_ms, checked),
        Record::Replicated(_) => w.record(params, at_ms),
    };
    // `before`: when the key was due to expire. Every counting call sets the key's expiry to
    // its value's `empty_at_ms`, so an unchanged time (a call in the same newest bucket, the
    // usual case under traffic) is already set: one expires-dict write saved per call.
    let (decision, computed, created, before) = match key.value_mut::<Window>(&WINDOW_TYPE)? {
        Some(w) => {
            let before = w.empty_at_ms();
            let d = apply(w).map_err(error_reply)?;
            (d, w.empty_at_ms(), None, before)
        }
        None => {
            let mut w = Window::new(params, at_ms);
            let d = apply(&mut w).map_err(error_reply)?;
            (d, w.empty_at_ms(), Some(w), None)
        }
    };
    let expire = match how {
        Record::Replicated(expire_at) => expire_at,
        Record::Admitted(_) => computed,
    };
    let done = match (expire, created) {
        (Some(ms), Some(w)) => {
            // Refused (nothing stored) → an error, and nothing changed.
            key.set_value(&WINDOW_TYPE, w)?;
            stats::bump(&stats::WINDOW_KEYS);
            key.set_abs_expire(ms)
        }
        (Some(ms), None) if before == Some(ms) => Ok(()),
        (Some(ms), None) => key.set_abs_expire(ms),
        (None, Some(_)) => {
            // A window created and empty at once is not stored: the key stays as it was.
            key.unchanged();
            Ok(())
        }
        (None, None) => key.delete(),
    };
    // The window has changed: the caller must still reply and replicate. These calls cannot
    // fail on a key open for writing that holds a value; log if Redis ever disagrees.
    if let Err(e) = done {
        redis_module::logging::log_warning(crate::shell::log_safe(&format!(
            "quota: window key expiry not updated: {e}"
        )));
    }
    Ok((decision, expire))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn window_cap_message_matches_the_constant() {
        assert!(WINDOW_TOO_LONG.ends_with(&format!(" {MAX_WINDOW_MS}")));
    }

    #[test]
    fn c_names_match() {
        assert_eq!(WAPPLY_C.to_str().unwrap(), WAPPLY);
    }
}
