//! One attached rank's ring slots: which are free, being filled, ready or leased; the batches
//! in flight and their units; in-order publishing. The rank's handle is [`super::Feed`].
//!
//! # Design
//! - A batch is split into units; a batch is published once all its units are done, and
//!   batches are published in (epoch, step) order even when they finish out of order.
//! - A slot leased by the consumer is never handed out until released.
//!
//! # Limitations
//! - One consumer per feed.

use crate::sync::lock;
use std::collections::{BTreeMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::backend::{BackendFault, UnitSize};
use super::job::Job;
use super::memory::SlotMemory;
use super::mix::{mix_batch, MixBatch};
use super::Position;
use crate::source::index::Staged;
use crate::source::object::Prefetch;
use crate::transform::sampler::Sampler;

/// A batch handed to the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    /// The ring slot that holds the batch.
    pub slot: usize,
    /// The slot's generation as published (its RELEASE must name it).
    pub generation: u64,
    /// The batch's epoch.
    pub epoch: u64,
    /// The batch's step within the epoch (the rank's own count).
    pub step: u64,
    /// Samples in the batch (less than the batch size only in a final partial batch).
    pub n: usize,
}

/// What a feed's consumer receives next.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedEvent {
    /// A batch is ready in a slot and leased to the consumer.
    Ready(Ready),
    /// The job's last epoch is done.
    EndOfData,
}
pub(super) struct SlotState {
    pub(super) generation: u64,
    /// Global sample indices of the batch being written into the slot.
    pub(super) indices: Vec<u64>,
    pub(super) units_left: usize,
    /// Units of the batch not yet filled: the one whose finish brings it to 0 runs the
    /// batch mix, before its own `units_left` is counted down (so before publishing).
    pub(super) unfilled: usize,
    pub(super) leased: bool,
    /// The objects of the batch being dispatched, on their way into the node cache: its
    /// units are handed out once they all arrived or the batch is due, so that no worker
    /// waits for the network (dropped once its last unit is handed out; the units hold it).
    pub(super) staged: Option<Arc<dyn Staged>>,
}

pub(super) struct FeedState {
    /// This rank's share of each epoch (it caches the current epoch's permutation).
    pub(super) sampler: Sampler,
    /// The next batch to start.
    pub(super) next: Position,
    pub(super) free: VecDeque<usize>,
    pub(super) slots: Vec<SlotState>,
    /// The batch whose units are being handed out.
    pub(super) dispatching: Option<Dispatch>,
    /// Batches started and not yet published, by position.
    pub(super) in_flight: BTreeMap<Position, usize>,
    /// Completed batches, in order, not yet received by the consumer.
    pub(super) ready: VecDeque<Ready>,
    /// The position the consumer sees next.
    pub(super) publish_next: Position,
    pub(super) stopped: bool,
    /// Units handed to workers and not yet finished (complete, for pending backends).
    pub(super) writers: usize,
    /// Why the backend can no longer fill this feed's ring (a GPU fault); the consumer is
    /// told instead of receiving more batches.
    pub(super) failed: Option<BackendFault>,
    /// Set by a [`FeedWaker`], consumed by the consumer's next wake-able wait.
    pub(super) woken: bool,
    /// The last epoch whose order the dataset's storage was told ([`FeedShared::prefetch`]).
    pub(super) scheduled: Option<u64>,
}

/// The batch whose units are being handed out.
#[derive(Debug, Clone, Copy)]
pub(super) struct Dispatch {
    pub(super) slot: usize,
    pub(super) pos: Position,
    /// Where in the batch the next unit starts.
    pub(super) next_start: usize,
}

pub(super) struct FeedShared {
    pub(super) job: Arc<Job>,
    pub(super) rank: u32,
    pub(super) ring: Arc<dyn SlotMemory>,
    pub(super) state: Mutex<FeedState>,
    /// Signalled when a batch becomes ready, a writer finishes, or the feed stops.
    pub(super) changed: Condvar,
    /// Told this rank's order as it starts each epoch, so object storage fetches ahead what
    /// this rank reads next (stops when the feed goes).
    pub(super) prefetch: Prefetch,
    /// Wakes the engine's workers: a staged batch's objects arrived, or it is due.
    pub(super) wake: Arc<dyn Fn() + Send + Sync>,
}

