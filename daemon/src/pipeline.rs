//! The pipeline: an [`Engine`] of worker threads shared by every job, and one [`Feed`] per
//! attached rank that fills that rank's ring slots in order and publishes them.
//!
//! # Design
//! - Work is scheduled in *chunks* of up to [`CHUNK`] samples of one batch. A worker takes a
//!   chunk, reads all its files with one batched read, then decodes and augments each sample
//!   straight into its place in the slot. A batch is published once all its chunks are done;
//!   batches are published in (epoch, step) order even when they finish out of order.
//! - Fair share: workers pick work round-robin over jobs, then over the ranks of a job. A rank
//!   whose ring has no free slot is skipped (backpressure), so it never holds others back.
//! - Every stage is bounded by the ring: nothing is produced without a free slot, and a slot
//!   leased by a client is never written until it is released.
//! - Steady state allocates nothing per batch: workers own their reader, decoder, augmenter
//!   and buffers; slots own their index lists.
//! - Determinism: each sample's output is a function of (seed, epoch, index) alone (see
//!   [`crate::rng`]), so thread count and timing change nothing.
//!
//! # Limitations
//! - CPU backend only; the CUDA backend plugs in as another kind of [`SlotMemory`] and worker.

use std::collections::{BTreeMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use stoker::ring::{RingLayout, SampleStatus};
use stoker::spec::PipelineSpec;
use stoker_kernels::reference::RgbImage;

use crate::augment::{sample_params, Augmenter};
use crate::badsample::{BadCounts, BadSample, BadSampleLog};
use crate::dataset::Dataset;
use crate::decode::{probe, CpuDecoder, DecodeError, Limits};
use crate::fsopen::{OpenPolicy, OpenRules};
use crate::metrics as m;
use crate::reader::{ReadError, ReadRequest, Reader, ReaderKind};
use crate::rng::{KeyedRng, Stream};
use crate::sampler::{ResumedEpoch, Sampler};
use stoker::protocol::EpochOffset;

/// Most samples one worker takes from a batch at a time.
pub const CHUNK: usize = 16;
/// How many other samples are tried, in order, before a bad sample is given up as failed
/// under the `skip` policy.
pub const MAX_REPLACEMENT_TRIES: usize = 16;
/// Default number of slots in a rank's ring.
pub const DEFAULT_SLOTS: usize = 4;

/// A position in a job's stream of batches.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Default)]
pub struct Position {
    pub epoch: u64,
    pub step: u64,
}

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

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("invalid pipeline spec: {0}")]
    Spec(#[from] stoker::spec::SpecError),
    #[error("{0}")]
    Sampler(String),
    #[error("reader: {0}")]
    Reader(#[from] ReadError),
    #[error("decoder: {0}")]
    Decoder(#[from] DecodeError),
    #[error("rank {rank} is out of range for world_size {world_size}")]
    Rank { rank: u32, world_size: u32 },
    #[error("cannot start at epoch {epoch} step {step}: {reason}")]
    Position {
        epoch: u64,
        step: u64,
        reason: String,
    },
    #[error("ring of {slots} slots is too small: at least 2 are needed")]
    RingTooSmall { slots: usize },
    #[error("ring layout does not match the job's spec")]
    RingMismatch,
    #[error("slot {slot} (generation {generation}) is not leased")]
    NotLeased { slot: usize, generation: u64 },
    #[error("the feed has stopped")]
    Stopped,
    #[error("could not start worker thread: {0}")]
    Thread(std::io::Error),
}

/// How the engine runs.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    /// Worker threads; 0 means one per core.
    pub threads: usize,
    pub reader: ReaderKind,
    pub limits: Limits,
    pub policy: BadSamplePolicy,
    /// Bad-sample log lines per second (each bad file is logged once; see
    /// [`crate::badsample`]).
    pub bad_log_per_second: u32,
    /// Test and benchmark hook: deliberately slows the reader and the decoder, so that the
    /// benchmark's bottleneck verdict can be checked on constructed cases. `None` in service.
    pub throttle: Option<Throttle>,
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
        EngineConfig {
            threads: 0,
            reader: ReaderKind::Auto,
            limits: Limits::default(),
            policy: BadSamplePolicy::Skip,
            bad_log_per_second: crate::ratelimit::DEFAULT_LINES_PER_SECOND,
            throttle: None,
        }
    }
}

