//! In-process throughput measurement: the real pipeline (reader, decoder, augmenter, engine)
//! filling a heap ring that a consumer thread drains, as fast as it goes.
//!
//! The measurement follows the peers in `../shared/peers`: one warm-up epoch (page cache,
//! thread start), then `epochs` timed epochs; images/s counts images delivered to the consumer.

use std::path::{Path, PathBuf};
use std::sync::{Arc, PoisonError};
use std::time::Instant;
use stoker_pipeline::sync::lock;

use serde::Serialize;
use stoker_wire::spec::PipelineSpec;

use stoker_pipeline::engine::DEFAULT_SLOTS_PER_RANK;
use stoker_pipeline::engine::{
    Engine, EngineConfig, FeedEvent, HeapRing, Job, PipelineError, Position, StageTotals,
    CPU_UNIT_SAMPLES,
};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_pipeline::source::local::fsopen::open_input;
use stoker_pipeline::source::object::ObjectStore;

/// What to measure.
#[derive(Debug, Clone)]
pub(crate) struct BenchOptions {
    pub data: PathBuf,
    pub spec: PipelineSpec,
    pub engine: EngineConfig,
    pub seed: u64,
    pub warmup_epochs: u64,
    /// Timed epochs at most (after the warm-up).
    pub epochs: u64,
    /// With `until_s`: the run stops at the first epoch end after `min_epochs` timed epochs
    /// and `until_s` seconds, so that an epoch count grown from a measured rate cannot run
    /// for much longer than asked.
    pub min_epochs: u64,
    pub until_s: Option<f64>,
    pub slots: usize,
    /// Where an `s3://` dataset is read from (one store for the whole run: an eviction and
    /// the reads after it see one node cache).
    pub objects: Arc<ObjectStore>,
}

impl BenchOptions {
    /// The standard comparison: RandomResizedCrop 224 + flip + normalise, f32 NCHW, batch 64,
    /// one warm-up epoch and two timed ones.
    pub(crate) fn standard(data: &Path, threads: usize) -> BenchOptions {
        BenchOptions {
            data: data.to_path_buf(),
            spec: PipelineSpec::train(64, 224),
            engine: EngineConfig {
                threads,
                ..EngineConfig::default()
            },
            seed: 0,
            warmup_epochs: 1,
            epochs: 2,
            min_epochs: 2,
            until_s: None,
            slots: DEFAULT_SLOTS_PER_RANK,
            objects: ObjectStore::from_environment(),
        }
    }
}

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct BenchReport {
    pub data: String,
    pub samples: usize,
    pub threads: usize,
    pub reader: &'static str,
    pub batch_size: u32,
    pub images: u64,
    pub batches: u64,
    /// Timed epochs run: `epochs`, or fewer where `until_s` ended the run.
    pub epochs: u64,
    pub seconds: f64,
    pub images_per_s: f64,
    pub mb_per_s_read: f64,
    /// User + system CPU time of the whole process per 1000 delivered images.
    pub cpu_s_per_1000: f64,
    /// Per-stage worker time per image (ms), summed over threads.
    pub read_ms_per_image: f64,
    pub decode_ms_per_image: f64,
    pub augment_ms_per_image: f64,
    pub bad_samples: u64,
    /// Decodes per image produced, warm-up included: 1 however many views a spec has.
    pub decodes_per_image: f64,
}

#[derive(Debug, thiserror::Error)]
pub(crate) enum BenchError {
    #[error("dataset {path}: {source}")]
    Dataset {
        path: PathBuf,
        source: stoker_pipeline::source::index::DatasetError,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("reader: {0}")]
    Reader(stoker_pipeline::source::local::reader::ReadError),
    #[error("decoder: {0}")]
    Decoder(stoker_pipeline::transform::decode::DecodeError),
}

/// Process CPU time (user + system) in seconds.
pub(crate) fn process_cpu_seconds() -> f64 {
    // rustix has no getrusage: libc it stays.
    // SAFETY: getrusage writes a plain struct we own.
    let usage = unsafe {
        let mut u: libc::rusage = std::mem::zeroed();
        libc::getrusage(libc::RUSAGE_SELF, &mut u);
        u
    };
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 * 1e-6;
    tv(usage.ru_utime) + tv(usage.ru_stime)
}

