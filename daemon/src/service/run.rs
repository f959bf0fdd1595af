//! `stokerd`'s run: reads the config, chooses the backend, binds (or takes systemd's socket),
//! starts metrics, the signal and supervisor threads, serves, and drains on SIGTERM (the room's
//! design is in [`crate::service`]).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::remote::board::RemoteBoard;
use crate::remote::home::RemoteFactory;
use crate::remote::unit::DatasetRules;
use crate::remote::worker::WorkerSetup;
use crate::serve::access::AccessPolicy;
use crate::serve::{Server, ServerError, ServerHandle};
use crate::service::config::{Config, ConfigError};
use crate::service::detach::ReadyNotice;
use crate::service::metrics::{self, MetricsError};
use crate::service::systemd::{self, Notifier, Signal, Signals, SystemdError};
use stoker_pipeline::engine::choice::BackendChoice;
use stoker_pipeline::engine::choice::BackendError;
use stoker_pipeline::engine::ExtraWorkers;
use stoker_pipeline::source::object::ObjectStore;
use stoker_wire::exit::Exit;

/// How long attached clients get to go after SIGTERM before the daemon exits anyway.
pub(crate) const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often STATUS= is sent to systemd (and images/s recomputed).
const STATUS_EVERY: Duration = Duration::from_secs(2);
/// The accept loop must have looked up this recently for the watchdog to be fed.
const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// Serve decoded, augmented training batches to local processes over a Unix socket.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "stokerd", version = stoker_wire::protocol::VERSION_LINE)]
pub struct StokerdArgs {
    /// Config file (TOML). Without it the defaults serve a single-user workstation. SIGHUP
    /// reads it again.
    #[arg(long)]
    pub config: Option<PathBuf>,
    /// Socket to listen on. Default: server.socket from the config; else $STOKER_SOCKET; else
    /// /run/stoker/stoker.sock as root; else $XDG_RUNTIME_DIR/stoker/stoker.sock; else
    /// /tmp/stoker-<uid>/stoker.sock. Ignored when systemd passes the socket (socket
    /// activation).
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// File mode of the socket, in octal (e.g. 600). Overrides server.socket_mode.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    pub socket_mode: Option<u32>,
    /// Exit after SECS seconds with no client connected (0: never; checked every quarter of
    /// SECS, at most every second). Overrides server.idle_exit_s.
    #[arg(long, value_name = "SECS")]
    pub idle_exit: Option<u64>,
    /// Leave the starting process: it exits 0 once the daemon serves, or with the daemon's
    /// exit code (and its log's last lines) if it fails first; the daemon runs on in a new
    /// session, logging to --log-file.
    #[arg(long)]
    pub detach: bool,
    /// With --detach: the file the daemon logs to (appended; made mode 0600). Default:
    /// stokerd.log in the folder of the socket it binds.
    #[arg(long, value_name = "PATH")]
    pub log_file: Option<PathBuf>,
    /// Decode worker threads shared by every job (0: one per core). Overrides the config.
    #[arg(long)]
    pub threads: Option<usize>,
    /// Slots in each rank's ring (at least 2). Overrides the config.
    #[arg(long)]
    pub slots: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464). Overrides
    /// metrics.listen.
    #[arg(long, value_name = "ADDR")]
    pub metrics_listen: Option<std::net::SocketAddr>,
    /// Decode backend: auto (CUDA where a GPU and its libraries are present, else the CPU, and
    /// the log says why), cpu, or cuda (refused with the reason where it cannot serve).
    /// Overrides pipeline.backend.
    #[arg(long, value_enum)]
    pub backend: Option<BackendChoice>,
    /// Work for other hosts' daemons: take their units of work on ADDR (e.g. 0.0.0.0:7411).
    /// Needs --secret-file. Sets worker.listen.
    #[arg(long, value_name = "ADDR")]
    pub worker: Option<std::net::SocketAddr>,
    /// Send units of work to the worker at HOST:PORT too, beside the local decode threads
    /// (repeat for several). Needs --secret-file. Adds to remote.workers.
    #[arg(long = "remote-worker", value_name = "HOST:PORT")]
    pub remote_workers: Vec<String>,
    /// The secret workers and home daemons share (a file only its owner may read). A worker
    /// makes it when it does not exist yet; give home daemons the same file. Sets
    /// worker.secret_file and remote.secret_file.
    #[arg(long, value_name = "FILE")]
    pub secret_file: Option<PathBuf>,
    /// A folder under which clients and home daemons may name datasets by path (repeat for
    /// several). Adds to access.dataset_roots.
    #[arg(long = "dataset-root", value_name = "DIR")]
    pub dataset_roots: Vec<PathBuf>,
}

