//! QUOTA.SET / INFO / RESERVE / SETTLE / ROLLBACK / EXTEND / CHARGE / PENDING: parse, plan on
//! the pure ledger, apply, replicate the effects, reply. See docs/commands.md for each reply.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::id::ParsedId;
use crate::core::ledger::{
    Budget, OnExpire, Plan, ReserveReply, RollbackStatus, Settings, SettleStatus, UsageLog, View,
    DEFAULT_STREAM_MAX_LEN, UNITS_MS,
};
use crate::core::period::{Period, PeriodKind};
use crate::core::window::Window;
use crate::shell::apply::{apply_and_propagate, Counts};
use crate::shell::args::{check_id, ttl_arg, Args, BAD_TTL, BAD_TTL_MS};
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::config::MAX_ID_LENGTH_RANGE;
use crate::shell::key::ModuleKey;
use crate::shell::reply::{error_reply, reply_array, reply_fields, Field, Item};
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{clock, config, events, replicate, stats, usage};

/// Most entries QUOTA.PENDING returns in one call.
pub const MAX_PENDING_COUNT: i64 = 10_000;

pub(crate) fn noquota() -> RedisError {
    RedisError::Str("NOQUOTA no budget at this key (create it with QUOTA.SET)")
}

/// Runs a write command on an existing budget: one writable open; the plan is made on the
/// budget as it is, and only a plan with effects changes (and signals) the key — a denial or
/// an error writes nothing, so `WATCH` and client tracking see no change. Then applies the
/// effects and replicates them. Returns the plan's reply and the view after it.
fn run_write<R>(
    ctx: &Context,
    key_name: &RedisString,
    at: Option<i64>,
    plan: impl FnOnce(&Budget, i64) -> Result<Plan<R>, RedisError>,
) -> Result<(R, View), RedisError> {
    let wall = clock::command_ms(at)?;
    let mut key = ModuleKey::open_writable(ctx, key_name)?;
    let planned = match key.value::<Budget>(&BUDGET_TYPE) {
        Ok(Some(budget)) => {
            let now = budget.now(wall);
            plan(budget, now).map(|p| (p, now))
        }
        Ok(None) => Err(noquota()),
        Err(e) => Err(e),
    };
    let (plan, now) = match planned {
        Ok((plan, now)) if !plan.effects.is_empty() => (plan, now),
        other => {
            key.unchanged();
            let (plan, now) = other?;
            let view = key
                .value::<Budget>(&BUDGET_TYPE)?
                .ok_or_else(noquota)?
                .view(now);
            return Ok((plan.reply, view));
        }
    };
    let budget = key.value_mut::<Budget>(&BUDGET_TYPE)?.ok_or_else(noquota)?;
    let view = apply_and_propagate(ctx, key_name, budget, now, &plan.effects)?;
    Ok((plan.reply, view))
}

/// Parses an optional trailing `AT ms` (test clock) — shared by every time-dependent command.
fn parse_at(args: &mut Args, token: &[u8]) -> Result<Option<Option<i64>>, RedisError> {
    if token.eq_ignore_ascii_case(b"AT") {
        return Ok(Some(Some(args.next_i64()?)));
    }
    Ok(None)
}

/// `UNIT ms|s|min|NONE` → the unit in ms (`None`: plain units).
fn parse_unit(token: &[u8]) -> Result<Option<i64>, RedisError> {
    if token.eq_ignore_ascii_case(b"NONE") {
        return Ok(None);
    }
    UNITS_MS
        .iter()
        .find(|(name, _)| token.eq_ignore_ascii_case(name.as_bytes()))
        .map(|&(_, ms)| Some(ms))
        .ok_or(RedisError::Str("ERR UNIT must be ms, s, min or NONE"))
}