/// A training run's data: a dataset, a spec, a seed and a world size. Shared by its ranks.
pub struct Job {
    pub dataset: Arc<Dataset>,
    pub spec: PipelineSpec,
    pub seed: u64,
    pub world_size: u32,
    steps_per_epoch: u64,
    /// The elastic resume point every rank of the job shares, if any (see [`crate::sampler`]).
    offset: Option<EpochOffset>,
    /// Batches per rank of the offset's epoch.
    resumed: Option<ResumedEpoch>,
    /// How the job's files are opened (credentials, symlinks, shard identities).
    rules: Arc<OpenRules>,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("samples", &self.dataset.len())
            .field("spec", &self.spec)
            .field("seed", &self.seed)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl Job {
    pub fn new(
        dataset: Arc<Dataset>,
        spec: PipelineSpec,
        seed: u64,
        world_size: u32,
    ) -> Result<Arc<Job>, PipelineError> {
        Job::with_policy(dataset, spec, seed, world_size, None, OpenPolicy::default())
    }

    /// A job whose files are opened under `policy` (a client's credentials, no symlinks;
    /// its tar shards must stay the files indexed, see [`crate::fsopen`]), and whose epoch
    /// `offset.epoch` serves only what is left after an elastic checkpoint, if any.
    pub fn with_policy(
        dataset: Arc<Dataset>,
        spec: PipelineSpec,
        seed: u64,
        world_size: u32,
        offset: Option<EpochOffset>,
        policy: OpenPolicy,
    ) -> Result<Arc<Job>, PipelineError> {
        spec.validate()?;
        let offset = offset.filter(|o| o.consumed > 0);
        let sampler = Self::make_sampler(&dataset, &spec, seed, 0, world_size, offset)?;
        let rules = Arc::new(OpenRules::new(policy, dataset.file_identities()));
        Ok(Arc::new(Job {
            steps_per_epoch: sampler.steps_per_epoch(),
            resumed: sampler.resumed_epoch(),
            offset,
            dataset,
            spec,
            seed,
            world_size,
            rules,
        }))
    }

    fn make_sampler(
        dataset: &Dataset,
        spec: &PipelineSpec,
        seed: u64,
        rank: u32,
        world_size: u32,
        offset: Option<EpochOffset>,
    ) -> Result<Sampler, PipelineError> {
        let sampler = Sampler::new(
            dataset.len() as u64,
            seed,
            rank as u64,
            world_size as u64,
            spec.batch_size as u64,
            spec.drop_last,
        );
        match offset {
            Some(o) => sampler.and_then(|s| s.with_offset(o)),
            None => sampler,
        }
        .map_err(|e| PipelineError::Sampler(e.to_string()))
    }

    /// The elastic resume point of this job, if any.
    pub fn offset(&self) -> Option<EpochOffset> {
        self.offset
    }

    /// Batches each rank receives in `epoch` (the offset's epoch may have fewer, even none).
    pub fn steps_in(&self, epoch: u64) -> u64 {
        match self.resumed {
            Some(r) if r.epoch == epoch => r.steps,
            _ => self.steps_per_epoch,
        }
    }

    /// The first batch at or after `pos` that exists: past the end of an epoch (or in an
    /// elastic epoch with nothing left) is the start of the next.
    pub fn settle(&self, mut pos: Position) -> Position {
        while pos.step >= self.steps_in(pos.epoch) && self.steps_per_epoch > 0 {
            pos = Position {
                epoch: pos.epoch + 1,
                step: 0,
            };
        }
        pos
    }

    /// How the job's files are opened.
    pub fn open_policy(&self) -> &OpenPolicy {
        &self.rules.policy
    }

    /// Batches each rank receives per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The sampler of one rank of this job.
    pub fn sampler(&self, rank: u32) -> Result<Sampler, PipelineError> {
        if rank >= self.world_size {
            return Err(PipelineError::Rank {
                rank,
                world_size: self.world_size,
            });
        }
        Self::make_sampler(
            &self.dataset,
            &self.spec,
            self.seed,
            rank,
            self.world_size,
            self.offset,
        )
    }

    /// Whether `pos` lies past the job's last epoch.
    fn is_past_end(&self, pos: Position) -> bool {
        matches!(self.spec.epochs, Some(e) if pos.epoch >= e as u64)
    }
}

/// Memory a feed writes slots into: host memory for the in-process pipeline, a memfd mapping
/// for served rings, device memory for the CUDA backend.
///
/// # Safety
/// `slot_ptr(i)` must be valid for reads and writes of `layout().slot.slot_bytes` bytes, for
/// every `i < layout().slots`, for as long as the value lives, and slots must not overlap.
pub unsafe trait SlotMemory: Send + Sync {
    fn layout(&self) -> &RingLayout;
    fn slot_ptr(&self, slot: usize) -> *mut u8;
}

/// A ring in ordinary heap memory (benchmarks, tests, in-process use).
pub struct HeapRing {
    layout: RingLayout,
    // Boxed [u128] keeps 16-byte alignment; slots are SLOT_ALIGN multiples from its start.
    mem: Box<[std::cell::UnsafeCell<u128>]>,
}

// SAFETY: the memory is only ever accessed through raw pointers handed out by slot_ptr, and
// the pipeline's slot protocol keeps writers and readers of one slot apart.
unsafe impl Sync for HeapRing {}

impl HeapRing {
    pub fn new(spec: &PipelineSpec, slots: usize) -> HeapRing {
        let layout = RingLayout::new(spec, slots, 4096);
        let words = layout.ring_bytes.div_ceil(16);
        let mem = (0..words).map(|_| std::cell::UnsafeCell::new(0)).collect();
        HeapRing { layout, mem }
    }