/// A `--socket-mode` that is not a file mode.
#[derive(Debug, thiserror::Error)]
#[error("{0:?} is not a file mode in octal, like 600 or 660")]
pub(super) struct ModeError(String);

fn parse_mode(s: &str) -> Result<u32, ModeError> {
    let digits = s.trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(ModeError(s.to_string())),
    }
}

/// Why the service could not start or stopped.
#[derive(Debug, thiserror::Error)]
pub enum ServiceError {
    /// The config file or the flags (exit 78).
    #[error("{0}")]
    Config(#[from] ConfigError),
    /// What systemd passed: `$NOTIFY_SOCKET`, `$WATCHDOG_USEC`, an activated socket.
    #[error("{0}")]
    Systemd(#[from] SystemdError),
    /// The `--backend` / `pipeline.backend` choice could not be served.
    #[error("{0}")]
    Backend(#[from] BackendError),
    /// The socket could not be bound or set up, or the server could not start.
    #[error("{0}")]
    Server(#[from] ServerError),
    /// The `/metrics` recorder or listener.
    #[error("{0}")]
    Metrics(#[from] MetricsError),
    /// A missing `worker.secret_file` could not be made.
    #[error("cannot make the shared secret file {path}: {source}")]
    Secret {
        /// The secret file as configured.
        path: PathBuf,
        /// What creating or writing it reported.
        source: std::io::Error,
    },
    /// The remote-worker side (`[worker]` or `[remote]`) could not start.
    #[error("{0}")]
    Remote(crate::remote::worker::WorkerError),
    /// A thread of the service could not be spawned.
    #[error("cannot start the {name} thread: {source}")]
    Thread {
        /// The thread's role (`signal`, `supervisor`).
        name: &'static str,
        /// What spawning it reported.
        source: std::io::Error,
    },
    /// A sticky CUDA error: the process must be relaunched (engine/cuda/sticky.rs).
    #[error("exiting to be restarted after a sticky CUDA error: {0}")]
    GpuRestart(String),
}

impl ServiceError {
    /// True when the configuration (file, flags, environment systemd set) is at fault.
    pub fn is_config(&self) -> bool {
        match self {
            ServiceError::Config(_)
            | ServiceError::Systemd(_)
            | ServiceError::Backend(_)
            | ServiceError::Secret { .. } => true,
            ServiceError::Server(e) => e.is_config(),
            ServiceError::Metrics(e) => e.is_config(),
            ServiceError::Remote(e) => e.is_config(),
            ServiceError::Thread { .. } | ServiceError::GpuRestart(_) => false,
        }
    }

    /// The process exit code: [`Exit::Config`] for configuration errors, else
    /// [`Exit::Failure`].
    pub fn exit_code(&self) -> Exit {
        if let ServiceError::GpuRestart(_) = self {
            return Exit::GpuRestart;
        }
        if self.is_config() {
            Exit::Config
        } else {
            Exit::Failure
        }
    }
}

/// Runs the daemon until it has drained after SIGTERM. `signals` must have been blocked
/// before any thread started, so only the signal thread takes SIGTERM / SIGHUP. `ready` is
/// told once the socket listens (`--detach`'s starter then exits 0).
pub fn run(
    args: &StokerdArgs,
    signals: Signals,
    mut ready: ReadyNotice,
) -> Result<(), ServiceError> {
    let mut file = match &args.config {
        Some(path) => Config::load(path)?,
        None => Config::default(),
    };
    args.apply_to(&mut file)?;
    stoker_nvidia::cuda::set_blocking_sync(file.cuda.blocking_sync); // before any GPU is retained
    let notifier = systemd_notifier();
    let watchdog = systemd::watchdog_interval()?;
    let activated = systemd::listen_fd()?;
    let backend = stoker_pipeline::engine::choice::choose(file.pipeline.backend)?;
    tracing::info!(backend = backend.name(), "decode backend");
    let remotes = remote_workers(&file)?;
    // Listening before the socket is: once a client can attach here, home daemons can too.
    start_worker(&file)?;
    if activated.is_none() && remotes.is_empty() && worker_without_socket(&file) {
        return serve_worker_only(&file, &signals, &notifier, watchdog, ready);
    }
    let server = match activated {
        Some((fd, name)) => {
            tracing::info!(name, "using the socket systemd passed (socket activation)");
            let path = systemd::socket_path(&fd).unwrap_or_else(|| file.socket_path());
            Server::from_activated(fd, path, &file.serve(), backend, &extra_workers(&remotes))?
        }
        None => Server::bind(&file.serve(), backend, &extra_workers(&remotes))?,
    };

    let handle = server.handle();
    handle.show_workers(RemoteBoard {
        workers: remotes.iter().map(RemoteFactory::board).collect(),
    });
    serve_metrics(&file, &handle)?;
    spawn_signal_thread(signals, &handle, &notifier, args.clone())?;
    drain_on_sticky_error(&handle, &notifier);
    let idle_exit = match file.server.idle_exit_s {
        0 => None,
        s => Some(Duration::from_secs(s)),
    };
    {
        let (handle, notifier) = (handle.clone(), Arc::clone(&notifier));
        std::thread::Builder::new()
            .name("stoker-supervisor".into())
            .spawn(move || supervise(&handle, &notifier, watchdog, idle_exit))
            .map_err(|source| ServiceError::Thread {
                name: "supervisor",
                source,
            })?;
    }
    // The socket is listening: a client that connects now is accepted by serve() below.
    notifier.notify(&format!(
        "READY=1\nSTATUS=serving on {}\nMAINPID={}",
        server.socket_path().display(),
        std::process::id()
    ));
    ready.ready();
    server.serve()?;
    let restart = stoker_pipeline::engine::cuda::sticky::cause().map(str::to_owned);
    if !handle.wait_drained(DRAIN_TIMEOUT) {
        tracing::warn!(
            clients = handle.connections(),
            "drain timed out: exiting with clients still attached"
        );
        let code = if restart.is_some() {
            Exit::GpuRestart
        } else {
            Exit::Ok
        };
        std::process::exit(i32::from(code.code()));
    }
    drop(server);
    if let Some(cause) = restart {
        return Err(ServiceError::GpuRestart(cause));
    }
    tracing::info!("stokerd stopped");
    Ok(())
}

/// Serves `/metrics` if `metrics.listen` is set: the server's series, and a worker's own.
fn serve_metrics(file: &Config, handle: &ServerHandle) -> Result<(), ServiceError> {
    let Some(addr) = file.metrics_addr() else {
        return Ok(());
    };
    let prom = crate::service::metrics::install()?;
    handle.show_metric_paths(file.metrics.show_paths);
    let h = handle.clone();
    let worker = file.worker.listen.is_some();
    let scrapers = file.metrics.scrapers.clone();
    metrics::spawn_listener(addr, prom, scrapers, move || {
        let mut text = h.metrics_text();
        if worker {
            text.push_str(&crate::remote::tally::metrics_text());
        }
        text
    })?;
    Ok(())
}

/// The workers of `[remote]`, one backend factory each.
/// A worker's missing secret is made first: a daemon that is both worker and home may share it.
fn remote_workers(file: &Config) -> Result<Vec<RemoteFactory>, ServiceError> {
    if let (Some(_), Some(secret)) = (&file.worker.listen, &file.worker.secret_file) {
        make_secret_if_missing(secret)?;
    }
    let remotes = crate::remote::home::factories(&file.remote).map_err(ServiceError::Remote)?;
    for r in &remotes {
        let connections = r.connections();
        tracing::info!(worker = r.addr(), connections, "remote worker");
    }
    Ok(remotes)
}

/// The engine threads of `remotes`: `remote.connections` per worker.
fn extra_workers(remotes: &[RemoteFactory]) -> Vec<ExtraWorkers<'_>> {
    remotes
        .iter()
        .map(|r| ExtraWorkers {
            name: "remote".into(),
            factory: r,
            threads: r.connections(),
        })
        .collect()
}

/// Starts `[worker]` if configured: units of work for home daemons over TCP, from the
/// datasets this daemon's own config allows.
fn start_worker(file: &Config) -> Result<(), ServiceError> {
    if file.worker.listen.is_none() {
        return Ok(());
    }
    file.limits.apply_entry_limits();
    let open = stoker_pipeline::source::index::OpenOptions {
        limits: file.limits.walk(),
        objects: Some(ObjectStore::new(&file.s3, &file.datasets)),
        ..stoker_pipeline::source::index::OpenOptions::default()
    };
    let rules = DatasetRules::new(
        &file.access.dataset_roots,
        &file.datasets,
        &file.worker.s3_prefixes,
        open,
    )
    .map_err(|e| ServiceError::Remote(e.into()))?;
    let setup = WorkerSetup {
        rules,
        engine: file.engine(),
    };
    crate::remote::worker::spawn(&file.worker, setup).map_err(ServiceError::Remote)?;
    Ok(())
}

/// The systemd notifier, or a disabled one (said in the log) where `$NOTIFY_SOCKET` is bad.
fn systemd_notifier() -> Arc<Notifier> {
    Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "not notifying systemd");
        Notifier::disabled()
    }))
}