/// The name of a unit in ms, as QUOTA.INFO shows it (`none`: plain units).
fn unit_name(unit_ms: Option<i64>) -> &'static str {
    UNITS_MS
        .iter()
        .find(|&&(_, ms)| Some(ms) == unit_ms)
        .map_or("none", |&(name, _)| name)
}

/// `KEEP n` of RESERVE and CHARGE: a non-negative amount.
fn parse_keep(a: &mut Args) -> Result<Option<i64>, RedisError> {
    a.next_amount("KEEP").map(Some)
}

/// The options of `QUOTA.SET` that only a budget takes (none combines with `WINDOW`).
pub(crate) const BUDGET_OPTIONS: [&str; 12] = [
    "LIMIT",
    "USED",
    "OVERDRAFT",
    "MAXRESERVE",
    "TTL",
    "PERIOD",
    "TZ",
    "ANCHOR",
    "ONEXPIRE",
    "UNIT",
    "STREAM",
    "STREAMMAXLEN",
];

/// True if `token` is one of [`BUDGET_OPTIONS`] (case-insensitive).
pub(crate) fn is_budget_option(token: &[u8]) -> bool {
    BUDGET_OPTIONS
        .iter()
        .any(|o| token.eq_ignore_ascii_case(o.as_bytes()))
}

/// The error for `WINDOW` read among a budget's options (`args`: all of argv): it combines
/// with none of them, and comes right after the key.
#[cold]
fn window_among_options(a: &Args, args: &[RedisString], window: &[u8]) -> RedisError {
    let before = args.get(2..).unwrap_or(&[]);
    match before.iter().find(|t| is_budget_option(t.as_slice())) {
        Some(option) => window_with_budget_option(a, window, option.as_slice()),
        None => a.syntax_error(window, "WINDOW must come right after the key"),
    }
}

/// The syntax error near `token` for `QUOTA.SET key WINDOW ...` given the budget option
/// `option` (before or after `WINDOW`).
#[cold]
pub(crate) fn window_with_budget_option(a: &Args, token: &[u8], option: &[u8]) -> RedisError {
    a.syntax_error(
        token,
        &format!(
            "WINDOW cannot be combined with budget options such as {} (a key is a window or a \
             budget)",
            String::from_utf8_lossy(option).to_ascii_uppercase()
        ),
    )
}

