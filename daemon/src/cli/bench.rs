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
//! # Limitations
//! - The cuda backend is not wired into the pipeline yet; `--backend cuda` is refused.
//! - With `--socket`, the daemon's peak memory and CPU time are not known (it may be shared).
//! - Cold rows drop the page cache with posix_fadvise(DONTNEED) per file (pages another process
//!   maps stay cached, and so do dentries and inodes); as root, /proc/sys/vm/drop_caches = 3
//!   drops data and metadata, as after a reboot.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use clap::Args;
use serde::Serialize;
use stoker::spec::{Crop, DType, Layout, PipelineSpec};

use crate::bench::{
    decode_stage, effective_threads, evict, index_timing, load_samples, peak_rss_mb,
    pipeline_stage, run_in_process, storage_only, svg_chart, verdict, AtLeast, BenchOptions,
    BenchReport, CacheState, Eviction, IndexTiming, Stage, StageResult, Verdict,
};
use crate::config::BackendChoice;

use super::bench_client::ClientStats;
use super::{EXIT_FAILURES, EXIT_OK, EXIT_USAGE};

/// The pipeline spec, shared by `bench` and `bench-client`.
#[derive(Debug, Clone, Args)]
pub struct SpecArgs {
    #[arg(long, default_value_t = 64)]
    pub batch: u32,
    /// Output side (RandomResizedCrop, or CenterCrop with --eval).
    #[arg(long, default_value_t = 224)]
    pub size: u32,
    /// Evaluation transform (Resize + CenterCrop) instead of RandomResizedCrop + flip.
    #[arg(long)]
    pub eval: bool,
    #[arg(long, value_enum, default_value = "f32")]
    pub dtype: DTypeArg,
    #[arg(long, value_enum, default_value = "nchw")]
    pub layout: LayoutArg,
}

