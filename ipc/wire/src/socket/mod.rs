//! Unix SOCK_SEQPACKET sockets: listen, connect, accept, and send/receive one message with
//! optional file descriptors (SCM_RIGHTS); [`path`]: which socket a daemon listens on and a
//! client connects to unless told otherwise; [`trust`]: whom a client trusts as its daemon;
//! [`groups`]: group names and gids; [`users`]: user names of uids.
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

#![deny(unsafe_code)]

use std::io;
use std::io::{IoSlice, IoSliceMut};
use std::mem::MaybeUninit;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::os::unix::ffi::OsStrExt as _;
use std::path::Path;
use std::time::Duration;

use rustix::io::Errno;
use rustix::net::{
    self, AddressFamily, RecvAncillaryBuffer, RecvAncillaryMessage, RecvFlags, ReturnFlags,
    SendAncillaryBuffer, SendAncillaryMessage, SendFlags, Shutdown, SocketAddrUnix, SocketFlags,
    SocketType,
};

#[allow(unsafe_code)]
pub mod groups;
pub mod path;
#[allow(unsafe_code)]
mod peergroups;
pub mod trust;
#[allow(unsafe_code)]
pub mod users;

/// Most descriptors one message carries.
pub(crate) const MAX_FDS: usize = 4;

/// Why a send or receive failed.
#[derive(Debug, thiserror::Error)]
pub enum SockError {
    /// The path does not fit a `sockaddr_un` (108 bytes).
    #[error("socket path {0:?} is too long for a Unix socket address")]
    PathTooLong(std::path::PathBuf),
    /// A socket call failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The call that failed (`connect`, `sendmsg`, ...).
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: io::Error,
    },
    /// A received message (of at least the first many bytes) did not fit the buffer (of the
    /// second many bytes).
    #[error("message of {0} bytes or more does not fit the {1}-byte buffer")]
    Truncated(usize, usize),
    /// A received message carried more descriptors than [`MAX_FDS`]; all were closed.
    #[error("message carried more than {MAX_FDS} file descriptors")]
    TooManyFds,
    /// The caller asked to send this many descriptors, more than [`MAX_FDS`].
    #[error("at most {MAX_FDS} file descriptors per message, asked to send {0}")]
    SendTooManyFds(usize),
    /// The kernel took only part of a message.
    #[error("message of {sent} bytes was sent as {len}")]
    ShortSend {
        /// Bytes the kernel took.
        sent: usize,
        /// Bytes of the message.
        len: usize,
    },
    /// The socket is in this user's own daemon folder, and that folder is not private.
    #[error("refusing the stoker daemon at {}: {source}", path.display())]
    UntrustedFolder {
        /// The socket.
        path: std::path::PathBuf,
        /// Why its folder is not private.
        #[source]
        source: stoker_private::PrivateDirError,
    },
    /// The process serving the socket runs as a uid the client does not trust.
    #[error(
        "refusing the stoker daemon at {}: the process serving it runs as uid {uid}, not as \
         this user (uid {ours}), root, or the owner of a folder root made for it (trusted: \
         {trusted:?}); remove {} if you did not start it",
        path.display(),
        path.display()
    )]
    UntrustedUid {
        /// The socket.
        path: std::path::PathBuf,
        /// The uid of the process serving it (SO_PEERCRED).
        uid: u32,
        /// This process's effective uid.
        ours: u32,
        /// Every uid trusted for this socket, this process's first.
        trusted: Vec<u32>,
    },
}

impl SockError {
    fn os(op: &'static str, errno: Errno) -> SockError {
        SockError::Io {
            op,
            source: errno.into(),
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
        let timeouts = [Errno::AGAIN, Errno::TIMEDOUT];
        timeouts
            .iter()
            .any(|e| self.raw_os_error() == Some(e.raw_os_error()))
    }
}

/// One received message: its length in the caller's buffer, and the descriptors it carried.
#[derive(Debug)]
pub struct Received {
    /// Bytes of the message, at the start of the caller's buffer.
    pub len: usize,
    /// The descriptors it carried (close-on-exec), in the order sent.
    pub fds: Vec<OwnedFd>,
}

/// The peer's credentials as the kernel recorded them at connect time (SO_PEERCRED).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerCred {
    /// The peer's process id at connect time (it may be another process's by now).
    pub pid: i32,
    /// The peer's effective uid.
    pub uid: u32,
    /// The peer's effective gid.
    pub gid: u32,
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
    net::socket_with(
        AddressFamily::UNIX,
        SocketType::SEQPACKET,
        SocketFlags::CLOEXEC,
        None,
    )
    .map_err(|e| SockError::os("socket", e))
}

