//! The operations side of a running server: the stop flag, counters, the heartbeat, status and
//! metrics, held through a [`ServerHandle`].
//!
//! # Design
//! - [`ServerState`] is shared by the accept loop, every connection and the handle; signals,
//!   the watchdog, status and metrics only ever go through the handle.
//! - Nothing waits by polling: a stop wakes the accept loop (an eventfd) and every forwarder
//!   (its feed's waker); a drain waits on a condvar the last connection signals.
//!
//! # Limitations
//! - Rates are computed when asked (`update_rate`), not on a timer of their own.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use stoker_wire::protocol::{DaemonStatus, EncodeError, JobStatus, Message, WorkerStatus};

use crate::serve::access::{AccessPolicy, Quotas};
use stoker_pipeline::engine::FeedWaker;

use super::gpus::Engines;
use crate::serve::stall::StallBoard;
use stoker_pipeline::metrics::{self as m, histogram, Throughput};

use super::registry::Registry;
use super::wake::EventFd;
/// Daemon-wide state the operations side reads and sets: the stop flag, counters for status
/// and metrics, the accept loop's heartbeat.
pub(super) struct ServerState {
    pub(super) stopping: AtomicBool,
    /// Wakes the accept loop when the server stops.
    pub(super) stop_event: EventFd,
    /// Connection threads running (attached ranks and status requests).
    pub(super) connections: Mutex<u64>,
    /// Signalled when the last connection ends.
    pub(super) drained: Condvar,
    /// The feed wakers of the connections' forwarders, by connection id: a stop wakes them.
    pub(super) forwarders: Mutex<HashMap<u64, FeedWaker>>,
    /// Ranks attached.
    pub(super) clients: AtomicU64,
    /// Images delivered to clients.
    pub(super) delivered: AtomicU64,
    /// Ring bytes mapped for clients.
    pub(super) ring_bytes: AtomicU64,
    pub(super) started: Instant,
    /// Milliseconds since `started` when the accept loop last looked up.
    pub(super) heartbeat_ms: AtomicU64,
    /// The throughput figure.
    pub(super) rate: Throughput,
    /// Every attached rank's data stall, as its client reports it.
    pub(super) stalls: Arc<StallBoard>,
    /// The remote workers' figures (`[remote]`), once the service set them.
    pub(super) remote: OnceLock<Box<dyn WorkerFigures>>,
}

/// What a home daemon's remote workers did, as status and metrics show it. The service hands
/// the remote room's board in; the server only asks it.
pub(crate) trait WorkerFigures: Send + Sync {
    /// Each worker's row of `stoker status` (none without workers).
    fn rows(&self) -> Vec<WorkerStatus>;
    /// The share of `all_images` (every image the engine filled) that workers filled; None
    /// without workers.
    fn share(&self, all_images: u64) -> Option<f64>;
    /// Feeds the recorder the workers' figures and returns what it renders itself, as
    /// Prometheus text; called just before a render.
    fn metrics_text(&self, all_images: u64) -> String;
}

impl ServerState {
    pub(super) fn new() -> Result<ServerState, std::io::Error> {
        let now = Instant::now();
        Ok(ServerState {
            stopping: AtomicBool::new(false),
            stop_event: EventFd::new()?,
            connections: Mutex::new(0),
            drained: Condvar::new(),
            forwarders: Mutex::default(),
            clients: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            ring_bytes: AtomicU64::new(0),
            started: now,
            heartbeat_ms: AtomicU64::new(0),
            rate: Throughput::default(),
            stalls: Arc::default(),
            remote: OnceLock::new(),
        })
    }

    /// Counts a connection thread about to start.
    pub(super) fn connection_opened(&self) {
        *self.connections.lock().unwrap_or_else(|e| e.into_inner()) += 1;
    }

    /// Counts a connection thread that ended; the last one wakes a drain.
    pub(super) fn connection_closed(&self) {
        let mut n = self.connections.lock().unwrap_or_else(|e| e.into_inner());
        *n -= 1;
        if *n == 0 {
            self.drained.notify_all();
        }
    }

