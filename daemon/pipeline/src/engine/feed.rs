//! One attached rank's feed: the handle through which its connection receives ready batches
//! and releases them (the slots themselves are `slots`).
//!
//! # Design
//! - Dropping a [`Feed`] waits until no worker writes into its ring any more.

#![forbid(unsafe_code)]

use crate::sync::{lock, wait, wait_timeout};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::backend::BackendFault;
use super::job::Job;
use super::memory::SlotMemory;
use super::scheduler::Shared;
use super::slots::{FeedEvent, FeedShared, FeedState};
use super::PipelineError;

/// Wakes a feed's consumer (see [`Feed::waker`]); a wake is remembered until consumed, so
/// one sent just before the consumer waits is not lost.
#[derive(Clone)]
pub struct FeedWaker(Arc<FeedShared>);

impl FeedWaker {
    /// Wakes the consumer (or makes its next wait return at once).
    pub fn wake(&self) {
        lock(&self.0.state).woken = true;
        self.0.changed.notify_all();
    }
}

/// One rank's stream of ready batches. Dropping it stops the feed and waits until no worker
/// writes into its ring any more, so the ring may be unmapped afterwards.
pub struct Feed {
    pub(super) shared: Arc<FeedShared>,
    pub(super) engine: Arc<Shared>,
}

impl std::fmt::Debug for FeedWaker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FeedWaker")
            .field("rank", &self.0.rank)
            .finish_non_exhaustive()
    }
}

impl std::fmt::Debug for Feed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Feed")
            .field("rank", &self.shared.rank)
            .field("job", &self.shared.job)
            .finish_non_exhaustive()
    }
}

impl Feed {
    /// The rank this feed serves.
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    /// The job the rank belongs to.
    pub fn job(&self) -> &Arc<Job> {
        &self.shared.job
    }

    /// The ring the feed's batches are written into.
    pub fn ring(&self) -> &Arc<dyn SlotMemory> {
        &self.shared.ring
    }

    /// A handle that wakes this feed's consumer out of [`Feed::recv_wakeable`] or
    /// [`Feed::wait_woken`] (the connection ended, the daemon drains).
    pub fn waker(&self) -> FeedWaker {
        FeedWaker(Arc::clone(&self.shared))
    }

    /// Waits for the next batch in order, or until woken (`None`).
    pub fn recv_wakeable(&self) -> Result<Option<FeedEvent>, PipelineError> {
        let mut st = lock(&self.shared.state);
        loop {
            if std::mem::take(&mut st.woken) {
                return Ok(None);
            }
            if let Some(ev) = self.poll_event(&mut st)? {
                return Ok(Some(ev));
            }
            st = wait(&self.shared.changed, st);
        }
    }

    /// Why the feed failed, if it did, without waiting.
    pub fn failure(&self) -> Option<BackendFault> {
        lock(&self.shared.state).failed.clone()
    }

    /// Waits until woken, whatever the feed does meanwhile.
    pub fn wait_woken(&self) {
        let mut st = lock(&self.shared.state);
        while !std::mem::take(&mut st.woken) {
            st = wait(&self.shared.changed, st);
        }
    }

    /// The next event if there is one now: a batch (leased to the consumer from here on), the
    /// end of the data, or why the feed cannot go on.
    fn poll_event(&self, st: &mut FeedState) -> Result<Option<FeedEvent>, PipelineError> {
        if st.stopped {
            return Err(PipelineError::Stopped);
        }
        if let Some(fault) = &st.failed {
            return Err(PipelineError::Backend(fault.clone()));
        }
        if let Some(ready) = st.ready.pop_front() {
            st.slots[ready.slot].leased = true;
            return Ok(Some(FeedEvent::Ready(ready)));
        }
        let finished = self.shared.job.is_past_end(st.next) || self.shared.job.steps.per_epoch == 0;
        if finished && st.dispatching.is_none() && st.in_flight.is_empty() {
            return Ok(Some(FeedEvent::EndOfData));
        }
        Ok(None)
    }

    /// Waits for the next batch in order.
    pub fn recv(&self) -> Result<FeedEvent, PipelineError> {
        loop {
            if let Some(ev) = self.recv_timeout(Duration::from_secs(3600))? {
                return Ok(ev);
            }
        }
    }

    /// Waits up to `timeout` for the next batch; `None` if none came.
    pub fn recv_timeout(&self, timeout: Duration) -> Result<Option<FeedEvent>, PipelineError> {
        let deadline = Instant::now() + timeout;
        let mut st = lock(&self.shared.state);
        loop {
            if let Some(ev) = self.poll_event(&mut st)? {
                return Ok(Some(ev));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            st = wait_timeout(&self.shared.changed, st, deadline - now).0;
        }
    }

    /// Gives a received slot back to the producer.
    pub fn release(&self, slot: usize, generation: u64) -> Result<(), PipelineError> {
        let mut st = lock(&self.shared.state);
        match st.slots.get_mut(slot) {
            Some(s) if s.leased && s.generation == generation => {
                s.leased = false;
                st.free.push_back(slot);
            }
            _ => return Err(PipelineError::NotLeased { slot, generation }),
        }
        drop(st);
        self.engine.work.notify_all();
        Ok(())
    }

    /// Gives back every slot the consumer holds (the client went away).
    pub fn release_all(&self) {
        let mut st = lock(&self.shared.state);
        let st = &mut *st;
        for (i, s) in st.slots.iter_mut().enumerate() {
            if s.leased {
                s.leased = false;
                st.free.push_back(i);
            }
        }
        self.engine.work.notify_all();
    }

    /// Slots currently held by the consumer.
    pub fn leased(&self) -> usize {
        let st = lock(&self.shared.state);
        st.slots.iter().filter(|s| s.leased).count()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut st = lock(&self.shared.state);
        st.stopped = true;
        while st.writers > 0 {
            st = wait(&self.shared.changed, st);
        }
        drop(st);
        let mut sched = lock(&self.engine.sched);
        for j in sched.jobs.iter_mut() {
            j.feeds.retain(|f| !Arc::ptr_eq(f, &self.shared));
        }
        sched.jobs.retain(|j| !j.feeds.is_empty());
    }
}
