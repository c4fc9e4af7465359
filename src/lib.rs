//! redis-quota: a Redis module with native, atomic quota commands for multi-tenant LLM and API
//! gateways — two-phase budgets (RESERVE → SETTLE / ROLLBACK), one-phase charges.
//!
//! Layout: [`core`] is the pure ledger (no Redis types); [`shell`] is the thin Redis layer
//! (arguments, replies, data type callbacks, replication, configs). This file only registers.

// Unit tests may panic: the deny lints in Cargo.toml guard the module code only.
#![cfg_attr(
    test,
    allow(
        clippy::unwrap_used,
        clippy::expect_used,
        clippy::indexing_slicing,
        clippy::arithmetic_side_effects,
        clippy::panic
    )
)]

pub mod core;
pub mod shell;

use redis_module::{configuration::ConfigurationFlags, redis_module, Context, RedisString, Status};

use shell::apply_cmds::{quota_apply, quota_load};
use shell::budget_cmds::{
    quota_charge, quota_extend, quota_info, quota_pending, quota_reserve, quota_rollback,
    quota_set, quota_settle,
};
use shell::budget_type::BUDGET_TYPE;
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
        // One log line: "panicked at file:line:col:" and the message are joined by a space.
        let info = info.to_string().replace('\n', " ");
        if PANIC_SELF_TEST.with(std::cell::Cell::get) {
            let msg = format!("quota: panic hook installed (self-test, caught: {info})");
            log(RedisLogLevel::Notice, shell::log_safe(&msg));
        } else {
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
    let caught = std::panic::catch_unwind(|| panic!("quota panic hook self-test"));
    PANIC_SELF_TEST.with(|f| f.set(false));
    if caught.is_ok() {
        redis_module::logging::log_warning("quota: panic hook self-test did not panic");
    }
}

/// A `panic = "abort"` build cannot catch a panic: it only says the hook is installed.
#[cfg(not(panic = "unwind"))]
fn self_test_panic_hook() {
    redis_module::logging::log_notice("quota: panic hook installed (panic=abort build)");
}

fn init(ctx: &Context, _args: &[RedisString]) -> Status {
    install_panic_hook();
    // Without it a short read during RDB load is a server panic and replicas refuse diskless load.
    ctx.set_module_options(redis_module::ModuleOptions::HANDLE_IO_ERRORS);
    // Replaces the crate's empty INFO callback with `# quota`.
    redis_module::raw::register_info_function(ctx.ctx, Some(shell::stats::info_callback));
    shell::sweeper::start(ctx);
    Status::Ok
}

redis_module! {
    name: "quota",
    version: 1,
    allocator: (shell::alloc::QuotaAlloc, shell::alloc::QuotaAlloc),
    data_types: [BUDGET_TYPE, WINDOW_TYPE],
    init: init,
    commands: [
        ["QUOTA.SET", quota_set, "write deny-oom", 1, 1, 1, ""],
        ["QUOTA.INFO", quota_info, "readonly fast", 1, 1, 1, ""],
        ["QUOTA.RESERVE", quota_reserve, "write deny-oom fast", 1, 1, 1, ""],
        ["QUOTA.SETTLE", quota_settle, "write fast", 1, 1, 1, ""],
        ["QUOTA.ROLLBACK", quota_rollback, "write fast", 1, 1, 1, ""],
        ["QUOTA.EXTEND", quota_extend, "write fast", 1, 1, 1, ""],
        ["QUOTA.CHARGE", quota_charge, "write deny-oom fast", 1, 1, 1, ""],
        ["QUOTA.PENDING", quota_pending, "readonly", 1, 1, 1, ""],
        ["QUOTA.APPLY", quota_apply, "write", 1, 1, 1, ""],
        ["QUOTA.LOAD", quota_load, "write", 1, 1, 1, ""],
        ["QUOTA.WINDOW", quota_window, "write deny-oom fast", 1, 1, 1, ""],
        ["QUOTA.WAPPLY", quota_wapply, "write", 1, 1, 1, ""],
    ],
    event_handlers: [
        [@GENERIC: shell::sweeper::on_keyspace_event],
    ],
    configurations: [
        i64: [
            ["default-ttl", &config::DEFAULT_TTL, 3_600_000, 1, i64::MAX, ConfigurationFlags::DEFAULT, None],
            ["finished-ttl", &config::FINISHED_TTL, 3_600_000, 0, i64::MAX, ConfigurationFlags::DEFAULT, None],
            ["max-pending", &config::MAX_PENDING, 1_000_000, 1, i64::MAX, ConfigurationFlags::DEFAULT, None],
            ["max-id-length", &config::MAX_ID_LENGTH, 128, 1, 65_536, ConfigurationFlags::DEFAULT, None],
            ["sweep-effort", &config::SWEEP_EFFORT, 1000, 0, 1_000_000, ConfigurationFlags::DEFAULT, None],
        ],
        string: [],
        bool: [
            ["test-clock", &config::TEST_CLOCK, false, ConfigurationFlags::DEFAULT, None],
        ],
        enum: [],
        module_args_as_configuration: true,
    ]
}
