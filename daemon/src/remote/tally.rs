//! A worker's own figures for its `/metrics`: units and images served, bytes each way, what
//! it refused and why, the home daemons connected now, and the CPU its connections spent
//! working and sending.
//!
//! # Design
//! - The units, images, bytes and refusals are recorded with the `metrics` macros at the
//!   event (nothing in the worker reads them back). The connections and homes are kept in
//!   one map here and set as gauges whenever a connection comes or goes.
//! - CPU seconds are the connection thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//!   around a unit's work and around writing its answer, kept in process-wide atomics (one
//!   worker per process) and rendered as text at scrape time: the recorder's counters hold
//!   integers only.
//!
//! # Limitations
//! - Home daemons are told apart by their address: two behind one NAT address count once.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{LazyLock, Mutex};

use super::board::{render_seconds, thread_cpu_ns};
use stoker_pipeline::metrics as m;
use stoker_pipeline::sync::lock;

static WORK_NS: AtomicU64 = AtomicU64::new(0);
static SEND_NS: AtomicU64 = AtomicU64::new(0);
/// Authenticated connections open, by peer address.
static HOMES: LazyLock<Mutex<HashMap<IpAddr, usize>>> = LazyLock::new(Mutex::default);

/// Counts a refusal; `reason` is one of [`m::WORKER_REFUSALS`].
pub(crate) fn refused(reason: &'static str) {
    debug_assert!(m::WORKER_REFUSALS.contains(&reason), "{reason}");
    metrics::counter!(m::WORKER_REFUSALS_TOTAL, "reason" => reason).increment(1);
}

/// Counts `bytes` read from a home daemon.
pub(crate) fn received(bytes: u64) {
    metrics::counter!(m::WORKER_BYTES_TOTAL, "direction" => "received").increment(bytes);
}

/// Times `work` (a unit's reading, decoding and resizing) on this thread's CPU clock.
pub(crate) fn work<T>(work: impl FnOnce() -> T) -> T {
    let t0 = thread_cpu_ns();
    let out = work();
    WORK_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Ordering::Relaxed);
    out
}

/// Times `send` (writing an answer of `bytes`, `images` of them) on this thread's CPU clock.
pub(crate) fn send<T>(bytes: u64, images: u64, send: impl FnOnce() -> T) -> T {
    let t0 = thread_cpu_ns();
    let out = send();
    SEND_NS.fetch_add(thread_cpu_ns().saturating_sub(t0), Ordering::Relaxed);
    metrics::counter!(m::WORKER_BYTES_TOTAL, "direction" => "sent").increment(bytes);
    metrics::counter!(m::WORKER_IMAGES_TOTAL).increment(images);
    out
}

/// An authenticated home daemon's connection, counted while it lives.
pub(crate) struct HomeSeat {
    ip: IpAddr,
}

impl HomeSeat {
    pub(crate) fn new(ip: IpAddr) -> HomeSeat {
        let mut homes = lock(&HOMES);
        *homes.entry(ip).or_insert(0) += 1;
        set_gauges(&homes);
        HomeSeat { ip }
    }
}

impl Drop for HomeSeat {
    fn drop(&mut self) {
        let mut homes = lock(&HOMES);
        if let Some(n) = homes.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                homes.remove(&self.ip);
            }
        }
        set_gauges(&homes);
    }
}

fn set_gauges(homes: &HashMap<IpAddr, usize>) {
    let connections: usize = homes.values().sum();
    metrics::gauge!(m::WORKER_CONNECTIONS).set(connections as f64);
    metrics::gauge!(m::WORKER_HOMES).set(homes.len() as f64);
}

/// The CPU seconds series as Prometheus text (call at scrape time, on a worker).
pub(crate) fn metrics_text() -> String {
    let s = |a: &AtomicU64| a.load(Ordering::Relaxed) as f64 * 1e-9;
    let rows = [
        ("work".to_owned(), s(&WORK_NS)),
        ("send".to_owned(), s(&SEND_NS)),
    ];
    let mut text = String::new();
    render_seconds(&mut text, m::WORKER_CPU_SECONDS_TOTAL, "part", &rows);
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn seats_count_connections_and_distinct_homes_until_dropped() {
        let a: IpAddr = "10.1.2.3".parse().unwrap();
        let count = || {
            let h = lock(&HOMES);
            (h.get(&a).copied().unwrap_or(0), h.contains_key(&a))
        };
        let one = HomeSeat::new(a);
        let two = HomeSeat::new(a);
        assert_eq!(count(), (2, true));
        drop(one);
        assert_eq!(count(), (1, true));
        drop(two);
        assert_eq!(count(), (0, false));
    }

    #[test]
    fn cpu_time_is_rendered_in_seconds_by_part() {
        work(|| (0..200_000u64).map(std::hint::black_box).sum::<u64>());
        let text = metrics_text();
        assert!(
            text.contains("# TYPE stoker_worker_cpu_seconds_total counter"),
            "{text}"
        );
        assert!(
            text.contains("stoker_worker_cpu_seconds_total{part=\"send\"} "),
            "{text}"
        );
        let work: f64 = text
            .lines()
            .find_map(|l| l.strip_prefix("stoker_worker_cpu_seconds_total{part=\"work\"} "))
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert!(work > 0.0, "{text}");
    }
}
