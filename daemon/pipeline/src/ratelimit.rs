//! A log-line rate limiter: at most N lines per one-second window; lines past that are
//! counted, and the first line admitted in a later window carries how many were suppressed
//! ("suppressed K"), so a dataset full of bad files cannot flood the journal.
//!
//! # Design
//! - Fixed one-second windows, no clock thread: the limiter is consulted when a line is about
//!   to be written, and is cheap enough to sit behind a mutex on the error path.
//! - [`RateLimit::flush`] reports suppressed lines with no later line to carry them (at the end
//!   of a job, say).

#![forbid(unsafe_code)]

use std::time::{Duration, Instant};

/// Lines per second a [`RateLimit`] admits when the config does not say.
pub const DEFAULT_LINES_PER_SECOND: u32 = 20;

const WINDOW: Duration = Duration::from_secs(1);

/// What to do with one line.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Admit {
    /// Write it; `suppressed` lines were dropped since the last line written.
    Log {
        /// Lines dropped since the last line written.
        suppressed: u64,
    },
    /// Drop it (it is counted).
    Suppress,
}

/// At most `per_second` lines per window.
#[derive(Debug)]
pub struct RateLimit {
    per_second: u32,
    window_start: Option<Instant>,
    in_window: u32,
    suppressed: u64,
}

impl RateLimit {
    /// A limiter admitting `per_second` lines a second (0 admits none, counting them all).
    pub fn new(per_second: u32) -> RateLimit {
        RateLimit {
            per_second,
            window_start: None,
            in_window: 0,
            suppressed: 0,
        }
    }

    /// Decides about a line written at `now`.
    pub fn admit(&mut self, now: Instant) -> Admit {
        let fresh = match self.window_start {
            Some(start) => now.saturating_duration_since(start) >= WINDOW,
            None => true,
        };
        if fresh {
            self.window_start = Some(now);
            self.in_window = 0;
        }
        if self.in_window < self.per_second {
            self.in_window += 1;
            Admit::Log {
                suppressed: std::mem::take(&mut self.suppressed),
            }
        } else {
            self.suppressed += 1;
            Admit::Suppress
        }
    }

    /// Lines suppressed and not yet reported; resets the count.
    pub fn flush(&mut self) -> u64 {
        std::mem::take(&mut self.suppressed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn admits_n_per_window_then_reports_the_suppressed_count() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(3);
        for _ in 0..3 {
            assert_eq!(r.admit(t0), Admit::Log { suppressed: 0 });
        }
        for _ in 0..5 {
            assert_eq!(r.admit(t0 + Duration::from_millis(500)), Admit::Suppress);
        }
        assert_eq!(
            r.admit(t0 + Duration::from_millis(1000)),
            Admit::Log { suppressed: 5 }
        );
        assert_eq!(
            r.admit(t0 + Duration::from_millis(1001)),
            Admit::Log { suppressed: 0 }
        );
        assert_eq!(r.flush(), 0);
    }

    #[test]
    fn flush_returns_what_no_line_carried() {
        let t0 = Instant::now();
        let mut r = RateLimit::new(1);
        assert_eq!(r.admit(t0), Admit::Log { suppressed: 0 });
        assert_eq!(r.admit(t0), Admit::Suppress);
        assert_eq!(r.admit(t0), Admit::Suppress);
        assert_eq!(r.flush(), 2);
        assert_eq!(r.flush(), 0);
    }

    #[test]
    fn zero_admits_nothing() {
        let mut r = RateLimit::new(0);
        assert_eq!(r.admit(Instant::now()), Admit::Suppress);
        assert_eq!(r.flush(), 1);
    }
}
