//! The `[s3]` section of stoker.toml: how to reach object storage and where the node cache
//! lives. Every key is optional; absent connection keys fall back to the standard AWS
//! environment variables (`AWS_ENDPOINT_URL`, `AWS_REGION`, `AWS_ACCESS_KEY_ID`, ...), then to
//! web identity, container and instance credentials.
//!
//! # Design
//! `[s3.default]` is the connection of every `s3://` dataset; `[s3.datasets.<name>]` replaces
//! it whole for one registered dataset. The rest (in-flight limit, retries, cache) is per host.
//!
//! # Limitations
//! Secrets in the file are plain text: keep the file readable by the daemon's user only, or
//! leave them out and use the environment or instance credentials.

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// Requests in flight per host when the config does not say.
pub const DEFAULT_MAX_IN_FLIGHT: usize = 64;
/// Retries of a throttled or failed request (5xx, 429, connection errors, timeouts).
pub const DEFAULT_RETRIES: u32 = 5;
/// First backoff between retries; doubled each retry, capped at [`MAX_BACKOFF_MS`].
pub const DEFAULT_BACKOFF_MS: u64 = 100;
/// The longest wait between two retries.
pub const MAX_BACKOFF_MS: u64 = 5_000;
/// Timeout of one request, connection included.
pub const DEFAULT_TIMEOUT_MS: u64 = 30_000;
/// How long one fetch may take, every attempt, retry and backoff together; also how long a
/// batch waits (holding no decode worker) for its objects before what is missing is bad.
pub const DEFAULT_FETCH_DEADLINE_MS: u64 = 30_000;
/// The longest an answer may go without a byte (its headers, then between parts of its
/// body) before the download is given up as stalled: its slot goes back at once.
pub const DEFAULT_STALL_TIMEOUT_MS: u64 = 5_000;
/// How long listing a prefix may take, every page together: an honest listing of a million
/// objects takes a minute or two; one that goes on past this is refused.
pub const DEFAULT_LIST_DEADLINE_MS: u64 = 600_000;
/// Objects larger than this (shards) are read by per-sample ranged GETs, not fetched whole.
pub const DEFAULT_WHOLE_OBJECT_MAX_BYTES: u64 = 64 << 20;
/// How long an `s3://` dataset's index, cached on disk, is used without listing again.
pub const DEFAULT_INDEX_TTL_S: u64 = 600;
/// Size cap of the node cache (bytes).
pub const DEFAULT_CACHE_MAX_BYTES: u64 = 20 << 30;

/// How to reach one S3-compatible service. Keys left out come from the environment.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Connection {
    /// `https://s3.us-east-1.amazonaws.com`, `http://127.0.0.1:9000`, ... Plain `http://` is
    /// allowed when the endpoint says so.
    pub endpoint: Option<String>,
    /// The signing region; `None`: the one the environment gives (`AWS_REGION`, ...).
    pub region: Option<String>,
    /// Path-style addressing (`endpoint/bucket/key`), as MinIO, SeaweedFS and most
    /// self-hosted services need; virtual-hosted style (`bucket.endpoint/key`) otherwise.
    pub path_style: Option<bool>,
    /// The access key; `None`: the environment's credentials.
    pub access_key_id: Option<String>,
    /// The secret of `access_key_id`.
    pub secret_access_key: Option<String>,
    /// The session token of temporary credentials, if any.
    pub session_token: Option<String>,
}

