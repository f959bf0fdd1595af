//! Connections that have not yet sent their first message (ATTACH or STATUS): held by the
//! accept loop itself, with no thread, under caps and a deadline.
//!
//! # Design
//! - **No thread per idle connection**: a new connection waits in the [`Lobby`]; the accept
//!   loop polls the listener and every waiting socket together. A connection gets its thread
//!   only once its first message has arrived (the thread then reads it at once); one that
//!   hangs up first is closed right there.
//! - **Caps**: at most `[limits] max_waiting_per_uid` waiting connections per peer uid
//!   (SO_PEERCRED, read at accept) and `max_waiting` in all, the latter also at most
//!   half the daemon's fd limit (`RLIMIT_NOFILE`), so one uid's idle connections can neither
//!   lock other uids out nor use up the fds attached clients need. A connection over a cap is
//!   closed at once.
//! - **Deadline**: a connection that sends nothing within `attach_deadline_ms` is closed.
//! - **fd exhaustion**: when `accept` fails with EMFILE/ENFILE, the oldest waiting connection
//!   of the uid holding the most is closed to make room.
//! - Refusals are logged through a [`RateLimit`] (20 lines a second, then "suppressed K"):
//!   a flood cannot flood the journal.
//!
//! # Limitations
//! - Caps are per uid: many uids together can still fill the total (each to its own cap).
//! - A connection over a cap is closed without an ERROR message (writing to it could block).

#![forbid(unsafe_code)]

use std::collections::HashMap;
use std::os::fd::AsFd;
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};
use rustix::net::RecvFlags;

use stoker_wire::socket::SeqPacket;

use crate::serve::access::Peer;
use crate::serve::config::LimitsConfig;
use stoker_pipeline::ratelimit::{Admit, RateLimit};

/// Lobby log lines a second.
const LOG_PER_SECOND: u32 = 20;

/// The caps and deadline in force: `[limits] max_waiting_per_uid`, `max_waiting` (also at
/// most half the fd limit) and `attach_deadline_ms`, each at least 1.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Caps {
    per_uid: usize,
    total: usize,
    deadline: Duration,
}

/// One connection waiting for its first message.
struct Waiting {
    id: u64,
    sock: SeqPacket,
    /// Taken at accept, from the socket: the access rules judge these, never `/proc`.
    peer: Peer,
    since: Instant,
}

/// A connection whose first message has arrived: its thread may start.
pub(crate) struct Arrived {
    pub id: u64,
    pub sock: SeqPacket,
    pub peer: Peer,
}

/// Why a connection left the lobby without a thread.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Closed {
    UidCap,
    TotalCap,
    Deadline,
    HungUp,
    NoCredentials,
    Evicted,
}

impl Closed {
    fn reason(self) -> &'static str {
        match self {
            Closed::UidCap => "too many connections of this uid waiting to attach",
            Closed::TotalCap => "too many connections waiting to attach",
            Closed::Deadline => "nothing sent within the attach deadline",
            Closed::HungUp => "closed before its first message",
            Closed::NoCredentials => "no peer credentials",
            Closed::Evicted => "evicted: the daemon ran out of fds",
        }
    }
}

/// The waiting connections.
pub(crate) struct Lobby {
    limits: Caps,
    waiting: Vec<Waiting>,
    by_uid: HashMap<u32, usize>,
    log: RateLimit,
}

/// Half the soft fd limit: what the lobby may hold at most.
fn fd_share() -> usize {
    // `None` is no limit.
    let soft = rustix::process::getrlimit(rustix::process::Resource::Nofile).current;
    soft.map_or(usize::MAX, |n| usize::try_from(n / 2).unwrap_or(usize::MAX))
}

impl Lobby {
    /// An empty lobby under `[limits]`' caps and deadline.
    pub(crate) fn new(limits: &LimitsConfig) -> Lobby {
        let limits = Caps {
            per_uid: limits.max_waiting_per_uid.max(1),
            total: limits.max_waiting.min(fd_share()).max(1),
            deadline: Duration::from_millis(limits.attach_deadline_ms.max(1)),
        };
        Lobby {
            limits,
            waiting: Vec::new(),
            by_uid: HashMap::new(),
            log: RateLimit::new(LOG_PER_SECOND),
        }
    }

