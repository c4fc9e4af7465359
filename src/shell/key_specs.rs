//! Key positions of the multi-key commands (`QUOTA.MRESERVE`, `MSETTLE`, `MROLLBACK`,
//! `MEXTEND`): `numkeys` at argv[1], then that many keys. The legacy (first, last, step) triple
//! cannot say this, so the commands are created without key positions and declare them twice:
//!
//! - a key spec, through raw `RedisModule_SetCommandInfo` (present on Redis 7.0.15): begin
//!   search at index 1, find keys by keynum (the count at offset 0, the first key at offset 1,
//!   step 1). `COMMAND GETKEYS`, `COMMAND INFO` and ACL key patterns read it;
//! - the `getkeys-api` flag, answered by [`answer_key_positions`] at the top of each handler:
//!   Redis 7.0's cluster routing (CROSSSLOT, MOVED, CLUSTERDOWN) asks the command itself
//!   (`getKeysFromCommand`), never its key specs, for a command without legacy positions.
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

/// If Redis is only asking for the command's key positions (`getkeys-api`), declares them —
/// `numkeys` at argv[1] (1 to `max` of them; another value declares none, and the command
/// itself then refuses it), the keys after it — and returns true: the handler must then return
/// without replying or doing anything else.
pub fn answer_key_positions(ctx: &Context, args: &[redis_module::RedisString], max: usize) -> bool {
    // SAFETY: copies of pointers written once by RedisModule_Init.
    let (Some(is_request), Some(key_at)) =
        (unsafe { raw::RedisModule_IsKeysPositionRequest }, unsafe {
            raw::RedisModule_KeyAtPos
        })
    else {
        return false;
    };
    // SAFETY: the command's live context.
    if unsafe { is_request(ctx.ctx) } == 0 {
        return false;
    }
    let n = args
        .get(1)
        .and_then(|a| crate::shell::args::parse_canonical_i64(a.as_slice()))
        .and_then(|n| usize::try_from(n).ok())
        .filter(|n| (1..=max).contains(n))
        .unwrap_or(0);
    for pos in (2..n.saturating_add(2)).take_while(|&p| p < args.len()) {
        if let Ok(pos) = c_int::try_from(pos) {
            // SAFETY: the live context of a key position request; `pos` is an argument index.
            unsafe { key_at(ctx.ctx, pos) };
        }
    }
    true
}

/// Key access flags of a command that reads and updates every key it names.
pub const RW_UPDATE: u64 = (raw::REDISMODULE_CMD_KEY_RW | raw::REDISMODULE_CMD_KEY_UPDATE) as u64;
