//! The engine room: an [`Engine`] of worker threads shared by every job, and one [`Feed`] per
//! attached rank that fills that rank's ring slots in order and publishes them. What differs
//! between hardware is a [`Backend`] (see [`backend`]); everything here is shared by all.
//!
//! Files: `job` (a job and its samplers), `scheduler` (fair share), `feed` (a rank's handle),
//! `slots` (a rank's slots, batches in flight and in-order publishing), `worker` (workers,
//! bad-sample policy, completion), `backend` (the trait), `choice` (the `--backend` choice against what this host has), `cpu` (the CPU
//! backend, with several views of one image decoded once), `cuda` (the CUDA backend,
//! one engine per GPU), `memory` (ring memory), `fields` (a unit's per-sample fields read into
//! the slot), `mix` (the batch mix once a batch is filled, before it is published), `stats`.
//!
//! # Design
//! - Work is scheduled in *units* of one batch, as large as the backend says ([`UnitSize`]:
//!   up to [`CPU_UNIT_SAMPLES`] samples for the CPU, whole batches for a GPU). A worker takes a unit and
//!   has its backend fill the images; the engine settles bad samples and writes labels,
//!   indices and status into the slot's host part. A batch is published once all its units
//!   are *complete* (for a GPU, once its event completed, not when `fill` returned); batches
//!   are published in (epoch, step) order even when they finish out of order.
//! - Fair share: workers pick work round-robin over jobs, then over the ranks of a job. A rank
//!   whose ring has no free slot is skipped (backpressure), so it never holds others back.
//! - Every stage is bounded by the ring: nothing is produced without a free slot, and a slot
//!   leased by a client is never written until it is released.
//! - No buffer for bytes or pixels is allocated per batch in steady state: backends own their
//!   reader (and its read buffers), decoder, augmenter and scratch; slots own their index
//!   lists.
//! - Determinism: each sample's output is a function of (seed, epoch, index) alone (see
//!   [`crate::transform::rng`]), so thread count, backend and timing change nothing; a batch
//!   mix adds a function of the batch's samples and its number (`mix`).
//!
//! # Limitations
//! - One backend per engine: a daemon serving CPU and CUDA ranks runs one engine each.
//! - Small bookkeeping is still allocated per unit: the unit's read requests and their
//!   results, a path copy per file opened, the feed's in-order entry for the batch, and on a
//!   GPU the batch's lists of bitstreams, regions and outputs and its boxed completion. Each
//!   is a few bytes per sample beside the megabytes the buffers above reuse.

pub mod backend;
pub mod choice;
mod cpu;
pub mod cuda;
mod feed;
mod fields;
mod job;
mod memory;
mod mix;
mod scheduler;
mod slots;
mod stats;
mod worker;

use crate::sync::lock;
use std::collections::BTreeMap;
use std::sync::{Arc, Condvar, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::Duration;

use stoker_wire::ring::ImageMemory;

use crate::engine::backend::BackendKind;
use crate::source::local::reader::{ReadError, Reader, ReaderKind};
use crate::transform::badsample::BadSampleLog;
use crate::transform::decode::{DecodeError, Limits};
use crate::transform::sampler::SamplerError;

pub use backend::{
    Backend, BackendFactory, BackendFault, Completion, MixWork, PendingWork, SampleOutcome,
    SampleWork, SlotImages, UnitSize, UnitWork,
};
pub use cpu::{CpuBackend, CpuBackendFactory};
pub use cuda::{CudaBackendFactory, Gpu};
pub use feed::{Feed, FeedWaker};
pub use job::Job;
pub use memory::{HeapRing, SlotMemory};
use scheduler::{JobFeeds, Sched, Shared};
use slots::FeedShared;
pub use slots::{FeedEvent, Ready};
pub use stats::{StageHistograms, StageStats, StageTotals};
pub use worker::replacement_candidates;
use worker::{PendingUnit, Worker};

/// Most samples of one batch in a unit of work of the CPU backend.
pub const CPU_UNIT_SAMPLES: usize = 16;
/// How many other samples are tried, in order, before a bad sample is given up as failed
/// under the `skip` policy.
pub const MAX_REPLACEMENT_TRIES: usize = 16;

/// A position in a job's stream of batches: the client's and the wire's type.
/// Slots per rank's ring when the config does not say.
pub const DEFAULT_SLOTS_PER_RANK: usize = 4;
/// The fewest slots a ring may have: one the client holds, one being filled.
pub const MIN_SLOTS_PER_RANK: usize = 2;

pub use stoker_wire::protocol::Position;

/// What happens to a sample that cannot be read or decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum BadSamplePolicy {
    /// Replace it deterministically with another sample (every rank and rerun agrees).
    #[default]
    Skip,
    /// Leave its pixels zeroed and report it as failed in the batch's status.
    Fail,
}

