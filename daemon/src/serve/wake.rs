//! An eventfd that wakes a thread blocked in `poll` (the accept loop, when the server stops).
//!
//! # Design
//! - Non-blocking and close-on-exec; `signal` adds 1, and the counter stays readable until
//!   drained, so a signal sent before the waiter polls is not lost.
//!
//! # Limitations
//! - Linux only (eventfd), like the rest of the daemon.

use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};

/// A wake-up flag a `poll` can wait on.
#[derive(Debug)]
pub struct EventFd(OwnedFd);

impl EventFd {
    pub fn new() -> Result<EventFd, std::io::Error> {
        // SAFETY: plain syscall; no pointers.
        let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
        if fd < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `fd` was just returned by eventfd and nothing else owns it.
        Ok(EventFd(unsafe { OwnedFd::from_raw_fd(fd) }))
    }

    /// Makes the eventfd readable (wakes every poll on it) until it is drained.
    pub fn signal(&self) {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an fd we own. A full counter (EAGAIN)
        // is still readable, which is all a signal needs.
        unsafe { libc::write(self.0.as_raw_fd(), (&one as *const u64).cast(), 8) };
    }

    /// Whether the eventfd was signalled (without clearing it).
    #[cfg(test)]
    pub fn is_signalled(&self) -> bool {
        let mut pfd = libc::pollfd {
            fd: self.0.as_raw_fd(),
            events: libc::POLLIN,
            revents: 0,
        };
        // SAFETY: one valid pollfd for the duration of the call; zero timeout.
        unsafe { libc::poll(&mut pfd, 1, 0) == 1 }
    }
}

impl AsFd for EventFd {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.0.as_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_stays_until_seen() {
        let e = EventFd::new().unwrap();
        assert!(!e.is_signalled());
        e.signal();
        assert!(e.is_signalled());
        assert!(e.is_signalled(), "seeing it does not clear it");
    }
}
