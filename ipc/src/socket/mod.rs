//! Unix SOCK_SEQPACKET sockets: listen, connect, accept, and send/receive one message with
//! optional file descriptors (SCM_RIGHTS); [`path`]: which socket a daemon listens on and a
//! client connects to unless told otherwise.
//!
//! # Design
//! - SOCK_SEQPACKET keeps message boundaries and is connection-oriented, so one `send` is one
//!   protocol message and a closed peer reads as end of file.
//! - Every descriptor is an [`OwnedFd`] on the line it is created; received descriptors carry
//!   close-on-exec (`MSG_CMSG_CLOEXEC`), sockets are created with `SOCK_CLOEXEC`.
//! - A message larger than the receive buffer is detected with `MSG_TRUNC` and is an error,
//!   never a silently cut message. Truncated control data (too many fds) is an error too; the
//!   fds that did arrive are closed.
//! - Sends use `MSG_NOSIGNAL`: a vanished peer is `EPIPE`, not a SIGPIPE.
//!
//! # Limitations
//! - Linux only. At most [`MAX_FDS`] descriptors per message.

use std::io;
use std::mem::{size_of, MaybeUninit};
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::Duration;

pub mod path;

/// Most descriptors one message carries.
pub const MAX_FDS: usize = 4;

/// Why a send or receive failed.
#[derive(Debug, thiserror::Error)]
pub enum SockError {
    #[error("socket path {0:?} is too long for a Unix socket address")]
    PathTooLong(std::path::PathBuf),
    #[error("{op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: io::Error,
    },
    #[error("message of {0} bytes or more does not fit the {1}-byte buffer")]
    Truncated(usize, usize),
    #[error("message carried more than {MAX_FDS} file descriptors")]
    TooManyFds,
    #[error("at most {MAX_FDS} file descriptors per message, asked to send {0}")]
    SendTooManyFds(usize),
    #[error("message of {sent} bytes was sent as {len}")]
    ShortSend { sent: usize, len: usize },
}

impl SockError {
    fn last(op: &'static str) -> SockError {
        SockError::Io {
            op,
            source: io::Error::last_os_error(),
        }
    }

    /// The OS error behind this one, if any.
    pub fn raw_os_error(&self) -> Option<i32> {
        match self {
            SockError::Io { source, .. } => source.raw_os_error(),
            _ => None,
        }
    }

    /// True when a receive timeout (set with [`SeqPacket::set_read_timeout`]) expired.
    pub fn is_timeout(&self) -> bool {
        matches!(
            self.raw_os_error(),
            Some(libc::EAGAIN) | Some(libc::ETIMEDOUT)
        )
    }
}

/// One received message: its length in the caller's buffer, and the descriptors it carried.
#[derive(Debug)]
pub struct Received {
    pub len: usize,
    pub fds: Vec<OwnedFd>,
}

/// A connected SOCK_SEQPACKET socket.
#[derive(Debug)]
pub struct SeqPacket {
    fd: OwnedFd,
}

/// A listening SOCK_SEQPACKET socket bound to a path.
#[derive(Debug)]
pub struct SeqPacketListener {
    fd: OwnedFd,
}

