//! Multi-limit admission (issue 19): `QUOTA.MRESERVE`, `QUOTA.MSETTLE`, `QUOTA.MROLLBACK`,
//! `QUOTA.MEXTEND` over up to [`MAX_KEYS`] keys, each a budget or a configured window key.
//! See docs/commands.md for each reply; the decisions are [`crate::core::multi`]'s.
//!
//! Every command opens all its keys once, writable, and plans on all of them before changing
//! anything. An error or a denial on any key changes nothing anywhere: every key is declared
//! unchanged, so nothing is written, signalled, published or replicated. Otherwise each key's
//! effects are applied in key order and replicated together as one `QUOTA.MAPPLY` (each key's
//! line as its `QUOTA.APPLY` or `QUOTA.WAPPLY` would carry it, [`crate::shell::mapply`]):
//! replicas and the AOF apply them together, with the master's time and id.
//!
//! A key deleted between reserve and settle is an error (`NOQUOTA`; nothing changes: settle the
//! other keys with a shorter list); a budget replaced by a new one does not know the id
//! (`NORESERVATION`); a window key replaced by a new one does not remember it (`skipped`).

use redis_module::{raw, Context, RedisError, RedisResult, RedisString, RedisValue};
use smallvec::SmallVec;
use std::ffi::CStr;

use crate::core::id::ParsedId;
use crate::core::ledger::Budget;
use crate::core::multi::{
    self, Decision, KeyEffects, KeyError, KeyOutcome, KeyStatus, Limit, Planned,
};
use crate::core::window::Window;
use crate::shell::apply::{apply_counted_logged, count_releases, write_usage};
use crate::shell::args::{check_id, ttl_arg, Args, BAD_TTL, BAD_TTL_MS};
use crate::shell::budget_cmds::{check_id_arg, check_new_id, noquota};
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::key::ModuleKey;
use crate::shell::key_specs::After;
use crate::shell::mapply::Batch;
use crate::shell::reply::error_reply;
use crate::shell::usage;
use crate::shell::window_cmds::no_window_config;
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{clock, config, key_specs, stats, window_effects};

/// Most keys one multi-key command names (`numkeys`).
pub const MAX_KEYS: usize = 16;

/// What each command needs after its keys (for [`key_specs::answer_key_positions`] and the
/// arity check of [`parse_keys`]): as its parser reads them.
const MRESERVE: After = After::MRESERVE;
const MSETTLE: After = After::MSETTLE;
const MROLLBACK: After = After::MROLLBACK;
const MEXTEND: After = After::MEXTEND;

/// What a key holds.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Kind {
    Budget,
    /// A window key with a stored configuration.
    Window,
}

/// One key of the command, open for writing.
struct Opened<'a> {
    name: &'a RedisString,
    key: ModuleKey<'a>,
    kind: Kind,
}

/// The listed key names, in order.
type Keys<'a> = SmallVec<[&'a RedisString; MAX_KEYS]>;

/// The listed keys, open.
type OpenedKeys<'a> = SmallVec<[Opened<'a>; 8]>;

/// Each key's value after a command, in key order.
type Values = SmallVec<[i64; 8]>;

/// Parses `numkeys key [key ...]`: 1..=[`MAX_KEYS`] keys (checked first, as every M* command
/// is opened with [`Args::new`]`(args, 1)`), none listed twice, and at least the arguments
/// `after` them left (else the arity error, before any key is read: with `numkeys` above the
/// keys given, amounts would be read as keys).
fn parse_keys<'a>(a: &mut Args<'a>, after: After) -> Result<Keys<'a>, RedisError> {
    let n = a.next_i64()?;
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or(RedisError::Str("ERR numkeys must be between 1 and 16"))?;
    let needed = n
        .saturating_mul(after.per_key.saturating_add(1))
        .saturating_add(after.fixed);
    if a.remaining() < needed {
        return Err(a.wrong_arity());
    }
    let mut keys: Keys<'a> = SmallVec::with_capacity(n);
    // Each name's bytes read once (a call into Redis each), for the duplicate check.
    let mut seen: SmallVec<[&[u8]; MAX_KEYS]> = SmallVec::with_capacity(n);
    for _ in 0..n {
        let k = a.next_string()?;
        let bytes = k.as_slice();
        // Names under one hash tag share their start: the last byte first, then the rest.
        if seen
            .iter()
            .any(|s| s.len() == bytes.len() && s.last() == bytes.last() && *s == bytes)
        {
            return Err(RedisError::String(format!(
                "ERR key '{}' is listed twice",
                crate::core::error::printable_id(bytes)
            )));
        }
        seen.push(bytes);
        keys.push(k);
    }
    Ok(keys)
}