#[derive(Debug, Clone, Args)]
pub struct BenchArgs {
    /// Dataset: an ImageFolder tree, a flat folder, a file list or tar shards.
    pub data: PathBuf,
    /// Decode backend (only `cpu` is built so far; `auto` means cpu here).
    #[arg(long, value_enum, default_value = "auto")]
    pub backend: BackendChoice,
    /// Decode worker threads (0: one per core).
    #[arg(long, default_value_t = 0)]
    pub threads: usize,
    #[command(flatten)]
    pub spec: SpecArgs,
    /// Timed epochs (after the warm-up epochs), at least; see --min-seconds.
    #[arg(long, default_value_t = 2)]
    pub epochs: u64,
    /// Warm runs last at least this long: the decode stages repeat their samples, and the
    /// timed epochs grow from --epochs until, at the measured decode+augment rate, they take
    /// this long. The pipeline, the clients, the scaling runs and the peers all run that many
    /// epochs. Cold runs are one epoch whatever its length.
    #[arg(long, default_value_t = 5.0)]
    pub min_seconds: f64,
    #[arg(long, default_value_t = 1)]
    pub warmup: u64,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Client process counts for the end-to-end runs (ranks of one job), e.g. 1,2,4.
    #[arg(long, value_delimiter = ',', default_value = "1,2,4")]
    pub clients: Vec<usize>,
    /// Use this running daemon instead of starting one.
    #[arg(long)]
    pub socket: Option<PathBuf>,
    /// The stokerd binary to start (default: next to this `stoker`).
    #[arg(long)]
    pub stokerd: Option<PathBuf>,
    /// Only the in-process stages: no daemon, no clients.
    #[arg(long)]
    pub in_process: bool,
    /// Skip the scaling runs (client counts after the first, decode threads 1..cores).
    #[arg(long)]
    pub no_scaling: bool,
    /// Also measure with a cold page cache (indexing walk, storage, pipeline and end to end).
    /// As root this drops the whole host's page cache, dentries and inodes (drop_caches = 3);
    /// as another user only the dataset's data pages (posix_fadvise).
    #[arg(long)]
    pub cold: bool,
    /// Only indexing and storage (warm, and cold with --cold), no decoding: to compare
    /// layouts or filesystems quickly, or on datasets too large to decode in a benchmark's time.
    #[arg(long)]
    pub storage_only: bool,
    /// At most this many samples are held in memory for the decode stages.
    #[arg(long, default_value_t = 2000)]
    pub decode_sample: usize,
    /// Run the CPU peers (../shared/peers) on the same files and print stoker's ratio to each.
    #[arg(long)]
    pub compare: bool,
    /// The peers' Python (default /tmp/peer/bin/python if it exists).
    #[arg(long)]
    pub peer_python: Option<PathBuf>,
    /// The peers' folder (default: $STOKER_PEERS, else ../shared/peers beside the working
    /// directory or the dataset).
    #[arg(long)]
    pub peers: Option<PathBuf>,
    /// Write the report as JSON to this file (default: stoker-bench-NAME.json here, NAME being
    /// the dataset's folder or file name).
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write an SVG chart (images/s by stage, by client count, by threads, beside the peers) to
    /// this file (default: stoker-bench-NAME.svg here).
    #[arg(long)]
    pub svg: Option<PathBuf>,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum DTypeArg {
    U8,
    F16,
    Bf16,
    F32,
}

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum LayoutArg {
    Nchw,
    Nhwc,
}

impl SpecArgs {
    pub fn spec(&self) -> PipelineSpec {
        let base = if self.eval {
            PipelineSpec::eval(self.batch, self.size)
        } else {
            PipelineSpec::train(self.batch, self.size)
        };
        PipelineSpec {
            crop: if self.eval {
                Crop::center(self.size)
            } else {
                base.crop
            },
            dtype: match self.dtype {
                DTypeArg::U8 => DType::U8,
                DTypeArg::F16 => DType::F16,
                DTypeArg::Bf16 => DType::Bf16,
                DTypeArg::F32 => DType::F32,
            },
            layout: match self.layout {
                LayoutArg::Nchw => Layout::Nchw,
                LayoutArg::Nhwc => Layout::Nhwc,
            },
            ..base
        }
    }

    /// The same flags, to pass on to a `bench-client`.
    fn to_flags(&self) -> Vec<String> {
        let mut v = vec![
            "--batch".into(),
            self.batch.to_string(),
            "--size".into(),
            self.size.to_string(),
            "--dtype".into(),
            format!("{:?}", self.dtype).to_lowercase(),
            "--layout".into(),
            format!("{:?}", self.layout).to_lowercase(),
        ];
        if self.eval {
            v.push("--eval".into());
        }
        v
    }
}

/// One end-to-end run: a daemon serving `clients` client processes.
#[derive(Debug, Clone, Serialize)]
pub struct ServedResult {
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
}

/// A peer's figure from the same run.
#[derive(Debug, Clone, Serialize)]
pub struct PeerResult {
    pub name: String,
    pub images_per_s: Option<f64>,
    /// stoker's images/s (end to end with one client, else in-process) over the peer's.
    pub ratio: Option<f64>,
    pub error: Option<String>,
}

/// Everything `stoker bench` measured.
#[derive(Debug, Clone, Serialize)]
pub struct FullReport {
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
    pub peers: Vec<PeerResult>,
    pub bench_peak_rss_mb: Option<f64>,
}

fn progress(step: &str) {
    eprintln!("stoker bench: {step}");
}

pub fn run(args: &BenchArgs) -> i32 {
    if args.backend == BackendChoice::Cuda {
        eprintln!(
            "stoker bench: the cuda backend is not wired into the pipeline yet; use --backend cpu"
        );
        return EXIT_USAGE;
    }
    let spec = args.spec.spec();
    if let Err(e) = spec.validate() {
        eprintln!("stoker bench: {e}");
        return EXIT_USAGE;
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
            return EXIT_USAGE;
        }
    }
    match bench(args, spec) {
        Ok(report) => {
            println!("{}", table(&report));
            let text = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
            for (path, content) in [(&json_path, text), (&svg_path, chart(&report))] {
                if let Err(e) = std::fs::write(path, content) {
                    eprintln!("stoker bench: cannot write {}: {e}", path.display());
                    return EXIT_FAILURES;
                }
            }
            eprintln!(
                "stoker bench: wrote {} and {}",
                json_path.display(),
                svg_path.display()
            );
            EXIT_OK
        }
        Err(e) => {
            eprintln!("stoker bench: {e}");
            EXIT_FAILURES
        }
    }
}

