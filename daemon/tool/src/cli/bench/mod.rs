//! `stoker bench DATA`: where the time goes, what limits throughput, and how stoker compares.
//!
//! Runs, on the user's data and machine: indexing (cache off and on), storage only (the reader,
//! no decode), decode only and decode + augment (bytes in memory), the whole pipeline in this
//! process, and end to end: a real `stokerd` (or `--socket` of a running one) serving N real
//! client processes (`stoker bench-client`) that read every byte. Then a one-line verdict naming
//! the bottleneck, scaling by client count and decode threads, optional cold-cache rows
//! (`--cold`) and the CPU peers side by side (`--compare`). Progress goes to stderr; results to
//! the terminal as a table, to JSON (`--json`) and to an SVG chart (`--svg`).
//!
//! With `--backend cuda` it measures the GPU path instead (`cuda.rs`): the hardware JPEG
//! engines' batched decode rate and `stokerd --backend cuda` end to end. With `--views dino`
//! only the several-views row (`views.rs`): stoker beside the DataLoader doing the same views;
//! with `--recipe` only a training recipe's row (`recipe.rs`): its operations, beside the
//! DataLoader with the same torchvision Compose and DALI.
//!
//! # Limitations
//! - With `--socket`, the daemon's peak memory and CPU time are not known (it may be shared).
//! - Cold rows drop the page cache with posix_fadvise(DONTNEED) per file (pages another process
//!   maps stay cached, and so do dentries and inodes); as root, /proc/sys/vm/drop_caches = 3
//!   drops data and metadata, as after a reboot.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker_wire::spec::{Crop, PipelineSpec};

use crate::bench::{
    decode_stage, effective_threads, entropy_stage, evict, index_timing, load_samples, peak_rss_mb,
    pipeline_stage, run_in_process, storage_only, svg_chart, verdict, AtLeast, BenchOptions,
    BenchReport, CacheState, Ceiling, Eviction, IndexTiming, Stage, StageResult, Verdict,
};
use stoker_pipeline::engine::choice::BackendChoice;
use stoker_pipeline::source::index::Dataset;

use super::bench_client::ClientStats;
use super::Exit;

