//! Which socket a daemon listens on and a client connects to unless told otherwise.
//! `docs/python.md` states the rule for users.

use std::path::{Path, PathBuf};

use super::SeqPacket;

/// Environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "STOKER_SOCKET";
/// The system daemon's socket (a daemon running as root, e.g. under systemd).
pub const SYSTEM_SOCKET: &str = "/run/stoker/stoker.sock";

/// The folder of this user's own daemon (socket, start lock, log):
/// `$XDG_RUNTIME_DIR/stoker`, else `/tmp/stoker-<uid>`. Whoever creates it makes it mode 0700.
pub fn user_daemon_dir() -> PathBuf {
    match std::env::var_os("XDG_RUNTIME_DIR").filter(|p| !p.is_empty()) {
        Some(dir) => PathBuf::from(dir).join("stoker"),
        None => {
            // SAFETY: getuid has no preconditions and cannot fail.
            let uid = unsafe { libc::getuid() };
            PathBuf::from(format!("/tmp/stoker-{uid}"))
        }
    }
}

/// The socket of this user's own daemon: `stoker.sock` in [`user_daemon_dir`].
pub fn user_socket_path() -> PathBuf {
    user_daemon_dir().join("stoker.sock")
}

/// Where the daemon listens unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] for root; else [`user_socket_path`]. The daemon's config
/// (`stoker_daemon::config::default_socket_path`) is this.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    // SAFETY: getuid has no preconditions and cannot fail.
    let uid = unsafe { libc::getuid() };
    if uid == 0 {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_path()
}

/// Where a client connects unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] when a daemon answers there (a system daemon serves the whole host);
/// else [`user_socket_path`] (the Python package starts a daemon there when none answers).
pub fn client_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if SeqPacket::connect(Path::new(SYSTEM_SOCKET)).is_ok() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_path()
}
