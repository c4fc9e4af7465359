//! Key specs of the multi-key commands (`QUOTA.MRESERVE`, `MSETTLE`, `MROLLBACK`, `MEXTEND`):
//! `numkeys` at argv[1], then that many keys. The legacy (first, last, step) triple cannot say
//! this, so the commands are created without key positions and given one key spec through raw
//! `RedisModule_SetCommandInfo` (present on Redis 7.0.15): begin search at index 1, find keys
//! by keynum (the count at offset 0, the first key at offset 1, step 1). `COMMAND GETKEYS`,
//! cluster routing (CROSSSLOT, MOVED) and ACL key patterns then see every key.
//!
//! Only the key spec is set here (no summary, arity or arguments): the COMMAND DOCS metadata of
//! every command is meant to go through the same call, and can take this spec over.

use std::os::raw::c_int;

use redis_module::{raw, Context};

/// `RedisModuleCommandInfoVersion` 1, as `redismodule.h` defines `RedisModule_CurrentCommandInfoVersion`
/// (a `static const` in the header, so not a symbol the bindings can link to).
fn info_version() -> raw::RedisModuleCommandInfoVersion {
    raw::RedisModuleCommandInfoVersion {
        version: 1,
        sizeof_historyentry: std::mem::size_of::<raw::RedisModuleCommandHistoryEntry>(),
        sizeof_keyspec: std::mem::size_of::<raw::RedisModuleCommandKeySpec>(),
        sizeof_arg: std::mem::size_of::<raw::RedisModuleCommandArg>(),
    }
}

/// Declares `numkeys key [key ...]` starting at argv[1] as the key spec of the command `name`
/// (already created). `flags`: `REDISMODULE_CMD_KEY_*` access flags of the keys.
pub fn declare_numkeys(ctx: &Context, name: &std::ffi::CStr, flags: u64) -> Result<(), String> {
    let shown = name.to_string_lossy();
    // SAFETY: copies of pointers written once by RedisModule_Init.
    let (Some(get), Some(set_info)) = (unsafe { raw::RedisModule_GetCommand }, unsafe {
        raw::RedisModule_SetCommandInfo
    }) else {
        return Err("RedisModule_SetCommandInfo is not available".to_string());
    };
    // SAFETY: the load context is live; the name is NUL-terminated.
    let command = unsafe { get(ctx.ctx, name.as_ptr()) };
    if command.is_null() {
        return Err(format!("could not get command {shown}"));
    }
    let version = info_version();
    // SAFETY (zeroed): a key spec is plain data; all zero is the terminating entry
    // (begin_search_type 0, REDISMODULE_KSPEC_BS_INVALID).
    let mut specs: [raw::RedisModuleCommandKeySpec; 2] = unsafe { std::mem::zeroed() };
    let [spec, _end] = &mut specs;
    spec.flags = flags;
    spec.begin_search_type = raw::RedisModuleKeySpecBeginSearchType_REDISMODULE_KSPEC_BS_INDEX;
    spec.bs.index.pos = 1;
    spec.find_keys_type = raw::RedisModuleKeySpecFindKeysType_REDISMODULE_KSPEC_FK_KEYNUM;
    spec.fk.keynum.keynumidx = 0;
    spec.fk.keynum.firstkey = 1;
    spec.fk.keynum.keystep = 1;
    // SAFETY (zeroed): every other field null or 0 means "not given".
    let mut info: raw::RedisModuleCommandInfo = unsafe { std::mem::zeroed() };
    info.version = &version;
    info.key_specs = specs.as_mut_ptr();
    // SAFETY: a live command handle; Redis copies what it keeps from `info` during the call.
    let status = unsafe { set_info(command, &info) };
    if status == raw::REDISMODULE_OK as c_int {
        Ok(())
    } else {
        Err(format!("could not set the key spec of {shown}"))
    }
}

/// Key access flags of a command that reads and updates every key it names.
pub const RW_UPDATE: u64 = (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;
