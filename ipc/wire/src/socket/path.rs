//! Which socket a daemon listens on and a client connects to unless told otherwise.
//! docs/operations.md ("Which socket") states the rule; this is its one implementation.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use super::SeqPacket;

/// Environment variable naming the daemon's socket.
pub const SOCKET_ENV: &str = "STOKER_SOCKET";
/// Environment variable (`1`) asking for this user's own daemon even where the system
/// daemon's socket exists: the explicit ask that lets a client whom the system socket
/// refuses start a private daemon instead.
pub(crate) const PRIVATE_DAEMON_ENV: &str = "STOKER_PRIVATE_DAEMON";
/// The system daemon's socket (a daemon running as root, e.g. under systemd).
pub(crate) const SYSTEM_SOCKET: &str = "/run/stoker/stoker.sock";

/// The folder of this user's own daemon (socket, start lock, log):
/// `$XDG_RUNTIME_DIR/stoker`, else `/tmp/stoker-<uid>`. Whoever creates it makes it mode 0700.
pub(crate) fn user_daemon_dir() -> PathBuf {
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
    /// The system daemon's socket, which exists but refuses this user (its file's mode and
    /// group): connecting there fails with [`explain_refusal`]; nothing is started.
    SystemRefused = 3,
}

/// Where a client connects unless told otherwise: `$STOKER_SOCKET` if set; else
/// [`SYSTEM_SOCKET`] when a daemon answers there (a system daemon serves the whole host) or
/// when it exists but refuses this user (who is told so, loudly, when connecting), unless
/// `$STOKER_PRIVATE_DAEMON=1`; else [`user_socket_path`] (the Python package starts a
/// daemon there when none answers).
pub fn client_socket_path() -> PathBuf {
    resolve_client_socket().0
}

/// [`client_socket_path`] and where it came from.
pub fn resolve_client_socket() -> (PathBuf, SocketSource) {
    let private = std::env::var_os(PRIVATE_DAEMON_ENV).is_some_and(|v| v == "1");
    resolve_client_socket_with(
        std::env::var_os(SOCKET_ENV),
        private,
        Path::new(SYSTEM_SOCKET),
    )
}

/// The client rule, given `$STOKER_SOCKET`, `$STOKER_PRIVATE_DAEMON` and the system socket
/// (tests put it elsewhere).
fn resolve_client_socket_with(
    env: Option<std::ffi::OsString>,
    private: bool,
    system: &Path,
) -> (PathBuf, SocketSource) {
    if let Some(p) = env.filter(|p| !p.is_empty()) {
        return (PathBuf::from(p), SocketSource::Env);
    }
    if private {
        return (user_socket_path(), SocketSource::User);
    }
    match SeqPacket::connect(system) {
        Ok(_) => (system.to_path_buf(), SocketSource::System),
        Err(e) if is_refusal(e.raw_os_error()) => {
            (system.to_path_buf(), SocketSource::SystemRefused)
        }
        Err(_) => (user_socket_path(), SocketSource::User),
    }
}

/// Whether a failed `connect` means the socket exists but this user may not use it (its
/// file's or folder's permissions), rather than that no daemon is there.
pub fn is_refusal(errno: Option<i32>) -> bool {
    matches!(errno, Some(libc::EACCES) | Some(libc::EPERM))
}

/// Why `socket` refuses this process, for the message of a refused `connect`: the file's
/// mode, owner and group, this process's uid and groups, and what to do. Names the
/// `$STOKER_PRIVATE_DAEMON` way out, never takes it.
pub fn explain_refusal(socket: &Path) -> String {
    use std::os::unix::fs::MetadataExt;
    let uid = rustix::process::getuid().as_raw();
    let supplementary: Vec<u32> = rustix::process::getgroups()
        .unwrap_or_default()
        .iter()
        .map(|g| g.as_raw())
        .collect();
    let mine = distinct_groups(rustix::process::getgid().as_raw(), &supplementary);
    let named = |g: u32| match super::groups::name_of(g) {
        Some(n) => format!("{g} ({n})"),
        None => g.to_string(),
    };
    let groups: Vec<String> = mine.iter().map(|&g| named(g)).collect();
    let file = match std::fs::metadata(socket) {
        Ok(m) => format!(
            "it is mode {:04o}, owner uid {}, group {}",
            m.mode() & 0o7777,
            m.uid(),
            named(m.gid())
        ),
        Err(e) => format!("its folder may not be entered ({e})"),
    };
    let group = std::fs::metadata(socket)
        .ok()
        .map(|m| super::groups::name_of(m.gid()).unwrap_or_else(|| m.gid().to_string()));
    let ask = match group {
        Some(g) => {
            format!("ask the administrator to add this user to the group {g} (then log in again)")
        }
        None => "ask the administrator for access".to_owned(),
    };
    format!(
        "the socket refuses this user (uid {uid}, groups [{}]): {file}; {ask}, or set \
         {PRIVATE_DAEMON_ENV}=1 to use a daemon of this user's own instead \
         (docs/operations.md, \"Which socket\")",
        groups.join(", ")
    )
}

/// This process's groups for a message, each once: the primary group first, then the
/// supplementary ones in their order (the kernel's list often holds the primary one again).
fn distinct_groups(primary: u32, supplementary: &[u32]) -> Vec<u32> {
    let mut out = vec![primary];
    for &g in supplementary {
        if !out.contains(&g) {
            out.push(g);
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::socket::SeqPacketListener;

    /// Issue 43 item 8: the refusal named a group twice ("groups [1000, 4, 24, 1000]"): the
    /// primary group put first was only dropped where it came next.
    #[test]
    fn a_refusal_names_each_group_once() {
        assert_eq!(distinct_groups(1000, &[4, 24, 1000, 27]), [1000, 4, 24, 27]);
        assert_eq!(distinct_groups(0, &[0]), [0]);
        assert_eq!(distinct_groups(5, &[]), [5]);
        assert_eq!(distinct_groups(5, &[7, 7]), [5, 7]);
    }

    #[test]
    fn a_client_takes_the_env_then_an_answering_system_daemon_then_its_own() {
        let dir = tempfile::tempdir().unwrap();
        let system = dir.path().join("system.sock");
        assert_eq!(
            resolve_client_socket_with(None, false, &system),
            (user_socket_path(), SocketSource::User)
        );
        let _listener = SeqPacketListener::bind(&system).unwrap();
        assert_eq!(
            resolve_client_socket_with(Some("".into()), false, &system),
            (system.clone(), SocketSource::System)
        );
        assert_eq!(
            resolve_client_socket_with(None, true, &system),
            (user_socket_path(), SocketSource::User),
            "asked for this user's own daemon"
        );
        let mine = dir.path().join("mine.sock");
        assert_eq!(
            resolve_client_socket_with(Some(mine.clone().into()), true, &system),
            (mine, SocketSource::Env)
        );
    }
}
