//! Time and counts per stage, summed over every worker of an engine.
//!
//! # Design
//! - Relaxed atomics: totals are read for reports, never to decide anything.
//!
//! # Limitations
//! - Sums only; the latency histograms are in the metrics (`crate::service::metrics`).

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::transform::badsample::BadCounts;

/// Time and counts per stage, summed over workers.
#[derive(Debug, Default)]
pub struct StageStats {
    pub images: AtomicU64,
    pub bad: AtomicU64,
    pub bytes_read: AtomicU64,
    pub read_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub augment_ns: AtomicU64,
    pub batches: AtomicU64,
    /// `bad`, split by reason code.
    pub bad_by_reason: BadCounts,
}

/// A snapshot of [`StageStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageTotals {
    pub images: u64,
    pub bad: u64,
    pub bytes_read: u64,
    pub read_ns: u64,
    pub decode_ns: u64,
    pub augment_ns: u64,
    pub batches: u64,
}

impl StageStats {
    pub fn totals(&self) -> StageTotals {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StageTotals {
            images: g(&self.images),
            bad: g(&self.bad),
            bytes_read: g(&self.bytes_read),
            read_ns: g(&self.read_ns),
            decode_ns: g(&self.decode_ns),
            augment_ns: g(&self.augment_ns),
            batches: g(&self.batches),
        }
    }
}