    pub(super) fn beat(&self) {
        let ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }

    pub(super) fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// What the operations side (signals, watchdog, status, metrics) holds of a running server.
#[derive(Clone)]
pub(crate) struct ServerHandle {
    pub(super) state: Arc<ServerState>,
    pub(super) registry: Arc<Registry>,
    pub(super) engines: Arc<Engines>,
    pub(super) quotas: Arc<Quotas>,
    pub(super) socket: PathBuf,
    pub(super) activated: bool,
}

impl ServerHandle {
    /// Starts the drain: the accept loop ends and attached clients are told "daemon stopping".
    pub(crate) fn stop(&self) {
        self.state.stopping.store(true, Ordering::Release);
        self.state.stop_event.signal();
        let forwarders = self
            .state
            .forwarders
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        for waker in forwarders.values() {
            waker.wake();
        }
    }

    pub(crate) fn is_stopping(&self) -> bool {
        self.state.stopping()
    }

    /// Connection threads still running.
    pub(crate) fn connections(&self) -> u64 {
        *self
            .state
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner())
    }

    /// Waits until every connection has ended, or `timeout`; true if they all ended.
    pub(crate) fn wait_drained(&self, timeout: Duration) -> bool {
        let n = self
            .state
            .connections
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let (n, _) = self
            .state
            .drained
            .wait_timeout_while(n, timeout, |n| *n > 0)
            .unwrap_or_else(|e| e.into_inner());
        *n == 0
    }

    /// Shows `board`'s workers in status and metrics (once; later boards are ignored).
    pub(crate) fn show_workers(&self, board: impl WorkerFigures + 'static) {
        let _ = self.state.remote.set(Box::new(board));
    }

    /// Replaces the access rules and registered datasets (config reload). Running jobs keep
    /// what they opened; new attaches see the new rules.
    pub(crate) fn set_access(&self, access: AccessPolicy) {
        *self
            .registry
            .access
            .write()
            .unwrap_or_else(|e| e.into_inner()) = access;
    }

    /// The object storage of this server's datasets (a reload reconfigures it).
    pub(crate) fn objects(&self) -> &Arc<stoker_pipeline::source::object::ObjectStore> {
        &self.registry.objects
    }

    /// Whether the server still works: the accept loop looked up within `max_age` and the
    /// registry can be locked. The watchdog pings only while this holds.
    pub(crate) fn is_alive(&self, max_age: Duration) -> bool {
        let now = u64::try_from(self.state.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let beat = self.state.heartbeat_ms.load(Ordering::Relaxed);
        let fresh =
            now.saturating_sub(beat) <= u64::try_from(max_age.as_millis()).unwrap_or(u64::MAX);
        let lockable = match self.registry.jobs.try_lock() {
            Ok(_) => true,
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(_)) => false,
        };
        fresh && lockable
    }

    /// Recomputes images/s from the delivered count since the last call (call it every
    /// second or so); returns it.
    pub(crate) fn update_rate(&self) -> f64 {
        self.state
            .rate
            .update(self.state.delivered.load(Ordering::Relaxed))
    }

    pub(super) fn rate(&self) -> f64 {
        self.state.rate.last()
    }

    /// Shows job keys whole on `/metrics`, dataset paths in them included
    /// (`metrics.show_paths`), or not (the default).
    pub(crate) fn show_metric_paths(&self, on: bool) {
        self.state.stalls.set_show_paths(on);
    }

