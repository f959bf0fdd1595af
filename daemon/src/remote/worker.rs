//! The worker's side: a TCP listener that does units of work for authenticated home daemons.
//!
//! # Design
//! - One thread per connection (a connection carries one unit at a time; a home daemon opens
//!   several). Who may hold a connection, and how much memory, is [`super::gate`]'s: a
//!   connection still in its handshake holds no slot, and the oldest of those gives way to
//!   a new one; an authenticated one counts against `[worker] max_connections` and
//!   `max_connections_per_peer`, its pixel buffers against `max_bytes_per_peer`.
//! - The handshake ([`super::auth::accept`]) must finish within [`HANDSHAKE_TIMEOUT`]; a peer
//!   that fails it is logged with its address and the reason, never with what it sent, at
//!   most one line a second per kind of refusal, each saying how many more were refused
//!   since the last (a connect-and-drop flood writes a line a second, not a line each); the
//!   `stoker_worker_refusals_total` counter counts every one.
//! - A job the worker will not open, or a unit it will not do (an index past the dataset,
//!   too many samples, more than `max_unit_bytes` of pixels or than its peer's memory may
//!   grow by, an unknown job), is refused with the reason, told to the home daemon and
//!   logged; the connection stays. A connection keeps at most [`MAX_JOBS_PER_CONNECTION`]
//!   jobs: opening one more lets the least recently used go (its buffer freed), and the
//!   answer names it, so the home daemon opens it again when it needs it.
//! - Anything that is not a message of the protocol, or whose MAC is wrong
//!   ([`super::seal`]), closes the connection, logged once.
//! - A home daemon that goes away ends its connections' threads, each with its jobs and
//!   buffers: closed or reset at the next read or write; silent (partitioned, stopped) after
//!   `[worker] idle_timeout_ms` without a message, or once TCP keepalive or a write finds it
//!   gone ([`super::wire::tune`]).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::{self, Secret};
use super::board::frame_bytes;
use super::gate::{Gate, GateLimits};
use super::seal::Session;
use super::tally::{self, HomeSeat};
use super::tls::{Link, WorkerTls};
use super::unit::{DatasetRules, WorkerJob};
use super::wire::{tune, Message, OpenJob, WireError};
use crate::remote::config::WorkerConfig;
use stoker_pipeline::engine::EngineConfig;
use stoker_pipeline::metrics as m;
use stoker_pipeline::ratelimit::{Admit, RateLimit};
use stoker_pipeline::sync::lock;