    /// The bytes of one slot. The caller must hold the slot's lease (it is READY and not yet
    /// released), so no worker writes into it meanwhile.
    pub fn slot(&self, slot: usize) -> &[u8] {
        // SAFETY: slot_ptr is valid for slot_bytes; the lease keeps writers away.
        unsafe { std::slice::from_raw_parts(self.slot_ptr(slot), self.layout.slot.slot_bytes) }
    }
}

// SAFETY: slots are disjoint ranges of `mem`, which lives as long as the ring, and ring_bytes
// covers slots * slot_bytes.
unsafe impl SlotMemory for HeapRing {
    fn layout(&self) -> &RingLayout {
        &self.layout
    }
    fn slot_ptr(&self, slot: usize) -> *mut u8 {
        let offset = self.layout.slot_offset(slot);
        // SAFETY: offset < ring_bytes <= mem.len() * 16.
        unsafe { (self.mem.as_ptr() as *mut u8).add(offset) }
    }
}

/// A batch handed to the consumer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ready {
    pub slot: usize,
    pub generation: u64,
    pub epoch: u64,
    pub step: u64,
    /// Samples in the batch (less than the batch size only in a final partial batch).
    pub n: usize,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum FeedEvent {
    Ready(Ready),
    /// The job's last epoch is done.
    EndOfData,
}

/// Time and counts per stage, summed over workers.
#[derive(Debug, Default)]
pub struct StageStats {
    pub images: AtomicU64,
    pub bad: AtomicU64,
    pub bytes_read: AtomicU64,
    pub read_ns: AtomicU64,
    pub decode_ns: AtomicU64,
    pub augment_ns: AtomicU64,
    pub batches: AtomicU64,
    /// `bad`, split by reason code.
    pub bad_by_reason: BadCounts,
}

/// A snapshot of [`StageStats`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct StageTotals {
    pub images: u64,
    pub bad: u64,
    pub bytes_read: u64,
    pub read_ns: u64,
    pub decode_ns: u64,
    pub augment_ns: u64,
    pub batches: u64,
}

impl StageStats {
    pub fn totals(&self) -> StageTotals {
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        StageTotals {
            images: g(&self.images),
            bad: g(&self.bad),
            bytes_read: g(&self.bytes_read),
            read_ns: g(&self.read_ns),
            decode_ns: g(&self.decode_ns),
            augment_ns: g(&self.augment_ns),
            batches: g(&self.batches),
        }
    }
}

