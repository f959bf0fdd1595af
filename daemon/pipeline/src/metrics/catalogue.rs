//! The metrics catalogue: every series stokerd exports, with its name, kind, unit, help text
//! and labels, in one table ([`ALL`]). [`super::install`] describes and registers from it,
//! `docs/operations.md` lists the same names (a test compares them), and the code that records
//! a series names it through the constants below.
//!
//! # Design
//! - **Each event is recorded once.** What the daemon reads back itself (`stoker status`,
//!   `stoker bench`, systemd's `STATUS=`) is recorded once in atomics: the engine's
//!   [`crate::engine::StageStats`] (images read, bytes, stage latencies, bad samples by
//!   reason), the server's delivered count and gauges, each GPU's decode mix and latencies.
//!   At scrape time the server feeds them to the exporter (counters with `absolute`, gauges
//!   with `set`) and renders the latency histograms from their atomic buckets
//!   ([`super::histogram`]), so a scrape and `stoker status` read the same record. Events
//!   nothing in the daemon reads back (READY slots outstanding, connections, reloads, the
//!   decode backend mix, object storage's bytes, retries and cache lookups) are recorded
//!   with the `metrics` macros only. [`Series::source`] says which.
//! - Names and labels are what dashboards query: they never change here without the docs.
//!
//! # Limitations
//! - Series whose label values are known only at run time (`gpu`, `code`, `job`, `rank`)
//!   appear with their first value, not at zero from the start.

#![forbid(unsafe_code)]

use metrics::Unit;

/// What a series is, in Prometheus' terms.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Only goes up (a `_total`).
    Counter,
    /// Goes up and down (a level now).
    Gauge,
    /// Buckets, a count and a sum (seconds).
    Histogram,
}

impl Kind {
    /// The `# TYPE` word.
    pub fn name(self) -> &'static str {
        match self {
            Kind::Counter => "counter",
            Kind::Gauge => "gauge",
            Kind::Histogram => "histogram",
        }
    }
}

/// Where a scrape's figures for a series come from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    /// The `metrics` recorder: the `metrics` macros at the event, or atomics fed to it at
    /// scrape time.
    Recorder,
    /// Text the daemon renders at scrape time from its own atomics (latency histograms, the
    /// per-rank data stall).
    Rendered,
}

/// The label sets a series has from the start (registered at zero by [`super::install`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AtStart {
    /// None: its label values are known only at run time.
    Nothing,
    /// The series without labels.
    Plain,
    /// One series per value of this label.
    Each(&'static str, &'static [&'static str]),
}

/// One series (a Prometheus family).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Series {
    /// The family's name (`stoker_...`).
    pub name: &'static str,
    /// Its Prometheus type.
    pub kind: Kind,
    /// The unit of its values.
    pub unit: Unit,
    /// The `# HELP` text.
    pub help: &'static str,
    /// Its label names (values in the docs' metrics table).
    pub labels: &'static [&'static str],
    /// Where a scrape's figures come from.
    pub source: Source,
    /// The label sets registered at zero when the daemon starts.
    pub at_start: AtStart,
}

/// Every reason a sample can be bad (`transform::badsample::REASONS`): read reasons
/// (`ReadError::reason`), then decode reasons (`DecodeError::reason`), then `other`.
pub const BAD_SAMPLE_REASONS: &[&str] = &[
    // ReadError::reason
    "setup",
    "not_found",
    "permission",
    "short_read",
    "io",
    "not_regular",
    "symlink",
    "changed",
    "credentials",
    // DecodeError::reason
    "unknown_format",
    "truncated",
    "corrupt",
    "corrupt_warning",
    "unsupported",
    "too_large",
    "file_too_large",
    "too_many_scans",
    "bad_crop",
    "internal",
    "other",
];

