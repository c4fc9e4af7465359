//! Time for commands on the master: the wall clock, or a client's `AT` under `quota.test-clock`.
//! Replicas and AOF replays never come here: they take the time carried by the effects.

use redis_module::{raw, RedisError};

use crate::shell::config;

/// Redis's wall clock in unix ms.
pub fn wall_ms() -> i64 {
    // SAFETY: the pointer is filled in by RedisModule_Init before any command runs.
    unsafe { raw::RedisModule_Milliseconds.map(|f| f()).unwrap_or(0) }
}

/// Latest `AT` accepted, unix ms: 9999-11-01T00:00Z. Every calendar period containing it (a
/// month at most, in any zone) still ends within the range periods support (jiff's, to
/// 9999-12-30T22:00Z), so no test-clock call reaches a time where a budget's period cannot be
/// computed, nor the end of `i64`, where every later deadline would overflow.
pub const MAX_AT_MS: i64 = 253_397_030_400_000;

/// The time a command runs at: `AT` if given (test clock only), else the wall clock.
pub fn command_ms(at: Option<i64>) -> Result<i64, RedisError> {
    match at {
        None => Ok(wall_ms()),
        Some(_) if !config::test_clock() => Err(RedisError::Str(
            "ERR AT is only accepted when quota.test-clock is yes",
        )),
        Some(ms) if ms < 0 => Err(RedisError::Str("ERR AT must not be negative")),
        Some(ms) if ms > MAX_AT_MS => Err(RedisError::Str(
            "ERR AT must be at most 253397030400000 (9999-11-01T00:00:00Z)",
        )),
        Some(ms) => Ok(ms),
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn max_at_leaves_a_month_in_any_zone_within_the_calendar() {
        let at = jiff::Timestamp::from_millisecond(super::MAX_AT_MS).map(|t| t.to_string());
        assert_eq!(at.ok().as_deref(), Some("9999-11-01T00:00:00Z"));
        // A month plus the widest offset still fits before jiff's last instant.
        let room = jiff::Timestamp::MAX.as_millisecond() - super::MAX_AT_MS;
        assert!(room > (31 * 24 + 26) * 3_600_000, "{room}");
    }
}