fn socket() -> Result<OwnedFd, SockError> {
    // SAFETY: plain syscall with constant arguments; no pointers.
    let fd = unsafe { libc::socket(libc::AF_UNIX, libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(SockError::last("socket"));
    }
    // SAFETY: `fd` was just returned by socket(2), is valid, and nothing else owns it.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// The size of a kernel struct passed to a socket call, as the kernel takes it.
// The structs passed (timeval, ucred) are a few bytes.
#[allow(clippy::cast_possible_truncation)]
fn socklen_of<T>() -> libc::socklen_t {
    size_of::<T>() as libc::socklen_t
}

fn sockaddr(path: &Path) -> Result<(libc::sockaddr_un, libc::socklen_t), SockError> {
    // SAFETY: sockaddr_un is plain old data; all zeroes is a valid value.
    let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    // AF_UNIX is 1.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let family = libc::AF_UNIX as libc::sa_family_t;
    addr.sun_family = family;
    let bytes = path.as_os_str().as_bytes();
    // Keep one byte for the terminating NUL.
    if bytes.is_empty() || bytes.len() >= addr.sun_path.len() || bytes.contains(&0) {
        return Err(SockError::PathTooLong(path.to_owned()));
    }
    for (dst, src) in addr.sun_path.iter_mut().zip(bytes) {
        *dst = libc::c_char::from_ne_bytes([*src]);
    }
    let len = size_of::<libc::sa_family_t>() + bytes.len() + 1;
    let len =
        libc::socklen_t::try_from(len).map_err(|_| SockError::PathTooLong(path.to_owned()))?;
    Ok((addr, len))
}

impl SeqPacketListener {
    /// Binds `path` and listens. The path must not exist (remove a stale one first).
    pub fn bind(path: &Path) -> Result<SeqPacketListener, SockError> {
        let fd = socket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
        let rc = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc != 0 {
            return Err(SockError::last("bind"));
        }
        // SAFETY: plain syscall on a socket we own.
        if unsafe { libc::listen(fd.as_raw_fd(), 128) } != 0 {
            return Err(SockError::last("listen"));
        }
        Ok(SeqPacketListener { fd })
    }

    /// Wraps a socket that is already bound and listening (systemd socket activation).
    pub fn from_fd(fd: OwnedFd) -> SeqPacketListener {
        SeqPacketListener { fd }
    }

    /// Waits for a client. `EINTR` is retried.
    pub fn accept(&self) -> Result<SeqPacket, SockError> {
        loop {
            // SAFETY: null address pointers are allowed (we do not want the peer's address).
            let fd = unsafe {
                libc::accept4(
                    self.fd.as_raw_fd(),
                    std::ptr::null_mut(),
                    std::ptr::null_mut(),
                    libc::SOCK_CLOEXEC,
                )
            };
            if fd >= 0 {
                // SAFETY: `fd` was just returned by accept4(2) and nothing else owns it.
                let fd = unsafe { OwnedFd::from_raw_fd(fd) };
                return Ok(SeqPacket { fd });
            }
            let err = SockError::last("accept");
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }
}

impl AsFd for SeqPacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

impl SeqPacket {
    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> Result<SeqPacket, SockError> {
        let fd = socket()?;
        let (addr, len) = sockaddr(path)?;
        // SAFETY: `addr` is a valid sockaddr_un of `len` bytes that outlives the call.
        let rc = unsafe {
            libc::connect(
                fd.as_raw_fd(),
                (&addr as *const libc::sockaddr_un).cast(),
                len,
            )
        };
        if rc != 0 {
            return Err(SockError::last("connect"));
        }
        Ok(SeqPacket { fd })
    }

    /// A connected pair (tests, and in-process clients).
    pub fn pair() -> Result<(SeqPacket, SeqPacket), SockError> {
        let mut fds = [0 as RawFd; 2];
        // SAFETY: `fds` has room for the two descriptors socketpair(2) writes.
        let rc = unsafe {
            libc::socketpair(
                libc::AF_UNIX,
                libc::SOCK_SEQPACKET | libc::SOCK_CLOEXEC,
                0,
                fds.as_mut_ptr(),
            )
        };
        if rc != 0 {
            return Err(SockError::last("socketpair"));
        }
        // SAFETY: both descriptors were just created by socketpair(2) and are owned by no one.
        let (a, b) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
        Ok((SeqPacket { fd: a }, SeqPacket { fd: b }))
    }

    /// A second handle on the same socket (one thread reads while another writes).
    pub fn try_clone(&self) -> Result<SeqPacket, SockError> {
        let fd = self
            .fd
            .try_clone()
            .map_err(|source| SockError::Io { op: "dup", source })?;
        Ok(SeqPacket { fd })
    }

    /// Makes `recv` fail with a timeout error ([`SockError::is_timeout`]) after `d`;
    /// `None` blocks forever.
    pub fn set_read_timeout(&self, d: Option<Duration>) -> Result<(), SockError> {
        let tv = match d {
            Some(d) => libc::timeval {
                tv_sec: libc::time_t::try_from(d.as_secs())
                    .map_or(i32::MAX.into(), |s| s.min(i32::MAX.into())),
                tv_usec: d.subsec_micros().max(u32::from(d.is_zero())) as libc::suseconds_t,
            },
            None => libc::timeval {
                tv_sec: 0,
                tv_usec: 0,
            },
        };
        // SAFETY: `tv` is a valid timeval that outlives the call, and the length says so.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_RCVTIMEO,
                (&tv as *const libc::timeval).cast(),
                socklen_of::<libc::timeval>(),
            )
        };
        if rc != 0 {
            return Err(SockError::last("setsockopt(SO_RCVTIMEO)"));
        }
        Ok(())
    }

    /// Shuts both directions down: a thread blocked in `recv` on another handle of this
    /// socket returns end of file.
    pub fn shutdown(&self) {
        // SAFETY: plain syscall on a socket we own; failure (not connected) is harmless.
        unsafe { libc::shutdown(self.fd.as_raw_fd(), libc::SHUT_RDWR) };
    }

    /// The peer's credentials (SO_PEERCRED): pid, uid, gid.
    pub fn peer_cred(&self) -> Result<libc::ucred, SockError> {
        let mut cred = libc::ucred {
            pid: 0,
            uid: 0,
            gid: 0,
        };
        let mut len = socklen_of::<libc::ucred>();
        // SAFETY: `cred` and `len` are valid for writes and `len` holds cred's size.
        let rc = unsafe {
            libc::getsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERCRED,
                (&mut cred as *mut libc::ucred).cast(),
                &mut len,
            )
        };
        if rc != 0 {
            return Err(SockError::last("getsockopt(SO_PEERCRED)"));
        }
        Ok(cred)
    }

    /// Sends one message with `fds` attached (SCM_RIGHTS). `EINTR` is retried.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), SockError> {
        if fds.len() > MAX_FDS {
            return Err(SockError::SendTooManyFds(fds.len()));
        }
        let mut cmsg_buf = CmsgBuf::new();
        let mut iov = libc::iovec {
            iov_base: bytes.as_ptr() as *mut libc::c_void,
            iov_len: bytes.len(),
        };
        // SAFETY: msghdr is plain old data; all zeroes is a valid empty header.
        let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
        msg.msg_iov = &mut iov;
        msg.msg_iovlen = 1;
        if !fds.is_empty() {
            // At most MAX_FDS descriptors (checked above).
            #[allow(clippy::cast_possible_truncation)]
            let payload = (fds.len() * size_of::<RawFd>()) as u32;
            // SAFETY: CMSG_SPACE is a pure size computation.
            let space = unsafe { libc::CMSG_SPACE(payload) } as usize;
            msg.msg_control = cmsg_buf.as_mut_ptr().cast();
            msg.msg_controllen = space as _;
            // SAFETY: msg_control points at a buffer of `space` (<= its capacity) aligned
            // bytes, so CMSG_FIRSTHDR returns a valid header pointer inside it, and the
            // `fds.len()` descriptors fit in its CMSG_DATA area by construction of `space`.
            unsafe {
                let cmsg = libc::CMSG_FIRSTHDR(&msg);
                (*cmsg).cmsg_level = libc::SOL_SOCKET;
                (*cmsg).cmsg_type = libc::SCM_RIGHTS;
                (*cmsg).cmsg_len = libc::CMSG_LEN(payload) as _;
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                for (i, fd) in fds.iter().enumerate() {
                    data.add(i).write_unaligned(fd.as_raw_fd());
                }
            }
        }
        loop {
            // SAFETY: `msg` points at `iov` and `cmsg_buf`, both alive for the call; the
            // kernel only reads them.
            let n = unsafe { libc::sendmsg(self.fd.as_raw_fd(), &msg, libc::MSG_NOSIGNAL) };
            if n >= 0 {
                let sent = n.unsigned_abs();
                if sent != bytes.len() {
                    return Err(SockError::ShortSend {
                        sent,
                        len: bytes.len(),
                    });
                }
                return Ok(());
            }
            let err = SockError::last("sendmsg");
            if err.raw_os_error() != Some(libc::EINTR) {
                return Err(err);
            }
        }
    }

    /// Receives one message into `buf`. `Ok(None)` is end of file (the peer closed).
    /// A message longer than `buf` is [`SockError::Truncated`]. `EINTR` is retried.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<Received>, SockError> {
        let mut cmsg_buf = CmsgBuf::new();
        loop {
            let mut iov = libc::iovec {
                iov_base: buf.as_mut_ptr().cast(),
                iov_len: buf.len(),
            };
            // SAFETY: msghdr is plain old data; all zeroes is a valid empty header.
            let mut msg: libc::msghdr = unsafe { std::mem::zeroed() };
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = cmsg_buf.as_mut_ptr().cast();
            msg.msg_controllen = CmsgBuf::CAPACITY as _;
            // SAFETY: `msg` points at `buf` (via iov) and `cmsg_buf`, both valid for writes of
            // the lengths given and alive for the call.
            let n = unsafe {
                libc::recvmsg(
                    self.fd.as_raw_fd(),
                    &mut msg,
                    libc::MSG_CMSG_CLOEXEC | libc::MSG_TRUNC,
                )
            };
            if n < 0 {
                let err = SockError::last("recvmsg");
                if err.raw_os_error() == Some(libc::EINTR) {
                    continue;
                }
                return Err(err);
            }
            // Take ownership of every fd first, so each is closed whatever happens next.
            let fds = take_fds(&msg);
            let len = n.unsigned_abs();
            if msg.msg_flags & libc::MSG_CTRUNC != 0 {
                return Err(SockError::TooManyFds);
            }
            if msg.msg_flags & libc::MSG_TRUNC != 0 || len > buf.len() {
                return Err(SockError::Truncated(len.max(buf.len() + 1), buf.len()));
            }
            if len == 0 && fds.is_empty() {
                return Ok(None);
            }
            return Ok(Some(Received { len, fds }));
        }
    }
}

