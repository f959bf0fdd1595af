//! `stokerd`'s serving side: the Unix socket, the registry of jobs, one ring per rank, and the
//! forwarding of READY / RELEASE between a client and its rank's [`Feed`].
//!
//! # Design
//! - One SOCK_SEQPACKET listener. A new connection waits in the accept loop's
//!   [`Lobby`](crate::lobby) (no thread, per-uid caps, a deadline) until its first message
//!   arrives; then it gets its thread (ranks per host are few). Each
//!   connection also runs a forwarder thread that turns feed events into READY / END_OF_DATA
//!   messages, while the connection thread reads RELEASE / DETACH from the socket.
//! - The registry maps a job key to its [`Job`] and the terms every rank must agree on (spec,
//!   world_size, dataset, seed). The first rank creates the job; a later rank whose terms differ
//!   is refused with the field that differs; a rank attached twice is refused. The job is
//!   dropped when its last rank leaves, so a key can later name a new job.
//! - Each rank gets its own sealed memfd ring, sent with SCM_RIGHTS in ATTACHED, mapped once.
//! - A connection ends on DETACH, end of file (the client exited or was killed), a malformed
//!   message, or a protocol violation. Then the feed stops (its Drop waits until no worker
//!   writes the ring), every slot the client held is reclaimed, and the rank is free to attach
//!   again with a start (epoch, step). Other ranks and jobs go on.
//!
//! - Operations (issue 5): the accept loop polls so a drain can stop it; SIGTERM sets
//!   [`ServerHandle::stop`], every forwarder then sends ERROR(STOPPING) "daemon stopping" and
//!   shuts its socket, so connection threads end, feeds stop and rings are unmapped. Datasets
//!   registered by name come from the config and are replaced on reload
//!   ([`ServerHandle::set_access`]); jobs already running keep the path they opened. A STATUS
//!   message instead of ATTACH gets a [`DaemonStatus`] and the connection closes.
//!
//! # Limitations
//! - Access: every connection's peer credentials, the dataset it names, and the ring it asks
//!   for are checked by [`crate::access`] before anything is opened or allocated; a refusal
//!   says which rule refused it.
//!
//! # Limitations
//! - The first rank of a job indexes its dataset outside the registry lock (status and other
//!   attaches go on); two first ranks of one job arriving together both index, and the later
//!   one joins the job the earlier one made.
//! - The `cuda` backend is not served yet: any device other than `cpu` is refused.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, RwLock};
use std::time::{Duration, Instant};

use stoker::memfd::{page_size, MemfdRing};
use stoker::protocol::{
    Attach, Attached, DaemonStatus, EncodeError, EpochOffset, ErrorCode, JobStatus, Message,
    Ready as ReadyMsg, MAX_MESSAGE_BYTES,
};
use stoker::ring::RingLayout;
use stoker::sock::{SeqPacket, SeqPacketListener, SockError};
use stoker::spec::PipelineSpec;

use crate::access::{
    open_dataset, AccessError, AccessPolicy, OpenDatasetError, Peer, QuotaGrant, QuotaLimits,
    Quotas,
};
use crate::dataset::{OpenOptions, WalkLimits};
use crate::fsopen::OpenPolicy;
use crate::lobby::{Lobby, LobbyLimits};
use crate::metrics as m;
use crate::pipeline::{
    Engine, EngineConfig, Feed, FeedEvent, Job, PipelineError, Position, SlotMemory,
};
use crate::stall::{RankStallEntry, StallBoard};

/// How long a new connection may take to send its ATTACH.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// Why a connection that hung up without a word ended (a liveness probe, typically).
const CLOSED_BEFORE_ATTACH: &str = "closed before ATTACH";
/// How long a refused peer's first message is waited for before the refusal is sent.
const REFUSED_PEER_DRAIN: Duration = Duration::from_secs(1);
/// How often a forwarder looks up from its feed to see whether the connection ended.
const FORWARD_POLL: Duration = Duration::from_millis(50);
/// How long the accept loop waits before it looks at the stop flag (and beats the heart).
const ACCEPT_POLL: Duration = Duration::from_millis(200);
/// "accept failed" lines a second at most.
const ACCEPT_LOG_PER_SECOND: u32 = 2;
/// What attached clients are told when the daemon drains.
pub const STOPPING_MESSAGE: &str = "daemon stopping";

/// What the server needs to run.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen (see [`stoker::default_socket_path`]).
    pub socket: PathBuf,
    /// Slots in each rank's ring.
    pub slots: usize,
    pub engine: EngineConfig,
    /// Who may attach and which datasets they may name.
    pub access: AccessPolicy,
    /// Ring memory quotas and limits on clients and jobs.
    pub quotas: QuotaLimits,
    /// File mode of a socket the server creates itself (systemd's socket unit sets its own).
    pub socket_mode: u32,
    /// Group given the socket the server creates, so its members may connect.
    pub socket_group: Option<String>,
    /// Caps and deadline of connections that have not attached ([`crate::lobby`]).
    pub lobby: LobbyLimits,
    /// How far indexing a dataset may walk.
    pub walk: WalkLimits,
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("a ring needs at least 2 slots, configured {0}")]
    Slots(usize),
    #[error("socket {path}: group {group:?} does not exist (server.socket_group)")]
    SocketGroup { path: PathBuf, group: String },
    #[error("socket {path}: cannot set mode {mode:#o} / group: {source}")]
    SocketPermissions {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    #[error("cannot create the socket directory {}: {source}", path.display())]
    SocketDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("another stoker daemon is serving at {}", .0.display())]
    InUse(PathBuf),
    #[error("cannot listen at {}: {source}", path.display())]
    Bind {
        path: PathBuf,
        #[source]
        source: SockError,
    },
    #[error("cannot start the pipeline engine: {0}")]
    Engine(#[from] PipelineError),
    #[error("accept failed: {0}")]
    Accept(SockError),
    #[error("the activated socket: {0}")]
    Activated(String),
}

