//! Multi-limit admission (issue 19), pure: one request planned against several limits at once
//! — budgets ([`Budget`]) and configured window keys ([`Window`]) — all or nothing. The shell
//! (`src/shell/multi_cmds.rs`) opens the keys, calls these, applies the effects and replies.
//!
//! Each key is planned with its own single-key rules ([`Budget::plan_reserve`],
//! [`Window::plan_id_reserve`], ...) at its own time: a budget at `Budget::now(wall)`, a window
//! at `wall` (moved up to its last time by the window itself). Nothing here changes a key; a
//! plan is a list of effects per key, applied only when every key has agreed:
//!
//! - **MRESERVE** grants iff every key grants. A key's error is the command's error. A denial
//!   reports the first key that denied and its retry time. With a client id, every key that
//!   knows the id as pending with the same amount answers a retry; a retry is granted again
//!   (the same id, nothing more taken) only if every listed key does; keys that know it and
//!   keys that do not is `CONFLICT` (a retry must name the same keys and amounts, in any order;
//!   when the key that does not know it is a window key, the error says its bucket may have
//!   left the window: a retry after the window is a new request).
//!   A subset of the original keys cannot be told from a retry and is answered as one.
//! - **MSETTLE / MROLLBACK / MEXTEND**: every key's plan must succeed (an id a listed budget
//!   does not know is `NORESERVATION`), else nothing changes anywhere. A window key that no
//!   longer remembers the id (its bucket left the window) is `skipped`, not an error; so is,
//!   in MSETTLE, a window key whose id was rolled back (its count was given back: a window is
//!   a rate limit, not the bill), so the budgets' late charges are not lost.

use smallvec::SmallVec;

use crate::core::book::Id;
use crate::core::error::LedgerError;
use crate::core::id::StreamId;
use crate::core::ledger::{
    Budget, Effects, Policy, ReserveReply, RollbackStatus, SettleStatus, NO_ID_LEFT,
};
use crate::core::window::{IdPlan, Window, WindowEffect, NOT_CONFIGURED};

/// A window key's planned effects: at most one in every plan here, held inline (no
/// allocation per key on the write path).
pub type WindowEffects = SmallVec<[WindowEffect; 1]>;

/// A multi-key command's error and the listed key it is about: `index` is that key's
/// 0-based position in the command (`None` for an error about the request as a whole, e.g.
/// the wrong number of amounts). Displays as `error` (its code first); the shell appends the
/// key's name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeyError {
    pub index: Option<usize>,
    pub error: LedgerError,
}

impl KeyError {
    /// `error` at the listed key `index`.
    #[cold]
    pub fn at(index: usize, error: impl Into<LedgerError>) -> Self {
        KeyError {
            index: Some(index),
            error: error.into(),
        }
    }
}

impl From<LedgerError> for KeyError {
    fn from(error: LedgerError) -> Self {
        KeyError { index: None, error }
    }
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        self.error.fmt(f)
    }
}

impl std::error::Error for KeyError {}

/// One key of a multi-key command, as stored.
#[derive(Clone, Copy)]
pub enum Limit<'a> {
    Budget(&'a Budget),
    Window(&'a Window),
}

/// The effects planned for one key, in key order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum KeyEffects {
    /// A budget's effects, at the budget's time `now`.
    Budget { now: i64, effects: Effects },
    /// A window's effects, at the command's time.
    Window(WindowEffects),
}

impl KeyEffects {
    /// True if the key changes.
    pub fn is_empty(&self) -> bool {
        match self {
            KeyEffects::Budget { effects, .. } => effects.is_empty(),
            KeyEffects::Window(effects) => effects.is_empty(),
        }
    }
}

