//! The worker's side: a TCP listener that does units of work for authenticated home daemons.
//!
//! # Design
//! - One thread per connection (a connection carries one unit at a time; a home daemon opens
//!   several). Before its handshake a connection is counted against `[worker]
//!   max_connections` and `max_connections_per_peer`; over either it is closed at once, with
//!   the reason logged.
//! - The handshake ([`super::auth::accept`]) must finish within [`HANDSHAKE_TIMEOUT`]; a peer
//!   that fails it is logged with its address and the reason, never with what it sent.
//! - A job the worker will not open, or a unit it will not do (an index past the dataset,
//!   too many samples, more than `max_unit_bytes` of pixels, an unknown job), is refused
//!   with the reason, told to the home daemon and logged; the connection stays.
//! - Anything that is not a message of the protocol closes the connection, logged.
//! - A home daemon that goes away (killed, partitioned) ends its connections' threads at
//!   their next read or write; each thread's jobs and buffers go with it.
//!
//! # Limitations
//! - A home daemon partitioned away without a FIN is noticed only by TCP keepalive (off)
//!   or the next write: its connection's thread waits in its read meanwhile.

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr, TcpListener, TcpStream};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::auth::{self, Secret};
use super::unit::{DatasetRules, WorkerJob};
use super::wire::{read_message, write_message, Message, WireError};
use crate::engine::EngineConfig;
use crate::service::metrics as m;
use crate::service::remote_config::WorkerConfig;
use crate::sync::lock;

/// How long a new connection has to prove it holds the secret.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(5);

/// Why the worker could not start.
#[derive(Debug, thiserror::Error)]
pub enum WorkerError {
    #[error("worker.listen {addr}: {source}")]
    Bind {
        addr: String,
        source: std::io::Error,
    },
    #[error("{0}")]
    Secret(#[from] super::auth::SecretError),
    #[error("worker: {0}")]
    Setup(String),
}

impl WorkerError {
    /// True when the configuration is at fault (the secret file, the rules); a port in use
    /// is not.
    pub fn is_config(&self) -> bool {
        !matches!(self, WorkerError::Bind { .. })
    }
}

/// What a worker needs besides `[worker]`: the datasets it may open and its engine settings.
pub struct WorkerSetup {
    pub rules: DatasetRules,
    pub engine: EngineConfig,
}

struct Shared {
    secret: Secret,
    setup: WorkerSetup,
    max_connections: usize,
    max_per_peer: usize,
    max_unit_bytes: u64,
    /// Connections open, by peer address.
    peers: Mutex<HashMap<IpAddr, usize>>,
}

/// Binds `[worker] listen` and serves home daemons on a thread of its own; returns the
/// address it listens on.
pub fn spawn(config: &WorkerConfig, setup: WorkerSetup) -> Result<SocketAddr, WorkerError> {
    let (Some(addr), Some(secret)) = (&config.listen, &config.secret_file) else {
        return Err(WorkerError::Setup(
            "worker.listen and worker.secret_file are both needed".into(),
        ));
    };
    let secret = Secret::load(secret)?;
    let bind = |source| WorkerError::Bind {
        addr: addr.clone(),
        source,
    };
    let listener = TcpListener::bind(addr.as_str()).map_err(bind)?;
    let local = listener.local_addr().map_err(bind)?;
    let shared = Arc::new(Shared {
        secret,
        setup,
        max_connections: config.max_connections,
        max_per_peer: config.max_connections_per_peer,
        max_unit_bytes: config.max_unit_bytes,
        peers: Mutex::default(),
    });
    std::thread::Builder::new()
        .name("stoker-worker-accept".into())
        .spawn(move || accept_loop(&listener, &shared))
        .map_err(|e| WorkerError::Setup(format!("cannot start the accept thread: {e}")))?;
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
        if let Err(reason) = shared.admit(peer.ip()) {
            tracing::warn!(%peer, reason, "worker connection refused");
            continue;
        }
        let shared = Arc::clone(shared);
        let spawned = std::thread::Builder::new()
            .name("stoker-worker-conn".into())
            .spawn(move || {
                serve_connection(stream, peer, &shared);
                shared.leave(peer.ip());
            });
        if let Err(e) = spawned {
            tracing::warn!(%peer, error = %e, "cannot start a connection thread");
        }
    }
}

