//! Prometheus metrics: the catalogue of every series ([`catalogue`]: names, kinds, units, help,
//! labels, and which event records each one, once) and the atomic latency histogram
//! ([`histogram`]) are the pipeline's (`stoker_pipeline::metrics`, re-exported here); this
//! module installs the recorder and runs a tiny HTTP/1.1 listener that serves them as
//! Prometheus text on `GET /metrics`.
//!
//! # Design
//! - Code records through `metrics::counter!` and friends or through atomics the server feeds
//!   to the recorder at scrape time (see [`catalogue`]); without an installed recorder (the
//!   default: `metrics.listen` unset) the macros do nothing.
//! - [`install`] installs `metrics-exporter-prometheus`'s recorder (without its HTTP stack),
//!   describes every series of the catalogue and registers every label set known at start at
//!   zero, so a scrape lists each documented series from the start.
//! - [`spawn_listener`] accepts on one thread, which also reads every connection's request
//!   head (at most [`MAX_REQUEST_BYTES`]) as its bytes come, holding no thread for it
//!   (`heads`: at most 64 wait, the oldest slow one closed first); once a head is in, the
//!   connection is answered on a thread of its own, at most [`MAX_CONNECTIONS`] at a time
//!   (and [`MAX_SCRAPER_CONNECTIONS`] more for `metrics.scrapers` addresses), then closed.
//!   The whole request must arrive within [`REQUEST_TIMEOUT`] and the whole answer leave
//!   within [`RESPONSE_TIMEOUT`] (deadlines, not per-read timeouts), so clients that send
//!   half a request and wait hold no thread a scrape needs. Gauges that are state
//!   (clients, jobs) are refreshed by a callback just before each render; the text it returns
//!   (series that come and go with ranks, such as the data stall of `crate::serve::stall`) is
//!   appended to the render.
//!
//! # Limitations
//! - No keep-alive, no TLS, no authentication: bind it to a local address.
//! - Per-GPU series (`gpu` label) appear once a rank attached on that GPU.

#![forbid(unsafe_code)]

use std::io::Write;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};

pub use stoker_pipeline::metrics::*;

/// Largest HTTP request head read.
pub(crate) const MAX_REQUEST_BYTES: usize = 8 * 1024;
/// How long a scraper may take to send its whole request.
pub(crate) const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// How long a scraper may take to read the whole answer.
pub(crate) const RESPONSE_TIMEOUT: Duration = Duration::from_secs(10);
/// Connections answered at once (their request head in); more are closed as they come.
pub(crate) const MAX_CONNECTIONS: usize = 8;
/// Connections from `metrics.scrapers` addresses answered at once, besides the others.
pub(crate) const MAX_SCRAPER_CONNECTIONS: usize = 4;

mod heads;

/// Why `/metrics` could not be served.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The Prometheus recorder could not be built or made the global recorder.
    #[error("cannot install the metrics recorder: {0}")]
    Recorder(#[source] metrics_exporter_prometheus::BuildError),
    /// `metrics.listen` (or `--metrics-listen`) cannot be bound: a configuration error.
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: SocketAddr,
        /// What bind reported.
        source: std::io::Error,
    },
    /// The listener's thread could not be spawned.
    #[error("cannot start the metrics thread: {0}")]
    Thread(std::io::Error),
}

impl MetricsError {
    /// An address that cannot be bound is a configuration error (exit 78).
    pub(crate) fn is_config(&self) -> bool {
        matches!(self, MetricsError::Bind { .. })
    }
}

/// Installs the Prometheus recorder as the global `metrics` recorder and describes and
/// registers every series of the [`catalogue`] it renders. Call once.
pub(crate) fn install() -> Result<PrometheusHandle, MetricsError> {
    let handle = PrometheusBuilder::new()
        .set_buckets(STAGE_BUCKETS)
        .map_err(MetricsError::Recorder)?
        .install_recorder()
        .map_err(MetricsError::Recorder)?;
    for series in ALL.iter().filter(|s| s.source == Source::Recorder) {
        describe(series);
        register(series);
    }
    Ok(handle)
}

/// Says what a series means and its unit (its `# HELP` line).
fn describe(s: &Series) {
    let (name, unit, help) = (s.name, s.unit, s.help);
    match s.kind {
        Kind::Counter => metrics::describe_counter!(name, unit, help),
        Kind::Gauge => metrics::describe_gauge!(name, unit, help),
        Kind::Histogram => metrics::describe_histogram!(name, unit, help),
    }
}

/// Registers the series' label sets known at start at zero, so a scrape shows them before
/// their first event.
fn register(s: &Series) {
    let sets: Vec<Vec<metrics::Label>> = match s.at_start {
        AtStart::Nothing => return,
        AtStart::Plain => vec![Vec::new()],
        AtStart::Each(label, values) => values
            .iter()
            .map(|v| vec![metrics::Label::new(label, *v)])
            .collect(),
    };
    for labels in sets {
        match s.kind {
            Kind::Counter => metrics::counter!(s.name, labels).increment(0),
            Kind::Gauge => metrics::gauge!(s.name, labels).set(0.0),
            // Registers the series; no sample is recorded.
            Kind::Histogram => drop(metrics::histogram!(s.name, labels)),
        }
    }
}