/// Whether this daemon is a worker that binds no local socket: a worker serves home daemons
/// over TCP, and binding the default socket (the system daemon's, for root) would make it the
/// daemon local clients attach to (issue 43). A socket asked for (`--socket`,
/// `server.socket`, `$STOKER_SOCKET`) is bound as for any daemon.
fn worker_without_socket(file: &Config) -> bool {
    let env_socket =
        std::env::var_os(stoker_wire::socket::path::SOCKET_ENV).is_some_and(|v| !v.is_empty());
    file.worker.listen.is_some() && file.server.socket.is_none() && !env_socket
}

/// A worker without a local socket: its listener runs on its own threads; this serves
/// `/metrics` (the worker's series), tells systemd it is ready, feeds the watchdog, and
/// returns at SIGTERM (home daemons decode their units again themselves).
fn serve_worker_only(
    file: &Config,
    signals: &Signals,
    notifier: &Arc<Notifier>,
    watchdog: Option<Duration>,
    mut ready: ReadyNotice,
) -> Result<(), ServiceError> {
    if let Some(addr) = file.metrics_addr() {
        let prom = crate::service::metrics::install()?;
        let scrapers = file.metrics.scrapers.clone();
        metrics::spawn_listener(addr, prom, scrapers, crate::remote::tally::metrics_text)?;
    }
    if let Some(w) = watchdog {
        let notifier = Arc::clone(notifier);
        std::thread::Builder::new()
            .name("stoker-watchdog".into())
            .spawn(move || loop {
                std::thread::sleep(w / 2);
                notifier.notify("WATCHDOG=1");
            })
            .map_err(|source| ServiceError::Thread {
                name: "watchdog",
                source,
            })?;
    }
    tracing::info!("a worker only: no local socket (--socket or server.socket asks for one)");
    notifier.notify(&format!(
        "READY=1\nSTATUS=worker only, no local socket\nMAINPID={}",
        std::process::id()
    ));
    ready.ready();
    loop {
        match signals.wait() {
            Signal::Terminate => break,
            Signal::Reload => tracing::info!("SIGHUP: a worker has nothing to reload"),
        }
    }
    notifier.notify("STOPPING=1");
    tracing::info!("stokerd stopped");
    Ok(())
}