/// Runs the pipeline in this process and measures it.
pub(crate) fn run_in_process(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let open = OpenOptions {
        objects: Some(opts.objects.clone()),
        ..OpenOptions::default()
    };
    let dataset = Dataset::open(&opts.data, &open).map_err(|source| BenchError::Dataset {
        path: opts.data.clone(),
        source,
    })?;
    let samples = dataset.len();
    let spec = PipelineSpec {
        // More epochs than a u32 holds never end: saturate rather than wrap.
        epochs: Some(u32::try_from(opts.warmup_epochs + opts.epochs).unwrap_or(u32::MAX)),
        ..opts.spec.clone()
    };
    let engine = Engine::new(opts.engine.clone())?;
    let job = Job::new(Arc::new(dataset), spec.clone(), opts.seed, 1)?;
    let steps = job.steps_per_epoch();
    let ring = Arc::new(HeapRing::new(&spec, opts.slots));
    let feed = engine.start_feed(job, 0, ring, Position::default())?;

    // Timing starts when the last warm-up batch is released (or now, without warm-up), so the
    // first timed batch's production counts.
    let snapshot = || (Instant::now(), process_cpu_seconds(), engine.stats());
    let mut started: Option<(Instant, f64, StageTotals)> = (opts.warmup_epochs == 0).then(snapshot);
    let (mut images, mut batches, mut epochs) = (0u64, 0u64, 0u64);
    while let FeedEvent::Ready(ready) = feed.recv()? {
        let warmup = ready.epoch < opts.warmup_epochs;
        if !warmup {
            images += ready.n as u64;
            batches += 1;
        }
        feed.release(ready.slot, ready.generation)?;
        if warmup {
            started = Some(snapshot());
        } else if ready.step + 1 == steps {
            epochs += 1;
            // Time's up at an epoch end: the batches made ahead are dropped with the feed.
            let elapsed = started
                .as_ref()
                .map_or(0.0, |s| s.0.elapsed().as_secs_f64());
            if opts.until_s.is_some_and(|u| elapsed >= u) && epochs >= opts.min_epochs {
                break;
            }
        }
    }
    drop(feed);
    let (t0, cpu0, stats0) =
        started.unwrap_or((Instant::now(), process_cpu_seconds(), engine.stats()));
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = process_cpu_seconds() - cpu0;
    let s = engine.stats();
    let per_image = |now: u64, then: u64| {
        let n = (s.images - stats0.images).max(1) as f64;
        (now - then) as f64 / 1e6 / n
    };
    Ok(BenchReport {
        data: opts.data.display().to_string(),
        samples,
        threads: engine.threads(),
        reader: engine.reader_kind(),
        batch_size: spec.batch_size,
        images,
        batches,
        epochs,
        seconds,
        images_per_s: images as f64 / seconds.max(1e-9),
        mb_per_s_read: (s.bytes_read - stats0.bytes_read) as f64 / 1e6 / seconds.max(1e-9),
        cpu_s_per_1000: cpu / (images.max(1) as f64) * 1000.0,
        read_ms_per_image: per_image(s.read_ns, stats0.read_ns),
        decode_ms_per_image: per_image(s.decode_ns, stats0.decode_ns),
        augment_ms_per_image: per_image(s.augment_ns, stats0.augment_ns),
        bad_samples: s.bad,
        decodes_per_image: s.images_decoded as f64 / s.images.max(1) as f64,
    })
}

// ---------------------------------------------------------------------------------------------
// Stage by stage: storage only, decode only, decode + augment, each on its own, so that the
// slowest one names the bottleneck.
// ---------------------------------------------------------------------------------------------

/// The page cache's state during a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum CacheState {
    /// The files were read in a warm-up pass first.
    Warm,
    /// The dataset's pages were dropped first.
    Cold,
    /// Samples held in memory (the decode stages).
    Memory,
}

impl CacheState {
    pub(crate) fn name(self) -> &'static str {
        match self {
            CacheState::Warm => "warm",
            CacheState::Cold => "cold",
            CacheState::Memory => "memory",
        }
    }
}

impl std::fmt::Display for CacheState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // pad, not write_str: the table's column widths apply.
        f.pad(self.name())
    }
}

/// A stage measured on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Stage {
    #[serde(rename = "storage")]
    Storage,
    #[serde(rename = "decode")]
    Decode,
    #[serde(rename = "decode+augment")]
    DecodeAugment,
    #[serde(rename = "pipeline (in-process)")]
    Pipeline,
    /// Entropy decoding alone (coefficients only): the ceiling the others are judged against.
    #[serde(rename = "entropy decode (ceiling)")]
    Entropy,
}

