//! Connections to `/metrics` until their request head has arrived: read by the listener's
//! own thread as their bytes come, holding no thread of their own.
//!
//! # Design
//! A connection gets an answering thread (one of [`super::MAX_CONNECTIONS`], or of
//! [`super::MAX_SCRAPER_CONNECTIONS`] for an address in `metrics.scrapers`) only once its
//! whole request head is in, so clients that send half a request and wait cost an fd and a
//! place here, never a thread a scrape needs: a scraper sends its head in one packet and is
//! answered at once. At most [`MAX_WAITING`] connections wait; when a new one comes the
//! oldest waiting client that is not a scraper (the slowest) is closed first. Each must send
//! its head within [`super::REQUEST_TIMEOUT`] of connecting.
//!
//! # Limitations
//! - Waiting places are shared by every address but the scrapers' (which are never closed
//!   for others): a flood of more than [`MAX_WAITING`] connecting clients closes slow ones as
//!   fast as it connects, and a scrape among them is answered if its head arrives before 64
//!   newer connections did.

use std::collections::VecDeque;
use std::io::Read;
use std::net::{IpAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use rustix::event::{PollFd, PollFlags};

use super::{MAX_REQUEST_BYTES, REQUEST_TIMEOUT};

/// Connections waiting for their request head at once.
pub(crate) const MAX_WAITING: usize = 64;

/// A request as read: the connection, its head, whether the head is complete (else it was
/// cut, too large or the client hung up) and whether it came from a scraper's address.
#[derive(Debug)]
pub(crate) struct Request {
    pub(crate) stream: TcpStream,
    pub(crate) head: Vec<u8>,
    pub(crate) complete: bool,
    pub(crate) scraper: bool,
}

/// One connection whose head is not in yet.
struct Waiting {
    stream: TcpStream,
    head: Vec<u8>,
    since: Instant,
    scraper: bool,
}

/// What reading a waiting connection gave.
enum Progress {
    /// More of the head may come.
    Pending,
    /// The head is in (or can never be: too large, or the client hung up).
    Done { complete: bool },
}

/// Accepts on `listener` for ever, reading each connection's request head without a thread,
/// and hands each request whose head is in (or cut) to `answer`. `scrapers`: the addresses
/// whose connections are never closed to make room for others.
pub(crate) fn run(listener: &TcpListener, scrapers: &[IpAddr], mut answer: impl FnMut(Request)) {
    if let Err(e) = listener.set_nonblocking(true) {
        tracing::warn!(error = %e, "metrics listener cannot be made non-blocking");
        return;
    }
    let mut waiting: VecDeque<Waiting> = VecDeque::new();
    loop {
        let now = Instant::now();
        // Past its deadline a connection is closed (dropped) unanswered.
        waiting.retain(|w| now.duration_since(w.since) < REQUEST_TIMEOUT);
        let wait = waiting
            .iter()
            .map(|w| (w.since + REQUEST_TIMEOUT).saturating_duration_since(now))
            .min();
        let ready = poll(listener, &waiting, wait);
        let mut kept = VecDeque::with_capacity(waiting.len());
        for (mut w, readable) in waiting.drain(..).zip(&ready[1..]) {
            if !readable {
                kept.push_back(w);
                continue;
            }
            match read_some(&mut w) {
                Progress::Pending => kept.push_back(w),
                Progress::Done { complete } => answer(Request {
                    stream: w.stream,
                    head: w.head,
                    complete,
                    scraper: w.scraper,
                }),
            }
        }
        waiting = kept;
        if ready[0] {
            accept_all(listener, scrapers, &mut waiting);
        }
    }
}

/// Which of the listener (first) and the waiting connections are readable, waiting at most
/// `wait` (`None`: until one is).
fn poll(listener: &TcpListener, waiting: &VecDeque<Waiting>, wait: Option<Duration>) -> Vec<bool> {
    let mut fds = Vec::with_capacity(waiting.len() + 1);
    fds.push(PollFd::new(listener, PollFlags::IN));
    fds.extend(
        waiting
            .iter()
            .map(|w| PollFd::new(&w.stream, PollFlags::IN)),
    );
    let timeout = wait.map(|d| rustix::time::Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    });
    if rustix::event::poll(&mut fds, timeout.as_ref()).is_err() {
        return vec![false; fds.len()];
    }
    let flags = PollFlags::IN | PollFlags::HUP | PollFlags::ERR;
    fds.iter().map(|f| f.revents().intersects(flags)).collect()
}

/// Accepts every connection waiting on `listener` into `waiting`, closing the oldest
/// waiting non-scraper (else the oldest) when [`MAX_WAITING`] wait already.
fn accept_all(listener: &TcpListener, scrapers: &[IpAddr], waiting: &mut VecDeque<Waiting>) {
    loop {
        let (stream, peer) = match listener.accept() {
            Ok(c) => c,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept failed");
                return;
            }
        };
        if stream.set_nonblocking(true).is_err() {
            continue;
        }
        if waiting.len() >= MAX_WAITING {
            let slowest = waiting.iter().position(|w| !w.scraper).unwrap_or(0);
            waiting.remove(slowest);
            tracing::debug!("metrics connection closed: {MAX_WAITING} waiting for their request");
        }
        waiting.push_back(Waiting {
            stream,
            head: Vec::with_capacity(512),
            since: Instant::now(),
            scraper: scrapers.contains(&peer.ip().to_canonical()),
        });
    }
}

/// Reads what `w` sent so far.
fn read_some(w: &mut Waiting) -> Progress {
    let mut buf = [0u8; 1024];
    loop {
        match w.stream.read(&mut buf) {
            Ok(0) => return Progress::Done { complete: false },
            Ok(n) => {
                w.head.extend_from_slice(&buf[..n]);
                if w.head.windows(4).any(|x| x == b"\r\n\r\n") {
                    return Progress::Done { complete: true };
                }
                if w.head.len() > MAX_REQUEST_BYTES {
                    return Progress::Done { complete: false };
                }
            }
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return Progress::Pending,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(_) => return Progress::Done { complete: false },
        }
    }
}
