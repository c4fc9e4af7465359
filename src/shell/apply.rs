//! Applying a plan's effects to a budget, and what follows every change: keyspace events, the
//! module counters (INFO), the sweeper's index, and on a master the replication of the effects
//! applied, and the usage log ([`crate::shell::usage`]: on a master, one stream entry per
//! event that finishes a reservation or changes `used`). Shared by the commands, the
//! replicated `QUOTA.APPLY`, the sweeper and the data type's callbacks (the counters).

use redis_module::{Context, RedisError, RedisString};

use crate::core::id::ParsedId;
use crate::core::ledger::{Budget, Effect, OnExpire, View};
use crate::shell::effects::Logged;
use crate::shell::usage::{self, UsageEntry};
use crate::shell::{events, replicate, stats, sweep_index};

/// Applies effects to a budget in place (master path), replicates the ones applied and adds
/// their usage entries to the budget's stream. Returns the budget's view at `at` afterwards,
/// or the error that stopped the effects (the ones before it are kept, replicated and
/// logged). A usage stream key holding another type refuses the write before anything is
/// applied (`WRONGTYPE`).
pub fn apply_and_propagate(
    ctx: &Context,
    key_name: &RedisString,
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
) -> Result<View, RedisError> {
    let logging = usage::may_log(budget, effects);
    // Checked, and left open for the entries (one budget: no other handle on the stream key).
    let held = if logging {
        usage::hold_stream(ctx, budget, effects)?
    } else {
        None
    };
    let mut log = Vec::new();
    let (result, view) = apply_counted_logged(
        ctx,
        key_name,
        budget,
        at,
        effects,
        logging.then_some(&mut log),
        &mut ParsedId::default(),
    );
    let view = view.unwrap_or_else(|| budget.view(at));
    let marks = write_usage(ctx, key_name, budget, at, &log, held);
    replicate_applied(ctx, key_name, at, effects, &result, &marks);
    match result.error {
        Some(e) => Err(e),
        None => Ok(view),
    }
}

/// [`apply_and_propagate`] without the view afterwards (the sweeper's, which has no use for
/// it).
pub fn apply_and_replicate(
    ctx: &Context,
    key_name: &RedisString,
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
) -> Applied {
    let mut log = Vec::new();
    let logging = usage::may_log(budget, effects).then_some(&mut log);
    let result = apply_counted_logged(
        ctx,
        key_name,
        budget,
        at,
        effects,
        logging,
        &mut ParsedId::default(),
    )
    .0;
    let marks = write_usage(ctx, key_name, budget, at, &log, None);
    replicate_applied(ctx, key_name, at, effects, &result, &marks);
    result
}

/// Adds usage entries to the budget's stream (through `held` if it is that stream's key, as
/// [`usage::hold_stream`] left it open), before the effects are replicated: returns the
/// `LOGGED` marks (entry ids, lengths) to replicate with them.
pub fn write_usage(
    ctx: &Context,
    key_name: &RedisString,
    budget: &Budget,
    at: i64,
    log: &[UsageEntry],
    held: Option<usage::HeldStream>,
) -> usage::Marks {
    match budget.usage() {
        Some(u) => usage::write(ctx, key_name, u, at, log, held),
        None => usage::Marks::new(),
    }
}

/// Replicates the effects `result` says were applied, and counts their releases of expired
/// reservations (INFO `quota_expired`, and by policy `quota_expired_charge`,
/// `quota_expired_elapsed`, `quota_expiry_charged`).
fn replicate_applied(
    ctx: &Context,
    key_name: &RedisString,
    at: i64,
    effects: &[Effect],
    result: &Applied,
    logged: &[Logged],
) {
    let applied = effects.get(..result.applied).unwrap_or(&[]);
    replicate::replicate_effects(ctx, key_name, at, applied, logged);
    count_releases(applied);
}

