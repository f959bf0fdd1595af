//! `stoker stop`: stops the daemon at a socket (this user's own by default) and waits until it
//! is gone.
//!
//! # Design
//! - The daemon is found as `stoker status` finds it (the same socket rule, the same trust
//!   check on the peer), asked for its pid (its STATUS answer), and sent SIGTERM: its own
//!   drain runs (attached clients get their announced batches, then it exits 0), as under
//!   `systemctl stop`. Only a user with the rights to signal it can stop it: the kernel's
//!   rule, reported with the daemon's owner.
//! - The command returns once the process is gone (or a zombie of its parent), so a script
//!   can start another daemon with other flags right after it.
//!
//! # Limitations
//! - A daemon under systemd's socket activation is started again by the next client; stop the
//!   unit (`systemctl stop stokerd.socket stokerd`) for good.

#![forbid(unsafe_code)]

use std::path::PathBuf;
use std::time::{Duration, Instant};

use clap::Args;
use rustix::process::{kill_process, test_kill_process, Pid, Signal};

use super::status::query;
use super::Exit;

/// Arguments of `stoker stop`.
#[derive(Debug, Args)]
pub struct StopArgs {
    /// The daemon's socket. Default: as `stoker status` finds it ($STOKER_SOCKET, else the
    /// system daemon's if one answers, else this user's own).
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    /// Seconds to wait for the daemon to drain and exit.
    #[arg(long, default_value_t = 60)]
    pub(crate) timeout_s: u64,
}

/// How often the process is looked for while it drains.
const POLL: Duration = Duration::from_millis(20);

/// Runs `stoker stop`.
pub fn run(args: &StopArgs) -> Exit {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(stoker_wire::client_socket_path);
    let status = match query(&socket) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("stoker stop: {e}");
            return Exit::NoDaemon;
        }
    };
    let Some(pid) = i32::try_from(status.pid).ok().and_then(Pid::from_raw) else {
        eprintln!(
            "stoker stop: the daemon at {} gave pid {}, which is no process",
            socket.display(),
            status.pid
        );
        return Exit::Failure;
    };
    if let Err(e) = kill_process(pid, Signal::TERM) {
        let owner = std::fs::metadata(format!("/proc/{}", status.pid))
            .map(|m| std::os::unix::fs::MetadataExt::uid(&m).to_string())
            .unwrap_or_else(|_| "unknown".into());
        eprintln!(
            "stoker stop: cannot signal stokerd (pid {}, uid {owner}) at {}: {e}; only its \
             owner or root may stop it (the system daemon: `systemctl stop stokerd`)",
            status.pid,
            socket.display()
        );
        return Exit::Failure;
    }
    let deadline = Instant::now() + Duration::from_secs(args.timeout_s);
    while running(pid) {
        if Instant::now() >= deadline {
            eprintln!(
                "stoker stop: stokerd (pid {}) at {} is still draining after {} s ({} clients \
                 attached when asked)",
                status.pid,
                socket.display(),
                args.timeout_s,
                status.clients
            );
            return Exit::Failure;
        }
        std::thread::sleep(POLL);
    }
    eprintln!(
        "stoker stop: stopped stokerd (pid {}) at {}",
        status.pid,
        socket.display()
    );
    Exit::Ok
}

/// Whether `pid` is a live process: not gone, and not a zombie waiting for its parent.
fn running(pid: Pid) -> bool {
    if test_kill_process(pid).is_err() {
        return false;
    }
    let stat =
        std::fs::read_to_string(format!("/proc/{}/stat", pid.as_raw_nonzero())).unwrap_or_default();
    // The state follows the command name, which is in parentheses and may hold spaces.
    let state = stat
        .rfind(')')
        .and_then(|i| stat[i + 1..].split_whitespace().next());
    !matches!(state, Some("Z" | "X") | None)
}
