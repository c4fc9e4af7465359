//! Registration of the write commands on every request's path (RESERVE, SETTLE, ROLLBACK,
//! EXTEND, CHARGE, WINDOW) without the `redis-module` wrapper's argument vector.
//!
//! The crate's `redis_module!` wrapper copies Redis's argv into a new `Vec<RedisString>`,
//! retaining every argument and releasing it after the call: an allocation, a free and two
//! API calls per argument on each request (~0.45k instructions of a ~11k RESERVE, issue 5).
//! Here the handler borrows argv as `&[RedisString]` for the duration of the call. The ACL
//! categories are set as the crate sets them: only where the server has
//! `RedisModule_SetCommandACLCategories` (Redis 7.2+).

use std::ffi::CStr;
use std::mem::ManuallyDrop;
use std::os::raw::c_int;

use redis_module::{raw, Context, RedisResult, RedisString};
use smallvec::SmallVec;

/// A command handler that borrows its arguments (`args[0]` is the command name).
pub type Handler = fn(&Context, &[RedisString]) -> RedisResult;

/// Runs `handler` on Redis's argv, borrowed, and replies with its result as the crate's
/// wrapper does.
///
/// # Safety
///
/// `ctx` is the command's live context and `argv` points to `argc` live argument strings (or
/// is null), as Redis passes them to a command function.
pub unsafe fn dispatch(
    ctx: *mut raw::RedisModuleCtx,
    argv: *mut *mut raw::RedisModuleString,
    argc: c_int,
    handler: Handler,
) -> c_int {
    let context = Context::new(ctx);
    let len = usize::try_from(argc).unwrap_or(0);
    let strings: &[*mut raw::RedisModuleString] = if argv.is_null() || len == 0 {
        &[]
    } else {
        // SAFETY: the caller passes `argc` live argument strings for the duration of the call.
        unsafe { std::slice::from_raw_parts(argv, len) }
    };
    // Not retained, so never released: Redis owns them for the whole call.
    let held: SmallVec<[ManuallyDrop<RedisString>; 16]> = strings
        .iter()
        .map(|&s| ManuallyDrop::new(RedisString::from_redis_module_string(ctx, s)))
        .collect();
    // SAFETY: `ManuallyDrop<T>` is `repr(transparent)`, so the slice has `[RedisString]`'s
    // layout; it is only borrowed, so no element is dropped (released) through it.
    let args: &[RedisString] =
        unsafe { std::slice::from_raw_parts(held.as_ptr().cast::<RedisString>(), held.len()) };
    context.reply(handler(&context, args)) as c_int
}

/// An `extern "C"` command function for [`Handler`] `$handler`, for [`register`].
#[macro_export]
macro_rules! borrowed_args_command {
    ($name:ident, $handler:path) => {
        extern "C" fn $name(
            ctx: *mut redis_module::raw::RedisModuleCtx,
            argv: *mut *mut redis_module::raw::RedisModuleString,
            argc: std::os::raw::c_int,
        ) -> std::os::raw::c_int {
            // SAFETY: Redis calls a command function with its live context and argv.
            unsafe { $crate::shell::command::dispatch(ctx, argv, argc, $handler) }
        }
    };
}

/// One command to register: name, C function, flags, key positions (first, last, step) and
/// the ACL categories applied on Redis 7.2+.
pub struct Spec {
    pub name: &'static CStr,
    pub func: raw::RedisModuleCmdFunc,
    pub flags: &'static CStr,
    pub keys: (c_int, c_int, c_int),
    pub acl: &'static CStr,
}

/// Registers `spec` on the load context. Errors name the command; a refused ACL category set
/// is logged, not fatal (as in the crate).
pub fn register(ctx: &Context, spec: &Spec) -> Result<(), String> {
    let name = spec.name.to_string_lossy();
    // SAFETY (here and below): copies of pointers written once by RedisModule_Init.
    let create = raw_api(unsafe { raw::RedisModule_CreateCommand }, "CreateCommand")?;
    let (first, last, step) = spec.keys;
    // SAFETY: the load context is live; the strings are static and NUL-terminated.
    let status = unsafe {
        create(
            ctx.ctx,
            spec.name.as_ptr(),
            spec.func,
            spec.flags.as_ptr(),
            first,
            last,
            step,
        )
    };
    if status != raw::REDISMODULE_OK as c_int {
        return Err(format!("could not create command {name}"));
    }
    // SAFETY: a copy of a pointer written once by RedisModule_Init.
    let Some(set_categories) = (unsafe { raw::RedisModule_SetCommandACLCategories }) else {
        return Ok(());
    };
    let get = raw_api(unsafe { raw::RedisModule_GetCommand }, "GetCommand")?;
    // SAFETY: as above; the command was just created.
    let command = unsafe { get(ctx.ctx, spec.name.as_ptr()) };
    if command.is_null() {
        return Err(format!("could not get command {name}"));
    }
    // SAFETY: a live command handle and a static string.
    if unsafe { set_categories(command, spec.acl.as_ptr()) } != raw::REDISMODULE_OK as c_int {
        ctx.log_warning(&format!(
            "quota: could not set ACL categories of {name} (continuing)"
        ));
    }
    Ok(())
}

fn raw_api<T>(f: Option<T>, name: &str) -> Result<T, String> {
    f.ok_or_else(|| format!("RedisModule_{name} is not available"))
}