fn bench(args: &BenchArgs, spec: PipelineSpec) -> Result<FullReport, String> {
    let data =
        std::fs::canonicalize(&args.data).map_err(|e| format!("{}: {e}", args.data.display()))?;
    let threads = effective_threads(args.threads);
    let mut opts = BenchOptions::standard(&data, threads);
    opts.spec = spec.clone();
    opts.epochs = args.epochs.max(1);
    opts.warmup_epochs = args.warmup;
    opts.seed = args.seed;

    progress("indexing (cache off, then on)");
    let (index, ds) = index_timing(&data, args.cold).map_err(|e| e.to_string())?;
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
    let read_with =
        crate::reader::Reader::new(opts.engine.reader, 1).map_or("unavailable", |r| r.kind());
    progress(&format!(
        "loading up to {} samples into memory for the decode stages",
        args.decode_sample
    ));
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
            pipeline: None,
            dataset: data.display().to_string(),
            decode_threads: threads,
            read_with,
            backend: "cpu",
            spec,
            warmup_epochs: args.warmup,
            timed_epochs: args.epochs,
            index,
            stages,
            end_to_end: Vec::new(),
            thread_scaling: Vec::new(),
            eviction,
            verdict: None,
            peers: Vec::new(),
            bench_peak_rss_mb: peak_rss_mb(None),
        });
    }
    let samples = load_samples(&ds, args.decode_sample, args.seed);
    let min_s = args.min_seconds.max(0.0);
    let at_least = AtLeast {
        images: 1000.max(samples.len()),
        seconds: min_s,
    };
    progress("decode only");
    stages.push(
        decode_stage(&samples, &spec, &opts.engine, args.seed, false, at_least)
            .map_err(|e| e.to_string())?,
    );
    progress("decode + augment");
    let both = decode_stage(&samples, &spec, &opts.engine, args.seed, true, at_least)
        .map_err(|e| e.to_string())?;
    drop(samples);
    // From here on every warm run (pipeline, clients, scaling, peers) runs this many epochs.
    opts.epochs = timed_epochs(args.epochs, min_s, both.images_per_s, ds.len());
    stages.push(both);
    let args = &BenchArgs {
        epochs: opts.epochs,
        ..args.clone()
    };
    progress(&format!(
        "pipeline in process ({} warm-up + {} timed epochs)",
        opts.warmup_epochs, opts.epochs
    ));
    let pipeline = run_in_process(&opts).map_err(|e| e.to_string())?;
    stages.push(pipeline_stage(&pipeline, CacheState::Warm));

    let mut eviction = None;
    if args.cold {
        progress("storage only (cold page cache)");
        eviction = Some(evict(&ds));
        stages.push(
            storage_only(&ds, &opts.engine, args.seed, CacheState::Cold)
                .map_err(|e| e.to_string())?,
        );
        progress("pipeline in process (cold page cache, one epoch)");
        evict(&ds);
        let cold = BenchOptions {
            warmup_epochs: 0,
            epochs: 1,
            ..opts.clone()
        };
        let r = run_in_process(&cold).map_err(|e| e.to_string())?;
        stages.push(pipeline_stage(&r, CacheState::Cold));
    }

    let mut end_to_end = Vec::new();
    if !args.in_process {
        let counts: Vec<usize> = if args.no_scaling {
            args.clients.iter().copied().take(1).collect()
        } else {
            args.clients.clone()
        };
        for &n in counts.iter().filter(|&&n| n > 0) {
            progress(&format!("end to end: stokerd + {n} client process(es)"));
            match run_served(args, &data, n, threads, CacheState::Warm, None) {
                Ok(r) => end_to_end.push(r),
                Err(e) => {
                    eprintln!("stoker bench: end to end with {n} clients skipped: {e}");
                    break;
                }
            }
        }
        if args.cold && !end_to_end.is_empty() {
            progress("end to end, cold page cache: stokerd + 1 client, one epoch");
            match run_served(args, &data, 1, threads, CacheState::Cold, Some(&ds)) {
                Ok(r) => end_to_end.push(r),
                Err(e) => eprintln!("stoker bench: cold end to end skipped: {e}"),
            }
        }
    }

    let mut thread_scaling = Vec::new();
    if !args.no_scaling {
        let cores = effective_threads(0);
        for t in 1..=cores.max(threads) {
            progress(&format!(
                "scaling: pipeline in process with {t} decode thread(s)"
            ));
            let o = BenchOptions {
                engine: crate::pipeline::EngineConfig {
                    threads: t,
                    ..opts.engine.clone()
                },
                ..opts.clone()
            };
            let r = run_in_process(&o).map_err(|e| e.to_string())?;
            thread_scaling.push(pipeline_stage(&r, CacheState::Warm));
        }
    }

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
    let verdict = verdict(
        rate(Stage::Storage),
        rate(Stage::Decode),
        rate(Stage::DecodeAugment),
        Some(pipeline.images_per_s),
        best_e2e,
    );

    let mut peers = Vec::new();
    if args.compare {
        let (_, rate) = ours(&end_to_end, Some(&pipeline)).expect("the pipeline ran");
        peers = compare(args, &data, threads, rate);
    }

    Ok(FullReport {
        pipeline: Some(pipeline),
        dataset: data.display().to_string(),
        decode_threads: threads,
        read_with,
        backend: "cpu",
        spec,
        warmup_epochs: args.warmup,
        timed_epochs: args.epochs,
        index,
        stages,
        end_to_end,
        thread_scaling,
        eviction,
        verdict: Some(verdict),
        peers,
        bench_peak_rss_mb: peak_rss_mb(None),
    })
}

