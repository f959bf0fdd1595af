//! `stokerd`: the stoker daemon. Parses flags and the config file, sets up logging, serves,
//! and maps the top-level error to an exit code: configuration errors exit with 78
//! (EX_CONFIG) so that systemd's `RestartPreventExitStatus=78` stops a restart loop.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::Arc;
use std::time::{Duration, Instant};

use clap::Parser;
use stoker_daemon::access::{AccessPolicy, QuotaLimits};
use stoker_daemon::config::{BackendChoice, Config, ReaderChoice, EXIT_CONFIG};
use stoker_daemon::decode::Limits;
use stoker_daemon::detach::{self, ReadyNotice, Role};
use stoker_daemon::metrics::MetricsListener;
use stoker_daemon::pipeline::EngineConfig;
use stoker_daemon::reader::ReaderKind;
use stoker_daemon::server::{Server, ServerConfig, ServerHandle};
use stoker_daemon::systemd::{self, Notifier, Signal, Signals};

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
enum BackendArg {
    Auto,
    Cpu,
    Cuda,
}

/// Exit code for failures at run time.
const EXIT_FAILURE: u8 = 1;
/// How long attached clients get to go after SIGTERM before the daemon exits anyway.
const DRAIN_TIMEOUT: Duration = Duration::from_secs(10);
/// How often STATUS= is sent to systemd (and images/s recomputed).
const STATUS_EVERY: Duration = Duration::from_secs(2);
/// The accept loop must have looked up this recently for the watchdog to be fed.
const ALIVE_WITHIN: Duration = Duration::from_secs(5);

/// Serve decoded, augmented training batches to local processes over a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "stokerd", version)]
struct Args {
    /// Config file (TOML). Without it the defaults serve a single-user workstation. SIGHUP
    /// reads it again.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Socket to listen on. Default: server.socket from the config; else $STOKER_SOCKET; else
    /// /run/stoker/stoker.sock as root; else $XDG_RUNTIME_DIR/stoker/stoker.sock; else
    /// /tmp/stoker-<uid>/stoker.sock. Ignored when systemd passes the socket (socket
    /// activation).
    #[arg(long)]
    socket: Option<PathBuf>,
    /// File mode of the socket, in octal (e.g. 600). Overrides server.socket_mode.
    #[arg(long, value_name = "OCTAL", value_parser = parse_mode)]
    socket_mode: Option<u32>,
    /// Exit after SECS seconds with no client connected (0: never; checked every quarter of
    /// SECS, at most every second). Overrides server.idle_exit_s.
    #[arg(long, value_name = "SECS")]
    idle_exit: Option<u64>,
    /// Leave the starting process: it exits 0 once the daemon serves, or with the daemon's
    /// exit code if it fails first; the daemon runs on in a new session.
    #[arg(long)]
    detach: bool,
    /// Decode worker threads shared by every job (0: one per core). Overrides the config.
    #[arg(long)]
    threads: Option<usize>,
    /// Slots in each rank's ring (at least 2). Overrides the config.
    #[arg(long)]
    slots: Option<usize>,
    /// Serve Prometheus metrics at http://ADDR/metrics (e.g. 127.0.0.1:9464). Overrides
    /// metrics.listen.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
    /// Decode backend: auto (CUDA where a GPU and its libraries are present, else the CPU, and
    /// the log says why), cpu, or cuda (refused with the reason where it cannot serve).
    /// Overrides pipeline.backend.
    #[arg(long, value_enum)]
    backend: Option<BackendArg>,
}

fn parse_mode(s: &str) -> Result<u32, String> {
    let digits = s.trim_start_matches("0o");
    match u32::from_str_radix(digits, 8) {
        Ok(m) if m <= 0o777 => Ok(m),
        _ => Err(format!(
            "{s:?} is not a file mode in octal, like 600 or 660"
        )),
    }
}

fn main() -> ExitCode {
    let config_exit = ExitCode::from(EXIT_CONFIG as u8);
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                config_exit
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Still one thread: the only moment a fork is safe.
    let ready = if args.detach {
        match detach::detach() {
            Ok(Role::Parent(code)) => return code,
            Ok(Role::Daemon(notice)) => notice,
            Err(e) => {
                eprintln!("stokerd: {e}");
                return ExitCode::from(EXIT_FAILURE);
            }
        }
    } else {
        ReadyNotice::none()
    };
    run(args, ready)
}