/// Binds `addr` and serves the `/metrics` HTTP listener on a thread of its own; returns the
/// address it serves on. `refresh` runs before each render; the Prometheus text it returns is
/// appended to the recorder's. Connections from `scrapers` get answering threads of their
/// own and are never closed to make room for others.
pub(crate) fn spawn_listener(
    addr: SocketAddr,
    handle: PrometheusHandle,
    scrapers: Vec<IpAddr>,
    refresh: impl Fn() -> String + Send + Sync + 'static,
) -> Result<SocketAddr, MetricsError> {
    let listener = TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
    let addr = listener.local_addr().unwrap_or(addr);
    let refresh = Arc::new(refresh);
    std::thread::Builder::new()
        .name("stoker-metrics".into())
        .spawn(move || {
            let busy = [Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0))];
            heads::run(&listener, &scrapers, |request| {
                serve_one(request, &busy, &handle, &refresh);
            });
        })
        .map_err(MetricsError::Thread)?;
    tracing::info!(%addr, "serving Prometheus metrics at /metrics");
    Ok(addr)
}

/// Answers `request` on a thread of its own, unless [`MAX_CONNECTIONS`] are being answered
/// ([`MAX_SCRAPER_CONNECTIONS`] for a scraper's: `busy[1]`), then it is closed.
fn serve_one<F: Fn() -> String + Send + Sync + 'static>(
    request: heads::Request,
    busy: &[Arc<AtomicUsize>; 2],
    handle: &PrometheusHandle,
    refresh: &Arc<F>,
) {
    let (busy, most) = match request.scraper {
        true => (&busy[1], MAX_SCRAPER_CONNECTIONS),
        false => (&busy[0], MAX_CONNECTIONS),
    };
    if busy.fetch_add(1, Ordering::AcqRel) >= most {
        busy.fetch_sub(1, Ordering::AcqRel);
        tracing::debug!("metrics connection closed: {most} being answered");
        return;
    }
    let (busy, handle, refresh) = (Arc::clone(busy), handle.clone(), Arc::clone(refresh));
    let spawned = std::thread::Builder::new()
        .name("stoker-metrics-conn".into())
        .spawn(move || {
            let heads::Request {
                mut stream,
                head,
                complete,
                ..
            } = request;
            let answered = stream
                .set_nonblocking(false)
                .and_then(|()| answer(&mut stream, &head, complete, &handle, &*refresh));
            if let Err(e) = answered {
                tracing::debug!(error = %e, "metrics request failed");
            }
            busy.fetch_sub(1, Ordering::AcqRel);
        });
    if let Err(e) = spawned {
        tracing::warn!(error = %e, "cannot start a metrics connection thread");
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

/// Answers the request whose head is `head` (`complete`: its blank line arrived) on `s`.
fn answer(
    s: &mut TcpStream,
    head: &[u8],
    complete: bool,
    handle: &PrometheusHandle,
    refresh: &impl Fn() -> String,
) -> std::io::Result<()> {
    let (status, ctype, body) = match (complete, route(head)) {
        (true, Route::Metrics) => {
            let extra = refresh();
            let mut body = handle.render();
            if !body.is_empty() && !body.ends_with('\n') {
                body.push('\n');
            }
            body.push_str(&extra);
            // Label values come from clients (job keys) and servers (error codes, GPU names):
            // the exporter escapes `\\`, `"` and newlines, the only escapes the text format
            // has; any other control character (and a bidi control) is replaced, not escaped,
            // so no raw CR, ESC or NUL passes and no escape makes a parser refuse the page.
            let body = stoker_wire::escape::replace_controls(&body);
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
    out.push_str(&body);
    write_before(s, out.as_bytes(), Instant::now() + RESPONSE_TIMEOUT)
}

/// The time left until `deadline`, or a timeout error once it has passed.
fn left_until(deadline: Instant) -> std::io::Result<Duration> {
    let left = deadline.saturating_duration_since(Instant::now());
    if left.is_zero() {
        return Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            "the client missed the deadline",
        ));
    }
    Ok(left)
}

/// Writes all of `bytes` to `s` before `deadline`, or fails with a timeout.
fn write_before(s: &mut TcpStream, mut bytes: &[u8], deadline: Instant) -> std::io::Result<()> {
    while !bytes.is_empty() {
        s.set_write_timeout(Some(left_until(deadline)?))?;
        match s.write(bytes) {
            Ok(0) => return Err(std::io::ErrorKind::WriteZero.into()),
            Ok(n) => bytes = &bytes[n..],
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
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
