//! What peers may hold on a worker: handshakes in progress, authenticated connections, and
//! pixel memory, counted per peer address.
//!
//! # Design
//! - A connection that has not authenticated yet is *pending*: at most [`MAX_HANDSHAKES`] in
//!   all and [`MAX_HANDSHAKES_PER_PEER`] per address, each for at most
//!   `super::worker::HANDSHAKE_TIMEOUT`. A new connection over either cap is not refused:
//!   the oldest pending one (of its own address when that cap is hit) is shut down instead,
//!   logged. Refusing at the cap would let peers that never authenticate keep everyone
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

use std::collections::{HashMap, VecDeque};
use std::net::{IpAddr, Shutdown, TcpStream};
use std::sync::Mutex;

use stoker_pipeline::sync::lock;

/// Most connections waiting to authenticate, in all.
pub(crate) const MAX_HANDSHAKES: usize = 32;
/// Most connections from one address waiting to authenticate.
pub(crate) const MAX_HANDSHAKES_PER_PEER: usize = 8;

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
        let mut s = lock(&self.state);
        let id = s.next;
        s.next += 1;
        s.pending.push_back(Pending { id, ip, stream });
        let mine = s.pending.iter().filter(|p| p.ip == ip).count();
        let victim = if mine > MAX_HANDSHAKES_PER_PEER {
            s.pending.iter().position(|p| p.ip == ip)
        } else {
            (s.pending.len() > MAX_HANDSHAKES).then_some(0)
        };
        if let Some(old) = victim.and_then(|at| s.pending.remove(at)) {
            let _ = old.stream.shutdown(Shutdown::Both);
            s.evicted += 1;
            // One line per power of two: a flood of them is not a flood of lines.
            if s.evicted.is_power_of_two() {
                tracing::warn!(
                    peer = %old.ip,
                    evicted = s.evicted,
                    "worker dropped the oldest unfinished handshake to make room \
                     ({MAX_HANDSHAKES_PER_PEER} per address, {MAX_HANDSHAKES} in all)"
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
