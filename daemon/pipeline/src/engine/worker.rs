//! The engine's worker threads and its completion thread: take a unit from the scheduler,
//! have the backend fill it, apply the bad-sample policy, write labels, indices and status,
//! and publish once the unit is complete.
//!
//! # Design
//! - Everything here is backend-agnostic; the backend only fills images (see
//!   [`super::backend`]).
//! - Bad samples: counted by reason, logged once per file (rate-limited), then under policy
//!   `skip` replaced by the first of a deterministic sequence of other samples (drawn from
//!   (seed, epoch, bad index)) that the backend fills; under `fail`, or when no replacement
//!   works, zeroed and reported failed.
//! - Fields (`PipelineSpec::fields`) are those of the sample delivered at each position, the
//!   replacement's when a sample was replaced, filled once the outcomes are settled
//!   ([`super::fields`]).
//! - A unit whose completion is pending goes to the completion thread, which waits for each
//!   in the order they were filled and only then finishes the unit, so a slot is never
//!   published before its images are complete.
//!
//! # Limitations
//! - One completion thread per engine: a GPU backend's completions wait one after another
//!   (they complete in stream order anyway).

use crate::sync::lock;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Instant;

use stoker_wire::ring::{SampleStatus, SlotLayout};

use super::backend::SlotImages;
use super::backend::UnitWork;
use super::backend::{Backend, BackendFault, Completion, PendingWork, SampleOutcome, SampleWork};
use super::fields::{FieldFiller, FieldUnit};
use super::job::Job;
use super::memory::HostWriter;
use super::scheduler::Shared;
use super::slots::Unit;
use super::{BadSamplePolicy, Position, MAX_REPLACEMENT_TRIES};
use crate::metrics as m;
use crate::transform::badsample::BadSample;
use crate::transform::rng::{KeyedRng, Stream};

/// A unit filled with a pending completion, on its way to the completion thread.
pub(super) struct PendingUnit {
    pub(super) unit: Unit,
    pub(super) pending: Box<dyn PendingWork>,
}

/// One worker thread: a backend and the buffers it reuses for every unit.
pub(super) struct Worker {
    shared: Arc<Shared>,
    backend: Box<dyn Backend>,
    /// Global index of the sample asked for at each unit position.
    indices: Vec<u64>,
    /// Global index of the sample actually delivered at each unit position.
    delivered: Vec<u64>,
    fields: FieldFiller,
    outcomes: Vec<SampleOutcome>,
    completions: crossbeam_channel::Sender<PendingUnit>,
    /// The batch mix's room for one image, reused.
    mix_scratch: Vec<u8>,
}

/// A position in a slot being settled: the batch, the sample's place in it, the slot's memory.
struct Spot<'a> {
    job: &'a Job,
    pos: Position,
    at: usize,
    images: SlotImages,
    layout: SlotLayout,
    due: Option<Instant>,
}

impl Worker {
    pub(super) fn new(
        shared: Arc<Shared>,
        backend: Box<dyn Backend>,
        completions: crossbeam_channel::Sender<PendingUnit>,
    ) -> Worker {
        Worker {
            shared,
            backend,
            indices: Vec::new(),
            delivered: Vec::new(),
            fields: FieldFiller::default(),
            outcomes: Vec::new(),
            completions,
            mix_scratch: Vec::new(),
        }
    }

    pub(super) fn run(&mut self) {
        while let Some(unit) = self.shared.next_unit() {
            let filled = self.fill(&unit);
            let whole = unit.start == 0 && unit.end == unit.batch_len;
            let (b, ring) = (unit.mix_batch(), &*unit.feed.ring);
            match super::mix::on_device(&b, whole, ring, &mut *self.backend, filled) {
                Completion::Done => unit.feed.finish_unit(&unit, Ok(()), &mut self.mix_scratch),
                Completion::Pending(pending) => {
                    if let Err(e) = self.completions.send(PendingUnit { unit, pending }) {
                        // Only at shutdown: wait here rather than publish unfinished work.
                        let PendingUnit { unit, pending } = e.into_inner();
                        let done = pending.wait();
                        unit.feed.finish_unit(&unit, done, &mut self.mix_scratch);
                    }
                }
            }
        }
    }

    /// Has the backend fill one unit, then settles every sample's outcome.
    fn fill(&mut self, unit: &Unit) -> Completion {
        let feed = &unit.feed;
        let job = &feed.job;
        let layout = feed.ring.layout().slot;
        let images = feed.ring.images(unit.slot);
        self.indices.clear();
        {
            let st = lock(&feed.state);
            self.indices
                .extend_from_slice(&st.slots[unit.slot].indices[unit.start..unit.end]);
        }
        let shared = Arc::clone(&self.shared);
        let work = UnitWork {
            job,
            pos: unit.pos,
            start: unit.start,
            indices: &self.indices,
            images,
            layout,
            config: &shared.config,
            stats: &shared.stats,
            due: unit.due(),
        };
        self.outcomes.clear();
        let completion = self.backend.fill(&work, &mut self.outcomes);
        assert_eq!(
            self.outcomes.len(),
            self.indices.len(),
            "one outcome per sample"
        );
        // A short final batch's last unit also marks the unused tail.
        let last = unit.end == unit.batch_len;
        let end = if last { layout.batch_size } else { unit.end };
        // SAFETY: the worker alone writes the positions of the unit it holds, and the tail
        // past `batch_len` belongs to the batch's last unit (feed.rs hands each out once).
        let mut host = unsafe { HostWriter::new(&*feed.ring, unit.slot, unit.start, end) };
        let outcomes = std::mem::take(&mut self.outcomes);
        self.write_outcomes(unit, &outcomes, &mut host);
        self.outcomes = outcomes;
        let fields = FieldUnit {
            job,
            start: unit.start,
            delivered: &self.delivered,
            due: unit.due(),
            config: &shared.config,
            stats: &shared.stats,
            log: &shared.bad_log,
        };
        self.fields.fill(&fields, &mut host);
        let stats = &self.shared.stats;
        stats
            .images
            .fetch_add(self.indices.len() as u64, Ordering::Relaxed);
        if last {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            // Partial final batch: mark the unused tail so clients never mistake it for data.
            for at in unit.batch_len..layout.batch_size {
                host.mark_empty(at);
            }
        }
        completion
    }