impl ServerError {
    /// True for errors in the configuration itself (exit code 78, no restart).
    pub fn is_config(&self) -> bool {
        match self {
            ServerError::Slots(_) => true,
            ServerError::Bind { source, .. } => matches!(source, SockError::PathTooLong(_)),
            ServerError::Activated(_) => true,
            ServerError::SocketGroup { .. } => true,
            _ => false,
        }
    }
}

/// A served rank's ring: a sealed memfd the pipeline writes into.
struct ServedRing(MemfdRing);

// SAFETY: `MemfdRing::slot_ptr(i)` points inside a mapping of `ring_bytes >= slots *
// slot_bytes` bytes that lives as long as the ring, and slots are laid out back to back
// without overlap by `RingLayout`.
unsafe impl SlotMemory for ServedRing {
    fn layout(&self) -> &RingLayout {
        self.0.layout()
    }
    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        self.0.slot_ptr(slot)
    }
}

/// What every rank of a job must agree on.
#[derive(Debug, Clone, PartialEq)]
struct JobTerms {
    spec: PipelineSpec,
    world_size: u32,
    dataset: String,
    seed: u64,
    /// The elastic resume point (an offset of 0 is none).
    offset: Option<EpochOffset>,
}

impl JobTerms {
    fn of(a: &Attach) -> JobTerms {
        JobTerms {
            spec: a.spec.clone(),
            world_size: a.world_size,
            dataset: a.dataset.clone(),
            seed: a.seed,
            offset: a.start.offset.filter(|o| o.consumed > 0),
        }
    }

    /// The first field in which `other` differs, for a SPEC_MISMATCH refusal.
    fn mismatch(&self, other: &JobTerms) -> Option<String> {
        if self.world_size != other.world_size {
            return Some(format!(
                "world_size {} differs from the job's {}",
                other.world_size, self.world_size
            ));
        }
        if self.dataset != other.dataset {
            return Some(format!(
                "dataset {:?} differs from the job's {:?}",
                other.dataset, self.dataset
            ));
        }
        if self.seed != other.seed {
            return Some(format!(
                "seed {} differs from the job's {}",
                other.seed, self.seed
            ));
        }
        if self.offset != other.offset {
            let show = |o: Option<EpochOffset>| o.map_or("none".to_owned(), |o| o.to_string());
            return Some(format!(
                "elastic offset ({}) differs from the job's ({})",
                show(other.offset),
                show(self.offset)
            ));
        }
        self.spec
            .first_difference(&other.spec)
            .map(|field| format!("spec field {field} differs from the job's"))
    }
}

struct JobEntry {
    terms: JobTerms,
    job: Arc<Job>,
    ranks: BTreeSet<u32>,
    /// Images delivered to this job's ranks.
    delivered: Arc<AtomicU64>,
}

/// Job key → job, and the access rules (which SIGHUP may replace). Shared by every
/// connection.
struct Registry {
    jobs: Mutex<HashMap<String, JobEntry>>,
    access: RwLock<AccessPolicy>,
    max_jobs: usize,
    walk: WalkLimits,
}

impl Default for Registry {
    fn default() -> Self {
        Registry {
            jobs: Mutex::default(),
            access: RwLock::new(AccessPolicy::permissive_for_owner()),
            max_jobs: usize::MAX,
            walk: WalkLimits::default(),
        }
    }
}

/// A refusal sent to the client before the connection closes.
#[derive(Debug)]
struct Refusal {
    code: ErrorCode,
    message: String,
}

fn refuse(code: ErrorCode, message: impl Into<String>) -> Refusal {
    Refusal {
        code,
        message: message.into(),
    }
}

impl From<AccessError> for Refusal {
    fn from(e: AccessError) -> Refusal {
        let code = match e {
            AccessError::Peer(_) | AccessError::Dataset(_) => ErrorCode::PermissionDenied,
            AccessError::UnknownName(_) => ErrorCode::UnknownDataset,
            AccessError::Quota(_) => ErrorCode::Quota,
        };
        refuse(code, e.to_string())
    }
}

/// One rank's place in the registry; dropping it frees the rank (and the job, if it was the
/// last rank).
struct RankSeat {
    registry: Arc<Registry>,
    key: String,
    rank: u32,
    delivered: Arc<AtomicU64>,
}

impl Drop for RankSeat {
    fn drop(&mut self) {
        let mut jobs = self.registry.jobs.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(entry) = jobs.get_mut(&self.key) {
            entry.ranks.remove(&self.rank);
            if entry.ranks.is_empty() {
                jobs.remove(&self.key);
                tracing::info!(job = %self.key, "job ended: no ranks attached");
            }
        }
    }
}

