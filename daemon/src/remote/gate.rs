//! What peers may hold on a worker: handshakes in progress, authenticated connections, and
//! pixel memory, counted per peer address.
//!
//! # Design
//! - A connection that has not authenticated yet is *pending*: at most [`MAX_HANDSHAKES`] in
//!   all, [`MAX_HANDSHAKES_PER_PEER`] per address and [`MAX_HANDSHAKES_PER_PREFIX`] per IPv6
//!   /64, each for at most `super::worker::HANDSHAKE_TIMEOUT`. A new connection over a cap
//!   is not refused: a pending one of the same address (or network, or any) is shut down
//!   instead: first one whose peer has hung up already (a connect-and-drop flood's), then
//!   one from an address that never authenticated (so known home daemons keep their
//!   places), then the oldest; logged once per power of two. Refusing at the cap would let peers that never authenticate keep everyone
//!   out; a short deadline alone would still let them fill every slot for that long. With
//!   eviction a home daemon's handshake (one round trip) fails only if
//!   [`MAX_HANDSHAKES_PER_PEER`] newer connections from its address, or [`MAX_HANDSHAKES`]
//!   in all, arrive within that round trip; it then tries again after its backoff.
//! - Pending connections hold no slot of `max_connections` or `max_connections_per_peer`:
//!   only an authenticated one counts (it is told the cap it hit, and closed).
//! - Pixel memory (the buffers of a connection's jobs) is counted per address against
//!   `max_bytes_per_peer` before a unit grows a buffer; a unit over it is refused with the
//!   reason. A connection's bytes and its slot are given back when it ends.
//!
//! # Limitations
//! - Per address, not per home daemon: home daemons behind one NAT share their caps.
//! - A job's decoder scratch memory is not counted, only its pixel buffer.

#![forbid(unsafe_code)]

use std::collections::{HashMap, HashSet, VecDeque};
use std::net::{IpAddr, Ipv6Addr, Shutdown, TcpStream};
use std::sync::Mutex;

use stoker_pipeline::sync::lock;

/// Most connections waiting to authenticate, in all.
pub(crate) const MAX_HANDSHAKES: usize = 32;
/// Most connections from one address waiting to authenticate.
pub(crate) const MAX_HANDSHAKES_PER_PEER: usize = 8;
/// Most connections from one IPv6 /64 network waiting to authenticate (one host usually
/// holds a whole /64, so its addresses are counted together as well as one by one).
pub(crate) const MAX_HANDSHAKES_PER_PREFIX: usize = 16;
/// Addresses remembered as having authenticated (their pending handshakes give way last).
const MAX_KNOWN: usize = 4096;

/// The caps of `[worker]` that the gate keeps.
#[derive(Debug, Clone, Copy)]
pub(crate) struct GateLimits {
    pub max_connections: usize,
    pub max_per_peer: usize,
    pub max_bytes_per_peer: u64,
}

/// Which cap of `[worker]` refused a connection or a unit's pixel memory; the text is the
/// reason the peer is sent.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GateRefusal {
    /// Authenticated connections from every peer are at `worker.max_connections`.
    #[error("{open} connections open: worker.max_connections is {max}")]
    Connections {
        /// Connections open now.
        open: usize,
        /// `worker.max_connections`.
        max: usize,
    },
    /// This peer address's connections are at `worker.max_connections_per_peer`.
    #[error("{open} connections from this address: worker.max_connections_per_peer is {max}")]
    PeerConnections {
        /// Connections open now from this address.
        open: usize,
        /// `worker.max_connections_per_peer`.
        max: usize,
    },
    /// The pixel memory asked for would take this peer address past
    /// `worker.max_bytes_per_peer`.
    #[error(
        "{bytes} more bytes of pixels, with {held} held for this address: over \
         worker.max_bytes_per_peer {max}"
    )]
    PeerBytes {
        /// Bytes asked for.
        bytes: u64,
        /// Bytes this address holds already.
        held: u64,
        /// `worker.max_bytes_per_peer`.
        max: u64,
    },
}

/// The worker's count of who holds what.
pub(crate) struct Gate {
    limits: GateLimits,
    state: Mutex<State>,
}

#[derive(Default)]
struct State {
    pending: VecDeque<Pending>,
    next: u64,
    evicted: u64,
    peers: HashMap<IpAddr, PeerUse>,
    /// Addresses that authenticated since the worker started (at most [`MAX_KNOWN`]).
    known: HashSet<IpAddr>,
}

/// A connection still in its handshake, with a handle to shut it down.
struct Pending {
    id: u64,
    ip: IpAddr,
    stream: TcpStream,
}

#[derive(Default)]
struct PeerUse {
    connections: usize,
    bytes: u64,
}