/// A worker whose secret file does not exist yet makes one: 32 random bytes in hex, mode 0600,
/// in a folder it makes 0700 if need be. Home daemons are then given the same file.
fn make_secret_if_missing(path: &Path) -> Result<(), ServiceError> {
    use std::io::Write;
    use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
    if path.exists() {
        return Ok(());
    }
    let fail = |source: std::io::Error| ServiceError::Secret {
        path: path.to_owned(),
        source,
    };
    if let Some(folder) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
        std::fs::DirBuilder::new()
            .recursive(true)
            .mode(0o700)
            .create(folder)
            .map_err(fail)?;
    }
    let mut bytes = [0u8; 32];
    ring::rand::SecureRandom::fill(&ring::rand::SystemRandom::new(), &mut bytes)
        .map_err(|_| fail(std::io::Error::other("no randomness from the system")))?;
    let text: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    // Written whole under a private name, then linked into place: a worker starting at the
    // same time on a shared home reads either no file or the whole of one, and the first
    // link wins.
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let tmp = path.with_file_name(format!(".{name}.{}.tmp", std::process::id()));
    let written = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(&tmp)
        .and_then(|mut f| f.write_all(format!("{text}\n").as_bytes()));
    let linked = written.and_then(|()| std::fs::hard_link(&tmp, path));
    let _ = std::fs::remove_file(&tmp);
    match linked {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => return Ok(()),
        other => other.map_err(fail)?,
    }
    tracing::info!(
        secret_file = %path.display(),
        "made a new shared secret: give the home daemons the same file"
    );
    Ok(())
}