/// Arguments of `stoker bench`.
#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Dataset: an ImageFolder tree, a flat folder, a file list or tar shards.
    pub(crate) data: PathBuf,
    /// Decode backend. `cuda` measures the GPU path instead (`--device`): the hardware JPEG
    /// engines' batched decode rate (the ceiling) and `stokerd --backend cuda` end to end into
    /// a client process; `auto` and `cpu` measure the CPU path.
    #[arg(long, value_enum, default_value = "auto")]
    pub(crate) backend: BackendChoice,
    /// With `--backend cuda`: the GPU (`cuda`, `cuda:N` or a UUID).
    #[arg(long, default_value = "cuda")]
    pub(crate) device: stoker_wire::Device,
    /// With `--backend cuda`: only the hardware decoder's rate, no daemon.
    #[arg(long)]
    pub(crate) decode_only: bool,
    /// With `--backend cuda`: the engines' rate with T threads x S batches in flight each
    /// (`T` or `TxS`), on whole images and on the crops' regions, e.g. 1,2,4,2x2.
    #[arg(long, value_delimiter = ',', default_value = "1x2")]
    pub(crate) decode_streams: Vec<decode_streams::DecodeStreams>,
    /// With `--backend cuda`: CU_CTX_SCHED_BLOCKING_SYNC on the primary context, here and in
    /// the daemon it starts (`cuda.blocking_sync`).
    #[arg(long)]
    pub(crate) blocking_sync: bool,
    /// With `--backend cuda`: nvJPEG reads the bitstreams from pinned memory, here and in the
    /// daemon it starts (`cuda.pinned_inputs`).
    #[arg(long)]
    pub(crate) pinned_inputs: bool,
    /// With `--backend cuda`: end to end at each `cuda.hw_decode_share`, e.g. 1,0.65,0.
    #[arg(long, value_delimiter = ',')]
    pub(crate) hw_shares: Vec<f64>,
    /// `[cuda]` keys for the daemon the run starts (set by `--hw-shares`).
    #[arg(skip)]
    pub(crate) daemon_config: String,
    /// Decode worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub(crate) threads: usize,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
    /// Timed epochs (after the warm-up epochs), at least; see --min-seconds.
    #[arg(long, default_value_t = 2)]
    pub(crate) epochs: u64,
    /// Warm runs last at least this long: the decode stages repeat their samples, and the
    /// in-process pipeline runs timed epochs from --epochs until this time is up (at most as
    /// many as the measured decode+augment rate says take this long). The clients, the
    /// scaling runs and the peers run as many epochs as it did. Cold runs are one epoch
    /// whatever its length.
    #[arg(long, default_value_t = 5.0)]
    pub(crate) min_seconds: f64,
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: u64,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Client process counts for the end-to-end runs (ranks of one job), e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub(crate) clients: Vec<usize>,
    /// Use this running daemon instead of starting one.
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    /// The stokerd binary to start (default: next to this `stoker`).
    #[arg(long)]
    pub(crate) stokerd: Option<PathBuf>,
    /// Only the in-process stages: no daemon, no clients.
    #[arg(long)]
    pub(crate) in_process: bool,
    /// Skip the scaling runs (client counts after the first, decode threads 1..cores).
    #[arg(long)]
    pub(crate) no_scaling: bool,
    /// Also measure with a cold page cache (indexing walk, storage, pipeline and end to end).
    /// As root this drops the whole host's page cache, dentries and inodes (drop_caches = 3);
    /// as another user only the dataset's data pages (posix_fadvise).
    #[arg(long)]
    pub(crate) cold: bool,
    /// Only indexing and storage (warm, and cold with --cold), no decoding: to compare
    /// layouts or filesystems quickly, or on datasets too large to decode in a benchmark's time.
    #[arg(long)]
    pub(crate) storage_only: bool,
    /// At most this many samples are held in memory for the decode stages.
    #[arg(long, default_value_t = 2000)]
    pub(crate) decode_sample: usize,
    /// Run the CPU peers (the scripts shipped in the Python package's stoker/peers) on the same
    /// files and print stoker's ratio to each;
    /// for an `s3://` dataset, s3torchconnector with the DataLoader on the same objects, against
    /// stoker's cold (from the server) figure.
    #[arg(long)]
    pub(crate) compare: bool,
    /// With an `s3://` dataset: a local folder holding the same files; stoker is measured on it
    /// and on the dataset (warm: from the node cache) alternately, twice each, and the ratio
    /// printed beside the peers.
    #[arg(long)]
    pub(crate) local_copy: Option<PathBuf>,
    /// The peers' Python (default: $STOKER_PEER_PYTHON, which the wheel's stoker sets to its
    /// own, else `python3` on PATH).
    #[arg(long)]
    pub(crate) peer_python: Option<PathBuf>,
    /// The peers' folder (default: $STOKER_PEERS, else the wheel's stoker/peers beside this
    /// executable, else python/stoker/peers in the working directory).
    #[arg(long)]
    pub(crate) peers: Option<PathBuf>,
    /// Write the report as JSON to this file (default: stoker-bench-NAME.json here, NAME being
    /// the dataset's folder or file name).
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
    /// Write an SVG chart (images/s by stage, by client count, by threads, beside the peers) to
    /// this file (default: stoker-bench-NAME.svg here).
    #[arg(long)]
    pub(crate) svg: Option<PathBuf>,
    /// Only the several-views row (docs/views.md): `dino` is 2 global views (224, scale
    /// 0.4-1) and 6 local ones (96, scale 0.05-0.4), in process, against the PyTorch
    /// DataLoader doing the same views in the same run.
    #[arg(long, value_enum)]
    pub(crate) views: Option<views::ViewsPreset>,
    /// Only a training recipe's row (docs/benchmarks.md): `torchvision-reference` (RRC 176,
    /// flip, TrivialAugmentWide, normalise, RandomErasing 0.1) or `dino` (2 x 224 + 6 x 96
    /// views with DINO's colour operations), in process, against the PyTorch DataLoader with
    /// the same torchvision Compose and (reference) DALI's CPU pipeline, in the same run.
    #[arg(long, value_enum, conflicts_with = "views")]
    pub(crate) recipe: Option<recipe::Recipe>,
    /// With --recipe: also run the recipe once without each kind of operation, and once with
    /// a do-nothing operation (the 8-bit path alone), to show what each costs.
    #[arg(long)]
    pub(crate) op_costs: bool,
    /// With --recipe: the Python that has DALI (default: the peers' Python).
    #[arg(long)]
    pub(crate) dali_python: Option<PathBuf>,
    #[command(flatten)]
    pub(crate) remote: workers::WorkersArgs,
    /// A whole spec for the client processes in place of the spec flags (a recipe's views and
    /// operations have no flags); set by the recipe row, not on the command line.
    #[arg(skip)]
    pub(crate) spec_override: Option<PipelineSpec>,
}

