//! Rate-limited warnings: a flood of the same failure (corrupt `RESTORE` payloads, one
//! warning each) must not fill the Redis log. A [`LogLimit`] lets one warning through per
//! interval of the server's clock and counts the ones it held back, which the next warning
//! that passes reports. No thread, no timer: the decision is taken when a warning comes.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// One warning per `interval_ms` at most; the others are counted. Atomics only, so it may
/// be used from any thread (RDB loading may run off the main thread).
pub struct LogLimit {
    interval_ms: i64,
    /// Unix ms before which warnings are held back (`i64::MIN`: none logged yet).
    next_ms: AtomicI64,
    /// Warnings held back since the last one logged.
    held_back: AtomicU64,
}

impl LogLimit {
    /// A limit of one warning per `interval_ms`.
    pub const fn new(interval_ms: i64) -> Self {
        LogLimit {
            interval_ms,
            next_ms: AtomicI64::new(i64::MIN),
            held_back: AtomicU64::new(0),
        }
    }

    /// Whether a warning at `now_ms` (the server's clock, unix ms) may be logged: `Some(n)`
    /// with the number `n` of warnings held back since the previous one logged, or `None`
    /// (counted as held back). A clock that goes back lets the warning through.
    pub fn admit(&self, now_ms: i64) -> Option<u64> {
        let next = self.next_ms.load(Ordering::Relaxed);
        let due = now_ms >= next || next.saturating_sub(now_ms) > self.interval_ms;
        let until = now_ms.saturating_add(self.interval_ms);
        if due
            && self
                .next_ms
                .compare_exchange(next, until, Ordering::Relaxed, Ordering::Relaxed)
                .is_ok()
        {
            return Some(self.held_back.swap(0, Ordering::Relaxed));
        }
        self.held_back.fetch_add(1, Ordering::Relaxed);
        None
    }
}

/// `msg`, then how many like it were held back (`n`) if any: the text of a warning that
/// [`LogLimit::admit`] let through.
pub fn with_held_back(msg: &str, n: u64) -> String {
    match n {
        0 => msg.to_string(),
        n => format!("{msg} ({n} more since the previous one, not logged)"),
    }
}

#[cfg(test)]
mod tests {
    use super::{with_held_back, LogLimit};

    #[test]
    fn one_warning_per_interval_and_the_count_of_the_others() {
        let l = LogLimit::new(1000);
        assert_eq!(l.admit(5_000), Some(0));
        assert_eq!(l.admit(5_000), None);
        assert_eq!(l.admit(5_999), None);
        assert_eq!(l.admit(6_000), Some(2));
        assert_eq!(l.admit(6_500), None);
        // Long after: the one held back is still reported.
        assert_eq!(l.admit(60_000), Some(1));
        assert_eq!(l.admit(60_001), None);
        // A clock set back by more than the interval does not silence warnings.
        assert_eq!(l.admit(10_000), Some(1));
        assert_eq!(l.admit(10_001), None);
    }

    #[test]
    fn the_held_back_count_is_appended() {
        assert_eq!(with_held_back("x: refused", 0), "x: refused");
        assert_eq!(
            with_held_back("x: refused", 3),
            "x: refused (3 more since the previous one, not logged)"
        );
    }
}
