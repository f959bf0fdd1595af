//! The server's sections of stokerd's config (`[server]`, `[limits]`, `[access]`) with their
//! defaults, each written once, and [`ServeConfig`]: everything the server is started with.
//! The config file (`crate::service::config`) assembles these with the other rooms' sections.

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

use stoker_pipeline::engine::{EngineConfig, DEFAULT_SLOTS_PER_RANK};
use stoker_pipeline::source::index::WalkLimits;
use stoker_pipeline::source::object::S3Config;
use stoker_pipeline::transform::decode::{Limits, DEFAULT_MAX_FILE_BYTES, DEFAULT_MAX_PIXELS};

/// Socket file mode: owner and group may connect.
pub(crate) const DEFAULT_SOCKET_MODE: u32 = 0o660;
/// Ring memory one client may hold, all its rings together (bytes).
pub(crate) const DEFAULT_MAX_CLIENT_RING_BYTES: u64 = 8 << 30;
/// Ring memory one job may hold, all its ranks together (bytes).
pub(crate) const DEFAULT_MAX_JOB_RING_BYTES: u64 = 64 << 30;
/// Most clients attached at once.
pub(crate) const DEFAULT_MAX_CLIENTS: usize = 256;
/// Most jobs at once.
pub(crate) const DEFAULT_MAX_JOBS: usize = 64;
/// Waiting connections one uid may hold, by default.
pub(crate) const DEFAULT_MAX_WAITING_PER_UID: usize = 32;
/// Waiting connections in all, by default (also capped at half the fd limit).
pub(crate) const DEFAULT_MAX_WAITING: usize = 1024;
/// Bytes of JPEG entry points one uid may keep, by default.
pub(crate) const DEFAULT_ENTRY_BYTES_PER_UID: u64 =
    stoker_pipeline::transform::decode::DEFAULT_ENTRY_BYTES_PER_SCOPE as u64;
/// Milliseconds a new connection may take to send its first message, by default.
pub(crate) const DEFAULT_ATTACH_DEADLINE_MS: u64 = 5000;

/// What the server is started with (stokerd's config, validated, with the command line's
/// overrides applied).
#[derive(Debug, Clone)]
pub(crate) struct ServeConfig {
    /// Where to listen.
    pub socket: PathBuf,
    pub server: ServerConfig,
    pub limits: LimitsConfig,
    pub access: AccessConfig,
    /// Registered datasets: name -> path.
    pub datasets: BTreeMap<String, PathBuf>,
    /// Object storage (`s3://` datasets) and the node cache.
    pub s3: S3Config,
    /// The engine's share of `[pipeline]` and `[limits]`.
    pub engine: EngineConfig,
}

/// `[server]`: the socket clients connect to and the rings they get.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ServerConfig {
    /// Socket path; empty means the default for the user (see `stoker_wire::default_socket_path`).
    pub socket: Option<PathBuf>,
    /// Socket file mode (octal in TOML: `socket_mode = 0o660`).
    pub socket_mode: u32,
    /// Group that owns the socket (clients in it may connect).
    pub socket_group: Option<String>,
    /// Slots in each rank's ring.
    pub slots_per_rank: usize,
    /// Exit after this many seconds with no connection at all; 0 (the default): never. The
    /// per-user daemon `stoker.Loader` starts uses it (`--idle-exit`).
    pub idle_exit_s: u64,
}

impl Default for ServerConfig {
    fn default() -> Self {
        ServerConfig {
            socket: None,
            socket_mode: DEFAULT_SOCKET_MODE,
            socket_group: None,
            slots_per_rank: DEFAULT_SLOTS_PER_RANK,
            idle_exit_s: 0,
        }
    }
}

/// `[limits]`: what one image, one client, one user and one job may cost the daemon.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LimitsConfig {
    /// The largest image decoded, in pixels (width × height); a larger one is a bad sample.
    pub max_pixels: u64,
    /// The largest encoded sample read, in bytes; a larger one is a bad sample.
    pub max_file_bytes: u64,
    /// Ring bytes all connections of one uid may hold at once.
    pub max_client_ring_bytes: u64,
    /// Ring bytes all ranks of one job may hold at once.
    pub max_job_ring_bytes: u64,
    /// Clients attached at once, in all.
    pub max_clients: usize,
    /// Jobs at once, in all.
    pub max_jobs: usize,
    /// Clients (rings) one uid may have attached; unset: half of `max_clients` (at least 1),
    /// so no single user can hold every ring.
    pub max_clients_per_uid: Option<usize>,
    /// Jobs one uid may run; unset: half of `max_jobs` (at least 1), so no single user can
    /// hold every job.
    pub max_jobs_per_uid: Option<usize>,
    /// Each uid's share of the decode workers while several users' jobs run, by uid (a
    /// number as a string key: `{ "1000" = 2.0 }`); a uid not named has share 1, so by default
    /// the workers are split evenly between the users with jobs, then evenly between each
    /// user's jobs.
    pub user_shares: BTreeMap<String, f64>,
    /// Bad-sample log lines per second; past it lines are counted and reported as
    /// "suppressed K" (each bad file is logged once anyway).
    pub log_bad_samples_per_second: u32,
    /// Connections of one uid that may wait, not yet attached (the lobby, `serve::lobby`).
    pub max_waiting_per_uid: usize,
    /// Connections that may wait in all, not yet attached (also at most half the fd limit).
    pub max_waiting: usize,
    /// Milliseconds a new connection has to send its ATTACH (or STATUS).
    pub attach_deadline_ms: u64,
    /// Directory entries indexing one dataset may look at.
    pub max_index_entries: u64,
    /// Folder depth below a dataset's root that indexing may reach.
    pub max_index_depth: u32,
    /// Bytes of JPEG entry points (`transform::decode`'s table) one uid's jobs may keep; over
    /// it the uid's own oldest files go, and all of them when its last job ends.
    pub entry_bytes_per_uid: u64,
    /// Seconds a uid's entry points stay after its last job ends, so that its next job finds
    /// them (0: they go with the job); still within `entry_bytes_per_uid`.
    pub entry_grace_s: u64,
}

