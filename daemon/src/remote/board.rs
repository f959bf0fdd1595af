//! What a home daemon knows of its remote workers, for `stoker status` and `/metrics`: per
//! worker entry, units in flight, units done, re-issued and refused, images, bytes each way,
//! the CPU its connections spent receiving, each unit's round trip, and the recent images/s.
//!
//! # Design
//! - One [`WorkerBoard`] per `[remote] workers` entry, shared by that entry's connections
//!   (`crate::remote::home`) and read by the server ([`RemoteBoard`]): relaxed atomics and a
//!   [`LatencyHistogram`], the one record of these events; the scrape feeds them to the
//!   recorder (counters with `absolute`) and renders the histogram, as the engine's stage
//!   figures are.
//! - A unit's round trip runs from writing its request to the last byte of its pixels read:
//!   the worker's work, its queueing and the network, as the home daemon waits for it.
//! - Receiving's CPU is the connection thread's own CPU time (`CLOCK_THREAD_CPUTIME_ID`)
//!   around the answer's read: what the wire costs the GPU host, per byte.
//! - Images/s is recomputed when read, over at least half a second, like the daemon's own.
//! - The share of images filled remotely is this board's images over every image the engine
//!   filled (units are of one size but for a batch's last, so it is the share of units too).
//!
//! # Limitations
//! - Bytes are the TCP payload (frames and pixels), not TCP/IP headers.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Instant;

use stoker_wire::protocol::WorkerStatus;

use metrics_exporter_prometheus::formatting::{
    sanitize_label_value, write_help_line, write_metric_line, write_type_line,
};

use super::wire::Message;
use crate::serve::WorkerFigures;
use stoker_pipeline::metrics::{self as m, histogram, LatencyHistogram, Throughput};

/// One worker entry's figures, as its home daemon saw them.
#[derive(Debug)]
pub(crate) struct WorkerBoard {
    addr: String,
    /// Units written to the worker and not yet answered (or given up).
    in_flight: AtomicU64,
    done: AtomicU64,
    /// Units given up on (a fault) and filled locally.
    reissued: AtomicU64,
    refused: AtomicU64,
    images: AtomicU64,
    bytes_sent: AtomicU64,
    bytes_received: AtomicU64,
    receive_cpu_ns: AtomicU64,
    round_trip: LatencyHistogram,
    rate: Throughput,
}

/// A unit on its way: made when its request is written, settled once.
pub(crate) struct UnitTiming {
    sent: Instant,
}

impl WorkerBoard {
    pub(crate) fn new(addr: &str) -> WorkerBoard {
        WorkerBoard {
            addr: addr.to_owned(),
            in_flight: AtomicU64::new(0),
            done: AtomicU64::new(0),
            reissued: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            images: AtomicU64::new(0),
            bytes_sent: AtomicU64::new(0),
            bytes_received: AtomicU64::new(0),
            receive_cpu_ns: AtomicU64::new(0),
            round_trip: LatencyHistogram::default(),
            rate: Throughput::default(),
        }
    }

    /// A unit's request of `bytes` was written.
    pub(crate) fn sent(&self, bytes: u64) -> UnitTiming {
        self.in_flight.fetch_add(1, Ordering::Relaxed);
        self.bytes_sent.fetch_add(bytes, Ordering::Relaxed);
        UnitTiming {
            sent: Instant::now(),
        }
    }

    /// Bytes written or read outside a unit (opening a job, its answer).
    pub(crate) fn control(&self, sent: u64, received: u64) {
        self.bytes_sent.fetch_add(sent, Ordering::Relaxed);
        self.bytes_received.fetch_add(received, Ordering::Relaxed);
    }

    /// `bytes` of a unit's answer read, costing this thread `cpu_ns` of CPU.
    pub(crate) fn received(&self, bytes: u64, cpu_ns: u64) {
        self.bytes_received.fetch_add(bytes, Ordering::Relaxed);
        self.receive_cpu_ns.fetch_add(cpu_ns, Ordering::Relaxed);
    }

    /// The unit `timing` stands for is sent again on a new connection (its first one was
    /// found closed): no longer in flight as that send.
    pub(crate) fn resent(&self, _timing: UnitTiming) {
        self.in_flight.fetch_sub(1, Ordering::Relaxed);
    }

    /// How the unit `timing` stands for ended: done with `images`, refused, or re-issued.
    pub(crate) fn settle(&self, timing: Option<UnitTiming>, end: UnitEnd) {
        if let Some(t) = timing {
            self.in_flight.fetch_sub(1, Ordering::Relaxed);
            if let UnitEnd::Done(_) = end {
                let ns = u64::try_from(t.sent.elapsed().as_nanos()).unwrap_or(u64::MAX);
                self.round_trip.record_ns(ns);
            }
        }
        match end {
            UnitEnd::Done(images) => {
                self.done.fetch_add(1, Ordering::Relaxed);
                self.images.fetch_add(images, Ordering::Relaxed);
            }
            UnitEnd::Refused => {
                self.refused.fetch_add(1, Ordering::Relaxed);
            }
            UnitEnd::Reissued => {
                self.reissued.fetch_add(1, Ordering::Relaxed);
            }
        }
    }

    /// Images/s over the time since the last call (at least half a second ago), else the
    /// figure of the last call.
    fn images_per_s(&self) -> f64 {
        self.rate.update(self.images.load(Ordering::Relaxed))
    }