/// Why the engine could not make a job, attach a rank, start or serve a feed.
#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    /// The job's spec failed its validation.
    #[error("invalid pipeline spec: {0}")]
    Spec(#[from] stoker_wire::spec::SpecError),
    /// The sampler refused the job's dataset size, world size, batch size or elastic offset
    /// (the sampler's message; the daemon refuses the job with it).
    #[error("{0}")]
    Sampler(String),
    /// The sample reader could not be set up.
    #[error("reader: {0}")]
    Reader(#[from] ReadError),
    /// A backend's decoder could not be set up.
    #[error("decoder: {0}")]
    Decoder(#[from] DecodeError),
    /// A rank at or past the job's world size.
    #[error("rank {rank} is out of range for world_size {world_size}")]
    Rank {
        /// The rank asked for.
        rank: u32,
        /// The job's world size.
        world_size: u32,
    },
    /// A start position the rank's sampler does not have.
    #[error("cannot start at epoch {epoch} step {step}: {source}")]
    Position {
        /// The epoch asked for.
        epoch: u64,
        /// The step within that epoch.
        step: u64,
        /// The sampler's reason.
        #[source]
        source: SamplerError,
    },
    /// A batch mix is asked for over a dataset with a label outside its classes (or none).
    #[error("batch_mix spreads labels over {num_classes} classes, but sample {sample} has label {label}: every label must be 0..{num_classes} (num_classes too small, or a dataset without labels)")]
    MixLabel {
        /// The sample, as the dataset names it.
        sample: String,
        /// Its label (-1: the dataset has none).
        label: i64,
        /// The mix's `num_classes`.
        num_classes: u32,
    },
    /// A ring with fewer than 2 slots (one to fill while the client holds the other).
    #[error("ring of {slots} slots is too small: at least 2 are needed")]
    RingTooSmall {
        /// The ring's slot count.
        slots: usize,
    },
    /// A ring laid out for another spec than the job's.
    #[error("ring layout does not match the job's spec")]
    RingMismatch,
    /// A release of a slot (or a generation of it) the client does not hold.
    #[error("slot {slot} (generation {generation}) is not leased")]
    NotLeased {
        /// The slot released.
        slot: usize,
        /// The generation the release named.
        generation: u64,
    },
    /// The feed was stopped (its engine shut down or it was detached).
    #[error("the feed has stopped")]
    Stopped,
    /// A worker thread could not be spawned.
    #[error("could not start worker thread: {0}")]
    Thread(std::io::Error),
    /// A ring whose image memory is not where the engine's backend writes.
    #[error("the {backend} backend writes {wants:?} memory, the ring's images are {got:?}")]
    RingMemory {
        /// The backend's name (`cpu`, `cuda`).
        backend: &'static str,
        /// Where the backend writes images.
        wants: ImageMemory,
        /// Where the ring's images are.
        got: ImageMemory,
    },
    /// A backend failed as a whole (not one bad sample): its unit's batch cannot be filled.
    #[error("backend fault: {0}")]
    Backend(BackendFault),
    /// Extra workers (named) whose backend does not match the engine's.
    #[error("{0}: its units or image memory differ from the engine's backend")]
    Extra(String),
}

/// More threads taking the engine's units, each with a backend of `factory`: `threads` of
/// them, named `stoker-NAME-i` (the remote workers' connections, `crate::remote`).
pub struct ExtraWorkers<'a> {
    /// The threads' name part (`stoker-NAME-i`).
    pub name: String,
    /// Makes one backend per thread.
    pub factory: &'a dyn BackendFactory,
    /// How many threads.
    pub threads: usize,
}

impl std::fmt::Debug for ExtraWorkers<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ExtraWorkers")
            .field("name", &self.name)
            .field("threads", &self.threads)
            .finish_non_exhaustive()
    }
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    /// How samples are read (io_uring, or pread where io_uring is unavailable).
    pub reader: ReaderKind,
    /// The decoder's limits on image and file size.
    pub limits: Limits,
    /// What a bad sample becomes.
    pub policy: BadSamplePolicy,
    /// Bad-sample log lines per second (each bad file is logged once; see
    /// [`crate::transform::badsample`]).
    pub bad_log_per_second: u32,
    /// Test and benchmark hook: deliberately slows the reader and the decoder, so that the
    /// benchmark's bottleneck verdict can be checked on constructed cases. `None` in service.
    pub throttle: Option<Throttle>,
    /// Each uid's share of the workers (a uid not named: 1); see [`scheduler`].
    pub user_shares: std::collections::BTreeMap<u32, f64>,
    /// `[cuda]`: how the CUDA backend uses its GPUs.
    pub cuda: cuda::CudaOptions,
}

