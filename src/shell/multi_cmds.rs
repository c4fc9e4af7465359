//! Multi-limit admission (issue 19): `QUOTA.MRESERVE`, `QUOTA.MSETTLE`, `QUOTA.MROLLBACK`,
//! `QUOTA.MEXTEND` over up to [`MAX_KEYS`] keys, each a budget or a configured window key.
//! See docs/commands.md for each reply.
//!
//! Every command opens all its keys once, writable, and plans on each key with the single-key
//! rules (`Budget::plan_*`, `Window::plan_id_*`) before changing anything. An error or a denial
//! on any key changes nothing anywhere: every key is declared unchanged, so nothing is written,
//! signalled, published or replicated. Otherwise each key's effects are applied in key order
//! and replicated as that key's `QUOTA.APPLY` (budgets) or `QUOTA.WAPPLY` (windows), which Redis
//! wraps in one MULTI/EXEC: replicas and the AOF apply them together, with the master's time
//! and id.
//!
//! A key that was deleted between reserve and settle is an error (`NOQUOTA`, nothing changes:
//! settle the other keys with a shorter list); a budget replaced by a new one does not know the
//! id (`NORESERVATION`); a window key replaced by a new one does not remember it (`skipped`).

use redis_module::{Context, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::book::Id;
use crate::core::id::StreamId;
use crate::core::ledger::{Budget, Effects, ReserveReply, RollbackStatus, SettleStatus};
use crate::core::window::{IdPlan, Window, WindowEffect, WindowParams};
use crate::shell::apply::apply_and_propagate;
use crate::shell::args::{check_id, syntax_error, Args};
use crate::shell::budget_cmds::{check_id_arg, check_new_id, noquota};
use crate::shell::budget_type::BUDGET_TYPE;
use crate::shell::key::ModuleKey;
use crate::shell::reply::error_reply;
use crate::shell::window_cmds::no_window_config;
use crate::shell::window_type::WINDOW_TYPE;
use crate::shell::{clock, config, stats, window_effects};

/// Most keys one multi-key command names (`numkeys`).
pub const MAX_KEYS: usize = 16;

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

/// The effects planned for one key.
enum Planned {
    Budget { now: i64, effects: Effects },
    Window { effects: Vec<WindowEffect> },
}

/// Parses `numkeys key [key ...]`: 1..=[`MAX_KEYS`] keys, none listed twice.
fn parse_keys<'a>(a: &mut Args<'a>) -> Result<Vec<&'a RedisString>, RedisError> {
    let n = a.next_i64()?;
    let n = usize::try_from(n)
        .ok()
        .filter(|n| (1..=MAX_KEYS).contains(n))
        .ok_or(RedisError::Str("ERR numkeys must be between 1 and 16"))?;
    let mut keys: Vec<&RedisString> = Vec::with_capacity(n);
    for _ in 0..n {
        let k = a.next_string()?;
        if keys.iter().any(|seen| seen.as_slice() == k.as_slice()) {
            return Err(RedisError::String(format!(
                "ERR key '{}' is listed twice",
                crate::core::error::printable_id(k.as_slice())
            )));
        }
        keys.push(k);
    }
    Ok(keys)
}

/// Parses an optional trailing `AT ms` (test clock).
fn parse_at_only(a: &mut Args) -> Result<Option<i64>, RedisError> {
    let mut at = None;
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"AT") {
            at = Some(a.next_i64()?);
        } else {
            return Err(syntax_error(t));
        }
    }
    Ok(at)
}

/// Opens every key writable and tells its kind. Errors (and declares every key unchanged) on
/// an empty key (`NOQUOTA`), a window key without a configuration (`NOQUOTA`), another type
/// (`WRONGTYPE`).
fn open_all<'a>(ctx: &Context, names: &[&'a RedisString]) -> Result<Vec<Opened<'a>>, RedisError> {
    let mut opened: Vec<Opened<'a>> = Vec::with_capacity(names.len());
    for &name in names {
        let key = match ModuleKey::open_writable(ctx, name) {
            Ok(k) => k,
            Err(e) => return Err(abort(&mut opened, e)),
        };
        let kind = match key.value::<Budget>(&BUDGET_TYPE) {
            Ok(Some(_)) => Ok(Kind::Budget),
            Ok(None) => Err(RedisError::Str(
                "NOQUOTA no budget or window at a listed key (create it with QUOTA.SET)",
            )),
            Err(_) => match key.value::<Window>(&WINDOW_TYPE) {
                Ok(Some(w)) if w.config().is_some() => Ok(Kind::Window),
                Ok(_) => Err(no_window_config()),
                Err(_) => Err(RedisError::WrongType),
            },
        };
        opened.push(Opened {
            name,
            key,
            kind: Kind::Budget,
        });
        match (kind, opened.last_mut()) {
            (Ok(kind), Some(o)) => o.kind = kind,
            (Err(e), _) => return Err(abort(&mut opened, e)),
            (Ok(_), None) => {}
        }
    }
    Ok(opened)
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

