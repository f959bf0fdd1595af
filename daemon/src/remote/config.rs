//! The config sections of remote work: `[worker]` (this daemon works for home daemons) and
//! `[remote]` (this home daemon sends units to workers). Keys and defaults are documented in
//! docs/operations.md and docs/multi-host.md.

#![forbid(unsafe_code)]

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Most connections a worker takes at once, by default.
pub(crate) const DEFAULT_MAX_CONNECTIONS: usize = 64;
/// Most connections from one peer address, by default.
pub(crate) const DEFAULT_MAX_CONNECTIONS_PER_PEER: usize = 16;
/// Most pixel bytes one unit may need on a worker (its buffer), by default.
pub(crate) const DEFAULT_MAX_UNIT_BYTES: u64 = 256 << 20;
/// Most pixel bytes the units of one peer address may hold on a worker at once, by default.
pub(crate) const DEFAULT_MAX_BYTES_PER_PEER: u64 = 1 << 30;
/// Milliseconds a worker waits for a home daemon's next message before it closes the
/// connection, by default.
pub(crate) const DEFAULT_IDLE_TIMEOUT_MS: u64 = 120_000;
/// Seconds between resolutions of a home daemon's worker names, by default.
pub(crate) const DEFAULT_RESOLVE_INTERVAL_S: u64 = 30;
/// Connections (units in flight) a home daemon keeps to each worker, by default.
pub(crate) const DEFAULT_CONNECTIONS_PER_WORKER: usize = 2;
/// Milliseconds a unit may take on a worker before it is filled locally, by default.
pub(crate) const DEFAULT_UNIT_TIMEOUT_MS: u64 = 10_000;

/// `[worker]`: do units of work for home daemons over TCP.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct WorkerConfig {
    /// The TCP address to listen on (`0.0.0.0:7411`); none: not a worker.
    pub listen: Option<String>,
    /// The shared secret home daemons prove they hold (a file only its owner may read).
    pub secret_file: Option<PathBuf>,
    /// This worker's TLS certificate chain and key (PEM): with them it speaks only TLS.
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM, a file only its owner may read) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// The CA home daemons' certificates must be signed by (mutual TLS).
    pub tls_client_ca: Option<PathBuf>,
    /// Connections held at once from every home daemon together; one more is refused.
    pub max_connections: usize,
    /// Connections held at once from one peer address; one more is refused.
    pub max_connections_per_peer: usize,
    /// Pixel bytes one unit may need on the worker; a larger unit is refused.
    pub max_unit_bytes: u64,
    /// Pixel bytes the connections of one peer address may hold at once; a unit past it is
    /// refused.
    pub max_bytes_per_peer: u64,
    /// A connection with no message for this long, in milliseconds, is closed.
    pub idle_timeout_ms: u64,
    /// `s3://bucket/prefix` URLs under which home daemons may name unregistered datasets.
    pub s3_prefixes: Vec<String>,
}

impl Default for WorkerConfig {
    fn default() -> Self {
        WorkerConfig {
            listen: None,
            secret_file: None,
            tls_cert: None,
            tls_key: None,
            tls_client_ca: None,
            max_connections: DEFAULT_MAX_CONNECTIONS,
            max_connections_per_peer: DEFAULT_MAX_CONNECTIONS_PER_PEER,
            max_unit_bytes: DEFAULT_MAX_UNIT_BYTES,
            max_bytes_per_peer: DEFAULT_MAX_BYTES_PER_PEER,
            idle_timeout_ms: DEFAULT_IDLE_TIMEOUT_MS,
            s3_prefixes: Vec::new(),
        }
    }
}

