//! Prometheus metrics: the names stoker records through the `metrics` facade, and a tiny
//! HTTP/1.1 listener that serves them as Prometheus text on `GET /metrics`.
//!
//! # Design
//! - Code records through `metrics::counter!` and friends, with the names below; without an
//!   installed recorder (the default: `metrics.listen` unset) those calls do nothing.
//! - [`install`] installs `metrics-exporter-prometheus`'s recorder (without its HTTP stack),
//!   describes every metric and registers every label set at zero, so a scrape lists each
//!   documented series from the start.
//! - [`MetricsListener`] is one thread: accept, read one request of at most
//!   [`MAX_REQUEST_BYTES`] within [`REQUEST_TIMEOUT`], answer, close. Gauges that are state
//!   (clients, jobs) are refreshed by a callback just before each render; the text it returns
//!   (series that come and go with ranks, such as the data stall of `crate::serve::stall`) is
//!   appended to the render.
//!
//! # Limitations
//! - No keep-alive, no TLS, no authentication: bind it to a local address.
//! - Per-GPU series (`gpu` label) appear once a rank attached on that GPU.

#![forbid(unsafe_code)]

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::Duration;

use metrics::{describe_counter, describe_gauge, describe_histogram, Unit};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

/// Images through each stage: `stage` = read, decode, augment, delivered.
pub const IMAGES_TOTAL: &str = "stoker_images_total";
/// Bytes read from storage.
pub const BYTES_READ_TOTAL: &str = "stoker_bytes_read_total";
/// Latency per stage (`stage` = read per chunk of samples; decode, augment per image).
pub const STAGE_SECONDS: &str = "stoker_stage_seconds";
/// Images decoded, by `backend` (cpu, cuda, hybrid).
pub const DECODE_TOTAL: &str = "stoker_decode_total";
/// Samples that could not be used, by `reason` (`crate::transform::badsample::REASONS`).
pub const BAD_SAMPLES_TOTAL: &str = "stoker_bad_samples_total";
/// Filled slots sent to clients and not yet released (queue depth on the client side).
pub const READY_SLOTS: &str = "stoker_ready_slots";
/// Ranks attached.
pub const CLIENTS: &str = "stoker_clients";
/// Jobs served.
pub const JOBS: &str = "stoker_jobs";
/// Ring memory mapped for clients, by `memory` (host).
pub const RING_BYTES: &str = "stoker_ring_bytes";
/// Config reloads, by `result` (ok, error).
pub const RELOADS_TOTAL: &str = "stoker_reloads_total";
/// Connections accepted (attaches and status requests).
pub const CONNECTIONS_TOTAL: &str = "stoker_connections_total";

/// Images decoded on a GPU, by `gpu` (UUID) and `path` (hardware, hybrid, cpu).
pub const GPU_DECODE_TOTAL: &str = "stoker_gpu_decode_total";
/// Host time per batch decoding on a GPU (nvJPEG calls and the CPU path), by `gpu`.
pub const GPU_DECODE_SECONDS: &str = "stoker_gpu_decode_seconds";
/// Device time per batch from the end of decode to the end of the kernel, by `gpu`.
pub const GPU_KERNEL_SECONDS: &str = "stoker_gpu_kernel_seconds";
/// Batches enqueued on a GPU and not complete, by `gpu`.
pub const GPU_BATCHES_IN_FLIGHT: &str = "stoker_gpu_batches_in_flight";
/// 1 for each serving GPU, with `gpu`, `name`, `emulated` (true, false) and `broken` labels.
pub const GPU_INFO: &str = "stoker_gpu_info";

/// Every metric name, for the docs test.
pub const ALL: &[&str] = &[
    IMAGES_TOTAL,
    BYTES_READ_TOTAL,
    STAGE_SECONDS,
    DECODE_TOTAL,
    BAD_SAMPLES_TOTAL,
    READY_SLOTS,
    CLIENTS,
    JOBS,
    RING_BYTES,
    RELOADS_TOTAL,
    CONNECTIONS_TOTAL,
    GPU_DECODE_TOTAL,
    GPU_DECODE_SECONDS,
    GPU_KERNEL_SECONDS,
    GPU_BATCHES_IN_FLIGHT,
    GPU_INFO,
];

