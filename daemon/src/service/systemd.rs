//! The small parts of systemd's service protocol `stokerd` speaks, without libsystemd:
//! readiness and status notification (`sd_notify`), the watchdog, socket activation
//! (`sd_listen_fds`), and the signals systemd sends (SIGTERM to stop, SIGHUP to reload).
//!
//! # Design
//! - [`Notifier`] sends one datagram per state change to `$NOTIFY_SOCKET`, a path or an
//!   abstract socket written `@name`. Without the variable it does nothing, so the daemon runs
//!   the same way by hand.
//! - [`listen_fd`] takes fd 3 when `$LISTEN_PID` is this process and checks it is what the
//!   socket unit promises (a listening AF_UNIX SOCK_SEQPACKET socket) before serving on it.
//! - [`Signals`] blocks SIGTERM, SIGINT and SIGHUP in the calling thread before any other
//!   thread exists, so every thread inherits the mask and one thread takes them with
//!   `sigwait`: no async handler, no self-pipe.
//!
//! # Limitations
//! - Only one activated socket is served; extra ones are logged and closed.

use std::ffi::OsString;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

use rustix::net::{AddressFamily, SendFlags, SocketAddrUnix, SocketFlags, SocketType};

use crate::serve::{check_seqpacket_listener, ListenerError};

/// The first fd systemd passes (`SD_LISTEN_FDS_START`).
pub(crate) const LISTEN_FDS_START: RawFd = 3;

/// Why the systemd environment could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    /// `$NOTIFY_SOCKET` names no path or abstract address a datagram can be sent to.
    #[error("$NOTIFY_SOCKET {0:?} is not a usable socket address")]
    NotifyAddress(OsString),
    /// The datagram socket for sd_notify could not be made.
    #[error("cannot create the notification socket: {0}")]
    NotifySocket(std::io::Error),
    /// A variable systemd sets to a number (`$WATCHDOG_USEC`, `$LISTEN_PID`, ...) is not one.
    #[error("${name} is {value:?}, not a number")]
    Number {
        /// The variable's name, without `$`.
        name: &'static str,
        /// Its value as set.
        value: String,
    },
    /// The socket systemd passed is not one the daemon can serve on.
    #[error("the activated fd 3 is not a listening unix SOCK_SEQPACKET socket ({0})")]
    NotSeqPacketListener(ListenerError),
    /// pthread_sigmask failed.
    #[error("cannot block signals: {0}")]
    SignalMask(std::io::Error),
}