/// The worker threads shared by every job and rank.
pub struct Engine {
    shared: Arc<Shared>,
    workers: Mutex<Vec<JoinHandle<()>>>,
    threads: usize,
    reader_kind: &'static str,
}

struct Shared {
    sched: Mutex<Sched>,
    /// Signalled when work may have appeared (a slot freed, a feed started) or on shutdown.
    work: Condvar,
    config: EngineConfig,
    stats: StageStats,
    bad_log: BadSampleLog,
}

#[derive(Default)]
struct Sched {
    /// Feeds grouped by job (by `Arc<Job>` identity), for round-robin over jobs.
    jobs: Vec<JobFeeds>,
    next_job: usize,
    shutdown: bool,
}

struct JobFeeds {
    job: Arc<Job>,
    feeds: Vec<Arc<FeedShared>>,
    next_feed: usize,
}

/// One chunk of work handed to a worker.
struct Chunk {
    feed: Arc<FeedShared>,
    slot: usize,
    pos: Position,
    /// Range of positions within the batch.
    start: usize,
    end: usize,
    /// Samples in the whole batch.
    batch_len: usize,
}

impl Engine {
    pub fn new(config: EngineConfig) -> Result<Arc<Engine>, PipelineError> {
        let threads = if config.threads == 0 {
            std::thread::available_parallelism().map_or(1, |n| n.get())
        } else {
            config.threads
        };
        // Probe the reader once so the choice (and any fallback) is known and logged at start.
        let reader_kind = Reader::new(config.reader, CHUNK)?.kind();
        tracing::info!(threads, reader = reader_kind, "pipeline engine starting");
        let shared = Arc::new(Shared {
            sched: Mutex::new(Sched::default()),
            work: Condvar::new(),
            bad_log: BadSampleLog::new(config.bad_log_per_second),
            config,
            stats: StageStats::default(),
        });
        let engine = Arc::new(Engine {
            shared: shared.clone(),
            workers: Mutex::new(Vec::with_capacity(threads)),
            threads,
            reader_kind,
        });
        for i in 0..threads {
            let mut worker = Worker::new(shared.clone())?;
            let handle = std::thread::Builder::new()
                .name(format!("stoker-worker-{i}"))
                .spawn(move || worker.run())
                .map_err(PipelineError::Thread)?;
            engine.workers.lock().unwrap().push(handle);
        }
        Ok(engine)
    }

    pub fn threads(&self) -> usize {
        self.threads
    }

    /// "io_uring" or "pread".
    pub fn reader_kind(&self) -> &'static str {
        self.reader_kind
    }

    pub fn stats(&self) -> StageTotals {
        self.shared.stats.totals()
    }

    /// Bad samples met so far, by reason code (see [`crate::badsample::REASONS`]).
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
            .map_err(|e| PipelineError::Position {
                epoch: start.epoch,
                step: start.step,
                reason: e.to_string(),
            })?;
        let layout = *ring.layout();
        if layout.slots < 2 {
            return Err(PipelineError::RingTooSmall {
                slots: layout.slots,
            });
        }
        if layout.slot != stoker::ring::SlotLayout::new(&job.spec) {
            return Err(PipelineError::RingMismatch);
        }
        let slots = (0..layout.slots)
            .map(|_| SlotState {
                generation: 0,
                indices: Vec::with_capacity(job.spec.batch_size as usize),
                chunks_left: 0,
                leased: false,
            })
            .collect();
        let feed = Arc::new(FeedShared {
            job: job.clone(),
            rank,
            ring,
            state: Mutex::new(FeedState {
                sampler,
                next: start,
                free: (0..layout.slots).collect(),
                slots,
                dispatching: None,
                in_flight: BTreeMap::new(),
                ready: VecDeque::new(),
                publish_next: start,
                stopped: false,
                writers: 0,
            }),
            changed: Condvar::new(),
        });
        {
            let mut sched = self.shared.sched.lock().unwrap();
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
        self.shared.sched.lock().unwrap().shutdown = true;
        self.shared.work.notify_all();
        for handle in self.workers.get_mut().unwrap().drain(..) {
            let _ = handle.join();
        }
    }
}

