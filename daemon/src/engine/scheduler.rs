//! The engine's shared state and its fair-share scheduler: which rank's batch a worker fills
//! next.
//!
//! # Design
//! - Round-robin over jobs, then over the ranks (feeds) of a job, so two jobs get equal shares
//!   whatever their rank counts. A feed without a free slot yields nothing (backpressure stops
//!   that rank only).
//! - The units of one batch are handed out back to back, so batches finish in order.
//! - Workers sleep on a condvar and are woken when work may have appeared.
//!
//! # Limitations
//! - One lock for the scheduler; fine for the handful of ranks a host serves.

#![forbid(unsafe_code)]

use crate::sync::{lock, wait};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::Instant;

use super::backend::UnitSize;
use super::feed::FeedShared;
use super::job::Job;
use super::stats::StageStats;
use super::{EngineConfig, Position};
use crate::source::index::Staged;
use crate::transform::badsample::BadSampleLog;

pub(super) struct Shared {
    pub(super) sched: Mutex<Sched>,
    /// Signalled when work may have appeared (a slot freed, a feed started) or on shutdown.
    pub(super) work: Condvar,
    pub(super) config: EngineConfig,
    pub(super) stats: StageStats,
    pub(super) bad_log: BadSampleLog,
    /// How the backend cuts batches into units.
    pub(super) unit_size: UnitSize,
}

#[derive(Default)]
pub(super) struct Sched {
    /// Feeds grouped by job (by `Arc<Job>` identity), for round-robin over jobs.
    pub(super) jobs: Vec<JobFeeds>,
    pub(super) next_job: usize,
    pub(super) shutdown: bool,
}

pub(super) struct JobFeeds {
    pub(super) job: Arc<Job>,
    pub(super) feeds: Vec<Arc<FeedShared>>,
    pub(super) next_feed: usize,
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
}

impl Shared {
    /// Blocks until a unit is available, or returns `None` on shutdown.
    pub(super) fn next_unit(&self) -> Option<Unit> {
        let mut sched = lock(&self.sched);
        loop {
            if sched.shutdown {
                return None;
            }
            if let Some(unit) = Sched::pick(&mut sched, self.unit_size) {
                return Some(unit);
            }
            sched = wait(&self.work, sched);
        }
    }
}

impl Sched {
    /// Round-robin over jobs, then over the feeds of the chosen job.
    pub(super) fn pick(sched: &mut MutexGuard<'_, Sched>, unit_size: UnitSize) -> Option<Unit> {
        let jobs = sched.jobs.len();
        for j in 0..jobs {
            let ji = (sched.next_job + j) % jobs;
            let job = &mut sched.jobs[ji];
            let feeds = job.feeds.len();
            for f in 0..feeds {
                let fi = (job.next_feed + f) % feeds;
                if let Some(unit) = job.feeds[fi].take_unit(unit_size) {
                    // Keep handing out this batch's units before moving on, so batches finish
                    // in order; rotate once the batch is fully dispatched.
                    if unit.end == unit.batch_len {
                        job.next_feed = (fi + 1) % feeds;
                    }
                    sched.next_job = (ji + 1) % jobs;
                    return Some(unit);
                }
            }
        }
        None
    }
}
