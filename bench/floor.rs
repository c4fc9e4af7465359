//! `libapifloor.so`: the module API floor of a quota write, loaded next to redis-quota by
//! `make bench` so that the table can say what a write costs before any ledger work.
//!
//! `FLOOR.WRITE key` makes exactly the Redis module API calls a granted `QUOTA.RESERVE` makes,
//! registered the same way (a C command function that borrows argv, as
//! `src/shell/command.rs` does for the write commands), and nothing else: it opens `key` writable
//! (and closes it, which signals it), publishes one keyspace event, replicates one packed string
//! the size of a RESERVE's effects with `RedisModule_Replicate` ("sb"), and replies with a
//! four-element array shaped like a grant (`[1, id, available, 0]`).
//!
//! `FLOOR.MWRITE 5 k1 k2 k3 k4 k5 ...` does the same for a granted 5-key `QUOTA.MRESERVE`: each
//! key opened writable, type checked, given one keyspace event and closed; one `QUOTA.MAPPLY`-
//! sized compact line replicated with its numkeys and keys ("lsssssb"); the grant's reply
//! (`[1, id, -1, 0, [5 values]]`). Anything after the keys is ignored.
//!
//! `FLOOR.NOP` exists only as the replicated command's name (`RedisModule_Replicate` refuses
//! unknown names); the bench server has no replica and no AOF, as for every workload.
//!
//! Not part of the product: an example target (`cargo build --release --example apifloor`).

#![allow(clippy::missing_safety_doc)]
// Module code, loaded into Redis: held to the library's no-panic lints.
#![deny(
    clippy::unwrap_used,
    clippy::expect_used,
    clippy::indexing_slicing,
    clippy::arithmetic_side_effects,
    clippy::panic
)]

use std::os::raw::{c_char, c_int};

use redis_module::{
    raw, redis_module, Context, RedisError, RedisResult, RedisString, RedisValue, Status,
};

/// What a RESERVE replicates: `<at> GRANT <len>:<id> <amount> <deadline>` (same length).
const PACKED: &[u8] = b"1764485000000 GRANT 15:1764485000000-0 5 1764488600000";
const ID: &[u8] = b"1764485000000-0";
/// What a 5-key MRESERVE replicates after its numkeys and keys (`QUOTA.MAPPLY`'s compact form,
/// same length).
const MPACKED: &[u8] =
    b"R 1764485000000 15:1764485000000-0 D 1000 1764485060000 B 1000 B 1000 W 1000 1000 1 W 1000 1000 1000";
/// Keys of `FLOOR.MWRITE`.
const MKEYS: usize = 5;

extern "C" fn floor_write_c(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let key = if argc == 2 && !argv.is_null() {
        // SAFETY: Redis passes `argc` live argument strings.
        unsafe { *argv.add(1) }
    } else {
        std::ptr::null_mut()
    };
    let result = if key.is_null() {
        Err(RedisError::WrongArity)
    } else {
        // Borrowed, never released (Redis owns it for the call).
        let key = std::mem::ManuallyDrop::new(RedisString::from_redis_module_string(ctx, key));
        floor_write(&context, &key)
    };
    context.reply(result) as c_int
}

/// Opens `key_name` writable, reads its type (as a command does before reading its value),
/// publishes one keyspace event, and closes it.
fn touch(ctx: &Context, key_name: &RedisString) {
    let key = ctx.open_key_writable(key_name);
    let _ = key.key_type();
    // SAFETY: plain API call with a live context and key string.
    unsafe {
        if let Some(notify) = raw::RedisModule_NotifyKeyspaceEvent {
            notify(
                ctx.ctx,
                redis_module::NotifyEvent::MODULE.bits(),
                c"floor.write".as_ptr(),
                key_name.inner,
            );
        }
    }
}

fn floor_write(ctx: &Context, key_name: &RedisString) -> RedisResult {
    touch(ctx, key_name);
    // SAFETY: a live context, key string and static buffer for the duration of the call.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                c"FLOOR.NOP".as_ptr(),
                c"sb".as_ptr(),
                key_name.inner,
                PACKED.as_ptr().cast::<c_char>(),
                PACKED.len(),
            );
        }
    }
    raw::reply_with_array(ctx.ctx, 4);
    raw::reply_with_long_long(ctx.ctx, 1);
    raw::reply_with_string_buffer(ctx.ctx, ID.as_ptr().cast(), ID.len());
    raw::reply_with_long_long(ctx.ctx, 999);
    raw::reply_with_long_long(ctx.ctx, 0);
    Ok(RedisValue::NoReply)
}

