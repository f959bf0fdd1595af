//! Logging set-up for the daemon (journald-friendly) and a rate limit for lines a dataset can
//! trigger once per sample.
//!
//! # Design
//! - Under systemd (`$JOURNAL_STREAM` set) lines carry no timestamp (the journal adds its
//!   own); colours only when stderr is a terminal.
//! - [`RateLimit`] lets at most `per_second` lines through per one-second window and reports
//!   how many it held back when the next window opens, so a corrupt dataset cannot flood the
//!   journal while the counters (metrics) still see every sample.

use std::io::IsTerminal;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Bad-sample log lines let through per second.
pub const BAD_SAMPLE_LINES_PER_SECOND: u32 = 10;

/// Sets up `tracing` for `stokerd`: `$RUST_LOG` filter (default `info`), stderr.
pub fn init_daemon() {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let ansi = std::io::stderr().is_terminal();
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .with_ansi(ansi);
    if std::env::var_os("JOURNAL_STREAM").is_some() {
        builder.without_time().init();
    } else {
        builder.init();
    }
}

/// At most N events per second; the rest are counted.
pub struct RateLimit {
    per_second: u32,
    state: Mutex<Window>,
}

struct Window {
    start: Option<Instant>,
    passed: u32,
    suppressed: u64,
}

/// What to do with one event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    /// Log it; `suppressed_before` lines were held back in the previous window(s).
    Log { suppressed_before: u64 },
    /// Over the limit: count it only.
    Suppress,
}

impl RateLimit {
    pub const fn new(per_second: u32) -> RateLimit {
        RateLimit {
            per_second,
            state: Mutex::new(Window {
                start: None,
                passed: 0,
                suppressed: 0,
            }),
        }
    }

    pub fn check(&self) -> Verdict {
        self.check_at(Instant::now())
    }

    fn check_at(&self, now: Instant) -> Verdict {
        let mut w = self.state.lock().unwrap_or_else(|e| e.into_inner());
        let fresh = match w.start {
            Some(s) => now.duration_since(s) >= Duration::from_secs(1),
            None => true,
        };
        if fresh {
            w.start = Some(now);
            w.passed = 0;
        }
        if w.passed < self.per_second {
            w.passed += 1;
            let suppressed_before = std::mem::take(&mut w.suppressed);
            Verdict::Log { suppressed_before }
        } else {
            w.suppressed += 1;
            Verdict::Suppress
        }
    }
}

/// The limit on "bad sample" lines, shared by every worker.
pub static BAD_SAMPLE_LOG: RateLimit = RateLimit::new(BAD_SAMPLE_LINES_PER_SECOND);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limits_per_window_and_reports_what_it_held_back() {
        let r = RateLimit::new(2);
        let t = Instant::now();
        assert_eq!(
            r.check_at(t),
            Verdict::Log {
                suppressed_before: 0
            }
        );
        assert_eq!(
            r.check_at(t),
            Verdict::Log {
                suppressed_before: 0
            }
        );
        assert_eq!(r.check_at(t), Verdict::Suppress);
        assert_eq!(
            r.check_at(t + Duration::from_millis(500)),
            Verdict::Suppress
        );
        assert_eq!(
            r.check_at(t + Duration::from_millis(1001)),
            Verdict::Log {
                suppressed_before: 2
            }
        );
    }
}