/// Images through each stage: `stage` = read, decode, augment, delivered.
pub const IMAGES_TOTAL: &str = "stoker_images_total";
/// Bytes read from storage.
pub const BYTES_READ_TOTAL: &str = "stoker_bytes_read_total";
/// Latency per stage (`stage` = read per unit of samples; decode, augment per image).
pub const STAGE_SECONDS: &str = "stoker_stage_seconds";
/// Images decoded, by `backend` (cpu, cuda, hybrid).
pub const DECODE_TOTAL: &str = "stoker_decode_total";
/// Samples that could not be used, by `reason` ([`BAD_SAMPLE_REASONS`]).
pub const BAD_SAMPLES_TOTAL: &str = "stoker_bad_samples_total";
/// Filled slots sent to clients and not yet released (queue depth on the client side).
pub const READY_SLOTS: &str = "stoker_ready_slots";
/// Ranks attached.
pub const CLIENTS: &str = "stoker_clients";
/// Jobs served.
pub const JOBS: &str = "stoker_jobs";
/// Ring memory mapped for clients, by `memory` (host; device with `gpu`).
pub const RING_BYTES: &str = "stoker_ring_bytes";
/// Bytes the JPEG entry-point table holds, every user's together.
pub const ENTRY_TABLE_BYTES: &str = "stoker_entry_table_bytes";
/// Bytes the indexes of the jobs served hold, each index counted once however many jobs
/// share it.
pub const INDEX_BYTES: &str = "stoker_index_bytes";
/// Config reloads, by `result` (ok, error).
pub const RELOADS_TOTAL: &str = "stoker_reloads_total";
/// Connections accepted (attaches and status requests).
pub const CONNECTIONS_TOTAL: &str = "stoker_connections_total";
/// Bytes of samples' objects, by `source`: `s3` (downloaded) or `cache` (found local).
pub const S3_BYTES_TOTAL: &str = "stoker_s3_bytes_total";
/// Objects asked of the node cache, by `result`: `hit`, `miss`, or `rejected` (an entry that
/// failed its check before use, deleted and fetched again).
pub const S3_CACHE_REQUESTS_TOTAL: &str = "stoker_s3_cache_requests_total";
/// Downloads in flight now.
pub const S3_IN_FLIGHT: &str = "stoker_s3_requests_in_flight";
/// Requests tried again (throttling, 5xx, timeouts, connection errors).
pub const S3_RETRIES_TOTAL: &str = "stoker_s3_retries_total";
/// Requests that failed for good, by S3 error `code`.
pub const S3_ERRORS_TOTAL: &str = "stoker_s3_errors_total";
/// The data stall of each rank (recent share of its loop's time waiting), by `job`, `rank`.
pub const CLIENT_WAIT_FRACTION: &str = "stoker_client_wait_fraction";
/// Seconds each rank's loop waited inside `next()`, by `job`, `rank`.
pub const CLIENT_WAIT_SECONDS_TOTAL: &str = "stoker_client_wait_seconds_total";
/// Seconds each rank's loop spent between `next()` calls, by `job`, `rank`.
pub const CLIENT_COMPUTE_SECONDS_TOTAL: &str = "stoker_client_compute_seconds_total";
/// Images decoded on a GPU, by `gpu` (UUID) and `path` (hardware, hybrid, cpu).
/// Units sent to a remote worker, by worker and result.
pub const REMOTE_UNITS_TOTAL: &str = "stoker_remote_units_total";
/// Images a remote worker filled, by worker.
pub const REMOTE_IMAGES_TOTAL: &str = "stoker_remote_images_total";
/// Units a worker did or refused for home daemons, by result.
pub const WORKER_UNITS_TOTAL: &str = "stoker_worker_units_total";
/// Units sent to each remote worker and not answered yet, by worker.
pub const REMOTE_UNITS_IN_FLIGHT: &str = "stoker_remote_units_in_flight";
/// Images each remote worker filled per second, recently, by worker.
pub const REMOTE_IMAGES_PER_SECOND: &str = "stoker_remote_images_per_second";
/// Time from sending a unit to a worker to the last byte of its pixels, by worker.
pub const REMOTE_ROUND_TRIP_SECONDS: &str = "stoker_remote_round_trip_seconds";
/// TCP payload bytes to and from each remote worker, by worker and direction.
pub const REMOTE_BYTES_TOTAL: &str = "stoker_remote_bytes_total";
/// CPU seconds the home daemon spent reading each worker's answers, by worker.
pub const REMOTE_RECEIVE_CPU_SECONDS_TOTAL: &str = "stoker_remote_receive_cpu_seconds_total";
/// The share of images (so of units) remote workers filled since start.
pub const REMOTE_SHARE: &str = "stoker_remote_share";
/// Images a worker filled for home daemons.
pub const WORKER_IMAGES_TOTAL: &str = "stoker_worker_images_total";
/// TCP payload bytes a worker sent and received, by direction.
pub const WORKER_BYTES_TOTAL: &str = "stoker_worker_bytes_total";
/// Connections, jobs and units a worker refused, by reason.
pub const WORKER_REFUSALS_TOTAL: &str = "stoker_worker_refusals_total";
/// Why a worker refused something (the `reason` label of [`WORKER_REFUSALS_TOTAL`]).
pub const WORKER_REFUSALS: &[&str] = &[
    "connections",
    "handshake",
    "job",
    "unit",
    "unit_bytes",
    "memory",
];
/// Authenticated home-daemon connections a worker holds now.
pub const WORKER_CONNECTIONS: &str = "stoker_worker_connections";
/// Home daemons (distinct peer addresses) connected to a worker now.
pub const WORKER_HOMES: &str = "stoker_worker_homes";
/// CPU seconds a worker's connections spent, by part (work: reading, decoding and
/// resizing units; send: writing the answers).
pub const WORKER_CPU_SECONDS_TOTAL: &str = "stoker_worker_cpu_seconds_total";
/// Images decoded per GPU, by `gpu` and `path` (hardware, hybrid, cpu).
pub const GPU_DECODE_TOTAL: &str = "stoker_gpu_decode_total";
/// Host time per batch decoding on a GPU (nvJPEG calls and the CPU path), by `gpu`.
pub const GPU_DECODE_SECONDS: &str = "stoker_gpu_decode_seconds";
/// Device time per batch from the end of decode to the end of the kernel, by `gpu`.
pub const GPU_KERNEL_SECONDS: &str = "stoker_gpu_kernel_seconds";
/// Batches enqueued on a GPU and not complete, by `gpu`.
pub const GPU_BATCHES_IN_FLIGHT: &str = "stoker_gpu_batches_in_flight";
/// 1 for each serving GPU, with `gpu`, `name`, `emulated` (true, false) and `broken` labels.
pub const GPU_INFO: &str = "stoker_gpu_info";