impl LimitsConfig {
    /// `max_clients_per_uid`, or half of `max_clients` (at least 1).
    pub(crate) fn clients_per_uid(&self) -> usize {
        self.max_clients_per_uid
            .unwrap_or((self.max_clients / 2).max(1))
    }

    /// Puts `entry_bytes_per_uid` and `entry_grace_s` in force for the process's JPEG
    /// entry-point table (a serving daemon's and a worker's alike).
    pub(crate) fn apply_entry_limits(&self) {
        let budget = usize::try_from(self.entry_bytes_per_uid).unwrap_or(usize::MAX);
        stoker_pipeline::transform::decode::set_entry_budget(budget);
        let grace = std::time::Duration::from_secs(self.entry_grace_s);
        stoker_pipeline::transform::decode::set_entry_grace(grace);
    }

    /// `max_jobs_per_uid`, or half of `max_jobs` (at least 1).
    pub(crate) fn jobs_per_uid(&self) -> usize {
        self.max_jobs_per_uid.unwrap_or((self.max_jobs / 2).max(1))
    }

    /// `user_shares` by uid (keys and values checked by the config's validation; bad ones left out).
    pub(crate) fn shares(&self) -> BTreeMap<u32, f64> {
        self.user_shares
            .iter()
            .filter_map(|(uid, share)| Some((uid.parse().ok()?, *share)))
            .filter(|(_, share): &(u32, f64)| share.is_finite() && *share > 0.0)
            .collect()
    }

    /// The first bad `user_shares` entry, named.
    pub(crate) fn shares_problem(&self) -> Option<String> {
        self.user_shares.iter().find_map(|(uid, share)| {
            if uid.parse::<u32>().is_err() {
                Some(format!(
                    "limits.user_shares: key {uid:?} is not a uid (a number)"
                ))
            } else if !(share.is_finite() && *share > 0.0) {
                Some(format!(
                    "limits.user_shares.{uid}: share must be a positive number, got {share}"
                ))
            } else {
                None
            }
        })
    }
}

impl Default for LimitsConfig {
    fn default() -> Self {
        LimitsConfig {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
            max_client_ring_bytes: DEFAULT_MAX_CLIENT_RING_BYTES,
            max_job_ring_bytes: DEFAULT_MAX_JOB_RING_BYTES,
            max_clients: DEFAULT_MAX_CLIENTS,
            max_jobs: DEFAULT_MAX_JOBS,
            max_clients_per_uid: None,
            max_jobs_per_uid: None,
            user_shares: BTreeMap::new(),
            log_bad_samples_per_second: stoker_pipeline::ratelimit::DEFAULT_LINES_PER_SECOND,
            max_waiting_per_uid: DEFAULT_MAX_WAITING_PER_UID,
            max_waiting: DEFAULT_MAX_WAITING,
            attach_deadline_ms: DEFAULT_ATTACH_DEADLINE_MS,
            max_index_entries: WalkLimits::default().max_entries,
            max_index_depth: WalkLimits::default().max_depth,
            entry_bytes_per_uid: DEFAULT_ENTRY_BYTES_PER_UID,
            entry_grace_s: stoker_pipeline::transform::decode::DEFAULT_ENTRY_GRACE.as_secs(),
        }
    }
}

/// `[access]`: who may attach, and which datasets they may name by path.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct AccessConfig {
    /// Client uids allowed to attach besides root and the daemon's own uid (always allowed).
    pub allowed_uids: Vec<u32>,
    /// Groups whose members may attach (the peer's primary or a supplementary group, as the
    /// socket recorded them), by gid or by name (`["stoker-clients", 2000]`).
    pub allowed_gids: Vec<GroupRef>,
    /// Folders under which clients may name datasets by path. When empty, a client whose uid
    /// is the daemon's own may name any path (it could read it itself) and other clients may
    /// use registered datasets only.
    pub dataset_roots: Vec<PathBuf>,
}

/// A group in the config: a gid, or a name looked up in the system's group database when
/// the access rules are made (a name the system lacks is a configuration error then).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum GroupRef {
    /// A numeric gid, used as is.
    Gid(u32),
    /// A group name, looked up when the access rules are made.
    Name(String),
}

impl GroupRef {
    /// The gid, or `None` when the name is no group of this system.
    pub(crate) fn gid(&self) -> Option<u32> {
        match self {
            GroupRef::Gid(g) => Some(*g),
            GroupRef::Name(n) => stoker_wire::socket::groups::gid_of(n),
        }
    }
}

impl std::fmt::Display for GroupRef {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            GroupRef::Gid(g) => write!(f, "{g}"),
            GroupRef::Name(n) => write!(f, "{n:?}"),
        }
    }
}

impl LimitsConfig {
    /// How far indexing may walk.
    pub(crate) fn walk(&self) -> WalkLimits {
        WalkLimits {
            max_entries: self.max_index_entries,
            max_depth: self.max_index_depth,
        }
    }

    /// What a decoder refuses before decoding.
    pub(crate) fn decode(&self) -> Limits {
        Limits {
            max_pixels: self.max_pixels,
            max_file_bytes: self.max_file_bytes,
        }
    }
}
