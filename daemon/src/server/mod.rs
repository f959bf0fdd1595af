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
//! - The registry lock is held while the first rank of a job opens the dataset, so attaches
//!   wait on a slow first indexing.
//! - The `cuda` backend is not served yet: any device other than `cpu` is refused.

mod connection;
mod listen;
mod ops;
mod refusal;
mod registry;
mod wake;

use connection::*;
pub use listen::Server;
pub use ops::ServerHandle;
use ops::*;
use refusal::*;
use registry::*;
use wake::EventFd;

use std::collections::{BTreeSet, HashMap};
use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, RwLock};
use std::time::{Duration, Instant};

use stoker::memfd::{page_size, MemfdRing};
use stoker::protocol::{
    Attach, Attached, DaemonStatus, EncodeError, ErrorCode, JobStatus, Message, Ready as ReadyMsg,
    MAX_MESSAGE_BYTES,
};
use stoker::ring::RingLayout;
use stoker::sock::{SeqPacket, SeqPacketListener, SockError};
use stoker::spec::PipelineSpec;

use crate::access::{AccessError, AccessPolicy, Peer, QuotaGrant, QuotaLimits, Quotas};
use crate::dataset::{Dataset, OpenOptions};
use crate::engine::{
    Engine, EngineConfig, Feed, FeedEvent, FeedWaker, Job, PipelineError, Position, SlotImages,
    SlotMemory,
};
use crate::metrics as m;

/// How long a new connection may take to send its ATTACH.
pub const ATTACH_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a refused peer's first message is waited for before the refusal is sent.
const REFUSED_PEER_DRAIN: Duration = Duration::from_secs(1);
/// How often the accept loop beats the heart the watchdog checks ([`ServerHandle::is_alive`])
/// when no client connects; a stop wakes it at once.
const HEARTBEAT_INTERVAL: Duration = Duration::from_millis(200);
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
    #[error("cannot create the eventfd that wakes the accept loop: {0}")]
    Wake(std::io::Error),
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

#[cfg(test)]
mod tests {
    use super::listen::{group_id, set_socket_permissions};
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
            .seat(&a, Path::new(&a.dataset))
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