/// What MRESERVE decided.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum MReserve {
    /// Every key grants: the id, the effects per key, and each window key's remaining after
    /// the grant (its check's, less its amount: no second pass over its buckets), `None` at
    /// a budget key (known once its effects are applied).
    Granted {
        id: Id,
        effects: Vec<KeyEffects>,
        remaining: SmallVec<[Option<i64>; 8]>,
    },
    /// Every key knows the id as pending with the same amount: nothing more is taken.
    Retried { id: Id },
    /// `index`: the first key that denied; `retry_after_ms` its (a window's exact retry, a
    /// budget's period end or -1).
    Denied { index: usize, retry_after_ms: i64 },
}

/// What MRESERVE decided, as [`plan_mreserve_into`] returns it: a grant's effects and
/// remainings are in the caller's [`Planned`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Decision {
    /// Every key grants: [`Planned`] holds each key's effects and remaining.
    Granted { id: Id },
    /// As [`MReserve::Retried`].
    Retried { id: Id },
    /// As [`MReserve::Denied`].
    Denied { index: usize, retry_after_ms: i64 },
}

/// A grant's plan, per key in key order, kept where the caller keeps it (the shell: on its
/// stack, so neither an allocation nor a move of ~140 bytes a key): the effects, and each
/// window key's remaining after the grant (`None` at a budget key), as in
/// [`MReserve::Granted`].
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Planned {
    pub effects: SmallVec<[KeyEffects; 8]>,
    pub remaining: SmallVec<[Option<i64>; 8]>,
}

/// The status of one key in MSETTLE / MROLLBACK.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KeyStatus {
    /// A budget's pending reservation settled.
    Settled,
    /// A budget's expired reservation settled (late).
    Late,
    /// A window's count corrected to the actual.
    Corrected,
    /// Rolled back (a budget's reservation released, or a window's count given back).
    RolledBack,
    /// Already settled with this actual, or already rolled back: nothing changes.
    Duplicate,
    /// A budget's reservation had expired: nothing to roll back.
    Expired,
    /// A window key no longer remembers the id (its bucket left the window): nothing changes.
    Skipped,
}

impl KeyStatus {
    /// The status word of the reply.
    pub fn name(self) -> &'static str {
        match self {
            KeyStatus::Settled => "settled",
            KeyStatus::Late => "late",
            KeyStatus::Corrected => "corrected",
            KeyStatus::RolledBack => "rolledback",
            KeyStatus::Duplicate => "duplicate",
            KeyStatus::Expired => "expired",
            KeyStatus::Skipped => "skipped",
        }
    }
}

/// One key's part of an MSETTLE or MROLLBACK: status, amount (charged or released), effects.
pub type KeyOutcome = (KeyStatus, i64, KeyEffects);

/// The value a reply shows for a key at `wall`: a budget's available, a window's remaining
/// under its configuration (-1 without one).
pub fn value(limit: Limit<'_>, wall: i64) -> i64 {
    match limit {
        Limit::Budget(b) => b.view(b.now(wall)).available,
        Limit::Window(w) => match w.config() {
            Some(c) => w.check(&c.params(0), wall).map_or(-1, |d| d.remaining),
            None => -1,
        },
    }
}