/// One end-to-end run: a daemon serving `clients` client processes.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct ServedResult {
    pub clients: usize,
    pub cache: CacheState,
    pub images: u64,
    pub seconds: f64,
    pub images_per_s: f64,
    /// Image bytes delivered to the clients per second.
    pub mb_per_s: f64,
    pub wait_p50_ms: f64,
    pub wait_p99_ms: f64,
    /// Daemon + clients CPU seconds per 1000 images (`None` with `--socket`).
    pub cpu_s_per_1000: Option<f64>,
    pub daemon_peak_rss_mb: Option<f64>,
    pub client_peak_rss_mb: f64,
    /// The daemon's GPUs as `stoker status` showed them when the clients were done (decode
    /// mix, time per batch); empty for the CPU backend.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gpus: Vec<stoker_wire::protocol::GpuStatus>,
}

/// A peer's figure from the same run.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct PeerResult {
    pub name: String,
    pub images_per_s: Option<f64>,
    /// stoker's images/s (end to end with one client, else in-process) over the peer's.
    pub ratio: Option<f64>,
    /// Which of stoker's figures the ratio uses.
    pub against: Option<String>,
    pub error: Option<String>,
}

/// Everything `stoker bench` measured.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct FullReport {
    /// The in-process pipeline run (its fields at the top level, as earlier versions wrote);
    /// absent with `--storage-only`.
    #[serde(flatten, skip_serializing_if = "Option::is_none")]
    pub pipeline: Option<BenchReport>,
    pub dataset: String,
    pub decode_threads: usize,
    pub read_with: &'static str,
    pub backend: &'static str,
    pub spec: PipelineSpec,
    /// Warm-up and timed epochs of every warm run (cold runs time one epoch).
    pub warmup_epochs: u64,
    pub timed_epochs: u64,
    pub index: IndexTiming,
    pub stages: Vec<StageResult>,
    pub end_to_end: Vec<ServedResult>,
    pub thread_scaling: Vec<StageResult>,
    pub eviction: Option<Eviction>,
    /// Absent with `--storage-only`.
    pub verdict: Option<Verdict>,
    pub ceiling: Option<Ceiling>,
    pub peers: Vec<PeerResult>,
    pub bench_peak_rss_mb: Option<f64>,
}

fn progress(step: &str) {
    eprintln!("stoker bench: {step}");
}

