//! Bad samples: why a sample could not be delivered ([`BadSample`], with the stable reason
//! codes of [`crate::source::local::reader::ReadError::reason`] and [`crate::transform::decode::DecodeError::reason`]),
//! counted by reason ([`BadCounts`]), and logged once per file, rate-limited
//! ([`BadSampleLog`]).
//!
//! # Design
//! - Counters are a fixed array of atomics indexed by [`REASONS`]: no lock, no allocation on
//!   the error path. A code not in the list counts as `other`.
//! - A file is logged the first time it is met (path and reason); later meetings (other
//!   epochs, other jobs) are counted but not logged. The set of logged files is capped at
//!   [`MAX_REMEMBERED_FILES`]; past it every meeting is logged, still rate-limited.
//! - Logging goes through [`RateLimit`]: at most N lines a second, then one "suppressed K".
//! - Each job also keeps its own count and the first few distinct names ([`BadNames`]), which
//!   the daemon tells that job's clients (BAD_SAMPLES), so a training script can say which
//!   files were bad without the daemon's log.

#![forbid(unsafe_code)]

use std::collections::{BTreeMap, HashSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use stoker_wire::protocol::{BadSamples, BAD_NAMES, BAD_NAMES_BYTES};

use crate::ratelimit::{Admit, RateLimit};
use crate::source::local::reader::ReadError;
use crate::transform::decode::DecodeError;

/// Every reason a sample can be bad: read reasons, then decode reasons, then `other` (the
/// label values of the bad-samples series, so the metric names own the list).
pub use crate::metrics::catalogue::BAD_SAMPLE_REASONS as REASONS;

/// Files remembered as already logged.
pub const MAX_REMEMBERED_FILES: usize = 1 << 20;

/// Why one sample could not be delivered.
#[derive(Debug, Clone, PartialEq)]
pub struct BadSample {
    /// A code from [`REASONS`].
    pub reason: &'static str,
    /// The full message, for the log.
    pub detail: String,
}

impl From<&ReadError> for BadSample {
    fn from(e: &ReadError) -> BadSample {
        BadSample {
            reason: e.reason(),
            detail: e.to_string(),
        }
    }
}

impl From<DecodeError> for BadSample {
    fn from(e: DecodeError) -> BadSample {
        BadSample {
            reason: e.reason(),
            detail: e.to_string(),
        }
    }
}

/// Bad samples met, by reason.
#[derive(Debug)]
pub struct BadCounts {
    counts: [AtomicU64; REASONS.len()],
}

impl Default for BadCounts {
    fn default() -> Self {
        BadCounts {
            counts: std::array::from_fn(|_| AtomicU64::new(0)),
        }
    }
}

impl BadCounts {
    /// Counts one bad sample under `reason` (one of [`REASONS`]).
    pub fn add(&self, reason: &str) {
        let i = REASONS
            .iter()
            .position(|r| *r == reason)
            .unwrap_or(REASONS.len() - 1);
        self.counts[i].fetch_add(1, Ordering::Relaxed);
    }

    /// The reasons met so far and how often (reasons never met are left out).
    pub fn snapshot(&self) -> BTreeMap<&'static str, u64> {
        REASONS
            .iter()
            .zip(&self.counts)
            .map(|(r, c)| (*r, c.load(Ordering::Relaxed)))
            .filter(|(_, n)| *n > 0)
            .collect()
    }
}

/// Logs each bad file once, at most `per_second` lines a second.
#[derive(Debug)]
pub struct BadSampleLog {
    inner: Mutex<LogState>,
}

#[derive(Debug)]
struct LogState {
    seen: HashSet<String>,
    limit: RateLimit,
}

impl BadSampleLog {
    /// A log writing at most `per_second` lines a second.
    pub fn new(per_second: u32) -> BadSampleLog {
        BadSampleLog {
            inner: Mutex::new(LogState {
                seen: HashSet::new(),
                limit: RateLimit::new(per_second),
            }),
        }
    }

    /// Logs `bad` for the file `path` unless it was logged before or the rate limit says no.
    /// Returns whether a line was written.
    pub fn log(&self, path: &str, bad: &BadSample) -> bool {
        let mut st = self.inner.lock().unwrap_or_else(|e| e.into_inner());
        if st.seen.contains(path) {
            return false;
        }
        if st.seen.len() < MAX_REMEMBERED_FILES {
            st.seen.insert(path.to_owned());
        }
        match st.limit.admit(Instant::now()) {
            Admit::Suppress => false,
            Admit::Log { suppressed } => {
                drop(st);
                if suppressed > 0 {
                    tracing::warn!(suppressed, "bad sample lines suppressed by the rate limit");
                }
                tracing::warn!(
                    sample = %path,
                    reason = bad.reason,
                    detail = %bad.detail,
                    "bad sample"
                );
                true
            }
        }
    }
}