impl Shared {
    /// Counts a new connection from `ip`, or says which cap refuses it.
    fn admit(&self, ip: IpAddr) -> Result<(), String> {
        let mut peers = lock(&self.peers);
        let total: usize = peers.values().sum();
        if total >= self.max_connections {
            return Err(format!(
                "{total} connections open: worker.max_connections is {}",
                self.max_connections
            ));
        }
        let mine = peers.entry(ip).or_insert(0);
        if *mine >= self.max_per_peer {
            return Err(format!(
                "{mine} connections from this address: worker.max_connections_per_peer is {}",
                self.max_per_peer
            ));
        }
        *mine += 1;
        Ok(())
    }

    fn leave(&self, ip: IpAddr) {
        let mut peers = lock(&self.peers);
        if let Some(n) = peers.get_mut(&ip) {
            *n -= 1;
            if *n == 0 {
                peers.remove(&ip);
            }
        }
    }
}

/// One home daemon's connection: the handshake, then jobs and units until it closes.
fn serve_connection(mut stream: TcpStream, peer: SocketAddr, shared: &Shared) {
    let _ = stream.set_nodelay(true);
    let deadline = Instant::now() + HANDSHAKE_TIMEOUT;
    if let Err(e) = auth::accept(&mut stream, &shared.secret, deadline) {
        tracing::warn!(%peer, reason = %e, "worker refused an unauthenticated peer");
        return;
    }
    tracing::info!(%peer, "home daemon connected");
    let mut jobs: HashMap<u32, WorkerJob> = HashMap::new();
    let mut units = 0u64;
    let end = loop {
        let message = match read_message(&mut stream, None) {
            Ok(m) => m,
            Err(WireError::Closed) => break None,
            Err(e) => break Some(e.to_string()),
        };
        let answered = match message {
            Message::Open(open) => {
                let answer = match WorkerJob::open(&open, &shared.setup.rules, &shared.setup.engine)
                {
                    Ok(job) => {
                        jobs.insert(open.job, job);
                        Message::Opened { job: open.job }
                    }
                    Err(reason) => {
                        tracing::warn!(%peer, dataset = %open.dataset, reason, "worker refused a job");
                        Message::Refused {
                            job: Some(open.job),
                            unit: None,
                            reason,
                        }
                    }
                };
                write_message(&mut stream, &answer, &[])
            }
            Message::Unit {
                id,
                job,
                epoch,
                indices,
            } => {
                units += 1;
                do_unit(
                    &mut stream,
                    peer,
                    shared,
                    jobs.get_mut(&job),
                    (id, epoch, &indices),
                )
            }
            other => break Some(format!("unexpected {}", kind(&other))),
        };
        if let Err(e) = answered {
            break Some(e.to_string());
        }
    };
    match end {
        None => tracing::info!(%peer, units, "home daemon disconnected"),
        Some(reason) => tracing::warn!(%peer, units, reason, "worker closed a connection"),
    }
}

/// Does one unit (or refuses it, with the reason) and sends the answer.
fn do_unit(
    stream: &mut TcpStream,
    peer: SocketAddr,
    shared: &Shared,
    job: Option<&mut WorkerJob>,
    (id, epoch, indices): (u64, u64, &[u64]),
) -> Result<(), WireError> {
    let refusal = match &job {
        None => Some("no such job on this connection".to_owned()),
        Some(j) => j.check(indices).err().or_else(|| {
            let bytes = j.unit_bytes(indices.len());
            (bytes > shared.max_unit_bytes).then(|| {
                format!(
                    "{bytes} bytes of pixels: over worker.max_unit_bytes {}",
                    shared.max_unit_bytes
                )
            })
        }),
    };
    let (Some(job), None) = (job, &refusal) else {
        let reason = refusal.unwrap_or_default();
        tracing::warn!(%peer, unit = id, reason, "worker refused a unit");
        metrics::counter!(m::WORKER_UNITS_TOTAL, "result" => "refused").increment(1);
        let refused = Message::Refused {
            job: None,
            unit: Some(id),
            reason,
        };
        return write_message(stream, &refused, &[]);
    };
    let (samples, pixels) = job.run(epoch, indices);
    metrics::counter!(m::WORKER_UNITS_TOTAL, "result" => "done").increment(1);
    let done = Message::Done {
        id,
        samples,
        bytes: pixels.len() as u64,
    };
    write_message(stream, &done, pixels)
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