/// Counts the releases of expired reservations among applied effects (INFO `quota_expired`,
/// and by policy `quota_expired_charge`, `quota_expired_elapsed`, `quota_expiry_charged`).
pub(crate) fn count_releases(applied: &[Effect]) {
    stats::add(&stats::EXPIRED, releases(applied));
    for e in applied {
        if let Effect::Release {
            on_expire, charge, ..
        } = e
        {
            match on_expire {
                OnExpire::Release => continue,
                OnExpire::Charge => stats::bump(&stats::EXPIRED_CHARGE),
                OnExpire::Elapsed => stats::bump(&stats::EXPIRED_ELAPSED),
            }
            stats::add(&stats::EXPIRY_CHARGED, *charge);
        }
    }
}

/// Applies effects in place and does what follows any change, on a master or a replica alike:
/// publish their keyspace events, keep the module counters and the sweeper's index in step.
/// Replication is the caller's: effects on a master, verbatim on a replica. Returns how far
/// the effects got, and the view at `at` afterwards if the events needed it (a grant or
/// charge: `quota.exhausted`).
pub fn apply_counted(
    ctx: &Context,
    key_name: &RedisString,
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
) -> (Applied, Option<View>) {
    apply_counted_logged(
        ctx,
        key_name,
        budget,
        at,
        effects,
        None,
        &mut ParsedId::default(),
    )
}

/// [`apply_counted`], collecting the usage entries of the applied effects into `log` if given
/// (a master's write, or a replica's line with `LOGGED` marks).
pub fn apply_counted_logged(
    ctx: &Context,
    key_name: &RedisString,
    budget: &mut Budget,
    at: i64,
    effects: &[Effect],
    log: Option<&mut Vec<UsageEntry>>,
    ids: &mut ParsedId,
) -> (Applied, Option<View>) {
    let before = Counts::of(budget);
    let result = usage::apply_logged(budget, at, effects, log, ids);
    Counts::of(budget).record_since(&before);
    let applied = effects.get(..result.applied).unwrap_or(&[]);
    let budget = &*budget;
    let mut view = None;
    events::notify(ctx, key_name, applied, || {
        view.get_or_insert_with(|| budget.view(at)).available
    });
    sweep_index::track_budget(sweep_index::selected_db(ctx), key_name.as_slice(), budget);
    (result, view)
}

/// Pending and remembered counts of a budget, to keep the module-wide totals in step.
pub struct Counts {
    pending: i64,
    remembered: i64,
}

impl Counts {
    /// The counts of `b` now.
    pub fn of(b: &Budget) -> Counts {
        Counts {
            pending: i64::try_from(b.book().pending_len()).unwrap_or(i64::MAX),
            remembered: i64::try_from(b.book().finished_len()).unwrap_or(i64::MAX),
        }
    }

    /// Adds the change from `before` to the module totals.
    pub fn record_since(&self, before: &Counts) {
        stats::add(&stats::PENDING, self.pending.saturating_sub(before.pending));
        stats::add(
            &stats::REMEMBERED,
            self.remembered.saturating_sub(before.remembered),
        );
    }

    /// Adds a whole value (created or loaded) to the module totals.
    pub fn adopt(&self) {
        stats::add(&stats::PENDING, self.pending);
        stats::add(&stats::REMEMBERED, self.remembered);
        stats::bump(&stats::BUDGET_KEYS);
    }

    /// Removes a whole value (freed) from the module totals.
    pub fn drop_value(&self) {
        stats::add(&stats::PENDING, self.pending.saturating_neg());
        stats::add(&stats::REMEMBERED, self.remembered.saturating_neg());
        stats::add(&stats::BUDGET_KEYS, -1);
    }
}

/// How far a list of effects got.
pub struct Applied {
    /// How many effects, from the first, were applied.
    pub applied: usize,
    /// Why the next one was not (`None`: all were).
    pub error: Option<RedisError>,
}

/// Applies effects in order, stopping at the first that does not fit (nothing of it applied).
pub fn apply_all(budget: &mut Budget, at: i64, effects: &[Effect]) -> Applied {
    usage::apply_logged(budget, at, effects, None, &mut ParsedId::default())
}

/// How many of `effects` release an expired reservation.
pub fn releases(effects: &[Effect]) -> i64 {
    let n = effects
        .iter()
        .filter(|e| matches!(e, Effect::Release { .. }))
        .count();
    i64::try_from(n).unwrap_or(i64::MAX)
}