/// `QUOTA.SET key [LIMIT n] [USED n] [OVERDRAFT n] [MAXRESERVE n] [TTL ms]
/// [PERIOD NONE|MINUTE|HOUR|DAY|WEEK|MONTH] [TZ zone] [ANCHOR unix_ms]
/// [ONEXPIRE RELEASE|CHARGE|ELAPSED] [UNIT ms|s|min|NONE] [STREAM stream_key|""] [STREAMMAXLEN n]
/// [NX|XX] [AT ms]`
/// → 1 if created, 0 otherwise (amounts in units, times in ms). `STREAM` turns the usage log on
/// (`""`: off), see [`crate::shell::usage`].
pub fn quota_set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 1)?;
    let key_name = a.next_string()?;
    if args
        .get(2)
        .is_some_and(|t| t.as_slice().eq_ignore_ascii_case(b"WINDOW"))
    {
        a.next_bytes()?;
        a.set_form(c"WINDOW");
        return crate::shell::window_cmds::quota_set_window(ctx, key_name, &mut a);
    }
    let (mut limit, mut used, mut overdraft, mut max_reserve, mut ttl) =
        (None, None, None, None, None);
    let (mut on_expire, mut unit): (Option<OnExpire>, Option<Option<i64>>) = (None, None);
    let (mut nx, mut xx, mut at) = (false, false, None);
    let (mut kind, mut tz, mut anchor): (Option<PeriodKind>, Option<&[u8]>, Option<i64>) =
        (None, None, None);
    let (mut stream, mut stream_max): (Option<&[u8]>, Option<i64>) = (None, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"LIMIT") {
            limit = Some(a.next_amount("LIMIT")?);
        } else if t.eq_ignore_ascii_case(b"USED") {
            used = Some(a.next_amount("USED")?);
        } else if t.eq_ignore_ascii_case(b"OVERDRAFT") {
            overdraft = Some(a.next_amount("OVERDRAFT")?);
        } else if t.eq_ignore_ascii_case(b"MAXRESERVE") {
            let m = a.next_i64()?;
            if m < -1 {
                return Err(RedisError::Str(
                    "ERR MAXRESERVE must be -1 (none) or a non-negative integer",
                ));
            }
            max_reserve = Some((m >= 0).then_some(m));
        } else if t.eq_ignore_ascii_case(b"TTL") {
            ttl = Some(a.next_ttl(BAD_TTL)?);
        } else if t.eq_ignore_ascii_case(b"PERIOD") {
            kind = Some(PeriodKind::parse(a.next_bytes()?).map_err(error_reply)?);
        } else if t.eq_ignore_ascii_case(b"TZ") {
            tz = Some(a.next_bytes()?);
        } else if t.eq_ignore_ascii_case(b"ANCHOR") {
            anchor = Some(a.next_i64()?);
        } else if t.eq_ignore_ascii_case(b"STREAM") {
            stream = Some(a.next_bytes()?);
        } else if t.eq_ignore_ascii_case(b"STREAMMAXLEN") {
            stream_max = Some(a.next_amount("STREAMMAXLEN")?);
        } else if t.eq_ignore_ascii_case(b"ONEXPIRE") {
            on_expire = Some(OnExpire::parse(a.next_bytes()?).ok_or(RedisError::Str(
                "ERR ONEXPIRE must be RELEASE, CHARGE or ELAPSED",
            ))?);
        } else if t.eq_ignore_ascii_case(b"UNIT") {
            unit = Some(parse_unit(a.next_bytes()?)?);
        } else if t.eq_ignore_ascii_case(b"NX") {
            nx = true;
        } else if t.eq_ignore_ascii_case(b"XX") {
            xx = true;
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else if t.eq_ignore_ascii_case(b"WINDOW") {
            return Err(window_among_options(&a, &args, t));
        } else {
            return Err(a.unexpected(t));
        }
    }
    if nx && xx {
        return Err(RedisError::Str(
            "ERR NX and XX options at the same time are not compatible",
        ));
    }
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    // A bad zone is an error even when NX or XX would leave the key alone.
    if let Some(tz) = tz {
        Period::new(PeriodKind::None, tz, None).map_err(error_reply)?;
    }
    let stream_key = stream.filter(|s| !s.is_empty());
    if let Some(s) = stream_key {
        check_stream_arg(ctx, key_name, s)?;
    }
    // What the stream key holds is checked only once something will be set: NX on a budget
    // and XX on an empty key reply 0 first (nothing is set, so there is nothing to check).
    let check_stream_type = || stream_key.map_or(Ok(()), |s| usage::check_stream_key(ctx, s));

    // Another type at this key is refused here with WRONGTYPE, but a window key given no
    // budget option (only NX, XX or AT) has nothing to change: 0, as a budget given none.
    let key = ctx.open_key(key_name);
    let exists = match key.get_value::<Budget>(&BUDGET_TYPE) {
        Ok(budget) => budget.is_some(),
        Err(_) => {
            let no_budget_option = limit.is_none()
                && used.is_none()
                && overdraft.is_none()
                && max_reserve.is_none()
                && ttl.is_none()
                && kind.is_none()
                && tz.is_none()
                && anchor.is_none()
                && on_expire.is_none()
                && unit.is_none()
                && stream.is_none()
                && stream_max.is_none();
            return match key.get_value::<Window>(&WINDOW_TYPE) {
                Ok(Some(_)) if no_budget_option => Ok(RedisValue::Integer(0)),
                _ => Err(RedisError::WrongType),
            };
        }
    };
    drop(key);
    if exists {
        if nx {
            return Ok(RedisValue::Integer(0));
        }
        check_stream_type()?;
        run_write(ctx, key_name, at, |b, now| {
            let period = merge_period(b.period(), kind, tz, anchor)?;
            let s = b.settings();
            let settings = Settings {
                limit: limit.unwrap_or(s.limit),
                overdraft: overdraft.unwrap_or(s.overdraft),
                max_reserve: max_reserve.unwrap_or(s.max_reserve),
                default_ttl_ms: ttl.unwrap_or(s.default_ttl_ms),
                on_expire: on_expire.unwrap_or(s.on_expire),
                unit_ms: unit.unwrap_or(s.unit_ms),
            };
            // Checked first: a bad STREAMMAXLEN changes nothing.
            let log = usage_after(b.usage(), stream, stream_max)?;
            let mut plan = b
                .plan_configure(now, &policy, settings, used, period)
                .map_err(error_reply)?;
            if let Some(log) = log {
                plan.effects.extend(b.plan_usage(log).map_err(error_reply)?);
            }
            Ok(plan)
        })?;
        return Ok(RedisValue::Integer(0));
    }
    if xx {
        return Ok(RedisValue::Integer(0));
    }
    check_stream_type()?;
    let Some(limit) = limit else {
        return Err(RedisError::Str(
            "ERR LIMIT is required to create a budget: QUOTA.SET key LIMIT n [option ...] (see QUOTA.HELP)",
        ));
    };
    let settings = Settings {
        limit,
        overdraft: overdraft.unwrap_or(0),
        max_reserve: max_reserve.unwrap_or(None),
        default_ttl_ms: ttl.unwrap_or_else(config::default_ttl),
        on_expire: on_expire.unwrap_or_default(),
        unit_ms: unit.unwrap_or(None),
    };
    let period = merge_period(&Period::none(), kind, tz, anchor)?.unwrap_or_else(Period::none);
    let log = usage_after(None, stream, stream_max)?.flatten();
    let configure =
        Budget::plan_create(wall, settings, used.unwrap_or(0), period).map_err(error_reply)?;
    let mut list = vec![configure];
    let mut budget = Budget::new(settings, wall);
    list.extend(budget.plan_usage(log).map_err(error_reply)?);
    // A new budget logs its starting USED as an adjustment.
    let mut entries = Vec::new();
    let logging = usage::may_log(&budget, &list).then_some(&mut entries);
    if let Some(e) =
        usage::apply_logged(&mut budget, wall, &list, logging, &mut ParsedId::default()).error
    {
        return Err(e);
    }
    let log = budget.usage().cloned();
    let mut key = ModuleKey::open_writable(ctx, key_name)?;
    let counts = Counts::of(&budget);
    key.set_value(&BUDGET_TYPE, budget)?;
    counts.adopt();
    events::notify(ctx, key_name, &list, || 0);
    let marks = match log {
        Some(log) => usage::write(ctx, key_name, &log, wall, &entries, None),
        None => usage::Marks::new(),
    };
    replicate::replicate_effects(ctx, key_name, wall, &list, &marks);
    Ok(RedisValue::Integer(1))
}