impl Gate {
    pub(crate) fn new(limits: GateLimits) -> Gate {
        Gate {
            limits,
            state: Mutex::default(),
        }
    }

    /// Counts `stream` from `ip` as pending; shuts the oldest pending connection down when
    /// a cap is hit. Returns its ticket for [`Gate::handshake_over`].
    pub(crate) fn pending(&self, ip: IpAddr, stream: &TcpStream) -> Option<u64> {
        let stream = stream.try_clone().ok()?;
        let ip = ip.to_canonical();
        let mut s = lock(&self.state);
        let id = s.next;
        s.next += 1;
        s.pending.push_back(Pending { id, ip, stream });
        let all: Vec<usize> = (0..s.pending.len()).collect();
        let of = |same: &dyn Fn(IpAddr) -> bool| -> Vec<usize> {
            (all.iter().copied())
                .filter(|&i| same(s.pending[i].ip))
                .collect()
        };
        let mine = of(&|p| p == ip);
        let network = of(&|p| prefix(p) == prefix(ip));
        let candidates = if mine.len() > MAX_HANDSHAKES_PER_PEER {
            mine
        } else if network.len() > MAX_HANDSHAKES_PER_PREFIX {
            network
        } else if s.pending.len() > MAX_HANDSHAKES {
            all
        } else {
            Vec::new()
        };
        // A peer that hung up already goes first (a connect-and-drop flood), then one of an
        // address never authenticated, then the oldest.
        let victim = (candidates.iter().copied())
            .find(|&i| hung_up(&s.pending[i].stream))
            .or_else(|| (candidates.iter().copied()).find(|&i| !s.known.contains(&s.pending[i].ip)))
            .or(candidates.first().copied());
        if let Some(old) = victim.and_then(|at| s.pending.remove(at)) {
            let _ = old.stream.shutdown(Shutdown::Both);
            s.evicted += 1;
            // One line per power of two: a flood of them is not a flood of lines.
            if s.evicted.is_power_of_two() {
                tracing::warn!(
                    peer = %old.ip,
                    evicted = s.evicted,
                    "worker dropped an unfinished handshake to make room ({MAX_HANDSHAKES_PER_PEER} \
                     per address, {MAX_HANDSHAKES_PER_PREFIX} per IPv6 /64, {MAX_HANDSHAKES} in all)"
                );
            }
        }
        Some(id)
    }

    /// The handshake of `ticket` has ended (passed or not).
    pub(crate) fn handshake_over(&self, ticket: Option<u64>) {
        if let Some(id) = ticket {
            lock(&self.state).pending.retain(|p| p.id != id);
        }
    }

    /// Counts an authenticated connection from `ip`, or says which cap refuses it.
    pub(crate) fn admit(&self, ip: IpAddr) -> Result<(), GateRefusal> {
        let mut s = lock(&self.state);
        // It proved the secret: its later handshakes give way last.
        if s.known.len() < MAX_KNOWN {
            s.known.insert(ip.to_canonical());
        }
        let total: usize = s.peers.values().map(|p| p.connections).sum();
        let max = self.limits.max_connections;
        if total >= max {
            return Err(GateRefusal::Connections { open: total, max });
        }
        let mine = s.peers.entry(ip).or_default();
        if mine.connections >= self.limits.max_per_peer {
            return Err(GateRefusal::PeerConnections {
                open: mine.connections,
                max: self.limits.max_per_peer,
            });
        }
        mine.connections += 1;
        Ok(())
    }

    /// Reserves `bytes` more of pixel memory for `ip`, or says why not.
    pub(crate) fn reserve(&self, ip: IpAddr, bytes: u64) -> Result<(), GateRefusal> {
        let mut s = lock(&self.state);
        let mine = s.peers.entry(ip).or_default();
        let max = self.limits.max_bytes_per_peer;
        if mine.bytes.saturating_add(bytes) > max {
            return Err(GateRefusal::PeerBytes {
                bytes,
                held: mine.bytes,
                max,
            });
        }
        mine.bytes += bytes;
        Ok(())
    }

    /// Gives back `bytes` of `ip`'s pixel memory.
    pub(crate) fn release(&self, ip: IpAddr, bytes: u64) {
        if let Some(p) = lock(&self.state).peers.get_mut(&ip) {
            p.bytes = p.bytes.saturating_sub(bytes);
        }
    }

    /// An authenticated connection of `ip` has ended, holding `bytes`.
    pub(crate) fn leave(&self, ip: IpAddr, bytes: u64) {
        let mut s = lock(&self.state);
        if let Some(p) = s.peers.get_mut(&ip) {
            p.connections = p.connections.saturating_sub(1);
            p.bytes = p.bytes.saturating_sub(bytes);
            if p.connections == 0 {
                s.peers.remove(&ip);
            }
        }
    }
}

