//! Request slots: at most `s3.max_in_flight` downloads at once, shared fairly between the
//! users and datasets that want them, and capped for an endpoint that stalls.
//!
//! # Design
//! A download waits for a [`Slot`] under its [`Flow`] (the user whose job asked, and the
//! dataset) and its endpoint (service and bucket). When a slot is free it goes to the waiter
//! whose user holds the fewest slots, then whose dataset holds the fewest, then the oldest:
//! a user with many jobs queues behind a user with one, instead of ahead of it in arrival
//! order. An endpoint where a download stalled (no byte for `s3.stall_timeout_ms`, or the
//! fetch deadline passed) within the last [`STALLED_FOR`] may hold at most a quarter of the
//! slots, so a server that sends half a body and waits cannot hold every slot while other
//! servers' requests wait. A slot is given back when its download ends (or fails), and goes
//! at once to the next waiter.
//!
//! # Limitations
//! - Slots held are not taken back: a user that took every free slot while nobody else
//!   waited keeps them until its downloads end (each within its stall timeout and the fetch
//!   deadline).
//! - The endpoint cap is learnt from stalls; before the first one, a stalling endpoint may
//!   hold every slot for one stall timeout.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tokio::sync::oneshot;

/// How long an endpoint counts as stalling after its last stall.
pub(crate) const STALLED_FOR: Duration = Duration::from_secs(60);

/// Who a download is for: the user whose job asked (`None`: the daemon itself, a tool) and
/// the dataset.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub(crate) struct Flow {
    pub(crate) user: Option<u32>,
    pub(crate) dataset: Arc<str>,
}

impl Flow {
    /// The flow of the daemon's own reads (a tool, a file list's objects).
    pub(crate) fn own(dataset: &str) -> Flow {
        Flow {
            user: None,
            dataset: dataset.into(),
        }
    }
}

struct Waiter {
    flow: Flow,
    endpoint: Arc<str>,
    seq: u64,
    tx: oneshot::Sender<()>,
}

#[derive(Default)]
struct State {
    held: usize,
    by_user: HashMap<Option<u32>, usize>,
    by_flow: HashMap<Flow, usize>,
    by_endpoint: HashMap<Arc<str>, usize>,
    stalled: HashMap<Arc<str>, Instant>,
    waiting: Vec<Waiter>,
    seq: u64,
}

/// The request slots of one store.
pub(crate) struct Slots {
    capacity: usize,
    state: Mutex<State>,
}

impl std::fmt::Debug for Slots {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let st = self.lock();
        f.debug_struct("Slots")
            .field("capacity", &self.capacity)
            .field("held", &st.held)
            .field("waiting", &st.waiting.len())
            .finish()
    }
}

/// One slot held by a download of `flow` on `endpoint`; given back on drop.
pub(crate) struct Slot {
    slots: Arc<Slots>,
    flow: Flow,
    endpoint: Arc<str>,
}

impl std::fmt::Debug for Slot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Slot")
            .field("flow", &self.flow)
            .field("endpoint", &self.endpoint)
            .finish()
    }
}

impl Drop for Slot {
    fn drop(&mut self) {
        let mut st = self.slots.lock();
        release(&mut st, &self.flow, &self.endpoint);
        self.slots.dispatch(&mut st);
    }
}