/// The usage log after a QUOTA.SET from the `current` one: `None` if STREAM and STREAMMAXLEN
/// were both absent (unchanged). `STREAM key` keeps the current MAXLEN unless STREAMMAXLEN is
/// given (default [`DEFAULT_STREAM_MAX_LEN`]); `STREAM ""` turns the log off.
fn usage_after(
    current: Option<&UsageLog>,
    stream: Option<&[u8]>,
    stream_max: Option<i64>,
) -> Result<Option<Option<UsageLog>>, RedisError> {
    let no_stream = || RedisError::Str("ERR STREAMMAXLEN needs a usage stream: STREAM key");
    Ok(match (stream, stream_max) {
        (None, None) => None,
        (Some(b""), None) => Some(None),
        (Some(b""), Some(_)) => return Err(no_stream()),
        (Some(s), max) => Some(Some(UsageLog {
            stream: s.to_vec(),
            max_len: max
                .or(current.map(|c| c.max_len))
                .unwrap_or(DEFAULT_STREAM_MAX_LEN),
        })),
        (None, Some(max)) => Some(Some(UsageLog {
            stream: current.ok_or_else(no_stream)?.stream.clone(),
            max_len: max,
        })),
    })
}

/// A usage stream key for `key`: in a cluster it must hash to the same slot (a hash tag, e.g.
/// `{tenant}:budget` and `{tenant}:usage`), so every command on the budget can write it; not
/// the budget key; allowed by the user's ACL. (That it is missing or a stream is checked by
/// the caller once something will be set, [`usage::check_stream_key`].)
fn check_stream_arg(ctx: &Context, key: &RedisString, stream: &[u8]) -> Result<(), RedisError> {
    if stream.len() > crate::core::ledger::MAX_STREAM_KEY_LEN {
        return Err(RedisError::Str(
            "ERR the usage stream key must be 1 to 65536 bytes",
        ));
    }
    if ctx.get_flags().contains(ContextFlags::CLUSTER)
        && usage::key_slot(stream) != usage::key_slot(key.as_slice())
    {
        return Err(RedisError::Str(
            "CROSSSLOT the usage stream key must hash to the same slot as the budget key \
             (give both the same hash tag, e.g. {tenant}:budget and {tenant}:usage)",
        ));
    }
    if stream == key.as_slice() {
        return Err(RedisError::Str(
            "ERR the usage stream key must not be the budget key",
        ));
    }
    usage::check_stream_acl(ctx, stream)
}