/// Histogram buckets for stage latency (seconds): 10 µs to 2.5 s.
pub const STAGE_BUCKETS: &[f64] = &[
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5,
    1.0, 2.5,
];
/// Largest HTTP request head read.
pub const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a scraper may take to send its request.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(String),
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        addr: SocketAddr,
        source: std::io::Error,
    },
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

impl MetricsError {
    /// An address that cannot be bound is a configuration error (exit 78).
    pub fn is_config(&self) -> bool {
        matches!(self, MetricsError::Bind { .. })
    }
}

/// Installs the Prometheus recorder as the global `metrics` recorder and registers every
/// series. Call once.
pub fn install() -> Result<PrometheusHandle, MetricsError> {
    let handle = PrometheusBuilder::new()
        .set_buckets(STAGE_BUCKETS)
        .map_err(|e| MetricsError::Recorder(e.to_string()))?
        .install_recorder()
        .map_err(|e| MetricsError::Recorder(e.to_string()))?;
    describe_series();
    register_series();
    crate::source::object::register_metrics();
    Ok(handle)
}

/// Says what every series means and its unit (the `# HELP` lines).
fn describe_series() {
    describe_counter!(
        IMAGES_TOTAL,
        Unit::Count,
        "Images through each stage (read, decode, augment, delivered to clients)."
    );
    describe_counter!(BYTES_READ_TOTAL, Unit::Bytes, "Bytes read from storage.");
    describe_histogram!(
        STAGE_SECONDS,
        Unit::Seconds,
        "Latency per stage: read per chunk of samples, decode and augment per image."
    );
    describe_counter!(DECODE_TOTAL, Unit::Count, "Images decoded, by backend.");
    describe_counter!(
        BAD_SAMPLES_TOTAL,
        Unit::Count,
        "Samples that could not be read or decoded, by reason."
    );
    describe_gauge!(
        READY_SLOTS,
        Unit::Count,
        "Filled ring slots sent to clients and not released yet."
    );
    describe_gauge!(CLIENTS, Unit::Count, "Ranks attached.");
    describe_gauge!(JOBS, Unit::Count, "Jobs served.");
    describe_gauge!(
        RING_BYTES,
        Unit::Bytes,
        "Ring memory mapped for clients, by memory kind."
    );
    describe_counter!(RELOADS_TOTAL, Unit::Count, "Config reloads, by result.");
    describe_counter!(
        CONNECTIONS_TOTAL,
        Unit::Count,
        "Connections accepted on the daemon's socket."
    );
    describe_counter!(
        GPU_DECODE_TOTAL,
        Unit::Count,
        "Images decoded on a GPU, by GPU and path (hardware, hybrid, cpu)."
    );
    describe_histogram!(
        GPU_DECODE_SECONDS,
        Unit::Seconds,
        "Host time per batch decoding on a GPU (nvJPEG calls and the CPU path)."
    );
    describe_histogram!(
        GPU_KERNEL_SECONDS,
        Unit::Seconds,
        "Device time per batch from the end of decode to the end of the augment kernel."
    );
    describe_gauge!(
        GPU_BATCHES_IN_FLIGHT,
        Unit::Count,
        "Batches enqueued on a GPU and not complete."
    );
    describe_gauge!(
        GPU_INFO,
        Unit::Count,
        "1 per serving GPU; labels say its name, whether it is emulated and whether it broke."
    );
}

/// Registers every series at zero so a scrape shows it before its first event.
fn register_series() {
    for stage in ["read", "decode", "augment", "delivered"] {
        metrics::counter!(IMAGES_TOTAL, "stage" => stage).increment(0);
    }
    for stage in ["read", "decode", "augment"] {
        // Registers the series; no sample is recorded.
        let _ = metrics::histogram!(STAGE_SECONDS, "stage" => stage);
    }
    metrics::counter!(BYTES_READ_TOTAL).increment(0);
    metrics::counter!(DECODE_TOTAL, "backend" => "cpu").increment(0);
    for &reason in crate::transform::badsample::REASONS {
        metrics::counter!(BAD_SAMPLES_TOTAL, "reason" => reason).increment(0);
    }
    for result in ["ok", "error"] {
        metrics::counter!(RELOADS_TOTAL, "result" => result).increment(0);
    }
    metrics::counter!(CONNECTIONS_TOTAL).increment(0);
    metrics::gauge!(READY_SLOTS).set(0.0);
    metrics::gauge!(CLIENTS).set(0.0);
    metrics::gauge!(JOBS).set(0.0);
    metrics::gauge!(RING_BYTES, "memory" => "host").set(0.0);
}

