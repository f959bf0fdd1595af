//! `stoker bench`'s end-to-end runs: a real `stokerd` and real `stoker bench-client`
//! processes, timed together.
//!
//! # Design
//! - Children are killed on drop (`ChildGuard`); temp folders removed (`RemoveDir`).
//!
//! # Limitations
//! - One job per run; client counts come from `--clients`.

#![forbid(unsafe_code)]

use super::*;

pub(super) struct ChildGuard(pub(super) std::process::Child);

impl Drop for ChildGuard {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Starts (or uses) a daemon, runs `clients` client processes as the ranks of one job, and
/// gathers their figures. `cold`: evict `ds` from the page cache first and time one epoch.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
pub(super) fn run_served(
    args: &BenchArgs,
    data: &Path,
    clients: usize,
    threads: usize,
    cache: CacheState,
    cold: Option<&stoker_pipeline::source::index::Dataset>,
) -> Result<ServedResult, String> {
    let dir = std::env::temp_dir().join(format!(
        "stoker-bench-{}-{clients}-{cache}",
        std::process::id()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _cleanup = RemoveDir(dir.clone());
    let (socket, daemon) = match &args.socket {
        Some(s) => (s.clone(), None),
        None => start_stokerd(args, &dir, threads, &args.daemon_config)?,
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
    let stats = run_clients(args, &socket, data, clients, cache, (warmup, epochs))?;
    let daemon_cpu = match (pid.and_then(crate::bench::cpu_seconds_of), cpu0) {
        (Some(b), Some(a)) => Some(b - a),
        _ => None,
    };
    let daemon_rss = pid.and_then(|p| peak_rss_mb(Some(p)));
    let gpus = crate::cli::status::query(&socket).map_or_else(|_| Vec::new(), |s| s.gpus);
    drop(daemon);

    let images: u64 = stats.iter().map(|s| s.images).sum();
    let images_all: u64 = stats.iter().map(|s| s.images_all).sum();
    let bytes: u64 = stats.iter().map(|s| s.bytes).sum();
    let seconds = stats.iter().map(|s| s.seconds).fold(0.0, f64::max);
    let mut waits: Vec<f64> = stats.iter().flat_map(|s| s.waits_ms.clone()).collect();
    waits.sort_by(f64::total_cmp);
    let pct = |p: f64| percentile(&waits, p);
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
        gpus,
    })
}

/// Runs `clients` bench-client processes as the ranks of one job against `socket` and
/// gathers each one's figures; `(warmup, epochs)` each client runs.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
pub(super) fn run_clients(
    args: &BenchArgs,
    socket: &Path,
    data: &Path,
    clients: usize,
    cache: CacheState,
    (warmup, epochs): (u64, u64),
) -> Result<Vec<ClientStats>, String> {
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let job = format!("bench-{}-{clients}-{cache}", std::process::id());
    let spec_flags = match &args.spec_override {
        Some(spec) => vec![
            "--spec-json".to_string(),
            serde_json::to_string(spec).map_err(|e| format!("the spec as JSON: {e}"))?,
        ],
        None => args.spec.to_flags(),
    };
    let children: Vec<std::process::Child> = (0..clients)
        .map(|rank| {
            Command::new(&exe)
                .arg("bench-client")
                .arg("--socket")
                .arg(socket)
                .arg("--data")
                .arg(data)
                .args(["--job", &job])
                .args(["--rank", &rank.to_string()])
                .args(["--world", &clients.to_string()])
                .args(["--seed", &args.seed.to_string()])
                .args(["--warmup", &warmup.to_string()])
                .args(["--epochs", &epochs.to_string()])
                .args(["--device", &client_device(args)])
                .args(&spec_flags)
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
    match failure {
        Some(f) => Err(f),
        None => Ok(stats),
    }
}

/// The `p` quantile (0..=1) of sorted `values`, 0 when there are none.
// `p` is in 0..=1, so the index is in 0..len.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn percentile(values: &[f64], p: f64) -> f64 {
    if values.is_empty() {
        0.0
    } else {
        values[((values.len() - 1) as f64 * p).round() as usize]
    }
}

/// Starts `stokerd` on a socket in `dir`, its config file the bench's `[cuda]` switches
/// followed by `config` (more sections, TOML; stokerd takes one `--config`), and waits until
/// it listens.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
pub(super) fn start_stokerd(
    args: &BenchArgs,
    dir: &Path,
    threads: usize,
    config: &str,
) -> Result<(PathBuf, Option<ChildGuard>), String> {
    let socket = dir.join("stoker.sock");
    let log_path = dir.join("stokerd.log");
    let config_path = dir.join("stoker.toml");
    let text = format!(
        "[cuda]\nblocking_sync = {}\npinned_inputs = {}\n{config}",
        args.blocking_sync, args.pinned_inputs
    );
    std::fs::write(&config_path, text).map_err(|e| format!("{}: {e}", config_path.display()))?;
    let log =
        std::fs::File::create(&log_path).map_err(|e| format!("{}: {e}", log_path.display()))?;
    let child = Command::new(stokerd_path(args)?)
        .arg("--config")
        .arg(&config_path)
        .arg("--socket")
        .arg(&socket)
        .arg("--threads")
        .arg(threads.to_string())
        .args(["--backend", daemon_backend(args)])
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(log)
        .spawn()
        .map_err(|e| format!("cannot start stokerd: {e}"))?;
    let mut guard = ChildGuard(child);
    let deadline = Instant::now() + Duration::from_secs(30);
    // Another process's readiness: nothing to be woken by, so look every 20 ms.
    while stoker_wire::socket::SeqPacket::connect(&socket).is_err() {
        if let Ok(Some(status)) = guard.0.try_wait() {
            let text = std::fs::read_to_string(&log_path).unwrap_or_default();
            let why = text
                .lines()
                .rev()
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            return Err(format!("stokerd exited before serving ({status}): {why}"));
        }
        if Instant::now() > deadline {
            return Err("stokerd did not listen within 30s".into());
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    Ok((socket, Some(guard)))
}

/// What `stokerd --backend` the run asks for: the bench's own backend (auto as auto).
fn daemon_backend(args: &BenchArgs) -> &'static str {
    match args.backend {
        BackendChoice::Auto => "auto",
        BackendChoice::Cpu => "cpu",
        BackendChoice::Cuda => "cuda",
    }
}

/// The device the client processes attach with: the bench's GPU with the cuda backend, else
/// host memory.
fn client_device(args: &BenchArgs) -> String {
    match args.backend {
        BackendChoice::Cuda => args.device.to_string(),
        _ => stoker_wire::Device::Cpu.to_string(),
    }
}

pub(super) struct RemoveDir(pub(super) PathBuf);

impl Drop for RemoveDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The `stokerd` to start: `--stokerd`, else the one beside this executable.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
pub(super) fn stokerd_path(args: &BenchArgs) -> Result<PathBuf, String> {
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
