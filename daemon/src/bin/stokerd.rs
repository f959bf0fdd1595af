//! `stokerd`: the stoker daemon. Parses flags, sets up logging, serves, and maps the
//! top-level error to an exit code (configuration errors exit with 78, EX_CONFIG, so that
//! systemd's `RestartPreventExitStatus=78` stops a restart loop).

use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use stoker_daemon::pipeline::{EngineConfig, DEFAULT_SLOTS};
use stoker_daemon::server::{Server, ServerConfig};

/// Exit code for configuration errors (sysexits.h EX_CONFIG).
const EXIT_CONFIG: u8 = 78;
/// Exit code for failures at run time.
const EXIT_FAILURE: u8 = 1;

/// Serve decoded, augmented training batches to local processes over a Unix socket.
#[derive(Debug, Parser)]
#[command(name = "stokerd", version)]
struct Args {
    /// Socket to listen on. Default: $STOKER_SOCKET; else /run/stoker/stoker.sock as root;
    /// else $XDG_RUNTIME_DIR/stoker.sock; else /tmp/stoker-<uid>/stoker.sock.
    #[arg(long)]
    socket: Option<PathBuf>,
    /// Decode worker threads shared by every job (0: one per core).
    #[arg(long, default_value_t = 0)]
    threads: usize,
    /// Slots in each rank's ring (at least 2).
    #[arg(long, default_value_t = DEFAULT_SLOTS)]
    slots: usize,
}

fn main() -> ExitCode {
    let args = match Args::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(EXIT_CONFIG)
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
    let config = ServerConfig {
        socket: args.socket.unwrap_or_else(stoker::default_socket_path),
        slots: args.slots,
        engine: EngineConfig {
            threads: args.threads,
            ..EngineConfig::default()
        },
    };
    let result = Server::bind(config).and_then(|server| server.serve());
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, "stokerd stopped");
            eprintln!("stokerd: {e}");
            ExitCode::from(if e.is_config() {
                EXIT_CONFIG
            } else {
                EXIT_FAILURE
            })
        }
    }
}