impl Stage {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Stage::Storage => "storage",
            Stage::Decode => "decode",
            Stage::DecodeAugment => "decode+augment",
            Stage::Pipeline => "pipeline (in-process)",
            Stage::Entropy => "entropy decode (ceiling)",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        // pad, not write_str: the table's column widths apply.
        f.pad(self.name())
    }
}

/// One stage's measurement.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct StageResult {
    pub stage: Stage,
    pub threads: usize,
    pub images: u64,
    pub seconds: f64,
    pub images_per_s: f64,
    /// Bytes in per second (storage: read; decode: compressed bytes consumed; end to end:
    /// bytes delivered to clients).
    pub mb_per_s: f64,
    /// CPU seconds (user + system, every process involved) per 1000 images.
    pub cpu_s_per_1000: f64,
    pub cache: CacheState,
    /// Samples the stage failed on (corrupt, or of a format it does not take): not in
    /// `images`, and not in the rate.
    pub failed: u64,
}

impl StageResult {
    pub(super) fn new(
        stage: Stage,
        threads: usize,
        images: u64,
        bytes: u64,
        seconds: f64,
        cpu: f64,
        cache: CacheState,
    ) -> StageResult {
        let secs = seconds.max(1e-9);
        StageResult {
            stage,
            threads,
            images,
            seconds,
            images_per_s: images as f64 / secs,
            mb_per_s: bytes as f64 / 1e6 / secs,
            cpu_s_per_1000: cpu / images.max(1) as f64 * 1000.0,
            cache,
            failed: 0,
        }
    }
}

/// Threads to use for `requested` (0: one per core).
pub(crate) fn effective_threads(requested: usize) -> usize {
    if requested == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        requested
    }
}

/// Opens `path`, timing it; `cache_dir` `None` walks the dataset (no index cache).
pub(crate) fn open_timed(
    path: &Path,
    cache_dir: Option<&Path>,
    objects: &Arc<ObjectStore>,
) -> Result<(Dataset, f64), BenchError> {
    let opts = OpenOptions {
        use_cache: cache_dir.is_some(),
        cache_dir: cache_dir.map(Path::to_path_buf),
        objects: Some(objects.clone()),
        ..OpenOptions::default()
    };
    let t0 = Instant::now();
    let ds = Dataset::open(path, &opts).map_err(|source| BenchError::Dataset {
        path: path.to_owned(),
        source,
    })?;
    Ok((ds, t0.elapsed().as_secs_f64()))
}

/// How long indexing takes: a full walk (cache off) and a load from the index cache.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct IndexTiming {
    pub kind: &'static str,
    pub samples: usize,
    /// Files holding the samples (one per image in folders, one per shard in tar layouts).
    pub files: usize,
    /// The walk with the index cache off: the caches as they were found, or, with `cold`,
    /// right after the cold walk (everything it read cached).
    pub walk_s: f64,
    /// The same walk right after [`evict`] (with `--cold`): as root the dentries and inodes
    /// are dropped too, so this is the walk of a freshly booted host.
    pub walk_cold_s: Option<f64>,
    pub cached_s: f64,
    /// Whether the second open really came from the cache.
    pub cache_hit: bool,
}

/// Measures indexing of `path` with the cache off, then on (in a private cache folder);
/// with `cold`, also the walk after the dataset was evicted from the caches. Returns the
/// dataset of the first walk with the timings.
pub(crate) fn index_timing(
    path: &Path,
    cold: bool,
    objects: &Arc<ObjectStore>,
) -> Result<(IndexTiming, Dataset), BenchError> {
    let (ds, first_s) = open_timed(path, None, objects)?;
    let (walk_s, walk_cold_s) = if cold {
        // Evicted, walked cold, then walked again with everything the cold walk cached.
        evict(&ds);
        let cold_s = open_timed(path, None, objects)?.1;
        (open_timed(path, None, objects)?.1, Some(cold_s))
    } else {
        (first_s, None)
    };
    let cache = std::env::temp_dir().join(format!("stoker-bench-index-{}", std::process::id()));
    let _ = open_timed(path, Some(&cache), objects)?; // writes the cache
    let (cached, cached_s) = open_timed(path, Some(&cache), objects)?;
    let _ = std::fs::remove_dir_all(&cache);
    let timing = IndexTiming {
        kind: ds.kind().as_str(),
        samples: ds.len(),
        files: distinct_files(&ds).len(),
        walk_s,
        walk_cold_s,
        cached_s,
        cache_hit: cached.origin() == stoker_pipeline::source::index::IndexOrigin::Cache,
    };
    Ok((timing, ds))
}

