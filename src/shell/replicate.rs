//! Replication of effects: one `QUOTA.APPLY key at_ms EFFECT ...` per write, which Redis sends to
//! replicas and the AOF (wrapped in MULTI/EXEC with anything else the call replicates).

use redis_module::{raw, Context, RedisString};

use crate::core::ledger::Effect;
use crate::shell::effects;

/// Replicates `effects` for `key` at `at_ms`. Logs (never panics) if Redis refuses, which would
/// mean a misspelt command name: replicas would silently miss the write.
pub fn replicate_effects(ctx: &Context, key: &RedisString, at_ms: i64, list: &[Effect]) {
    if list.is_empty() {
        return;
    }
    let mut tokens: Vec<Vec<u8>> =
        Vec::with_capacity(list.len().saturating_mul(4).saturating_add(2));
    tokens.push(key.as_slice().to_vec());
    tokens.push(at_ms.to_string().into_bytes());
    for e in list {
        effects::encode(e, &mut tokens);
    }
    replicate_tokens(ctx, "QUOTA.APPLY", &tokens);
}

/// Replicates `command tokens...` checking the status.
pub fn replicate_tokens(ctx: &Context, command: &str, tokens: &[Vec<u8>]) {
    let refs: Vec<&[u8]> = tokens.iter().map(Vec::as_slice).collect();
    if raw::replicate(ctx.ctx, command, refs.as_slice()) == raw::Status::Err {
        ctx.log_warning("quota: replication of an effect was refused by Redis");
    }
}