/// Sends `sd_notify` datagrams to `$NOTIFY_SOCKET`.
pub(crate) struct Notifier {
    /// The socket and the address to send to; `None` when not run by systemd.
    target: Option<(OwnedFd, SocketAddrUnix)>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET`. Without it, [`Notifier::notify`] does nothing.
    pub(crate) fn from_env() -> Result<Notifier, SystemdError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(Notifier { target: None });
        };
        let addr = notify_address(&path)?;
        let fd = rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| SystemdError::NotifySocket(e.into()))?;
        Ok(Notifier {
            target: Some((fd, addr)),
        })
    }

    /// A notifier that sends nothing.
    pub(crate) fn disabled() -> Notifier {
        Notifier { target: None }
    }

    /// Sends `state` (newline-separated `KEY=value` lines). Failures are logged, not fatal:
    /// systemd going away must not stop the daemon.
    pub(crate) fn notify(&self, state: &str) {
        let Some((fd, addr)) = &self.target else {
            return;
        };
        let sent = rustix::net::sendto(fd, state.as_bytes(), SendFlags::NOSIGNAL, addr);
        if let Err(e) = sent {
            tracing::warn!(error = %std::io::Error::from(e), state, "sd_notify failed");
        }
    }
}

/// `sizeof(sockaddr_un.sun_path)` on Linux.
const SUN_PATH_LEN: usize = 108;

/// `/path` or `@abstract` → a unix socket address.
fn notify_address(path: &OsString) -> Result<SocketAddrUnix, SystemdError> {
    let bytes = path.as_bytes();
    let bad = || SystemdError::NotifyAddress(path.clone());
    if bytes.len() < 2 || bytes.len() >= SUN_PATH_LEN || bytes[1..].contains(&0) {
        return Err(bad());
    }
    match bytes[0] {
        b'/' => SocketAddrUnix::new(bytes).map_err(|_| bad()),
        // An abstract name starts with NUL and is exactly as long as given, no terminator.
        b'@' => SocketAddrUnix::new_abstract_name(&bytes[1..]).map_err(|_| bad()),
        _ => Err(bad()),
    }
}

/// The watchdog interval systemd expects pings within (`$WATCHDOG_USEC`), when it applies
/// to this process (`$WATCHDOG_PID` unset or ours).
pub(crate) fn watchdog_interval() -> Result<Option<Duration>, SystemdError> {
    let Some(usec) = env_number("WATCHDOG_USEC")? else {
        return Ok(None);
    };
    if let Some(pid) = env_number("WATCHDOG_PID")? {
        if pid != u64::from(std::process::id()) {
            return Ok(None);
        }
    }
    Ok((usec > 0).then(|| Duration::from_micros(usec)))
}

fn env_number(name: &'static str) -> Result<Option<u64>, SystemdError> {
    match std::env::var(name) {
        Ok(v) => v
            .trim()
            .parse()
            .map(Some)
            .map_err(|_| SystemdError::Number { name, value: v }),
        Err(_) => Ok(None),
    }
}

/// The listening socket systemd passed (socket activation), if `$LISTEN_PID` is this process.
/// Removes the `LISTEN_*` variables, as `sd_listen_fds(1)` does; call it before starting
/// threads. Returns the fd and its name from `$LISTEN_FDNAMES`.
pub(crate) fn listen_fd() -> Result<Option<(OwnedFd, String)>, SystemdError> {
    let pid = env_number("LISTEN_PID")?;
    let count = env_number("LISTEN_FDS")?;
    let names = std::env::var("LISTEN_FDNAMES").unwrap_or_default();
    for v in ["LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"] {
        std::env::remove_var(v);
    }
    let (Some(pid), Some(count)) = (pid, count) else {
        return Ok(None);
    };
    if pid != u64::from(std::process::id()) || count == 0 {
        return Ok(None);
    }
    let names: Vec<&str> = names.split(':').collect();
    let mut fds = Vec::new();
    let end = RawFd::try_from(count)
        .ok()
        .and_then(|c| LISTEN_FDS_START.checked_add(c))
        .ok_or_else(|| SystemdError::Number {
            name: "LISTEN_FDS",
            value: count.to_string(),
        })?;
    for raw in LISTEN_FDS_START..end {
        // SAFETY: the borrow lasts for one fcntl(F_GETFD), which only reads the descriptor's
        // flags and fails with EBADF if `raw` is not open.
        let borrowed = unsafe { BorrowedFd::borrow_raw(raw) };
        if rustix::io::fcntl_getfd(borrowed).is_err() {
            return Err(SystemdError::NotSeqPacketListener(ListenerError::NotOpen {
                fd: raw,
                count,
            }));
        }
        // SAFETY: systemd passed fds 3..3+count to this process for it to own, fd `raw` is
        // open (checked above) and is taken into an OwnedFd exactly once here.
        fds.push(unsafe { OwnedFd::from_raw_fd(raw) });
    }
    let mut fds = fds.into_iter();
    let fd = fds.next().expect("count > 0");
    for (i, extra) in fds.enumerate() {
        tracing::warn!(
            fd = extra.as_raw_fd(),
            name = names.get(i + 1).copied().unwrap_or(""),
            "ignoring an extra activated socket"
        );
    }
    set_cloexec(&fd);
    check_seqpacket_listener(&fd).map_err(SystemdError::NotSeqPacketListener)?;
    Ok(Some((fd, names.first().copied().unwrap_or("").to_owned())))
}

fn set_cloexec(fd: &OwnedFd) {
    // A descriptor whose flags cannot be read or set keeps them; the daemon execs nothing.
    if let Ok(flags) = rustix::io::fcntl_getfd(fd) {
        let _ = rustix::io::fcntl_setfd(fd, flags | rustix::io::FdFlags::CLOEXEC);
    }
}

/// The path a unix listening socket is bound to, if it has one.
pub(crate) fn socket_path(fd: &OwnedFd) -> Option<std::path::PathBuf> {
    let addr = rustix::net::getsockname(fd).ok()?;
    let addr = SocketAddrUnix::try_from(addr).ok()?;
    let path = addr.path()?;
    Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
        path.to_bytes(),
    )))
}

/// CLOCK_MONOTONIC in microseconds, for `RELOADING=1` / `MONOTONIC_USEC=`.
pub(crate) fn monotonic_usec() -> u64 {
    let ts = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    // The monotonic clock is never negative.
    let (sec, nsec) = (
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u64::try_from(ts.tv_nsec).unwrap_or(0),
    );
    sec * 1_000_000 + nsec / 1000
}

/// The signals the daemon acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Signal {
    /// SIGTERM or SIGINT: drain and exit.
    Terminate,
    /// SIGHUP: reload the config.
    Reload,
}

/// SIGTERM, SIGINT and SIGHUP, blocked in every thread and taken by [`Signals::wait`].
///
/// rustix has no signal masks or `sigwait` outside its experimental `runtime` feature: libc
/// it stays here.
pub struct Signals {
    set: libc::sigset_t,
}

impl Signals {
    /// Blocks the signals in the calling thread. Call it before starting any thread, so
    /// that they all inherit the mask.
    pub fn block() -> Result<Signals, SystemdError> {
        // SAFETY: sigset_t is plain old data, initialised by sigemptyset before use; the
        // mask change affects this thread only.
        unsafe {
            let mut set: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut set);
            libc::sigaddset(&mut set, libc::SIGTERM);
            libc::sigaddset(&mut set, libc::SIGINT);
            libc::sigaddset(&mut set, libc::SIGHUP);
            let rc = libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut());
            if rc != 0 {
                return Err(SystemdError::SignalMask(std::io::Error::from_raw_os_error(
                    rc,
                )));
            }
            Ok(Signals { set })
        }
    }

    /// Waits for the next signal.
    pub(crate) fn wait(&self) -> Signal {
        loop {
            let mut sig: libc::c_int = 0;
            // SAFETY: `self.set` is an initialised sigset; `sig` is valid for writes.
            let rc = unsafe { libc::sigwait(&self.set, &mut sig) };
            if rc != 0 {
                continue;
            }
            match sig {
                libc::SIGHUP => return Signal::Reload,
                libc::SIGTERM | libc::SIGINT => return Signal::Terminate,
                _ => continue,
            }
        }
    }
}

impl std::fmt::Debug for Signals {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // The set is always the same three; libc's sigset_t has no Debug.
        f.debug_struct("Signals")
            .field("blocked", &["SIGTERM", "SIGINT", "SIGHUP"])
            .finish_non_exhaustive()
    }
}

// SAFETY: a sigset_t is plain data; sigwait only reads it.
unsafe impl Send for Signals {}
// SAFETY: as above.
unsafe impl Sync for Signals {}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )]

    use super::*;

    fn datagram_socket() -> OwnedFd {
        rustix::net::socket_with(
            AddressFamily::UNIX,
            SocketType::DGRAM,
            SocketFlags::CLOEXEC,
            None,
        )
        .unwrap()
    }

    #[test]
    fn notify_addresses_parse() {
        let addr = notify_address(&OsString::from("@stoker/notify")).unwrap();
        assert_eq!(addr.abstract_name(), Some(&b"stoker/notify"[..]));
        let addr = notify_address(&OsString::from("/run/systemd/notify")).unwrap();
        assert_eq!(addr.path().unwrap().to_bytes(), b"/run/systemd/notify");
        assert!(notify_address(&OsString::from("relative")).is_err());
        assert!(notify_address(&OsString::from("@")).is_err());
        assert!(notify_address(&OsString::from(format!("/{}", "x".repeat(107)))).is_err());
    }

    #[test]
    fn notifier_sends_to_an_abstract_socket() {
        let name = format!("@stoker-test-notify-{}", std::process::id());
        let addr = notify_address(&OsString::from(&name)).unwrap();
        let fd = datagram_socket();
        rustix::net::bind(&fd, &addr).unwrap();
        let n = Notifier {
            target: Notifier::from_env_path(&name).unwrap().target,
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        let (got, _) =
            rustix::net::recv(&fd, &mut buf[..], rustix::net::RecvFlags::empty()).unwrap();
        assert_eq!(&buf[..got], b"READY=1");
    }

    impl Notifier {
        fn from_env_path(path: &str) -> Result<Notifier, SystemdError> {
            let addr = notify_address(&OsString::from(path))?;
            Ok(Notifier {
                target: Some((datagram_socket(), addr)),
            })
        }
    }

    #[test]
    fn a_seqpacket_listener_passes_the_check_and_a_datagram_socket_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let l = stoker_wire::socket::SeqPacketListener::bind(&dir.path().join("s")).unwrap();
        let fd: OwnedFd = l.as_fd_owned();
        check_seqpacket_listener(&fd).unwrap();
        let d = datagram_socket();
        assert!(check_seqpacket_listener(&d)
            .unwrap_err()
            .to_string()
            .contains("SOCK_SEQPACKET"));
    }

    trait DupFd {
        fn as_fd_owned(&self) -> OwnedFd;
    }
    impl DupFd for stoker_wire::socket::SeqPacketListener {
        fn as_fd_owned(&self) -> OwnedFd {
            use std::os::fd::AsFd;
            self.as_fd().try_clone_to_owned().unwrap()
        }
    }
}
