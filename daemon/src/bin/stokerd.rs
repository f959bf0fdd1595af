//! `stokerd`: the stoker daemon. Parses flags and the config file, sets up logging, serves,
//! and maps the top-level error to an exit code: configuration errors exit with 78
//! (EX_CONFIG) so that systemd's `RestartPreventExitStatus=78` stops a restart loop.

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use stoker_daemon::access::{AccessPolicy, QuotaLimits};
use stoker_daemon::config::{Config, ReaderChoice, EXIT_CONFIG};
use stoker_daemon::decode::Limits;
use stoker_daemon::pipeline::EngineConfig;
use stoker_daemon::reader::ReaderKind;
use stoker_daemon::server::{Server, ServerConfig};

/// Exit code for failures at run time.
const EXIT_FAILURE: u8 = 1;

/// Serve decoded, augmented training batches to local processes over a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "stokerd", version)]
struct Args {
    /// Config file (TOML). Without it the defaults serve a single-user workstation.
    #[arg(long)]
    config: Option<PathBuf>,
    /// Socket to listen on. Default: server.socket from the config; else $STOKER_SOCKET; else
    /// /run/stoker/stoker.sock as root; else $XDG_RUNTIME_DIR/stoker.sock; else
    /// /tmp/stoker-<uid>.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Decode worker threads shared by every job (0: one per core). Overrides the config.
    #[arg(long)]
    threads: Option<usize>,
    /// Slots in each rank's ring (at least 2). Overrides the config.
    #[arg(long)]
    slots: Option<usize>,
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
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .with_writer(std::io::stderr)
        .init();
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
    let config = ServerConfig {
        socket: args.socket.unwrap_or_else(|| file.socket_path()),
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
        },
        access: AccessPolicy::new(&file.access, &file.datasets),
        quotas: QuotaLimits::from(&file.limits),
    };
    match Server::bind(config).and_then(|server| server.serve()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "stokerd stopped");
            eprintln!("stokerd: {e}");
            if e.is_config() {
                config_exit
            } else {
                ExitCode::from(EXIT_FAILURE)
            }
        }
    }
}