/// `[remote]`: the workers this home daemon sends units to.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RemoteConfig {
    /// `host:port` of each worker (a name is resolved again at every reconnect).
    pub workers: Vec<String>,
    /// The shared secret the workers hold too.
    pub secret_file: Option<PathBuf>,
    /// The CA the workers' TLS certificates are signed by: with it, TLS to every worker.
    pub tls_ca: Option<PathBuf>,
    /// This home daemon's certificate chain and key (PEM), for workers asking mutual TLS.
    pub tls_cert: Option<PathBuf>,
    /// The private key (PEM, a file only its owner may read) of `tls_cert`.
    pub tls_key: Option<PathBuf>,
    /// Seconds between resolutions of the workers' names (a headless Service's pods).
    pub resolve_interval_s: u64,
    /// Connections (and so units in flight) kept open to each worker.
    pub connections: usize,
    /// A unit not back within this many milliseconds is filled locally and its connection
    /// dropped.
    pub unit_timeout_ms: u64,
}

impl Default for RemoteConfig {
    fn default() -> Self {
        RemoteConfig {
            workers: Vec::new(),
            secret_file: None,
            tls_ca: None,
            tls_cert: None,
            tls_key: None,
            resolve_interval_s: DEFAULT_RESOLVE_INTERVAL_S,
            connections: DEFAULT_CONNECTIONS_PER_WORKER,
            unit_timeout_ms: DEFAULT_UNIT_TIMEOUT_MS,
        }
    }
}

impl WorkerConfig {
    /// The first value out of range, named by its key.
    pub(crate) fn problem(&self) -> Option<String> {
        let listen = self.listen.as_ref()?;
        if listen.parse::<std::net::SocketAddr>().is_err() {
            return Some(format!(
                "worker.listen: {listen:?} is not an address like 0.0.0.0:7411"
            ));
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Some("worker.tls_cert and worker.tls_key go together".into());
        }
        if self.tls_client_ca.is_some() && self.tls_cert.is_none() {
            return Some("worker.tls_client_ca needs worker.tls_cert and tls_key".into());
        }
        if self.secret_file.is_none() && self.tls_client_ca.is_none() {
            return Some(
                "worker.listen is set but neither worker.secret_file nor worker.tls_client_ca \
                 is: a worker serves only home daemons that prove they hold the secret or a \
                 certificate of that CA"
                    .into(),
            );
        }
        if self.max_connections == 0 || self.max_connections_per_peer == 0 {
            return Some(
                "worker.max_connections and max_connections_per_peer must be \
                         at least 1"
                    .into(),
            );
        }
        if self.max_bytes_per_peer == 0 || self.idle_timeout_ms == 0 {
            return Some("worker.max_bytes_per_peer and idle_timeout_ms must be at least 1".into());
        }
        if let Some(p) = self.s3_prefixes.iter().find(|p| !p.starts_with("s3://")) {
            return Some(format!("worker.s3_prefixes: {p:?} is not an s3:// URL"));
        }
        None
    }
}

impl RemoteConfig {
    /// The first value out of range, named by its key.
    pub(crate) fn problem(&self) -> Option<String> {
        if self.workers.is_empty() {
            return None;
        }
        if self.tls_cert.is_some() != self.tls_key.is_some() {
            return Some("remote.tls_cert and remote.tls_key go together".into());
        }
        if self.tls_cert.is_some() && self.tls_ca.is_none() {
            return Some("remote.tls_cert needs remote.tls_ca (TLS to the workers)".into());
        }
        if self.secret_file.is_none() && self.tls_cert.is_none() {
            return Some(
                "remote.workers are set but neither remote.secret_file nor remote.tls_cert is"
                    .into(),
            );
        }
        if self.connections == 0 || self.unit_timeout_ms == 0 || self.resolve_interval_s == 0 {
            return Some(
                "remote.connections, unit_timeout_ms and resolve_interval_s must be at least 1"
                    .into(),
            );
        }
        if let Some(w) = self.workers.iter().find(|w| w.rsplit_once(':').is_none()) {
            return Some(format!("remote.workers: {w:?} is not host:port"));
        }
        None
    }
}