/// `sizeof(sockaddr_un.sun_path)` on Linux.
const SUN_PATH_LEN: usize = 108;

fn sockaddr(path: &Path) -> Result<SocketAddrUnix, SockError> {
    // Keep one byte for the terminating NUL.
    let bytes = path.as_os_str().as_bytes();
    if bytes.is_empty() || bytes.len() >= SUN_PATH_LEN || bytes.contains(&0) {
        return Err(SockError::PathTooLong(path.to_owned()));
    }
    SocketAddrUnix::new(path).map_err(|_| SockError::PathTooLong(path.to_owned()))
}

impl SeqPacketListener {
    /// Binds `path` and listens. The path must not exist (remove a stale one first).
    pub fn bind(path: &Path) -> Result<SeqPacketListener, SockError> {
        let fd = socket()?;
        let addr = sockaddr(path)?;
        net::bind(&fd, &addr).map_err(|e| SockError::os("bind", e))?;
        net::listen(&fd, 128).map_err(|e| SockError::os("listen", e))?;
        Ok(SeqPacketListener { fd })
    }

    /// Wraps a socket that is already bound and listening (systemd socket activation).
    pub fn from_fd(fd: OwnedFd) -> SeqPacketListener {
        SeqPacketListener { fd }
    }

    /// Waits for a client. `EINTR` is retried.
    pub fn accept(&self) -> Result<SeqPacket, SockError> {
        loop {
            match net::accept_with(&self.fd, SocketFlags::CLOEXEC) {
                Ok(fd) => return Ok(SeqPacket { fd }),
                Err(Errno::INTR) => continue,
                Err(e) => return Err(SockError::os("accept", e)),
            }
        }
    }
}

impl AsFd for SeqPacketListener {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

/// A connected SOCK_SEQPACKET socket received or inherited as a descriptor (SCM_RIGHTS,
/// stdin); the caller vouches that it is one.
impl From<OwnedFd> for SeqPacket {
    fn from(fd: OwnedFd) -> SeqPacket {
        SeqPacket { fd }
    }
}

impl From<SeqPacket> for OwnedFd {
    fn from(s: SeqPacket) -> OwnedFd {
        s.fd
    }
}

impl SeqPacket {
    /// Connects to the listener at `path`.
    pub fn connect(path: &Path) -> Result<SeqPacket, SockError> {
        let fd = socket()?;
        let addr = sockaddr(path)?;
        net::connect(&fd, &addr).map_err(|e| SockError::os("connect", e))?;
        Ok(SeqPacket { fd })
    }

    /// A connected pair (tests, and in-process clients).
    pub fn pair() -> Result<(SeqPacket, SeqPacket), SockError> {
        let (a, b) = net::socketpair(
            AddressFamily::UNIX,
            SocketType::SEQPACKET,
            SocketFlags::CLOEXEC,
            None,
        )
        .map_err(|e| SockError::os("socketpair", e))?;
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
        // A zero timeout would mean "block forever" to the kernel: make it the shortest one.
        let d = d.map(|d| d.max(Duration::from_micros(1)));
        net::sockopt::set_socket_timeout(&self.fd, net::sockopt::Timeout::Recv, d)
            .map_err(|e| SockError::os("setsockopt(SO_RCVTIMEO)", e))
    }

    /// Shuts both directions down: a thread blocked in `recv` on another handle of this
    /// socket returns end of file.
    pub fn shutdown(&self) {
        // Failure (not connected) is harmless: there is nothing to wake.
        let _ = net::shutdown(&self.fd, Shutdown::Both);
    }

