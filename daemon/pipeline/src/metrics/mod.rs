//! The metric handles the pipeline records through: the catalogue of every series
//! ([`catalogue`]: names, kinds, units, help, labels, and which event records each one,
//! once), the atomic latency histogram ([`histogram`]) and the images/s rate ([`rate`]).
//! Recording goes through the `metrics` facade (a no-op until a recorder is installed); the
//! daemon installs the Prometheus recorder and serves `/metrics`.

#![forbid(unsafe_code)]

pub mod catalogue;
pub mod histogram;
pub mod rate;

pub use catalogue::*;
pub use histogram::{HistogramSnapshot, LatencyHistogram};
pub use rate::Throughput;

/// Histogram buckets for stage latency (seconds): 10 µs to 2.5 s.
pub const STAGE_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5,
];
