//! Time and counts per stage, summed over every worker of an engine: the one record of these
//! events (see `crate::metrics::catalogue`), read by `stoker status`, `stoker bench`
//! and, at scrape time, the metrics.
//!
//! # Design
//! - Relaxed atomics: totals are read for reports, never to decide anything.
//! - Stage latencies are [`LatencyHistogram`]s: their sums are the stage times, their buckets
//!   the Prometheus histograms.
//!
//! # Limitations
//! - Per engine: the server adds the engines' figures up.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use crate::metrics::{HistogramSnapshot, LatencyHistogram};
use crate::transform::badsample::BadCounts;

/// Time and counts per stage, summed over workers.
#[derive(Debug, Default)]
pub struct StageStats {
    /// Samples written into slots (delivered, replaced or failed).
    pub images: AtomicU64,
    /// Samples read from storage without error.
    pub images_read: AtomicU64,
    /// Bad samples (replaced or failed).
    pub bad: AtomicU64,
    /// Encoded bytes read from storage.
    pub bytes_read: AtomicU64,
    /// One sample per unit of work's batched read.
    pub read: LatencyHistogram,
    /// One sample per image decoded (and augmented) on the CPU.
    pub decode: LatencyHistogram,
    /// One sample per image augmented on the CPU.
    pub augment: LatencyHistogram,
    /// Batches published.
    pub batches: AtomicU64,
    /// `bad`, split by reason code.
    pub bad_by_reason: BadCounts,
}

/// A snapshot of [`StageStats`]' sums.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageTotals {
    /// Samples written into slots (delivered, replaced or failed).
    pub images: u64,
    /// Samples read from storage without error.
    pub images_read: u64,
    /// Images decoded and augmented on the CPU.
    pub images_decoded: u64,
    /// Bad samples (replaced or failed).
    pub bad: u64,
    /// Encoded bytes read from storage.
    pub bytes_read: u64,
    /// Time in batched reads, summed over workers, in nanoseconds.
    pub read_ns: u64,
    /// Time decoding on the CPU, summed over workers, in nanoseconds.
    pub decode_ns: u64,
    /// Time augmenting on the CPU, summed over workers, in nanoseconds.
    pub augment_ns: u64,
    /// Batches published.
    pub batches: u64,
}

/// A snapshot of [`StageStats`]' latency histograms.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StageHistograms {
    /// Per batched read of a unit.
    pub read: HistogramSnapshot,
    /// Per image decoded on the CPU.
    pub decode: HistogramSnapshot,
    /// Per image augmented on the CPU.
    pub augment: HistogramSnapshot,
}

impl StageStats {
    /// The sums so far.
    pub fn totals(&self) -> StageTotals {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StageTotals {
            images: g(&self.images),
            images_read: g(&self.images_read),
            images_decoded: self.decode.count(),
            bad: g(&self.bad),
            bytes_read: g(&self.bytes_read),
            read_ns: self.read.sum_ns(),
            decode_ns: self.decode.sum_ns(),
            augment_ns: self.augment.sum_ns(),
            batches: g(&self.batches),
        }
    }

    /// The latency histograms so far.
    pub fn histograms(&self) -> StageHistograms {
        StageHistograms {
            read: self.read.snapshot(),
            decode: self.decode.snapshot(),
            augment: self.augment.snapshot(),
        }
    }
}

impl StageTotals {
    /// Adds another engine's totals.
    pub fn add(&mut self, o: &StageTotals) {
        self.images += o.images;
        self.images_read += o.images_read;
        self.images_decoded += o.images_decoded;
        self.bad += o.bad;
        self.bytes_read += o.bytes_read;
        self.read_ns += o.read_ns;
        self.decode_ns += o.decode_ns;
        self.augment_ns += o.augment_ns;
        self.batches += o.batches;
    }
}

impl StageHistograms {
    /// Adds another engine's histograms.
    pub fn add(&mut self, o: &StageHistograms) {
        self.read.add(&o.read);
        self.decode.add(&o.decode);
        self.augment.add(&o.augment);
    }
}