/// Runs `stoker bench`: measures, prints the table, writes the JSON and SVG reports, and
/// returns the exit code.
pub fn run(args: &BenchArgs) -> Exit {
    if let Some(preset) = args.views {
        return views::run(args, preset);
    }
    if let Some(recipe) = args.recipe {
        return recipe::run(args, recipe);
    }
    let spec = args.spec.spec();
    if let Err(e) = spec.validate() {
        eprintln!("stoker bench: {e}");
        return Exit::Usage;
    }
    let (json_path, svg_path) = output_paths(args);
    // Refuse a folder that is not there before the run, not after it.
    for path in [&json_path, &svg_path] {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        if parent.is_some_and(|p| !p.is_dir()) {
            eprintln!(
                "stoker bench: cannot write {}: no such folder",
                path.display()
            );
            return Exit::Usage;
        }
    }
    if args.backend == BackendChoice::Cuda {
        return cuda::run(args, spec, &json_path);
    }
    if !args.remote.workers.is_empty() {
        return workers::run(args, &spec, &json_path);
    }
    match bench(args, spec) {
        Ok(report) => {
            println!("{}", table(&report));
            let text = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
            for (path, content) in [(&json_path, text), (&svg_path, chart(&report))] {
                if let Err(e) = std::fs::write(path, content) {
                    eprintln!("stoker bench: cannot write {}: {e}", path.display());
                    return Exit::Failure;
                }
            }
            eprintln!(
                "stoker bench: wrote {} and {}",
                json_path.display(),
                svg_path.display()
            );
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker bench: {e}");
            Exit::Failure
        }
    }
}

/// The dataset's path as the runs name it (canonical, or the URL) and the options every
/// in-process run shares.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn bench_options(
    args: &BenchArgs,
    spec: &PipelineSpec,
) -> Result<(PathBuf, usize, BenchOptions), String> {
    let data = if stoker_pipeline::source::object::is_url(&args.data) {
        args.data.clone()
    } else {
        std::fs::canonicalize(&args.data).map_err(|e| format!("{}: {e}", args.data.display()))?
    };
    let threads = effective_threads(args.threads);
    let mut opts = BenchOptions::standard(&data, threads);
    opts.spec = spec.clone();
    opts.epochs = args.epochs.max(1);
    opts.min_epochs = opts.epochs;
    opts.warmup_epochs = args.warmup;
    opts.seed = args.seed;
    Ok((data, threads, opts))
}

// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn bench(args: &BenchArgs, spec: PipelineSpec) -> Result<FullReport, String> {
    let (data, threads, mut opts) = bench_options(args, &spec)?;

    progress("indexing (cache off, then on)");
    let (index, ds) = index_timing(&data, args.cold, &opts.objects).map_err(|e| e.to_string())?;
    progress(&format!(
        "{} samples in {} files ({}); walk {:.3}s, from cache {:.3}s",
        index.samples, index.files, index.kind, index.walk_s, index.cached_s
    ));

    let mut stages = Vec::new();
    progress("storage only (warm page cache)");
    storage_only(&ds, &opts.engine, args.seed, CacheState::Warm).map_err(|e| e.to_string())?;
    stages.push(
        storage_only(&ds, &opts.engine, args.seed, CacheState::Warm).map_err(|e| e.to_string())?,
    );
    let read_with = stoker_pipeline::source::local::reader::Reader::new(opts.engine.reader, 1)
        .map_or("unavailable", |r| r.kind());
    if args.storage_only {
        let mut eviction = None;
        if args.cold {
            progress("storage only (cold page cache)");
            eviction = Some(evict(&ds));
            stages.push(
                storage_only(&ds, &opts.engine, args.seed, CacheState::Cold)
                    .map_err(|e| e.to_string())?,
            );
        }
        return Ok(FullReport {
            stages,
            eviction,
            ..FullReport::empty(args, &data, threads, read_with, spec, index)
        });
    }
    decode_stages(args, &spec, &mut opts, &ds, &mut stages)?;
    let pipeline = timed_pipeline(args, &mut opts, &mut stages)?;
    let args = &BenchArgs {
        epochs: opts.epochs,
        ..args.clone()
    };

    let eviction = if args.cold {
        Some(cold_in_process(&ds, &opts, &mut stages)?)
    } else {
        None
    };
    let end_to_end = if args.in_process {
        Vec::new()
    } else {
        end_to_end_runs(args, &data, threads, &ds)
    };
    let thread_scaling = if args.no_scaling {
        Vec::new()
    } else {
        scaling_runs(&opts, threads)?
    };
    let verdict = bench_verdict(&stages, &end_to_end, &pipeline);

    let warm = ours(&end_to_end, Some(&pipeline)).expect("the pipeline ran");
    let cold = ours_cold(&end_to_end, &stages);
    let peers = peer_runs(args, &opts, &data, threads, warm, cold);

    Ok(FullReport {
        pipeline: Some(pipeline),
        ceiling: Ceiling::of(&stages),
        stages,
        end_to_end,
        thread_scaling,
        eviction,
        verdict: Some(verdict),
        peers,
        ..FullReport::empty(args, &data, threads, read_with, spec, index)
    })
}

