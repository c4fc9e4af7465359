//! The `rq-budget` module data type: RDB save/load, AOF rewrite, digest, MEMORY USAGE, COPY, free.
//!
//! All callbacks are `extern "C"` and must never unwind into Redis: they only call code that
//! returns errors (no panics on loaded data), and `free` touches no Redis API (it may run on the
//! lazy-free thread).

use std::os::raw::{c_int, c_void};

use redis_module::{logging, native_types::RedisType, raw};

use crate::core::ledger::Budget;
use crate::shell::apply::Counts;
use crate::shell::persist::{decode_budget, encode_budget, BUDGET_ENCVER};
use crate::shell::sweeper;

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

/// The callbacks both module types implement; everything else Redis offers stays unset.
pub(crate) struct TypeCallbacks {
    pub rdb_load: unsafe extern "C" fn(*mut raw::RedisModuleIO, c_int) -> *mut c_void,
    pub rdb_save: unsafe extern "C" fn(*mut raw::RedisModuleIO, *mut c_void),
    pub aof_rewrite:
        unsafe extern "C" fn(*mut raw::RedisModuleIO, *mut raw::RedisModuleString, *mut c_void),
    pub free: unsafe extern "C" fn(*mut c_void),
    pub mem_usage: unsafe extern "C" fn(*const c_void) -> usize,
    pub digest: unsafe extern "C" fn(*mut raw::RedisModuleDigest, *mut c_void),
    pub copy: unsafe extern "C" fn(
        *mut raw::RedisModuleString,
        *mut raw::RedisModuleString,
        *const c_void,
    ) -> *mut c_void,
}

/// The method table for a type with `cb`: RDB, AOF rewrite, free, MEMORY USAGE, digest, COPY.
pub(crate) const fn type_methods(cb: TypeCallbacks) -> raw::RedisModuleTypeMethods {
    raw::RedisModuleTypeMethods {
        version: raw::REDISMODULE_TYPE_METHOD_VERSION as u64,
        rdb_load: Some(cb.rdb_load),
        rdb_save: Some(cb.rdb_save),
        aof_rewrite: Some(cb.aof_rewrite),
        free: Some(cb.free),
        mem_usage: Some(cb.mem_usage),
        digest: Some(cb.digest),
        aux_load: None,
        aux_save: None,
        aux_save2: None,
        aux_save_triggers: 0,
        free_effort: None,
        unlink: None,
        copy: Some(cb.copy),
        defrag: None,
        copy2: None,
        free_effort2: None,
        mem_usage2: None,
        unlink2: None,
    }
}

unsafe extern "C" fn rdb_save(rdb: *mut raw::RedisModuleIO, value: *mut c_void) {
    let Some(budget) = value.cast::<Budget>().as_ref() else {
        return;
    };
    raw::save_slice(rdb, &encode_budget(budget));
}

unsafe extern "C" fn rdb_load(rdb: *mut raw::RedisModuleIO, encver: c_int) -> *mut c_void {
    let Ok(buffer) = raw::load_string_buffer(rdb) else {
        return std::ptr::null_mut();
    };
    match decode_budget(encver, buffer.as_ref()) {
        Ok(budget) => {
            Counts::of(&budget).adopt();
            if let Some((db, key)) = sweeper::key_of_io(rdb) {
                sweeper::track_budget(db, &key, &budget);
            }
            Box::into_raw(Box::new(budget)).cast::<c_void>()
        }
        Err(e) => {
            logging::log_io_error(
                rdb,
                logging::RedisLogLevel::Warning,
                &crate::shell::log_safe(&format!("rq-budget: refusing value: {e}")),
            );
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

/// Emits `QUOTA.LOAD key type_name encver payload` into an AOF rewrite (any of our types).
pub(crate) unsafe fn emit_load(
    aof: *mut raw::RedisModuleIO,
    key: *mut raw::RedisModuleString,
    type_name: &str,
    encver: i32,
    payload: &[u8],
) {
    if let Some(emit) = raw::RedisModule_EmitAOF {
        // The type name goes as a buffer (`b`): no C string to build for every key.
        emit(
            aof,
            c"QUOTA.LOAD".as_ptr(),
            c"sblb".as_ptr(),
            key,
            type_name.as_ptr(),
            type_name.len(),
            libc::c_longlong::from(encver),
            payload.as_ptr(),
            payload.len(),
        );
    }
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

/// Adds `bytes` (a value's encoding) to a DEBUG DIGEST as one sequence.
///
/// # Safety
///
/// `md` is the live digest Redis passed to the type's `digest` callback.
pub(crate) unsafe fn add_digest(md: *mut raw::RedisModuleDigest, bytes: &[u8]) {
    if let (Some(add), Some(end)) = (
        raw::RedisModule_DigestAddStringBuffer,
        raw::RedisModule_DigestEndSequence,
    ) {
        add(md, bytes.as_ptr().cast(), bytes.len());
        end(md);
    }
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
