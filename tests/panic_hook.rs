//! A panic, if one ever happens, is visible: the module's panic hook writes its message and
//! location to the Redis log (issue 6, item 6).
//!
//! No input can make the module panic (clippy denies unwrap/expect/indexing/unchecked
//! arithmetic/panic in the module code), so there is no command to trigger one. Instead the
//! module raises one deliberate panic at load, inside `catch_unwind`, through the hook it has
//! just installed: the line it leaves in the log proves, on the real server, that a panic's
//! message and `file:line:col` reach the Redis log as one line, and that the server survives it.

mod common;
use common::*;

/// The log line the hook wrote for the load-time self-test panic.
fn self_test_line(log: &str) -> Option<String> {
    log.lines()
        .find(|l| l.contains("quota: crash hook installed"))
        .map(str::to_string)
}

#[test]
fn the_panic_hook_writes_message_and_location_to_the_redis_log() {
    let mut s = Server::start(&[]);
    let log = s.log();
    let line = self_test_line(&log).unwrap_or_else(|| panic!("no panic hook line in:\n{log}"));
    // Message and location, on one line (a multi-line entry would be split by log shippers).
    assert!(
        line.contains("(self-test 'quota crash hook self-test' reached it from src/lib.rs:"),
        "{line}"
    );
    // No "panic" on a healthy start: log alerts match on it.
    assert!(!line.to_lowercase().contains("panic"), "{line}");
    // Written before the module finished loading, i.e. before any command can run.
    let hook_at = log.find("quota: crash hook installed").unwrap();
    let loaded_at = log.find("Module 'quota' loaded").unwrap();
    assert!(hook_at < loaded_at);
    // The panic was caught: the server is up and serves commands; no real panic was logged.
    assert!(s.alive());
    let mut c = s.conn();
    ok(&mut c, &["QUOTA.SET", "t", "LIMIT", "10"]);
    assert_eq!(info(&mut c, "t")["limit"], 10);
    assert!(!s.log().contains("quota: PANIC"), "{}", s.log());
}