extern "C" fn floor_mwrite_c(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
) -> c_int {
    let context = Context::new(ctx);
    let mut keys = [std::ptr::null_mut::<raw::RedisModuleString>(); MKEYS];
    let enough = usize::try_from(argc).is_ok_and(|n| n >= MKEYS.saturating_add(2));
    if enough && !argv.is_null() {
        for (i, k) in (2usize..).zip(keys.iter_mut()) {
            // SAFETY: Redis passes `argc` live argument strings, and `argc >= 2 + MKEYS`.
            *k = unsafe { *argv.add(i) };
        }
    }
    let result = if keys.iter().any(|k| k.is_null()) {
        Err(RedisError::WrongArity)
    } else {
        floor_mwrite(&context, &keys)
    };
    context.reply(result) as c_int
}

fn floor_mwrite(ctx: &Context, keys: &[*mut raw::RedisModuleString; MKEYS]) -> RedisResult {
    for &k in keys {
        // Borrowed, never released (Redis owns it for the call).
        let key = std::mem::ManuallyDrop::new(RedisString::from_redis_module_string(ctx.ctx, k));
        touch(ctx, &key);
    }
    let [k0, k1, k2, k3, k4] = *keys;
    // SAFETY: a live context, key strings and static buffer for the duration of the call; the
    // format names exactly the arguments passed.
    unsafe {
        if let Some(replicate) = raw::RedisModule_Replicate {
            replicate(
                ctx.ctx,
                c"FLOOR.NOP".as_ptr(),
                c"lsssssb".as_ptr(),
                MKEYS as std::os::raw::c_longlong,
                k0,
                k1,
                k2,
                k3,
                k4,
                MPACKED.as_ptr().cast::<c_char>(),
                MPACKED.len(),
            );
        }
    }
    raw::reply_with_array(ctx.ctx, 5);
    raw::reply_with_long_long(ctx.ctx, 1);
    raw::reply_with_string_buffer(ctx.ctx, ID.as_ptr().cast(), ID.len());
    raw::reply_with_long_long(ctx.ctx, -1);
    raw::reply_with_long_long(ctx.ctx, 0);
    raw::reply_with_array(ctx.ctx, 5);
    for v in [
        999_999_999_999_000,
        999_999_999_999_000,
        999_999_999_999_000,
        999_999_999,
        999_999_000,
    ] {
        raw::reply_with_long_long(ctx.ctx, v);
    }
    Ok(RedisValue::NoReply)
}

fn floor_nop(_: &Context, _: Vec<RedisString>) -> RedisResult {
    Ok(RedisValue::SimpleStringStatic("OK"))
}

fn init(ctx: &Context, _: &[RedisString]) -> Status {
    // SAFETY: the load context is live; the strings are static and NUL-terminated.
    let created = unsafe {
        raw::RedisModule_CreateCommand.map(|create| {
            create(
                ctx.ctx,
                c"FLOOR.WRITE".as_ptr(),
                Some(floor_write_c),
                c"write deny-oom fast".as_ptr(),
                1,
                1,
                1,
            )
        })
    };
    // SAFETY: as above.
    let created_m = unsafe {
        raw::RedisModule_CreateCommand.map(|create| {
            create(
                ctx.ctx,
                c"FLOOR.MWRITE".as_ptr(),
                Some(floor_mwrite_c),
                c"write deny-oom fast".as_ptr(),
                2,
                6,
                1,
            )
        })
    };
    if created == Some(raw::REDISMODULE_OK as c_int) && created_m == created {
        Status::Ok
    } else {
        Status::Err
    }
}

redis_module! {
    name: "apifloor",
    version: 1,
    allocator: (redis_module::alloc::RedisAlloc, redis_module::alloc::RedisAlloc),
    data_types: [],
    init: init,
    commands: [
        ["FLOOR.NOP", floor_nop, "write", 1, 1, 1, ""],
    ],
}