/// Parses an optional trailing `AT ms` (test clock). `values`: what the command takes one of
/// per key before it (`"actual"`), if anything.
fn parse_at_only(a: &mut Args, values: Option<(usize, &str)>) -> Result<Option<i64>, RedisError> {
    let mut at = None;
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"AT") {
            at = Some(a.next_i64()?);
        } else {
            return Err(match values {
                Some((n, what)) => not_an_option(a, t, n, what),
                None => a.unexpected(t),
            });
        }
    }
    Ok(at)
}

/// The error for `t`, read where an option was expected after the `n` per-key values named
/// `what` (`amount`, `actual`): a number there (or `ELAPSED` after actuals) is one too many,
/// else an unknown option.
#[cold]
fn not_an_option(a: &Args, t: &[u8], n: usize, what: &str) -> RedisError {
    let value = crate::shell::args::parse_canonical_i64(t).is_some()
        || (what == "actual" && t.eq_ignore_ascii_case(b"ELAPSED"));
    if value {
        let s = if n == 1 { "" } else { "s" };
        a.syntax_error(
            t,
            &format!("expected {n} {what}{s}, one per key (numkeys is {n}), got more"),
        )
    } else {
        a.unexpected(t)
    }
}

/// Opens every key writable into `opened` (the caller's, on its stack: the open keys are not
/// moved) and tells its kind. Errors (and declares every key unchanged) on an empty key
/// (`NOQUOTA`), a window key without a configuration (`NOQUOTA`), another type
/// (`WRONGTYPE`).
fn open_all<'a>(
    ctx: &Context,
    names: &[&'a RedisString],
    opened: &mut OpenedKeys<'a>,
) -> Result<(), RedisError> {
    for &name in names {
        let key = match ModuleKey::open_writable(ctx, name) {
            Ok(k) => k,
            Err(e) => return Err(abort(opened, e)),
        };
        let kind = if key.holds(&BUDGET_TYPE) {
            Ok(Kind::Budget)
        } else if key.holds(&WINDOW_TYPE) {
            // Read at once (its configuration): no prefetch.
            match key.value::<Window>(&WINDOW_TYPE) {
                Ok(Some(w)) if w.config().is_some() => Ok(Kind::Window),
                _ => Err(no_window_config()),
            }
        } else {
            // Empty, or another type.
            match key.value::<Budget>(&BUDGET_TYPE) {
                Ok(_) => Err(RedisError::Str(
                    "NOQUOTA no budget or window at a listed key (create it with QUOTA.SET)",
                )),
                Err(_) => Err(RedisError::WrongType),
            }
        };
        match kind {
            Ok(kind) => opened.push(Opened { name, key, kind }),
            Err(e) => {
                let mut key = key;
                key.unchanged();
                return Err(abort(opened, naming_key(e, name)));
            }
        }
    }
    // Once every key is open: what lies below each value, fetched together.
    let mut fetch = |address: *const u8, bytes: usize| crate::shell::key::prefetch(address, bytes);
    for o in opened.iter() {
        match o.kind {
            Kind::Budget => {
                if let Ok(Some(b)) = o.key.value::<Budget>(&BUDGET_TYPE) {
                    b.hot_addresses(&mut fetch);
                }
            }
            Kind::Window => {
                if let Ok(Some(w)) = o.key.value::<Window>(&WINDOW_TYPE) {
                    w.hot_addresses(&mut fetch);
                }
            }
        }
    }
    Ok(())
}

/// As [`check_new_id`] for a window key: a new id must fit `quota.max-id-length` (`max`,
/// bytes); one the key remembers (a retry) only the hard cap. Without it, a request listing
/// only window keys kept ids of any length up to the hard cap.
fn check_new_window_id(w: &Window, id: Option<&[u8]>, max: i64) -> Result<(), RedisError> {
    let Some(id) = id else {
        return Ok(());
    };
    match crate::shell::args::check_id(id, max) {
        Err(e) if w.remembered().get(id).is_none() => Err(e),
        _ => Ok(()),
    }
}

