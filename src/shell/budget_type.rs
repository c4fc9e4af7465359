//! The `rq-budget` module data type: RDB save/load, AOF rewrite, digest, MEMORY USAGE, COPY, free.
//!
//! All callbacks are `extern "C"` and must never unwind into Redis: they only call code that
//! returns errors (no panics on loaded data), and `free` touches no Redis API (it may run on the
//! lazy-free thread).

use std::os::raw::{c_int, c_void};

use redis_module::{logging, native_types::RedisType, raw};

use crate::core::ledger::Budget;
use crate::shell::apply::Counts;
use crate::shell::log_limit::{with_held_back, LogLimit};
use crate::shell::persist::{decode_budget, encode_budget, BUDGET_ENCVER};
use crate::shell::sweep_index;
use crate::shell::type_methods::{add_digest, emit_load, type_methods, TypeCallbacks};

/// The type's name, also the type token of `QUOTA.LOAD`.
pub const BUDGET_TYPE_NAME: &str = "rq-budget";

/// The budget type. The 9-character name and the encver go into every RDB: never rename it.
pub static BUDGET_TYPE: RedisType = RedisType::new(
    BUDGET_TYPE_NAME,
    BUDGET_ENCVER,
    type_methods(TypeCallbacks {
        rdb_load,
        rdb_save,
        aof_rewrite,
        free,
        mem_usage,
        digest,
        copy,
    }),
);

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let Some(budget) = value.cast::<Budget>().as_ref() else {
        return;
    };
    raw::save_slice(rdb, &encode_budget(budget));
}

/// Refusals of corrupt values (RDB load, RESTORE) logged: one per second.
static BUDGET_REFUSALS: LogLimit = LogLimit::new(1000);

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let Ok(buffer) = raw::load_string_buffer(rdb) else {
        return std::ptr::null_mut();
    };
    match decode_budget(encver, buffer.as_ref()) {
        Ok(budget) => {
            Counts::of(&budget).adopt();
            if let Some((db, key)) = sweep_index::key_of_io(rdb) {
                sweep_index::track_budget(db, &key, &budget);
            }
            Box::into_raw(Box::new(budget)).cast::<c_void>()
        }
        Err(e) => {
            // One warning per second at most: a flood of corrupt RESTOREs must not fill the
            // log (each still gets its error reply).
            if let Some(held_back) = BUDGET_REFUSALS.admit(crate::shell::clock::wall_ms()) {
                let msg = with_held_back(&format!("rq-budget: refusing value: {e}"), held_back);
                logging::log_io_error(
                    rdb,
                    logging::RedisLogLevel::Warning,
                    &crate::shell::log_safe(&msg),
                );
            }
            std::ptr::null_mut()
        }
    }
}

/// Rewrites the key as one `QUOTA.LOAD key rq-budget encver payload`: the exact state, absolute
/// times.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let Some(budget) = value.cast::<Budget>().as_ref() else {
        return;
    };
    emit_load(
        aof,
        key,
        BUDGET_TYPE_NAME,
        BUDGET_ENCVER,
        &encode_budget(budget),
    );
}

unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        let budget = Box::from_raw(value.cast::<Budget>());
        // Atomics only: this may run on the lazy-free thread.
        Counts::of(&budget).drop_value();
        drop(budget);
    }
}

/// MEMORY USAGE: see [`crate::shell::memory::budget_bytes`].
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    match value.cast::<Budget>().as_ref() {
        Some(b) => crate::shell::memory::budget_bytes(b),
        None => 0,
    }
}

/// DEBUG DIGEST-VALUE: the encoded state, so any divergence between servers shows.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let Some(budget) = value.cast::<Budget>().as_ref() else {
        return;
    };
    add_digest(md, &encode_budget(budget));
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    match value.cast::<Budget>().as_ref() {
        Some(b) => {
            Counts::of(b).adopt();
            Box::into_raw(Box::new(b.clone())).cast::<c_void>()
        }
        None => std::ptr::null_mut(),
    }
}
