//! In-process throughput measurement: the real pipeline (reader, decoder, augmenter, engine)
//! filling a heap ring that a consumer thread drains, as fast as it goes.
//!
//! The measurement follows the peers in `../shared/peers`: one warm-up epoch (page cache,
//! thread start), then `epochs` timed epochs; images/s counts images delivered to the consumer.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use serde::Serialize;
use stoker::spec::PipelineSpec;

use crate::dataset::{Dataset, OpenOptions};
use crate::pipeline::{
    Engine, EngineConfig, FeedEvent, HeapRing, Job, PipelineError, Position, StageTotals, CHUNK,
    DEFAULT_SLOTS,
};

/// What to measure.
#[derive(Debug, Clone)]
pub struct BenchOptions {
    pub data: PathBuf,
    pub spec: PipelineSpec,
    pub engine: EngineConfig,
    pub seed: u64,
    pub warmup_epochs: u64,
    pub epochs: u64,
    pub slots: usize,
}

impl BenchOptions {
    /// The standard comparison: RandomResizedCrop 224 + flip + normalise, f32 NCHW, batch 64,
    /// one warm-up epoch and two timed ones.
    pub fn standard(data: &Path, threads: usize) -> BenchOptions {
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
            slots: DEFAULT_SLOTS,
        }
    }
}

/// What was measured.
#[derive(Debug, Clone, Serialize)]
pub struct BenchReport {
    pub data: String,
    pub samples: usize,
    pub threads: usize,
    pub reader: &'static str,
    pub batch_size: u32,
    pub images: u64,
    pub batches: u64,
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
}

#[derive(Debug, thiserror::Error)]
pub enum BenchError {
    #[error("dataset {path}: {source}")]
    Dataset {
        path: String,
        source: crate::dataset::DatasetError,
    },
    #[error(transparent)]
    Pipeline(#[from] PipelineError),
    #[error("reader: {0}")]
    Reader(crate::reader::ReadError),
    #[error("decoder: {0}")]
    Decoder(crate::decode::DecodeError),
}

/// Process CPU time (user + system) in seconds.
pub fn process_cpu_seconds() -> f64 {
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
pub fn run_in_process(opts: &BenchOptions) -> Result<BenchReport, BenchError> {
    let dataset = Dataset::open(&opts.data, &OpenOptions::default()).map_err(|source| {
        BenchError::Dataset {
            path: opts.data.display().to_string(),
            source,
        }
    })?;
    let samples = dataset.len();
    let spec = PipelineSpec {
        epochs: Some((opts.warmup_epochs + opts.epochs) as u32),
        ..opts.spec.clone()
    };
    let engine = Engine::new(opts.engine.clone())?;
    let job = Job::new(Arc::new(dataset), spec.clone(), opts.seed, 1)?;
    let ring = Arc::new(HeapRing::new(&spec, opts.slots));
    let feed = engine.start_feed(job, 0, ring, Position::default())?;

    // Timing starts when the last warm-up batch is released (or now, without warm-up), so the
    // first timed batch's production counts.
    let snapshot = || (Instant::now(), process_cpu_seconds(), engine.stats());
    let mut started: Option<(Instant, f64, StageTotals)> = (opts.warmup_epochs == 0).then(snapshot);
    let (mut images, mut batches) = (0u64, 0u64);
    while let FeedEvent::Ready(ready) = feed.recv()? {
        let warmup = ready.epoch < opts.warmup_epochs;
        if !warmup {
            images += ready.n as u64;
            batches += 1;
        }
        feed.release(ready.slot, ready.generation)?;
        if warmup {
            started = Some(snapshot());
        }
    }
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
        seconds,
        images_per_s: images as f64 / seconds.max(1e-9),
        mb_per_s_read: (s.bytes_read - stats0.bytes_read) as f64 / 1e6 / seconds.max(1e-9),
        cpu_s_per_1000: cpu / (images.max(1) as f64) * 1000.0,
        read_ms_per_image: per_image(s.read_ns, stats0.read_ns),
        decode_ms_per_image: per_image(s.decode_ns, stats0.decode_ns),
        augment_ms_per_image: per_image(s.augment_ns, stats0.augment_ns),
        bad_samples: s.bad,
    })
}

