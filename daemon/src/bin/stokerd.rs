//! `stokerd`: the stoker daemon. Parses flags, blocks signals, sets up logging, runs the
//! service ([`stoker_daemon::service::run`]) and maps its error to an exit code:
//! configuration errors exit with 78 (EX_CONFIG) so that systemd's
//! `RestartPreventExitStatus=78` stops a restart loop; other failures with 1.

#![forbid(unsafe_code)]

use std::process::ExitCode;

use clap::Parser;
use stoker_daemon::service::detach::{self, ReadyNotice, Role};
use stoker_daemon::service::systemd::Signals;
use stoker_daemon::service::{self, StokerdArgs};
use stoker_wire::exit::Exit;

fn main() -> ExitCode {
    let args = match StokerdArgs::try_parse() {
        Ok(a) => a,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() {
                ExitCode::from(Exit::Config)
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Still one thread: the only moment a fork is safe.
    let ready = if args.detach {
        let log = args.detached_log();
        eprintln!("stokerd: detaching; it logs to {}", log.display());
        match detach::detach(&log) {
            Ok(Role::Parent(code)) => return code,
            Ok(Role::Daemon(notice)) => notice,
            Err(e) => {
                eprintln!("stokerd: {e}");
                return ExitCode::from(Exit::Failure);
            }
        }
    } else {
        ReadyNotice::none()
    };
    // Before any thread exists, so every thread inherits the mask and only the signal
    // thread takes SIGTERM / SIGHUP.
    let signals = match Signals::block() {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stokerd: {e}");
            return ExitCode::from(Exit::Failure);
        }
    };
    stoker_daemon::service::logging::init_daemon();
    tracing::info!(
        version = stoker_wire::protocol::VERSION,
        protocol = stoker_wire::protocol::PROTOCOL_VERSION,
        "stokerd starting"
    );
    match service::run(&args, signals, ready) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!(error = %e, config = e.is_config(), "stokerd stopped");
            eprintln!("stokerd: {e}");
            ExitCode::from(e.exit_code())
        }
    }
}
