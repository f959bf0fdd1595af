//! The daemon's configuration: one TOML file, every key optional, unknown keys rejected with
//! the key and its line. Command-line flags override the file. With no file at all the
//! defaults serve a single-user workstation.
//!
//! Every key and its default is documented in `docs/operations.md`. Each section's type sits
//! beside the room it configures (`[server]`, `[limits]`, `[access]`: `crate::serve::config`;
//! `[worker]`, `[remote]`: `crate::remote::config`; `[s3]`: the pipeline's object storage),
//! with its defaults, each written once; this file assembles them into one [`Config`].
//!
//! These types are also the daemon's run-time configuration: `stokerd` applies its flags to
//! a [`Config`], validates it once, and the server reads its sections ([`Config::engine`] is
//! the engine's share of `[pipeline]` and `[limits]`).

#![forbid(unsafe_code)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

pub use crate::remote::config::{RemoteConfig, WorkerConfig};
pub use crate::serve::config::*;
use stoker_pipeline::engine::choice::BackendChoice;
use stoker_pipeline::engine::{BadSamplePolicy, EngineConfig, MIN_SLOTS_PER_RANK};
use stoker_pipeline::source::local::reader::ReaderKind;

/// Why the configuration cannot be used; every one exits 78 (EX_CONFIG).
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    /// The config file could not be read.
    #[error("cannot read config {path}: {source}")]
    Read {
        /// The config file.
        path: PathBuf,
        /// What reading it reported.
        source: std::io::Error,
    },
    /// The file is not TOML, or names a key or value no section has.
    #[error("config {path}: {}", one_line(.source))]
    Parse {
        /// The config file.
        path: PathBuf,
        /// The TOML parser's error, shown on one line with its line and column.
        source: toml::de::Error,
    },
    /// A value is out of range.
    #[error("config {path}: {message}")]
    Invalid {
        /// The config file.
        path: PathBuf,
        /// The key and the rule it broke, as [`Config::problem`] words it.
        message: String,
    },
    /// A command-line flag set a value the config file could not hold.
    #[error("command line: {message}")]
    Flags {
        /// The key and the rule it broke, as [`Config::problem`] words it.
        message: String,
    },
}

/// The whole configuration file.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Config {
    /// `[server]`: the socket, its mode and group, slots per ring, the idle exit.
    pub server: ServerConfig,
    /// `[pipeline]`: the backend, decode threads, the reader, the bad-sample policy.
    pub pipeline: PipelineConfig,
    /// `[limits]`: decode limits, ring-memory and attach quotas, fair shares.
    pub limits: LimitsConfig,
    /// `[access]`: who may attach and under which folders they may name datasets.
    pub access: AccessConfig,
    /// `[metrics]`: the Prometheus listener.
    pub metrics: MetricsConfig,
    /// Registered datasets: name -> path. Clients may name these.
    pub datasets: BTreeMap<String, PathBuf>,
    /// Object storage (`s3://` datasets) and the node cache.
    pub s3: stoker_pipeline::source::object::S3Config,
    /// This daemon as a remote worker for home daemons (`crate::remote`).
    pub worker: WorkerConfig,
    /// The remote workers this daemon sends units to.
    pub remote: RemoteConfig,
    /// `[cuda]`: the GPUs' context scheduling and nvJPEG's inputs.
    pub cuda: stoker_pipeline::engine::cuda::CudaOptions,
}

/// `[pipeline]`: how the engine decodes.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct PipelineConfig {
    /// `auto` (CUDA where a GPU and its libraries are present, else the CPU), `cpu` or
    /// `cuda`; `--backend` overrides it.
    pub backend: BackendChoice,
    /// Decode threads shared by every job; 0 means one per core.
    pub threads: usize,
    /// How files are read: `auto` (io_uring, else pread), `io_uring` or `pread`.
    pub reader: ReaderKind,
    /// What happens to a sample that cannot be read or decoded.
    pub bad_samples: BadSamplePolicy,
}

/// `[metrics]`: the Prometheus text endpoint.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MetricsConfig {
    /// Address of the Prometheus text endpoint (`127.0.0.1:9464`); none disables it.
    pub listen: Option<String>,
    /// Addresses of the scrapers (Prometheus): their connections are answered on threads of
    /// their own and never closed to make room for other clients.
    pub scrapers: Vec<std::net::IpAddr>,
    /// Whether the page shows job keys whole, dataset paths in them included; by default a
    /// key is shown up to its first `/`, then as a hash.
    pub show_paths: bool,
}