/// The `/metrics` HTTP listener.
pub struct MetricsListener {
    addr: SocketAddr,
}

impl MetricsListener {
    /// Binds `addr` and serves on a thread of its own. `refresh` runs before each render;
    /// the Prometheus text it returns is appended to the recorder's.
    pub fn spawn(
        addr: SocketAddr,
        handle: PrometheusHandle,
        refresh: impl Fn() -> String + Send + 'static,
    ) -> Result<MetricsListener, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
        let addr = listener.local_addr().unwrap_or(addr);
        std::thread::Builder::new()
            .name("stoker-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    match conn {
                        Ok(mut s) => {
                            if let Err(e) = answer(&mut s, &handle, &refresh) {
                                tracing::debug!(error = %e, "metrics request failed");
                            }
                        }
                        Err(e) => {
                            tracing::warn!(error = %e, "metrics accept failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
            .map_err(MetricsError::Thread)?;
        tracing::info!(%addr, "serving Prometheus metrics at /metrics");
        Ok(MetricsListener { addr })
    }

    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

/// What a request asks for.
#[derive(Debug, PartialEq, Eq)]
enum Route {
    Metrics,
    NotFound,
    MethodNotAllowed,
    BadRequest,
}

fn route(head: &[u8]) -> Route {
    let Ok(text) = std::str::from_utf8(head) else {
        return Route::BadRequest;
    };
    let line = text.lines().next().unwrap_or("");
    let mut parts = line.split(' ');
    let (Some(method), Some(target), Some(version)) = (parts.next(), parts.next(), parts.next())
    else {
        return Route::BadRequest;
    };
    if !version.starts_with("HTTP/1.") {
        return Route::BadRequest;
    }
    if method != "GET" {
        return Route::MethodNotAllowed;
    }
    let path = target.split('?').next().unwrap_or("");
    if path == "/metrics" {
        Route::Metrics
    } else {
        Route::NotFound
    }
}

fn answer(
    s: &mut TcpStream,
    handle: &PrometheusHandle,
    refresh: &impl Fn() -> String,
) -> std::io::Result<()> {
    s.set_read_timeout(Some(REQUEST_TIMEOUT))?;
    s.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = loop {
        let n = s.read(&mut buf)?;
        if n == 0 {
            break false;
        }
        head.extend_from_slice(&buf[..n]);
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if head.len() > MAX_REQUEST_BYTES {
            break false;
        }
    };
    let (status, ctype, body) = match (complete, route(&head)) {
        (true, Route::Metrics) => {
            let extra = refresh();
            let mut body = handle.render();
            if !body.is_empty() && !body.ends_with('\n') {
                body.push('\n');
            }
            body.push_str(&extra);
            ("200 OK", "text/plain; version=0.0.4; charset=utf-8", body)
        }
        (true, Route::NotFound) => ("404 Not Found", "text/plain", "only /metrics\n".into()),
        (true, Route::MethodNotAllowed) => (
            "405 Method Not Allowed",
            "text/plain",
            "only GET\n".to_owned(),
        ),
        _ => ("400 Bad Request", "text/plain", "bad request\n".to_owned()),
    };
    let mut out = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    if status.starts_with("405") {
        out.push_str("Allow: GET\r\n");
    }
    out.push_str("\r\n");
    s.write_all(out.as_bytes())?;
    s.write_all(body.as_bytes())?;
    s.flush()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_are_routed() {
        assert_eq!(
            route(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n"),
            Route::Metrics
        );
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.0\r\n\r\n"), Route::Metrics);
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n"), Route::NotFound);
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n"),
            Route::MethodNotAllowed
        );
        assert_eq!(route(b"garbage\r\n\r\n"), Route::BadRequest);
        assert_eq!(route(&[0xff, 0xfe]), Route::BadRequest);
    }
}
