//! QUOTA.SET / INFO / RESERVE / SETTLE / ROLLBACK / EXTEND / CHARGE / PENDING: parse, plan on
//! the pure ledger, apply, replicate the effects, reply. See docs/commands.md for each reply.

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::ledger::{
    Budget, Effect, Plan, ReserveReply, RollbackStatus, Settings, SettleStatus, View,
};
use crate::shell::args::{check_id, syntax_error, Args};
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::reply::{reply_fields, Field};
use crate::shell::{clock, config, replicate};

/// Most entries QUOTA.PENDING returns in one call.
pub const MAX_PENDING_COUNT: i64 = 10_000;

fn noquota() -> RedisError {
    RedisError::Str("NOQUOTA no budget at this key (create it with QUOTA.SET)")
}

fn ledger_err(e: crate::core::error::LedgerError) -> RedisError {
    RedisError::String(e.to_string())
}

/// Runs a write command on an existing budget: plan on a read-only open (a denial or an error
/// writes nothing, so WATCH and client tracking see no change), then apply the effects on a
/// writable open and replicate them. Returns the plan's reply and the view after it.
fn run_write<R>(
    ctx: &Context,
    key_name: &RedisString,
    at: Option<i64>,
    plan: impl FnOnce(&Budget, i64) -> Result<Plan<R>, RedisError>,
) -> Result<(R, View), RedisError> {
    let wall = clock::command_ms(at)?;
    let (plan, now) = {
        let key = ctx.open_key(key_name);
        let budget =
            crate::shell::wrongtype(key.get_value::<Budget>(&BUDGET_TYPE))?.ok_or_else(noquota)?;
        let now = budget.now(wall);
        let plan = plan(budget, now)?;
        if plan.effects.is_empty() {
            let view = budget.view(now);
            return Ok((plan.reply, view));
        }
        (plan, now)
    };
    let key = ctx.open_key_writable(key_name);
    let budget =
        crate::shell::wrongtype(key.get_value::<Budget>(&BUDGET_TYPE))?.ok_or_else(noquota)?;
    let result = apply_all(budget, now, &plan.effects);
    replicate::replicate_effects(
        ctx,
        key_name,
        now,
        plan.effects.get(..result.applied).unwrap_or(&[]),
    );
    if let Some(e) = result.error {
        return Err(e);
    }
    let view = budget.view(now);
    Ok((plan.reply, view))
}

/// How far a list of effects got.
pub struct Applied {
    pub applied: usize,
    pub error: Option<RedisError>,
}

/// Applies effects in order, stopping at the first that does not fit (nothing of it applied).
pub fn apply_all(budget: &mut Budget, at: i64, effects: &[Effect]) -> Applied {
    for (i, e) in effects.iter().enumerate() {
        if let Err(err) = budget.apply(at, e) {
            return Applied {
                applied: i,
                error: Some(ledger_err(err)),
            };
        }
    }
    Applied {
        applied: effects.len(),
        error: None,
    }
}

/// Parses an optional trailing `AT ms` (test clock) — shared by every time-dependent command.
fn parse_at(args: &mut Args, token: &[u8]) -> Result<Option<Option<i64>>, RedisError> {
    if token.eq_ignore_ascii_case(b"AT") {
        return Ok(Some(Some(args.next_i64()?)));
    }
    Ok(None)
}