impl Config {
    /// Reads and validates a config file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(&text, path)
    }

    /// Parses and validates config text; `path` names it in errors.
    pub(crate) fn parse(text: &str, path: &Path) -> Result<Config, ConfigError> {
        let config: Config = toml::from_str(text).map_err(|source| ConfigError::Parse {
            path: path.to_path_buf(),
            source,
        })?;
        match config.problem() {
            Some(message) => Err(ConfigError::Invalid {
                path: path.to_path_buf(),
                message,
            }),
            None => Ok(config),
        }
    }

    /// The first value out of range, named by its key; `None` when the config is valid.
    pub(crate) fn problem(&self) -> Option<String> {
        let share = self.cuda.hw_decode_share;
        if !(0.0..=1.0).contains(&share) {
            return Some(format!(
                "cuda.hw_decode_share must be between 0 and 1, got {share}"
            ));
        }
        let threads = self.cuda.hybrid_threads;
        let most = stoker_pipeline::engine::cuda::MAX_HYBRID_THREADS;
        if !(1..=most).contains(&threads) {
            return Some(format!(
                "cuda.hybrid_threads must be between 1 and {most}, got {threads}"
            ));
        }
        if self.server.slots_per_rank < MIN_SLOTS_PER_RANK {
            return Some(format!(
                "server.slots_per_rank must be at least {MIN_SLOTS_PER_RANK}, got {}",
                self.server.slots_per_rank
            ));
        }
        if self.server.socket_mode > 0o777 {
            return Some(format!(
                "server.socket_mode must be a file mode like 0o660, got {:#o}",
                self.server.socket_mode
            ));
        }
        for (name, p) in &self.datasets {
            if name.is_empty() || name.contains('/') {
                return Some(format!(
                    "datasets: name {name:?} must be non-empty and contain no '/'"
                ));
            }
            if !p.is_absolute() && !stoker_pipeline::source::object::is_url(p) {
                return Some(format!(
                    "datasets.{name}: path {} must be absolute (or an s3:// URL)",
                    p.display()
                ));
            }
        }
        if let Some(problem) = self.limits.shares_problem() {
            return Some(problem);
        }
        if let Some(problem) = self.s3.problem(&self.datasets) {
            return Some(problem);
        }
        if let Some(root) = self.access.dataset_roots.iter().find(|r| !r.is_absolute()) {
            return Some(format!(
                "access.dataset_roots: {} must be absolute",
                root.display()
            ));
        }
        if let Some(problem) = self.worker.problem().or_else(|| self.remote.problem()) {
            return Some(problem);
        }
        if let Some(addr) = &self.metrics.listen {
            if let Err(e) = addr.parse::<std::net::SocketAddr>() {
                return Some(format!(
                    "metrics.listen: {addr:?} is not an address like 127.0.0.1:9464 ({e})"
                ));
            }
        }
        None
    }

    /// The engine's share of `[pipeline]` and `[limits]`.
    pub(crate) fn engine(&self) -> EngineConfig {
        EngineConfig {
            threads: self.pipeline.threads,
            reader: self.pipeline.reader,
            limits: self.limits.decode(),
            policy: self.pipeline.bad_samples,
            bad_log_per_second: self.limits.log_bad_samples_per_second,
            throttle: None,
            user_shares: self.limits.shares(),
            cuda: self.cuda,
        }
    }

    /// What the server is started with: its own sections, the datasets and object storage,
    /// the engine's share and the socket path.
    pub(crate) fn serve(&self) -> ServeConfig {
        ServeConfig {
            socket: self.socket_path(),
            server: self.server.clone(),
            limits: self.limits.clone(),
            access: self.access.clone(),
            datasets: self.datasets.clone(),
            s3: self.s3.clone(),
            engine: self.engine(),
        }
    }

    /// The Prometheus endpoint's address, if metrics are on (`metrics.listen`, checked by
    /// [`Config::problem`]).
    pub(crate) fn metrics_addr(&self) -> Option<std::net::SocketAddr> {
        self.metrics.listen.as_deref().and_then(|a| a.parse().ok())
    }

    /// The socket path to listen on.
    pub(crate) fn socket_path(&self) -> PathBuf {
        self.server
            .socket
            .clone()
            .unwrap_or_else(default_socket_path)
    }
}

/// Where the daemon listens unless told: [`stoker_wire::default_socket_path`] (`$STOKER_SOCKET`,
/// else `/run/stoker/stoker.sock` for root, else the user's own
/// `$XDG_RUNTIME_DIR/stoker/stoker.sock` or `/tmp/stoker-$UID/stoker.sock`).
pub(crate) fn default_socket_path() -> PathBuf {
    stoker_wire::default_socket_path()
}

