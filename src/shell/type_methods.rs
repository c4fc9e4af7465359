//! What the two module data types (`rq-budget`, `rq-window`) share: their method table, the
//! `QUOTA.LOAD` line an AOF rewrite emits for a value, and how a value enters DEBUG DIGEST.

use std::os::raw::{c_int, c_void};

use redis_module::raw;

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

/// Emits `QUOTA.LOAD key type_name encver payload` into an AOF rewrite (any of our types).
///
/// # Safety
///
/// `aof` and `key` are the live handles Redis passed to the type's `aof_rewrite` callback.
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