/// A sticky CUDA error starts the drain; `run` then exits with [`Exit::GpuRestart`].
fn drain_on_sticky_error(handle: &ServerHandle, notifier: &Arc<Notifier>) {
    let (handle, notifier) = (handle.clone(), Arc::clone(notifier));
    stoker_pipeline::engine::cuda::sticky::on_restart(move |cause| {
        tracing::warn!(%cause, "draining to restart (clients are told the daemon stops)");
        notifier.notify("STOPPING=1\nSTATUS=restarting after a sticky CUDA error");
        handle.stop();
    });
}

/// The thread that takes SIGTERM (drain; a second one exits) and SIGHUP (reload).
fn spawn_signal_thread(
    signals: Signals,
    handle: &ServerHandle,
    notifier: &Arc<Notifier>,
    args: StokerdArgs,
) -> Result<(), ServiceError> {
    let (handle, notifier) = (handle.clone(), Arc::clone(notifier));
    std::thread::Builder::new()
        .name("stoker-signals".into())
        .spawn(move || loop {
            match signals.wait() {
                Signal::Terminate if handle.is_stopping() => {
                    tracing::warn!("second SIGTERM: exiting without waiting for clients");
                    std::process::exit(0);
                }
                Signal::Terminate => {
                    tracing::info!(
                        clients = handle.connections(),
                        "SIGTERM: draining (clients are told the daemon stops)"
                    );
                    notifier.notify("STOPPING=1\nSTATUS=draining");
                    handle.stop();
                }
                Signal::Reload => reload(&args, &handle, &notifier),
            }
        })
        .map_err(|source| ServiceError::Thread {
            name: "signal",
            source,
        })?;
    Ok(())
}

impl StokerdArgs {
    /// Where a detached daemon logs: `--log-file`, else `stokerd.log` beside the socket it
    /// binds (`--socket`, else the config's, else the default one). A config that cannot be
    /// read here is reported by the daemon itself, into that log.
    pub fn detached_log(&self) -> PathBuf {
        if let Some(p) = &self.log_file {
            return p.clone();
        }
        let socket = match (&self.socket, &self.config) {
            (Some(s), _) => s.clone(),
            (None, Some(c)) => Config::load(c).map_or_else(
                |_| stoker_wire::socket::path::default_socket_path(),
                |c| c.socket_path(),
            ),
            (None, None) => stoker_wire::socket::path::default_socket_path(),
        };
        socket
            .parent()
            .unwrap_or_else(|| Path::new("."))
            .join("stokerd.log")
    }

    /// Applies the flags that override config keys, then checks the result as a config file
    /// is checked (`--slots 1` is refused like `slots_per_rank = 1`).
    pub(crate) fn apply_to(&self, config: &mut Config) -> Result<(), ConfigError> {
        let server = &mut config.server;
        server.socket = self.socket.clone().or(server.socket.take());
        server.socket_mode = self.socket_mode.unwrap_or(server.socket_mode);
        server.idle_exit_s = self.idle_exit.unwrap_or(server.idle_exit_s);
        server.slots_per_rank = self.slots.unwrap_or(server.slots_per_rank);
        let pipeline = &mut config.pipeline;
        pipeline.threads = self.threads.unwrap_or(pipeline.threads);
        pipeline.backend = self.backend.unwrap_or(pipeline.backend);
        if let Some(addr) = self.metrics_listen {
            config.metrics.listen = Some(addr.to_string());
        }
        self.apply_remote(config);
        match config.problem() {
            Some(message) => Err(ConfigError::Flags { message }),
            None => Ok(()),
        }
    }
}