impl BenchReport {
    /// A few lines a person reads at a glance.
    pub fn table(&self) -> String {
        format!(
            "stoker cpu threads={} batch={} reader={}: {} images in {:.2}s = {:.1} img/s\n\
             \x20 per image (worker ms): read {:.3}  decode {:.3}  augment {:.3}\n\
             \x20 read {:.1} MB/s, CPU {:.2} s per 1000 images, bad samples {}",
            self.threads,
            self.batch_size,
            self.reader,
            self.images,
            self.seconds,
            self.images_per_s,
            self.read_ms_per_image,
            self.decode_ms_per_image,
            self.augment_ms_per_image,
            self.mb_per_s_read,
            self.cpu_s_per_1000,
            self.bad_samples,
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Stage by stage: storage only, decode only, decode + augment, each on its own, so that the
// slowest one names the bottleneck.
// ---------------------------------------------------------------------------------------------

/// The page cache's state during a measurement.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CacheState {
    /// The files were read in a warm-up pass first.
    Warm,
    /// The dataset's pages were dropped first.
    Cold,
    /// Samples held in memory (the decode stages).
    Memory,
}

impl CacheState {
    pub fn name(self) -> &'static str {
        match self {
            CacheState::Warm => "warm",
            CacheState::Cold => "cold",
            CacheState::Memory => "memory",
        }
    }
}

impl std::fmt::Display for CacheState {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A stage measured on its own.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum Stage {
    #[serde(rename = "storage")]
    Storage,
    #[serde(rename = "decode")]
    Decode,
    #[serde(rename = "decode+augment")]
    DecodeAugment,
    #[serde(rename = "pipeline (in-process)")]
    Pipeline,
}

impl Stage {
    pub fn name(self) -> &'static str {
        match self {
            Stage::Storage => "storage",
            Stage::Decode => "decode",
            Stage::DecodeAugment => "decode+augment",
            Stage::Pipeline => "pipeline (in-process)",
        }
    }
}

impl std::fmt::Display for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// One stage's measurement.
#[derive(Debug, Clone, Serialize)]
pub struct StageResult {
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
}

impl StageResult {
    fn new(
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
        }
    }
}

/// Threads to use for `requested` (0: one per core).
pub fn effective_threads(requested: usize) -> usize {
    if requested == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        requested
    }
}

/// Opens `path`, timing it; `cache_dir` `None` walks the dataset (no index cache).
pub fn open_timed(path: &Path, cache_dir: Option<&Path>) -> Result<(Dataset, f64), BenchError> {
    let opts = OpenOptions {
        use_cache: cache_dir.is_some(),
        cache_dir: cache_dir.map(Path::to_path_buf),
        ..OpenOptions::default()
    };
    let t0 = Instant::now();
    let ds = Dataset::open(path, &opts).map_err(|source| BenchError::Dataset {
        path: path.display().to_string(),
        source,
    })?;
    Ok((ds, t0.elapsed().as_secs_f64()))
}