impl Registry {
    /// The access rules in force.
    fn access(&self) -> std::sync::RwLockReadGuard<'_, AccessPolicy> {
        self.access.read().unwrap_or_else(|e| e.into_inner())
    }

    /// Refuses a new job when `limits.max_jobs` run already.
    fn check_job_count(&self, jobs: &HashMap<String, JobEntry>, a: &Attach) -> Result<(), Refusal> {
        if jobs.len() < self.max_jobs {
            return Ok(());
        }
        Err(refuse(
            ErrorCode::Quota,
            format!(
                "job {:?}: {} jobs are running, the limit (limits.max_jobs) is {}",
                a.job,
                jobs.len(),
                self.max_jobs
            ),
        ))
    }

    /// Opens the dataset of a job's first rank under `policy` and makes the job.
    fn create_job(
        &self,
        a: &Attach,
        path: &Path,
        policy: &OpenPolicy,
        offset: Option<EpochOffset>,
    ) -> Result<Arc<Job>, Refusal> {
        let opts = OpenOptions {
            limits: self.walk,
            ..OpenOptions::default()
        };
        let dataset = open_dataset(&a.dataset, path, &opts, policy).map_err(|e| match e {
            OpenDatasetError::Access(e) => Refusal::from(e),
            OpenDatasetError::Dataset(e) => refuse(ErrorCode::UnknownDataset, e.to_string()),
        })?;
        self.access().check_dataset_files(&a.dataset, &dataset)?;
        let (ds, spec) = (Arc::new(dataset), a.spec.clone());
        Job::with_policy(ds, spec, a.seed, a.world_size, offset, policy.clone()).map_err(
            |e| match e {
                PipelineError::Spec(e) => refuse(ErrorCode::InvalidSpec, e.to_string()),
                PipelineError::Sampler(e) => refuse(ErrorCode::InvalidSpec, e),
                e => refuse(ErrorCode::Internal, e.to_string()),
            },
        )
    }

    /// Checks an attach against the job it names, creating the job for its first rank (from
    /// the dataset at `path`, which the access rules resolved), and takes the rank's seat.
    /// Returns the job, the seat, how many ranks are now attached, and whether this attach
    /// created the job.
    fn seat(
        self: &Arc<Self>,
        a: &Attach,
        path: &Path,
        (policy, peer_uid): (&OpenPolicy, u32),
    ) -> Result<(Arc<Job>, RankSeat, u32, bool), Refusal> {
        let terms = JobTerms::of(a);
        let lock = || self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let mut jobs = lock();
        let mut created = false;
        if !jobs.contains_key(&a.job) {
            self.check_job_count(&jobs, a)?;
            // Indexing may take long (a large or hostile tree): not under the lock, so status
            // and other attaches go on meanwhile.
            drop(jobs);
            let job = self.create_job(a, path, policy, terms.offset)?;
            jobs = lock();
            // Another first rank of the same job may have made it meanwhile: join that one.
            if !jobs.contains_key(&a.job) {
                self.check_job_count(&jobs, a)?;
                tracing::info!(
                    job = %a.job,
                    dataset = %a.dataset,
                    samples = job.dataset.len(),
                    world_size = a.world_size,
                    steps_per_epoch = job.steps_per_epoch(),
                    offset = ?terms.offset,
                    "job created"
                );
                let entry = JobEntry {
                    terms: terms.clone(),
                    job,
                    ranks: BTreeSet::new(),
                    delivered: Arc::default(),
                };
                jobs.insert(a.job.clone(), entry);
                created = true;
            }
        }
        let entry = jobs.get(&a.job).expect("inserted or present above");
        if let Some(diff) = entry.terms.mismatch(&terms) {
            return Err(refuse(
                ErrorCode::SpecMismatch,
                format!("job {:?}, rank {}: {diff}", a.job, a.rank),
            ));
        }
        if entry.job.open_policy() != policy {
            return Err(refuse(
                ErrorCode::PermissionDenied,
                format!(
                    "job {:?} reads its files with other credentials than uid {}'s: \
                     another user's job cannot be joined",
                    a.job, peer_uid
                ),
            ));
        }
        if entry.ranks.contains(&a.rank) {
            return Err(refuse(
                ErrorCode::RankTaken,
                format!("job {:?}: rank {} is attached already", a.job, a.rank),
            ));
        }
        let entry = jobs.get_mut(&a.job).expect("inserted or present above");
        entry.ranks.insert(a.rank);
        let seat = RankSeat {
            registry: Arc::clone(self),
            key: a.job.clone(),
            rank: a.rank,
            delivered: Arc::clone(&entry.delivered),
        };
        Ok((
            Arc::clone(&entry.job),
            seat,
            entry.ranks.len() as u32,
            created,
        ))
    }
}

/// Daemon-wide state the operations side reads and sets: the stop flag, counters for status
/// and metrics, the accept loop's heartbeat.
struct ServerState {
    stopping: AtomicBool,
    /// Connection threads running (attached ranks and status requests).
    connections: AtomicU64,
    /// Ranks attached.
    clients: AtomicU64,
    /// Images delivered to clients.
    delivered: AtomicU64,
    /// Ring bytes mapped for clients.
    ring_bytes: AtomicU64,
    started: Instant,
    /// Milliseconds since `started` when the accept loop last looked up.
    heartbeat_ms: AtomicU64,
    /// (when, delivered then, images/s) for the throughput figure.
    rate: Mutex<(Instant, u64, f64)>,
    /// Every attached rank's data stall, as its client reports it.
    stalls: Arc<StallBoard>,
}

impl ServerState {
    fn new() -> ServerState {
        let now = Instant::now();
        ServerState {
            stopping: AtomicBool::new(false),
            connections: AtomicU64::new(0),
            clients: AtomicU64::new(0),
            delivered: AtomicU64::new(0),
            ring_bytes: AtomicU64::new(0),
            started: now,
            heartbeat_ms: AtomicU64::new(0),
            rate: Mutex::new((now, 0, 0.0)),
            stalls: Arc::default(),
        }
    }

    fn beat(&self) {
        let ms = self.started.elapsed().as_millis() as u64;
        self.heartbeat_ms.store(ms, Ordering::Relaxed);
    }

    fn stopping(&self) -> bool {
        self.stopping.load(Ordering::Acquire)
    }
}

/// What the operations side (signals, watchdog, status, metrics) holds of a running server.
#[derive(Clone)]
pub struct ServerHandle {
    state: Arc<ServerState>,
    registry: Arc<Registry>,
    engine: Arc<Engine>,
    quotas: Arc<Quotas>,
    socket: PathBuf,
    activated: bool,
}

impl ServerHandle {
    /// Starts the drain: the accept loop ends and attached clients are told "daemon stopping".
    pub fn stop(&self) {
        self.state.stopping.store(true, Ordering::Release);
    }

    pub fn is_stopping(&self) -> bool {
        self.state.stopping()
    }

    /// Connection threads still running.
    pub fn connections(&self) -> u64 {
        self.state.connections.load(Ordering::Acquire)
    }