struct SlotState {
    generation: u64,
    /// Global sample indices of the batch being written into the slot.
    indices: Vec<u64>,
    chunks_left: usize,
    leased: bool,
}

struct FeedState {
    /// This rank's share of each epoch (it caches the current epoch's permutation).
    sampler: Sampler,
    /// The next batch to start.
    next: Position,
    free: VecDeque<usize>,
    slots: Vec<SlotState>,
    /// The batch whose chunks are being handed out: (slot, position, next chunk start).
    dispatching: Option<(usize, Position, usize)>,
    /// Batches started and not yet published, by position.
    in_flight: BTreeMap<Position, usize>,
    /// Completed batches, in order, not yet received by the consumer.
    ready: VecDeque<Ready>,
    /// The position the consumer sees next.
    publish_next: Position,
    stopped: bool,
    /// Chunks handed to workers and not yet finished.
    writers: usize,
}

struct FeedShared {
    job: Arc<Job>,
    rank: u32,
    ring: Arc<dyn SlotMemory>,
    state: Mutex<FeedState>,
    /// Signalled when a batch becomes ready, a writer finishes, or the feed stops.
    changed: Condvar,
}

impl FeedShared {
    fn advance(&self, pos: Position) -> Position {
        self.job.settle(Position {
            epoch: pos.epoch,
            step: pos.step + 1,
        })
    }

    /// Hands out the next chunk of this feed, starting a new batch if a slot is free.
    fn take_chunk(self: &Arc<Self>) -> Option<Chunk> {
        let mut st = self.state.lock().unwrap();
        if st.stopped {
            return None;
        }
        if st.dispatching.is_none() {
            if self.job.is_past_end(st.next) || self.job.steps_per_epoch == 0 {
                return None;
            }
            let slot = st.free.pop_front()?;
            let pos = st.next;
            st.next = self.advance(pos);
            let st = &mut *st;
            let s = &mut st.slots[slot];
            st.sampler
                .batch_indices_into(pos.epoch, pos.step, &mut s.indices);
            s.chunks_left = s.indices.len().div_ceil(CHUNK).max(1);
            st.in_flight.insert(pos, slot);
            st.dispatching = Some((slot, pos, 0));
        }
        let (slot, pos, start) = st.dispatching.expect("set above");
        let n = st.slots[slot].indices.len();
        let end = (start + CHUNK).min(n);
        st.dispatching = if end >= n {
            None
        } else {
            Some((slot, pos, end))
        };
        st.writers += 1;
        Some(Chunk {
            feed: self.clone(),
            slot,
            pos,
            start,
            end,
            batch_len: n,
        })
    }