/// The `[s3]` section.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct S3Config {
    /// The connection of every `s3://` dataset that has none of its own.
    pub default: Connection,
    /// Connections of registered datasets, by their name in `[datasets]`.
    pub datasets: BTreeMap<String, Connection>,
    /// Requests in flight at once, all datasets together, shared fairly between users and
    /// datasets.
    pub max_in_flight: usize,
    /// Retries of a failed request (throttling, 5xx, a dropped connection).
    pub retries: u32,
    /// The first retry's backoff in milliseconds, doubled each retry up to [`MAX_BACKOFF_MS`].
    pub backoff_ms: u64,
    /// The timeout of one request attempt in milliseconds, connection included.
    pub timeout_ms: u64,
    /// The whole-request deadline of one fetch (attempts, retries and backoffs together),
    /// and how long a batch waits for its objects before a sample still missing is bad.
    pub fetch_deadline_ms: u64,
    /// The longest an answer may go without a byte before its download is given up as
    /// stalled (its slot freed; its endpoint holds fewer slots for a while).
    pub stall_timeout_ms: u64,
    /// How long listing a dataset's prefix may take, every page and retry together.
    pub list_deadline_ms: u64,
    /// The node cache's folder; default `<cache dir>/objects` (see `dataset`'s cache dir).
    pub cache_dir: Option<PathBuf>,
    /// The node cache's size limit in bytes.
    pub cache_max_bytes: u64,
    /// Whether a job starting on a dataset fetches its objects ahead, in its epoch's order.
    pub prefetch: bool,
    /// Objects up to this size are fetched whole; samples of larger ones (tar shards) by
    /// ranged GETs, nearby samples merged into one request.
    pub whole_object_max_bytes: u64,
    /// Seconds an `s3://` dataset's index cached on disk is trusted without listing the
    /// prefix again (0: list at every open).
    pub index_ttl_s: u64,
}

impl Default for S3Config {
    fn default() -> Self {
        S3Config {
            default: Connection::default(),
            datasets: BTreeMap::new(),
            max_in_flight: DEFAULT_MAX_IN_FLIGHT,
            retries: DEFAULT_RETRIES,
            backoff_ms: DEFAULT_BACKOFF_MS,
            timeout_ms: DEFAULT_TIMEOUT_MS,
            fetch_deadline_ms: DEFAULT_FETCH_DEADLINE_MS,
            list_deadline_ms: DEFAULT_LIST_DEADLINE_MS,
            stall_timeout_ms: DEFAULT_STALL_TIMEOUT_MS,
            cache_dir: None,
            cache_max_bytes: DEFAULT_CACHE_MAX_BYTES,
            prefetch: true,
            whole_object_max_bytes: DEFAULT_WHOLE_OBJECT_MAX_BYTES,
            index_ttl_s: DEFAULT_INDEX_TTL_S,
        }
    }
}

impl S3Config {
    /// Why this section is invalid, if it is; `datasets` are the registered datasets.
    pub fn problem(&self, datasets: &BTreeMap<String, PathBuf>) -> Option<String> {
        for name in self.datasets.keys() {
            if !datasets.get(name).is_some_and(|p| super::is_url(p)) {
                return Some(format!(
                    "s3.datasets.{name}: no registered dataset {name:?} with an s3:// URL in \
                     [datasets]"
                ));
            }
        }
        if self.max_in_flight == 0 {
            return Some("s3.max_in_flight must be at least 1".into());
        }
        if self.cache_max_bytes == 0 {
            return Some("s3.cache_max_bytes must be at least 1".into());
        }
        if self.timeout_ms == 0 {
            return Some("s3.timeout_ms must be at least 1".into());
        }
        if self.fetch_deadline_ms == 0 {
            return Some("s3.fetch_deadline_ms must be at least 1".into());
        }
        if self.stall_timeout_ms == 0 {
            return Some("s3.stall_timeout_ms must be at least 1".into());
        }
        if self.list_deadline_ms == 0 {
            return Some("s3.list_deadline_ms must be at least 1".into());
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_dataset_connection_must_name_a_registered_s3_dataset() {
        let mut cfg = S3Config::default();
        let mut datasets = BTreeMap::new();
        assert_eq!(cfg.problem(&datasets), None);
        cfg.datasets.insert("net".into(), Connection::default());
        assert!(cfg.problem(&datasets).unwrap().contains("s3.datasets.net"));
        datasets.insert("net".into(), PathBuf::from("/data/net"));
        assert!(cfg.problem(&datasets).is_some());
        datasets.insert("net".into(), PathBuf::from("s3://bucket/net"));
        assert_eq!(cfg.problem(&datasets), None);
        cfg.max_in_flight = 0;
        assert!(cfg.problem(&datasets).unwrap().contains("max_in_flight"));
    }
}
