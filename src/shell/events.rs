//! Module keyspace events (class `d`: subscribe with `notify-keyspace-events` containing `d`,
//! e.g. `KEA` or `Kd`), derived from the effects a write applied — so a replica applying the
//! same effects publishes the same events, in the same order.
//!
//! `quota.set`, `quota.reserve`, `quota.settle`, `quota.rollback`, `quota.expire`,
//! `quota.extend`, `quota.charge`, `quota.reset`, `quota.window`, and `quota.exhausted` when a
//! grant or charge leaves `available <= 0`. An expiry under `ONEXPIRE CHARGE` or `ELAPSED`
//! publishes `quota.expire-charge` or `quota.expire-elapsed` instead of `quota.expire`.

use std::ffi::CStr;

use redis_module::{raw, Context, NotifyEvent, RedisString};

use crate::core::ledger::{Effect, OnExpire};

/// The event an effect publishes, if any (forgetting an old id is silent).
fn event_of(effect: &Effect) -> Option<&'static CStr> {
    Some(match effect {
        Effect::Configure { .. } | Effect::Usage { .. } => c"quota.set",
        Effect::Reset { .. } => c"quota.reset",
        Effect::Grant { .. } => c"quota.reserve",
        Effect::Settle { .. } | Effect::SettleLate { .. } => c"quota.settle",
        Effect::Rollback { .. } => c"quota.rollback",
        Effect::Release { on_expire, .. } => match on_expire {
            OnExpire::Release => c"quota.expire",
            OnExpire::Charge => c"quota.expire-charge",
            OnExpire::Elapsed => c"quota.expire-elapsed",
        },
        Effect::Extend { .. } => c"quota.extend",
        Effect::Charge { .. } => c"quota.charge",
        Effect::Forget { .. } => return None,
    })
}

/// Publishes one module-class event (a C string literal: nothing to allocate on every write).
pub fn publish(ctx: &Context, key: &RedisString, name: &CStr) {
    // SAFETY: plain API call with a live context and key string.
    unsafe {
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(
                ctx.ctx,
                NotifyEvent::MODULE.bits(),
                name.as_ptr(),
                key.inner,
            );
        }
    }
}

/// Publishes the events of `effects` on `key`; `available_after` (called only after a grant
/// or charge) decides `quota.exhausted`.
pub fn notify(
    ctx: &Context,
    key: &RedisString,
    effects: &[Effect],
    available_after: impl FnOnce() -> i64,
) {
    let mut last = None;
    let mut spends = false;
    for e in effects {
        spends |= matches!(e, Effect::Grant { .. } | Effect::Charge { .. });
        if let Some(name) = event_of(e) {
            // One event per kind in a row: a sweep of 100 releases publishes one quota.expire.
            if last != Some(name) {
                publish(ctx, key, name);
                last = Some(name);
            }
        }
    }
    if spends && available_after() <= 0 {
        publish(ctx, key, c"quota.exhausted");
    }
}