fn budget_of<'k>(o: &'k Opened) -> Result<&'k Budget, RedisError> {
    o.key.value::<Budget>(&BUDGET_TYPE)?.ok_or_else(noquota)
}

fn window_of<'k>(o: &'k Opened) -> Result<&'k Window, RedisError> {
    o.key
        .value::<Window>(&WINDOW_TYPE)?
        .ok_or_else(no_window_config)
}

/// What a configured window has left at `now`: `limit - counted`, never negative.
fn remaining(w: &Window, now: i64) -> Result<i64, RedisError> {
    let params: WindowParams = w.config().ok_or_else(no_window_config)?.params(0);
    Ok(w.check(&params, now).map_err(error_reply)?.remaining)
}

/// The value a reply shows for a key now: a budget's available, a window's remaining.
fn value_now(o: &Opened, wall: i64) -> Result<i64, RedisError> {
    match o.kind {
        Kind::Budget => {
            let b = budget_of(o)?;
            Ok(b.view(b.now(wall)).available)
        }
        Kind::Window => remaining(window_of(o)?, wall),
    }
}

/// Applies every key's planned effects (keys with none are declared unchanged) and returns the
/// value of each key afterwards. The plans were made on these very values, so an effect that
/// does not apply is a bug; it is reported as the error, what was applied before it stays (and
/// is replicated), as for `QUOTA.APPLY`.
fn apply_all(
    ctx: &Context,
    opened: &mut [Opened],
    planned: &[Planned],
    wall: i64,
) -> Result<Vec<i64>, RedisError> {
    let mut values = Vec::with_capacity(opened.len());
    let mut failed = None;
    for (o, p) in opened.iter_mut().zip(planned) {
        if failed.is_some() {
            o.key.unchanged();
            continue;
        }
        let applied = match p {
            Planned::Budget { effects, .. } if effects.is_empty() => {
                o.key.unchanged();
                value_now(o, wall)
            }
            Planned::Window { effects } if effects.is_empty() => {
                o.key.unchanged();
                value_now(o, wall)
            }
            Planned::Budget { now, effects } => match o.key.value_mut::<Budget>(&BUDGET_TYPE) {
                Ok(Some(b)) => {
                    apply_and_propagate(ctx, o.name, b, *now, effects).map(|v| v.available)
                }
                Ok(None) => Err(noquota()),
                Err(e) => Err(e),
            },
            Planned::Window { effects } => {
                window_effects::apply_and_propagate(ctx, &mut o.key, o.name, wall, effects)
                    .and_then(|()| value_now(o, wall))
            }
        };
        match applied {
            Ok(v) => values.push(v),
            Err(e) => failed = Some(e),
        }
    }
    match failed {
        Some(e) => Err(e),
        None => Ok(values),
    }
}

/// A fresh id for a multi-key reservation: stream-style `<ms>-<seq>`, above what every listed
/// budget has seen (the largest of their next ids) and known to none of the keys.
fn generate_id(opened: &[Opened], wall: i64) -> Result<Id, RedisError> {
    let mut best: Option<StreamId> = None;
    for o in opened.iter().filter(|o| o.kind == Kind::Budget) {
        let b = budget_of(o)?;
        let id = b.next_id(b.now(wall)).map_err(error_reply)?;
        let parsed = StreamId::parse(&id);
        best = best.max(parsed);
    }
    let mut candidate = match best {
        Some(id) => id,
        None => StreamId {
            ms: u64::try_from(wall).unwrap_or(0),
            seq: 0,
        },
    };
    for _ in 0..1024 {
        let id = candidate.to_bytes();
        let mut taken = false;
        for o in opened {
            taken |= match o.kind {
                Kind::Budget => budget_of(o)?.book().get(&id).is_some(),
                Kind::Window => window_of(o)?.remembered().get(&id).is_some(),
            };
        }
        if !taken {
            return Ok(id);
        }
        candidate = candidate
            .next(wall)
            .ok_or(RedisError::Str("ERR could not generate a fresh id"))?;
    }
    Err(RedisError::Str("ERR could not generate a fresh id"))
}

