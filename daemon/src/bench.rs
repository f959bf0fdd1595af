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
    Engine, EngineConfig, FeedEvent, HeapRing, Job, PipelineError, Position, StageTotals,
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

    let mut started: Option<(Instant, f64, StageTotals)> = None;
    let (mut images, mut batches) = (0u64, 0u64);
    while let FeedEvent::Ready(ready) = feed.recv()? {
        if ready.epoch >= opts.warmup_epochs {
            if started.is_none() {
                started = Some((Instant::now(), process_cpu_seconds(), engine.stats()));
            }
            images += ready.n as u64;
            batches += 1;
        }
        feed.release(ready.slot, ready.generation)?;
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