    /// Feeds the recorder what the daemon's atomics hold (the one record of those events,
    /// see [`stoker_pipeline::metrics::catalogue`]): counters, and the gauges that are state
    /// (clients, jobs, ring bytes, GPUs); returns the series the daemon renders itself as
    /// Prometheus text (the latency histograms and the per-rank data stall). Call it just
    /// before each render.
    pub(crate) fn metrics_text(&self) -> String {
        let stages = self.engines.stage_figures();
        let t = &stages.totals;
        let delivered = self.state.delivered.load(Ordering::Relaxed);
        for (stage, n) in [
            ("read", t.images_read),
            ("decode", t.images_decoded),
            ("augment", t.images_decoded),
            ("delivered", delivered),
        ] {
            ::metrics::counter!(m::IMAGES_TOTAL, "stage" => stage).absolute(n);
        }
        ::metrics::counter!(m::BYTES_READ_TOTAL).absolute(t.bytes_read);
        for (reason, n) in &stages.bad_by_reason {
            ::metrics::counter!(m::BAD_SAMPLES_TOTAL, "reason" => *reason).absolute(*n);
        }
        self.refresh_gauges();
        let mut text = String::new();
        let h = &stages.histograms;
        let rows = [
            ("read", h.read),
            ("decode", h.decode),
            ("augment", h.augment),
        ]
        .map(|(stage, snap)| (vec![("stage", stage.to_owned())], snap));
        histogram::render(&mut text, m::STAGE_SECONDS, &rows);
        let gpus = self.engines.gpu_histograms();
        for (name, pick) in [(m::GPU_DECODE_SECONDS, 0), (m::GPU_KERNEL_SECONDS, 1)] {
            let rows: Vec<_> = gpus
                .iter()
                .map(|(gpu, decode, kernel)| {
                    (
                        vec![("gpu", gpu.clone())],
                        if pick == 0 { *decode } else { *kernel },
                    )
                })
                .collect();
            histogram::render(&mut text, name, &rows);
        }
        text.push_str(&self.state.stalls.prometheus_text());
        if let Some(remote) = self.state.remote.get() {
            text.push_str(&remote.metrics_text(t.images));
        }
        text
    }

    /// Sets the gauges that are state rather than events (clients, jobs, ring bytes, GPUs)
    /// and the GPUs' decode counts.
    fn refresh_gauges(&self) {
        let jobs = self.job_count();
        ::metrics::gauge!(m::JOBS).set(jobs as f64);
        ::metrics::gauge!(m::INDEX_BYTES).set(self.index_bytes() as f64);
        let entries = stoker_pipeline::transform::decode::entry_table_bytes();
        ::metrics::gauge!(m::ENTRY_TABLE_BYTES).set(entries as f64);
        ::metrics::gauge!(m::CLIENTS).set(self.state.clients.load(Ordering::Relaxed) as f64);
        let gpus = self.engines.gpu_status();
        let device: u64 = gpus.iter().map(|g| g.ring_device_bytes).sum();
        let all = self.state.ring_bytes.load(Ordering::Relaxed);
        ::metrics::gauge!(m::RING_BYTES, "memory" => "host").set(all.saturating_sub(device) as f64);
        for g in gpus {
            let gpu = g.uuid.clone();
            for (path, n) in [
                ("hardware", g.decoded_hardware),
                ("hybrid", g.decoded_hybrid),
                ("cpu", g.decoded_cpu),
            ] {
                ::metrics::counter!(m::GPU_DECODE_TOTAL, "gpu" => gpu.clone(), "path" => path)
                    .absolute(n);
            }
            ::metrics::gauge!(m::RING_BYTES, "memory" => "device", "gpu" => gpu.clone())
                .set(g.ring_device_bytes as f64);
            ::metrics::gauge!(m::GPU_BATCHES_IN_FLIGHT, "gpu" => gpu.clone())
                .set(g.batches_in_flight as f64);
            ::metrics::gauge!(
                m::GPU_INFO,
                "gpu" => gpu,
                "name" => g.name,
                "emulated" => g.emulated.to_string(),
                "broken" => g.broken.is_some().to_string()
            )
            .set(1.0);
        }
    }

