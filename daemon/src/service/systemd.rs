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
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::time::Duration;

/// The first fd systemd passes (`SD_LISTEN_FDS_START`).
pub const LISTEN_FDS_START: RawFd = 3;

/// Why the systemd environment could not be used.
#[derive(Debug, thiserror::Error)]
pub enum SystemdError {
    #[error("$NOTIFY_SOCKET {0:?} is not a usable socket address")]
    NotifyAddress(OsString),
    #[error("cannot create the notification socket: {0}")]
    NotifySocket(std::io::Error),
    #[error("${name} is {value:?}, not a number")]
    Number { name: &'static str, value: String },
    #[error("the activated fd 3 is not a listening unix SOCK_SEQPACKET socket ({0})")]
    NotSeqPacketListener(ListenerError),
    #[error("cannot block signals: {0}")]
    SignalMask(std::io::Error),
}

/// Sends `sd_notify` datagrams to `$NOTIFY_SOCKET`.
pub struct Notifier {
    /// The socket and the address to send to; `None` when not run by systemd.
    target: Option<(OwnedFd, libc::sockaddr_un, libc::socklen_t)>,
}

impl Notifier {
    /// Reads `$NOTIFY_SOCKET`. Without it, [`Notifier::notify`] does nothing.
    pub fn from_env() -> Result<Notifier, SystemdError> {
        let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
            return Ok(Notifier { target: None });
        };
        let (addr, len) = notify_address(&path)?;
        // SAFETY: plain syscall; the result is checked and owned on the next line.
        let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
        if fd < 0 {
            return Err(SystemdError::NotifySocket(std::io::Error::last_os_error()));
        }
        // SAFETY: `fd` was just returned by socket(2) and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Ok(Notifier {
            target: Some((fd, addr, len)),
        })
    }

    /// A notifier that sends nothing.
    pub fn disabled() -> Notifier {
        Notifier { target: None }
    }

    pub fn is_enabled(&self) -> bool {
        self.target.is_some()
    }

    /// Sends `state` (newline-separated `KEY=value` lines). Failures are logged, not fatal:
    /// systemd going away must not stop the daemon.
    pub fn notify(&self, state: &str) {
        let Some((fd, addr, len)) = &self.target else {
            return;
        };
        // SAFETY: `state` and `addr` are valid for the lengths given for the whole call.
        let rc = unsafe {
            libc::sendto(
                fd.as_raw_fd(),
                state.as_ptr().cast(),
                state.len(),
                libc::MSG_NOSIGNAL,
                (addr as *const libc::sockaddr_un).cast(),
                *len,
            )
        };
        if rc < 0 {
            tracing::warn!(error = %std::io::Error::last_os_error(), state, "sd_notify failed");
        }
    }
}

/// `/path` or `@abstract` → a sockaddr_un.
fn notify_address(path: &OsString) -> Result<(libc::sockaddr_un, libc::socklen_t), SystemdError> {
    let bytes = path.as_bytes();
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // AF_UNIX is 1.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let family = libc::AF_UNIX as libc::sa_family_t;
    addr.sun_family = family;
    let bad = || SystemdError::NotifyAddress(path.clone());
    if bytes.len() < 2 || bytes.len() >= addr.sun_path.len() || bytes[1..].contains(&0) {
        return Err(bad());
    }
    let abstract_ns = match bytes[0] {
        b'/' => false,
        b'@' => true,
        _ => return Err(bad()),
    };
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    let base = std::mem::size_of::<libc::sa_family_t>();
    let len = if abstract_ns {
        // An abstract name starts with NUL and is exactly as long as given, no terminator.
        addr.sun_path[0] = 0;
        base + bytes.len()
    } else {
        base + bytes.len() + 1
    };
    Ok((addr, libc::socklen_t::try_from(len).map_err(|_| bad())?))
}

