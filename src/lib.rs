//! redis-quota: a Redis module with native, atomic quota commands for multi-tenant LLM and API
//! gateways — two-phase budgets (RESERVE → SETTLE / ROLLBACK), one-phase charges.
//!
//! Layout: [`core`] is the pure ledger (no Redis types); [`shell`] is the thin Redis layer
//! (arguments, replies, data type callbacks, replication, configs). This file only registers.

// Never crash Redis: no panicking shortcuts in the module code. Unit tests may panic; the
// integration tests, bench and examples are clients, not module code, and are not held to it.
#![cfg_attr(
    not(test),
    deny(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::panic
    )
)]

pub mod core;
pub mod shell;

use std::ffi::CStr;
use std::os::raw::{c_char, c_int};

use redis_module::{
    configuration::ConfigurationFlags, raw, redis_module, Context, NotifyEvent, RedisString, Status,
};

use shell::apply_cmds::{quota_apply, quota_load};
use shell::budget_cmds::{
    quota_charge, quota_extend, quota_info, quota_pending, quota_reserve, quota_rollback,
    quota_set, quota_settle,
};
use shell::budget_type::BUDGET_TYPE;
use shell::command_docs::quota_help;
use shell::config;
use shell::window_apply::quota_wapply;
use shell::window_cmds::quota_window;
use shell::window_type::WINDOW_TYPE;