    /// Connections waiting now.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.waiting.len()
    }

    #[cfg(test)]
    pub(crate) fn is_empty(&self) -> bool {
        self.waiting.is_empty()
    }

    /// Takes a new connection in, or closes it when its uid or the lobby is full.
    pub(crate) fn admit(&mut self, id: u64, sock: SeqPacket) {
        let peer = match Peer::of(&sock) {
            Ok(p) => p,
            Err(_) => return self.closed(id, None, Closed::NoCredentials),
        };
        let uid = peer.uid;
        let mine = self.by_uid.get(&uid).copied().unwrap_or(0);
        if mine >= self.limits.per_uid {
            return self.closed(id, Some(uid), Closed::UidCap);
        }
        if self.waiting.len() >= self.limits.total {
            return self.closed(id, Some(uid), Closed::TotalCap);
        }
        *self.by_uid.entry(uid).or_default() += 1;
        self.waiting.push(Waiting {
            id,
            sock,
            peer,
            since: Instant::now(),
        });
    }

    /// The fds to poll: the listener first, then every waiting connection in order.
    pub(crate) fn poll_fds<'a>(&'a self, listener: &'a impl AsFd) -> Vec<PollFd<'a>> {
        std::iter::once(PollFd::new(listener, PollFlags::IN))
            .chain(
                self.waiting
                    .iter()
                    .map(|w| PollFd::new(&w.sock, PollFlags::IN)),
            )
            .collect()
    }

    /// How long the accept loop may sleep: `max`, or less when a deadline comes sooner.
    pub(crate) fn timeout(&self, max: Duration) -> Duration {
        let now = Instant::now();
        self.waiting
            .iter()
            .map(|w| (w.since + self.limits.deadline).saturating_duration_since(now))
            .fold(max, Duration::min)
    }

    /// After a poll over [`Lobby::poll_fds`], given each entry's returned events: removes the connections whose first message has
    /// arrived (returned, for their threads), closes those that hung up or are past the
    /// deadline.
    pub(crate) fn sort_out(&mut self, polled: &[PollFlags]) -> Vec<Arrived> {
        let now = Instant::now();
        let mut arrived = Vec::new();
        let mut keep = Vec::with_capacity(self.waiting.len());
        let waiting = std::mem::take(&mut self.waiting);
        for (i, w) in waiting.into_iter().enumerate() {
            // Connections admitted after the poll have no entry: they wait on.
            let revents = polled.get(i + 1).copied().unwrap_or(PollFlags::empty());
            let verdict = if revents.intersects(PollFlags::IN | PollFlags::HUP | PollFlags::ERR) {
                if has_message(&w.sock) {
                    None
                } else {
                    Some(Closed::HungUp)
                }
            } else if now >= w.since + self.limits.deadline {
                Some(Closed::Deadline)
            } else {
                keep.push(w);
                continue;
            };
            let uid = w.peer.uid;
            self.leave(uid);
            match verdict {
                None => arrived.push(Arrived {
                    id: w.id,
                    sock: w.sock,
                    peer: w.peer,
                }),
                Some(why) => self.closed(w.id, Some(uid), why),
            }
        }
        self.waiting = keep;
        arrived
    }

    /// Closes the oldest waiting connection of the uid holding the most (the daemon is out
    /// of fds); false when none waits.
    pub(crate) fn evict_one(&mut self) -> bool {
        let Some((&uid, _)) = self.by_uid.iter().max_by_key(|(_, n)| **n) else {
            return false;
        };
        let Some(i) = self.waiting.iter().position(|w| w.peer.uid == uid) else {
            return false;
        };
        let w = self.waiting.remove(i);
        self.leave(uid);
        self.closed(w.id, Some(uid), Closed::Evicted);
        true
    }

    fn leave(&mut self, uid: u32) {
        if let Some(n) = self.by_uid.get_mut(&uid) {
            *n -= 1;
            if *n == 0 {
                self.by_uid.remove(&uid);
            }
        }
    }

    fn closed(&mut self, id: u64, uid: Option<u32>, why: Closed) {
        let quiet = matches!(why, Closed::HungUp);
        if quiet {
            tracing::debug!(conn = id, uid, reason = why.reason(), "connection closed");
            return;
        }
        if let Admit::Log { suppressed } = self.log.admit(Instant::now()) {
            tracing::warn!(
                conn = id,
                uid,
                reason = why.reason(),
                per_uid = self.limits.per_uid,
                total = self.limits.total,
                suppressed,
                "connection closed before attaching"
            );
        }
    }
}

/// Whether a readable connection holds a message (not only the end of file).
fn has_message(sock: &SeqPacket) -> bool {
    let mut byte = [0u8; 1];
    // PEEK leaves the message queued.
    let peeked = rustix::net::recv(sock, &mut byte[..], RecvFlags::PEEK | RecvFlags::DONTWAIT);
    // 1: a message (peeked, possibly truncated); 0: end of file; EAGAIN cannot happen after
    // POLLIN, any other error is for the thread to report.
    !matches!(peeked, Ok((0, _)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_uid_over_its_cap_is_closed_and_others_still_get_in() {
        let mut lobby = Lobby::new(&LimitsConfig {
            max_waiting_per_uid: 2,
            max_waiting: 10,
            attach_deadline_ms: 50,
            ..LimitsConfig::default()
        });
        let mut clients = Vec::new();
        for id in 0..4 {
            let (a, b) = SeqPacket::pair().unwrap();
            lobby.admit(id, a);
            clients.push(b);
        }
        assert_eq!(lobby.len(), 2, "the same uid holds at most its cap");
        // Connection 1 speaks; connection 0 stays silent past the deadline.
        clients[1].send(b"hello", &[]).unwrap();
        let mut pfds = lobby.poll_fds(&clients[0]);
        let second = rustix::event::Timespec {
            tv_sec: 1,
            tv_nsec: 0,
        };
        rustix::event::poll(&mut pfds, Some(&second)).unwrap();
        let polled: Vec<PollFlags> = pfds.iter().map(PollFd::revents).collect();
        drop(pfds);
        let arrived = lobby.sort_out(&polled);
        assert_eq!(arrived.len(), 1);
        assert_eq!(arrived[0].id, 1);
        std::thread::sleep(Duration::from_millis(60));
        let polled = vec![PollFlags::empty(); lobby.len() + 1];
        assert!(lobby.sort_out(&polled).is_empty());
        assert!(lobby.is_empty(), "the silent one is closed at its deadline");
    }
}