/// `e` with the listed key it is about appended (`... (key 'quota:{t}:rpm')`): with up to 16
/// keys a bare `WRONGTYPE`, `NOQUOTA`, `CONFLICT` or `NORESERVATION` would not say which one.
/// The code stays first.
#[cold]
fn naming_key(e: RedisError, name: &RedisString) -> RedisError {
    RedisError::String(format!(
        "{e} (key '{}')",
        crate::core::error::printable_id(name.as_slice())
    ))
}

/// A core error as the reply, naming the listed key it is about (as [`naming_key`]).
#[cold]
fn key_error(names: &[&RedisString], e: KeyError) -> RedisError {
    match e.index.and_then(|i| names.get(i)) {
        Some(name) => naming_key(error_reply(&e.error), name),
        None => error_reply(&e.error),
    }
}

/// Declares every key unchanged and returns `e`: nothing was written anywhere.
fn abort(opened: &mut [Opened], e: RedisError) -> RedisError {
    unchanged_all(opened);
    e
}

/// Declares every key unchanged (a denial, a retry: nothing is written).
fn unchanged_all(opened: &mut [Opened]) {
    for o in opened.iter_mut() {
        o.key.unchanged();
    }
}

/// The stored values of the keys, for planning.
fn limits<'k>(opened: &'k [Opened]) -> Result<SmallVec<[Limit<'k>; 8]>, RedisError> {
    let mut limits = SmallVec::with_capacity(opened.len());
    for o in opened {
        limits.push(match o.kind {
            Kind::Budget => {
                Limit::Budget(o.key.value::<Budget>(&BUDGET_TYPE)?.ok_or_else(noquota)?)
            }
            Kind::Window => Limit::Window(
                o.key
                    .value::<Window>(&WINDOW_TYPE)?
                    .ok_or_else(no_window_config)?,
            ),
        });
    }
    Ok(limits)
}

/// Each key's value now (a budget's available, a window's remaining).
fn values_now(opened: &[Opened], wall: i64) -> Result<Values, RedisError> {
    Ok(limits(opened)?
        .into_iter()
        .map(|l| multi::value(l, wall))
        .collect())
}

/// Plans with `plan` on the keys' stored values; on an error declares every key unchanged.
fn plan_on<T>(
    opened: &mut [Opened],
    plan: impl FnOnce(&[Limit]) -> Result<T, RedisError>,
) -> Result<T, RedisError> {
    let planned = limits(opened).and_then(|l| plan(&l));
    planned.map_err(|e| abort(opened, e))
}

/// Refuses the command when a budget that would log its usage has a stream key holding
/// another type: checked with the plan, before any key changes (a ledger change must not go
/// unlogged, nor one key change without the others).
fn check_streams<'e>(
    ctx: &Context,
    names: &[&RedisString],
    limits: &[Limit],
    planned: impl Iterator<Item = &'e KeyEffects>,
) -> Result<(), RedisError> {
    for ((l, p), name) in limits.iter().zip(planned).zip(names) {
        if let (Limit::Budget(b), KeyEffects::Budget { effects, .. }) = (l, p) {
            if usage::may_log(b, effects) {
                usage::check_stream(ctx, b, effects).map_err(|e| naming_key(e, name))?;
            }
        }
    }
    Ok(())
}

