//! Internal commands that carry effects to replicas and the AOF:
//! - `QUOTA.APPLY key <packed>` (see [`crate::shell::effects`]), one per write; the
//!   multi-argument form `QUOTA.APPLY key at_ms EFFECT args ...` of earlier versions still loads;
//! - `QUOTA.LOAD key type encver payload`, the exact state of a key of either type
//!   (`rq-budget` or `rq-window`), written by AOF rewrite. The legacy form
//!   `QUOTA.LOAD key encver payload` (budgets only, written before windows existed) still loads.
//!
//! `QUOTA.WAPPLY` (window effects) lives in [`crate::shell::window_apply`].
//!
//! All are accepted only from the master link or while loading: a client could otherwise
//! forge any state.

use redis_module::{Context, ContextFlags, RedisError, RedisResult, RedisString, RedisValue};

use crate::core::id::ParsedId;
use crate::core::ledger::{Budget, Effect};
use crate::shell::apply::{apply_counted_logged, Applied, Counts};
use crate::shell::args::{parse_i64, Args};
use crate::shell::budget_type::{BUDGET_TYPE, BUDGET_TYPE_NAME};
use crate::shell::effects::Logged;
use crate::shell::key::ModuleKey;
use crate::shell::usage::{self, UsageEntry};
use crate::shell::window_type::{WINDOW_TYPE, WINDOW_TYPE_NAME};
use crate::shell::{effects, events, persist, stats, sweep_index};

/// Is this call replaying the master's stream or the AOF?
pub(crate) fn from_replication_or_loading(ctx: &Context) -> bool {
    let flags = ctx.get_flags();
    flags.contains(ContextFlags::REPLICATED) || flags.contains(ContextFlags::LOADING)
}

pub(crate) fn internal_only(name: &str) -> RedisError {
    RedisError::String(format!(
        "ERR {name} is internal: it is accepted only from the master or while loading the AOF"
    ))
}

/// `QUOTA.APPLY key <packed>` or `QUOTA.APPLY key at_ms EFFECT args [EFFECT args ...]` → OK.
pub fn quota_apply(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !from_replication_or_loading(ctx) {
        return Err(internal_only("QUOTA.APPLY"));
    }
    let mut a = Args::new(&args, 2)?;
    let key_name = a.next_string()?;
    let (at, (list, logged)) = if args.len() == 3 {
        // One argument: the packed form.
        let tokens = effects::unpack(a.next_bytes()?)?;
        let (at, rest) = tokens.split_first().ok_or(RedisError::WrongArity)?;
        (
            parse_i64(at)?,
            effects::decode_logged(rest.iter().copied())?,
        )
    } else {
        let at = a.next_i64()?;
        let list = effects::decode_logged(args.iter().skip(3).map(RedisString::as_slice))?;
        (at, list)
    };
    if list.is_empty() {
        return Err(RedisError::WrongArity);
    }
    let result = apply_budget_at_key(ctx, key_name, at, &list, &logged)?;
    if result.applied > 0 {
        // Feeds this server's own AOF and sub-replicas.
        ctx.replicate_verbatim();
    }
    match result.error {
        Some(e) => Err(e),
        None => Ok(RedisValue::SimpleStringStatic("OK")),
    }
}

/// Applies one replicated line of budget effects at `at` to the budget at `key_name` (a first
/// `CONFIG` creates it), with what follows every change (events, counters, the sweeper's
/// index), and adds the usage entries the master added (`logged`, [`usage::rebuild`]);
/// replication is the caller's. Errors if the key cannot be opened or holds no budget and the
/// line does not create one, or (before anything changes) if the line has entries and the
/// usage stream key holds another type; otherwise returns how far the effects got.
pub(crate) fn apply_budget_at_key(
    ctx: &Context,
    key_name: &RedisString,
    at: i64,
    list: &[Effect],
    logged: &[Logged],
) -> Result<Applied, RedisError> {
    let mut key = ModuleKey::open_writable(ctx, key_name)?;
    let mut entries = Vec::new();
    let result = match key.value_mut::<Budget>(&BUDGET_TYPE)? {
        Some(budget) => {
            if !logged.is_empty() {
                if let Err(e) = check_replicated_stream(ctx, budget, list) {
                    key.unchanged();
                    return Err(e);
                }
            }
            let log = (!logged.is_empty()).then_some(&mut entries);
            let result = apply_counted_logged(
                ctx,
                key_name,
                budget,
                at,
                list,
                log,
                &mut ParsedId::default(),
            )
            .0;
            rebuild_usage(ctx, key_name, budget, at, &entries, logged);
            result
        }
        None => {
            // Only a CONFIG effect creates a budget.
            let Some(Effect::Configure { settings, .. }) = list.first() else {
                return Err(RedisError::Str("ERR QUOTA.APPLY: no budget at this key"));
            };
            let mut budget = Budget::new(**settings, at);
            if !logged.is_empty() {
                if let Err(e) = check_replicated_stream(ctx, &budget, list) {
                    key.unchanged();
                    return Err(e);
                }
            }
            let log = (!logged.is_empty()).then_some(&mut entries);
            let result = usage::apply_logged(&mut budget, at, list, log, &mut ParsedId::default());
            if result.applied > 0 {
                let counts = Counts::of(&budget);
                sweep_index::track_budget(
                    sweep_index::selected_db(ctx),
                    key_name.as_slice(),
                    &budget,
                );
                key.set_value(&BUDGET_TYPE, budget)?;
                counts.adopt();
                events::notify(
                    ctx,
                    key_name,
                    list.get(..result.applied).unwrap_or(&[]),
                    || 0,
                );
                if let Ok(Some(budget)) = key.value::<Budget>(&BUDGET_TYPE) {
                    rebuild_usage(ctx, key_name, budget, at, &entries, logged);
                }
            }
            result
        }
    };
    if result.applied == 0 {
        key.unchanged();
    }
    Ok(result)
}

