//! Time for commands on the master: the wall clock, or a client's `AT` under `quota.test-clock`.
//! Replicas and AOF replays never come here: they take the time carried by the effects.

use redis_module::{raw, RedisError};

use crate::shell::config;

/// Redis's wall clock in unix ms.
pub fn wall_ms() -> i64 {
    // SAFETY: the pointer is filled in by RedisModule_Init before any command runs.
    unsafe { raw::RedisModule_Milliseconds.map(|f| f()).unwrap_or(0) }
}

/// The time a command runs at: `AT` if given (test clock only), else the wall clock.
pub fn command_ms(at: Option<i64>) -> Result<i64, RedisError> {
    match at {
        None => Ok(wall_ms()),
        Some(_) if !config::test_clock() => Err(RedisError::Str(
            "ERR AT is only accepted when quota.test-clock is yes",
        )),
        Some(ms) if ms < 0 => Err(RedisError::Str("ERR AT must not be negative")),
        Some(ms) => Ok(ms),
    }
}