/// `QUOTA.MRESERVE numkeys key [key ...] amount [amount ...] [ID id] [TTL ms] [AT ms]`
/// → `[granted, id|nil, denied_index, retry_after_ms, [value per key]]`.
pub fn quota_mreserve(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 3)?;
    let names = parse_keys(&mut a)?;
    let mut amounts = Vec::with_capacity(names.len());
    for _ in &names {
        amounts.push(a.next_amount("amount")?);
    }
    let (mut id, mut ttl, mut at) = (None, None, None);
    while !a.is_empty() {
        let t = a.next_bytes()?;
        if t.eq_ignore_ascii_case(b"ID") {
            let v = a.next_bytes()?;
            check_id_arg(v)?;
            id = Some(v);
        } else if t.eq_ignore_ascii_case(b"TTL") {
            ttl = Some(a.next_positive("TTL")?);
        } else if t.eq_ignore_ascii_case(b"AT") {
            at = Some(a.next_i64()?);
        } else {
            return Err(syntax_error(t));
        }
    }
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let max_id = config::max_id_length();
    let mut opened = open_all(ctx, &names)?;
    let planned = plan_reserve(&opened, &amounts, id, ttl, wall, &policy, max_id);
    let (id, outcome) = match planned {
        Ok(p) => p,
        Err(e) => return Err(abort(&mut opened, e)),
    };
    match outcome {
        ReserveOutcome::Retried => {
            unchanged_all(&mut opened);
            let values = values_now(&opened, wall)?;
            stats::bump(&stats::MRESERVE_GRANTED);
            Ok(reserve_reply(Some(&id), -1, 0, values))
        }
        ReserveOutcome::Denied { index, retry } => {
            unchanged_all(&mut opened);
            let values = values_now(&opened, wall)?;
            stats::bump(&stats::MRESERVE_DENIED);
            Ok(reserve_reply(
                None,
                i64::try_from(index).unwrap_or(-1),
                retry,
                values,
            ))
        }
        ReserveOutcome::Grant(planned) => {
            let values = apply_all(ctx, &mut opened, &planned, wall)?;
            stats::bump(&stats::MRESERVE_GRANTED);
            Ok(reserve_reply(Some(&id), -1, 0, values))
        }
    }
}

fn values_now(opened: &[Opened], wall: i64) -> Result<Vec<i64>, RedisError> {
    opened.iter().map(|o| value_now(o, wall)).collect()
}

fn reserve_reply(id: Option<&[u8]>, denied: i64, retry: i64, values: Vec<i64>) -> RedisValue {
    RedisValue::Array(vec![
        RedisValue::Integer(i64::from(id.is_some())),
        match id {
            Some(id) => RedisValue::StringBuffer(id.to_vec()),
            None => RedisValue::Null,
        },
        RedisValue::Integer(denied),
        RedisValue::Integer(retry),
        RedisValue::Array(values.into_iter().map(RedisValue::Integer).collect()),
    ])
}

/// What MRESERVE decided.
enum ReserveOutcome {
    /// Every key knows the id with the same amount: nothing more is taken.
    Retried,
    /// The first key that denied, and its retry_after_ms.
    Denied { index: usize, retry: i64 },
    /// Every key grants: the effects per key.
    Grant(Vec<Planned>),
}