/// The watchdog interval systemd expects pings within (`$WATCHDOG_USEC`), when it applies
/// to this process (`$WATCHDOG_PID` unset or ours).
pub fn watchdog_interval() -> Result<Option<Duration>, SystemdError> {
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
pub fn listen_fd() -> Result<Option<(OwnedFd, String)>, SystemdError> {
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
        // SAFETY: F_GETFD only reads the descriptor's flags; it fails with EBADF if closed.
        if unsafe { libc::fcntl(raw, libc::F_GETFD) } < 0 {
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
    // SAFETY: fcntl on an fd we own; only the FD_CLOEXEC flag changes.
    unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFD);
        if flags >= 0 {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, flags | libc::FD_CLOEXEC);
        }
    }
}

/// The size of a kernel struct passed to a socket call, as the kernel takes it.
// The structs passed (c_int, sockaddr_un) are a few bytes.
#[allow(clippy::cast_possible_truncation)]
fn socklen_of<T>() -> libc::socklen_t {
    std::mem::size_of::<T>() as libc::socklen_t
}

/// Why a descriptor is not the listening socket stokerd serves on.
#[derive(Debug, thiserror::Error)]
pub enum ListenerError {
    #[error("fd {fd} of LISTEN_FDS={count} is not open")]
    NotOpen { fd: libc::c_int, count: u64 },
    #[error("{0}")]
    Sockopt(std::io::Error),
    #[error("domain {0}, not AF_UNIX")]
    Domain(libc::c_int),
    #[error("type {0}, not SOCK_SEQPACKET")]
    Type(libc::c_int),
    #[error("not listening")]
    NotListening,
}

fn sockopt_int(fd: &OwnedFd, opt: libc::c_int) -> Result<libc::c_int, ListenerError> {
    let mut v: libc::c_int = 0;
    let mut len = socklen_of::<libc::c_int>();
    // SAFETY: `v` and `len` are valid for writes of an int for the whole call.
    let rc = unsafe {
        libc::getsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&mut v as *mut libc::c_int).cast(),
            &mut len,
        )
    };
    if rc != 0 {
        return Err(ListenerError::Sockopt(std::io::Error::last_os_error()));
    }
    Ok(v)
}

/// Checks `fd` is an AF_UNIX SOCK_SEQPACKET socket in the listening state.
pub fn check_seqpacket_listener(fd: &OwnedFd) -> Result<(), ListenerError> {
    let domain = sockopt_int(fd, libc::SO_DOMAIN)?;
    let ty = sockopt_int(fd, libc::SO_TYPE)?;
    let listening = sockopt_int(fd, libc::SO_ACCEPTCONN)?;
    if domain != libc::AF_UNIX {
        return Err(ListenerError::Domain(domain));
    }
    if ty != libc::SOCK_SEQPACKET {
        return Err(ListenerError::Type(ty));
    }
    if listening == 0 {
        return Err(ListenerError::NotListening);
    }
    Ok(())
}

/// The path a unix listening socket is bound to, if it has one.
pub fn socket_path(fd: &OwnedFd) -> Option<std::path::PathBuf> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    let mut len = socklen_of::<libc::sockaddr_un>();
    // SAFETY: `addr` and `len` are valid for writes of a sockaddr_un for the whole call.
    let rc = unsafe {
        libc::getsockname(
            fd.as_raw_fd(),
            (&mut addr as *mut libc::sockaddr_un).cast(),
            &mut len,
        )
    };
    if rc != 0 || addr.sun_path[0] == 0 {
        return None;
    }
    let bytes: Vec<u8> = addr
        .sun_path
        .iter()
        .take_while(|&&c| c != 0)
        .map(|&c| c.to_ne_bytes()[0])
        .collect();
    Some(std::path::PathBuf::from(std::ffi::OsStr::from_bytes(
        &bytes,
    )))
}