fn run(args: Args, mut ready: ReadyNotice) -> ExitCode {
    let config_exit = ExitCode::from(EXIT_CONFIG as u8);
    // Before any thread exists, so every thread inherits the mask and only the signal
    // thread takes SIGTERM / SIGHUP.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stokerd: {e}");
            return ExitCode::from(EXIT_FAILURE);
        }
    };
    stoker_daemon::logging::init_daemon();
    let fail = |e: &dyn std::fmt::Display, config: bool| {
        tracing::error!(error = %e, "stokerd stopped");
        eprintln!("stokerd: {e}");
        if config {
            ExitCode::from(EXIT_CONFIG as u8)
        } else {
            ExitCode::from(EXIT_FAILURE)
        }
    };
    let file = match &args.config {
        Some(path) => match Config::load(path) {
            Ok(c) => c,
            Err(e) => {
                tracing::error!(error = %e, "bad configuration");
                eprintln!("stokerd: {e}");
                return config_exit;
            }
        },
        None => Config::default(),
    };
    stoker_daemon::s3::configure(&file.s3, &file.datasets);
    let notifier = Arc::new(Notifier::from_env().unwrap_or_else(|e| {
        tracing::warn!(error = %e, "not notifying systemd");
        Notifier::disabled()
    }));
    let watchdog = match systemd::watchdog_interval() {
        Ok(w) => w,
        Err(e) => return fail(&e, true),
    };
    let activated = match systemd::listen_fd() {
        Ok(a) => a,
        Err(e) => return fail(&e, true),
    };
    let metrics_addr = match args.metrics_listen {
        Some(a) => Some(a),
        None => file
            .metrics
            .listen
            .as_deref()
            .map(|a| a.parse().expect("validated by Config")),
    };
    let choice = match args.backend {
        Some(BackendArg::Auto) => BackendChoice::Auto,
        Some(BackendArg::Cpu) => BackendChoice::Cpu,
        Some(BackendArg::Cuda) => BackendChoice::Cuda,
        None => file.pipeline.backend,
    };
    let backend = match stoker_daemon::backend::choose(choice) {
        Ok(b) => b,
        Err(e) => return fail(&e, true),
    };
    tracing::info!(backend = backend.name(), "decode backend");
    let socket = args.socket.clone().unwrap_or_else(|| file.socket_path());
    let config = server_config(&args, &file, socket.clone());
    let bound = match activated {
        Some((fd, name)) => {
            tracing::info!(name, "using the socket systemd passed (socket activation)");
            let path = systemd::socket_path(&fd).unwrap_or(socket);
            Server::from_activated(fd, path, config)
        }
        None => Server::bind(config),
    };
    let server = match bound {
        Ok(s) => s,
        Err(e) => {
            let config = e.is_config();
            return fail(&e, config);
        }
    };
    let handle = server.handle();
    if let Some(addr) = metrics_addr {
        let started = stoker_daemon::metrics::install().and_then(|prom| {
            let h = handle.clone();
            MetricsListener::spawn(addr, prom, move || {
                h.refresh_metrics();
                h.stall_metrics()
            })
        });
        if let Err(e) = started {
            let config = e.is_config();
            return fail(&e, config);
        }
    }
    {
        let (handle, notifier) = (handle.clone(), Arc::clone(&notifier));
        let config_path = args.config.clone();
        let spawned = std::thread::Builder::new()
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
                    Signal::Reload => reload(config_path.as_deref(), &handle, &notifier),
                }
            });
        if let Err(e) = spawned {
            return fail(&e, false);
        }
    }
    let idle_exit = match args.idle_exit.unwrap_or(file.server.idle_exit_s) {
        0 => None,
        s => Some(Duration::from_secs(s)),
    };
    {
        let (handle, notifier) = (handle.clone(), Arc::clone(&notifier));
        let spawned = std::thread::Builder::new()
            .name("stoker-supervisor".into())
            .spawn(move || supervise(&handle, &notifier, watchdog, idle_exit));
        if let Err(e) = spawned {
            return fail(&e, false);
        }
    }
    // The socket is listening: a client that connects now is accepted by serve() below.
    notifier.notify(&format!(
        "READY=1\nSTATUS=serving on {}\nMAINPID={}",
        server.socket_path().display(),
        std::process::id()
    ));
    ready.ready();
    if let Err(e) = server.serve() {
        return fail(&e, false);
    }
    if !handle.wait_drained(DRAIN_TIMEOUT) {
        tracing::warn!(
            clients = handle.connections(),
            "drain timed out: exiting with clients still attached"
        );
        std::process::exit(0);
    }
    drop(server);
    tracing::info!("stokerd stopped");
    ExitCode::SUCCESS
}

fn server_config(args: &Args, file: &Config, socket: PathBuf) -> ServerConfig {
    ServerConfig {
        socket,
        slots: args.slots.unwrap_or(file.server.slots_per_rank),
        engine: EngineConfig {
            threads: args.threads.unwrap_or(file.pipeline.threads),
            reader: match file.pipeline.reader {
                ReaderChoice::Auto => ReaderKind::Auto,
                ReaderChoice::IoUring => ReaderKind::IoUring,
                ReaderChoice::Pread => ReaderKind::Pread,
            },
            policy: file.pipeline.bad_samples,
            limits: Limits {
                max_pixels: file.limits.max_pixels,
                max_file_bytes: file.limits.max_file_bytes,
            },
            bad_log_per_second: file.limits.log_bad_samples_per_second,
            throttle: None,
        },
        access: AccessPolicy::new(&file.access, &file.datasets),
        quotas: QuotaLimits::from(&file.limits),
        socket_mode: args.socket_mode.unwrap_or(file.server.socket_mode),
        socket_group: file.server.socket_group.clone(),
        lobby: file.limits.lobby(),
        walk: file.limits.walk(),
    }
}

/// SIGHUP: reads the config again and applies what can change while serving (registered
/// datasets and the access rules). A bad file is logged and the running config kept.
fn reload(path: Option<&Path>, handle: &ServerHandle, notifier: &Notifier) {
    let Some(path) = path else {
        tracing::info!("SIGHUP: no config file to reload");
        return;
    };
    notifier.notify(&format!(
        "RELOADING=1\nMONOTONIC_USEC={}",
        systemd::monotonic_usec()
    ));
    match Config::load(path) {
        Ok(c) => {
            let names: Vec<&String> = c.datasets.keys().collect();
            tracing::info!(config = %path.display(), datasets = ?names, "config reloaded");
            handle.set_access(AccessPolicy::new(&c.access, &c.datasets));
            stoker_daemon::s3::configure(&c.s3, &c.datasets);
            metrics::counter!(stoker_daemon::metrics::RELOADS_TOTAL, "result" => "ok").increment(1);
            tracing::info!(
                "access rules and datasets apply to new attaches now; limits, pipeline and server \
                 settings after a restart"
            );
        }
        Err(e) => {
            tracing::error!(error = %e, "config reload failed: keeping the running config");
            metrics::counter!(stoker_daemon::metrics::RELOADS_TOTAL, "result" => "error")
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