/// The files holding the dataset's samples, each once, in sample order.
pub(crate) fn distinct_files(ds: &Dataset) -> Vec<PathBuf> {
    let mut seen = std::collections::HashSet::new();
    let mut out = Vec::new();
    for i in 0..ds.len() {
        let p = ds.sample(i).path;
        if seen.insert(p) {
            out.push(p.to_path_buf());
        }
    }
    out
}

/// How the page cache was dropped for a cold measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub(crate) enum Eviction {
    /// `/proc/sys/vm/drop_caches` = 3 (root): page cache, dentries and inodes, as after a
    /// reboot.
    DropCaches,
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on every file of the dataset (any user who can
    /// read them; pages mapped by other processes stay).
    Fadvise,
    /// An `s3://` dataset: its objects' copies deleted from the node cache, so every read
    /// fetches from the server again.
    NodeCache,
}

/// Drops the dataset's files from the page cache: `drop_caches` as root (with the dentries
/// and inodes, so a folder's metadata is cold too), else fadvise (data pages only). An
/// `s3://` dataset is evicted from the node cache instead.
pub(crate) fn evict(ds: &Dataset) -> Eviction {
    if let Some(objects) = ds.objects() {
        objects.evict(ds);
        return Eviction::NodeCache;
    }
    if rustix::process::geteuid().is_root() {
        rustix::fs::sync();
        if std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok() {
            return Eviction::DropCaches;
        }
    }
    for p in distinct_files(ds) {
        if let Ok(f) = open_input(&p) {
            // Advice only: a file the kernel keeps cached is still read correctly.
            let _ = rustix::fs::fadvise(&f, 0, None, rustix::fs::Advice::DontNeed);
        }
    }
    Eviction::Fadvise
}

/// Peak resident memory (VmHWM) of a process in MB, from /proc; `None` if unreadable.
pub(crate) fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
    let path = match pid {
        Some(p) => format!("/proc/{p}/status"),
        None => "/proc/self/status".to_string(),
    };
    let text = std::fs::read_to_string(path).ok()?;
    let line = text.lines().find(|l| l.starts_with("VmHWM:"))?;
    let kb: f64 = line.split_whitespace().nth(1)?.parse().ok()?;
    Some(kb / 1024.0)
}

/// CPU seconds (user + system) a process has used so far, from /proc/PID/stat.
pub(crate) fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    let hz = rustix::param::clock_ticks_per_second().max(1) as f64;
    Some((utime + stime) / hz)
}

/// Runs `work(thread)` on `threads` threads at once and returns the wall seconds and the
/// process CPU seconds it took.
pub(super) fn timed_threads<F>(threads: usize, work: F) -> (f64, f64)
where
    F: Fn(usize) + Sync,
{
    let cpu0 = process_cpu_seconds();
    let t0 = Instant::now();
    std::thread::scope(|s| {
        for t in 0..threads {
            let work = &work;
            s.spawn(move || work(t));
        }
    });
    (t0.elapsed().as_secs_f64(), process_cpu_seconds() - cpu0)
}