/// Plans MRESERVE on every key (pure: nothing changes). Errors: a key's error; `CONFLICT` when
/// some keys know the id as pending with the same amount and others do not (a retry must name
/// the same keys and amounts).
fn plan_reserve(
    opened: &[Opened],
    amounts: &[i64],
    id: Option<&[u8]>,
    ttl: Option<i64>,
    wall: i64,
    policy: &crate::core::ledger::Policy,
    max_id: i64,
) -> Result<(Id, ReserveOutcome), RedisError> {
    let id: Id = match id {
        Some(id) => Id::from_slice(id),
        None => generate_id(opened, wall)?,
    };
    let mut planned = Vec::with_capacity(opened.len());
    let (mut retried, mut fresh) = (0usize, 0usize);
    let mut denied: Option<(usize, i64)> = None;
    for (i, (o, &amount)) in opened.iter().zip(amounts).enumerate() {
        match o.kind {
            Kind::Budget => {
                let b = budget_of(o)?;
                let now = b.now(wall);
                check_new_id(b, Some(&id), max_id)?;
                let plan = b
                    .plan_reserve(now, policy, amount, Some(&id), ttl)
                    .map_err(error_reply)?;
                match plan.reply {
                    ReserveReply::Retried { .. } => retried = retried.saturating_add(1),
                    ReserveReply::Granted { .. } => fresh = fresh.saturating_add(1),
                    ReserveReply::Denied => {
                        fresh = fresh.saturating_add(1);
                        if denied.is_none() {
                            denied = Some((i, b.retry_after(now, amount)));
                        }
                    }
                }
                planned.push(Planned::Budget {
                    now,
                    effects: plan.effects,
                });
            }
            Kind::Window => {
                let w = window_of(o)?;
                let cfg = *w.config().ok_or_else(no_window_config)?;
                let max_ids = policy.max_pending;
                match w
                    .plan_id_reserve(wall, &id, amount, max_ids)
                    .map_err(error_reply)?
                {
                    IdPlan::Retried => {
                        retried = retried.saturating_add(1);
                        planned.push(Planned::Window { effects: vec![] });
                    }
                    IdPlan::Denied(d) => {
                        fresh = fresh.saturating_add(1);
                        if denied.is_none() {
                            denied = Some((i, d.retry_after_ms));
                        }
                        planned.push(Planned::Window { effects: vec![] });
                    }
                    _ => {
                        fresh = fresh.saturating_add(1);
                        planned.push(Planned::Window {
                            effects: vec![WindowEffect::Count {
                                window_ms: cfg.window_ms,
                                precision_ms: cfg.precision_ms,
                                cost: amount,
                                id: Some(id.clone()),
                            }],
                        });
                    }
                }
            }
        }
    }
    if retried > 0 && fresh > 0 {
        return Err(RedisError::String(format!(
            "CONFLICT id '{}' is pending: a retry must name the same keys and amounts",
            crate::core::error::printable_id(&id)
        )));
    }
    let outcome = match denied {
        _ if retried > 0 => ReserveOutcome::Retried,
        Some((index, retry)) => ReserveOutcome::Denied { index, retry },
        None => ReserveOutcome::Grant(planned),
    };
    Ok((id, outcome))
}

/// `QUOTA.MSETTLE numkeys key [key ...] id actual [actual ...] [AT ms]`
/// → one `[status, charged, value]` per key.
pub fn quota_msettle(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 4)?;
    let names = parse_keys(&mut a)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let mut actuals = Vec::with_capacity(names.len());
    for _ in &names {
        actuals.push(a.next_amount("actual")?);
    }
    let at = parse_at_only(&mut a)?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = open_all(ctx, &names)?;
    let planned = (|| {
        let mut planned = Vec::with_capacity(opened.len());
        let mut statuses = Vec::with_capacity(opened.len());
        for (o, &actual) in opened.iter().zip(&actuals) {
            match o.kind {
                Kind::Budget => {
                    let b = budget_of(o)?;
                    let now = b.now(wall);
                    let plan = b
                        .plan_settle(now, &policy, id, actual)
                        .map_err(error_reply)?;
                    statuses.push(match plan.reply.0 {
                        SettleStatus::Settled => "settled",
                        SettleStatus::Late => "late",
                        SettleStatus::Duplicate => "duplicate",
                    });
                    planned.push(Planned::Budget {
                        now,
                        effects: plan.effects,
                    });
                }
                Kind::Window => {
                    let w = window_of(o)?;
                    let (status, effects) =
                        match w.plan_id_settle(wall, id, actual).map_err(error_reply)? {
                            IdPlan::Corrected { .. } => (
                                "corrected",
                                vec![WindowEffect::Settle {
                                    id: Id::from_slice(id),
                                    actual,
                                }],
                            ),
                            IdPlan::Duplicate => ("duplicate", vec![]),
                            _ => ("skipped", vec![]),
                        };
                    statuses.push(status);
                    planned.push(Planned::Window { effects });
                }
            }
        }
        Ok::<_, RedisError>((planned, statuses))
    })();
    let (planned, statuses) = match planned {
        Ok(p) => p,
        Err(e) => return Err(abort(&mut opened, e)),
    };
    let values = apply_all(ctx, &mut opened, &planned, wall)?;
    for s in &statuses {
        match *s {
            "settled" | "corrected" => stats::bump(&stats::MSETTLED),
            "late" => stats::bump(&stats::MSETTLED_LATE),
            _ => {}
        }
    }
    Ok(triples(&statuses, &actuals, &values))
}

