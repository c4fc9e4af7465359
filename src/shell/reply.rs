//! Reply helpers: field/value maps in a fixed order (a RESP3 map, a flat array in RESP2).

use redis_module::{raw, Context, RedisResult, RedisValue};

/// A value in a field/value reply.
pub enum Field {
    Int(i64),
    Str(String),
}

/// Replies with `fields` as a map, in the given order, and tells the caller's wrapper that the
/// reply was already sent.
pub fn reply_fields(ctx: &Context, fields: &[(&str, Field)]) -> RedisResult {
    let len = libc::c_long::try_from(fields.len()).unwrap_or(0);
    raw::reply_with_map(ctx.ctx, len);
    for (name, value) in fields {
        raw::reply_with_string_buffer(ctx.ctx, name.as_ptr().cast(), name.len());
        match value {
            Field::Int(n) => {
                raw::reply_with_long_long(ctx.ctx, *n);
            }
            Field::Str(s) => {
                raw::reply_with_string_buffer(ctx.ctx, s.as_ptr().cast(), s.len());
            }
        }
    }
    Ok(RedisValue::NoReply)
}
