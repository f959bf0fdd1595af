//! The engine's shared state and its fair-share scheduler: which rank's batch a worker fills
//! next.
//!
//! # Design
//! - Users first: the workers are shared between the uids that own jobs (the job's owner, see
//!   `crate::serve::registry`) by start-time fair queueing: each uid has a finish tag, a unit
//!   goes to the uid with work whose start tag (its finish tag, or the virtual time if later)
//!   is least, and that uid's tag advances by the unit's samples over its share
//!   (`[limits] user_shares`, 1 by default: an even split between active users). A uid that
//!   was idle starts at the virtual time, so idling earns no burst later; a uid whose ranks
//!   are all backpressured is skipped and keeps its place.
//! - Then round-robin over that uid's jobs, then over the ranks (feeds) of a job, so two jobs
//!   get equal shares whatever their rank counts. A feed without a free slot yields nothing
//!   (backpressure stops that rank only).
//! - The units of one batch are handed out back to back, so batches finish in order.
//! - Workers sleep on a condvar and are woken when work may have appeared.
//!
//! # Limitations
//! - One lock for the scheduler; fine for the handful of ranks a host serves.

#![forbid(unsafe_code)]

use crate::sync::{lock, wait};
use std::collections::{BTreeMap, HashMap};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};

use super::backend::UnitSize;
use super::job::Job;
use super::slots::{FeedShared, Unit};
use super::stats::StageStats;
use super::EngineConfig;
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
    /// Each uid's share of the workers (`[limits] user_shares`; a uid not named has 1).
    pub(super) shares: BTreeMap<u32, f64>,
    /// The fair-queueing virtual time: the start tag of the last unit handed out.
    vtime: f64,
    /// Each uid's finish tag (uids whose tag the virtual time passed are dropped).
    finish: HashMap<u32, f64>,
}

pub(super) struct JobFeeds {
    pub(super) job: Arc<Job>,
    pub(super) feeds: Vec<Arc<FeedShared>>,
    pub(super) next_feed: usize,
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
    /// A scheduler sharing the workers between uids by `shares`.
    pub(super) fn with_shares(shares: BTreeMap<u32, f64>) -> Sched {
        Sched {
            shares,
            ..Sched::default()
        }
    }

    /// The uid with work first (least start tag), then the uid's jobs round-robin, then the
    /// feeds of the chosen job.
    pub(super) fn pick(sched: &mut MutexGuard<'_, Sched>, unit_size: UnitSize) -> Option<Unit> {
        for uid in sched.uids_by_start() {
            if let Some(unit) = sched.pick_of(uid, unit_size) {
                sched.charge(uid, unit.end - unit.start);
                return Some(unit);
            }
        }
        None
    }

    fn start_tag(&self, uid: u32) -> f64 {
        self.finish
            .get(&uid)
            .copied()
            .unwrap_or(0.0)
            .max(self.vtime)
    }

    /// The uids owning jobs, least start tag first (ties by uid).
    fn uids_by_start(&self) -> Vec<u32> {
        let mut uids: Vec<u32> = self.jobs.iter().map(|j| j.job.owner).collect();
        uids.sort_unstable();
        uids.dedup();
        uids.sort_by(|a, b| self.start_tag(*a).total_cmp(&self.start_tag(*b)));
        uids
    }

    /// Advances `uid`'s finish tag by `samples` over its share.
    fn charge(&mut self, uid: u32, samples: usize) {
        let start = self.start_tag(uid);
        let share = self.shares.get(&uid).copied().unwrap_or(1.0);
        self.vtime = start;
        self.finish.insert(uid, start + samples as f64 / share);
        let now = self.vtime;
        self.finish.retain(|_, f| *f > now);
    }

    /// Round-robin over the jobs of `uid`, then over the feeds of the chosen job.
    fn pick_of(&mut self, uid: u32, unit_size: UnitSize) -> Option<Unit> {
        let jobs = self.jobs.len();
        for j in 0..jobs {
            let ji = (self.next_job + j) % jobs;
            let job = &mut self.jobs[ji];
            if job.job.owner != uid {
                continue;
            }
            let feeds = job.feeds.len();
            for f in 0..feeds {
                let fi = (job.next_feed + f) % feeds;
                if let Some(unit) = job.feeds[fi].take_unit(unit_size) {
                    // Keep handing out this batch's units before moving on, so batches finish
                    // in order; rotate once the batch is fully dispatched.
                    if unit.end == unit.batch_len {
                        job.next_feed = (fi + 1) % feeds;
                    }
                    self.next_job = (ji + 1) % jobs;
                    return Some(unit);
                }
            }
        }
        None
    }
}
