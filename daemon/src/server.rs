//! `stokerd`'s serving side: the Unix socket, the registry of jobs, one ring per rank, and the
//! forwarding of READY / RELEASE between a client and its rank's [`Feed`].
//!
//! # Design
//! - One SOCK_SEQPACKET listener; one thread per connection (ranks per host are few). Each
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
//! # Limitations
//! - The registry lock is held while the first rank of a job opens the dataset, so attaches
//!   wait on a slow first indexing. Datasets are named by path; registered names, allowed roots,
//!   peer credential checks and quotas come with the security work.
//! - The `cuda` backend is not served yet: any device other than `cpu` is refused.

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoker::memfd::{page_size, MemfdRing};
use stoker::protocol::{
    Attach, Attached, ErrorCode, Message, Ready as ReadyMsg, MAX_MESSAGE_BYTES,
};
use stoker::ring::RingLayout;
use stoker::sock::{SeqPacket, SeqPacketListener, SockError};
use stoker::spec::PipelineSpec;

use crate::dataset::{Dataset, OpenOptions};
use crate::pipeline::{
    Engine, EngineConfig, Feed, FeedEvent, Job, PipelineError, Position, SlotMemory,
};

/// How long a new connection may take to send its ATTACH.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How often a forwarder looks up from its feed to see whether the connection ended.
const FORWARD_POLL: Duration = Duration::from_millis(50);

/// What the server needs to run.
#[derive(Debug, Clone)]
pub struct ServerConfig {
    /// Where to listen (see [`stoker::default_socket_path`]).
    pub socket: PathBuf,
    /// Slots in each rank's ring.
    pub slots: usize,
    pub engine: EngineConfig,
}

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("a ring needs at least 2 slots, configured {0}")]
    Slots(usize),
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
}