    /// How many jobs are registered now.
    /// Bytes the jobs' indexes hold, each index once however many jobs share it.
    fn index_bytes(&self) -> u64 {
        let jobs = self.registry.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut seen = std::collections::HashSet::new();
        jobs.values()
            .filter(|e| seen.insert(std::sync::Arc::as_ptr(&e.job.dataset)))
            .map(|e| e.job.dataset.index_bytes())
            .sum()
    }

    fn job_count(&self) -> usize {
        self.registry
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len()
    }

    /// A one-line summary for systemd's STATUS=.
    pub(crate) fn summary(&self) -> String {
        let jobs = self.job_count();
        format!(
            "{} jobs, {} clients, {:.0} img/s{}",
            jobs,
            self.state.clients.load(Ordering::Relaxed),
            self.rate(),
            if self.is_stopping() { ", stopping" } else { "" }
        )
    }

    /// What `stoker status` shows a client of `viewer` uid: the daemon's figures, and the
    /// jobs it may see (its own; every job for root and the daemon's uid).
    pub(crate) fn status(&self, viewer: u32) -> DaemonStatus {
        let totals = self.engines.stage_figures().totals;
        let every_job = self.registry.access().sees_every_job(viewer);
        let mut jobs: Vec<JobStatus> = {
            let reg = self.registry.jobs.lock().unwrap_or_else(|e| e.into_inner());
            reg.iter()
                .filter(|(key, _)| every_job || key.owner == viewer)
                .map(|(key, e)| JobStatus {
                    job: key.name.clone(),
                    owner: key.owner,
                    dataset: e.terms.dataset.clone(),
                    samples: e.job.dataset.len() as u64,
                    world_size: e.terms.world_size,
                    ranks: e.ranks.iter().copied().collect(),
                    batch_size: e.terms.spec.batch_size,
                    steps_per_epoch: e.job.steps_per_epoch(),
                    images_delivered: e.delivered.load(Ordering::Relaxed),
                    stalls: self.state.stalls.of_job(key),
                })
                .collect()
        };
        jobs.sort_by(|a, b| (&a.job, a.owner).cmp(&(&b.job, b.owner)));
        DaemonStatus {
            daemon_version: stoker_wire::protocol::VERSION.to_owned(),
            protocol: stoker_wire::protocol::PROTOCOL_VERSION,
            pid: std::process::id(),
            uptime_s: self.state.started.elapsed().as_secs_f64(),
            socket: self.socket.display().to_string(),
            activated: self.activated,
            stopping: self.is_stopping(),
            clients: self.state.clients.load(Ordering::Relaxed),
            backend: self.engines.backend.name().to_owned(),
            reader: self.engines.cpu.reader_kind().to_owned(),
            threads: self.engines.cpu.threads() as u64,
            images_delivered: self.state.delivered.load(Ordering::Relaxed),
            images_per_s: self.rate(),
            bad_samples: totals.bad,
            ring_bytes: self.state.ring_bytes.load(Ordering::Relaxed),
            datasets: self.registry.access().dataset_names(),
            jobs,
            jobs_left_out: 0,
            gpus: self.engines.gpu_status(),
            workers: self
                .state
                .remote
                .get()
                .map(|r| r.rows())
                .unwrap_or_default(),
            remote_share: self.state.remote.get().and_then(|r| r.share(totals.images)),
        }
    }
}

/// Encodes a status reply, leaving out jobs until it fits the message limit: those with the
/// longest key and dataset first, so that one client's huge key cannot hide other jobs.
pub(super) fn encode_status(mut status: DaemonStatus) -> Result<Vec<u8>, EncodeError> {
    loop {
        match Message::StatusReply(Box::new(status.clone())).encode() {
            Err(EncodeError::TooLong(_)) if !status.jobs.is_empty() => {
                let largest = (0..status.jobs.len())
                    .max_by_key(|&i| status.jobs[i].job.len() + status.jobs[i].dataset.len())
                    .unwrap_or(0);
                status.jobs.remove(largest);
                status.jobs_left_out += 1;
            }
            other => return other,
        }
    }
}