/// toml's errors span several lines with a source excerpt; keep the key, line and reason.
fn one_line(e: &toml::de::Error) -> String {
    let msg = e.message().trim().to_string();
    match e.span() {
        Some(_) => {
            let text = e.to_string();
            // "TOML parse error at line 3, column 1" is the first line of the rendering.
            let location = text.lines().next().unwrap_or("").trim();
            let location = location.trim_start_matches("TOML parse error at ");
            format!("{location}: {msg}")
        }
        None => msg,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_pipeline::engine::DEFAULT_SLOTS_PER_RANK;

    #[test]
    fn empty_file_gives_defaults() {
        let c = Config::parse("", Path::new("x.toml")).unwrap();
        assert_eq!(c, Config::default());
        assert_eq!(c.server.slots_per_rank, DEFAULT_SLOTS_PER_RANK);
        assert_eq!(c.pipeline.bad_samples, BadSamplePolicy::Skip);
    }

    #[test]
    fn full_file_parses() {
        let text = r#"
[server]
socket = "/run/stoker/stoker.sock"
socket_mode = 0o660
socket_group = "stoker"
slots_per_rank = 6

[pipeline]
backend = "cpu"
threads = 8
reader = "pread"
bad_samples = "fail"

[limits]
max_pixels = 50000000

[access]
allowed_uids = [1000]
allowed_gids = ["stoker-clients", 2000]
dataset_roots = ["/data"]

[metrics]
listen = "127.0.0.1:9464"

[datasets]
imagenet = "/data/imagenet/train"
"#;
        let c = Config::parse(text, Path::new("stoker.toml")).unwrap();
        assert_eq!(c.server.slots_per_rank, 6);
        assert_eq!(c.pipeline.backend, BackendChoice::Cpu);
        assert_eq!(c.pipeline.reader, ReaderKind::Pread);
        assert_eq!(c.pipeline.bad_samples, BadSamplePolicy::Fail);
        assert_eq!(c.limits.max_pixels, 50_000_000);
        assert_eq!(c.limits.max_clients, DEFAULT_MAX_CLIENTS);
        assert_eq!(
            c.access.allowed_gids,
            [GroupRef::Name("stoker-clients".into()), GroupRef::Gid(2000)]
        );
        assert_eq!(
            c.datasets["imagenet"],
            PathBuf::from("/data/imagenet/train")
        );
    }

    #[test]
    fn the_engine_defaults_are_the_files() {
        let (file, engine) = (Config::default().engine(), EngineConfig::default());
        assert_eq!(file.threads, engine.threads);
        assert_eq!(file.reader, engine.reader);
        assert_eq!(file.limits, engine.limits);
        assert_eq!(file.policy, engine.policy);
        assert_eq!(file.bad_log_per_second, engine.bad_log_per_second);
    }

    /// The `default` column of docs/operations.md's configuration reference, for every key
    /// whose default is a literal (`` `4` ``, `` `"auto"` ``, `` `0o660` ``, `` `[]` ``), is what
    /// `Config::default()` holds.
    #[test]
    fn the_documented_defaults_are_the_codes() {
        let doc = concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/operations.md");
        let doc = std::fs::read_to_string(doc).expect("docs/operations.md");
        let defaults = toml::Value::try_from(Config::default()).expect("serialisable");
        let mut checked = 0;
        for row in doc.lines().filter(|l| l.starts_with("| `")) {
            let cells: Vec<&str> = row.split(" | ").collect();
            let keys: Vec<&str> = cells[0].trim_start_matches("| ").split(", ").collect();
            let values: Vec<&str> = cells[1].split(", ").collect();
            if keys.len() != values.len() || !keys.iter().all(|k| k.contains('.')) {
                continue;
            }
            for (key, value) in keys.iter().zip(&values) {
                let key = key.trim_matches('`');
                let Some(literal) = value.split(' ').next().and_then(documented_literal) else {
                    continue;
                };
                let found = key
                    .split('.')
                    .try_fold(&defaults, |v, part| v.get(part))
                    .unwrap_or_else(|| panic!("docs name {key}, which Config does not have"));
                assert_eq!(found, &literal, "docs/operations.md's default of {key}");
                checked += 1;
            }
        }
        assert!(
            checked >= 20,
            "the configuration reference was not found ({checked} keys)"
        );
    }

    /// A documented default written as a TOML literal in backticks.
    fn documented_literal(cell: &str) -> Option<toml::Value> {
        let text = cell.strip_prefix('`')?.strip_suffix('`')?;
        toml::from_str::<toml::Table>(&format!("v = {text}"))
            .ok()?
            .remove("v")
    }

    #[test]
    fn unknown_key_is_named_with_its_line() {
        let err = Config::parse("[server]\nslots = 3\n", Path::new("/etc/stoker.toml"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("/etc/stoker.toml"), "{err}");
        assert!(err.contains("slots"), "{err}");
        assert!(err.contains("line 2"), "{err}");
    }

    #[test]
    fn invalid_values_are_named() {
        let err = Config::parse("[server]\nslots_per_rank = 1\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("slots_per_rank"), "{err}");
        let err = Config::parse("[datasets]\nx = \"relative\"\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("absolute"), "{err}");
        let err = Config::parse("[cuda]\nhw_decode_share = 1.5\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cuda.hw_decode_share") && err.contains("1.5"),
            "{err}"
        );
        let err = Config::parse("[cuda]\nhybrid_threads = 0\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("cuda.hybrid_threads") && err.contains("got 0"),
            "{err}"
        );
        let err = Config::parse("[metrics]\nlisten = \"nowhere\"\n", Path::new("c"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("metrics.listen"), "{err}");
    }
}
