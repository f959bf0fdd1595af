//! Which socket a daemon listens on and a client connects to unless told otherwise.
//! docs/operations.md ("Which socket") states the rule; this is its one implementation.

#![forbid(unsafe_code)]

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
            let uid = rustix::process::getuid().as_raw();
            PathBuf::from(format!("/tmp/stoker-{uid}"))
        }
    }
}

/// The socket of this user's own daemon: `stoker.sock` in [`user_daemon_dir`].
pub fn user_socket_path() -> PathBuf {
    user_daemon_dir().join("stoker.sock")
}

/// What a message about an unreachable socket adds when `$STOKER_SOCKET` named it, so that a
/// stale variable (left from another job, a container's environment) is seen as the cause.
pub fn socket_env_note(socket: &Path) -> String {
    match std::env::var_os(SOCKET_ENV) {
        Some(p) if !p.is_empty() && Path::new(&p) == socket => {
            format!(" (named by ${SOCKET_ENV}: unset it, or point it at a running daemon's socket)")
        }
        _ => String::new(),
    }
}

/// Where the daemon listens unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] for root; else [`user_socket_path`]. The daemon's config
/// (`stoker_daemon::service::config::default_socket_path`) is this.
pub fn default_socket_path() -> PathBuf {
    if let Some(p) = std::env::var_os(SOCKET_ENV).filter(|p| !p.is_empty()) {
        return PathBuf::from(p);
    }
    if rustix::process::getuid().is_root() {
        return PathBuf::from(SYSTEM_SOCKET);
    }
    user_socket_path()
}

/// Where a client's socket came from: what decides whether it may start a daemon there.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(i32)]
pub enum SocketSource {
    /// `$STOKER_SOCKET`: used as given.
    Env = 0,
    /// The system daemon's socket, where a daemon answered.
    System = 1,
    /// This user's own socket (where the Python package starts a daemon if none answers).
    User = 2,
}

/// Where a client connects unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] when a daemon answers there (a system daemon serves the whole host);
/// else [`user_socket_path`] (the Python package starts a daemon there when none answers).
pub fn client_socket_path() -> PathBuf {
    resolve_client_socket().0
}

/// [`client_socket_path`] and where it came from.
pub fn resolve_client_socket() -> (PathBuf, SocketSource) {
    resolve_client_socket_with(std::env::var_os(SOCKET_ENV), Path::new(SYSTEM_SOCKET))
}

/// The client rule, given `$STOKER_SOCKET` and the system socket (tests put it elsewhere).
fn resolve_client_socket_with(
    env: Option<std::ffi::OsString>,
    system: &Path,
) -> (PathBuf, SocketSource) {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        return (PathBuf::from(p), SocketSource::Env);
    }
    if SeqPacket::connect(system).is_ok() {
        return (system.to_path_buf(), SocketSource::System);
    }
    (user_socket_path(), SocketSource::User)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::SeqPacketListener;

    #[test]
    fn a_client_takes_the_env_then_an_answering_system_daemon_then_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let system = dir.path().join("system.sock");
        assert_eq!(
            resolve_client_socket_with(None, &system),
            (user_socket_path(), SocketSource::User)
        );
        let _listener = SeqPacketListener::bind(&system).unwrap();
        assert_eq!(
            resolve_client_socket_with(Some("".into()), &system),
            (system.clone(), SocketSource::System)
        );
        let mine = dir.path().join("mine.sock");
        assert_eq!(
            resolve_client_socket_with(Some(mine.clone().into()), &system),
            (mine, SocketSource::Env)
        );
    }
}