/// The network an address counts in besides itself: an IPv6 address's /64 (an IPv4
/// address is its own).
fn prefix(ip: IpAddr) -> IpAddr {
    match ip {
        IpAddr::V4(_) => ip,
        IpAddr::V6(v6) => {
            let s = v6.segments();
            IpAddr::V6(Ipv6Addr::new(s[0], s[1], s[2], s[3], 0, 0, 0, 0))
        }
    }
}

/// Whether the peer of `stream` has hung up (its end shut down, or reset).
fn hung_up(stream: &TcpStream) -> bool {
    use rustix::event::{PollFd, PollFlags};
    let mut fds = [PollFd::new(stream, PollFlags::RDHUP)];
    let zero = rustix::time::Timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    matches!(rustix::event::poll(&mut fds, Some(&zero)), Ok(n) if n > 0)
        && fds[0]
            .revents()
            .intersects(PollFlags::RDHUP | PollFlags::HUP | PollFlags::ERR)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::io::Read;
    use std::net::TcpListener;

    fn gate() -> Gate {
        Gate::new(GateLimits {
            max_connections: 3,
            max_per_peer: 2,
            max_bytes_per_peer: 100,
        })
    }

    #[test]
    fn the_oldest_pending_handshake_of_an_address_makes_room_for_a_new_one() {
        let g = gate();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ip = listener.local_addr().unwrap().ip();
        let mut clients = Vec::new();
        let mut tickets = Vec::new();
        for _ in 0..=MAX_HANDSHAKES_PER_PEER {
            clients.push(TcpStream::connect(listener.local_addr().unwrap()).unwrap());
            let (s, _) = listener.accept().unwrap();
            tickets.push(g.pending(ip, &s));
        }
        // The first was shut down: its client reads the end at once.
        let mut byte = [0u8; 1];
        assert_eq!(clients[0].read(&mut byte).unwrap(), 0);
        assert_eq!(lock(&g.state).pending.len(), MAX_HANDSHAKES_PER_PEER);
        for t in tickets {
            g.handshake_over(t);
        }
        assert!(lock(&g.state).pending.is_empty());
    }

    #[test]
    fn a_hung_up_handshake_gives_way_before_a_live_one_and_ipv6_counts_by_64() {
        let g = gate();
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let ip = listener.local_addr().unwrap().ip();
        let mut live = Vec::new();
        let mut accepted = Vec::new();
        for i in 0..=MAX_HANDSHAKES_PER_PEER {
            let c = TcpStream::connect(listener.local_addr().unwrap()).unwrap();
            let (s, _) = listener.accept().unwrap();
            // The fourth client hangs up at once.
            if i == 3 {
                drop(c);
                std::thread::sleep(std::time::Duration::from_millis(50));
            } else {
                live.push(c);
            }
            g.pending(ip, &s);
            accepted.push(s);
        }
        // The oldest live client still waits: the hung-up one made the room.
        let _ = live[0].set_read_timeout(Some(std::time::Duration::from_millis(100)));
        let mut byte = [0u8; 1];
        assert!(live[0].read(&mut byte).is_err(), "the oldest live one kept");
        assert_eq!(lock(&g.state).pending.len(), MAX_HANDSHAKES_PER_PEER);
        let a: IpAddr = "2001:db8:1:2:aaaa::1".parse().unwrap();
        let b: IpAddr = "2001:db8:1:2:bbbb::9".parse().unwrap();
        assert_eq!(prefix(a), prefix(b));
        assert_ne!(prefix(a), prefix("2001:db8:1:3::1".parse().unwrap()));
    }

    #[test]
    fn connections_and_bytes_are_capped_per_address_and_given_back() {
        let g = gate();
        let (a, b): (IpAddr, IpAddr) = ("10.0.0.1".parse().unwrap(), "10.0.0.2".parse().unwrap());
        assert!(g.admit(a).is_ok() && g.admit(a).is_ok());
        assert!(g
            .admit(a)
            .unwrap_err()
            .to_string()
            .contains("max_connections_per_peer is 2"));
        assert!(g.admit(b).is_ok());
        assert!(g
            .admit(b)
            .unwrap_err()
            .to_string()
            .contains("worker.max_connections is 3"));
        assert!(g.reserve(a, 60).is_ok());
        assert!(g
            .reserve(a, 41)
            .unwrap_err()
            .to_string()
            .contains("max_bytes_per_peer 100"));
        assert!(g.reserve(b, 100).is_ok());
        g.leave(a, 60);
        g.leave(a, 0);
        assert!(g.reserve(a, 100).is_ok() && g.admit(a).is_ok());
    }
}