/// `QUOTA.SET key [LIMIT n] [USED n] [OVERDRAFT n] [MAXRESERVE n] [TTL ms] [NX|XX] [AT ms]`
/// → 1 if created, 0 otherwise.
pub fn quota_set(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 1)?;
    let key_name = a.next_string()?;
    let (mut limit, mut used, mut overdraft, mut max_reserve, mut ttl) =
        (None, None, None, None, None);
    let (mut nx, mut xx, mut at) = (false, false, None);
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
            ttl = Some(a.next_positive("TTL")?);
        } else if t.eq_ignore_ascii_case(b"NX") {
            nx = true;
        } else if t.eq_ignore_ascii_case(b"XX") {
            xx = true;
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(syntax_error(t));
        }
    }
    if nx && xx {
        return Err(RedisError::Str(
            "ERR NX and XX options at the same time are not compatible",
        ));
    }
    let wall = clock::command_ms(at)?;
    let policy = config::policy();

    // Another type at this key is refused here with WRONGTYPE.
    let exists = crate::shell::wrongtype(ctx.open_key(key_name).get_value::<Budget>(&BUDGET_TYPE))?
        .is_some();
    if exists {
        if nx {
            return Ok(RedisValue::Integer(0));
        }
        run_write(ctx, key_name, at, |b, now| {
            let s = b.settings();
            let settings = Settings {
                limit: limit.unwrap_or(s.limit),
                overdraft: overdraft.unwrap_or(s.overdraft),
                max_reserve: max_reserve.unwrap_or(s.max_reserve),
                default_ttl_ms: ttl.unwrap_or(s.default_ttl_ms),
            };
            b.plan_configure(now, &policy, settings, used)
                .map_err(ledger_err)
        })?;
        return Ok(RedisValue::Integer(0));
    }
    if xx {
        return Ok(RedisValue::Integer(0));
    }
    let Some(limit) = limit else {
        return Err(RedisError::Str("ERR LIMIT is required to create a budget"));
    };
    let settings = Settings {
        limit,
        overdraft: overdraft.unwrap_or(0),
        max_reserve: max_reserve.unwrap_or(None),
        default_ttl_ms: ttl.unwrap_or_else(config::default_ttl),
    };
    crate::core::ledger::validate_settings(&settings).map_err(ledger_err)?;
    let configure = Effect::Configure {
        settings,
        used: used.unwrap_or(0),
    };
    let mut budget = Budget::new(settings, wall);
    budget.apply(wall, &configure).map_err(ledger_err)?;
    let key = ctx.open_key_writable(key_name);
    crate::shell::wrongtype(key.set_value(&BUDGET_TYPE, budget))?;
    replicate::replicate_effects(ctx, key_name, wall, &[configure]);
    Ok(RedisValue::Integer(1))
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
            None => return Err(syntax_error(t)),
        }
    }
    let Some(v) = with_budget(ctx, key_name, at, |b, now| b.view(now))? else {
        return Ok(RedisValue::Null);
    };
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
        ],
    )
}

/// `QUOTA.RESERVE key amount [ID id] [TTL ms] [AT ms]`
/// → `[granted, id|nil, available, retry_after_ms]`.
pub fn quota_reserve(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 2)?;
    let key_name = a.next_string()?;
    let amount = a.next_amount("amount")?;
    let (mut id, mut ttl, mut at) = (None, None, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"ID") {
            let v = a.next_bytes()?;
            check_id(v, config::max_id_length())?;
            id = Some(v);
        } else if t.eq_ignore_ascii_case(b"TTL") {
            ttl = Some(a.next_positive("TTL")?);
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(syntax_error(t));
        }
    }
    let policy = config::policy();
    let (reply, view) = run_write(ctx, key_name, at, |b, now| {
        b.plan_reserve(now, &policy, amount, id, ttl)
            .map_err(ledger_err)
    })?;
    Ok(match reply {
        ReserveReply::Granted { id } | ReserveReply::Retried { id } => RedisValue::Array(vec![
            RedisValue::Integer(1),
            RedisValue::StringBuffer(id.into_vec()),
            RedisValue::Integer(view.available),
            RedisValue::Integer(0),
        ]),
        ReserveReply::Denied => RedisValue::Array(vec![
            RedisValue::Integer(0),
            RedisValue::Null,
            RedisValue::Integer(view.available),
            RedisValue::Integer(-1),
        ]),
    })
}

/// Parses `key id` and an optional trailing `AT ms`, after `extra` numeric arguments.
fn key_id_tail<'a>(
    a: &mut Args<'a>,
    extra: usize,
) -> Result<(&'a RedisString, &'a [u8], Vec<i64>, Option<i64>), RedisError> {
    let key = a.next_string()?;
    let id = a.next_bytes()?;
    check_id(id, config::max_id_length())?;
    let mut nums = Vec::with_capacity(extra);
    for _ in 0..extra {
        nums.push(a.next_i64()?);
    }
    let mut at = None;
    while !a.is_empty() {
        let t = a.next_bytes()?;
        match parse_at(a, t)? {
            Some(v) => at = v,
            None => return Err(syntax_error(t)),
        }
    }
    Ok((key, id, nums, at))
}

