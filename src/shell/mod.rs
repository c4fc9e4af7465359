//! The thin Redis shell around the pure core: argument parsing, replies, the data types'
//! callbacks, replication of effects, time, configs.

pub mod alloc;
pub mod apply;
pub mod apply_cmds;
pub mod args;
pub mod budget_cmds;
pub mod budget_type;
pub mod clock;
pub mod command;
pub mod command_docs;
pub mod config;
pub mod effects;
pub mod events;
pub mod key;
pub mod key_specs;
pub mod log_limit;
pub mod mapply;
pub mod memory;
pub mod multi_cmds;
pub mod persist;
pub mod replicate;
pub mod reply;
pub mod stats;
pub mod sweep_index;
pub mod sweeper;
pub mod type_methods;
pub mod usage;
pub mod window_apply;
pub mod window_cmds;
pub mod window_effects;
pub mod window_type;

/// Makes `msg` safe for the Redis log, which treats it as a printf format and stops at NUL,
/// and keeps it on one line (a decoder's message may hold a newline).
pub fn log_safe(msg: &str) -> String {
    msg.replace('%', "%%")
        .replace('\0', "\\0")
        .replace('\r', "\\r")
        .replace('\n', "\\n")
}

/// The crate reports a type mismatch as "Existing key has wrong Redis type" (no code prefix);
/// Redis clients expect the canonical `WRONGTYPE` error.
pub fn wrongtype<T>(r: Result<T, redis_module::RedisError>) -> Result<T, redis_module::RedisError> {
    r.map_err(|_| redis_module::RedisError::WrongType)
}

#[cfg(test)]
mod tests {
    #[test]
    fn log_lines_stay_one_line_and_literal() {
        assert_eq!(
            super::log_safe("a%sb\0c\r\nd"),
            "a%%sb\\0c\\r\\nd".to_string()
        );
    }
}