/// How long a new connection has to prove it holds the secret.
pub(crate) const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(2);
/// Most jobs one connection keeps open.
pub(crate) const MAX_JOBS_PER_CONNECTION: usize = 8;

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    /// `worker.listen` cannot be bound (a port in use, an address not this host's).
    #[error("worker.listen {addr}: {source}")]
    Bind {
        /// `worker.listen` as configured.
        addr: String,
        /// What bind reported.
        source: std::io::Error,
    },
    /// `worker.secret_file` cannot be used.
    #[error("{0}")]
    Secret(#[from] super::auth::SecretError),
    /// A `worker.tls_*` file cannot be used.
    #[error("{0}")]
    Tls(#[from] super::tls::TlsError),
    /// `[worker]` has no `listen` address.
    #[error("worker: worker.listen is needed")]
    NoListen,
    /// A `[worker]` value out of range, as the section's check words it.
    #[error("worker: {0}")]
    Setup(String),
    /// A group of the worker's access rules is no group of this system.
    #[error("worker: {0}")]
    Rules(#[from] crate::serve::access::UnknownGroup),
    /// The accept thread could not be spawned.
    #[error("worker: cannot start the accept thread: {0}")]
    Thread(#[source] std::io::Error),
}

impl WorkerError {
    /// True when the configuration is at fault (the secret file, the rules); a port in use
    /// is not.
    pub fn is_config(&self) -> bool {
        !matches!(self, WorkerError::Bind { .. })
    }
}

/// What a worker needs besides `[worker]`: the datasets it may open and its engine settings.
pub(crate) struct WorkerSetup {
    pub rules: DatasetRules,
    pub engine: EngineConfig,
}

/// Refusals before a peer authenticated, logged at most once a second per kind: a flood of
/// connections that drop or fail the handshake writes a line a second with the count of the
/// ones not logged since, not a line each.
#[derive(Default)]
struct RefusalLog {
    kinds: Mutex<HashMap<&'static str, RateLimit>>,
}

impl RefusalLog {
    /// Whether a refusal of `kind` may be logged now, and how many were not since the last
    /// line of that kind (`None`: count it, write nothing).
    fn admit(&self, kind: &'static str) -> Option<u64> {
        let mut kinds = lock(&self.kinds);
        let limit = kinds.entry(kind).or_insert_with(|| RateLimit::new(1));
        match limit.admit(Instant::now()) {
            Admit::Log { suppressed } => Some(suppressed),
            Admit::Suppress => None,
        }
    }
}

struct Shared {
    secret: Option<Secret>,
    refusals: RefusalLog,
    tls: Option<WorkerTls>,
    setup: WorkerSetup,
    max_unit_bytes: u64,
    idle: Duration,
    gate: Gate,
}

/// Binds `[worker] listen` and serves home daemons on a thread of its own; returns the
/// address it listens on.
pub(crate) fn spawn(config: &WorkerConfig, setup: WorkerSetup) -> Result<SocketAddr, WorkerError> {
    let Some(addr) = &config.listen else {
        return Err(WorkerError::NoListen);
    };
    if let Some(reason) = config.problem() {
        return Err(WorkerError::Setup(reason));
    }
    let secret = config
        .secret_file
        .as_deref()
        .map(Secret::load)
        .transpose()?;
    let tls = match (&config.tls_cert, &config.tls_key) {
        (Some(cert), Some(key)) => {
            Some(WorkerTls::load(cert, key, config.tls_client_ca.as_deref())?)
        }
        _ => None,
    };
    let bind = |source| WorkerError::Bind {
        addr: addr.clone(),
        source,
    };
    let listener = TcpListener::bind(addr.as_str()).map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let shared = Arc::new(Shared {
        secret,
        refusals: RefusalLog::default(),
        tls,
        setup,
        max_unit_bytes: config.max_unit_bytes,
        idle: Duration::from_millis(config.idle_timeout_ms),
        gate: Gate::new(GateLimits {
            max_connections: config.max_connections,
            max_per_peer: config.max_connections_per_peer,
            max_bytes_per_peer: config.max_bytes_per_peer,
        }),
    });
    std::thread::Builder::new()
        .name("stoker-worker-accept".into())
        .spawn(move || accept_loop(&listener, &shared))
        .map_err(WorkerError::Thread)?;
    tracing::info!(addr = %local, "remote worker listening");
    Ok(local)
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    for stream in listener.incoming() {
        let stream = match stream {
            Ok(s) => s,
            Err(e) => {
                tracing::warn!(error = %e, "worker accept failed");
                std::thread::sleep(Duration::from_millis(100));
                continue;
            }
        };
        let Ok(peer) = stream.peer_addr() else {
            continue;
        };
        let ticket = shared.gate.pending(peer.ip(), &stream);
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("stoker-worker-conn".into())
            .spawn(move || serve_connection(stream, peer, ticket, &shared));
        if let Err(e) = spawned {
            tracing::warn!(%peer, error = %e, "cannot start a connection thread");
        }
    }
}

/// One home daemon's connection: the handshake, then jobs and units until it closes.
fn serve_connection(stream: TcpStream, peer: SocketAddr, ticket: Option<u64>, shared: &Shared) {
    let passed = handshake(stream, peer, shared);
    shared.gate.handshake_over(ticket);
    let Some((mut link, session)) = passed else {
        return;
    };
    tracing::info!(%peer, "home daemon connected");
    let seat = HomeSeat::new(peer.ip());
    let mut conn = Connection {
        peer,
        shared,
        session,
        jobs: Vec::new(),
        uses: 0,
        units: 0,
    };
    let end = conn.serve(&mut link);
    let (units, held) = (conn.units, conn.held_bytes());
    drop(conn);
    shared.gate.leave(peer.ip(), held);
    drop(seat);
    match end {
        None => tracing::info!(%peer, units, "home daemon disconnected"),
        Some(reason) => tracing::warn!(%peer, units, reason, "worker closed a connection"),
    }
}

/// TLS if configured, then the secret's proof (or the version alone under mutual TLS) and
/// the gate's caps, within [`HANDSHAKE_TIMEOUT`]; the link and its session, or `None` once
/// logged why not.
fn handshake(stream: TcpStream, peer: SocketAddr, shared: &Shared) -> Option<(Link, Session)> {
    if let Err(e) = tune(&stream) {
        if let Some(more) = shared.refusals.admit("tcp") {
            tracing::warn!(%peer, error = %e, more_refused = more,
                "cannot set the connection's TCP options ({more} more refused since the last such line)");
        }
    }
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    let mut link = match &shared.tls {
        None => Link::Plain(stream),
        Some(tls) => match tls.accept(stream, deadline) {
            Ok(link) => link,
            Err(e) => {
                // As text, so the log line reads as it always has (a quoted string).
                let reason = e.to_string();
                tally::refused("handshake");
                if let Some(more) = shared.refusals.admit("tls") {
                    tracing::warn!(%peer, reason, more_refused = more,
                        "worker refused a peer's TLS handshake ({more} more refused since the last such line)");
                }
                return None;
            }
        },
    };
    let admit = || shared.gate.admit(peer.ip());
    match auth::accept(&mut link, shared.secret.as_ref(), deadline, admit) {
        Ok(session) => Some((link, session)),
        Err(auth::AuthError::Refused(reason)) => {
            tally::refused("connections");
            if let Some(more) = shared.refusals.admit("caps") {
                tracing::warn!(%peer, reason, more_refused = more,
                    "worker connection refused ({more} more refused since the last such line)");
            }
            None
        }
        Err(e) => {
            tally::refused("handshake");
            if let Some(more) = shared.refusals.admit("auth") {
                tracing::warn!(%peer, reason = %e, more_refused = more,
                    "worker refused an unauthenticated peer ({more} more refused since the last such line)");
            }
            None
        }
    }
}

/// One authenticated connection's state: its jobs (by the home's id, with when each was
/// last used) and how many units it did.
struct Connection<'a> {
    peer: SocketAddr,
    shared: &'a Shared,
    /// MACs what is sent and checks what is read ([`super::seal`]).
    session: Session,
    jobs: Vec<(u32, WorkerJob, u64)>,
    uses: u64,
    units: u64,
}

impl Connection<'_> {
    /// Answers messages until the connection ends; why, unless the home closed it.
    fn serve(&mut self, stream: &mut Link) -> Option<String> {
        let idle = self.shared.idle;
        loop {
            let message = match self.session.read(stream, Some(Instant::now() + idle)) {
                Ok(m) => {
                    tally::received(frame_bytes(&m));
                    m
                }
                Err(WireError::Closed) => return None,
                Err(WireError::Timeout) => {
                    return Some(format!(
                        "idle for {} ms (worker.idle_timeout_ms): the home daemon is gone \
                         or partitioned",
                        idle.as_millis()
                    ))
                }
                Err(e) => return Some(e.to_string()),
            };
            let answered = match message {
                Message::Open(open) => {
                    let answer = self.open(&open);
                    self.session.write(stream, &answer, &[])
                }
                Message::Unit {
                    id,
                    job,
                    epoch,
                    indices,
                } => {
                    self.units += 1;
                    self.unit(stream, job, (id, epoch, &indices))
                }
                other => return Some(format!("unexpected {}", kind(&other))),
            };
            if let Err(e) = answered {
                return Some(e.to_string());
            }
        }
    }

    /// Opens a job (letting the least recently used go if need be), or says why not.
    fn open(&mut self, open: &OpenJob) -> Message {
        let shared = self.shared;
        let job = match WorkerJob::open(open, &shared.setup.rules, &shared.setup.engine) {
            Ok(job) => job,
            Err(e) => {
                // As text: the home is sent it, and the log line reads as it always has.
                let reason = e.to_string();
                tally::refused("job");
                tracing::warn!(peer = %self.peer, dataset = %open.dataset, reason,
                    "worker refused a job");
                return Message::Refused {
                    job: Some(open.job),
                    unit: None,
                    reason,
                };
            }
        };
        // Its dataset's index counts against the peer's memory, as pixels do.
        if let Err(e) = shared.gate.reserve(self.peer.ip(), job.index_bytes()) {
            let reason = format!("the dataset's index ({} bytes): {e}", job.index_bytes());
            tally::refused("memory");
            tracing::warn!(peer = %self.peer, dataset = %open.dataset, reason,
                "worker refused a job");
            return Message::Refused {
                job: Some(open.job),
                unit: None,
                reason,
            };
        }
        let mut closed = Vec::new();
        if let Some(at) = self.jobs.iter().position(|(id, _, _)| *id == open.job) {
            self.drop_job(at);
        } else if self.jobs.len() >= MAX_JOBS_PER_CONNECTION {
            let lru = (0..self.jobs.len()).min_by_key(|&i| self.jobs[i].2);
            if let Some(at) = lru {
                closed.push(self.jobs[at].0);
                self.drop_job(at);
            }
            tracing::info!(peer = %self.peer, closed = ?closed,
                "worker let a job go: {MAX_JOBS_PER_CONNECTION} jobs open on this connection");
        }
        self.uses += 1;
        self.jobs.push((open.job, job, self.uses));
        Message::Opened {
            job: open.job,
            closed,
        }
    }

    fn drop_job(&mut self, at: usize) {
        let (_, job, _) = self.jobs.swap_remove(at);
        self.shared.gate.release(self.peer.ip(), job.held_bytes());
    }

    fn held_bytes(&self) -> u64 {
        self.jobs.iter().map(|(_, j, _)| j.held_bytes()).sum()
    }

    /// Does one unit of job `job` (or refuses it, with the reason) and sends the answer.
    fn unit(
        &mut self,
        stream: &mut Link,
        job: u32,
        (id, epoch, indices): (u64, u64, &[u64]),
    ) -> Result<(), WireError> {
        let (peer, shared) = (self.peer, self.shared);
        let at = self.jobs.iter().position(|(j, _, _)| *j == job);
        let refusal = match at {
            None => Err(("unit", "no such job on this connection".to_owned())),
            Some(at) => self.room_for(at, indices),
        };
        let (Some(at), Ok(())) = (at, &refusal) else {
            let (code, reason) = refusal.err().unwrap_or_default();
            tally::refused(code);
            tracing::warn!(%peer, unit = id, reason, "worker refused a unit");
            metrics::counter!(m::WORKER_UNITS_TOTAL, "result" => "refused").increment(1);
            let refused = Message::Refused {
                job: None,
                unit: Some(id),
                reason,
            };
            return self.session.write(stream, &refused, &[]);
        };
        self.uses += 1;
        let (_, job, used) = &mut self.jobs[at];
        let session = &mut self.session;
        *used = self.uses;
        let before = job.buffer_bytes();
        let (samples, pixels) = tally::work(|| job.run(epoch, indices));
        let bytes = pixels.len() as u64;
        metrics::counter!(m::WORKER_UNITS_TOTAL, "result" => "done").increment(1);
        let done = Message::Done { id, samples, bytes };
        let wire = frame_bytes(&done) + bytes;
        let sent = tally::send(wire, indices.len() as u64, || {
            session.write(stream, &done, pixels)
        });
        // The buffer grew by what was reserved (exactly, see `WorkerJob::run`); should the
        // allocator have given more, the gate is told.
        let grown = job.buffer_bytes().saturating_sub(before.max(bytes));
        if grown > 0 {
            let _ = shared.gate.reserve(peer.ip(), grown);
        }
        sent
    }

    /// Why the unit of `indices` of the job at `at` may not be done, if so (with its
    /// [`stoker_pipeline::metrics::WORKER_REFUSALS`] code); reserves the pixel memory its buffer must grow by.
    fn room_for(&self, at: usize, indices: &[u64]) -> Result<(), (&'static str, String)> {
        let job = &self.jobs[at].1;
        job.check(indices).map_err(|e| ("unit", e.to_string()))?;
        let bytes = job.unit_bytes(indices.len());
        let max = self.shared.max_unit_bytes;
        if bytes > max {
            return Err((
                "unit_bytes",
                format!("{bytes} bytes of pixels: over worker.max_unit_bytes {max}"),
            ));
        }
        let grow = bytes.saturating_sub(job.buffer_bytes());
        self.shared
            .gate
            .reserve(self.peer.ip(), grow)
            .map_err(|e| ("memory", e.to_string()))
    }
}

/// A message's kind, for logs (never its content).
fn kind(message: &Message) -> &'static str {
    match message {
        Message::Challenge { .. } => "challenge",
        Message::Hello { .. } => "hello",
        Message::Welcome { .. } => "welcome",
        Message::Open(_) => "open",
        Message::Opened { .. } => "opened",
        Message::Unit { .. } => "unit",
        Message::Done { .. } => "done",
        Message::Refused { .. } => "refused",
    }
}