/// Applies every key's planned effects (keys with none are declared unchanged), replicates
/// what was applied as one `QUOTA.MAPPLY` ([`crate::shell::mapply`]), and returns the value
/// of each key afterwards (a window key's from `known`, when its plan worked it out). The
/// plans were made on these very values (and their usage streams checked,
/// [`check_streams`]), so an effect that does not apply is a bug; it is reported as the error,
/// what was applied before it stays (and is replicated), as for `QUOTA.APPLY`.
fn apply_all<'a>(
    ctx: &Context,
    opened: &mut [Opened<'a>],
    planned: &[KeyEffects],
    known: Option<&[Option<i64>]>,
    wall: i64,
) -> Result<Values, RedisError> {
    let mut failed = None;
    let mut values = Values::with_capacity(opened.len());
    let mut batch = Batch::with_keys(opened.len());
    // Every budget is granted the same id: parsed once.
    let mut ids = ParsedId::default();
    for (i, (o, p)) in opened.iter_mut().zip(planned).enumerate() {
        if failed.is_some() {
            o.key.unchanged();
            continue;
        }
        let name: &'a RedisString = o.name;
        let (error, value) = match p {
            _ if p.is_empty() => {
                o.key.unchanged();
                (None, value_of(o, wall))
            }
            KeyEffects::Budget { now, effects } => match o.key.value_mut::<Budget>(&BUDGET_TYPE) {
                Ok(Some(b)) => {
                    let mut log = Vec::new();
                    let logging = usage::may_log(b, effects).then_some(&mut log);
                    let (result, view) =
                        apply_counted_logged(ctx, name, b, *now, effects, logging, &mut ids);
                    let applied = effects.get(..result.applied).unwrap_or(&[]);
                    count_releases(applied);
                    // The entries are added before the batch is replicated: their ids go in it.
                    let marks = write_usage(ctx, name, b, *now, &log, None);
                    batch.budget(name, *now, applied, &marks);
                    // The budget's time is `now` after the apply (`Budget::now(wall)`).
                    let available = match view {
                        Some(v) => v.available,
                        None => b.view(b.now(wall)).available,
                    };
                    (result.error, available)
                }
                Ok(None) => (Some(noquota()), -1),
                Err(e) => (Some(e), -1),
            },
            KeyEffects::Window(effects) => {
                let (applied, error) =
                    window_effects::apply_at_key(ctx, &mut o.key, name, wall, effects);
                batch.window(name, wall, effects.get(..applied).unwrap_or(&[]));
                let known = known.and_then(|k| k.get(i).copied().flatten());
                (error, known.unwrap_or_else(|| value_of(o, wall)))
            }
        };
        values.push(value);
        if error.is_some() {
            failed = error;
        }
    }
    batch.replicate(ctx);
    match failed {
        Some(e) => Err(e),
        None => Ok(values),
    }
}

/// One key's value now (a budget's available, a window's remaining; -1 if it is gone).
fn value_of(o: &Opened, wall: i64) -> i64 {
    let limit = match o.kind {
        Kind::Budget => o
            .key
            .value::<Budget>(&BUDGET_TYPE)
            .ok()
            .flatten()
            .map(Limit::Budget),
        Kind::Window => o
            .key
            .value::<Window>(&WINDOW_TYPE)
            .ok()
            .flatten()
            .map(Limit::Window),
    };
    limit.map_or(-1, |l| multi::value(l, wall))
}

/// `QUOTA.MRESERVE numkeys key [key ...] amount [amount ...] [ID id] [TTL ms] [KEEP n] [AT ms]`
/// → `[granted, id|nil, denied_index, retry_after_ms, [value per key]]`.
pub fn quota_mreserve(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if key_specs::answer_key_positions(ctx, args, MAX_KEYS, MRESERVE) {
        return Ok(RedisValue::NoReply);
    }
    let mut a = Args::new(args, 1)?;
    let names = parse_keys(&mut a, MRESERVE)?;
    let mut amounts: SmallVec<[i64; MAX_KEYS]> = SmallVec::with_capacity(names.len());
    for _ in &names {
        let n = a.next_i64_as("amount")?;
        if n < 0 {
            return Err(RedisError::Str("ERR amount must not be negative"));
        }
        amounts.push(n);
    }
    let (mut id, mut ttl, mut at, mut keep) = (None, None, None, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"ID") {
            let v = a.next_bytes()?;
            check_id_arg(v)?;
            id = Some(v);
        } else if t.eq_ignore_ascii_case(b"TTL") {
            ttl = Some(a.next_ttl(BAD_TTL)?);
        } else if t.eq_ignore_ascii_case(b"KEEP") {
            // One KEEP for every budget key; window keys ignore it.
            keep = Some(a.next_amount("KEEP")?);
        } else if t.eq_ignore_ascii_case(b"AT") {
            at = Some(a.next_i64()?);
        } else {
            return Err(not_an_option(&a, t, names.len(), "amount"));
        }
    }
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let max_id = config::max_id_length();
    let mut opened = OpenedKeys::new();
    open_all(ctx, &names, &mut opened)?;
    // The plan's effects stay here, on the stack, until applied.
    let mut planned = Planned::default();
    let decision = plan_on(&mut opened, |limits| {
        for l in limits {
            match l {
                Limit::Budget(b) => check_new_id(b, id, max_id)?,
                Limit::Window(w) => check_new_window_id(w, id, max_id)?,
            }
        }
        let decision =
            multi::plan_mreserve_into(limits, &amounts, id, ttl, keep, wall, &policy, &mut planned)
                .map_err(|e| key_error(&names, e))?;
        if let Decision::Granted { .. } = decision {
            check_streams(ctx, &names, limits, planned.effects.iter())?;
        }
        Ok(decision)
    })?;
    match decision {
        Decision::Retried { id } => {
            unchanged_all(&mut opened);
            stats::bump(&stats::MRESERVE_GRANTED);
            Ok(reserve_reply(
                ctx,
                Some(&id),
                -1,
                0,
                &values_now(&opened, wall)?,
            ))
        }
        Decision::Denied {
            index,
            retry_after_ms,
        } => {
            unchanged_all(&mut opened);
            stats::bump(&stats::MRESERVE_DENIED);
            let index = i64::try_from(index).unwrap_or(-1);
            Ok(reserve_reply(
                ctx,
                None,
                index,
                retry_after_ms,
                &values_now(&opened, wall)?,
            ))
        }
        Decision::Granted { id } => {
            let values = apply_all(
                ctx,
                &mut opened,
                &planned.effects,
                Some(&planned.remaining),
                wall,
            )?;
            stats::bump(&stats::MRESERVE_GRANTED);
            Ok(reserve_reply(ctx, Some(&id), -1, 0, &values))
        }
    }
}