    /// This worker's row of `stoker status`.
    pub(crate) fn status(&self) -> WorkerStatus {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let trips = self.round_trip.snapshot();
        WorkerStatus {
            addr: self.addr.clone(),
            units_in_flight: g(&self.in_flight),
            units_done: g(&self.done),
            units_reissued: g(&self.reissued),
            units_refused: g(&self.refused),
            images: g(&self.images),
            images_per_s: self.images_per_s(),
            round_trip_ms: trips.sum_ns as f64 / 1e6 / trips.count.max(1) as f64,
            bytes_sent: g(&self.bytes_sent),
            bytes_received: g(&self.bytes_received),
            receive_cpu_s: g(&self.receive_cpu_ns) as f64 * 1e-9,
        }
    }
}

/// How a unit given to a worker ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum UnitEnd {
    /// Filled by the worker, with this many images.
    Done(u64),
    /// The worker refused the job or the unit (filled locally).
    Refused,
    /// A fault (timeout, closed, malformed): filled locally, the connection dropped.
    Reissued,
}

/// This thread's CPU time so far, in nanoseconds.
pub(crate) fn thread_cpu_ns() -> u64 {
    let t = rustix::time::clock_gettime(rustix::time::ClockId::ThreadCPUTime);
    u64::try_from(t.tv_sec).unwrap_or(0) * 1_000_000_000 + u64::try_from(t.tv_nsec).unwrap_or(0)
}

/// The bytes `message` takes on the wire: its frame's 4-byte length and its JSON.
pub(crate) fn frame_bytes(message: &Message) -> u64 {
    /// Counts what is written, keeping nothing.
    struct Count(u64);
    impl std::io::Write for Count {
        fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
            self.0 += buf.len() as u64;
            Ok(buf.len())
        }
        fn flush(&mut self) -> std::io::Result<()> {
            Ok(())
        }
    }
    let mut count = Count(4);
    // A message that cannot be serialised is never sent: its size does not matter.
    let _ = serde_json::to_writer(&mut count, message);
    count.0
}

/// Every worker entry of a home daemon, as the server reads them.
#[derive(Debug, Default)]
pub(crate) struct RemoteBoard {
    pub workers: Vec<Arc<WorkerBoard>>,
}

impl WorkerFigures for RemoteBoard {
    fn rows(&self) -> Vec<WorkerStatus> {
        self.workers.iter().map(|w| w.status()).collect()
    }

    fn share(&self, all_images: u64) -> Option<f64> {
        if self.workers.is_empty() {
            return None;
        }
        let remote: u64 = self
            .workers
            .iter()
            .map(|w| w.images.load(Ordering::Relaxed))
            .sum();
        Some(remote as f64 / all_images.max(1) as f64)
    }

    fn metrics_text(&self, all_images: u64) -> String {
        if self.workers.is_empty() {
            return String::new();
        }
        let share = self.share(all_images).unwrap_or(0.0);
        ::metrics::gauge!(m::REMOTE_SHARE).set(share);
        let mut trips = Vec::new();
        let mut cpu = Vec::new();
        for w in &self.workers {
            let s = w.status();
            let worker = s.addr.clone();
            ::metrics::gauge!(m::REMOTE_UNITS_IN_FLIGHT, "worker" => worker.clone())
                .set(s.units_in_flight as f64);
            ::metrics::gauge!(m::REMOTE_IMAGES_PER_SECOND, "worker" => worker.clone())
                .set(s.images_per_s);
            for (direction, n) in [("sent", s.bytes_sent), ("received", s.bytes_received)] {
                ::metrics::counter!(m::REMOTE_BYTES_TOTAL, "worker" => worker.clone(),
                    "direction" => direction)
                .absolute(n);
            }
            cpu.push((worker.clone(), s.receive_cpu_s));
            trips.push((vec![("worker", worker)], w.round_trip.snapshot()));
        }
        let mut text = String::new();
        histogram::render(&mut text, m::REMOTE_ROUND_TRIP_SECONDS, &trips);
        render_seconds(
            &mut text,
            m::REMOTE_RECEIVE_CPU_SECONDS_TOTAL,
            "worker",
            &cpu,
        );
        text
    }
}

/// Appends the catalogue's counter `name` of seconds (an f64, which the recorder's u64
/// counters cannot hold), one line per `label` value.
pub(crate) fn render_seconds(out: &mut String, name: &str, label: &str, rows: &[(String, f64)]) {
    let Some(series) = m::find(name) else {
        return;
    };
    write_help_line(out, series.name, series.help);
    write_type_line(out, series.name, series.kind.name());
    for (value, seconds) in rows {
        let labels = [format!("{label}=\"{}\"", sanitize_label_value(value))];
        write_metric_line::<&str, f64>(out, series.name, None, &labels, None, *seconds, None);
    }
    out.push('\n');
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_unit_counts_once_in_flight_and_its_end_once() {
        let b = WorkerBoard::new("w:1");
        let t = b.sent(100);
        assert_eq!(b.status().units_in_flight, 1);
        b.received(4096, 2_000_000);
        b.settle(Some(t), UnitEnd::Done(16));
        let t = b.sent(100);
        b.settle(Some(t), UnitEnd::Reissued);
        b.settle(None, UnitEnd::Refused);
        let s = b.status();
        assert_eq!(
            (
                s.units_in_flight,
                s.units_done,
                s.units_reissued,
                s.units_refused
            ),
            (0, 1, 1, 1)
        );
        assert_eq!((s.images, s.bytes_sent, s.bytes_received), (16, 200, 4096));
        assert!((s.receive_cpu_s - 0.002).abs() < 1e-12);
        assert!(s.round_trip_ms >= 0.0);
        let board = RemoteBoard {
            workers: vec![Arc::new(b)],
        };
        assert!((board.share(64).unwrap() - 0.25).abs() < 1e-12);
        assert_eq!(RemoteBoard::default().share(64), None);
    }
}