impl ServerError {
    /// True for errors in the configuration itself (exit code 78, no restart).
    pub fn is_config(&self) -> bool {
        match self {
            ServerError::Slots(_) => true,
            ServerError::Bind { source, .. } => matches!(source, SockError::PathTooLong(_)),
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
}

impl JobTerms {
    fn of(a: &Attach) -> JobTerms {
        JobTerms {
            spec: a.spec.clone(),
            world_size: a.world_size,
            dataset: a.dataset.clone(),
            seed: a.seed,
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
        self.spec
            .first_difference(&other.spec)
            .map(|field| format!("spec field {field} differs from the job's"))
    }
}

struct JobEntry {
    terms: JobTerms,
    job: Arc<Job>,
    ranks: BTreeSet<u32>,
}

/// Job key → job. Shared by every connection.
#[derive(Default)]
struct Registry {
    jobs: Mutex<HashMap<String, JobEntry>>,
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

/// One rank's place in the registry; dropping it frees the rank (and the job, if it was the
/// last rank).
struct RankSeat {
    registry: Arc<Registry>,
    key: String,
    rank: u32,
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
    /// Checks an attach against the job it names, creating the job for its first rank, and
    /// takes the rank's seat. Returns the job, the seat, how many ranks are now attached,
    /// and whether this attach created the job.
    fn seat(self: &Arc<Self>, a: &Attach) -> Result<(Arc<Job>, RankSeat, u32, bool), Refusal> {
        let terms = JobTerms::of(a);
        let mut jobs = self.jobs.lock().unwrap_or_else(|e| e.into_inner());
        let created = !jobs.contains_key(&a.job);
        if let Some(entry) = jobs.get(&a.job) {
            if let Some(diff) = entry.terms.mismatch(&terms) {
                return Err(refuse(
                    ErrorCode::SpecMismatch,
                    format!("job {:?}, rank {}: {diff}", a.job, a.rank),
                ));
            }
            if entry.ranks.contains(&a.rank) {
                return Err(refuse(
                    ErrorCode::RankTaken,
                    format!("job {:?}: rank {} is attached already", a.job, a.rank),
                ));
            }
        } else {
            let dataset = Dataset::open(Path::new(&a.dataset), &OpenOptions::default())
                .map_err(|e| refuse(ErrorCode::UnknownDataset, e.to_string()))?;
            let job =
                Job::new(Arc::new(dataset), a.spec.clone(), a.seed, a.world_size).map_err(|e| {
                    match e {
                        PipelineError::Spec(e) => refuse(ErrorCode::InvalidSpec, e.to_string()),
                        PipelineError::Sampler(e) => refuse(ErrorCode::InvalidSpec, e),
                        e => refuse(ErrorCode::Internal, e.to_string()),
                    }
                })?;
            tracing::info!(
                job = %a.job,
                dataset = %a.dataset,
                samples = job.dataset.len(),
                world_size = a.world_size,
                steps_per_epoch = job.steps_per_epoch(),
                "job created"
            );
            jobs.insert(
                a.job.clone(),
                JobEntry {
                    terms,
                    job,
                    ranks: BTreeSet::new(),
                },
            );
        }
        let entry = jobs.get_mut(&a.job).expect("inserted or present above");
        entry.ranks.insert(a.rank);
        let seat = RankSeat {
            registry: Arc::clone(self),
            key: a.job.clone(),
            rank: a.rank,
        };
        Ok((
            Arc::clone(&entry.job),
            seat,
            entry.ranks.len() as u32,
            created,
        ))
    }
}

/// The daemon: a listening socket, the engine, the job registry.
pub struct Server {
    listener: SeqPacketListener,
    socket: PathBuf,
    slots: usize,
    engine: Arc<Engine>,
    registry: Arc<Registry>,
}

impl Server {
    /// Checks the config, starts the engine, and listens at `config.socket` (creating its
    /// directory, and replacing a stale socket no daemon answers on).
    pub fn bind(config: ServerConfig) -> Result<Server, ServerError> {
        if config.slots < 2 {
            return Err(ServerError::Slots(config.slots));
        }
        let socket = config.socket;
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
        let engine = Engine::new(config.engine)?;
        Ok(Server {
            listener,
            socket,
            slots: config.slots,
            engine,
            registry: Arc::default(),
        })
    }

    pub fn socket_path(&self) -> &Path {
        &self.socket
    }

    /// Accepts clients until accepting fails.
    pub fn serve(&self) -> Result<(), ServerError> {
        tracing::info!(
            socket = %self.socket.display(),
            slots = self.slots,
            threads = self.engine.threads(),
            "stokerd serving"
        );
        let mut next_id: u64 = 0;
        loop {
            let conn = match self.listener.accept() {
                Ok(c) => c,
                Err(e) if is_transient_accept(&e) => {
                    tracing::warn!(error = %e, "accept failed; going on");
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
                Err(e) => return Err(ServerError::Accept(e)),
            };
            next_id += 1;
            let id = next_id;
            let ctx = Connection {
                id,
                engine: Arc::clone(&self.engine),
                registry: Arc::clone(&self.registry),
                slots: self.slots,
            };
            let spawned = std::thread::Builder::new()
                .name(format!("stoker-conn-{id}"))
                .spawn(move || ctx.run(conn));
            if let Err(e) = spawned {
                tracing::error!(conn = id, error = %e, "cannot start a connection thread");
            }
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.socket);
    }
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
    engine: Arc<Engine>,
    registry: Arc<Registry>,
    slots: usize,
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
        match sock.peer_cred() {
            Ok(c) => tracing::debug!(conn = id, pid = c.pid, uid = c.uid, "client connected"),
            Err(e) => tracing::debug!(conn = id, error = %e, "client connected (no credentials)"),
        }
        let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
        let attach = match self.read_attach(&sock, &mut buf) {
            Ok(a) => a,
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
        let (feed, _seat) = match self.start(&sock, &attach) {
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
        let feed = Arc::new(feed);
        let stop = Arc::new(AtomicBool::new(false));
        let forwarder = match sock.try_clone() {
            Ok(out) => {
                let (feed, stop) = (Arc::clone(&feed), Arc::clone(&stop));
                std::thread::Builder::new()
                    .name(format!("stoker-fwd-{id}"))
                    .spawn(move || forward(id, &feed, &out, &stop))
                    .map_err(|e| e.to_string())
            }
            Err(e) => Err(e.to_string()),
        };
        let end = match &forwarder {
            Ok(_) => serve_releases(&sock, &feed, &mut buf),
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
        // seat (`_seat`) is freed after it, at the end of this function.
        drop(feed);
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

    fn read_attach(&self, sock: &SeqPacket, buf: &mut [u8]) -> Result<Box<Attach>, Refusal> {
        let _ = sock.set_read_timeout(Some(ATTACH_TIMEOUT));
        let got = sock.recv(buf);
        let _ = sock.set_read_timeout(None);
        let r = match got {
            Ok(Some(r)) => r,
            Ok(None) => return Err(refuse(ErrorCode::BadMessage, "closed before ATTACH")),
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
            Ok(Message::Attach(a)) => Ok(a),
            Ok(other) => Err(refuse(
                ErrorCode::BadMessage,
                format!("expected ATTACH, got {:?}", other.kind()),
            )),
            Err(e) => Err(refuse(e.code(), e.to_string())),
        }
    }

    /// Validates the attach, seats the rank, makes its ring, starts its feed and answers
    /// ATTACHED with the ring's fd.
    fn start(&self, sock: &SeqPacket, a: &Attach) -> Result<(Feed, RankSeat), Refusal> {
        check_attach(a)?;
        let (job, seat, ranks_attached, created_job) = self.registry.seat(a)?;
        let steps = job.steps_per_epoch();
        if steps > 0 && a.start.step >= steps {
            return Err(refuse(
                ErrorCode::InvalidSpec,
                format!(
                    "start step {} is beyond the {steps} steps of an epoch",
                    a.start.step
                ),
            ));
        }
        let layout = RingLayout::new(&a.spec, self.slots, page_size());
        let name = CString::new(format!("stoker-ring-rank{}", a.rank)).expect("no NUL");
        let ring = MemfdRing::create(&name, layout)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot create the ring: {e}")))?;
        let answer = Attached {
            slots: layout.slots as u32,
            slot_bytes: layout.slot.slot_bytes as u64,
            ring_bytes: layout.ring_bytes as u64,
            steps_per_epoch: steps,
            dataset_len: job.dataset.len() as u64,
            classes: job.dataset.classes().len() as u64,
            ranks_attached,
            created_job,
            daemon_version: env!("CARGO_PKG_VERSION").to_owned(),
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
            .engine
            .start_feed(job, a.rank, ring, start)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot start the feed: {e}")))?;
        Ok((feed, seat))
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

/// Reads RELEASE messages until the client detaches, hangs up, or breaks the protocol.
fn serve_releases(sock: &SeqPacket, feed: &Feed, buf: &mut [u8]) -> End {
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
            }
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

/// Sends the feed's READY and END_OF_DATA events to the client until `stop` is set, the
/// data ends, or the client is gone.
fn forward(id: u64, feed: &Feed, sock: &SeqPacket, stop: &AtomicBool) {
    let mut bytes = Vec::with_capacity(64);
    while !stop.load(Ordering::Acquire) {
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
        if last {
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
        let r = registry.seat(&a).err().expect("refused");
        assert_eq!(r.code, ErrorCode::UnknownDataset);
        assert!(registry.jobs.lock().unwrap().is_empty());
    }

    #[test]
    fn config_errors_are_told_apart() {
        assert!(ServerError::Slots(1).is_config());
        assert!(!ServerError::InUse("/x".into()).is_config());
    }
}
