//! A latency histogram kept in atomics: the one record of a timed event, read back by the
//! daemon itself (sums for `stoker status` and `stoker bench`) and rendered as a Prometheus
//! histogram at scrape time, in the exporter's own text format.
//!
//! # Design
//! - Fixed buckets ([`super::STAGE_BUCKETS`], seconds); recording is three relaxed atomic adds,
//!   no lock and no allocation.
//!
//! # Limitations
//! - Counts only grow (like every Prometheus counter); a sample past the last bucket counts
//!   only in `+Inf`.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};

use metrics_exporter_prometheus::formatting::{
    sanitize_label_value, write_help_line, write_metric_line, write_type_line,
};

use super::catalogue::find;
use super::STAGE_BUCKETS;

const BUCKETS: usize = STAGE_BUCKETS.len();

/// Samples of one latency, in [`STAGE_BUCKETS`].
#[derive(Debug, Default)]
pub struct LatencyHistogram {
    /// Samples per bucket (not cumulative): bucket `i` holds those at most `STAGE_BUCKETS[i]`
    /// and above the bucket before.
    buckets: [AtomicU64; BUCKETS],
    count: AtomicU64,
    sum_ns: AtomicU64,
}

/// What a [`LatencyHistogram`] held when read; snapshots of several add up.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct HistogramSnapshot {
    /// Samples per bucket of [`super::STAGE_BUCKETS`] (not cumulative; slower samples
    /// than the last bound are only in `count`).
    pub buckets: [u64; BUCKETS],
    /// Samples recorded.
    pub count: u64,
    /// Nanoseconds recorded, summed.
    pub sum_ns: u64,
}

impl LatencyHistogram {
    /// Records one sample of `ns` nanoseconds.
    pub fn record_ns(&self, ns: u64) {
        // Nanoseconds to seconds for the bucket bounds; a u64 of ns is exact enough as f64.
        #[allow(clippy::cast_precision_loss)]
        let seconds = ns as f64 * 1e-9;
        if let Some(i) = STAGE_BUCKETS.iter().position(|&b| seconds <= b) {
            self.buckets[i].fetch_add(1, Ordering::Relaxed);
        }
        self.count.fetch_add(1, Ordering::Relaxed);
        self.sum_ns.fetch_add(ns, Ordering::Relaxed);
    }

    /// Nanoseconds recorded, summed.
    pub fn sum_ns(&self) -> u64 {
        self.sum_ns.load(Ordering::Relaxed)
    }

    /// Samples recorded.
    pub fn count(&self) -> u64 {
        self.count.load(Ordering::Relaxed)
    }

    /// What it holds now.
    pub fn snapshot(&self) -> HistogramSnapshot {
        HistogramSnapshot {
            buckets: std::array::from_fn(|i| self.buckets[i].load(Ordering::Relaxed)),
            count: self.count(),
            sum_ns: self.sum_ns(),
        }
    }
}

impl HistogramSnapshot {
    /// Adds `other`'s samples (the same latency on another engine).
    pub fn add(&mut self, other: &HistogramSnapshot) {
        for (a, b) in self.buckets.iter_mut().zip(&other.buckets) {
            *a += b;
        }
        self.count += other.count;
        self.sum_ns += other.sum_ns;
    }
}

/// Labels and figures of one series of a histogram family.
pub type HistogramRow<'a> = (Vec<(&'a str, String)>, HistogramSnapshot);

/// Appends the catalogue's histogram `name` with one row of buckets per label set, as the
/// exporter renders its own histograms: `# HELP`, `# TYPE`, cumulative `_bucket{le=...}`
/// lines, `+Inf`, `_sum` in seconds and `_count`, then a blank line. Nothing when `rows` is
/// empty (or `name` is not in the catalogue, which its tests rule out for every name used).
pub fn render(out: &mut String, name: &str, rows: &[HistogramRow<'_>]) {
    let Some(series) = find(name).filter(|_| !rows.is_empty()) else {
        return;
    };
    write_help_line(out, series.name, series.help);
    write_type_line(out, series.name, series.kind.name());
    for (labels, h) in rows {
        let labels: Vec<String> = labels
            .iter()
            .map(|(k, v)| format!("{k}=\"{}\"", sanitize_label_value(v)))
            .collect();
        let mut cumulative = 0;
        for (bound, n) in STAGE_BUCKETS.iter().zip(&h.buckets) {
            cumulative += n;
            let le = Some(("le", bound));
            write_metric_line(
                out,
                series.name,
                Some("bucket"),
                &labels,
                le,
                cumulative,
                None,
            );
        }
        write_metric_line(
            out,
            series.name,
            Some("bucket"),
            &labels,
            Some(("le", "+Inf")),
            h.count,
            None,
        );
        // Seconds as the exporter writes them (an f64).
        #[allow(clippy::cast_precision_loss)]
        let sum = h.sum_ns as f64 * 1e-9;
        write_metric_line::<&str, f64>(out, series.name, Some("sum"), &labels, None, sum, None);
        write_metric_line::<&str, u64>(
            out,
            series.name,
            Some("count"),
            &labels,
            None,
            h.count,
            None,
        );
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::metrics::catalogue::STAGE_SECONDS;

    #[test]
    fn samples_land_in_their_bucket_and_render_cumulatively() {
        let h = LatencyHistogram::default();
        h.record_ns(5_000); // 5 µs: the first bucket (10 µs)
        h.record_ns(2_000_000); // 2 ms: the 2.5 ms bucket
        h.record_ns(10_000_000_000); // 10 s: past the last bucket, +Inf only
        assert_eq!((h.count(), h.sum_ns()), (3, 10_002_005_000));
        let mut twice = h.snapshot();
        twice.add(&h.snapshot());
        let mut out = String::new();
        render(
            &mut out,
            STAGE_SECONDS,
            &[(vec![("stage", "read".to_owned())], twice)],
        );
        assert!(out.starts_with("# HELP stoker_stage_seconds "), "{out}");
        assert!(
            out.contains("# TYPE stoker_stage_seconds histogram\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_bucket{stage=\"read\",le=\"0.00001\"} 2\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_bucket{stage=\"read\",le=\"0.0025\"} 4\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_bucket{stage=\"read\",le=\"2.5\"} 4\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_bucket{stage=\"read\",le=\"+Inf\"} 6\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_count{stage=\"read\"} 6\n"),
            "{out}"
        );
        assert!(
            out.contains("stoker_stage_seconds_sum{stage=\"read\"} 20.00401"),
            "{out}"
        );
    }
}