impl FullReport {
    /// A report of what every run knows, with no measurement beyond the index yet.
    fn empty(
        args: &BenchArgs,
        data: &Path,
        threads: usize,
        read_with: &'static str,
        spec: PipelineSpec,
        index: IndexTiming,
    ) -> FullReport {
        FullReport {
            pipeline: None,
            dataset: data.display().to_string(),
            decode_threads: threads,
            read_with,
            backend: "cpu",
            spec,
            warmup_epochs: args.warmup,
            timed_epochs: args.epochs,
            index,
            stages: Vec::new(),
            end_to_end: Vec::new(),
            thread_scaling: Vec::new(),
            eviction: None,
            verdict: None,
            ceiling: None,
            peers: Vec::new(),
            bench_peak_rss_mb: peak_rss_mb(None),
        }
    }
}

/// Decode only and decode + augment on samples held in memory; sets `opts.epochs` to what
/// every later warm run times, from the measured rate.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn decode_stages(
    args: &BenchArgs,
    spec: &PipelineSpec,
    opts: &mut BenchOptions,
    ds: &Dataset,
    stages: &mut Vec<StageResult>,
) -> Result<(), String> {
    progress(&format!(
        "loading up to {} samples into memory for the decode stages",
        args.decode_sample
    ));
    let samples = load_samples(ds, args.decode_sample, args.seed);
    let min_s = args.min_seconds.max(0.0);
    let at_least = AtLeast {
        images: 1000.max(samples.len()),
        seconds: min_s,
    };
    progress("entropy decode only (the ceiling), then decode only");
    stages.push(entropy_stage(&samples, &opts.engine, at_least).map_err(|e| e.to_string())?);
    let decode = decode_stage(&samples, spec, &opts.engine, args.seed, false, at_least);
    stages.push(decode.map_err(|e| e.to_string())?);
    progress("decode + augment");
    let both = decode_stage(&samples, spec, &opts.engine, args.seed, true, at_least)
        .map_err(|e| e.to_string())?;
    drop(samples);
    // The in-process pipeline runs up to this many epochs, and stops at the first epoch end
    // after --min-seconds (and --epochs): a rate measured on a few samples cannot make it run
    // for long.
    opts.epochs = timed_epochs(args.epochs, min_s, both.images_per_s, ds.len());
    opts.until_s = Some(min_s);
    stages.push(both);
    Ok(())
}

/// The warm in-process pipeline, up to `opts.epochs` timed epochs and stopped at the first
/// epoch end past --min-seconds; then sets `opts` so that every later warm run (clients,
/// scaling, peers) times the epochs it ran, whatever the decode rate promised.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn timed_pipeline(
    args: &BenchArgs,
    opts: &mut BenchOptions,
    stages: &mut Vec<StageResult>,
) -> Result<BenchReport, String> {
    progress(&format!(
        "pipeline in process ({} warm-up + up to {} timed epochs, {:.1} s at least)",
        opts.warmup_epochs,
        opts.epochs,
        args.min_seconds.max(0.0)
    ));
    let pipeline = run_in_process(opts).map_err(|e| e.to_string())?;
    stages.push(pipeline_stage(&pipeline, CacheState::Warm));
    opts.epochs = pipeline.epochs.max(1);
    opts.min_epochs = opts.epochs;
    opts.until_s = None;
    Ok(pipeline)
}