impl Slots {
    /// `capacity` slots (at least 1).
    pub(crate) fn new(capacity: usize) -> Slots {
        Slots {
            capacity: capacity.max(1),
            state: Mutex::default(),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Waits for a slot for a download of `flow` on `endpoint`; `None` only if the slots are
    /// gone (never while the store lives).
    pub(crate) async fn acquire(self: &Arc<Self>, flow: &Flow, endpoint: &str) -> Option<Slot> {
        let endpoint: Arc<str> = endpoint.into();
        let rx = {
            let mut st = self.lock();
            let (tx, rx) = oneshot::channel();
            st.seq += 1;
            let seq = st.seq;
            st.waiting.push(Waiter {
                flow: flow.clone(),
                endpoint: endpoint.clone(),
                seq,
                tx,
            });
            self.dispatch(&mut st);
            rx
        };
        rx.await.ok()?;
        Some(Slot {
            slots: self.clone(),
            flow: flow.clone(),
            endpoint,
        })
    }

    /// Records that a download on `endpoint` stalled: the endpoint holds at most a quarter of
    /// the slots for [`STALLED_FOR`].
    pub(crate) fn stalled(&self, endpoint: &str) {
        let mut st = self.lock();
        st.stalled
            .insert(endpoint.into(), Instant::now() + STALLED_FOR);
    }

    /// How many slots `endpoint` may hold now.
    fn endpoint_cap(&self, st: &State, endpoint: &str) -> usize {
        match st.stalled.get(endpoint) {
            Some(until) if *until > Instant::now() => (self.capacity / 4).max(1),
            _ => self.capacity,
        }
    }

    /// Gives free slots to waiters, fairest first, until none is free or none may take one.
    fn dispatch(&self, st: &mut State) {
        let now = Instant::now();
        st.stalled.retain(|_, until| *until > now);
        while st.held < self.capacity {
            // Waiters whose receiver went (a cancelled download) leave the queue here.
            st.waiting.retain(|w| !w.tx.is_closed());
            let pick = (0..st.waiting.len())
                .filter(|&i| {
                    let e = &st.waiting[i].endpoint;
                    st.by_endpoint.get(e).copied().unwrap_or(0) < self.endpoint_cap(st, e)
                })
                .min_by_key(|&i| {
                    let w = &st.waiting[i];
                    (
                        st.by_user.get(&w.flow.user).copied().unwrap_or(0),
                        st.by_flow.get(&w.flow).copied().unwrap_or(0),
                        w.seq,
                    )
                });
            let Some(i) = pick else { return };
            let w = st.waiting.swap_remove(i);
            st.held += 1;
            *st.by_user.entry(w.flow.user).or_default() += 1;
            *st.by_flow.entry(w.flow.clone()).or_default() += 1;
            *st.by_endpoint.entry(w.endpoint.clone()).or_default() += 1;
            if w.tx.send(()).is_err() {
                // Cancelled between the check and the send: the slot is free again.
                release(st, &w.flow, &w.endpoint);
            }
        }
    }
}

/// Counts one slot of `flow` on `endpoint` as free.
fn release(st: &mut State, flow: &Flow, endpoint: &Arc<str>) {
    st.held = st.held.saturating_sub(1);
    let dec = |n: &mut usize| {
        *n = n.saturating_sub(1);
        *n > 0
    };
    if !st.by_user.get_mut(&flow.user).is_some_and(dec) {
        st.by_user.remove(&flow.user);
    }
    if !st.by_flow.get_mut(flow).is_some_and(dec) {
        st.by_flow.remove(flow);
    }
    if !st.by_endpoint.get_mut(endpoint).is_some_and(dec) {
        st.by_endpoint.remove(endpoint);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn flow(user: u32, dataset: &str) -> Flow {
        Flow {
            user: Some(user),
            dataset: dataset.into(),
        }
    }

    #[test]
    fn a_freed_slot_goes_to_the_user_holding_fewest_and_a_stalled_endpoint_is_capped() {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        rt.block_on(async {
            let slots = Arc::new(Slots::new(4));
            let hog = flow(1, "a");
            let mut held = Vec::new();
            for _ in 0..4 {
                held.push(slots.acquire(&hog, "bad").await.unwrap());
            }
            // The hog queues 3 more, then another user asks: the next free slot is theirs.
            let queued: Vec<_> = (0..3)
                .map(|_| {
                    let (s, f) = (slots.clone(), hog.clone());
                    tokio::spawn(async move { s.acquire(&f, "bad").await })
                })
                .collect();
            tokio::task::yield_now().await;
            let (s, other) = (slots.clone(), flow(2, "b"));
            let theirs = tokio::spawn(async move { s.acquire(&other, "good").await });
            tokio::task::yield_now().await;
            // The stalled endpoint may now hold one slot (a quarter of 4).
            slots.stalled("bad");
            held.pop();
            let theirs = theirs.await.unwrap().unwrap();
            assert_eq!(theirs.flow.user, Some(2));
            held.pop();
            held.pop();
            held.pop();
            // Of the hog's 3 queued, one gets a slot (the cap), two wait while it is held.
            tokio::task::yield_now().await;
            let st = slots.lock();
            assert_eq!(st.by_endpoint.get("bad").copied(), Some(1));
            assert_eq!(st.waiting.len(), 2);
            drop(st);
            for q in queued {
                q.abort();
            }
        });
    }
}