/// Replies `[granted, id|nil, denied_index, retry_after_ms, [value per key]]`, written
/// straight to the client (no `RedisValue` tree).
fn reserve_reply(
    ctx: &Context,
    id: Option<&[u8]>,
    denied: i64,
    retry: i64,
    values: &[i64],
) -> RedisValue {
    raw::reply_with_array(ctx.ctx, 5);
    raw::reply_with_long_long(ctx.ctx, i64::from(id.is_some()));
    match id {
        Some(id) => raw::reply_with_string_buffer(ctx.ctx, id.as_ptr().cast(), id.len()),
        None => raw::reply_with_null(ctx.ctx),
    };
    raw::reply_with_long_long(ctx.ctx, denied);
    raw::reply_with_long_long(ctx.ctx, retry);
    raw::reply_with_array(ctx.ctx, len_of(values.len()));
    for &v in values {
        raw::reply_with_long_long(ctx.ctx, v);
    }
    RedisValue::NoReply
}

/// An array length for the reply functions.
fn len_of(n: usize) -> std::os::raw::c_long {
    std::os::raw::c_long::try_from(n).unwrap_or(0)
}

/// Applies the outcomes' effects and replies one `[status, amount, value]` per key.
fn apply_outcomes(
    ctx: &Context,
    opened: &mut [Opened],
    outcomes: Vec<KeyOutcome>,
    wall: i64,
) -> RedisResult {
    // Moved apart, not cloned: the effects to apply, the status and amount to reply.
    let mut rows: SmallVec<[(KeyStatus, i64); 8]> = SmallVec::with_capacity(outcomes.len());
    let mut effects: SmallVec<[KeyEffects; 8]> = SmallVec::with_capacity(outcomes.len());
    for (status, n, e) in outcomes {
        rows.push((status, n));
        effects.push(e);
    }
    let values = apply_all(ctx, opened, &effects, None, wall)?;
    for (status, _) in &rows {
        match status {
            KeyStatus::Settled | KeyStatus::Corrected => stats::bump(&stats::MSETTLED),
            KeyStatus::Late => stats::bump(&stats::MSETTLED_LATE),
            KeyStatus::RolledBack => stats::bump(&stats::MROLLED_BACK),
            _ => {}
        }
    }
    raw::reply_with_array(ctx.ctx, len_of(rows.len()));
    for ((status, n), v) in rows.iter().zip(values) {
        raw::reply_with_array(ctx.ctx, 3);
        raw::reply_with_simple_string(ctx.ctx, status_word(*status).as_ptr());
        raw::reply_with_long_long(ctx.ctx, *n);
        raw::reply_with_long_long(ctx.ctx, v);
    }
    Ok(RedisValue::NoReply)
}