impl StokerdArgs {
    /// The flags of remote work: `--worker`, `--remote-worker`, `--secret-file`,
    /// `--dataset-root`.
    fn apply_remote(&self, config: &mut Config) {
        if let Some(addr) = self.worker {
            config.worker.listen = Some(addr.to_string());
        }
        if let Some(secret) = &self.secret_file {
            config.worker.secret_file = Some(secret.clone());
            config.remote.secret_file = Some(secret.clone());
        }
        for w in &self.remote_workers {
            if !config.remote.workers.contains(w) {
                config.remote.workers.push(w.clone());
            }
        }
        for root in &self.dataset_roots {
            if !config.access.dataset_roots.contains(root) {
                config.access.dataset_roots.push(root.clone());
            }
        }
    }
}

/// SIGHUP: reads the config again (the command line's flags still override it) and applies
/// what can change while serving (registered datasets and the access rules). A bad file is
/// logged and the running config kept.
fn reload(args: &StokerdArgs, handle: &ServerHandle, notifier: &Notifier) {
    let Some(path) = args.config.as_deref() else {
        tracing::info!("SIGHUP: no config file to reload");
        return;
    };
    notifier.notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}",
        systemd::monotonic_usec()
    ));
    let loaded = Config::load(path)
        .map_err(|e| e.to_string())
        .and_then(|mut c| {
            args.apply_to(&mut c).map_err(|e| e.to_string())?;
            let access = AccessPolicy::new(&c.access, &c.datasets).map_err(|e| e.to_string())?;
            Ok((c, access))
        });
    match loaded {
        Ok((c, access)) => {
            let names: Vec<&String> = c.datasets.keys().collect();
            tracing::info!(config = %path.display(), datasets = ?names, "config reloaded");
            handle.set_access(access);
            handle.objects().configure(&c.s3, &c.datasets);
            ::metrics::counter!(crate::service::metrics::RELOADS_TOTAL, "result" => "ok")
                .increment(1);
            tracing::info!(
                "access rules and datasets apply to new attaches now; limits, pipeline and server \
                 settings after a restart"
            );
        }
        Err(e) => {
            tracing::error!(error = %e, "config reload failed: keeping the running config");
            ::metrics::counter!(crate::service::metrics::RELOADS_TOTAL, "result" => "error")
                .increment(1);
        }
    }
    notifier.notify(&format!("READY=1\nSTATUS={}", handle.summary()));
}

/// Feeds the watchdog at half its interval while the server is alive, keeps STATUS= and the
/// throughput figure current, and starts the drain once no client was connected for
/// `idle_exit`.
fn supervise(
    handle: &ServerHandle,
    notifier: &Notifier,
    watchdog: Option<Duration>,
    idle_exit: Option<Duration>,
) {
    let tick = watchdog.map_or(Duration::from_secs(1), |w| {
        (w / 2).min(Duration::from_secs(1))
    });
    let tick = idle_exit.map_or(tick, |i| tick.min((i / 4).max(Duration::from_millis(100))));
    let mut last_status = Instant::now();
    let mut last_line = String::new();
    let mut idle_since = Instant::now();
    loop {
        // A timer, not a poll: the watchdog wants a ping at this rate.
        std::thread::sleep(tick);
        if handle.connections() > 0 {
            idle_since = Instant::now();
        } else if idle_exit.is_some_and(|i| idle_since.elapsed() >= i) && !handle.is_stopping() {
            tracing::info!(
                idle_s = idle_since.elapsed().as_secs(),
                "no client for the idle time (--idle-exit): stopping"
            );
            notifier.notify("STOPPING=1\nSTATUS=idle");
            handle.stop();
        }
        if watchdog.is_some() {
            if handle.is_alive(ALIVE_WITHIN) {
                notifier.notify("WATCHDOG=1");
            } else {
                tracing::error!("server not responding: not feeding the watchdog");
            }
        }
        if last_status.elapsed() >= STATUS_EVERY {
            last_status = Instant::now();
            handle.update_rate();
            let line = handle.summary();
            if line != last_line {
                notifier.notify(&format!("STATUS={line}"));
                last_line = line;
            }
        }
    }
}