impl FeedShared {
    pub(super) fn new(
        job: Arc<Job>,
        rank: u32,
        ring: Arc<dyn SlotMemory>,
        sampler: Sampler,
        start: Position,
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> FeedShared {
        let slots = ring.layout().slots;
        FeedShared {
            state: Mutex::new(FeedState {
                sampler,
                next: start,
                free: (0..slots).collect(),
                slots: (0..slots)
                    .map(|_| SlotState {
                        generation: 0,
                        indices: Vec::with_capacity(job.spec.batch_size as usize),
                        units_left: 0,
                        unfilled: 0,
                        leased: false,
                        staged: None,
                    })
                    .collect(),
                dispatching: None,
                in_flight: BTreeMap::new(),
                ready: VecDeque::new(),
                publish_next: start,
                stopped: false,
                writers: 0,
                failed: None,
                woken: false,
                scheduled: None,
            }),
            job,
            rank,
            ring,
            changed: Condvar::new(),
            prefetch: Prefetch::default(),
            wake,
        }
    }

    pub(super) fn advance(&self, pos: Position) -> Position {
        pos.next(&self.job.steps)
    }

    /// Hands out the next unit of this feed, starting a new batch if a slot is free.
    pub(super) fn take_unit(self: &Arc<Self>, unit_size: UnitSize) -> Option<Unit> {
        let mut st = lock(&self.state);
        if st.stopped || st.failed.is_some() {
            return None;
        }
        if st.dispatching.is_none() {
            if self.job.is_past_end(st.next) || self.job.steps.per_epoch == 0 {
                return None;
            }
            let slot = st.free.pop_front()?;
            let pos = st.next;
            st.next = self.advance(pos);
            let st = &mut *st;
            if st.scheduled != Some(pos.epoch) {
                st.scheduled = Some(pos.epoch);
                self.schedule(&mut st.sampler, pos);
            }
            let s = &mut st.slots[slot];
            st.sampler
                .batch_indices_into(pos.epoch, pos.step, &mut s.indices);
            let len = s.indices.len();
            s.units_left = len.div_ceil(unit_size.samples(len)).max(1);
            s.unfilled = s.units_left;
            s.staged = self.stage(&s.indices);
            st.in_flight.insert(pos, slot);
            st.dispatching = Some(Dispatch {
                slot,
                pos,
                next_start: 0,
            });
        }
        let Dispatch {
            slot,
            pos,
            next_start: start,
        } = st.dispatching.expect("set above");
        let s = &mut st.slots[slot];
        if s.staged
            .as_ref()
            .is_some_and(|g| !g.settled() && Instant::now() < g.due())
        {
            // Its objects are on their way: no worker waits for them (the wake comes).
            return None;
        }
        let n = s.indices.len();
        let end = (start + unit_size.samples(n)).min(n);
        let staged = if end < n {
            s.staged.clone()
        } else {
            s.staged.take()
        };
        st.dispatching = (end < n).then_some(Dispatch {
            slot,
            pos,
            next_start: end,
        });
        st.writers += 1;
        Some(Unit {
            feed: self.clone(),
            slot,
            pos,
            start,
            end,
            batch_len: n,
            staged,
        })
    }

    /// Counts `unit` filled; with a batch mix, the batch's sample count when it was the last
    /// of its batch to be filled and the feed has not failed (its finisher mixes the batch).
    fn last_filled(&self, unit: &Unit) -> Option<usize> {
        self.job.spec.batch_mix.as_ref()?;
        let mut st = lock(&self.state);
        let failed = st.failed.is_some();
        let s = &mut st.slots[unit.slot];
        s.unfilled -= 1;
        (s.unfilled == 0 && !failed).then_some(s.indices.len())
    }

    /// Starts fetching the objects of the batch `indices` (nothing for local files).
    fn stage(&self, indices: &[u64]) -> Option<Arc<dyn Staged>> {
        let ds = &self.job.dataset;
        let objects = ds.objects()?;
        // Sample indices are below the dataset's length, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let reqs: Vec<_> = indices
            .iter()
            .map(|&i| ds.sample(i as usize).request())
            .collect();
        objects.stage(&reqs, self.wake.clone()).map(Arc::from)
    }

    /// Tells the dataset's storage the order this rank reads from `pos` to the end of its
    /// epoch (once an epoch, when its first batch starts; nothing for local datasets).
    fn schedule(&self, sampler: &mut Sampler, pos: Position) {
        if !Prefetch::wanted(&self.job.dataset) {
            return;
        }
        let mut order = Vec::new();
        sampler.rest_of_epoch_into(pos.epoch, pos.step, &mut order);
        self.prefetch.schedule(&self.job.dataset, pos.epoch, order);
    }

    /// Records a completed unit and publishes every batch that is now complete and next in
    /// order; a fault fails the feed instead. The batch's last unit to finish runs the
    /// batch mix first (`scratch` is the caller's, reused).
    pub(super) fn finish_unit(
        &self,
        unit: &Unit,
        done: Result<(), BackendFault>,
        scratch: &mut Vec<u8>,
    ) {
        let done = match self.last_filled(unit) {
            Some(n) if done.is_ok() => {
                let b = MixBatch {
                    n,
                    ..unit.mix_batch()
                };
                // SAFETY: every unit of the batch is filled (`last_filled` counted this one
                // last, once), and this unit's `units_left` is not yet counted down, so the
                // batch is not published: no one else reads or writes the slot.
                unsafe { mix_batch(&b, &*self.ring, scratch) };
                Ok(())
            }
            _ => done,
        };
        let mut st = lock(&self.state);
        st.writers -= 1;
        st.slots[unit.slot].units_left -= 1;
        if let Err(fault) = done {
            st.failed.get_or_insert(fault);
        }
        while let Some((&pos, &slot)) = st.in_flight.first_key_value() {
            if pos != st.publish_next || st.slots[slot].units_left > 0 {
                break;
            }
            if st.failed.is_some() || st.dispatching.is_some_and(|d| d.slot == slot) {
                break;
            }
            st.in_flight.remove(&pos);
            let s = &mut st.slots[slot];
            s.generation += 1;
            let ready = Ready {
                slot,
                generation: s.generation,
                epoch: pos.epoch,
                step: pos.step,
                n: s.indices.len(),
            };
            st.ready.push_back(ready);
            st.publish_next = self.advance(pos);
        }
        let failed = st.failed.is_some();
        drop(st);
        self.changed.notify_all();
        if failed {
            // A sticky CUDA error restarts the daemon once its ranks' feeds carry the cause.
            super::cuda::sticky::fire_if_recorded();
        }
    }
}

/// One unit of work as the scheduler hands it to a worker: samples `start..end` of the batch
/// in `slot` of `feed`'s ring (the backend sees it as a [`super::UnitWork`]).
pub(super) struct Unit {
    pub(super) feed: Arc<FeedShared>,
    pub(super) slot: usize,
    pub(super) pos: Position,
    /// Range of positions within the batch.
    pub(super) start: usize,
    pub(super) end: usize,
    /// Samples in the whole batch.
    pub(super) batch_len: usize,
    /// The batch's objects, kept in the node cache until every unit of it is done; when it
    /// is due (`None`: nothing to wait for).
    pub(super) staged: Option<Arc<dyn Staged>>,
}

impl Unit {
    /// When the batch is due: its reads wait for objects no longer.
    pub(super) fn due(&self) -> Option<Instant> {
        self.staged.as_ref().map(|s| s.due())
    }

    /// The batch mix's view of this unit's batch (all its samples).
    pub(super) fn mix_batch(&self) -> MixBatch<'_> {
        let job = &self.feed.job;
        MixBatch {
            spec: &job.spec,
            seed: job.seed,
            world_size: job.world_size,
            rank: self.feed.rank,
            pos: self.pos,
            slot: self.slot,
            n: self.batch_len,
        }
    }
}