impl AsFd for SeqPacket {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// Collects the SCM_RIGHTS descriptors of a received header as owned fds.
fn take_fds(msg: &libc::msghdr) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    if msg.msg_control.is_null() || msg.msg_controllen == 0 {
        return fds;
    }
    // SAFETY: `msg` was filled by recvmsg(2): its control area holds `msg_controllen` bytes
    // of well-formed cmsg headers, which CMSG_FIRSTHDR/CMSG_NXTHDR walk within bounds.
    unsafe {
        let mut cmsg = libc::CMSG_FIRSTHDR(msg);
        while !cmsg.is_null() {
            if (*cmsg).cmsg_level == libc::SOL_SOCKET && (*cmsg).cmsg_type == libc::SCM_RIGHTS {
                let data = libc::CMSG_DATA(cmsg).cast::<RawFd>();
                let header = libc::CMSG_LEN(0) as usize;
                let count = ((*cmsg).cmsg_len as usize).saturating_sub(header) / size_of::<RawFd>();
                for i in 0..count {
                    // Each received descriptor is new in this process and owned by no one.
                    fds.push(OwnedFd::from_raw_fd(data.add(i).read_unaligned()));
                }
            }
            cmsg = libc::CMSG_NXTHDR(msg, cmsg);
        }
    }
    fds
}