/// Artificial delays per image (a slow disk, a slow decoder), for `stoker bench` tests only.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Throttle {
    /// Slept by a worker after each read, per image read.
    pub read_delay: Duration,
    /// Slept before each decode, and counted as decode time.
    pub decode_delay: Duration,
}

impl Default for EngineConfig {
    fn default() -> Self {
        // The config file's defaults, each written once: 0 threads (one per core), each
        // enum's #[default], the decoder's and the bad-sample log's named constants.
        EngineConfig {
            threads: 0,
            reader: ReaderKind::default(),
            limits: Limits::default(),
            policy: BadSamplePolicy::default(),
            bad_log_per_second: crate::ratelimit::DEFAULT_LINES_PER_SECOND,
            throttle: None,
            user_shares: std::collections::BTreeMap::new(),
            cuda: cuda::CudaOptions::default(),
        }
    }
}

/// The worker threads shared by every job and rank, and the completion thread.
pub struct Engine {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    /// Waits for pending units; ends once every worker (and so every sender) is gone.
    completer: Mutex<Option<JoinHandle<()>>>,
    threads: usize,
    reader_kind: &'static str,
    kind: BackendKind,
    image_memory: ImageMemory,
}

impl std::fmt::Debug for Engine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("threads", &self.threads)
            .field("reader_kind", &self.reader_kind)
            .field("kind", &self.kind)
            .field("image_memory", &self.image_memory)
            .finish_non_exhaustive()
    }
}

impl Engine {
    /// An engine serving from the CPU backend.
    pub fn new(config: EngineConfig) -> Result<Arc<Engine>, PipelineError> {
        Engine::with_backend(config, &CpuBackendFactory)
    }

    /// An engine whose workers each own a backend made by `factory`.
    pub fn with_backend(
        config: EngineConfig,
        factory: &dyn BackendFactory,
    ) -> Result<Arc<Engine>, PipelineError> {
        Engine::with_backends(config, factory, &[])
    }

    /// As [`Engine::with_backend`], plus the threads of `extra`: more takers of the same
    /// units (remote workers, `crate::remote`), each waiting on its own backend. They must
    /// cut units and write images as `factory` does.
    pub fn with_backends(
        config: EngineConfig,
        factory: &dyn BackendFactory,
        extra: &[ExtraWorkers<'_>],
    ) -> Result<Arc<Engine>, PipelineError> {
        if let Some(e) = extra.iter().find(|e| {
            e.factory.unit_size() != factory.unit_size()
                || e.factory.image_memory() != factory.image_memory()
        }) {
            return Err(PipelineError::Extra(e.name.clone()));
        }
        let threads = if config.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.threads
        };
        // Probe the reader once so the choice (and any fallback) is known and logged at start.
        let reader_kind = Reader::new(config.reader, CPU_UNIT_SAMPLES)?.kind();
        let kind = factory.kind();
        tracing::info!(
            threads,
            reader = reader_kind,
            backend = kind.name(),
            "pipeline engine starting"
        );
        let mut backends = (0..threads)
            .map(|_| factory.make(&config).map(|b| (b, "worker".to_owned())))
            .collect::<Result<Vec<_>, _>>()?;
        for e in extra {
            for _ in 0..e.threads {
                backends.push((e.factory.make(&config)?, e.name.clone()));
            }
        }
        let shared = Arc::new(Shared {
            sched: Mutex::new(Sched::with_shares(config.user_shares.clone())),
            work: Condvar::new(),
            bad_log: BadSampleLog::new(config.bad_log_per_second),
            config,
            stats: StageStats::default(),
            unit_size: factory.unit_size(),
        });
        let (completions, pending) = crossbeam_channel::unbounded::<PendingUnit>();
        let completer = std::thread::Builder::new()
            .name("stoker-complete".to_owned())
            .spawn(move || worker::complete(pending))
            .map_err(PipelineError::Thread)?;
        let engine = Arc::new(Engine {
            shared: shared.clone(),
            workers: Mutex::new(Vec::with_capacity(threads)),
            completer: Mutex::new(Some(completer)),
            threads,
            reader_kind,
            kind,
            image_memory: factory.image_memory(),
        });
        for (i, (backend, name)) in backends.into_iter().enumerate() {
            let mut worker = Worker::new(shared.clone(), backend, completions.clone());
            let handle = std::thread::Builder::new()
                .name(format!("stoker-{name}-{i}"))
                .spawn(move || worker.run())
                .map_err(PipelineError::Thread)?;
            lock(&engine.workers).push(handle);
        }
        Ok(engine)
    }