/// CLOCK_MONOTONIC in microseconds, for `RELOADING=1` / `MONOTONIC_USEC=`.
pub fn monotonic_usec() -> u64 {
    // SAFETY: timespec is plain old data; clock_gettime writes it.
    let mut ts: libc::timespec = unsafe { std::mem::zeroed() };
    // SAFETY: `ts` is valid for writes; CLOCK_MONOTONIC always exists on Linux.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    // The monotonic clock is never negative.
    let (sec, nsec) = (
        u64::try_from(ts.tv_sec).unwrap_or(0),
        u64::try_from(ts.tv_nsec).unwrap_or(0),
    );
    sec * 1_000_000 + nsec / 1000
}

/// The signals the daemon acts on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// SIGTERM or SIGINT: drain and exit.
    Terminate,
    /// SIGHUP: reload the config.
    Reload,
}

/// SIGTERM, SIGINT and SIGHUP, blocked in every thread and taken by [`Signals::wait`].
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
    pub fn wait(&self) -> Signal {
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

    #[test]
    fn notify_addresses_parse() {
        let (addr, len) = notify_address(&OsString::from("@stoker/notify")).unwrap();
        assert_eq!(addr.sun_path[0], 0);
        assert_eq!(addr.sun_path[1], b's' as libc::c_char);
        assert_eq!(len as usize, 2 + "@stoker/notify".len());
        let (addr, len) = notify_address(&OsString::from("/run/systemd/notify")).unwrap();
        assert_eq!(addr.sun_path[0], b'/' as libc::c_char);
        assert_eq!(len as usize, 2 + "/run/systemd/notify".len() + 1);
        assert!(notify_address(&OsString::from("relative")).is_err());
        assert!(notify_address(&OsString::from("@")).is_err());
    }

    #[test]
    fn notifier_sends_to_an_abstract_socket() {
        let name = format!("@stoker-test-notify-{}", std::process::id());
        let (addr, len) = notify_address(&OsString::from(&name)).unwrap();
        // SAFETY: plain syscalls on a socket owned below; addr is valid for `len`.
        let fd = unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
            assert!(fd >= 0);
            let rc = libc::bind(fd, (&addr as *const libc::sockaddr_un).cast(), len);
            assert_eq!(rc, 0);
            OwnedFd::from_raw_fd(fd)
        };
        let n = Notifier {
            target: Notifier::from_env_path(&name).unwrap().target,
        };
        n.notify("READY=1");
        let mut buf = [0u8; 64];
        // SAFETY: buf is valid for writes of its length.
        let got = unsafe { libc::recv(fd.as_raw_fd(), buf.as_mut_ptr().cast(), buf.len(), 0) };
        assert_eq!(&buf[..got as usize], b"READY=1");
    }

    impl Notifier {
        fn from_env_path(path: &str) -> Result<Notifier, SystemdError> {
            let (addr, len) = notify_address(&OsString::from(path))?;
            // SAFETY: plain syscall, owned on the next line.
            let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
            // SAFETY: fresh fd, owned once.
            let fd = unsafe { OwnedFd::from_raw_fd(fd) };
            Ok(Notifier {
                target: Some((fd, addr, len)),
            })
        }
    }

    #[test]
    fn a_seqpacket_listener_passes_the_check_and_a_datagram_socket_does_not() {
        let dir = tempfile::tempdir().unwrap();
        let l = stoker::socket::SeqPacketListener::bind(&dir.path().join("s")).unwrap();
        let fd: OwnedFd = l.as_fd_owned();
        check_seqpacket_listener(&fd).unwrap();
        // SAFETY: plain syscall, owned on the next line.
        let d = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_DGRAM, 0) };
        // SAFETY: fresh fd, owned once.
        let d = unsafe { OwnedFd::from_raw_fd(d) };
        assert!(check_seqpacket_listener(&d)
            .unwrap_err()
            .to_string()
            .contains("SOCK_SEQPACKET"));
    }

    trait DupFd {
        fn as_fd_owned(&self) -> OwnedFd;
    }
    impl DupFd for stoker::socket::SeqPacketListener {
        fn as_fd_owned(&self) -> OwnedFd {
            use std::os::fd::AsFd;
            self.as_fd().try_clone_to_owned().unwrap()
        }
    }
}