/// Storage only: reads every sample's bytes (epoch 0's order) with `threads` readers, batched
/// by the pipeline's chunk size, and decodes nothing.
pub(crate) fn storage_only(
    ds: &Dataset,
    engine: &EngineConfig,
    seed: u64,
    cache: CacheState,
) -> Result<StageResult, BenchError> {
    let threads = effective_threads(engine.threads);
    let mut order = Vec::new();
    stoker_pipeline::transform::sampler::permutation_into(ds.len() as u64, seed, 0, &mut order);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let read = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let (secs, cpu) = timed_threads(threads, |_| {
        let mut reader = match stoker_pipeline::source::local::reader::Reader::new(
            engine.reader,
            CPU_UNIT_SAMPLES,
        ) {
            Ok(r) => r,
            Err(e) => {
                *lock(&failed) = Some(e);
                return;
            }
        };
        let mut bufs: Vec<Vec<u8>> = (0..CPU_UNIT_SAMPLES).map(|_| Vec::new()).collect();
        loop {
            let start = next.fetch_add(CPU_UNIT_SAMPLES, std::sync::atomic::Ordering::Relaxed);
            if start >= order.len() {
                return;
            }
            let end = (start + CPU_UNIT_SAMPLES).min(order.len());
            let reqs: Vec<stoker_pipeline::source::local::reader::ReadRequest<'_>> = order
                [start..end]
                .iter()
                .map(|&i| {
                    // A permutation of the dataset's indices, which are usizes.
                    #[allow(clippy::cast_possible_truncation)]
                    ds.sample(i as usize).request()
                })
                .collect();
            // Through the dataset's storage: an `s3://` dataset's objects come from the node
            // cache or the server (a plain reader would fail on their URLs).
            let res = stoker_pipeline::source::read_batch(ds, &mut reader, &reqs, &mut bufs, None);
            if let Some(t) = engine.throttle {
                std::thread::sleep(t.read_delay * u32::try_from(reqs.len()).unwrap_or(u32::MAX));
            }
            let ok = res.iter().filter(|r| r.is_ok()).count() as u64;
            let n: u64 = res
                .iter()
                .zip(&bufs)
                .filter(|(r, _)| r.is_ok())
                .map(|(_, b)| b.len() as u64)
                .sum();
            bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
            read.fetch_add(ok, std::sync::atomic::Ordering::Relaxed);
        }
    });
    // The lock policy (stoker_pipeline::sync): a panicked reader thread leaves the value as is.
    if let Some(e) = failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        return Err(BenchError::Reader(e));
    }
    // Samples read, not asked for: a failed read is no image (an unreadable dataset would
    // otherwise show as the fastest storage).
    Ok(StageResult::new(
        Stage::Storage,
        threads,
        read.into_inner(),
        bytes.into_inner(),
        secs,
        cpu,
        cache,
    ))
}

/// Encoded samples held in memory for the decode stages: (global index, bytes).
pub(crate) fn load_samples(ds: &Dataset, max: usize, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut order = Vec::new();
    stoker_pipeline::transform::sampler::permutation_into(ds.len() as u64, seed, 0, &mut order);
    order.truncate(max);
    let mut out = Vec::with_capacity(order.len());
    for i in order {
        // A permutation of the dataset's indices; lengths index memory on 64-bit hosts.
        #[allow(clippy::cast_possible_truncation)]
        let s = ds.sample(i as usize);
        #[allow(clippy::cast_possible_truncation)]
        let mut buf = vec![0u8; s.len as usize];
        let file = match ds.objects() {
            Some(objects) => objects.local_file(s),
            None => Ok(s.path.to_owned()),
        };
        let ok = file.and_then(|p| open_input(&p)).and_then(|f| {
            use std::os::unix::fs::FileExt;
            f.read_exact_at(&mut buf, s.offset)
        });
        if ok.is_ok() {
            out.push((i, buf));
        }
    }
    out
}

/// How long a stage that cycles through its samples runs: until both bounds are reached (whole
/// passes over the samples for `images`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct AtLeast {
    pub images: usize,
    pub seconds: f64,
}

impl AtLeast {
    /// The images a stage times over a set of `n`: whole passes over it, at least `images`
    /// (and one pass); none for an empty set.
    pub(crate) fn whole_passes(&self, n: usize) -> usize {
        if n == 0 {
            0
        } else {
            self.images.div_ceil(n).max(1) * n
        }
    }
}

/// Images/s of a pipeline in this process, as a stage row.
pub(crate) fn pipeline_stage(report: &BenchReport, cache: CacheState) -> StageResult {
    // A byte count: finite and non-negative (`as` saturates).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let bytes = (report.mb_per_s_read * 1e6 * report.seconds) as u64;
    let mut r = StageResult::new(
        Stage::Pipeline,
        report.threads,
        report.images,
        bytes,
        report.seconds,
        report.cpu_s_per_1000 * report.images as f64 / 1000.0,
        cache,
    );
    r.cpu_s_per_1000 = report.cpu_s_per_1000;
    r
}

mod ceiling;
mod decode;
mod report;
pub(crate) use ceiling::{entropy_stage, Ceiling};
pub(crate) use decode::decode_stage;
pub(crate) use report::{svg_chart, verdict, Verdict};

#[cfg(test)]
mod tests;