/// One job's bad samples: how many were met, and the first few distinct files' names
/// (at most [`BAD_NAMES`] names of [`BAD_NAMES_BYTES`] in all).
#[derive(Debug, Default)]
pub struct BadNames {
    count: AtomicU64,
    first: Mutex<Vec<String>>,
}

impl BadNames {
    /// Counts one bad sample; `name` (its file, as the job's clients should read it) is asked
    /// for only while there is room for another name.
    pub fn note(&self, name: impl FnOnce() -> String) {
        let mut first = crate::sync::lock(&self.first);
        if first.len() < BAD_NAMES {
            let name = name();
            let bytes: usize = first.iter().map(String::len).sum();
            if bytes + name.len() <= BAD_NAMES_BYTES && !first.contains(&name) {
                first.push(name);
            }
        }
        // Counted under the lock, so a count read with the names covers them.
        self.count.fetch_add(1, Ordering::Relaxed);
    }

    /// Bad samples met so far (cheap: read before every batch a client is sent).
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// The count and the names, as BAD_SAMPLES carries them.
    pub fn snapshot(&self) -> BadSamples {
        let first = crate::sync::lock(&self.first);
        BadSamples {
            count: self.count(),
            first: first.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_job_keeps_the_first_distinct_names_and_counts_every_meeting() {
        let names = BadNames::default();
        names.note(|| "a/broken.jpg".into());
        names.note(|| "a/broken.jpg".into());
        for i in 0..2 * BAD_NAMES {
            names.note(|| format!("b/{i}.jpg"));
        }
        let got = names.snapshot();
        assert_eq!(got.count, 2 + 2 * BAD_NAMES as u64);
        assert_eq!(got.first.len(), BAD_NAMES);
        assert_eq!(got.first[..2], ["a/broken.jpg", "b/0.jpg"]);
        let long = BadNames::default();
        long.note(|| "x".repeat(BAD_NAMES_BYTES));
        long.note(|| "y".into());
        assert_eq!(
            long.snapshot().first.len(),
            1,
            "over the bytes: counted only"
        );
        assert_eq!(long.count(), 2);
    }

    #[test]
    fn every_read_and_decode_reason_has_a_counter() {
        let read = [
            ReadError::Setup(crate::source::local::reader::SetupError::NoRead),
            ReadError::NotFound { path: "p".into() },
            ReadError::Permission { path: "p".into() },
            ReadError::ShortRead {
                path: "p".into(),
                offset: 0,
                want: 1,
                got: 0,
            },
        ];
        for e in &read {
            assert!(REASONS.contains(&e.reason()), "{}", e.reason());
        }
        let decode = [
            DecodeError::UnknownFormat { what: "x".into() },
            DecodeError::TruncatedImage {
                format: crate::transform::decode::ImageFormat::Png,
                detail: "x".into(),
            },
            DecodeError::Truncated { detail: "x".into() },
            DecodeError::FileTooLarge { len: 2, limit: 1 },
            DecodeError::TooLarge {
                w: 1,
                h: 1,
                limit: 0,
            },
            DecodeError::TooManyScans { limit: 1 },
            DecodeError::Internal { detail: "x".into() },
        ];
        for e in decode {
            assert!(REASONS.contains(&e.reason()), "{}", e.reason());
        }
    }

    #[test]
    fn counts_by_reason_and_unknown_as_other() {
        let c = BadCounts::default();
        c.add("truncated");
        c.add("truncated");
        c.add("not_found");
        c.add("something new");
        let s = c.snapshot();
        assert_eq!(s["truncated"], 2);
        assert_eq!(s["not_found"], 1);
        assert_eq!(s["other"], 1);
        assert_eq!(s.len(), 3);
    }

    #[test]
    fn a_file_is_logged_once() {
        let log = BadSampleLog::new(100);
        let bad = BadSample {
            reason: "corrupt",
            detail: "x".into(),
        };
        assert!(log.log("/a.jpg", &bad));
        assert!(!log.log("/a.jpg", &bad));
        assert!(log.log("/b.jpg", &bad));
    }
}