    /// The engine's own worker threads (extra workers not counted).
    pub fn threads(&self) -> usize {
        self.threads
    }

    /// "io_uring" or "pread".
    pub fn reader_kind(&self) -> &'static str {
        self.reader_kind
    }

    /// The backend the workers fill with.
    pub fn backend(&self) -> BackendKind {
        self.kind
    }

    /// Where this engine's backend writes images: what rings it is given must hold.
    pub fn image_memory(&self) -> ImageMemory {
        self.image_memory
    }

    /// The stage totals so far (images, bytes, stage times) of every worker.
    pub fn stats(&self) -> StageTotals {
        self.shared.stats.totals()
    }

    /// The stage latencies' histograms (for the metrics).
    pub fn histograms(&self) -> StageHistograms {
        self.shared.stats.histograms()
    }

    /// Bad samples met so far, by reason code (see [`crate::transform::badsample::REASONS`]).
    pub fn bad_by_reason(&self) -> BTreeMap<&'static str, u64> {
        self.shared.stats.bad_by_reason.snapshot()
    }

    /// Starts filling `ring` for `rank` of `job` from `start` on.
    pub fn start_feed(
        self: &Arc<Self>,
        job: Arc<Job>,
        rank: u32,
        ring: Arc<dyn SlotMemory>,
        start: Position,
    ) -> Result<Feed, PipelineError> {
        let sampler = job.sampler(rank)?;
        // Step 0 of an elastic epoch with nothing left is the next epoch's start.
        let start = if start.step == 0 {
            job.settle(start)
        } else {
            start
        };
        sampler
            .check_position(start.epoch, start.step)
            .map_err(|source| PipelineError::Position {
                epoch: start.epoch,
                step: start.step,
                source,
            })?;
        let layout = *ring.layout();
        if layout.slots < 2 {
            return Err(PipelineError::RingTooSmall {
                slots: layout.slots,
            });
        }
        if layout.slot != stoker_wire::ring::SlotLayout::new(&job.spec) {
            return Err(PipelineError::RingMismatch);
        }
        if layout.image_memory != self.image_memory {
            return Err(PipelineError::RingMemory {
                backend: self.kind.name(),
                wants: self.image_memory,
                got: layout.image_memory,
            });
        }
        let engine = Arc::downgrade(&self.shared);
        let wake = Arc::new(move || {
            if let Some(shared) = engine.upgrade() {
                // Taken and let go first: a worker between its look and its wait holds it,
                // so the notification cannot fall between the two.
                drop(lock(&shared.sched));
                shared.work.notify_all();
            }
        });
        let feed = Arc::new(FeedShared::new(
            job.clone(),
            rank,
            ring,
            sampler,
            start,
            wake,
        ));
        {
            let mut sched = lock(&self.shared.sched);
            match sched.jobs.iter_mut().find(|j| Arc::ptr_eq(&j.job, &job)) {
                Some(j) => j.feeds.push(feed.clone()),
                None => sched.jobs.push(JobFeeds {
                    job,
                    feeds: vec![feed.clone()],
                    next_feed: 0,
                }),
            }
        }
        self.shared.work.notify_all();
        Ok(Feed {
            shared: feed,
            engine: self.shared.clone(),
        })
    }
}

impl Drop for Engine {
    fn drop(&mut self) {
        lock(&self.shared.sched).shutdown = true;
        self.shared.work.notify_all();
        // The lock policy (crate::sync): a panicked holder leaves the handles usable.
        let workers = self
            .workers
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        for handle in workers.drain(..) {
            let _ = handle.join();
        }
        // Every worker, and with it every sender of pending units, is gone: the completion
        // thread finishes what is left and ends.
        let completer = self
            .completer
            .get_mut()
            .unwrap_or_else(PoisonError::into_inner);
        if let Some(handle) = completer.take() {
            let _ = handle.join();
        }
    }
}

#[cfg(test)]
mod tests;