const fn series(
    name: &'static str,
    kind: Kind,
    unit: Unit,
    help: &'static str,
    labels: &'static [&'static str],
    at_start: AtStart,
) -> Series {
    Series {
        name,
        kind,
        unit,
        help,
        labels,
        source: Source::Recorder,
        at_start,
    }
}

/// A series the daemon renders itself at scrape time.
const fn rendered(series: Series) -> Series {
    Series {
        source: Source::Rendered,
        at_start: AtStart::Nothing,
        ..series
    }
}

use AtStart::{Each, Nothing, Plain};
use Kind::{Counter, Gauge, Histogram};

/// Every series stokerd exports.
#[rustfmt::skip]
pub const ALL: &[Series] = &[
    series(IMAGES_TOTAL, Counter, Unit::Count,
        "Images through each stage (read, decode, augment, delivered to clients).",
        &["stage"], Each("stage", &["read", "decode", "augment", "delivered"])),
    series(BYTES_READ_TOTAL, Counter, Unit::Bytes, "Bytes read from storage.", &[], Plain),
    rendered(series(STAGE_SECONDS, Histogram, Unit::Seconds,
        "Latency per stage: read per unit of samples, decode and augment per image.",
        &["stage"], Nothing)),
    series(DECODE_TOTAL, Counter, Unit::Count, "Images decoded, by backend.",
        &["backend"], Each("backend", &["cpu"])),
    series(BAD_SAMPLES_TOTAL, Counter, Unit::Count,
        "Samples that could not be read or decoded, by reason.",
        &["reason"], Each("reason", BAD_SAMPLE_REASONS)),
    series(READY_SLOTS, Gauge, Unit::Count,
        "Filled ring slots sent to clients and not released yet.", &[], Plain),
    series(CLIENTS, Gauge, Unit::Count, "Ranks attached.", &[], Plain),
    series(JOBS, Gauge, Unit::Count, "Jobs served.", &[], Plain),
    series(RING_BYTES, Gauge, Unit::Bytes,
        "Ring memory mapped for clients, by memory kind.",
        &["memory", "gpu"], Each("memory", &["host"])),
    series(ENTRY_TABLE_BYTES, Gauge, Unit::Bytes,
        "Bytes the JPEG entry-point table holds, every user's together.", &[], Plain),
    series(INDEX_BYTES, Gauge, Unit::Bytes,
        "Bytes the indexes of the jobs served hold, each index counted once.", &[], Plain),
    series(RELOADS_TOTAL, Counter, Unit::Count, "Config reloads, by result.",
        &["result"], Each("result", &["ok", "error"])),
    series(CONNECTIONS_TOTAL, Counter, Unit::Count,
        "Connections accepted on the daemon's socket.", &[], Plain),
    series(S3_BYTES_TOTAL, Counter, Unit::Bytes,
        "Bytes of s3:// objects, by source (s3: downloaded, cache: found in the node cache).",
        &["source"], Each("source", &["s3", "cache"])),
    series(S3_CACHE_REQUESTS_TOTAL, Counter, Unit::Count, "Node-cache lookups, by result.",
        &["result"], Each("result", &["hit", "miss", "rejected"])),
    series(S3_IN_FLIGHT, Gauge, Unit::Count, "S3 downloads in flight.", &[], Plain),
    series(S3_RETRIES_TOTAL, Counter, Unit::Count, "S3 requests tried again.", &[], Plain),
    series(S3_ERRORS_TOTAL, Counter, Unit::Count,
        "S3 requests failed for good, by S3 error code.", &["code"], Nothing),
    rendered(series(CLIENT_WAIT_FRACTION, Gauge, Unit::Count,
        "Share of the training loop's time spent waiting for data (recent), per rank.",
        &["job", "rank"], Nothing)),
    rendered(series(CLIENT_WAIT_SECONDS_TOTAL, Counter, Unit::Seconds,
        "Seconds the training loop waited inside next(), per rank.",
        &["job", "rank"], Nothing)),
    rendered(series(CLIENT_COMPUTE_SECONDS_TOTAL, Counter, Unit::Seconds,
        "Seconds the training loop spent between next() calls, per rank.",
        &["job", "rank"], Nothing)),
    series(REMOTE_UNITS_TOTAL, Counter, Unit::Count,
        "Units given to a remote worker, by worker and result (done there, reissued locally \
         after a fault, refused by the worker).", &["worker", "result"], Nothing),
    series(REMOTE_IMAGES_TOTAL, Counter, Unit::Count, "Images a remote worker filled.",
        &["worker"], Nothing),
    series(WORKER_UNITS_TOTAL, Counter, Unit::Count,
        "Units this worker did for home daemons, or refused, by result.",
        &["result"], Each("result", &["done", "refused"])),
    series(REMOTE_UNITS_IN_FLIGHT, Gauge, Unit::Count,
        "Units sent to a remote worker and not answered yet, by worker.", &["worker"], Nothing),
    series(REMOTE_IMAGES_PER_SECOND, Gauge, Unit::Count,
        "Images a remote worker filled per second, recently, by worker.", &["worker"], Nothing),
    rendered(series(REMOTE_ROUND_TRIP_SECONDS, Histogram, Unit::Seconds,
        "Time from sending a unit to a remote worker to the last byte of its pixels.",
        &["worker"], Nothing)),
    series(REMOTE_BYTES_TOTAL, Counter, Unit::Bytes,
        "TCP payload bytes (frames and pixels) to and from a remote worker, by direction.",
        &["worker", "direction"], Nothing),
    rendered(series(REMOTE_RECEIVE_CPU_SECONDS_TOTAL, Counter, Unit::Seconds,
        "CPU seconds the home daemon's connections spent reading a worker's answers.",
        &["worker"], Nothing)),
    series(REMOTE_SHARE, Gauge, Unit::Count,
        "Share of images (so of units) filled by remote workers since start.", &[], Nothing),
    series(WORKER_IMAGES_TOTAL, Counter, Unit::Count,
        "Images this worker filled for home daemons.", &[], Plain),
    series(WORKER_BYTES_TOTAL, Counter, Unit::Bytes,
        "TCP payload bytes this worker sent and received, by direction.",
        &["direction"], Each("direction", &["sent", "received"])),
    series(WORKER_REFUSALS_TOTAL, Counter, Unit::Count,
        "Connections, jobs and units this worker refused, by reason.",
        &["reason"], Each("reason", WORKER_REFUSALS)),
    series(WORKER_CONNECTIONS, Gauge, Unit::Count,
        "Authenticated home-daemon connections this worker holds.", &[], Plain),
    series(WORKER_HOMES, Gauge, Unit::Count,
        "Home daemons (distinct peer addresses) connected to this worker.", &[], Plain),
    rendered(series(WORKER_CPU_SECONDS_TOTAL, Counter, Unit::Seconds,
        "CPU seconds this worker's connections spent, by part (work: reading, decoding and \
         resizing units; send: writing the answers).", &["part"], Nothing)),
    series(GPU_DECODE_TOTAL, Counter, Unit::Count,
        "Images decoded on a GPU, by GPU and path (hardware, hybrid, cpu).",
        &["gpu", "path"], Nothing),
    rendered(series(GPU_DECODE_SECONDS, Histogram, Unit::Seconds,
        "Host time per batch decoding on a GPU (nvJPEG calls and the CPU path).",
        &["gpu"], Nothing)),
    rendered(series(GPU_KERNEL_SECONDS, Histogram, Unit::Seconds,
        "Device time per batch from the end of decode to the end of the augment kernel.",
        &["gpu"], Nothing)),
    series(GPU_BATCHES_IN_FLIGHT, Gauge, Unit::Count,
        "Batches enqueued on a GPU and not complete.", &["gpu"], Nothing),
    series(GPU_INFO, Gauge, Unit::Count,
        "1 per serving GPU; labels say its name, whether it is emulated and whether it broke.",
        &["gpu", "name", "emulated", "broken"], Nothing),
];