fn triples(statuses: &[&'static str], amounts: &[i64], values: &[i64]) -> RedisValue {
    RedisValue::Array(
        statuses
            .iter()
            .zip(amounts)
            .zip(values)
            .map(|((s, n), v)| {
                RedisValue::Array(vec![
                    RedisValue::SimpleStringStatic(s),
                    RedisValue::Integer(*n),
                    RedisValue::Integer(*v),
                ])
            })
            .collect(),
    )
}

/// `QUOTA.MROLLBACK numkeys key [key ...] id [AT ms]` → one `[status, released, value]` per key.
pub fn quota_mrollback(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 3)?;
    let names = parse_keys(&mut a)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let at = parse_at_only(&mut a)?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = open_all(ctx, &names)?;
    let planned = (|| {
        let mut planned = Vec::with_capacity(opened.len());
        let mut statuses = Vec::with_capacity(opened.len());
        let mut released = Vec::with_capacity(opened.len());
        for o in &opened {
            match o.kind {
                Kind::Budget => {
                    let b = budget_of(o)?;
                    let now = b.now(wall);
                    let plan = b.plan_rollback(now, &policy, id).map_err(error_reply)?;
                    statuses.push(match plan.reply.0 {
                        RollbackStatus::RolledBack => "rolledback",
                        RollbackStatus::Duplicate => "duplicate",
                        RollbackStatus::Expired => "expired",
                    });
                    released.push(plan.reply.1);
                    planned.push(Planned::Budget {
                        now,
                        effects: plan.effects,
                    });
                }
                Kind::Window => {
                    let w = window_of(o)?;
                    let (status, n, effects) =
                        match w.plan_id_rollback(wall, id).map_err(error_reply)? {
                            IdPlan::RolledBack { released } => (
                                "rolledback",
                                released,
                                vec![WindowEffect::Rollback {
                                    id: Id::from_slice(id),
                                }],
                            ),
                            IdPlan::Duplicate => ("duplicate", 0, vec![]),
                            _ => ("skipped", 0, vec![]),
                        };
                    statuses.push(status);
                    released.push(n);
                    planned.push(Planned::Window { effects });
                }
            }
        }
        Ok::<_, RedisError>((planned, statuses, released))
    })();
    let (planned, statuses, released) = match planned {
        Ok(p) => p,
        Err(e) => return Err(abort(&mut opened, e)),
    };
    let values = apply_all(ctx, &mut opened, &planned, wall)?;
    stats::add(
        &stats::MROLLED_BACK,
        i64::try_from(statuses.iter().filter(|s| **s == "rolledback").count()).unwrap_or(0),
    );
    Ok(triples(&statuses, &released, &values))
}

/// `QUOTA.MEXTEND numkeys key [key ...] id ttl_ms [AT ms]` → one reply per key: a budget's
/// `ttl_ms` (as QUOTA.EXTEND's), nil for a window key (nothing to extend).
pub fn quota_mextend(ctx: &Context, args: &[RedisString]) -> RedisResult {
    let mut a = Args::new(args, 4)?;
    let names = parse_keys(&mut a)?;
    let id = a.next_bytes()?;
    check_id(id, config::MAX_ID_LENGTH_RANGE.1)?;
    let ttl = a.next_i64()?;
    if ttl <= 0 {
        return Err(RedisError::Str("ERR ttl_ms must be positive"));
    }
    let at = parse_at_only(&mut a)?;
    let wall = clock::command_ms(at)?;
    let policy = config::policy();
    let mut opened = open_all(ctx, &names)?;
    let planned = (|| {
        let mut planned = Vec::with_capacity(opened.len());
        for o in &opened {
            match o.kind {
                Kind::Budget => {
                    let b = budget_of(o)?;
                    let now = b.now(wall);
                    let plan = b.plan_extend(now, &policy, id, ttl).map_err(error_reply)?;
                    planned.push(Planned::Budget {
                        now,
                        effects: plan.effects,
                    });
                }
                Kind::Window => planned.push(Planned::Window { effects: vec![] }),
            }
        }
        Ok::<_, RedisError>(planned)
    })();
    let planned = match planned {
        Ok(p) => p,
        Err(e) => return Err(abort(&mut opened, e)),
    };
    apply_all(ctx, &mut opened, &planned, wall)?;
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