    /// Writes each sample's label, delivered index and status into the slot, settling the bad
    /// ones by the job's policy; remembers the indices delivered for the fields' pass.
    fn write_outcomes(
        &mut self,
        unit: &Unit,
        outcomes: &[SampleOutcome],
        host: &mut HostWriter<'_>,
    ) {
        let feed = &unit.feed;
        let job = &feed.job;
        let layout = feed.ring.layout().slot;
        let images = feed.ring.images(unit.slot);
        self.delivered.clear();
        for (k, outcome) in outcomes.iter().enumerate() {
            let at = unit.start + k;
            let index = self.indices[k];
            let (status, delivered) = match outcome {
                Ok(()) => {
                    self.count_decoded();
                    (SampleStatus::Ok, index)
                }
                Err(bad) => {
                    let spot = Spot {
                        job,
                        pos: unit.pos,
                        at,
                        images,
                        layout,
                        due: unit.due(),
                    };
                    self.settle_bad(&spot, index, bad)
                }
            };
            // Sample indices are below the dataset's length, a usize.
            #[allow(clippy::cast_possible_truncation)]
            let label = job.dataset.sample(delivered as usize).label;
            host.write(at, label, delivered, status);
            self.delivered.push(delivered);
        }
    }

    fn count_decoded(&self) {
        metrics::counter!(m::DECODE_TOTAL, "backend" => self.backend.kind().name()).increment(1);
    }

    /// Counts and logs a bad sample, then applies the policy; returns its status and the
    /// index of the sample delivered in its place.
    fn settle_bad(&mut self, spot: &Spot<'_>, index: u64, bad: &BadSample) -> (SampleStatus, u64) {
        let job = spot.job;
        // Counted every time it is met, by reason; logged once per file, rate-limited
        // (crate::transform::badsample).
        let stats = &self.shared.stats;
        stats.bad.fetch_add(1, Ordering::Relaxed);
        stats.bad_by_reason.add(bad.reason);
        // Sample indices are below the dataset's length, a usize.
        #[allow(clippy::cast_possible_truncation)]
        let name = job.dataset.display_name(index as usize);
        self.shared.bad_log.log(&name, bad);
        // The job's clients are told the file below the root they named.
        job.bad
            .note(|| match Path::new(&name).strip_prefix(job.dataset.root()) {
                Ok(below) => below.display().to_string(),
                Err(_) => name.clone(),
            });
        let replaced = match self.shared.config.policy {
            BadSamplePolicy::Skip => self.replace(spot, index),
            BadSamplePolicy::Fail => None,
        };
        match replaced {
            Some(other) => (SampleStatus::Replaced, other),
            None => {
                self.backend
                    .clear_sample(spot.images, &spot.layout, spot.at);
                (SampleStatus::Failed, index)
            }
        }
    }

    /// Tries other samples, chosen deterministically from (seed, epoch, bad index), until one
    /// fills; returns the index of the one delivered.
    fn replace(&mut self, spot: &Spot<'_>, bad: u64) -> Option<u64> {
        let (job, pos) = (spot.job, spot.pos);
        let len = job.dataset.len() as u64;
        let shared = Arc::clone(&self.shared);
        for other in replacement_candidates(job.seed, pos.epoch, bad, len) {
            let work = SampleWork {
                job,
                pos,
                index: other,
                at: spot.at,
                images: spot.images,
                layout: spot.layout,
                config: &shared.config,
                stats: &shared.stats,
                due: spot.due,
            };
            if self.backend.fill_sample(&work).is_ok() {
                self.count_decoded();
                return Some(other);
            }
        }
        None
    }
}

/// The samples tried, in order, in place of the bad sample `bad` of `epoch` (of a dataset of
/// `len` samples) under the `skip` policy: the one rule the engine and a remote worker
/// (`crate::remote`) both follow, so a replacement is the same wherever it is decided.
pub fn replacement_candidates(
    seed: u64,
    epoch: u64,
    bad: u64,
    len: u64,
) -> impl Iterator<Item = u64> {
    let mut rng = KeyedRng::new(seed, epoch, bad, Stream::Replacement);
    (0..MAX_REPLACEMENT_TRIES)
        .map(move |_| rng.below(len))
        .filter(move |&other| other != bad)
}

/// The completion thread: waits for each pending unit in turn, then finishes it (publishing
/// its batch when complete and next in order, or failing the feed with the fault).
pub(super) fn complete(units: crossbeam_channel::Receiver<PendingUnit>) {
    let mut scratch = Vec::new();
    for PendingUnit { unit, pending } in units {
        let result: Result<(), BackendFault> = pending.wait();
        if let Err(fault) = &result {
            tracing::error!(rank = unit.feed.rank, error = %fault, "backend fault");
        }
        unit.feed.finish_unit(&unit, result, &mut scratch);
    }
}