/// The period after a QUOTA.SET: `None` if PERIOD, TZ and ANCHOR were all absent (unchanged).
/// A TZ or ANCHOR alone keeps the current kind; PERIOD NONE clears the anchor.
fn merge_period(
    current: &Period,
    kind: Option<PeriodKind>,
    tz: Option<&[u8]>,
    anchor: Option<i64>,
) -> Result<Option<Period>, RedisError> {
    if kind.is_none() && tz.is_none() && anchor.is_none() {
        return Ok(None);
    }
    let kind = kind.unwrap_or(current.kind);
    let tz = tz.unwrap_or(current.tz.as_bytes());
    let anchor = if kind == PeriodKind::None && anchor.is_none() {
        None
    } else {
        anchor.or(current.anchor_ms)
    };
    Period::new(kind, tz, anchor).map(Some).map_err(error_reply)
}

/// Reads a budget for a read-only command: `None` for a missing key.
fn with_budget<T>(
    ctx: &Context,
    key_name: &RedisString,
    at: Option<i64>,
    f: impl FnOnce(&Budget, i64) -> T,
) -> Result<Option<T>, RedisError> {
    let wall = clock::command_ms(at)?;
    let key = ctx.open_key(key_name);
    Ok(crate::shell::wrongtype(key.get_value::<Budget>(&BUDGET_TYPE))?.map(|b| f(b, b.now(wall))))
}