/// [`usage::check_stream`] for a replicated line with entries: a stream key of another type
/// (impossible with the master's state) refuses the line before anything changes, logged.
fn check_replicated_stream(
    ctx: &Context,
    budget: &Budget,
    list: &[Effect],
) -> Result<(), RedisError> {
    usage::check_stream(ctx, budget, list).inspect_err(|_| {
        stats::add(&stats::USAGE_ERRORS, 1);
        ctx.log_warning(
            "quota: a replicated write was refused: its usage stream key is not a stream",
        );
    })
}

/// Adds the master's entries (`logged`) derived as `entries` to the budget's stream.
fn rebuild_usage(
    ctx: &Context,
    key_name: &RedisString,
    budget: &Budget,
    at: i64,
    entries: &[UsageEntry],
    logged: &[Logged],
) {
    if logged.is_empty() {
        return;
    }
    match budget.usage() {
        Some(log) => usage::rebuild(ctx, key_name, log, at, entries, logged),
        None => {
            stats::add(
                &stats::USAGE_ERRORS,
                i64::try_from(logged.len()).unwrap_or(i64::MAX),
            );
            ctx.log_warning("quota: a replicated usage entry names a budget without a stream");
        }
    }
}

/// `QUOTA.LOAD key type encver payload` (or legacy `QUOTA.LOAD key encver payload`, a budget)
/// → OK. Replaces the key's value with the decoded state; the type token says which decoder
/// (an encver alone does not name the type). A key of another type is refused with WRONGTYPE.
pub fn quota_load(ctx: &Context, args: Vec<RedisString>) -> RedisResult {
    if !from_replication_or_loading(ctx) {
        return Err(internal_only("QUOTA.LOAD"));
    }
    // The command name plus 3 arguments is the legacy form.
    let legacy = args.len() == 4;
    let mut a = Args::new(&args, if legacy { 3 } else { 4 })?;
    let key_name = a.next_string()?;
    let type_name: &[u8] = if legacy {
        BUDGET_TYPE_NAME.as_bytes()
    } else {
        a.next_bytes()?
    };
    let encver = i32::try_from(a.next_i64()?).map_err(|_| RedisError::Str("ERR bad encver"))?;
    let payload = a.next_bytes()?;
    if !a.is_empty() {
        return Err(RedisError::WrongArity);
    }
    let bad = |e: persist::DecodeError| RedisError::String(format!("ERR QUOTA.LOAD: {e}"));
    if type_name == BUDGET_TYPE_NAME.as_bytes() {
        let budget = persist::decode_budget(encver, payload).map_err(bad)?;
        let mut key = ModuleKey::open_writable(ctx, key_name)?;
        let counts = Counts::of(&budget);
        sweep_index::track_budget(sweep_index::selected_db(ctx), key_name.as_slice(), &budget);
        // Adopted only once stored, so the counters only ever see values Redis holds.
        key.set_value(&BUDGET_TYPE, budget)?;
        counts.adopt();
    } else if type_name == WINDOW_TYPE_NAME.as_bytes() {
        let window = persist::decode_window(encver, payload).map_err(bad)?;
        sweep_index::track_window(
            sweep_index::selected_db(ctx),
            key_name.as_slice(),
            &window,
            false,
        );
        ModuleKey::open_writable(ctx, key_name)?.set_value(&WINDOW_TYPE, window)?;
        stats::bump(&stats::WINDOW_KEYS);
    } else {
        return Err(RedisError::String(format!(
            "ERR QUOTA.LOAD: unknown type '{}'",
            crate::core::error::printable_id(type_name)
        )));
    }
    ctx.replicate_verbatim();
    Ok(RedisValue::SimpleStringStatic("OK"))
}