/// A fresh id for a multi-key reservation at `wall`: stream-style `<ms>-<seq>`, at least the
/// largest of the successors of the listed budgets' last generated ids (each at the budget's
/// clock), and known to none of the keys (probing at most 1024 ids from there).
///
/// # Errors
///
/// A budget's id generator is exhausted, or 1024 ids in a row are taken.
pub fn fresh_id(limits: &[Limit<'_>], wall: i64) -> Result<Id, LedgerError> {
    let mut candidate = first_candidate(limits, wall)?;
    for _ in 0..1024 {
        let id = candidate.to_bytes();
        let taken = limits.iter().any(|l| match l {
            Limit::Budget(b) => b.book().get(&id).is_some(),
            Limit::Window(w) => w.remembered().get(&id).is_some(),
        });
        if !taken {
            return Ok(id);
        }
        candidate = candidate
            .next(wall)
            .ok_or(LedgerError::Invalid("could not generate a fresh id"))?;
    }
    Err(LedgerError::Invalid("could not generate a fresh id"))
}

/// The first id [`fresh_id`] tries: the largest of the successors of the listed budgets' last
/// generated ids (each at the budget's clock; `<wall>-0` without a budget), without each
/// budget's own probe and string round trip.
///
/// # Errors
///
/// A budget's id generator is exhausted.
fn first_candidate(limits: &[Limit<'_>], wall: i64) -> Result<StreamId, LedgerError> {
    let mut best: Option<StreamId> = None;
    for limit in limits {
        if let Limit::Budget(b) = limit {
            let next = b.last_id.next(b.now(wall)).ok_or(NO_ID_LEFT)?;
            best = best.max(Some(next));
        }
    }
    Ok(best.unwrap_or(StreamId {
        ms: u64::try_from(wall).unwrap_or(0),
        seq: 0,
    }))
}

fn window_config(w: &Window) -> Result<crate::core::window::WindowConfig, LedgerError> {
    w.config()
        .copied()
        .ok_or(LedgerError::Invalid(NOT_CONFIGURED))
}

/// QUOTA.MRESERVE: `amounts[i]` on `limits[i]` under `id` (generated if `None`), budgets
/// with `ttl_ms` (their default if `None`), windows remembering at most `policy.max_pending`
/// ids.
///
/// # Errors
///
/// Each error names the key it is about ([`KeyError::index`]): `amounts` not one per key,
/// or negative (none); a key's error (`TOOLARGE`, `LIMIT`, `CONFLICT`, an
/// overflow, a window without configuration); `CONFLICT` when some keys know the id and others
/// do not (at the first key that does not).
pub fn plan_mreserve(
    limits: &[Limit<'_>],
    amounts: &[i64],
    id: Option<&[u8]>,
    ttl_ms: Option<i64>,
    wall: i64,
    policy: &Policy,
) -> Result<MReserve, KeyError> {
    plan_mreserve_keep(limits, amounts, id, ttl_ms, None, wall, policy)
}

/// [`plan_mreserve`] with `KEEP keep` (issue 22): every budget key grants only if its
/// `available` after the grant stays `>= keep` ([`Budget::plan_reserve_keep`]); window keys
/// ignore it.
///
/// # Errors
///
/// Those of [`plan_mreserve`], and `keep < 0`.
pub fn plan_mreserve_keep(
    limits: &[Limit<'_>],
    amounts: &[i64],
    id: Option<&[u8]>,
    ttl_ms: Option<i64>,
    keep: Option<i64>,
    wall: i64,
    policy: &Policy,
) -> Result<MReserve, KeyError> {
    let mut planned = Planned::default();
    Ok(
        match plan_mreserve_into(
            limits,
            amounts,
            id,
            ttl_ms,
            keep,
            wall,
            policy,
            &mut planned,
        )? {
            Decision::Granted { id } => MReserve::Granted {
                id,
                effects: planned.effects.into_vec(),
                remaining: planned.remaining,
            },
            Decision::Retried { id } => MReserve::Retried { id },
            Decision::Denied {
                index,
                retry_after_ms,
            } => MReserve::Denied {
                index,
                retry_after_ms,
            },
        },
    )
}

/// [`plan_mreserve_keep`] with a grant's effects and remainings written into `planned`
/// (cleared first; left with whatever the last plan wrote on any other outcome).
///
/// # Errors
///
/// Those of [`plan_mreserve_keep`].
#[allow(clippy::too_many_arguments)]
pub fn plan_mreserve_into(
    limits: &[Limit<'_>],
    amounts: &[i64],
    id: Option<&[u8]>,
    ttl_ms: Option<i64>,
    keep: Option<i64>,
    wall: i64,
    policy: &Policy,
    planned: &mut Planned,
) -> Result<Decision, KeyError> {
    if keep.is_some_and(|k| k < 0) {
        return Err(LedgerError::Invalid("KEEP must not be negative").into());
    }
    if amounts.len() != limits.len() || limits.is_empty() {
        return Err(LedgerError::Invalid("one amount per key").into());
    }
    let mut reserve =
        |id: Id| plan_mreserve_as(limits, amounts, id, ttl_ms, keep, wall, policy, planned);
    let Some(id) = id else {
        // A generated id: the first candidate, without probing every key for it first. Each
        // key's plan looks the id up anyway (a budget in its book, a window in its
        // remembered ids) before it grants or denies: a key that knows it answers a retry or
        // an error instead. So a grant or a denial proves that no key knows the candidate;
        // anything else (rare: a client id planted ahead, another request's id in a shared
        // window, or any error) is planned again, as before, with an id probed on every key.
        let decided = reserve(first_candidate(limits, wall)?.to_bytes());
        return match decided {
            Ok(Decision::Granted { .. } | Decision::Denied { .. }) => decided,
            _ => reserve(fresh_id(limits, wall)?),
        };
    };
    reserve(Id::from_slice(id))
}

/// [`plan_mreserve_into`] under `id` (given or generated).
#[allow(clippy::too_many_arguments)]
fn plan_mreserve_as(
    limits: &[Limit<'_>],
    amounts: &[i64],
    id: Id,
    ttl_ms: Option<i64>,
    keep: Option<i64>,
    wall: i64,
    policy: &Policy,
    planned: &mut Planned,
) -> Result<Decision, KeyError> {
    planned.effects.clear();
    planned.remaining.clear();
    let mut retried = 0usize;
    let mut denied: Option<(usize, i64)> = None;
    // The first key that does not know the id: the one at fault when others do (a retry),
    // and whether it is a window key.
    let mut first_fresh: Option<(usize, bool)> = None;
    for (i, (limit, &amount)) in limits.iter().zip(amounts).enumerate() {
        match limit {
            Limit::Budget(b) => {
                let now = b.now(wall);
                let plan = b
                    .plan_reserve_keep(now, policy, amount, Some(&id), ttl_ms, keep)
                    .map_err(|e| KeyError::at(i, e))?;
                match plan.reply {
                    ReserveReply::Retried { .. } => retried = retried.saturating_add(1),
                    ReserveReply::Granted { .. } => first_fresh = first_fresh.or(Some((i, false))),
                    ReserveReply::Denied => {
                        first_fresh = first_fresh.or(Some((i, false)));
                        denied = denied.or(Some((i, b.retry_after_keep(now, amount, keep))));
                    }
                }
                planned.effects.push(KeyEffects::Budget {
                    now,
                    effects: plan.effects,
                });
                planned.remaining.push(None);
            }
            Limit::Window(w) => {
                let cfg = window_config(w).map_err(|e| KeyError::at(i, e))?;
                let mut after = None;
                let effects = match w
                    .plan_id_reserve(wall, &id, amount, policy.max_pending)
                    .map_err(|e| KeyError::at(i, e))?
                {
                    IdPlan::Retried => {
                        retried = retried.saturating_add(1);
                        WindowEffects::new()
                    }
                    IdPlan::Denied(d) => {
                        first_fresh = first_fresh.or(Some((i, true)));
                        denied = denied.or(Some((i, d.retry_after_ms)));
                        WindowEffects::new()
                    }
                    plan => {
                        first_fresh = first_fresh.or(Some((i, true)));
                        if let IdPlan::Grant(d) = plan {
                            after = w.remaining_after_admitted(&d, cfg.precision_ms, amount);
                        }
                        smallvec::smallvec![WindowEffect::Count {
                            window_ms: cfg.window_ms,
                            precision_ms: cfg.precision_ms,
                            cost: amount,
                            // A memcpy; `clone` copies byte by byte.
                            id: Some(Id::from_slice(&id)),
                        }]
                    }
                };
                planned.effects.push(KeyEffects::Window(effects));
                planned.remaining.push(after);
            }
        }
    }
    if let (true, Some((i, window))) = (retried > 0, first_fresh) {
        return Err(KeyError::at(i, retry_conflict(&id, window)));
    }
    Ok(match denied {
        _ if retried > 0 => Decision::Retried { id },
        Some((index, retry_after_ms)) => Decision::Denied {
            index,
            retry_after_ms,
        },
        None => Decision::Granted { id },
    })
}

/// The `CONFLICT` of a retry that some listed keys know as pending and the key at fault
/// does not. A window key forgets an id once its bucket leaves the window (e.g. after 60 s
/// for a TPM window): the retry rule cannot hold past that, so the error says so.
#[cold]
fn retry_conflict(id: &[u8], window: bool) -> LedgerError {
    LedgerError::Conflict {
        id: id.to_vec(),
        // Pending elsewhere; this key does not know it.
        state: "pending on other listed keys",
        why: if window {
            "a retry must name the same keys and amounts, and this window key does not \
             remember it (its bucket left the window, or it was not listed): a retry after the \
             window is a new request (a new ID)"
        } else {
            "a retry must name the same keys and amounts"
        },
    }
}

/// QUOTA.MSETTLE: `actuals[i]` on `limits[i]` for `id`. One outcome per key: budgets as
/// QUOTA.SETTLE (charged = the actual), windows `corrected`, `duplicate` or `skipped` (the
/// actual; `skipped` when the window no longer remembers the id or rolled it back).
///
/// # Errors
///
/// `actuals` not one per key, or negative; any key's error (`NORESERVATION`, `CONFLICT`, an
/// overflow, a window without configuration).
pub fn plan_msettle(
    limits: &[Limit<'_>],
    id: &[u8],
    actuals: &[i64],
    wall: i64,
    policy: &Policy,
) -> Result<Vec<KeyOutcome>, KeyError> {
    let actuals: Vec<Actual> = actuals.iter().map(|&a| Actual::Units(a)).collect();
    plan_msettle_actuals(limits, id, &actuals, wall, policy)
}

/// What MSETTLE charges a key (issue 22).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Actual {
    /// This many units.
    Units(i64),
    /// `ELAPSED`: the time since the grant in the budget's UNIT
    /// ([`Budget::plan_settle_elapsed`]); budget keys only.
    Elapsed,
}

/// [`plan_msettle`] where a key's actual may be [`Actual::Elapsed`]: charged (and answered)
/// as `QUOTA.SETTLE key id ELAPSED` would.
///
/// # Errors
///
/// Those of [`plan_msettle`]; `ELAPSED` on a window key, or on a budget without a UNIT, or
/// for an expired reservation.
pub fn plan_msettle_actuals(
    limits: &[Limit<'_>],
    id: &[u8],
    actuals: &[Actual],
    wall: i64,
    policy: &Policy,
) -> Result<Vec<KeyOutcome>, KeyError> {
    if actuals.len() != limits.len() || limits.is_empty() {
        return Err(LedgerError::Invalid("one actual per key").into());
    }
    let mut out = Vec::with_capacity(limits.len());
    for (i, (limit, &given)) in limits.iter().zip(actuals).enumerate() {
        let actual = match (limit, given) {
            (_, Actual::Units(n)) => n,
            (Limit::Budget(_), Actual::Elapsed) => 0,
            (Limit::Window(_), Actual::Elapsed) => {
                return Err(KeyError::at(
                    i,
                    LedgerError::Invalid("ELAPSED settles budget keys only (a window has no UNIT)"),
                ))
            }
        };
        out.push(match limit {
            Limit::Budget(b) => {
                let now = b.now(wall);
                let plan = match given {
                    Actual::Units(_) => b.plan_settle(now, policy, id, actual),
                    Actual::Elapsed => b.plan_settle_elapsed(now, policy, id),
                }
                .map_err(|e| KeyError::at(i, e))?;
                let status = match plan.reply.0 {
                    SettleStatus::Settled => KeyStatus::Settled,
                    SettleStatus::Late => KeyStatus::Late,
                    SettleStatus::Duplicate => KeyStatus::Duplicate,
                };
                let effects = KeyEffects::Budget {
                    now,
                    effects: plan.effects,
                };
                (status, plan.reply.1, effects)
            }
            Limit::Window(w) => {
                window_config(w).map_err(|e| KeyError::at(i, e))?;
                let (status, effects) = match w
                    .plan_id_settle(wall, id, actual)
                    .map_err(|e| KeyError::at(i, e))?
                {
                    IdPlan::Corrected { .. } => (
                        KeyStatus::Corrected,
                        smallvec::smallvec![WindowEffect::Settle {
                            id: Id::from_slice(id),
                            actual,
                        }],
                    ),
                    IdPlan::Duplicate => (KeyStatus::Duplicate, WindowEffects::new()),
                    _ => (KeyStatus::Skipped, WindowEffects::new()),
                };
                (status, actual, KeyEffects::Window(effects))
            }
        });
    }
    Ok(out)
}

/// QUOTA.MROLLBACK: releases `id` on every key. One outcome per key: budgets as
/// QUOTA.ROLLBACK, windows `rolledback` (what it counted, given back), `duplicate` or
/// `skipped`.
///
/// # Errors
///
/// Any key's error (`NORESERVATION`, `CONFLICT`, a window without configuration).
pub fn plan_mrollback(
    limits: &[Limit<'_>],
    id: &[u8],
    wall: i64,
    policy: &Policy,
) -> Result<Vec<KeyOutcome>, KeyError> {
    let mut out = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        out.push(match limit {
            Limit::Budget(b) => {
                let now = b.now(wall);
                let plan = b
                    .plan_rollback(now, policy, id)
                    .map_err(|e| KeyError::at(i, e))?;
                let status = match plan.reply.0 {
                    RollbackStatus::RolledBack => KeyStatus::RolledBack,
                    RollbackStatus::Duplicate => KeyStatus::Duplicate,
                    RollbackStatus::Expired => KeyStatus::Expired,
                };
                let effects = KeyEffects::Budget {
                    now,
                    effects: plan.effects,
                };
                (status, plan.reply.1, effects)
            }
            Limit::Window(w) => {
                window_config(w).map_err(|e| KeyError::at(i, e))?;
                let (status, released, effects) = match w
                    .plan_id_rollback(wall, id)
                    .map_err(|e| KeyError::at(i, e))?
                {
                    IdPlan::RolledBack { released } => (
                        KeyStatus::RolledBack,
                        released,
                        smallvec::smallvec![WindowEffect::Rollback {
                            id: Id::from_slice(id),
                        }],
                    ),
                    IdPlan::Duplicate => (KeyStatus::Duplicate, 0, WindowEffects::new()),
                    _ => (KeyStatus::Skipped, 0, WindowEffects::new()),
                };
                (status, released, KeyEffects::Window(effects))
            }
        });
    }
    Ok(out)
}

/// QUOTA.MEXTEND: every budget's pending reservation `id` now expires at its `now + ttl_ms`;
/// window keys have nothing to extend (no effects).
///
/// # Errors
///
/// Any budget's error (`NORESERVATION`, `CONFLICT`, a bad TTL); a window without
/// configuration.
pub fn plan_mextend(
    limits: &[Limit<'_>],
    id: &[u8],
    ttl_ms: i64,
    wall: i64,
    policy: &Policy,
) -> Result<Vec<KeyEffects>, KeyError> {
    let mut out = Vec::with_capacity(limits.len());
    for (i, limit) in limits.iter().enumerate() {
        out.push(match limit {
            Limit::Budget(b) => {
                let now = b.now(wall);
                let plan = b
                    .plan_extend(now, policy, id, ttl_ms)
                    .map_err(|e| KeyError::at(i, e))?;
                KeyEffects::Budget {
                    now,
                    effects: plan.effects,
                }
            }
            Limit::Window(w) => {
                window_config(w).map_err(|e| KeyError::at(i, e))?;
                KeyEffects::Window(WindowEffects::new())
            }
        });
    }
    Ok(out)
}