/// Where the report goes: --json and --svg, else `stoker-bench-NAME.json` and `.svg` in the
/// working folder, NAME being the dataset's file name.
fn output_paths(args: &BenchArgs) -> (PathBuf, PathBuf) {
    let name = args
        .data
        .canonicalize()
        .ok()
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
        .map(|e| ("end to end (1 client)", e.images_per_s))
        .or_else(|| pipeline.map(|p| ("pipeline in process", p.images_per_s)))
}

/// Timed epochs: at least `epochs`, and enough to last `min_seconds` at `rate` images/s.
fn timed_epochs(epochs: u64, min_seconds: f64, rate: f64, samples: usize) -> u64 {
    let per_epoch = samples.max(1) as f64 / rate.max(1e-9);
    let needed = (min_seconds / per_epoch).ceil();
    // A dataset that decodes absurdly fast must not ask for millions of epochs.
    epochs.max(1).max(needed.min(10_000.0) as u64)
}

fn stokerd_path(args: &BenchArgs) -> Result<PathBuf, String> {
    if let Some(p) = &args.stokerd {
        return Ok(p.clone());
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let p = exe.with_file_name("stokerd");
    if p.exists() {
        Ok(p)
    } else {
        Err(format!("no stokerd at {} (give --stokerd)", p.display()))
    }
}

/// Kills and reaps the daemon this bench started, on every path out.
struct ChildGuard(std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts (or uses) a daemon, runs `clients` client processes as the ranks of one job, and
/// gathers their figures. `cold`: evict `ds` from the page cache first and time one epoch.
fn run_served(
    args: &BenchArgs,
    data: &Path,
    clients: usize,
    threads: usize,
    cache: CacheState,
    cold: Option<&crate::dataset::Dataset>,
) -> Result<ServedResult, String> {
    let dir = std::env::temp_dir().join(format!(
        "stoker-bench-{}-{clients}-{cache}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _cleanup = RemoveDir(dir.clone());
    let (socket, daemon) = match &args.socket {
        Some(s) => (s.clone(), None),
        None => {
            let socket = dir.join("stoker.sock");
            let child = Command::new(stokerd_path(args)?)
                .arg("--socket")
                .arg(&socket)
                .arg("--threads")
                .arg(threads.to_string())
                .env("RUST_LOG", "warn")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .spawn()
                .map_err(|e| format!("cannot start stokerd: {e}"))?;
            let mut guard = ChildGuard(child);
            let deadline = Instant::now() + Duration::from_secs(30);
            while stoker::sock::SeqPacket::connect(&socket).is_err() {
                if let Ok(Some(status)) = guard.0.try_wait() {
                    return Err(format!("stokerd exited before serving: {status}"));
                }
                if Instant::now() > deadline {
                    return Err("stokerd did not listen within 30s".into());
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            (socket, Some(guard))
        }
    };
    if let Some(ds) = cold {
        evict(ds);
    }
    let pid = daemon.as_ref().map(|d| d.0.id());
    let cpu0 = pid.and_then(crate::bench::cpu_seconds_of);
    let (warmup, epochs) = if cold.is_some() {
        (0, 1)
    } else {
        (args.warmup, args.epochs.max(1))
    };
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let job = format!("bench-{}-{clients}-{cache}", std::process::id());
    let children: Vec<std::process::Child> = (0..clients)
        .map(|rank| {
            Command::new(&exe)
                .arg("bench-client")
                .arg("--socket")
                .arg(&socket)
                .arg("--data")
                .arg(data)
                .args(["--job", &job])
                .args(["--rank", &rank.to_string()])
                .args(["--world", &clients.to_string()])
                .args(["--seed", &args.seed.to_string()])
                .args(["--warmup", &warmup.to_string()])
                .args(["--epochs", &epochs.to_string()])
                .args(args.spec.to_flags())
                .stdin(Stdio::null())
                .stdout(Stdio::piped())
                .spawn()
                .map_err(|e| format!("cannot start bench-client: {e}"))
        })
        .collect::<Result<_, _>>()?;
    let mut stats: Vec<ClientStats> = Vec::new();
    let mut failure = None;
    for c in children {
        let out = c
            .wait_with_output()
            .map_err(|e| format!("bench-client: {e}"))?;
        let text = String::from_utf8_lossy(&out.stdout);
        match text.lines().last().map(serde_json::from_str::<ClientStats>) {
            Some(Ok(s)) if out.status.success() => stats.push(s),
            _ => failure = Some(format!("a bench-client failed ({})", out.status)),
        }
    }
    if let Some(f) = failure {
        return Err(f);
    }
    let daemon_cpu = match (pid.and_then(crate::bench::cpu_seconds_of), cpu0) {
        (Some(b), Some(a)) => Some(b - a),
        _ => None,
    };
    let daemon_rss = pid.and_then(|p| peak_rss_mb(Some(p)));
    drop(daemon);

    let images: u64 = stats.iter().map(|s| s.images).sum();
    let images_all: u64 = stats.iter().map(|s| s.images_all).sum();
    let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
    let seconds = stats.iter().map(|s| s.seconds).fold(0.0, f64::max);
    let mut waits: Vec<f64> = stats.iter().flat_map(|s| s.waits_ms.clone()).collect();
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| {
        if waits.is_empty() {
            0.0
        } else {
            waits[((waits.len() - 1) as f64 * p).round() as usize]
        }
    };
    let clients_cpu: f64 = stats.iter().map(|s| s.cpu_s).sum();
    Ok(ServedResult {
        clients,
        cache,
        images,
        seconds,
        images_per_s: images as f64 / seconds.max(1e-9),
        mb_per_s: bytes as f64 / 1e6 / seconds.max(1e-9),
        wait_p50_ms: pct(0.5),
        wait_p99_ms: pct(0.99),
        cpu_s_per_1000: daemon_cpu.map(|d| (d + clients_cpu) / images_all.max(1) as f64 * 1000.0),
        daemon_peak_rss_mb: daemon_rss,
        client_peak_rss_mb: stats.iter().map(|s| s.peak_rss_mb).fold(0.0, f64::max),
    })
}

struct RemoveDir(PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Environment variable naming the peers' folder (below `--peers`, above the search).
pub const PEERS_ENV: &str = "STOKER_PEERS";

/// Where the peer scripts are, found at run time: `--peers`, else `$STOKER_PEERS`, else
/// `../shared/peers` beside the working directory or beside the dataset (its parent's
/// `../peers`, `../shared/peers` or `peers`). Never a path of the source tree: the shipped
/// binary runs where the source is not.
fn peers_dir(args: &BenchArgs, data: &Path) -> Option<PathBuf> {
    if let Some(p) = &args.peers {
        return Some(p.clone());
    }
    if let Some(p) = std::env::var_os(PEERS_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join("../shared/peers"));
    }
    if let Some(parent) = data.parent() {
        candidates.push(parent.join("../peers"));
        candidates.push(parent.join("../shared/peers"));
        candidates.push(parent.join("peers"));
    }
    candidates
        .into_iter()
        .find(|p| p.join("torch_loader.py").exists())
}

/// Runs the three CPU peers on the same files with the same threads, batch and epochs.
fn compare(args: &BenchArgs, data: &Path, threads: usize, ours: f64) -> Vec<PeerResult> {
    let python = args.peer_python.clone().or_else(|| {
        let p = PathBuf::from("/tmp/peer/bin/python");
        p.exists().then_some(p)
    });
    let runs: [(&str, &str, &[&str], &str); 3] = [
        (
            "PyTorch DataLoader + Pillow",
            "torch_loader.py",
            &["--decoder", "pil"],
            "--workers",
        ),
        (
            "PyTorch DataLoader + torchvision.io",
            "torch_loader.py",
            &["--decoder", "tv"],
            "--workers",
        ),
        ("DALI CPU-only", "dali_cpu.py", &[], "--threads"),
    ];
    let (Some(python), Some(dir)) = (python, peers_dir(args, data)) else {
        let why = "no peer Python or peers folder (give --peer-python and --peers)".to_string();
        eprintln!("stoker bench: --compare: {why}");
        return runs
            .iter()
            .map(|r| PeerResult {
                name: r.0.into(),
                images_per_s: None,
                ratio: None,
                error: Some(why.clone()),
            })
            .collect();
    };
    runs.iter()
        .map(|(name, script, extra, threads_flag)| {
            progress(&format!("peer: {name}"));
            let out = Command::new(&python)
                .arg(dir.join(script))
                .arg(data)
                .args(*extra)
                .args([*threads_flag, &threads.to_string()])
                .args(["--batch", &args.spec.batch.to_string()])
                .args(["--epochs", &(args.warmup + args.epochs.max(1)).to_string()])
                .stdin(Stdio::null())
                .output();
            let (rate, error) = match out {
                Ok(o) => {
                    let text = String::from_utf8_lossy(&o.stdout).to_string()
                        + &String::from_utf8_lossy(&o.stderr);
                    match parse_rate(&text) {
                        Some(r) if o.status.success() => (Some(r), None),
                        _ => (
                            None,
                            Some(format!(
                                "{} ({}): {}",
                                script,
                                o.status,
                                text.lines().last().unwrap_or("")
                            )),
                        ),
                    }
                }
                Err(e) => (None, Some(format!("{}: {e}", python.display()))),
            };
            if let Some(e) = &error {
                eprintln!("stoker bench: peer {name} failed: {e}");
            }
            PeerResult {
                name: name.to_string(),
                images_per_s: rate,
                ratio: rate.map(|r| ours / r.max(1e-9)),
                error,
            }
        })
        .collect()
}

/// The last "= N img/s" figure a peer printed.
fn parse_rate(text: &str) -> Option<f64> {
    text.lines()
        .rev()
        .filter_map(|l| {
            let i = l.rfind("= ")?;
            let rest = l[i + 2..].strip_suffix("img/s")?.trim();
            rest.parse().ok()
        })
        .next()
}

fn table(r: &FullReport) -> String {
    let mut s = format!(
        "stoker bench {}: {} samples ({}, {} files), backend {}, reader {}, batch {}, {} {} {}, \
         {} threads\n",
        r.dataset,
        r.index.samples,
        r.index.kind,
        r.index.files,
        r.backend,
        r.read_with,
        r.spec.batch_size,
        match r.spec.crop {
            Crop::RandomResized { .. } => "RandomResizedCrop+flip",
            _ => "Resize+CenterCrop",
        },
        r.spec.crop.output_size().1,
        format!("{:?} {:?}", r.spec.dtype, r.spec.layout).to_lowercase(),
        r.decode_threads,
    );
    if r.pipeline.is_some() {
        s += &format!(
            "timing: {} warm-up + {} timed epochs per warm run, one epoch per cold run\n",
            r.warmup_epochs, r.timed_epochs
        );
    }
    s += &format!(
        "indexing: walk {:.3}s{}, from the index cache {:.3}s{}\n\n",
        r.index.walk_s,
        r.index
            .walk_cold_s
            .map_or(String::new(), |c| format!(" (cold caches {c:.3}s)")),
        r.index.cached_s,
        if r.index.cache_hit {
            ""
        } else {
            " (cache miss)"
        }
    );
    s += &format!(
        "{:<28} {:>6} {:>7} {:>10} {:>9} {:>12}\n",
        "stage", "cache", "threads", "images/s", "MB/s", "CPU s/1000"
    );
    for st in &r.stages {
        s += &format!(
            "{:<28} {:>6} {:>7} {:>10.1} {:>9.1} {:>12.2}\n",
            st.stage, st.cache, st.threads, st.images_per_s, st.mb_per_s, st.cpu_s_per_1000
        );
    }
    for e in &r.end_to_end {
        s += &format!(
            "{:<28} {:>6} {:>7} {:>10.1} {:>9.1} {:>12}   wait p50 {:.2} ms, p99 {:.2} ms\n",
            format!(
                "end to end ({} client{})",
                e.clients,
                if e.clients == 1 { "" } else { "s" }
            ),
            e.cache,
            r.decode_threads,
            e.images_per_s,
            e.mb_per_s,
            e.cpu_s_per_1000.map_or("-".into(), |c| format!("{c:.2}")),
            e.wait_p50_ms,
            e.wait_p99_ms
        );
    }
    if let Some(v) = &r.verdict {
        s += &format!("\nverdict: {}\n", v.line);
    }
    if let Some(e) = r.end_to_end.first() {
        s += &format!(
            "peak RSS: daemon {}, client {:.1} MB, bench process {:.1} MB\n",
            e.daemon_peak_rss_mb
                .map_or("unknown".into(), |m| format!("{m:.1} MB")),
            e.client_peak_rss_mb,
            r.bench_peak_rss_mb.unwrap_or(0.0)
        );
    }
    let warm: Vec<&ServedResult> = r
        .end_to_end
        .iter()
        .filter(|e| e.cache == CacheState::Warm)
        .collect();
    if warm.len() > 1 {
        s += "scaling by clients: ";
        s += &warm
            .iter()
            .map(|e| format!("{} -> {:.1} img/s", e.clients, e.images_per_s))
            .collect::<Vec<_>>()
            .join(", ");
        s += "\n";
    }
    if !r.thread_scaling.is_empty() {
        s += "scaling by decode threads (in process): ";
        s += &r
            .thread_scaling
            .iter()
            .map(|t| format!("{} -> {:.1} img/s", t.threads, t.images_per_s))
            .collect::<Vec<_>>()
            .join(", ");
        s += "\n";
    }
    if !r.peers.is_empty() {
        s += "\npeers (same files, threads, batch and epochs, this run):\n";
        for peer in &r.peers {
            match (peer.images_per_s, peer.ratio) {
                (Some(v), Some(ratio)) => {
                    s += &format!(
                        "  {:<38} {:>8.1} img/s   stoker {:.2}x\n",
                        peer.name, v, ratio
                    )
                }
                _ => {
                    s += &format!(
                        "  {:<38} failed: {}\n",
                        peer.name,
                        peer.error.as_deref().unwrap_or("?")
                    )
                }
            }
        }
    }
    s
}

fn chart(r: &FullReport) -> String {
    let mut groups = vec![(
        "images/s by stage".to_string(),
        r.stages
            .iter()
            .map(|s| (format!("{} ({})", s.stage, s.cache), s.images_per_s))
            .chain(
                r.end_to_end
                    .iter()
                    .filter(|e| e.clients == 1)
                    .map(|e| (format!("end to end ({})", e.cache), e.images_per_s)),
            )
            .collect(),
    )];
    let warm: Vec<(String, f64)> = r
        .end_to_end
        .iter()
        .filter(|e| e.cache == CacheState::Warm)
        .map(|e| (format!("{} client(s)", e.clients), e.images_per_s))
        .collect();
    if !warm.is_empty() {
        groups.push(("end to end by client count".into(), warm));
    }
    if !r.thread_scaling.is_empty() {
        groups.push((
            "in-process pipeline by decode threads".into(),
            r.thread_scaling
                .iter()
                .map(|t| (format!("{} thread(s)", t.threads), t.images_per_s))
                .collect(),
        ));
    }
    let mut peers: Vec<(String, f64)> = r
        .peers
        .iter()
        .filter_map(|p| p.images_per_s.map(|v| (p.name.clone(), v)))
        .collect();
    if !peers.is_empty() {
        if let Some((name, v)) = ours(&r.end_to_end, r.pipeline.as_ref()) {
            peers.insert(0, (format!("stoker, {name}"), v));
        }
        groups.push(("stoker and the peers, same run".into(), peers));
    }
    svg_chart(
        &format!("stoker bench {}", r.dataset),
        r.verdict
            .as_ref()
            .map_or("storage only", |v| v.line.as_str()),
        &groups,
    )
}

#[cfg(test)]
mod tests {
    use super::{parse_rate, timed_epochs};

    #[test]
    fn timed_epochs_last_the_minimum_and_never_fewer_than_asked() {
        // 500 samples at 1000 img/s: 0.5 s an epoch, so 5 s needs 10.
        assert_eq!(timed_epochs(2, 5.0, 1000.0, 500), 10);
        // A long epoch keeps the asked count.
        assert_eq!(timed_epochs(2, 5.0, 1000.0, 100_000), 2);
        assert_eq!(timed_epochs(0, 0.0, 1000.0, 10), 1);
        // A zero rate (every sample bad) or an empty dataset stays bounded.
        assert_eq!(timed_epochs(1, 5.0, 0.0, 10), 1);
        assert_eq!(timed_epochs(1, 5.0, 1e12, 1), 10_000);
    }

    #[test]
    fn parses_the_peers_rate_line() {
        let text = "warming up\nDALI cpu threads=2 batch=64: 1000 images in 1.00s = 912.5 img/s\n";
        assert_eq!(parse_rate(text), Some(912.5));
        assert_eq!(parse_rate("nothing here"), None);
    }
}