    /// Records a finished chunk and publishes every batch that is now complete and next in
    /// order.
    fn finish_chunk(&self, chunk: &Chunk) {
        let mut st = self.state.lock().unwrap();
        st.writers -= 1;
        st.slots[chunk.slot].chunks_left -= 1;
        while let Some((&pos, &slot)) = st.in_flight.first_key_value() {
            if pos != st.publish_next || st.slots[slot].chunks_left > 0 {
                break;
            }
            if st.dispatching.is_some_and(|(s, _, _)| s == slot) {
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
        drop(st);
        self.changed.notify_all();
    }
}

/// One rank's stream of ready batches. Dropping it stops the feed and waits until no worker
/// writes into its ring any more, so the ring may be unmapped afterwards.
pub struct Feed {
    shared: Arc<FeedShared>,
    engine: Arc<Shared>,
}

impl Feed {
    pub fn rank(&self) -> u32 {
        self.shared.rank
    }

    pub fn job(&self) -> &Arc<Job> {
        &self.shared.job
    }

    pub fn ring(&self) -> &Arc<dyn SlotMemory> {
        &self.shared.ring
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
        let mut st = self.shared.state.lock().unwrap();
        loop {
            if st.stopped {
                return Err(PipelineError::Stopped);
            }
            if let Some(ready) = st.ready.pop_front() {
                st.slots[ready.slot].leased = true;
                return Ok(Some(FeedEvent::Ready(ready)));
            }
            let finished =
                self.shared.job.is_past_end(st.next) || self.shared.job.steps_per_epoch == 0;
            if finished && st.dispatching.is_none() && st.in_flight.is_empty() {
                return Ok(Some(FeedEvent::EndOfData));
            }
            let now = Instant::now();
            if now >= deadline {
                return Ok(None);
            }
            st = self
                .shared
                .changed
                .wait_timeout(st, deadline - now)
                .unwrap()
                .0;
        }
    }

    /// Gives a received slot back to the producer.
    pub fn release(&self, slot: usize, generation: u64) -> Result<(), PipelineError> {
        let mut st = self.shared.state.lock().unwrap();
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
        let mut st = self.shared.state.lock().unwrap();
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
        let st = self.shared.state.lock().unwrap();
        st.slots.iter().filter(|s| s.leased).count()
    }
}

impl Drop for Feed {
    fn drop(&mut self) {
        let mut st = self.shared.state.lock().unwrap();
        st.stopped = true;
        while st.writers > 0 {
            st = self.shared.changed.wait(st).unwrap();
        }
        drop(st);
        let mut sched = self.engine.sched.lock().unwrap();
        for j in sched.jobs.iter_mut() {
            j.feeds.retain(|f| !Arc::ptr_eq(f, &self.shared));
        }
        sched.jobs.retain(|j| !j.feeds.is_empty());
    }
}

/// One worker thread's tools, reused for every chunk.
struct Worker {
    shared: Arc<Shared>,
    reader: Reader,
    decoder: CpuDecoder,
    augmenter: Augmenter,
    bufs: Vec<Vec<u8>>,
    /// Global index of the sample actually delivered at each chunk position.
    chunk_indices: Vec<u64>,
    image: RgbImage,
    replacement_buf: Vec<Vec<u8>>,
}

impl Worker {
    fn new(shared: Arc<Shared>) -> Result<Worker, PipelineError> {
        Ok(Worker {
            reader: Reader::new(shared.config.reader, CHUNK)?,
            decoder: CpuDecoder::new(shared.config.limits)?,
            augmenter: Augmenter::default(),
            bufs: (0..CHUNK).map(|_| Vec::new()).collect(),
            chunk_indices: Vec::with_capacity(CHUNK),
            image: RgbImage::default(),
            replacement_buf: vec![Vec::new()],
            shared,
        })
    }

    fn run(&mut self) {
        while let Some(chunk) = self.next_chunk() {
            self.fill(&chunk);
            chunk.feed.finish_chunk(&chunk);
        }
    }

    /// Blocks until a chunk is available, or returns `None` on shutdown.
    fn next_chunk(&self) -> Option<Chunk> {
        let mut sched = self.shared.sched.lock().unwrap();
        loop {
            if sched.shutdown {
                return None;
            }
            if let Some(chunk) = Self::pick(&mut sched) {
                return Some(chunk);
            }
            sched = self.shared.work.wait(sched).unwrap();
        }
    }

    /// Round-robin over jobs, then over the feeds of the chosen job.
    fn pick(sched: &mut MutexGuard<'_, Sched>) -> Option<Chunk> {
        let jobs = sched.jobs.len();
        for j in 0..jobs {
            let ji = (sched.next_job + j) % jobs;
            let job = &mut sched.jobs[ji];
            let feeds = job.feeds.len();
            for f in 0..feeds {
                let fi = (job.next_feed + f) % feeds;
                if let Some(chunk) = job.feeds[fi].take_chunk() {
                    // Keep handing out this batch's chunks before moving on, so batches finish
                    // in order; rotate once the batch is fully dispatched.
                    if chunk.end == chunk.batch_len {
                        job.next_feed = (fi + 1) % feeds;
                    }
                    sched.next_job = (ji + 1) % jobs;
                    return Some(chunk);
                }
            }
        }
        None
    }

    /// Reads, decodes and augments one chunk into its slot.
    fn fill(&mut self, chunk: &Chunk) {
        let feed = &chunk.feed;
        let job = &feed.job;
        let layout = feed.ring.layout().slot;
        let base = feed.ring.slot_ptr(chunk.slot);
        let shared = self.shared.clone();
        let stats = &shared.stats;

        self.chunk_indices.clear();
        {
            let st = feed.state.lock().unwrap();
            self.chunk_indices
                .extend_from_slice(&st.slots[chunk.slot].indices[chunk.start..chunk.end]);
        }
        let count = self.chunk_indices.len();
        self.reader.set_rules(&job.rules);

        let t0 = Instant::now();
        let max_file_bytes = self.shared.config.limits.max_file_bytes;
        // Samples over the size limit are read as 0 bytes and reported as `file_too_large`
        // below: a huge file is never read into memory.
        let requests: Vec<ReadRequest<'_>> = self
            .chunk_indices
            .iter()
            .map(|&i| capped(request(&job.dataset, i), max_file_bytes))
            .collect();
        let results = self.reader.read_batch(&requests, &mut self.bufs[..count]);
        if let Some(t) = self.shared.config.throttle {
            std::thread::sleep(t.read_delay * count as u32);
        }
        drop(requests);
        let bytes: u64 = (0..count)
            .filter(|&k| results[k].is_ok())
            .map(|k| self.bufs[k].len() as u64)
            .sum();
        let read_ns = elapsed_ns(t0);
        stats.read_ns.fetch_add(read_ns, Ordering::Relaxed);
        stats.bytes_read.fetch_add(bytes, Ordering::Relaxed);
        let read_ok = results.iter().filter(|r| r.is_ok()).count() as u64;
        metrics::counter!(m::IMAGES_TOTAL, "stage" => "read").increment(read_ok);
        metrics::counter!(m::BYTES_READ_TOTAL).increment(bytes);
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "read").record(read_ns as f64 * 1e-9);

        for (k, read) in results.into_iter().enumerate() {
            let pos = chunk.start + k;
            let index = self.chunk_indices[k];
            // SAFETY: pos < batch_size, so the image, label, index and status of `pos` lie
            // inside the slot (SlotLayout), which no one else writes while we hold the chunk.
            let out = unsafe {
                std::slice::from_raw_parts_mut(
                    base.add(layout.images + pos * layout.image_bytes),
                    layout.image_bytes,
                )
            };
            let first = match (too_large(&job.dataset, index, max_file_bytes), read) {
                (Some(bad), _) => Err(bad),
                (None, Ok(())) => {
                    let data = std::mem::take(&mut self.bufs[k]);
                    let r = self.process(job, &data, index, chunk.pos, out);
                    self.bufs[k] = data;
                    r
                }
                (None, Err(e)) => Err(BadSample::from(&e)),
            };
            let (status, delivered) = match first {
                Ok(()) => (SampleStatus::Ok, index),
                Err(bad) => {
                    // Counted every time it is met, by reason; logged once per file,
                    // rate-limited (crate::badsample).
                    stats.bad.fetch_add(1, Ordering::Relaxed);
                    stats.bad_by_reason.add(bad.reason);
                    metrics::counter!(m::BAD_SAMPLES_TOTAL, "reason" => bad.reason).increment(1);
                    self.shared
                        .bad_log
                        .log(&job.dataset.display_name(index as usize), &bad);
                    match self.shared.config.policy {
                        BadSamplePolicy::Skip => match self.replace(job, index, chunk.pos, out) {
                            Some(other) => (SampleStatus::Replaced, other),
                            None => {
                                out.fill(0);
                                (SampleStatus::Failed, index)
                            }
                        },
                        BadSamplePolicy::Fail => {
                            out.fill(0);
                            (SampleStatus::Failed, index)
                        }
                    }
                }
            };
            let label = job.dataset.sample(delivered as usize).label;
            // SAFETY: as above; the regions are 8-byte aligned (SLOT_ALIGN) and hold
            // batch_size entries.
            unsafe {
                (base.add(layout.labels) as *mut i64).add(pos).write(label);
                (base.add(layout.indices) as *mut u64)
                    .add(pos)
                    .write(delivered);
                base.add(layout.status + pos).write(status as u8);
            }
        }
        stats.images.fetch_add(count as u64, Ordering::Relaxed);
        if chunk.end == chunk.batch_len {
            stats.batches.fetch_add(1, Ordering::Relaxed);
            // Partial final batch: mark the unused tail so clients never mistake it for data.
            for pos in chunk.batch_len..layout.batch_size {
                // SAFETY: pos < batch_size, inside the slot.
                unsafe {
                    base.add(layout.status + pos)
                        .write(SampleStatus::Empty as u8)
                };
            }
        }
    }

    /// Decodes and augments one sample into `out`; the error says why it is bad.
    fn process(
        &mut self,
        job: &Job,
        data: &[u8],
        index: u64,
        pos: Position,
        out: &mut [u8],
    ) -> Result<(), BadSample> {
        let stats = &self.shared.stats;
        let t0 = Instant::now();
        if let Some(t) = self.shared.config.throttle {
            std::thread::sleep(t.decode_delay);
        }
        let header = probe(data)?;
        let (crop, flip) = sample_params(
            &job.spec,
            header.width,
            header.height,
            job.seed,
            pos.epoch,
            index,
        );
        let within = self.decoder.decode_for_crop(
            data,
            crop,
            job.spec.crop.output_size(),
            &mut self.image,
        )?;
        let t1 = Instant::now();
        self.augmenter
            .augment_into(&self.image, within, flip, &job.spec, out);
        let decode_ns = (t1 - t0).as_nanos() as u64;
        let augment_ns = elapsed_ns(t1);
        stats.decode_ns.fetch_add(decode_ns, Ordering::Relaxed);
        stats.augment_ns.fetch_add(augment_ns, Ordering::Relaxed);
        metrics::counter!(m::DECODE_TOTAL, "backend" => "cpu").increment(1);
        metrics::counter!(m::IMAGES_TOTAL, "stage" => "decode").increment(1);
        metrics::counter!(m::IMAGES_TOTAL, "stage" => "augment").increment(1);
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "decode").record(decode_ns as f64 * 1e-9);
        metrics::histogram!(m::STAGE_SECONDS, "stage" => "augment")
            .record(augment_ns as f64 * 1e-9);
        Ok(())
    }