    /// The peer's credentials (SO_PEERCRED): pid, uid, gid.
    pub fn peer_cred(&self) -> Result<PeerCred, SockError> {
        let cred = net::sockopt::socket_peercred(&self.fd)
            .map_err(|e| SockError::os("getsockopt(SO_PEERCRED)", e))?;
        Ok(PeerCred {
            pid: cred.pid.as_raw_nonzero().get(),
            uid: cred.uid.as_raw(),
            gid: cred.gid.as_raw(),
        })
    }

    /// The peer's supplementary groups as the kernel recorded them at connect time
    /// (SO_PEERGROUPS), never read from `/proc/<pid>`: the pid may be another process's by now.
    pub fn peer_groups(&self) -> Result<Vec<u32>, SockError> {
        peergroups::peer_groups(self.fd.as_fd()).map_err(|source| SockError::Io {
            op: "getsockopt(SO_PEERGROUPS)",
            source,
        })
    }

    /// Sends one message with `fds` attached (SCM_RIGHTS). `EINTR` is retried.
    pub fn send(&self, bytes: &[u8], fds: &[BorrowedFd<'_>]) -> Result<(), SockError> {
        if fds.len() > MAX_FDS {
            return Err(SockError::SendTooManyFds(fds.len()));
        }
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let mut control = SendAncillaryBuffer::new(&mut space);
        if !fds.is_empty() && !control.push(SendAncillaryMessage::ScmRights(fds)) {
            return Err(SockError::SendTooManyFds(fds.len()));
        }
        loop {
            let iov = [IoSlice::new(bytes)];
            match net::sendmsg(&self.fd, &iov, &mut control, SendFlags::NOSIGNAL) {
                Ok(sent) if sent == bytes.len() => return Ok(()),
                Ok(sent) => {
                    return Err(SockError::ShortSend {
                        sent,
                        len: bytes.len(),
                    })
                }
                Err(Errno::INTR) => continue,
                Err(e) => return Err(SockError::os("sendmsg", e)),
            }
        }
    }

    /// Receives one message into `buf`. `Ok(None)` is end of file (the peer closed).
    /// A message longer than `buf` is [`SockError::Truncated`]. `EINTR` is retried.
    pub fn recv(&self, buf: &mut [u8]) -> Result<Option<Received>, SockError> {
        let mut space = [MaybeUninit::<u8>::uninit(); rustix::cmsg_space!(ScmRights(MAX_FDS))];
        let buf_len = buf.len();
        loop {
            let mut control = RecvAncillaryBuffer::new(&mut space);
            let mut iov = [IoSliceMut::new(buf)];
            let flags = RecvFlags::CMSG_CLOEXEC | RecvFlags::TRUNC;
            let got = match net::recvmsg(&self.fd, &mut iov, &mut control, flags) {
                Ok(got) => got,
                Err(Errno::INTR) => continue,
                Err(e) => return Err(SockError::os("recvmsg", e)),
            };
            // Take ownership of every fd first, so each is closed whatever happens next.
            let fds = take_fds(&mut control);
            let len = got.bytes;
            if got.flags.contains(ReturnFlags::CTRUNC) {
                return Err(SockError::TooManyFds);
            }
            if got.flags.contains(ReturnFlags::TRUNC) || len > buf_len {
                return Err(SockError::Truncated(len.max(buf_len + 1), buf_len));
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

/// Collects the SCM_RIGHTS descriptors of a received message as owned fds.
fn take_fds(control: &mut RecvAncillaryBuffer<'_>) -> Vec<OwnedFd> {
    let mut fds = Vec::new();
    for message in control.drain() {
        if let RecvAncillaryMessage::ScmRights(rights) = message {
            fds.extend(rights);
        }
    }
    fds
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::fs::File;
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;

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
        let flags = rustix::io::fcntl_getfd(&fd).unwrap();
        assert!(
            flags.contains(rustix::io::FdFlags::CLOEXEC),
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
        assert_eq!(err.raw_os_error(), Some(Errno::PIPE.raw_os_error()));
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
        assert_eq!(cred.uid, rustix::process::getuid().as_raw());
        let err = SeqPacket::connect(&dir.path().join("nope.sock")).unwrap_err();
        assert_eq!(err.raw_os_error(), Some(Errno::NOENT.raw_os_error()));
        assert!(matches!(
            SeqPacket::connect(&dir.path().join("x".repeat(200))),
            Err(SockError::PathTooLong(_))
        ));
    }
}