/// The cold-cache storage and in-process pipeline rows; returns how the cache was emptied.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn cold_in_process(
    ds: &Dataset,
    opts: &BenchOptions,
    stages: &mut Vec<StageResult>,
) -> Result<Eviction, String> {
    progress("storage only (cold page cache)");
    let eviction = evict(ds);
    stages.push(
        storage_only(ds, &opts.engine, opts.seed, CacheState::Cold).map_err(|e| e.to_string())?,
    );
    progress("pipeline in process (cold page cache, one epoch)");
    evict(ds);
    let cold = BenchOptions {
        warmup_epochs: 0,
        epochs: 1,
        ..opts.clone()
    };
    let r = run_in_process(&cold).map_err(|e| e.to_string())?;
    stages.push(pipeline_stage(&r, CacheState::Cold));
    Ok(eviction)
}

/// stokerd + N client processes for each client count (the first only with --no-scaling),
/// then the cold run with --cold. A failed run is reported and ends the series.
fn end_to_end_runs(
    args: &BenchArgs,
    data: &Path,
    threads: usize,
    ds: &Dataset,
) -> Vec<ServedResult> {
    let mut end_to_end = Vec::new();
    let counts: Vec<usize> = if args.no_scaling {
        args.clients.iter().copied().take(1).collect()
    } else {
        args.clients.clone()
    };
    for &n in counts.iter().filter(|&&n| n > 0) {
        progress(&format!("end to end: stokerd + {n} client process(es)"));
        match run_served(args, data, n, threads, CacheState::Warm, None) {
            Ok(r) => end_to_end.push(r),
            Err(e) => {
                eprintln!("stoker bench: end to end with {n} clients skipped: {e}");
                break;
            }
        }
    }
    if args.cold && !end_to_end.is_empty() {
        progress("end to end, cold page cache: stokerd + 1 client, one epoch");
        match run_served(args, data, 1, threads, CacheState::Cold, Some(ds)) {
            Ok(r) => end_to_end.push(r),
            Err(e) => eprintln!("stoker bench: cold end to end skipped: {e}"),
        }
    }
    end_to_end
}

/// The in-process pipeline with 1..cores decode threads.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn scaling_runs(opts: &BenchOptions, threads: usize) -> Result<Vec<StageResult>, String> {
    let mut thread_scaling = Vec::new();
    let cores = effective_threads(0);
    for t in 1..=cores.max(threads) {
        progress(&format!(
            "scaling: pipeline in process with {t} decode thread(s)"
        ));
        let o = BenchOptions {
            engine: stoker_pipeline::engine::EngineConfig {
                threads: t,
                ..opts.engine.clone()
            },
            ..opts.clone()
        };
        let r = run_in_process(&o).map_err(|e| e.to_string())?;
        thread_scaling.push(pipeline_stage(&r, CacheState::Warm));
    }
    Ok(thread_scaling)
}

/// The verdict from the warm stage rows and the best warm end-to-end figure.
fn bench_verdict(
    stages: &[StageResult],
    end_to_end: &[ServedResult],
    pipeline: &BenchReport,
) -> Verdict {
    let rate = |stage: Stage| {
        stages
            .iter()
            .find(|s| s.stage == stage && s.cache != CacheState::Cold)
            .map_or(0.0, |s| s.images_per_s)
    };
    let best_e2e = end_to_end
        .iter()
        .filter(|r| r.cache == CacheState::Warm)
        .map(|r| r.images_per_s)
        .fold(None, |a: Option<f64>, b| Some(a.map_or(b, |a| a.max(b))));
    verdict(
        rate(Stage::Storage),
        rate(Stage::Decode),
        rate(Stage::DecodeAugment),
        Some(pipeline.images_per_s),
        best_e2e,
    )
}