/// An aligned control-message buffer with room for [`MAX_FDS`] descriptors.
struct CmsgBuf {
    buf: [MaybeUninit<u64>; CmsgBuf::WORDS],
}

impl CmsgBuf {
    const WORDS: usize = 16;
    const CAPACITY: usize = CmsgBuf::WORDS * size_of::<u64>();

    fn new() -> CmsgBuf {
        CmsgBuf {
            buf: [MaybeUninit::new(0); CmsgBuf::WORDS],
        }
    }

    fn as_mut_ptr(&mut self) -> *mut u8 {
        self.buf.as_mut_ptr().cast()
    }
}

// Room for MAX_FDS descriptors, checked at compile time.
const _: () =
    assert!(CmsgBuf::CAPACITY >= size_of::<libc::cmsghdr>() + MAX_FDS * size_of::<RawFd>() + 8);

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::{Read, Seek, Write};

    #[test]
    fn messages_keep_their_boundaries() {
        let (a, b) = SeqPacket::pair().unwrap();
        a.send(b"one", &[]).unwrap();
        a.send(b"three", &[]).unwrap();
        let mut buf = [0u8; 64];
        let r = b.recv(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"one");
        let r = b.recv(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"three");
        assert!(r.fds.is_empty());
    }

    #[test]
    fn fds_travel_and_refer_to_the_same_file() {
        let (a, b) = SeqPacket::pair().unwrap();
        let mut f = tempfile::tempfile().unwrap();
        f.write_all(b"shared bytes").unwrap();
        a.send(b"here", &[f.as_fd()]).unwrap();
        let mut buf = [0u8; 16];
        let r = b.recv(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"here");
        assert_eq!(r.fds.len(), 1);
        let fd = r.fds.into_iter().next().unwrap();
        assert_ne!(fd.as_raw_fd(), f.as_raw_fd());
        // SAFETY: F_GETFD on a valid fd we own.
        let flags = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GETFD) };
        assert_ne!(
            flags & libc::FD_CLOEXEC,
            0,
            "received fd must be close-on-exec"
        );
        let mut g = File::from(fd);
        g.rewind().unwrap();
        let mut s = String::new();
        g.read_to_string(&mut s).unwrap();
        assert_eq!(s, "shared bytes");
    }

    #[test]
    fn oversize_message_is_an_error_not_a_cut() {
        let (a, b) = SeqPacket::pair().unwrap();
        a.send(&[7u8; 100], &[]).unwrap();
        let mut buf = [0u8; 10];
        let err = b.recv(&mut buf).unwrap_err();
        assert!(matches!(err, SockError::Truncated(100, 10)), "{err}");
    }

    #[test]
    fn closed_peer_reads_as_end_of_file_and_send_fails_without_sigpipe() {
        let (a, b) = SeqPacket::pair().unwrap();
        drop(a);
        let mut buf = [0u8; 10];
        assert!(b.recv(&mut buf).unwrap().is_none());
        let err = b.send(b"x", &[]).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::EPIPE));
    }

    #[test]
    fn read_timeout_expires() {
        let (_a, b) = SeqPacket::pair().unwrap();
        b.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
        let mut buf = [0u8; 10];
        assert!(b.recv(&mut buf).unwrap_err().is_timeout());
    }

    #[test]
    fn listen_connect_accept_over_a_path() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("s.sock");
        let l = SeqPacketListener::bind(&path).unwrap();
        let c = SeqPacket::connect(&path).unwrap();
        let s = l.accept().unwrap();
        c.send(b"hello", &[]).unwrap();
        let mut buf = [0u8; 10];
        let r = s.recv(&mut buf).unwrap().unwrap();
        assert_eq!(&buf[..r.len], b"hello");
        let cred = s.peer_cred().unwrap();
        // SAFETY: getuid has no preconditions.
        assert_eq!(cred.uid, unsafe { libc::getuid() });
        let err = SeqPacket::connect(&dir.path().join("nope.sock")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(libc::ENOENT));
        assert!(matches!(
            SeqPacket::connect(&dir.path().join("x".repeat(200))),
            Err(SockError::PathTooLong(_))
        ));
    }
}