std::thread_local! {
    /// Set while [`self_test_panic_hook`] runs its deliberate, caught panic.
    static PANIC_SELF_TEST: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Logs any panic with its message and location to the Redis log before Redis aborts, so the
/// cause is never lost. Panics must be unreachable from input and loaded data; this is the last
/// line. Then proves at load that the hook is in place (see [`self_test_panic_hook`]).
fn install_panic_hook() {
    std::panic::set_hook(Box::new(|info| {
        use redis_module::logging::{log, RedisLogLevel};
        if PANIC_SELF_TEST.with(std::cell::Cell::get) {
            // No "panic" in this line: a log alert on the word must not fire at every start.
            let at = info
                .location()
                .map_or_else(|| "?".to_owned(), ToString::to_string);
            let said = info
                .payload()
                .downcast_ref::<&str>()
                .copied()
                .unwrap_or("?");
            let msg =
                format!("quota: crash hook installed (self-test '{said}' reached it from {at})");
            log(RedisLogLevel::Notice, shell::log_safe(&msg));
        } else {
            // One log line: "panicked at file:line:col:" and the message are joined by a space.
            let info = info.to_string().replace('\n', " ");
            let msg = format!("quota: PANIC (Redis will abort): {info}");
            log(RedisLogLevel::Warning, shell::log_safe(&msg));
        }
    }));
    self_test_panic_hook();
}

/// Raises one panic inside `catch_unwind` (it never leaves this function), so the log shows at
/// every load that a panic's message and location reach the Redis log through the hook.
#[cfg(panic = "unwind")]
#[allow(clippy::panic)] // deliberate and caught right here
fn self_test_panic_hook() {
    PANIC_SELF_TEST.with(|f| f.set(true));
    let caught = std::panic::catch_unwind(|| panic!("quota crash hook self-test"));
    PANIC_SELF_TEST.with(|f| f.set(false));
    if caught.is_ok() {
        redis_module::logging::log_warning("quota: crash hook self-test did not run");
    }
}

/// A `panic = "abort"` build cannot catch a panic: it only says the hook is installed.
#[cfg(not(panic = "unwind"))]
fn self_test_panic_hook() {
    redis_module::logging::log_notice("quota: crash hook installed (abort build)");
}

/// Keyspace hook (class generic) for the sweeper's index: `RENAME`, `MOVE`, `COPY`, `RESTORE`.
extern "C" fn on_keyspace_event(
    ctx: *mut raw::RedisModuleCtx,
    event_type: c_int,
    event: *const c_char,
    key: *mut raw::RedisModuleString,
) -> c_int {
    if ctx.is_null() || event.is_null() || key.is_null() {
        return raw::Status::Ok as c_int;
    }
    let context = Context::new(ctx);
    // SAFETY: Redis passes a live NUL-terminated event name for the duration of the call.
    let event = unsafe { CStr::from_ptr(event) };
    if let Ok(event) = event.to_str() {
        shell::sweeper::on_keyspace_event(
            &context,
            NotifyEvent::from_bits_truncate(event_type),
            event,
            RedisString::string_as_slice(key),
        );
    }
    raw::Status::Ok as c_int
}

fn subscribe_keyspace_events(ctx: &Context) -> bool {
    // SAFETY: a copy of a function pointer written once by RedisModule_Init.
    let Some(subscribe) = (unsafe { raw::RedisModule_SubscribeToKeyspaceEvents }) else {
        return false;
    };
    // SAFETY: a plain API call on the live load context with a callback that lives as long as
    // the module.
    let status = unsafe {
        subscribe(
            ctx.ctx,
            NotifyEvent::GENERIC.bits(),
            Some(on_keyspace_event),
        )
    };
    status == raw::Status::Ok as c_int
}

borrowed_args_command!(cmd_reserve, quota_reserve);
borrowed_args_command!(cmd_settle, quota_settle);
borrowed_args_command!(cmd_rollback, quota_rollback);
borrowed_args_command!(cmd_extend, quota_extend);
borrowed_args_command!(cmd_charge, quota_charge);
borrowed_args_command!(cmd_window, quota_window);
borrowed_args_command!(cmd_mreserve, shell::multi_cmds::quota_mreserve);
borrowed_args_command!(cmd_msettle, shell::multi_cmds::quota_msettle);
borrowed_args_command!(cmd_mrollback, shell::multi_cmds::quota_mrollback);
borrowed_args_command!(cmd_mextend, shell::multi_cmds::quota_mextend);
borrowed_args_command!(cmd_mapply, shell::mapply::quota_mapply);

/// The multi-key commands (`numkeys key [key ...] ...`): created without legacy key positions,
/// with `getkeys-api` (cluster routing on 7.0) and a keynum key spec ([`shell::key_specs`]).
/// `QUOTA.MAPPLY` is internal (the effects of one multi-key write, from the master or the AOF)
/// and flagged as `QUOTA.APPLY`.
const MULTI_COMMANDS: [shell::command::Spec; 5] = {
    use shell::command::Spec;
    [
        Spec {
            name: c"QUOTA.MRESERVE",
            func: Some(cmd_mreserve),
            flags: c"write deny-oom fast getkeys-api",
            keys: (0, 0, 0),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.MSETTLE",
            func: Some(cmd_msettle),
            flags: c"write fast getkeys-api",
            keys: (0, 0, 0),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.MROLLBACK",
            func: Some(cmd_mrollback),
            flags: c"write fast getkeys-api",
            keys: (0, 0, 0),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.MEXTEND",
            func: Some(cmd_mextend),
            flags: c"write fast getkeys-api",
            keys: (0, 0, 0),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.MAPPLY",
            func: Some(cmd_mapply),
            flags: c"write getkeys-api",
            keys: (0, 0, 0),
            acl: c"write admin dangerous",
        },
    ]
};

/// The write commands on every request's path, with the flags, key positions and (Redis 7.2+)
/// ACL categories the other commands get from the `redis_module!` list below.
const HOT_COMMANDS: [shell::command::Spec; 6] = {
    use shell::command::Spec;
    [
        Spec {
            name: c"QUOTA.RESERVE",
            func: Some(cmd_reserve),
            flags: c"write deny-oom fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.SETTLE",
            func: Some(cmd_settle),
            flags: c"write fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.ROLLBACK",
            func: Some(cmd_rollback),
            flags: c"write fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.EXTEND",
            func: Some(cmd_extend),
            flags: c"write fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.CHARGE",
            func: Some(cmd_charge),
            flags: c"write deny-oom fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
        Spec {
            name: c"QUOTA.WINDOW",
            func: Some(cmd_window),
            flags: c"write deny-oom fast",
            keys: (1, 1, 1),
            acl: c"write fast",
        },
    ]
};

fn init(ctx: &Context, args: &[RedisString]) -> Status {
    // First, before anything that a failed load could leave behind (a keyspace subscription or a
    // timer calling into the unloaded library would crash Redis later).
    let raw_args: Vec<&[u8]> = args.iter().map(RedisString::as_slice).collect();
    if let Err(e) = config::check_module_args(&raw_args) {
        ctx.log_warning(&shell::log_safe(&format!("quota: not loaded: {e}")));
        return Status::Err;
    }
    install_panic_hook();
    // HANDLE_IO_ERRORS: without it a short read during RDB load is a server panic and replicas
    // refuse diskless load. NO_IMPLICIT_SIGNAL_MODIFIED: every writable open goes through
    // `shell::key::ModuleKey`, which signals the keys it changed (one open per write).
    ctx.set_module_options(
        redis_module::ModuleOptions::HANDLE_IO_ERRORS
            | redis_module::ModuleOptions::NO_IMPLICIT_SIGNAL_MODIFIED,
    );
    for spec in &HOT_COMMANDS {
        if let Err(e) = shell::command::register(ctx, spec) {
            ctx.log_warning(&format!("quota: not loaded: {e}"));
            return Status::Err;
        }
    }
    for spec in &MULTI_COMMANDS {
        if let Err(e) = shell::command::register(ctx, spec) {
            ctx.log_warning(&format!("quota: not loaded: {e}"));
            return Status::Err;
        }
    }
    // COMMAND DOCS / INFO and key specs of every command (the macro's are registered by now),
    // the multi-key commands' keynum key specs among them.
    if let Err(e) = shell::command_docs::set_all(ctx) {
        ctx.log_warning(&format!("quota: not loaded: {e}"));
        return Status::Err;
    }
    // Replaces the crate's empty INFO callback with `# quota`.
    redis_module::raw::register_info_function(ctx.ctx, Some(shell::stats::info_callback));
    // Server-event subscriptions go with the module if the load fails; keyspace ones do not,
    // so they come last.
    if !shell::sweep_index::subscribe_db_events(ctx) {
        ctx.log_warning("quota: not loaded: could not subscribe to FLUSHDB/SWAPDB events");
        return Status::Err;
    }
    if !subscribe_keyspace_events(ctx) {
        ctx.log_warning("quota: not loaded: could not subscribe to keyspace events");
        return Status::Err;
    }
    shell::sweeper::start(ctx);
    Status::Ok
}

redis_module! {
    name: "quota",
    version: 1,
    allocator: (shell::alloc::QuotaAlloc, shell::alloc::QuotaAlloc),
    data_types: [BUDGET_TYPE, WINDOW_TYPE],
    init: init,
    // 7th field: mandatory ACL categories, "" (a 7.0 server cannot set any and would refuse to
    // load). 8th: categories applied on Redis 7.2+ only (on 7.0 module commands belong to no
    // category: grant them by name, see docs/operations.md). The internal commands are @admin
    // @dangerous so that no category rule meant for clients grants them.
    commands: [
        ["QUOTA.SET", quota_set, "write deny-oom", 1, 1, 1, "", "write slow"],
        ["QUOTA.INFO", quota_info, "readonly fast", 1, 1, 1, "", "read fast"],
        ["QUOTA.PENDING", quota_pending, "readonly", 1, 1, 1, "", "read slow"],
        ["QUOTA.APPLY", quota_apply, "write", 1, 1, 1, "", "write admin dangerous"],
        ["QUOTA.LOAD", quota_load, "write", 1, 1, 1, "", "write admin dangerous"],
        ["QUOTA.WAPPLY", quota_wapply, "write", 1, 1, 1, "", "write admin dangerous"],
        ["QUOTA.HELP", quota_help, "readonly fast allow-loading allow-stale", 0, 0, 0, "", "fast"],
    ],
    // Keyspace events are subscribed in `init`, after the arguments are checked: a subscription
    // made by the macro would outlive a failed load and call into the unloaded library.
    configurations: [
        i64: [
            ["default-ttl", &config::DEFAULT_TTL, config::DEFAULT_TTL_DEFAULT, config::DEFAULT_TTL_RANGE.0, config::DEFAULT_TTL_RANGE.1, ConfigurationFlags::DEFAULT, None],
            ["finished-ttl", &config::FINISHED_TTL, config::FINISHED_TTL_DEFAULT, config::FINISHED_TTL_RANGE.0, config::FINISHED_TTL_RANGE.1, ConfigurationFlags::DEFAULT, None],
            ["max-pending", &config::MAX_PENDING, config::MAX_PENDING_DEFAULT, config::MAX_PENDING_RANGE.0, config::MAX_PENDING_RANGE.1, ConfigurationFlags::DEFAULT, None],
            ["max-id-length", &config::MAX_ID_LENGTH, config::MAX_ID_LENGTH_DEFAULT, config::MAX_ID_LENGTH_RANGE.0, config::MAX_ID_LENGTH_RANGE.1, ConfigurationFlags::DEFAULT, None],
            ["sweep-effort", &config::SWEEP_EFFORT, config::SWEEP_EFFORT_DEFAULT, config::SWEEP_EFFORT_RANGE.0, config::SWEEP_EFFORT_RANGE.1, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["test-clock", &config::TEST_CLOCK, false, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
