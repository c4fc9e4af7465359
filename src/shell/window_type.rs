//! The `rq-window` module data type (QUOTA.WINDOW keys): RDB save/load, AOF rewrite, digest,
//! MEMORY USAGE, COPY, free.
//!
//! All callbacks are `extern "C"` and must never unwind into Redis: they only call code that
//! returns errors (no panics on loaded data), and `free` touches no Redis API (it may run on the
//! lazy-free thread). The key's expiry is Redis's own (saved with the key in the RDB, emitted as
//! `PEXPIREAT` after our `aof_rewrite` output), so it needs nothing here.

use std::os::raw::{c_int, c_void};

use redis_module::{logging, native_types::RedisType, raw};

use crate::core::window::Window;
use crate::shell::log_limit::{with_held_back, LogLimit};
use crate::shell::persist::{decode_window, encode_window, WINDOW_ENCVER};
use crate::shell::type_methods::{add_digest, emit_load, type_methods, TypeCallbacks};
use crate::shell::{stats, sweep_index};

/// The type's name, also the type token of `QUOTA.LOAD`.
pub const WINDOW_TYPE_NAME: &str = "rq-window";

/// The window type. The 9-character name and the encver go into every RDB: never rename it.
pub static WINDOW_TYPE: RedisType = RedisType::new(
    WINDOW_TYPE_NAME,
    WINDOW_ENCVER,
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
    let Some(window) = value.cast::<Window>().as_ref() else {
        return;
    };
    raw::save_slice(rdb, &encode_window(window));
}

/// Refusals of corrupt values (RDB load, RESTORE) logged: one per second.
static WINDOW_REFUSALS: LogLimit = LogLimit::new(1000);

/// Also reached by RESTORE payloads: [`decode_window`] validates everything.
unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let Ok(buffer) = raw::load_string_buffer(rdb) else {
        return std::ptr::null_mut();
    };
    match decode_window(encver, buffer.as_ref()) {
        Ok(window) => {
            stats::bump(&stats::WINDOW_KEYS);
            if !window.remembered().is_empty() {
                if let Some((db, key)) = sweep_index::key_of_io(rdb) {
                    sweep_index::track_window(db, &key, &window, false);
                }
            }
            Box::into_raw(Box::new(window)).cast::<c_void>()
        }
        Err(e) => {
            // One warning per second at most: a flood of corrupt RESTOREs must not fill the
            // log (each still gets its error reply).
            if let Some(held_back) = WINDOW_REFUSALS.admit(crate::shell::clock::wall_ms()) {
                let msg = with_held_back(&format!("rq-window: refusing value: {e}"), held_back);
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

/// Rewrites the key as one `QUOTA.LOAD key rq-window encver payload`: the exact state.
unsafe extern "C" fn aof_rewrite(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    value: *mut c_void,
) {
    let Some(window) = value.cast::<Window>().as_ref() else {
        return;
    };
    emit_load(
        aof,
        key,
        WINDOW_TYPE_NAME,
        WINDOW_ENCVER,
        &encode_window(window),
    );
}

unsafe extern "C" fn free(value: *mut c_void) {
    if !value.is_null() {
        drop(Box::from_raw(value.cast::<Window>()));
        // An atomic only: this may run on the lazy-free thread.
        stats::add(&stats::WINDOW_KEYS, -1);
    }
}

/// The struct plus its bucket storage: bounded by the bucket budget, whatever the traffic (see
/// [`crate::shell::memory::window_bytes`]).
unsafe extern "C" fn mem_usage(value: *const c_void) -> usize {
    match value.cast::<Window>().as_ref() {
        Some(w) => crate::shell::memory::window_bytes(w),
        None => 0,
    }
}

/// DEBUG DIGEST-VALUE: the encoded state, so any divergence between servers shows.
unsafe extern "C" fn digest(md: *mut raw::RedisModuleDigest, value: *mut c_void) {
    let Some(window) = value.cast::<Window>().as_ref() else {
        return;
    };
    add_digest(md, &encode_window(window));
}

unsafe extern "C" fn copy(
    _from: *mut raw::RedisModuleString,
    _to: *mut raw::RedisModuleString,
    value: *const c_void,
) -> *mut c_void {
    match value.cast::<Window>().as_ref() {
        Some(w) => {
            stats::bump(&stats::WINDOW_KEYS);
            Box::into_raw(Box::new(w.clone())).cast::<c_void>()
        }
        None => std::ptr::null_mut(),
    }
}