/// Where the report goes: --json and --svg, else `stoker-bench-NAME.json` and `.svg` in the
/// working folder, NAME being the dataset's file name.
fn output_paths(args: &BenchArgs) -> (PathBuf, PathBuf) {
    let name = if stoker_pipeline::source::object::is_url(&args.data) {
        Some(args.data.clone())
    } else {
        args.data.canonicalize().ok()
    }
    .and_then(|p| p.file_name().map(|n| n.to_string_lossy().into_owned()))
    .unwrap_or_else(|| "data".into());
    let default = |ext: &str| PathBuf::from(format!("stoker-bench-{name}.{ext}"));
    (
        args.json.clone().unwrap_or_else(|| default("json")),
        args.svg.clone().unwrap_or_else(|| default("svg")),
    )
}

/// stoker's figure the peers are compared with: end to end with one warm client, like the
/// peers' single training process, else the in-process pipeline.
fn ours(
    end_to_end: &[ServedResult],
    pipeline: Option<&BenchReport>,
) -> Option<(&'static str, f64)> {
    end_to_end
        .iter()
        .find(|e| e.clients == 1 && e.cache == CacheState::Warm)
        .map(|e| ("end to end (1 client), warm", e.images_per_s))
        .or_else(|| pipeline.map(|p| ("pipeline in process", p.images_per_s)))
}

/// The peers of `--compare` and `--local-copy`: for an `s3://` dataset s3torchconnector
/// (against stoker's `cold` figure when there is one), else the CPU peers; stoker on the local
/// copy against its `warm` figure.
fn peer_runs(
    args: &BenchArgs,
    opts: &BenchOptions,
    data: &Path,
    threads: usize,
    warm: (&'static str, f64),
    cold: Option<(&'static str, f64)>,
) -> Vec<PeerResult> {
    let mut peers = Vec::new();
    if args.compare && stoker_pipeline::source::object::is_url(data) {
        peers = compare_s3(args, data, threads, cold.unwrap_or(warm));
    } else if args.compare {
        peers = compare(args, data, threads, warm);
    }
    if let Some(dir) = &args.local_copy {
        peers.push(compare_local(args, opts, data, dir, threads, warm));
    }
    peers
}

/// stoker's cold figure (an `s3://` dataset: fetched from the server): end to end with one
/// client, else the in-process pipeline; `None` without `--cold`.
fn ours_cold(end_to_end: &[ServedResult], stages: &[StageResult]) -> Option<(&'static str, f64)> {
    end_to_end
        .iter()
        .find(|e| e.clients == 1 && e.cache == CacheState::Cold)
        .map(|e| ("end to end (1 client), cold", e.images_per_s))
        .or_else(|| {
            stages
                .iter()
                .find(|s| s.stage == Stage::Pipeline && s.cache == CacheState::Cold)
                .map(|s| ("pipeline in process, cold", s.images_per_s))
        })
}

/// Timed epochs: at least `epochs`, and enough to last `min_seconds` at `rate` images/s.
fn timed_epochs(epochs: u64, min_seconds: f64, rate: f64, samples: usize) -> u64 {
    let per_epoch = samples.max(1) as f64 / rate.max(1e-9);
    let needed = (min_seconds / per_epoch).ceil();
    // A dataset that decodes absurdly fast must not ask for millions of epochs.
    // At most 10,000 and not negative (`as` saturates at 0).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let needed = needed.min(10_000.0) as u64;
    epochs.max(1).max(needed)
}

mod cuda;
mod decode_streams;
mod peers;
mod recipe;
mod report;
mod served;
mod spec_args;
mod split;
mod views;
mod workers;

use peers::*;
use report::*;
use served::*;
pub(crate) use spec_args::SpecArgs;

#[cfg(test)]
mod tests;
