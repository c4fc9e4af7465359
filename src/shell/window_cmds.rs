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

use crate::core::window::{Window, WindowDecision, WindowError, WindowParams, MAX_WINDOW_MS};
use crate::shell::args::Args;
use crate::shell::key::ModuleKey;
use crate::shell::reply::{error_reply, reply_array, Item};
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{clock, events, replicate, stats};

/// Name of the internal command carrying a recorded call to replicas and the AOF.
pub const WAPPLY: &str = "QUOTA.WAPPLY";
const WAPPLY_C: &std::ffi::CStr = c"QUOTA.WAPPLY";

/// `expire_at_ms` of a `QUOTA.WAPPLY` whose key holds nothing afterwards (deleted).
pub const NO_EXPIRY: i64 = -1;

/// Keyspace event (class `d`) of every recorded call, on the master and on replicas alike.
pub const EVENT: &std::ffi::CStr = c"quota.window";

/// The error of a `window_ms` above [`MAX_WINDOW_MS`] (spelled out: a `&'static str`).
const WINDOW_TOO_LONG: &str = "ERR window_ms must be at most 1000000000000000";

/// A parsed `QUOTA.WINDOW` call.
struct Request<'a> {
    key: &'a RedisString,
    params: WindowParams,
    peek: bool,
    at: Option<i64>,
}

fn parse(args: &[RedisString]) -> Result<Request<'_>, RedisError> {
    let mut a = Args::new(args, 3)?;
    let key = a.next_string()?;
    let limit = a.next_i64()?;
    let window_ms = a.next_i64()?;
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
        } else if t.eq_ignore_ascii_case(b"PRECISION") {
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
    // Before the combined checks (bucket count), so that this error names the cause.
    if window_ms > MAX_WINDOW_MS {
        return Err(RedisError::Str(WINDOW_TOO_LONG));
    }
    let params = WindowParams::parse(limit, window_ms, cost, precision).map_err(error_reply)?;
    Ok(Request {
        key,
        params,
        peek,
        at,
    })
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
    let checked = match key.value::<Window>(&WINDOW_TYPE) {
        Ok(Some(w)) => w.check(&req.params, now).map(|c| (c, true)),
        Ok(None) => Window::new(&req.params, now)
            .check(&req.params, now)
            .map(|c| (c, false)),
        Err(e) => {
            key.unchanged();
            return Err(e);
        }
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
    if req.peek || !checked.allowed || (!exists && req.params.cost == 0) {
        key.unchanged();
        return reply(ctx, &checked);
    }
    let (decision, expire_at) =
        record_at_key(&mut key, &req.params, now, Record::Admitted(&checked))?;
    drop(key);
    events::publish(ctx, req.key, EVENT);
    replicate::replicate_key_ints(
        ctx,
        WAPPLY_C,
        req.key,
        &[
            now,
            req.params.window_ms,
            req.params.precision_ms,
            req.params.cost,
            expire_at.unwrap_or(NO_EXPIRY),
        ],
    );
    reply(ctx, &decision)
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