/// The catalogue's entry for `name`.
pub fn find(name: &str) -> Option<&'static Series> {
    ALL.iter().find(|s| s.name == name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_counters_end_in_total() {
        for (i, s) in ALL.iter().enumerate() {
            assert!(
                ALL[i + 1..].iter().all(|o| o.name != s.name),
                "{} twice",
                s.name
            );
            assert_eq!(
                s.kind == Kind::Counter,
                s.name.ends_with("_total"),
                "{}",
                s.name
            );
            assert!(s.name.starts_with("stoker_"), "{}", s.name);
            if let AtStart::Each(label, _) = s.at_start {
                assert!(s.labels.contains(&label), "{}: {label}", s.name);
            }
        }
        assert_eq!(
            find(STAGE_SECONDS).map(|s| s.source),
            Some(Source::Rendered)
        );
    }

    /// docs/operations.md's metrics table (and docs/cuda.md for the per-GPU series) names
    /// every series of the catalogue, and nothing else.
    #[test]
    fn the_docs_list_the_catalogue() {
        let read = |page: &str| {
            let path = format!("{}/../../docs/{page}", env!("CARGO_MANIFEST_DIR"));
            std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
        };
        let (operations, cuda) = (read("operations.md"), read("cuda.md"));
        for s in ALL {
            let quoted = format!("`{}", s.name);
            assert!(
                operations.contains(&quoted) || cuda.contains(&quoted),
                "{} is not documented",
                s.name
            );
        }
        for row in operations
            .lines()
            .filter_map(|l| l.strip_prefix("| `stoker_"))
        {
            let name: String = row
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                find(&format!("stoker_{name}")).is_some(),
                "stoker_{name} is documented only"
            );
        }
    }
}