/// `QUOTA.INFO key [AT ms]` → field/value map, or nil.
pub fn quota_info(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 1)?;
    let key_name = a.next_string()?;
    let mut at = None;
    while !a.is_empty() {
        let t = a.next_bytes()?;
        match parse_at(&mut a, t)? {
            Some(v) => at = v,
            None => return Err(a.unexpected(t)),
        }
    }
    let info = match with_budget(ctx, key_name, at, |b, now| {
        (
            b.view(now),
            b.period().clone(),
            *b.settings(),
            b.usage().cloned(),
        )
    }) {
        Err(RedisError::WrongType) => {
            // A window key (or another type: WRONGTYPE).
            let now = clock::command_ms(at)?;
            let key = ctx.open_key(key_name);
            let w = crate::shell::wrongtype(key.get_value::<Window>(&WINDOW_TYPE))?;
            return match w {
                Some(w) => crate::shell::window_cmds::window_info(ctx, w, now),
                None => Ok(RedisValue::Null),
            };
        }
        other => other?,
    };
    let Some((v, period, settings, log)) = info else {
        return Ok(RedisValue::Null);
    };
    let (start, end) = v.period_bounds.unwrap_or((-1, -1));
    reply_fields(
        ctx,
        &[
            ("limit", Field::Int(v.limit)),
            ("used", Field::Int(v.used)),
            ("reserved", Field::Int(v.reserved)),
            ("available", Field::Int(v.available)),
            ("overdraft", Field::Int(v.overdraft)),
            ("max_reserve", Field::Int(v.max_reserve.unwrap_or(-1))),
            ("default_ttl_ms", Field::Int(v.default_ttl_ms)),
            ("pending", Field::Int(v.pending)),
            ("overrun", Field::Int(v.overrun)),
            ("period", Field::Str(period.kind.as_str().to_string())),
            ("tz", Field::Str(period.tz)),
            ("period_start_ms", Field::Int(start)),
            ("period_end_ms", Field::Int(end)),
            (
                "on_expire",
                Field::Str(settings.on_expire.as_str().to_string()),
            ),
            ("unit", Field::Str(unit_name(settings.unit_ms).to_string())),
            (
                "stream",
                Field::Bytes(log.as_ref().map(|l| l.stream.clone()).unwrap_or_default()),
            ),
            ("stream_maxlen", Field::Int(log.map_or(-1, |l| l.max_len))),
        ],
    )
}

/// A new id must fit `quota.max-id-length` (`max`, bytes); one the budget knows (a retry of
/// a reservation or charge made before the config was lowered) only the hard cap, so lowering
/// it strands nothing and retries still get their remembered answer.
pub(crate) fn check_new_id(b: &Budget, id: Option<&[u8]>, max: i64) -> Result<(), RedisError> {
    let Some(id) = id else {
        return Ok(());
    };
    match check_id(id, max) {
        // Over the limit: looked up only then.
        Err(e) if b.book().get(id).is_none() => Err(e),
        _ => Ok(()),
    }
}

/// An `ID` argument of RESERVE or CHARGE as parsed: non-empty and within the hard cap (no
/// known id is longer); beyond it refused naming `quota.max-id-length`, the limit a user set.
pub(crate) fn check_id_arg(v: &[u8]) -> Result<(), RedisError> {
    check_id(v, MAX_ID_LENGTH_RANGE.1).or_else(|_| check_id(v, config::max_id_length()))
}

/// `QUOTA.RESERVE key amount [ID id] [TTL ms] [KEEP n] [AT ms]`
/// → `[granted, id|nil, available, retry_after_ms]`.
pub fn quota_reserve(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 2)?;
    let key_name = a.next_string()?;
    let amount = a.next_amount("amount")?;
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
            keep = parse_keep(&mut a)?;
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(a.unexpected(t));
        }
    }
    let policy = config::policy();
    let max_id = config::max_id_length();
    let ((reply, retry), view) = run_write(ctx, key_name, at, |b, now| {
        check_new_id(b, id, max_id)?;
        let plan = b
            .plan_reserve_keep(now, &policy, amount, id, ttl, keep)
            .map_err(error_reply)?;
        let retry = match plan.reply {
            ReserveReply::Denied => b.retry_after_keep(now, amount, keep),
            _ => 0,
        };
        Ok(Plan {
            effects: plan.effects,
            reply: (plan.reply, retry),
        })
    })?;
    stats::bump(match reply {
        ReserveReply::Denied => &stats::DENIED,
        _ => &stats::GRANTED,
    });
    match reply {
        ReserveReply::Granted { id } | ReserveReply::Retried { id } => reply_array(
            ctx,
            &[
                Item::Int(1),
                Item::Bulk(&id),
                Item::Int(view.available),
                Item::Int(0),
            ],
        ),
        ReserveReply::Denied => reply_array(
            ctx,
            &[
                Item::Int(0),
                Item::Null,
                Item::Int(view.available),
                Item::Int(retry),
            ],
        ),
    }
}

