//! A worker entry's name resolved again every `[remote] resolve_interval_s`, so the pods of
//! a Kubernetes headless Service (or any name whose addresses change) are followed without
//! a restart.
//!
//! # Design
//! - One [`Resolver`] per `[remote] workers` entry, shared by the entry's connections: one
//!   lookup per interval, not one per connection. The answer is sorted, so each connection's
//!   place among the addresses ([`Answer::target`]) is the same for the same set whatever
//!   order the resolver gives, and a change of the set is a new generation, logged with
//!   the addresses added and gone.
//! - A connection is kept while its address is in the answer and either the set has not
//!   changed since it was made or it is at its place ([`keeps`]); else it is closed between
//!   two units (drained: the unit it holds completes) and made again at its place. So an
//!   address that vanished loses its connections, and one that appeared gets the
//!   connections whose place is now its own.
//! - A lookup that fails keeps the last answer (logged); with no answer yet the connection
//!   is down and its units are filled locally, as when a worker cannot be reached.
//!
//! # Limitations
//! - An entry has `remote.connections` connections, fixed at start: pods past that count get
//!   none (set it to at least the most pods the Service will have).

#![forbid(unsafe_code)]

use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use stoker_pipeline::sync::lock;

type Lookup = Box<dyn Fn(&str) -> std::io::Result<Vec<SocketAddr>> + Send + Sync>;

/// A worker entry's name and its last answer.
pub(crate) struct Resolver {
    name: String,
    interval: Duration,
    lookup: Lookup,
    state: Mutex<(Answer, Option<Instant>)>,
}

/// The addresses a name resolved to, sorted, and the generation of that set.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct Answer {
    pub addrs: Vec<SocketAddr>,
    pub generation: u64,
}

impl Answer {
    /// The address of the connection at `place`.
    pub(crate) fn target(&self, place: usize) -> Option<SocketAddr> {
        (!self.addrs.is_empty()).then(|| self.addrs[place % self.addrs.len()])
    }
}

/// Whether a connection to `peer` made under generation `made` stays, as the connection at
/// `place`, given the answer `now`.
pub(crate) fn keeps(peer: SocketAddr, made: u64, place: usize, now: &Answer) -> bool {
    now.addrs.contains(&peer) && (made == now.generation || now.target(place) == Some(peer))
}

/// Why a worker's name has no address to connect to.
#[derive(Debug, thiserror::Error)]
pub(crate) enum ResolveError {
    /// The lookup failed and no earlier answer is kept.
    #[error("resolve {name}: {source}")]
    Lookup {
        /// The name as configured (`host:port`).
        name: String,
        /// What the resolver reported.
        source: std::io::Error,
    },
    /// The lookup answered no address.
    #[error("{name} resolves to no address")]
    Empty {
        /// The name as configured (`host:port`).
        name: String,
    },
}

impl Resolver {
    /// `name` (`host:port`) resolved by the system's resolver every `interval`.
    pub(crate) fn new(name: &str, interval: Duration) -> Resolver {
        Resolver::with_lookup(
            name,
            interval,
            Box::new(|n: &str| n.to_socket_addrs().map(Iterator::collect)),
        )
    }

    fn with_lookup(name: &str, interval: Duration, lookup: Lookup) -> Resolver {
        Resolver {
            name: name.to_owned(),
            interval,
            lookup,
            state: Mutex::default(),
        }
    }

    /// The name as configured (`host:port`).
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The current answer, looked up again once older than the interval (or while there
    /// is none); why there is none.
    pub(crate) fn answer(&self) -> Result<Answer, ResolveError> {
        let mut state = lock(&self.state);
        let (answer, at) = &mut *state;
        let stale = at.is_none_or(|t| t.elapsed() >= self.interval) || answer.addrs.is_empty();
        if stale {
            *at = Some(Instant::now());
            match (self.lookup)(&self.name) {
                Ok(mut addrs) => {
                    addrs.sort_unstable();
                    addrs.dedup();
                    if addrs != answer.addrs {
                        let added: Vec<_> =
                            addrs.iter().filter(|a| !answer.addrs.contains(a)).collect();
                        let gone: Vec<_> =
                            answer.addrs.iter().filter(|a| !addrs.contains(a)).collect();
                        tracing::info!(worker = %self.name, ?added, ?gone,
                            "the worker's name resolves to other addresses");
                        answer.addrs = addrs;
                        answer.generation += 1;
                    }
                }
                Err(source) if answer.addrs.is_empty() => {
                    return Err(ResolveError::Lookup {
                        name: self.name.clone(),
                        source,
                    })
                }
                Err(e) => tracing::warn!(worker = %self.name, error = %e,
                    "cannot resolve the worker's name: keeping its last addresses"),
            }
        }
        if answer.addrs.is_empty() {
            return Err(ResolveError::Empty {
                name: self.name.clone(),
            });
        }
        Ok(answer.clone())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    fn addr(last: u8) -> SocketAddr {
        SocketAddr::from(([10, 0, 0, last], 7411))
    }

    #[test]
    fn a_name_is_looked_up_again_and_connections_follow_its_addresses() {
        let now: Arc<Mutex<Vec<SocketAddr>>> = Arc::new(Mutex::new(vec![addr(2)]));
        let seen = Arc::clone(&now);
        let r = Resolver::with_lookup(
            "workers:7411",
            Duration::ZERO,
            Box::new(move |_| Ok(lock(&seen).clone())),
        );
        let first = r.answer().unwrap();
        assert_eq!((first.addrs.clone(), first.generation), (vec![addr(2)], 1));
        // Both connections (places 0 and 1) are on the one address.
        assert!(keeps(addr(2), 1, 0, &first) && keeps(addr(2), 1, 1, &first));
        // A pod is added (the resolver answers in another order): place 1 moves to it.
        *lock(&now) = vec![addr(3), addr(2)];
        let second = r.answer().unwrap();
        assert_eq!(second.addrs, vec![addr(2), addr(3)]);
        assert_eq!(second.generation, 2);
        assert!(keeps(addr(2), 1, 0, &second));
        assert!(!keeps(addr(2), 1, 1, &second));
        assert!(keeps(addr(3), 2, 1, &second));
        // The same set again is no new generation.
        assert_eq!(r.answer().unwrap().generation, 2);
        // The first pod goes: its connection is drained.
        *lock(&now) = vec![addr(3)];
        let third = r.answer().unwrap();
        assert!(!keeps(addr(2), 2, 0, &third));
        assert!(keeps(addr(3), 2, 1, &third));
        assert_eq!(third.target(0), Some(addr(3)));
        // A failed lookup keeps the last answer.
        let failing = Resolver::with_lookup(
            "gone:1",
            Duration::ZERO,
            Box::new(|_| Err(std::io::Error::other("no such host"))),
        );
        assert!(failing
            .answer()
            .unwrap_err()
            .to_string()
            .contains("no such host"));
    }
}