    /// Waits until every connection has ended, or `timeout`; true if they all ended.
    pub fn wait_drained(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while self.connections() > 0 {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        true
    }

    /// Replaces the access rules and registered datasets (config reload). Running jobs keep
    /// what they opened; new attaches see the new rules.
    pub fn set_access(&self, access: AccessPolicy) {
        *self
            .registry
            .access
            .write()
            .unwrap_or_else(|e| e.into_inner()) = access;
    }

    /// Whether the server still works: the accept loop looked up within `max_age` and the
    /// registry can be locked. The watchdog pings only while this holds.
    pub fn is_alive(&self, max_age: Duration) -> bool {
        let now = self.state.started.elapsed().as_millis() as u64;
        let beat = self.state.heartbeat_ms.load(Ordering::Relaxed);
        let fresh = now.saturating_sub(beat) <= max_age.as_millis() as u64;
        let lockable = match self.registry.jobs.try_lock() {
            Ok(_) => true,
            Err(std::sync::TryLockError::WouldBlock) => true,
            Err(std::sync::TryLockError::Poisoned(_)) => false,
        };
        fresh && lockable
    }

    /// Recomputes images/s from the delivered count since the last call (call it every
    /// second or so); returns it.
    pub fn update_rate(&self) -> f64 {
        let delivered = self.state.delivered.load(Ordering::Relaxed);
        let mut r = self.state.rate.lock().unwrap_or_else(|e| e.into_inner());
        let dt = r.0.elapsed().as_secs_f64();
        if dt >= 0.5 {
            r.2 = (delivered - r.1) as f64 / dt;
            *r = (Instant::now(), delivered, r.2);
        }
        r.2
    }

    fn rate(&self) -> f64 {
        self.state.rate.lock().unwrap_or_else(|e| e.into_inner()).2
    }

    /// Sets the gauges that are state rather than events (clients, jobs, ring bytes).
    pub fn refresh_metrics(&self) {
        let jobs = self
            .registry
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        ::metrics::gauge!(m::JOBS).set(jobs as f64);
        ::metrics::gauge!(m::CLIENTS).set(self.state.clients.load(Ordering::Relaxed) as f64);
        ::metrics::gauge!(m::RING_BYTES, "memory" => "host")
            .set(self.state.ring_bytes.load(Ordering::Relaxed) as f64);
    }

    /// The per-rank data stall series, as Prometheus text (see [`crate::stall`]).
    pub fn stall_metrics(&self) -> String {
        self.state.stalls.prometheus_text()
    }

    /// A one-line summary for systemd's STATUS=.
    pub fn summary(&self) -> String {
        let jobs = self
            .registry
            .jobs
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len();
        format!(
            "{} jobs, {} clients, {:.0} img/s{}",
            jobs,
            self.state.clients.load(Ordering::Relaxed),
            self.rate(),
            if self.is_stopping() { ", stopping" } else { "" }
        )
    }

    /// What `stoker status` shows.
    pub fn status(&self) -> DaemonStatus {
        let totals = self.engine.stats();
        let mut jobs: Vec<JobStatus> = {
            let reg = self.registry.jobs.lock().unwrap_or_else(|e| e.into_inner());
            reg.iter()
                .map(|(key, e)| JobStatus {
                    job: key.clone(),
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
        jobs.sort_by(|a, b| a.job.cmp(&b.job));
        DaemonStatus {
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            pid: std::process::id(),
            uptime_s: self.state.started.elapsed().as_secs_f64(),
            socket: self.socket.display().to_string(),
            activated: self.activated,
            stopping: self.is_stopping(),
            clients: self.state.clients.load(Ordering::Relaxed),
            backend: "cpu".to_owned(),
            reader: self.engine.reader_kind().to_owned(),
            threads: self.engine.threads() as u64,
            images_delivered: self.state.delivered.load(Ordering::Relaxed),
            images_per_s: self.rate(),
            bad_samples: totals.bad,
            ring_bytes: self.state.ring_bytes.load(Ordering::Relaxed),
            datasets: self.registry.access().dataset_names(),
            jobs,
            jobs_left_out: 0,
        }
    }
}

/// Encodes a status reply, leaving out jobs until it fits the message limit.
fn encode_status(mut status: DaemonStatus) -> Result<Vec<u8>, EncodeError> {
    loop {
        match Message::StatusReply(Box::new(status.clone())).encode() {
            Err(EncodeError::TooLong(_)) if !status.jobs.is_empty() => {
                let drop = status.jobs.len().div_ceil(2);
                status.jobs.truncate(status.jobs.len() - drop);
                status.jobs_left_out += drop as u64;
            }
            other => return other,
        }
    }
}

/// The daemon: a listening socket, the engine, the job registry.
pub struct Server {
    listener: SeqPacketListener,
    socket: PathBuf,
    /// False for a socket systemd passed: systemd owns the file, we leave it on drop.
    owns_socket: bool,
    slots: usize,
    engine: Arc<Engine>,
    registry: Arc<Registry>,
    quotas: Arc<Quotas>,
    state: Arc<ServerState>,
    lobby: LobbyLimits,
    /// Rate limit of "accept failed" lines.
    accept_log: Mutex<crate::ratelimit::RateLimit>,
}

/// Gives a socket file the configured mode and group (who may connect is who may write it).
fn set_socket_permissions(path: &Path, mode: u32, group: Option<&str>) -> Result<(), ServerError> {
    use std::os::unix::fs::PermissionsExt;
    let perms_err = |source| ServerError::SocketPermissions {
        path: path.to_owned(),
        mode,
        source,
    };
    std::fs::set_permissions(path, std::fs::Permissions::from_mode(mode)).map_err(perms_err)?;
    if let Some(group) = group {
        let gid = group_id(group).ok_or_else(|| ServerError::SocketGroup {
            path: path.to_owned(),
            group: group.to_owned(),
        })?;
        std::os::unix::fs::chown(path, None, Some(gid)).map_err(perms_err)?;
    }
    Ok(())
}

/// The gid of a group name (or a numeric gid), from the system's group database.
fn group_id(name: &str) -> Option<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Some(gid);
    }
    let cname = std::ffi::CString::new(name).ok()?;
    let mut buf = vec![0u8; 16 * 1024];
    // SAFETY: a zeroed libc::group is a valid out-parameter for getgrnam_r.
    let mut grp: libc::group = unsafe { std::mem::zeroed() };
    let mut found: *mut libc::group = std::ptr::null_mut();
    // SAFETY: every pointer refers to live memory of the stated size for the call's duration;
    // the result only points into `grp` and `buf`, which we do not read beyond gr_gid.
    let rc = unsafe {
        libc::getgrnam_r(
            cname.as_ptr(),
            &mut grp,
            buf.as_mut_ptr().cast(),
            buf.len(),
            &mut found,
        )
    };
    (rc == 0 && !found.is_null()).then_some(grp.gr_gid)
}

impl Server {
    /// Checks the config, starts the engine, and listens at `config.socket` (creating its
    /// directory, and replacing a stale socket no daemon answers on).
    pub fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.slots < 2 {
            return Err(ServerError::Slots(config.slots));
        }
        let socket = config.socket.clone();
        if let Some(dir) = socket.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| ServerError::SocketDir {
                path: dir.to_owned(),
                source,
            })?;
        }
        if std::fs::symlink_metadata(&socket).is_ok() {
            match SeqPacket::connect(&socket) {
                Ok(_) => return Err(ServerError::InUse(socket)),
                Err(_) => {
                    tracing::info!(socket = %socket.display(), "removing stale socket");
                    let _ = std::fs::remove_file(&socket);
                }
            }
        }
        let listener = SeqPacketListener::bind(&socket).map_err(|source| ServerError::Bind {
            path: socket.clone(),
            source,
        })?;
        set_socket_permissions(&socket, config.socket_mode, config.socket_group.as_deref())?;
        Server::with_listener(listener, socket, true, config)
    }

    /// Serves on a listening socket systemd passed (socket activation), after checking it is
    /// a listening unix SOCK_SEQPACKET socket. `socket` names it in logs and status.
    pub fn from_activated(
        fd: OwnedFd,
        socket: PathBuf,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        if config.slots < 2 {
            return Err(ServerError::Slots(config.slots));
        }
        crate::systemd::check_seqpacket_listener(&fd).map_err(ServerError::Activated)?;
        Server::with_listener(SeqPacketListener::from_fd(fd), socket, false, config)
    }

    fn with_listener(
        listener: SeqPacketListener,
        socket: PathBuf,
        owns_socket: bool,
        config: ServerConfig,
    ) -> Result<Server, ServerError> {
        let engine = Engine::new(config.engine)?;
        let registry = Arc::new(Registry {
            jobs: Mutex::default(),
            access: RwLock::new(config.access),
            max_jobs: config.quotas.max_jobs,
            walk: config.walk,
        });
        let state = Arc::new(ServerState::new());
        state.beat();
        Ok(Server {
            listener,
            socket,
            owns_socket,
            slots: config.slots,
            engine,
            registry,
            quotas: Quotas::new(config.quotas),
            state,
            lobby: config.lobby,
            accept_log: Mutex::new(crate::ratelimit::RateLimit::new(ACCEPT_LOG_PER_SECOND)),
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// What signals, the watchdog, status and metrics hold of this server.
    pub fn handle(&self) -> ServerHandle {
        ServerHandle {
            state: Arc::clone(&self.state),
            registry: Arc::clone(&self.registry),
            engine: Arc::clone(&self.engine),
            quotas: Arc::clone(&self.quotas),
            socket: self.socket.clone(),
            activated: !self.owns_socket,
        }
    }

    /// Accepts clients until [`ServerHandle::stop`] (then returns `Ok`) or accepting fails.
    pub fn serve(&self) -> Result<(), ServerError> {
        tracing::info!(
            socket = %self.socket.display(),
            slots = self.slots,
            threads = self.engine.threads(),
            "stokerd serving"
        );
        let mut next_id: u64 = 0;
        // Connections that have not sent their first message wait here, without a thread.
        let mut lobby = Lobby::new(self.lobby);
        loop {
            self.state.beat();
            if self.state.stopping() {
                tracing::info!("no longer accepting connections (stopping)");
                return Ok(());
            }
            let mut pfds = lobby.poll_fds(&self.listener);
            let wait = lobby.timeout(ACCEPT_POLL);
            // SAFETY: `pfds` is a valid array of pollfds for the duration of the call.
            let rc = unsafe {
                libc::poll(
                    pfds.as_mut_ptr(),
                    pfds.len() as libc::nfds_t,
                    wait.as_millis() as libc::c_int,
                )
            };
            if rc < 0 {
                let e = std::io::Error::last_os_error();
                if e.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(ServerError::Accept(SockError::Io {
                    op: "poll",
                    source: e,
                }));
            }
            for arrived in lobby.sort_out(&pfds) {
                self.spawn_connection(arrived.id, arrived.sock);
            }
            if pfds[0].revents & libc::POLLIN == 0 {
                continue;
            }
            let conn = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if is_fd_exhaustion(&e) => {
                    // Make room by closing a waiting connection; else wait for fds to free.
                    if !lobby.evict_one() {
                        self.warn_accept(&e);
                        std::thread::sleep(Duration::from_millis(10));
                    }
                    continue;
                }
                Err(e) if is_transient_accept(&e) => {
                    self.warn_accept(&e);
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(ServerError::Accept(e)),
            };
            next_id += 1;
            ::metrics::counter!(m::CONNECTIONS_TOTAL).increment(1);
            lobby.admit(next_id, conn);
        }
    }

    /// Logs a failed accept, at most a few lines a second.
    fn warn_accept(&self, e: &SockError) {
        let mut log = self.accept_log.lock().unwrap_or_else(|p| p.into_inner());
        if let crate::ratelimit::Admit::Log { suppressed } = log.admit(Instant::now()) {
            tracing::warn!(error = %e, suppressed, "accept failed; going on");
        }
    }

    /// Starts the thread of a connection whose first message has arrived.
    fn spawn_connection(&self, id: u64, conn: SeqPacket) {
        let ctx = Connection {
            id,
            handle: self.handle(),
            slots: self.slots,
        };
        // Counted before the thread starts, so a drain never misses it.
        self.state.connections.fetch_add(1, Ordering::AcqRel);
        let spawned = std::thread::Builder::new()
            .name(format!("stoker-conn-{id}"))
            .spawn(move || {
                let state = Arc::clone(&ctx.handle.state);
                ctx.run(conn);
                state.connections.fetch_sub(1, Ordering::AcqRel);
            });
        if let Err(e) = spawned {
            self.state.connections.fetch_sub(1, Ordering::AcqRel);
            tracing::error!(conn = id, error = %e, "cannot start a connection thread");
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        if self.owns_socket {
            let _ = std::fs::remove_file(&self.socket);
        }
    }
}

fn is_fd_exhaustion(e: &SockError) -> bool {
    matches!(e.raw_os_error(), Some(libc::EMFILE) | Some(libc::ENFILE))
}

fn is_transient_accept(e: &SockError) -> bool {
    matches!(
        e.raw_os_error(),
        Some(libc::ECONNABORTED)
            | Some(libc::EMFILE)
            | Some(libc::ENFILE)
            | Some(libc::ENOBUFS)
            | Some(libc::ENOMEM)
            | Some(libc::EPROTO)
            | Some(libc::EPERM)
    )
}

/// One client connection.
struct Connection {
    id: u64,
    handle: ServerHandle,
    slots: usize,
}

/// The first message of a connection.
enum Opening {
    Attach(Box<Attach>),
    Status,
}

/// Why a connection ended.
#[derive(Debug)]
enum End {
    Detached,
    Eof,
    Malformed(String),
    Violation(String),
    Socket(SockError),
}

impl Connection {
    fn run(self, sock: SeqPacket) {
        let id = self.id;
        // Nothing a peer sends is parsed before its credentials pass.
        let peer = match sock.peer_cred() {
            Ok(c) => Peer::from_cred(&c),
            Err(e) => {
                tracing::warn!(conn = id, error = %e, "no peer credentials; refused");
                let why = format!("cannot read the peer's credentials: {e}");
                send_error(&sock, refuse(ErrorCode::PermissionDenied, why));
                return;
            }
        };
        tracing::debug!(
            conn = id,
            pid = peer.pid,
            uid = peer.uid,
            "client connected"
        );
        if let Err(e) = self.handle.registry.access().check_peer(&peer) {
            tracing::warn!(conn = id, reason = %e, "client refused");
            // Take the client's first message off the socket, unread, so that its send does
            // not fail on a closed connection before it can read why.
            let _ = sock.set_read_timeout(Some(REFUSED_PEER_DRAIN));
            let _ = sock.recv(&mut [0u8; 64]);
            send_error(&sock, e.into());
            return;
        }
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let attach = match self.read_attach(&sock, &mut buf) {
            Ok(Opening::Attach(_)) if self.handle.is_stopping() => {
                send_error(&sock, refuse(ErrorCode::Stopping, STOPPING_MESSAGE));
                return;
            }
            Ok(Opening::Attach(a)) => a,
            Ok(Opening::Status) => {
                match encode_status(self.handle.status()) {
                    Ok(bytes) => {
                        let _ = sock.send(&bytes, &[]);
                    }
                    Err(e) => send_error(&sock, refuse(ErrorCode::Internal, e.to_string())),
                }
                tracing::debug!(conn = id, "status answered");
                return;
            }
            Err(r) if r.message == CLOSED_BEFORE_ATTACH => {
                tracing::debug!(conn = id, "closed before ATTACH");
                return;
            }
            Err(r) => {
                tracing::warn!(conn = id, code = %r.code, reason = %r.message, "attach refused");
                send_error(&sock, r);
                return;
            }
        };
        let who = format!(
            "job {:?} rank {}/{}",
            attach.job, attach.rank, attach.world_size
        );
        let (feed, seat, _grant, ring_bytes) = match self.start(&sock, &attach, &peer) {
            Ok(v) => v,
            Err(r) => {
                tracing::warn!(conn = id, %who, code = %r.code, reason = %r.message, "attach refused");
                send_error(&sock, r);
                return;
            }
        };
        tracing::info!(
            conn = id,
            %who,
            epoch = attach.start.epoch,
            step = attach.start.step,
            "rank attached"
        );
        let state = Arc::clone(&self.handle.state);
        state.clients.fetch_add(1, Ordering::Relaxed);
        state.ring_bytes.fetch_add(ring_bytes, Ordering::Relaxed);
        let feed = Arc::new(feed);
        let stop = Arc::new(AtomicBool::new(false));
        let forwarder = match sock.try_clone() {
            Ok(out) => {
                let (feed, stop) = (Arc::clone(&feed), Arc::clone(&stop));
                let counts = Delivered {
                    daemon: Arc::clone(&state),
                    job: Arc::clone(&seat.delivered),
                };
                std::thread::Builder::new()
                    .name(format!("stoker-fwd-{id}"))
                    .spawn(move || forward(id, &feed, &out, &stop, &counts))
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        let stall = state.stalls.entry(&attach.job, attach.rank);
        let end = match &forwarder {
            Ok(_) => serve_releases(&sock, &feed, &stall, &mut buf),
            Err(e) => {
                send_error(
                    &sock,
                    refuse(ErrorCode::Internal, format!("cannot forward: {e}")),
                );
                End::Violation(format!("cannot start the forwarder: {e}"))
            }
        };
        stop.store(true, Ordering::Release);
        if let Ok(handle) = forwarder {
            let _ = handle.join();
        }
        let leased = feed.leased();
        // Drop of the last Arc<Feed> stops it and waits until no worker writes the ring; the
        // seat (`_seat`) and the quota grant (`_grant`) are freed after it, at the end of this
        // function.
        drop(feed);
        ::metrics::gauge!(m::READY_SLOTS).decrement(leased as f64);
        state.clients.fetch_sub(1, Ordering::Relaxed);
        state.ring_bytes.fetch_sub(ring_bytes, Ordering::Relaxed);
        drop(seat);
        if state.stopping() {
            tracing::info!(conn = id, %who, reclaimed = leased, "rank told: daemon stopping");
            return;
        }
        match end {
            End::Detached | End::Eof => {
                tracing::info!(conn = id, %who, reclaimed = leased, how = ?end, "rank detached")
            }
            End::Malformed(ref why) | End::Violation(ref why) => {
                tracing::warn!(conn = id, %who, reclaimed = leased, reason = %why, "connection closed")
            }
            End::Socket(ref e) => {
                tracing::warn!(conn = id, %who, reclaimed = leased, error = %e, "connection failed")
            }
        }
    }

    fn read_attach(&self, sock: &SeqPacket, buf: &mut [u8]) -> Result<Opening, Refusal> {
        let _ = sock.set_read_timeout(Some(ATTACH_TIMEOUT));
        let got = sock.recv(buf);
        let _ = sock.set_read_timeout(None);
        let r = match got {
            Ok(Some(r)) => r,
            Ok(None) => return Err(refuse(ErrorCode::BadMessage, CLOSED_BEFORE_ATTACH)),
            Err(e) if e.is_timeout() => {
                return Err(refuse(
                    ErrorCode::BadMessage,
                    "no ATTACH within the timeout",
                ))
            }
            Err(e) => return Err(refuse(ErrorCode::BadMessage, e.to_string())),
        };
        if !r.fds.is_empty() {
            return Err(refuse(ErrorCode::BadMessage, "ATTACH may not carry fds"));
        }
        match Message::decode(&buf[..r.len]) {
            Ok(Message::Attach(a)) => Ok(Opening::Attach(a)),
            Ok(Message::Status) => Ok(Opening::Status),
            Ok(other) => Err(refuse(
                ErrorCode::BadMessage,
                format!("expected ATTACH, got {:?}", other.kind()),
            )),
            Err(e) => Err(refuse(e.code(), e.to_string())),
        }
    }

    /// Validates the attach, checks the dataset against the access rules, seats the rank,
    /// reserves and makes its ring, starts its feed and answers ATTACHED with the ring's fd.
    fn start(
        &self,
        sock: &SeqPacket,
        a: &Attach,
        peer: &Peer,
    ) -> Result<(Feed, RankSeat, QuotaGrant, u64), Refusal> {
        check_attach(a)?;
        let path = self
            .handle
            .registry
            .access()
            .resolve_dataset(peer, &a.dataset)?;
        let policy = self.handle.registry.access().open_policy(peer, &a.dataset);
        let (job, seat, ranks_attached, created_job) =
            self.handle.registry.seat(a, &path, (&policy, peer.uid))?;
        let steps = job.steps_per_epoch();
        let start_steps = job.steps_in(a.start.epoch);
        if a.start.step > 0 && a.start.step >= start_steps {
            return Err(refuse(
                ErrorCode::InvalidSpec,
                format!(
                    "start step {} is beyond the {start_steps} steps of epoch {}",
                    a.start.step, a.start.epoch
                ),
            ));
        }
        let layout = RingLayout::new(&a.spec, self.slots, page_size());
        let grant = self
            .handle
            .quotas
            .reserve(peer.uid, &a.job, layout.ring_bytes as u64)?;
        let name = CString::new(format!("stoker-ring-rank{}", a.rank)).expect("no NUL");
        let ring = MemfdRing::create(&name, layout)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot create the ring: {e}")))?;
        let answer = Attached {
            slots: layout.slots as u32,
            slot_bytes: layout.slot.slot_bytes as u64,
            ring_bytes: layout.ring_bytes as u64,
            steps_per_epoch: steps,
            offset_epoch_steps: job.offset().map(|o| job.steps_in(o.epoch)),
            dataset_len: job.dataset.len() as u64,
            classes: job.dataset.classes().len() as u64,
            ranks_attached,
            created_job,
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
            accepts_stats: true,
        };
        let bytes = Message::Attached(answer)
            .encode()
            .map_err(|e| refuse(ErrorCode::Internal, e.to_string()))?;
        let ring = Arc::new(ServedRing(ring));
        // Send the answer before the feed starts, so READY never precedes ATTACHED.
        sock.send(&bytes, &[ring.0.as_fd()])
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot answer: {e}")))?;
        let start = Position {
            epoch: a.start.epoch,
            step: a.start.step,
        };
        let feed = self
            .handle
            .engine
            .start_feed(job, a.rank, ring, start)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot start the feed: {e}")))?;
        Ok((feed, seat, grant, layout.ring_bytes as u64))
    }
}

/// Checks what an attach asks for on its own, before it meets the job.
fn check_attach(a: &Attach) -> Result<(), Refusal> {
    if a.job.is_empty() {
        return Err(refuse(ErrorCode::InvalidSpec, "job key is empty"));
    }
    if a.world_size == 0 || a.rank >= a.world_size {
        return Err(refuse(
            ErrorCode::InvalidSpec,
            format!("rank {} is not within world_size {}", a.rank, a.world_size),
        ));
    }
    if a.device != "cpu" {
        return Err(refuse(
            ErrorCode::UnsupportedDevice,
            format!(
                "device {:?}: only \"cpu\" is served by this build",
                a.device
            ),
        ));
    }
    a.spec
        .validate()
        .map_err(|e| refuse(ErrorCode::InvalidSpec, e.to_string()))
}

fn send_error(sock: &SeqPacket, r: Refusal) {
    if let Ok(bytes) = Message::error(r.code, r.message).encode() {
        let _ = sock.send(&bytes, &[]);
    }
}

/// Reads RELEASE (and STATS) messages until the client detaches, hangs up, or breaks the
/// protocol.
fn serve_releases(sock: &SeqPacket, feed: &Feed, stall: &RankStallEntry, buf: &mut [u8]) -> End {
    loop {
        let r = match sock.recv(buf) {
            Ok(Some(r)) => r,
            Ok(None) => return End::Eof,
            Err(SockError::Truncated(n, _)) => {
                let why = format!("message of {n} bytes exceeds the limit");
                send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                return End::Malformed(why);
            }
            Err(e) if e.raw_os_error() == Some(libc::ECONNRESET) => return End::Eof,
            Err(e) => return End::Socket(e),
        };
        if !r.fds.is_empty() {
            let why = "client sent file descriptors".to_owned();
            send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
            return End::Violation(why);
        }
        match Message::decode(&buf[..r.len]) {
            Ok(Message::Release(rel)) => {
                if let Err(e) = feed.release(rel.slot as usize, rel.generation) {
                    let why = format!("RELEASE of slot {}: {e}", rel.slot);
                    send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                    return End::Violation(why);
                }
                ::metrics::gauge!(m::READY_SLOTS).decrement(1.0);
            }
            Ok(Message::Stats(stats)) => stall.record(stats),
            Ok(Message::Detach) => return End::Detached,
            Ok(other) => {
                let why = format!("unexpected {:?} after attach", other.kind());
                send_error(sock, refuse(ErrorCode::BadMessage, why.clone()));
                return End::Violation(why);
            }
            Err(e) => {
                let why = e.to_string();
                send_error(sock, refuse(e.code(), why.clone()));
                return End::Malformed(why);
            }
        }
    }
}

/// Where a forwarder counts the images it delivers.
struct Delivered {
    daemon: Arc<ServerState>,
    job: Arc<AtomicU64>,
}

/// Sends the feed's READY and END_OF_DATA events to the client until `stop` is set, the
/// data ends, or the client is gone. When the daemon drains it sends ERROR(STOPPING) and
/// shuts the socket, which ends the connection thread's read.
fn forward(id: u64, feed: &Feed, sock: &SeqPacket, stop: &AtomicBool, counts: &Delivered) {
    let mut bytes = Vec::with_capacity(64);
    while !stop.load(Ordering::Acquire) {
        if counts.daemon.stopping() {
            send_error(sock, refuse(ErrorCode::Stopping, STOPPING_MESSAGE));
            sock.shutdown();
            return;
        }
        let msg = match feed.recv_timeout(FORWARD_POLL) {
            Ok(None) => continue,
            Ok(Some(FeedEvent::Ready(r))) => Message::Ready(ReadyMsg {
                slot: r.slot as u32,
                generation: r.generation,
                epoch: r.epoch,
                step: r.step,
                n: r.n as u32,
            }),
            Ok(Some(FeedEvent::EndOfData)) => Message::EndOfData,
            Err(PipelineError::Stopped) => return,
            Err(e) => {
                tracing::error!(conn = id, error = %e, "feed failed");
                Message::error(ErrorCode::Internal, format!("feed failed: {e}"))
            }
        };
        let last = !matches!(msg, Message::Ready(_));
        if msg.encode_into(&mut bytes).is_err() || sock.send(&bytes, &[]).is_err() {
            // The client is gone; the connection thread sees end of file and cleans up.
            return;
        }
        if let Message::Ready(r) = &msg {
            let n = u64::from(r.n);
            counts.daemon.delivered.fetch_add(n, Ordering::Relaxed);
            counts.job.fetch_add(n, Ordering::Relaxed);
            ::metrics::counter!(m::IMAGES_TOTAL, "stage" => "delivered").increment(n);
            ::metrics::gauge!(m::READY_SLOTS).increment(1.0);
        }
        if last {
            // Nothing more to send, but a drain must still end this connection: wait for the
            // connection thread to finish, or tell the client the daemon stops.
            while !stop.load(Ordering::Acquire) {
                if counts.daemon.stopping() {
                    send_error(sock, refuse(ErrorCode::Stopping, STOPPING_MESSAGE));
                    sock.shutdown();
                    return;
                }
                std::thread::sleep(FORWARD_POLL);
            }
            return;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker::protocol::StartPosition;

    fn attach() -> Attach {
        Attach {
            job: "j".into(),
            rank: 0,
            world_size: 2,
            device: "cpu".into(),
            spec: PipelineSpec::train(4, 16),
            dataset: "/data".into(),
            seed: 7,
            start: StartPosition::default(),
        }
    }

    #[test]
    fn terms_mismatch_names_the_field() {
        let a = JobTerms::of(&attach());
        assert_eq!(a.mismatch(&a.clone()), None);
        let mut b = attach();
        b.world_size = 4;
        assert!(a
            .mismatch(&JobTerms::of(&b))
            .unwrap()
            .contains("world_size 4"));
        let mut b = attach();
        b.seed = 8;
        assert!(a.mismatch(&JobTerms::of(&b)).unwrap().contains("seed 8"));
        let mut b = attach();
        b.dataset = "/other".into();
        assert!(a.mismatch(&JobTerms::of(&b)).unwrap().contains("/other"));
        let mut b = attach();
        b.spec.drop_last = true;
        assert_eq!(
            a.mismatch(&JobTerms::of(&b)).unwrap(),
            "spec field drop_last differs from the job's"
        );
    }

    #[test]
    fn attach_checks_refuse_with_codes() {
        let mut a = attach();
        a.rank = 2;
        assert_eq!(check_attach(&a).unwrap_err().code, ErrorCode::InvalidSpec);
        let mut a = attach();
        a.device = "GPU-1234".into();
        assert_eq!(
            check_attach(&a).unwrap_err().code,
            ErrorCode::UnsupportedDevice
        );
        let mut a = attach();
        a.spec.batch_size = 0;
        let r = check_attach(&a).unwrap_err();
        assert_eq!(r.code, ErrorCode::InvalidSpec);
        assert!(r.message.contains("batch_size"), "{}", r.message);
        check_attach(&attach()).unwrap();
    }

    #[test]
    fn an_unopenable_dataset_is_refused_and_leaves_no_job() {
        let registry = Arc::new(Registry::default());
        let mut a = attach();
        a.dataset = "/nonexistent/stoker/dataset".into();
        let r = registry
            .seat(&a, Path::new(&a.dataset), (&OpenPolicy::default(), 0))
            .err()
            .expect("refused");
        assert_eq!(r.code, ErrorCode::UnknownDataset);
        assert!(registry.jobs.lock().unwrap().is_empty());
    }

    #[test]
    fn a_created_socket_gets_the_configured_mode_and_group() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let _listener = stoker::sock::SeqPacketListener::bind(&path).unwrap();
        // SAFETY: getegid has no preconditions and cannot fail.
        let gid = unsafe { libc::getegid() };
        set_socket_permissions(&path, 0o640, Some(&gid.to_string())).unwrap();
        let meta = std::fs::metadata(&path).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o640);
        assert_eq!(meta.gid(), gid);
        let err = set_socket_permissions(&path, 0o660, Some("no-such-group-stoker")).unwrap_err();
        assert!(err.is_config(), "{err}");
        assert!(err.to_string().contains("no-such-group-stoker"), "{err}");
        assert_eq!(group_id("root"), Some(0));
    }

    #[test]
    fn config_errors_are_told_apart() {
        assert!(ServerError::Slots(1).is_config());
        assert!(!ServerError::InUse("/x".into()).is_config());
    }
}