/// How long indexing takes: a full walk (cache off) and a load from the index cache.
#[derive(Debug, Clone, Serialize)]
pub struct IndexTiming {
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
pub fn index_timing(path: &Path, cold: bool) -> Result<(IndexTiming, Dataset), BenchError> {
    let (ds, first_s) = open_timed(path, None)?;
    let (walk_s, walk_cold_s) = if cold {
        // Evicted, walked cold, then walked again with everything the cold walk cached.
        evict(&ds);
        let cold_s = open_timed(path, None)?.1;
        (open_timed(path, None)?.1, Some(cold_s))
    } else {
        (first_s, None)
    };
    let cache = std::env::temp_dir().join(format!("stoker-bench-index-{}", std::process::id()));
    let _ = open_timed(path, Some(&cache))?; // writes the cache
    let (cached, cached_s) = open_timed(path, Some(&cache))?;
    let _ = std::fs::remove_dir_all(&cache);
    let timing = IndexTiming {
        kind: ds.kind().as_str(),
        samples: ds.len(),
        files: distinct_files(&ds).len(),
        walk_s,
        walk_cold_s,
        cached_s,
        cache_hit: cached.origin() == crate::dataset::IndexOrigin::Cache,
    };
    Ok((timing, ds))
}

/// The files holding the dataset's samples, each once, in sample order.
pub fn distinct_files(ds: &Dataset) -> Vec<PathBuf> {
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
pub enum Eviction {
    /// `/proc/sys/vm/drop_caches` = 3 (root): page cache, dentries and inodes, as after a
    /// reboot.
    DropCaches,
    /// `posix_fadvise(POSIX_FADV_DONTNEED)` on every file of the dataset (any user who can
    /// read them; pages mapped by other processes stay).
    Fadvise,
}

/// Drops the dataset's files from the page cache: `drop_caches` as root (with the dentries
/// and inodes, so a folder's metadata is cold too), else fadvise (data pages only).
pub fn evict(ds: &Dataset) -> Eviction {
    // SAFETY: sync and geteuid take no arguments and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        // SAFETY: as above.
        unsafe { libc::sync() };
        if std::fs::write("/proc/sys/vm/drop_caches", "3").is_ok() {
            return Eviction::DropCaches;
        }
    }
    use std::os::fd::AsRawFd;
    for p in distinct_files(ds) {
        if let Ok(f) = std::fs::File::open(&p) {
            // SAFETY: the fd is open for the duration of the call; fadvise only advises.
            unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        }
    }
    Eviction::Fadvise
}

/// Peak resident memory (VmHWM) of a process in MB, from /proc; `None` if unreadable.
pub fn peak_rss_mb(pid: Option<u32>) -> Option<f64> {
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
pub fn cpu_seconds_of(pid: u32) -> Option<f64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // Fields after the command name, which is in parentheses and may hold spaces.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: f64 = f.get(11)?.parse().ok()?;
    let stime: f64 = f.get(12)?.parse().ok()?;
    // SAFETY: sysconf reads a constant.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Some((utime + stime) / hz)
}

/// Runs `work(thread)` on `threads` threads at once and returns the wall seconds and the
/// process CPU seconds it took.
fn timed_threads<F>(threads: usize, work: F) -> (f64, f64)
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
pub fn storage_only(
    ds: &Dataset,
    engine: &EngineConfig,
    seed: u64,
    cache: CacheState,
) -> Result<StageResult, BenchError> {
    let threads = effective_threads(engine.threads);
    let mut order = Vec::new();
    crate::sampler::permutation_into(ds.len() as u64, seed, 0, &mut order);
    let next = std::sync::atomic::AtomicUsize::new(0);
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let (secs, cpu) = timed_threads(threads, |_| {
        let mut reader = match crate::reader::Reader::new(engine.reader, CHUNK) {
            Ok(r) => r,
            Err(e) => {
                *failed.lock().unwrap() = Some(e);
                return;
            }
        };
        let mut bufs: Vec<Vec<u8>> = (0..CHUNK).map(|_| Vec::new()).collect();
        loop {
            let start = next.fetch_add(CHUNK, std::sync::atomic::Ordering::Relaxed);
            if start >= order.len() {
                return;
            }
            let end = (start + CHUNK).min(order.len());
            let reqs: Vec<crate::reader::ReadRequest<'_>> = order[start..end]
                .iter()
                .map(|&i| {
                    let s = ds.sample(i as usize);
                    crate::reader::ReadRequest {
                        path: s.path,
                        offset: s.offset,
                        len: s.len,
                    }
                })
                .collect();
            let res = reader.read_batch(&reqs, &mut bufs);
            if let Some(t) = engine.throttle {
                std::thread::sleep(t.read_delay * reqs.len() as u32);
            }
            let n: u64 = res
                .iter()
                .zip(&bufs)
                .filter(|(r, _)| r.is_ok())
                .map(|(_, b)| b.len() as u64)
                .sum();
            bytes.fetch_add(n, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        return Err(BenchError::Reader(e));
    }
    Ok(StageResult::new(
        Stage::Storage,
        threads,
        ds.len() as u64,
        bytes.into_inner(),
        secs,
        cpu,
        cache,
    ))
}

/// Encoded samples held in memory for the decode stages: (global index, bytes).
pub fn load_samples(ds: &Dataset, max: usize, seed: u64) -> Vec<(u64, Vec<u8>)> {
    let mut order = Vec::new();
    crate::sampler::permutation_into(ds.len() as u64, seed, 0, &mut order);
    order.truncate(max);
    let mut out = Vec::with_capacity(order.len());
    for i in order {
        let s = ds.sample(i as usize);
        let mut buf = vec![0u8; s.len as usize];
        let ok = std::fs::File::open(s.path).and_then(|f| {
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
pub struct AtLeast {
    pub images: usize,
    pub seconds: f64,
}

/// Decode only (`augment == false`) or decode + augment, from bytes in memory, on `threads`
/// threads, each image decoded as the pipeline does (ROI at the smallest DCT scale that covers
/// the crop). Repeats the set until `at_least` is reached.
pub fn decode_stage(
    samples: &[(u64, Vec<u8>)],
    spec: &PipelineSpec,
    engine: &EngineConfig,
    seed: u64,
    augment: bool,
    at_least: AtLeast,
) -> Result<StageResult, BenchError> {
    let threads = effective_threads(engine.threads);
    let total = if samples.is_empty() {
        0
    } else {
        at_least.images.div_ceil(samples.len()).max(1) * samples.len()
    };
    let image_bytes = stoker::ring::SlotLayout::new(spec).image_bytes;
    let next = std::sync::atomic::AtomicUsize::new(0);
    let done = std::sync::atomic::AtomicU64::new(0);
    let bytes = std::sync::atomic::AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let t0 = Instant::now();
    let (secs, cpu) = timed_threads(threads, |_| {
        let mut decoder = match crate::decode::CpuDecoder::new(engine.limits) {
            Ok(d) => d,
            Err(e) => {
                *failed.lock().unwrap() = Some(e);
                return;
            }
        };
        let mut augmenter = crate::augment::Augmenter::default();
        let mut image = stoker_kernels::reference::RgbImage::default();
        let mut out = vec![0u8; image_bytes];
        loop {
            let k = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            if samples.is_empty() || (k >= total && t0.elapsed().as_secs_f64() >= at_least.seconds)
            {
                return;
            }
            let (index, data) = &samples[k % samples.len()];
            if let Some(t) = engine.throttle {
                std::thread::sleep(t.decode_delay);
            }
            let ok = (|| -> Result<(), crate::decode::DecodeError> {
                let h = crate::decode::probe(data)?;
                let (crop, flip) =
                    crate::augment::sample_params(spec, h.width, h.height, seed, 0, *index);
                let within =
                    decoder.decode_for_crop(data, crop, spec.crop.output_size(), &mut image)?;
                if augment {
                    augmenter.augment_into(&image, within, flip, spec, &mut out);
                }
                Ok(())
            })();
            if ok.is_ok() {
                bytes.fetch_add(data.len() as u64, std::sync::atomic::Ordering::Relaxed);
            }
            done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        }
    });
    if let Some(e) = failed.into_inner().unwrap() {
        return Err(BenchError::Decoder(e));
    }
    let name = if augment {
        Stage::DecodeAugment
    } else {
        Stage::Decode
    };
    Ok(StageResult::new(
        name,
        threads,
        done.into_inner(),
        bytes.into_inner(),
        secs,
        cpu,
        CacheState::Memory,
    ))
}

/// Images/s of a pipeline in this process, as a stage row.
pub fn pipeline_stage(report: &BenchReport, cache: CacheState) -> StageResult {
    let mut r = StageResult::new(
        Stage::Pipeline,
        report.threads,
        report.images,
        (report.mb_per_s_read * 1e6 * report.seconds) as u64,
        report.seconds,
        report.cpu_s_per_1000 * report.images as f64 / 1000.0,
        cache,
    );
    r.cpu_s_per_1000 = report.cpu_s_per_1000;
    r
}

// ---------------------------------------------------------------------------------------------
// The verdict.
// ---------------------------------------------------------------------------------------------

/// Which stage limits throughput, and how far the others are from it.
#[derive(Debug, Clone, Serialize)]
pub struct Verdict {
    /// "storage", "decode", "augment" or "delivery".
    pub bottleneck: &'static str,
    /// Images/s each part could give alone: (part, images/s).
    pub capacity: Vec<(&'static str, f64)>,
    /// One line: "decode-bound: storage could give 3.1x more, augment 4.0x more".
    pub line: String,
}

/// Names the bottleneck from the stage rates (images/s). Augment's own rate is derived from
/// decode and decode+augment (time per image is additive). `pipeline` and `end_to_end`, when
/// given, detect a delivery bottleneck: end to end well below what the pipeline makes in
/// process means the daemon-to-client path (or the clients) limits.
pub fn verdict(
    storage: f64,
    decode: f64,
    decode_augment: f64,
    pipeline: Option<f64>,
    end_to_end: Option<f64>,
) -> Verdict {
    let augment = if decode_augment > 0.0 && decode > decode_augment {
        1.0 / (1.0 / decode_augment - 1.0 / decode)
    } else {
        f64::INFINITY
    };
    let mut capacity = vec![
        ("storage", storage),
        ("decode", decode),
        ("augment", augment),
    ];
    if let (Some(p), Some(e)) = (pipeline, end_to_end) {
        if e < 0.7 * p {
            // Delivery can give no more than what was measured end to end.
            capacity.push(("delivery", e));
        }
    }
    let (bottleneck, min) =
        capacity.iter().copied().fold(
            ("storage", f64::INFINITY),
            |a, b| if b.1 < a.1 { b } else { a },
        );
    let others: Vec<String> = capacity
        .iter()
        .filter(|(name, _)| *name != bottleneck)
        .map(|(name, rate)| {
            if rate.is_finite() {
                format!("{name} could give {:.1}x more", rate / min.max(1e-9))
            } else {
                format!("{name} costs nothing measurable")
            }
        })
        .collect();
    let mut line = format!("{bottleneck}-bound: {}", others.join(", "));
    if let (Some(p), Some(e)) = (pipeline, end_to_end) {
        line.push_str(&format!(
            "; end to end delivers {:.2}x of the in-process pipeline",
            e / p.max(1e-9)
        ));
    }
    Verdict {
        bottleneck,
        capacity: capacity
            .into_iter()
            .map(|(n, r)| (n, if r.is_finite() { r } else { -1.0 }))
            .collect(),
        line,
    }
}

// ---------------------------------------------------------------------------------------------
// The SVG chart.
// ---------------------------------------------------------------------------------------------

/// A horizontal bar chart, one group per title: (group title, [(label, images/s)]).
pub fn svg_chart(title: &str, subtitle: &str, groups: &[(String, Vec<(String, f64)>)]) -> String {
    const W: f64 = 760.0;
    const LABEL_W: f64 = 230.0;
    const BAR_H: f64 = 20.0;
    const GAP: f64 = 6.0;
    let esc = |s: &str| {
        s.replace('&', "&amp;")
            .replace('<', "&lt;")
            .replace('>', "&gt;")
    };
    let mut y = 58.0;
    let mut body = String::new();
    let colours = ["#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2"];
    for (g, (gtitle, bars)) in groups.iter().enumerate() {
        // Each group has its own scale: storage runs orders of magnitude above decode.
        let max = bars.iter().map(|b| b.1).fold(1.0f64, f64::max);
        body.push_str(&format!(
            "<text x=\"10\" y=\"{:.0}\" font-weight=\"bold\">{}</text>\n",
            y + 14.0,
            esc(gtitle)
        ));
        y += 24.0;
        for (label, v) in bars {
            let w = (W - LABEL_W - 110.0) * v / max;
            body.push_str(&format!(
                "<text x=\"{:.0}\" y=\"{:.0}\" text-anchor=\"end\">{}</text>\
                 <rect x=\"{LABEL_W:.0}\" y=\"{y:.0}\" width=\"{w:.1}\" height=\"{BAR_H:.0}\" fill=\"{}\"/>\
                 <text x=\"{:.1}\" y=\"{:.0}\">{:.0} img/s</text>\n",
                LABEL_W - 8.0,
                y + 15.0,
                esc(label),
                colours[g % colours.len()],
                LABEL_W + w + 6.0,
                y + 15.0,
                v
            ));
            y += BAR_H + GAP;
        }
        y += 10.0;
    }
    format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{W:.0}\" height=\"{:.0}\" \
         font-family=\"sans-serif\" font-size=\"13\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n\
         <text x=\"10\" y=\"24\" font-size=\"16\" font-weight=\"bold\">{}</text>\n\
         <text x=\"10\" y=\"46\">{}</text>\n{body}</svg>\n",
        y + 10.0,
        esc(title),
        esc(subtitle)
    )
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::pipeline::Throttle;
    use crate::synth::{generate, SynthOptions};

    /// 48 small generated images in two classes.
    fn small_dataset() -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        generate(
            dir.path(),
            &SynthOptions {
                images: 48,
                classes: 2,
                size_scale: 0.2,
                threads: 2,
                ..SynthOptions::default()
            },
        )
        .unwrap();
        dir
    }

    /// Measures the three stages on a small generated dataset with `throttle` and returns the
    /// verdict.
    fn verdict_with(throttle: Throttle) -> Verdict {
        let dir = small_dataset();
        let (ds, _) = open_timed(dir.path(), None).unwrap();
        let engine = EngineConfig {
            threads: 2,
            throttle: Some(throttle),
            ..EngineConfig::default()
        };
        let spec = PipelineSpec::train(16, 64);
        let storage = storage_only(&ds, &engine, 0, CacheState::Warm).unwrap();
        let samples = load_samples(&ds, 48, 0);
        assert_eq!(samples.len(), 48);
        let once = AtLeast {
            images: 48,
            seconds: 0.0,
        };
        let decode = decode_stage(&samples, &spec, &engine, 0, false, once).unwrap();
        let both = decode_stage(&samples, &spec, &engine, 0, true, once).unwrap();
        assert_eq!(storage.images, 48);
        assert!(storage.mb_per_s > 0.0 && decode.images_per_s > 0.0);
        verdict(
            storage.images_per_s,
            decode.images_per_s,
            both.images_per_s,
            None,
            None,
        )
    }

    #[test]
    fn a_slow_reader_is_storage_bound() {
        let v = verdict_with(Throttle {
            read_delay: Duration::from_millis(8),
            decode_delay: Duration::ZERO,
        });
        assert_eq!(v.bottleneck, "storage", "{}", v.line);
        assert!(
            v.line.starts_with("storage-bound: decode could give "),
            "{}",
            v.line
        );
    }

    #[test]
    fn a_slow_decoder_is_decode_bound() {
        let v = verdict_with(Throttle {
            read_delay: Duration::ZERO,
            decode_delay: Duration::from_millis(8),
        });
        assert_eq!(v.bottleneck, "decode", "{}", v.line);
        assert!(
            v.line.starts_with("decode-bound: storage could give "),
            "{}",
            v.line
        );
    }

    #[test]
    fn the_throttled_pipeline_slows_down_by_the_delay() {
        // The hook in the engine itself: 48 images at 8 ms each on 2 threads take >= 192 ms.
        let dir = small_dataset();
        let mut opts = BenchOptions::standard(dir.path(), 2);
        opts.spec = PipelineSpec::train(16, 64);
        opts.warmup_epochs = 0;
        opts.epochs = 1;
        opts.engine.throttle = Some(Throttle {
            read_delay: Duration::from_millis(8),
            decode_delay: Duration::ZERO,
        });
        let r = run_in_process(&opts).unwrap();
        assert_eq!(r.images, 48);
        assert!(r.images_per_s < 48.0 / 0.19, "{}", r.images_per_s);
        assert!(r.read_ms_per_image >= 7.0, "{}", r.read_ms_per_image);
    }

    #[test]
    fn the_verdict_names_the_slowest_part_and_the_headroom_of_the_others() {
        let v = verdict(3100.0, 1000.0, 800.0, Some(790.0), Some(780.0));
        assert_eq!(v.bottleneck, "decode");
        // augment alone: 1 / (1/800 - 1/1000) = 4000 img/s.
        assert_eq!(
            v.line,
            "decode-bound: storage could give 3.1x more, augment could give 4.0x more; \
             end to end delivers 0.99x of the in-process pipeline"
        );
        let v = verdict(3100.0, 1000.0, 800.0, Some(790.0), Some(200.0));
        assert_eq!(v.bottleneck, "delivery", "{}", v.line);
    }

    #[test]
    fn the_chart_is_svg_with_one_bar_per_value() {
        let svg = svg_chart(
            "t <1>",
            "verdict",
            &[("g".into(), vec![("a".into(), 10.0), ("b".into(), 20.0)])],
        );
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        assert_eq!(svg.matches("<rect x=").count(), 2);
        assert!(svg.contains("t &lt;1&gt;"));
    }
}
