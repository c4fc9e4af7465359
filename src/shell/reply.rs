//! Reply helpers: field/value maps in a fixed order (a RESP3 map, a flat array in RESP2), and
//! the short arrays of the hot commands written straight to the client (no intermediate
//! `RedisValue` tree, no allocation).

use std::ffi::CStr;

use redis_module::{raw, Context, RedisError, RedisResult, RedisValue};

/// An element of a flat array reply.
pub enum Item<'a> {
    Int(i64),
    Bulk(&'a [u8]),
    Null,
    Status(&'static CStr),
}

/// A core error (ledger, period, window: their texts start with a Redis error code such as
/// `ERR`, `NOQUOTA`, `CONFLICT`) as an error reply.
pub fn error_reply(e: impl std::fmt::Display) -> RedisError {
    RedisError::String(e.to_string())
}

/// Replies with `items` as an array and tells the caller's wrapper that the reply was sent.
pub fn reply_array(ctx: &Context, items: &[Item]) -> RedisResult {
    let len = libc::c_long::try_from(items.len()).unwrap_or(0);
    raw::reply_with_array(ctx.ctx, len);
    for item in items {
        match item {
            Item::Int(n) => {
                raw::reply_with_long_long(ctx.ctx, *n);
            }
            Item::Bulk(b) => {
                raw::reply_with_string_buffer(ctx.ctx, b.as_ptr().cast(), b.len());
            }
            Item::Null => {
                raw::reply_with_null(ctx.ctx);
            }
            Item::Status(s) => {
                raw::reply_with_simple_string(ctx.ctx, s.as_ptr());
            }
        }
    }
    Ok(RedisValue::NoReply)
}

/// A value in a field/value reply.
pub enum Field {
    Int(i64),
    Str(String),
    /// Any bytes (a key name).
    Bytes(Vec<u8>),
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
            Field::Bytes(s) => {
                raw::reply_with_string_buffer(ctx.ctx, s.as_ptr().cast(), s.len());
            }
        }
    }
    Ok(RedisValue::NoReply)
}
