//! `stokerd`'s serving room: the Unix socket, the registry of jobs, one ring per rank, and the
//! forwarding of READY / RELEASE between a client and its rank's [`stoker_pipeline::engine::Feed`].
//!
//! Files: `config` (the server's sections of the config), `listen` (the socket, its mode
//! and group, the accept loop, a socket systemd passed), `connection` (one
//! client's state machine), `gpus` (the engine per backend and GPU, and the rings each
//! makes), `registry` (jobs, the terms ranks agree on, seats), `ops` (the
//! [`ServerHandle`] operations hold: stop, drain, status, metrics), `refusal`, `wake`,
//! `lobby` (connections waiting for their first message), `stall` (the stall watch), `access`
//! (who may attach and which datasets they may name; inside it, one attach's admission and
//! the dataset opened with it, and the quotas of ring memory and attachments),
//! `key` (a job's key).
//!
//! # Design
//! - One SOCK_SEQPACKET listener. A new connection waits in the accept loop's
//!   [`Lobby`](crate::serve::lobby) (no thread, per-uid caps, a deadline) until its first message
//!   arrives; then it gets its thread (ranks per host are few). Each
//!   connection also runs a forwarder thread that turns feed events into READY / END_OF_DATA
//!   messages, while the connection thread reads RELEASE / DETACH from the socket.
//! - The registry maps a job key to its job and the terms every rank must agree on (spec,
//!   world_size, dataset, seed). The first rank creates the job; a later rank whose terms differ
//!   is refused with the field that differs; a rank attached twice is refused. The job is
//!   dropped when its last rank leaves, so a key can later name a new job.
//! - Each rank gets its own sealed memfd ring, sent with SCM_RIGHTS in ATTACHED, mapped once;
//!   a rank on a GPU gets its images in a VMM allocation on it, exported as a second fd.
//! - A connection ends on DETACH, end of file (the client exited or was killed), a malformed
//!   message, or a protocol violation. Then the feed stops (its Drop waits until no worker
//!   writes the ring), every slot the client held is reclaimed, and the rank is free to attach
//!   again with a start (epoch, step). Other ranks and jobs go on.
//! - Nothing polls: SIGTERM's [`ServerHandle::stop`] signals an eventfd the accept loop waits
//!   on and wakes every forwarder through its feed, which then sends ERROR(STOPPING) "daemon
//!   stopping" and shuts its socket, so connection threads end, feeds stop and rings are
//!   unmapped. Datasets registered by name come from the config and are replaced on reload
//!   ([`ServerHandle::set_access`]); jobs already running keep the path they opened. A STATUS
//!   message instead of ATTACH gets a [`stoker_wire::protocol::DaemonStatus`] and the connection
//!   closes.
//! - Access: every connection's peer credentials, the dataset it names, and the ring it asks
//!   for are checked by [`crate::serve::access`] before anything is opened or allocated; a refusal
//!   says which rule refused it.
//!
//! # Limitations
//! - The first rank of a job indexes its dataset outside the registry lock (status and other
//!   attaches go on); two first ranks of one job arriving together both index, and the later
//!   one joins the job the earlier one made.
//! - A rank naming a GPU is served only when the daemon serves from CUDA (`gpus.rs`).
//! - The accept loop still wakes every [`HEARTBEAT_INTERVAL`] when idle: that is the
//!   watchdog's proof of life ([`ServerHandle::is_alive`]), not a poll for state.

pub(crate) mod access;
pub(crate) mod config;
mod connection;
mod gpus;
mod key;
mod listen;
pub(crate) mod lobby;
mod ops;
mod refusal;
mod registry;
pub(crate) mod stall;
mod wake;

pub(crate) use listen::{check_seqpacket_listener, ListenerError, Server};
pub(crate) use ops::{ServerHandle, WorkerFigures};

use std::path::PathBuf;
use std::time::Duration;

use stoker_wire::socket::SockError;

use stoker_pipeline::engine::PipelineError;

/// How long a new connection may take to send its ATTACH.
pub(crate) const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a refused peer's first message is waited for before the refusal is sent.
const REFUSED_PEER_DRAIN: Duration = Duration::from_secs(1);
/// How often the accept loop beats the heart the watchdog checks ([`ServerHandle::is_alive`])
/// when no client connects; a stop wakes it at once.
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(200);
/// What attached clients are told when the daemon drains.
pub(crate) const STOPPING_MESSAGE: &str = "daemon stopping";

/// Why the server could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error("socket {path}: group {group:?} does not exist (server.socket_group)")]
    SocketGroup { path: PathBuf, group: String },
    #[error(
        "socket {path}: server.socket_group {group:?} (gid {gid}): the daemon's user (uid {uid}) \
         is not a member of it, and only root may give the socket a group its owner is not in; \
         add the daemon's user to the group (usermod -aG {group} <user>, or \
         SupplementaryGroups={group} in its unit), or leave socket_group unset"
    )]
    SocketGroupNotMember {
        path: PathBuf,
        group: String,
        gid: u32,
        uid: u32,
    },
    #[error("socket {path}: cannot set mode {mode:#o} / group: {source}")]
    SocketPermissions {
        path: PathBuf,
        mode: u32,
        source: std::io::Error,
    },
    #[error("cannot use the socket directory {}: {source}", path.display())]
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
    #[error("{0}")]
    Access(access::UnknownGroup),
    #[error("cannot start the pipeline engine: {0}")]
    Engine(#[from] PipelineError),
    #[error("accept failed: {0}")]
    Accept(SockError),
    #[error("the activated socket: {0}")]
    Activated(ListenerError),
    #[error("cannot create the eventfd that wakes the accept loop: {0}")]
    Wake(std::io::Error),
}

impl ServerError {
    /// True for errors in the configuration itself (exit code 78, no restart).
    pub fn is_config(&self) -> bool {
        match self {
            ServerError::Bind { source, .. } => matches!(source, SockError::PathTooLong(_)),
            ServerError::Activated(_) => true,
            ServerError::SocketGroup { .. }
            | ServerError::SocketGroupNotMember { .. }
            | ServerError::Access(_) => true,
            _ => false,
        }
    }
}

#[cfg(test)]
mod tests;