    /// Tries other samples, chosen deterministically from (seed, epoch, bad index), until one
    /// decodes; returns the index of the one delivered.
    fn replace(&mut self, job: &Job, bad: u64, pos: Position, out: &mut [u8]) -> Option<u64> {
        let mut rng = KeyedRng::new(job.seed, pos.epoch, bad, Stream::Replacement);
        let len = job.dataset.len() as u64;
        for _ in 0..MAX_REPLACEMENT_TRIES {
            let other = rng.below(len);
            if other == bad {
                continue;
            }
            let max_file_bytes = self.shared.config.limits.max_file_bytes;
            if too_large(&job.dataset, other, max_file_bytes).is_some() {
                continue;
            }
            let req = [request(&job.dataset, other)];
            let ok = self.reader.read_batch(&req, &mut self.replacement_buf[..1]);
            if ok.into_iter().next().is_some_and(|r| r.is_ok()) {
                let data = std::mem::take(&mut self.replacement_buf[0]);
                let r = self.process(job, &data, other, pos, out);
                self.replacement_buf[0] = data;
                if r.is_ok() {
                    return Some(other);
                }
            }
        }
        None
    }
}

fn request(dataset: &Dataset, index: u64) -> ReadRequest<'_> {
    let s = dataset.sample(index as usize);
    ReadRequest {
        path: s.path,
        offset: s.offset,
        len: s.len,
    }
}

/// `file_too_large` when the indexed length of sample `index` is over `max_file_bytes`.
fn too_large(dataset: &Dataset, index: u64, max_file_bytes: u64) -> Option<BadSample> {
    let len = dataset.sample(index as usize).len;
    (len > max_file_bytes).then(|| {
        BadSample::from(DecodeError::FileTooLarge {
            len,
            limit: max_file_bytes,
        })
    })
}

/// `req`, or an empty read of it when it is over `max_file_bytes`.
fn capped(req: ReadRequest<'_>, max_file_bytes: u64) -> ReadRequest<'_> {
    if req.len > max_file_bytes {
        ReadRequest { len: 0, ..req }
    } else {
        req
    }
}

fn elapsed_ns(t0: Instant) -> u64 {
    t0.elapsed().as_nanos() as u64
}