/// [`KeyStatus::name`] as the simple string of a reply.
fn status_word(s: KeyStatus) -> &'static CStr {
    match s {
        KeyStatus::Settled => c"settled",
        KeyStatus::Late => c"late",
        KeyStatus::Corrected => c"corrected",
        KeyStatus::RolledBack => c"rolledback",
        KeyStatus::Duplicate => c"duplicate",
        KeyStatus::Expired => c"expired",
        KeyStatus::Skipped => c"skipped",
    }
}

/// `QUOTA.MSETTLE numkeys key [key ...] id actual|ELAPSED [actual|ELAPSED ...] [AT ms]`
/// → one `[status, charged, value]` per key (ELAPSED: budget keys with a UNIT only).
pub fn quota_msettle(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if key_specs::answer_key_positions(ctx, args, MAX_KEYS, MSETTLE) {
        return Ok(RedisValue::NoReply);
    }
    let mut a = Args::new(args, 1)?;
    let names = parse_keys(&mut a, MSETTLE)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let mut actuals = Vec::with_capacity(names.len());
    for _ in &names {
        let t = a.next_bytes()?;
        actuals.push(if t.eq_ignore_ascii_case(b"ELAPSED") {
            multi::Actual::Elapsed
        } else {
            let Some(n) = crate::shell::args::parse_canonical_i64(t) else {
                return Err(a.not_an_integer_as(Some("actual")));
            };
            if n < 0 {
                return Err(RedisError::Str("ERR actual must not be negative"));
            }
            multi::Actual::Units(n)
        });
    }
    let at = parse_at_only(&mut a, Some((names.len(), "actual")))?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = OpenedKeys::new();
    open_all(ctx, &names, &mut opened)?;
    let outcomes = plan_on(&mut opened, |limits| {
        let outcomes = multi::plan_msettle_actuals(limits, id, &actuals, wall, &policy)
            .map_err(|e| key_error(&names, e))?;
        check_streams(ctx, &names, limits, outcomes.iter().map(|(_, _, e)| e))?;
        Ok(outcomes)
    })?;
    apply_outcomes(ctx, &mut opened, outcomes, wall)
}

/// `QUOTA.MROLLBACK numkeys key [key ...] id [AT ms]` → one `[status, released, value]` per key.
pub fn quota_mrollback(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if key_specs::answer_key_positions(ctx, args, MAX_KEYS, MROLLBACK) {
        return Ok(RedisValue::NoReply);
    }
    let mut a = Args::new(args, 1)?;
    let names = parse_keys(&mut a, MROLLBACK)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let at = parse_at_only(&mut a, None)?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = OpenedKeys::new();
    open_all(ctx, &names, &mut opened)?;
    let outcomes = plan_on(&mut opened, |limits| {
        let outcomes =
            multi::plan_mrollback(limits, id, wall, &policy).map_err(|e| key_error(&names, e))?;
        check_streams(ctx, &names, limits, outcomes.iter().map(|(_, _, e)| e))?;
        Ok(outcomes)
    })?;
    apply_outcomes(ctx, &mut opened, outcomes, wall)
}

/// `QUOTA.MEXTEND numkeys key [key ...] id ttl_ms [AT ms]` → one reply per key: a budget's
/// `ttl_ms` (as QUOTA.EXTEND's), nil for a window key (nothing to extend).
pub fn quota_mextend(ctx: &Context, args: &[RedisString]) -> RedisResult {
    if key_specs::answer_key_positions(ctx, args, MAX_KEYS, MEXTEND) {
        return Ok(RedisValue::NoReply);
    }
    let mut a = Args::new(args, 1)?;
    let names = parse_keys(&mut a, MEXTEND)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let ttl = ttl_arg(a.next_i64_as("ttl_ms")?, BAD_TTL_MS)?;
    let at = parse_at_only(&mut a, None)?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = OpenedKeys::new();
    open_all(ctx, &names, &mut opened)?;
    let effects = plan_on(&mut opened, |limits| {
        let effects = multi::plan_mextend(limits, id, ttl, wall, &policy)
            .map_err(|e| key_error(&names, e))?;
        check_streams(ctx, &names, limits, effects.iter())?;
        Ok(effects)
    })?;
    apply_all(ctx, &mut opened, &effects, None, wall)?;
    stats::bump(&stats::MEXTENDED);
    Ok(RedisValue::Array(
        opened
            .iter()
            .map(|o| match o.kind {
                Kind::Budget => RedisValue::Integer(ttl),
                Kind::Window => RedisValue::Null,
            })
            .collect(),
    ))
}