/// `QUOTA.SETTLE key id actual [AT ms]` → `[status, charged, available]`.
pub fn quota_settle(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 3)?;
    let (key_name, id, nums, at) = key_id_tail(&mut a, 1)?;
    let actual = nums.first().copied().unwrap_or(0);
    if actual < 0 {
        return Err(RedisError::Str("ERR actual must not be negative"));
    }
    let policy = config::policy();
    let ((status, charged), view) = run_write(ctx, key_name, at, |b, now| {
        b.plan_settle(now, &policy, id, actual).map_err(ledger_err)
    })?;
    let status = match status {
        SettleStatus::Settled => "settled",
        SettleStatus::Late => "late",
        SettleStatus::Duplicate => "duplicate",
    };
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic(status),
        RedisValue::Integer(charged),
        RedisValue::Integer(view.available),
    ]))
}

/// `QUOTA.ROLLBACK key id [AT ms]` → `[status, released, available]`.
pub fn quota_rollback(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 2)?;
    let (key_name, id, _, at) = key_id_tail(&mut a, 0)?;
    let policy = config::policy();
    let ((status, released), view) = run_write(ctx, key_name, at, |b, now| {
        b.plan_rollback(now, &policy, id).map_err(ledger_err)
    })?;
    let status = match status {
        RollbackStatus::RolledBack => "rolledback",
        RollbackStatus::Duplicate => "duplicate",
        RollbackStatus::Expired => "expired",
    };
    Ok(RedisValue::Array(vec![
        RedisValue::SimpleStringStatic(status),
        RedisValue::Integer(released),
        RedisValue::Integer(view.available),
    ]))
}

/// `QUOTA.EXTEND key id ttl_ms [AT ms]` → ttl_ms.
pub fn quota_extend(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 3)?;
    let (key_name, id, nums, at) = key_id_tail(&mut a, 1)?;
    let ttl = nums.first().copied().unwrap_or(0);
    if ttl <= 0 {
        return Err(RedisError::Str("ERR ttl_ms must be positive"));
    }
    let policy = config::policy();
    let (ttl, _) = run_write(ctx, key_name, at, |b, now| {
        b.plan_extend(now, &policy, id, ttl).map_err(ledger_err)
    })?;
    Ok(RedisValue::Integer(ttl))
}

/// `QUOTA.CHARGE key amount [ID id] [FORCE] [AT ms]` → `[charged, available, retry_after_ms]`.
pub fn quota_charge(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 2)?;
    let key_name = a.next_string()?;
    let amount = a.next_amount("amount")?;
    let (mut id, mut force, mut at) = (None, false, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"ID") {
            let v = a.next_bytes()?;
            check_id(v, config::max_id_length())?;
            id = Some(v);
        } else if t.eq_ignore_ascii_case(b"FORCE") {
            force = true;
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(syntax_error(t));
        }
    }
    let policy = config::policy();
    let (charged, view) = run_write(ctx, key_name, at, |b, now| {
        b.plan_charge(now, &policy, amount, id, force)
            .map_err(ledger_err)
    })?;
    Ok(RedisValue::Array(vec![
        RedisValue::Integer(i64::from(charged)),
        RedisValue::Integer(view.available),
        RedisValue::Integer(if charged { 0 } else { -1 }),
    ]))
}

/// `QUOTA.PENDING key [COUNT n] [AT ms]` → `[[id, amount, age_ms, ttl_ms], ...]`.
pub fn quota_pending(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    let mut a = Args::new(&args, 1)?;
    let key_name = a.next_string()?;
    let (mut count, mut at) = (100i64, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"COUNT") {
            count = a.next_i64()?;
            if !(0..=MAX_PENDING_COUNT).contains(&count) {
                return Err(RedisError::String(format!(
                    "ERR COUNT must be between 0 and {MAX_PENDING_COUNT}"
                )));
            }
        } else if let Some(v) = parse_at(&mut a, t)? {
            at = v;
        } else {
            return Err(syntax_error(t));
        }
    }
    let count = usize::try_from(count).unwrap_or(0);
    let list = with_budget(ctx, key_name, at, |b, now| b.pending(now, count))?.unwrap_or_default();
    Ok(RedisValue::Array(
        list.into_iter()
            .map(|(id, amount, age, ttl)| {
                RedisValue::Array(vec![
                    RedisValue::StringBuffer(id.into_vec()),
                    RedisValue::Integer(amount),
                    RedisValue::Integer(age),
                    RedisValue::Integer(ttl),
                ])
            })
            .collect(),
    ))
}