/// `key id [n] [AT ms]`: the shape of SETTLE, ROLLBACK and EXTEND.
struct KeyIdArgs<'a> {
    key: &'a RedisString,
    id: &'a [u8],
    /// The integer after the id; `None` without one, or for `ELAPSED`.
    num: Option<i64>,
    at: Option<i64>,
}

/// What follows the id in [`key_id_tail`].
#[derive(PartialEq, Eq)]
enum Num {
    None,
    Int,
    /// An integer or the word `ELAPSED` (SETTLE).
    IntOrElapsed,
}

/// Parses `key id`, then an integer (or ELAPSED) as `num` says, then an optional trailing
/// `AT ms`.
fn key_id_tail<'a>(a: &mut Args<'a>, num: Num) -> Result<KeyIdArgs<'a>, RedisError> {
    let key = a.next_string()?;
    let id = a.next_bytes()?;
    // SETTLE, ROLLBACK and EXTEND name an existing id: only the hard cap applies, so lowering
    // quota.max-id-length never strands a reservation made under a higher one.
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let num = match num {
        Num::None => None,
        Num::Int => Some(a.next_i64()?),
        Num::IntOrElapsed => {
            let t = a.next_bytes()?;
            if t.eq_ignore_ascii_case(b"ELAPSED") {
                None
            } else {
                match crate::shell::args::parse_canonical_i64(t) {
                    Some(n) => Some(n),
                    None => return Err(a.not_an_integer()),
                }
            }
        }
    };
    let mut at = None;
    while !a.is_empty() {
        let t = a.next_bytes()?;
        match parse_at(a, t)? {
            Some(v) => at = v,
            None => return Err(a.unexpected(t)),
        }
    }
    Ok(KeyIdArgs { key, id, num, at })
}

/// `QUOTA.SETTLE key id actual|ELAPSED [AT ms]` → `[status, charged, available]`. ELAPSED
/// charges the time since the grant in the budget's UNIT.
pub fn quota_settle(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 3)?;
    let KeyIdArgs {
        key: key_name,
        id,
        num,
        at,
    } = key_id_tail(&mut a, Num::IntOrElapsed)?;
    // `None`: ELAPSED.
    let actual = match num {
        Some(n) if n < 0 => return Err(RedisError::Str("ERR actual must not be negative")),
        n => n,
    };
    let policy = config::policy();
    let ((status, charged), view) = run_write(ctx, key_name, at, |b, now| {
        match actual {
            Some(actual) => b.plan_settle(now, &policy, id, actual),
            None => b.plan_settle_elapsed(now, &policy, id),
        }
        .map_err(error_reply)
    })?;
    let status = match status {
        SettleStatus::Settled => {
            stats::bump(&stats::SETTLED);
            c"settled"
        }
        SettleStatus::Late => {
            stats::bump(&stats::LATE);
            c"late"
        }
        SettleStatus::Duplicate => c"duplicate",
    };
    reply_array(
        ctx,
        &[
            Item::Status(status),
            Item::Int(charged),
            Item::Int(view.available),
        ],
    )
}

/// `QUOTA.ROLLBACK key id [AT ms]` → `[status, released, available]`.
pub fn quota_rollback(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 2)?;
    let KeyIdArgs {
        key: key_name,
        id,
        at,
        ..
    } = key_id_tail(&mut a, Num::None)?;
    let policy = config::policy();
    let ((status, released), view) = run_write(ctx, key_name, at, |b, now| {
        b.plan_rollback(now, &policy, id).map_err(error_reply)
    })?;
    let status = match status {
        RollbackStatus::RolledBack => {
            stats::bump(&stats::ROLLED_BACK);
            c"rolledback"
        }
        RollbackStatus::Duplicate => c"duplicate",
        RollbackStatus::Expired => c"expired",
    };
    reply_array(
        ctx,
        &[
            Item::Status(status),
            Item::Int(released),
            Item::Int(view.available),
        ],
    )
}

