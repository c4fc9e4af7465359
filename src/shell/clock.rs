//! Time for commands on the master: the wall clock, or a client's `AT` under `quota.test-clock`.
//! Replicas and AOF replays never come here: they take the time carried by the effects.

use redis_module::{raw, RedisError};

use crate::shell::config;

/// Redis's wall clock in unix ms.
pub fn wall_ms() -> i64 {
    // SAFETY: the pointer is filled in by RedisModule_Init before any command runs.
    unsafe { raw::RedisModule_Milliseconds.map(|f| f()).unwrap_or(0) }
}

/// Latest `AT` accepted, unix ms: the latest `ANCHOR` (jiff's last instant, 9999-12-30T22:00Z,
/// the end of the range calendar periods support), so no test-clock call can move a key's
/// clock to the end of `i64`, where every later deadline would overflow.
pub const MAX_AT_MS: i64 = 253_402_207_200_999;

/// The time a command runs at: `AT` if given (test clock only), else the wall clock.
pub fn command_ms(at: Option<i64>) -> Result<i64, RedisError> {
    match at {
        None => Ok(wall_ms()),
        Some(_) if !config::test_clock() => Err(RedisError::Str(
            "ERR AT is only accepted when quota.test-clock is yes",
        )),
        Some(ms) if ms < 0 => Err(RedisError::Str("ERR AT must not be negative")),
        Some(ms) if ms > MAX_AT_MS => Err(RedisError::Str(
            "ERR AT must be at most 253402207200999 (9999-12-30T22:00:00.999Z)",
        )),
        Some(ms) => Ok(ms),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn max_at_is_the_latest_anchor() {
        assert_eq!(
            super::MAX_AT_MS,
            jiff::Timestamp::MAX.as_millisecond(),
            "{}",
            jiff::Timestamp::MAX
        );
    }
}
