//! Errors the agent survives: every one counted by kind, and logged with its own message at
//! most once per kind per [`LOG_EVERY_NS`], the line carrying how many were not logged since.
//!
//! A fault that repeats at probe rate (a full disk, a dead route) must neither flood the log nor
//! vanish from it: the first occurrence is logged at once with what the error says (a path, a
//! reserve size, a hint), and the counters say how often it happened. Nothing is formatted unless
//! it is logged, so the hot path pays one comparison per error.

use std::fmt::Display;

/// Shortest interval between two log lines of one kind of error.
pub const LOG_EVERY_NS: u64 = 30_000_000_000;

/// Counts and throttled log lines for `N` kinds of error of one component (a shard, a transport).
#[derive(Debug)]
pub struct ErrorLog<const N: usize> {
    /// Who logs (a device name), for the log lines.
    scope: String,
    names: [&'static str; N],
    count: [u64; N],
    /// `count` as of the last line logged, so the next line can say how many went unlogged.
    logged: [u64; N],
    next_log_ns: [u64; N],
}

impl<const N: usize> ErrorLog<N> {
    /// A log for `scope` whose kinds are named `names` (index = kind).
    pub fn new(scope: impl Into<String>, names: [&'static str; N]) -> Self {
        Self { scope: scope.into(), names, count: [0; N], logged: [0; N], next_log_ns: [0; N] }
    }

    /// One error of `kind`: counted always, logged (warn) with `message` unless a line of this
    /// kind was logged less than [`LOG_EVERY_NS`] ago. Returns whether it was logged.
    pub fn record(&mut self, kind: usize, now_ns: u64, message: impl Display) -> bool {
        self.count[kind] += 1;
        if now_ns < self.next_log_ns[kind] {
            return false;
        }
        let unlogged = self.count[kind] - self.logged[kind] - 1;
        tracing::warn!(
            scope = %self.scope,
            error = self.names[kind],
            total = self.count[kind],
            unlogged_since_last_line = unlogged,
            "{message}"
        );
        self.logged[kind] = self.count[kind];
        self.next_log_ns[kind] = now_ns.saturating_add(LOG_EVERY_NS);
        true
    }

    /// How many errors of `kind` were recorded.
    pub fn count(&self, kind: usize) -> u64 {
        self.count[kind]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_error_is_counted_and_each_kind_logged_once_per_interval() {
        let mut log = ErrorLog::new("mlx5_0", ["recv", "write"]);
        assert!(log.record(0, 1_000, "first: logged at once"));
        for i in 0..999 {
            assert!(!log.record(0, 1_000 + i, "repeats within the interval are only counted"));
        }
        assert!(log.record(1, 2_000, "another kind has its own throttle"));
        assert_eq!((log.count(0), log.count(1)), (1000, 1));
        assert!(log.record(0, 1_000 + LOG_EVERY_NS, "the next interval logs again"));
        assert_eq!((log.count(0), log.count(1)), (1001, 1));
    }
}
