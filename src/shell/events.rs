//! Module keyspace events (class `d`: subscribe with `notify-keyspace-events` containing `d`,
//! e.g. `KEA` or `Kd`), derived from the effects a write applied — so a replica applying the
//! same effects publishes the same events, in the same order.
//!
//! `quota.set`, `quota.reserve`, `quota.settle`, `quota.rollback`, `quota.expire`,
//! `quota.extend`, `quota.charge`, `quota.reset`, `quota.window`, and `quota.exhausted` when a
//! grant or charge leaves `available <= 0`.

use redis_module::{Context, NotifyEvent, RedisString};

use crate::core::ledger::Effect;

/// The event an effect publishes, if any (forgetting an old id is silent).
fn event_of(effect: &Effect) -> Option<&'static str> {
    Some(match effect {
        Effect::Configure { .. } => "quota.set",
        Effect::Reset { .. } => "quota.reset",
        Effect::Grant { .. } => "quota.reserve",
        Effect::Settle { .. } | Effect::SettleLate { .. } => "quota.settle",
        Effect::Rollback { .. } => "quota.rollback",
        Effect::Release { .. } => "quota.expire",
        Effect::Extend { .. } => "quota.extend",
        Effect::Charge { .. } => "quota.charge",
        Effect::Forget { .. } => return None,
    })
}

/// Publishes the events of `effects` on `key`; `available_after` decides `quota.exhausted`.
pub fn notify(ctx: &Context, key: &RedisString, effects: &[Effect], available_after: i64) {
    let mut last = None;
    let mut spends = false;
    for e in effects {
        spends |= matches!(e, Effect::Grant { .. } | Effect::Charge { .. });
        if let Some(name) = event_of(e) {
            // One event per kind in a row: a sweep of 100 releases publishes one quota.expire.
            if last != Some(name) {
                ctx.notify_keyspace_event(NotifyEvent::MODULE, name, key);
                last = Some(name);
            }
        }
    }
    if spends && available_after <= 0 {
        ctx.notify_keyspace_event(NotifyEvent::MODULE, "quota.exhausted", key);
    }
}

/// Publishes a single named event on `key`.
pub fn notify_one(ctx: &Context, key: &RedisString, name: &str) {
    ctx.notify_keyspace_event(NotifyEvent::MODULE, name, key);
}