/// `QUOTA.EXTEND key id ttl_ms [AT ms]` → ttl_ms.
pub fn quota_extend(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 3)?;
    let KeyIdArgs {
        key: key_name,
        id,
        num,
        at,
    } = key_id_tail(&mut a, Num::Int)?;
    let ttl = ttl_arg(num.unwrap_or(0), BAD_TTL_MS)?;
    let policy = config::policy();
    let (ttl, _) = run_write(ctx, key_name, at, |b, now| {
        b.plan_extend(now, &policy, id, ttl).map_err(error_reply)
    })?;
    Ok(RedisValue::Integer(ttl))
}

/// `QUOTA.CHARGE key amount [ID id] [FORCE] [KEEP n] [AT ms]`
/// → `[charged, available, retry_after_ms]`.
pub fn quota_charge(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 2)?;
    let key_name = a.next_string()?;
    let amount = a.next_amount("amount")?;
    let (mut id, mut force, mut at, mut keep) = (None, false, None, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"ID") {
            let v = a.next_bytes()?;
            check_id_arg(v)?;
            id = Some(v);
        } else if t.eq_ignore_ascii_case(b"FORCE") {
            force = true;
        } else if t.eq_ignore_ascii_case(b"KEEP") {
            keep = parse_keep(&mut a)?;
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(a.unexpected(t));
        }
    }
    let policy = config::policy();
    let max_id = config::max_id_length();
    let ((charged, retry), view) = run_write(ctx, key_name, at, |b, now| {
        check_new_id(b, id, max_id)?;
        let plan = b
            .plan_charge_keep(now, &policy, amount, id, force, keep)
            .map_err(error_reply)?;
        let retry = if plan.reply {
            0
        } else {
            b.retry_after_keep(now, amount, keep)
        };
        Ok(Plan {
            effects: plan.effects,
            reply: (plan.reply, retry),
        })
    })?;
    stats::bump(if charged {
        &stats::CHARGED
    } else {
        &stats::CHARGE_DENIED
    });
    reply_array(
        ctx,
        &[
            Item::Int(i64::from(charged)),
            Item::Int(view.available),
            Item::Int(retry),
        ],
    )
}

fn pending_count_error() -> RedisError {
    RedisError::String(format!(
        "ERR COUNT must be between 0 and {MAX_PENDING_COUNT}"
    ))
}

/// `QUOTA.PENDING key [COUNT n] [AT ms]`
/// → `[[id, amount, age_ms, ttl_ms, start_ms, heartbeat_ms|-1], ...]`.
pub fn quota_pending(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 1)?;
    let key_name = a.next_string()?;
    let (mut count, mut at) = (100i64, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"COUNT") {
            count = a.next_i64()?;
            // The sign is checked on every occurrence, the range on the value kept.
            if count < 0 {
                return Err(pending_count_error());
            }
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(a.unexpected(t));
        }
    }
    if count > MAX_PENDING_COUNT {
        return Err(pending_count_error());
    }
    let count = usize::try_from(count).unwrap_or(0);
    let list = with_budget(ctx, key_name, at, |b, now| b.pending(now, count))?.unwrap_or_default();
    Ok(RedisValue::Array(
        list.into_iter()
            .map(|p| {
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(p.id.into_vec()),
                    RedisValue::Integer(p.amount),
                    RedisValue::Integer(p.age_ms),
                    RedisValue::Integer(p.ttl_ms),
                    RedisValue::Integer(p.start_ms),
                    RedisValue::Integer(p.heartbeat_ms.unwrap_or(-1)),
                ])
            })
            .collect(),
    ))
}
