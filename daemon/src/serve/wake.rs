//! An eventfd that wakes a thread blocked in `poll` (the accept loop, when the server stops).
//!
//! # Design
//! - Non-blocking and close-on-exec; `signal` adds 1, and the counter stays readable until
//!   drained, so a signal sent before the waiter polls is not lost.
//!
//! # Limitations
//! - Linux only (eventfd), like the rest of the daemon.

#![forbid(unsafe_code)]

use std::os::fd::{AsFd, BorrowedFd, OwnedFd};

use rustix::event::EventfdFlags;

/// A wake-up flag a `poll` can wait on.
#[derive(Debug)]
pub(super) struct EventFd(OwnedFd);

impl EventFd {
    pub(super) fn new() -> Result<EventFd, std::io::Error> {
        let fd = rustix::event::eventfd(0, EventfdFlags::CLOEXEC | EventfdFlags::NONBLOCK)?;
        Ok(EventFd(fd))
    }

    /// Makes the eventfd readable (wakes every poll on it) until it is drained.
    pub(super) fn signal(&self) {
        // A full counter (EAGAIN) is still readable, which is all a signal needs.
        let _ = rustix::io::write(&self.0, &1u64.to_ne_bytes());
    }

    /// Whether the eventfd was signalled (without clearing it).
    #[cfg(test)]
    pub(super) fn is_signalled(&self) -> bool {
        use rustix::event::{PollFd, PollFlags};
        let mut pfd = [PollFd::new(&self.0, PollFlags::IN)];
        let zero = rustix::event::Timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut pfd, Some(&zero)) == Ok(1)
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
