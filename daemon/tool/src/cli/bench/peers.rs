//! `stoker bench --compare`: the CPU peers (DALI, the PyTorch DataLoader) run on the same
//! files, s3torchconnector on the same `s3://` objects, stoker on a local copy
//! (`--local-copy`), and where the peers' scripts are found at run time.
//!
//! # Design
//! - The peer scripts ship with the project: in the Python package (`stoker/peers/`, which
//!   the wheel installs; its `stoker` command points `$STOKER_PEERS` there and
//!   `$STOKER_PEER_PYTHON` at its own Python) and in a checkout (`python/stoker/peers/`).
//!   They are found at run time by `--peers`, `$STOKER_PEERS`, beside the executable (the
//!   wheel's `stoker/bin/../peers`), or beside the working directory or the dataset; never by
//!   a path of the source tree compiled in.
//!
//! # Limitations
//! - Peers need their own Python (`--peer-python`).
//! - s3torchconnector gets its endpoint and region from `AWS_ENDPOINT_URL` / `AWS_REGION`, as
//!   `stoker bench` does without a config file, and always path-style addressing.

#![forbid(unsafe_code)]

use super::*;

pub(super) const PEERS_ENV: &str = "STOKER_PEERS";
/// The peers' Python when `--peer-python` is not given.
pub(super) const PEER_PYTHON_ENV: &str = "STOKER_PEER_PYTHON";

/// Where the peer scripts are, found at run time: `--peers`, else `$STOKER_PEERS`, else
/// `../shared/peers` beside the working directory or beside the dataset (its parent's
/// `../peers`, `../shared/peers` or `peers`). Never a path of the source tree: the shipped
/// binary runs where the source is not.
pub(super) fn peers_dir(args: &BenchArgs, data: &Path) -> Option<PathBuf> {
    if let Some(p) = &args.peers {
        return Some(p.clone());
    }
    if let Some(p) = std::env::var_os(PEERS_ENV).filter(|p| !p.is_empty()) {
        return Some(PathBuf::from(p));
    }
    let mut candidates = Vec::new();
    if let Some(bin) = std::env::current_exe()
        .ok()
        .and_then(|e| e.parent().map(Path::to_owned))
    {
        candidates.push(bin.join("../peers"));
    }
    if let Ok(cwd) = std::env::current_dir() {
        candidates.push(cwd.join("python/stoker/peers"));
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

/// The peers' Python: `--peer-python`, else `$STOKER_PEER_PYTHON` (the wheel's `stoker`
/// sets its own), else `python3` on `PATH`.
fn peer_python(args: &BenchArgs) -> Option<PathBuf> {
    args.peer_python
        .clone()
        .or_else(|| {
            std::env::var_os(PEER_PYTHON_ENV)
                .filter(|p| !p.is_empty())
                .map(PathBuf::from)
        })
        .or_else(|| {
            let path = std::env::var_os("PATH")?;
            std::env::split_paths(&path)
                .map(|dir| dir.join("python3"))
                .find(|p| p.is_file())
        })
}

/// The peers' Python and folder, or why there are none.
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
pub(super) fn peer_setup(args: &BenchArgs, data: &Path) -> Result<(PathBuf, PathBuf), String> {
    match (peer_python(args), peers_dir(args, data)) {
        (Some(python), Some(dir)) => Ok((python, dir)),
        _ => {
            let why = "no peer Python or peer scripts (pip install the stoker wheel, which ships \
                       them, or give --peer-python and --peers python/stoker/peers)";
            eprintln!("stoker bench: --compare: {why}");
            Err(why.into())
        }
    }
}

/// A peer that could not run, with the reason.
pub(super) fn failed(name: &str, why: String) -> PeerResult {
    PeerResult {
        name: name.into(),
        images_per_s: None,
        ratio: None,
        against: None,
        error: Some(why),
    }
}

/// Runs one peer script and reads its rate; the ratio is `ours` over it.
pub(super) fn run_peer(
    python: &Path,
    script: &Path,
    flags: &[String],
    name: &str,
    ours: (&str, f64),
) -> PeerResult {
    progress(&format!("peer: {name}"));
    let out = Command::new(python)
        .arg(script)
        .args(flags)
        .stdin(Stdio::null())
        .output();
    let script = script.file_name().map_or(script, Path::new).display();
    let (rate, error) = match out {
        Ok(o) => {
            let text = String::from_utf8_lossy(&o.stdout).to_string()
                + &String::from_utf8_lossy(&o.stderr);
            match parse_rate(&text) {
                Some(r) if o.status.success() => (Some(r), None),
                _ => (
                    None,
                    Some(format!(
                        "{script} ({}): {}",
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
        ratio: rate.map(|r| ours.1 / r.max(1e-9)),
        against: Some(ours.0.to_string()),
        error,
    }
}

/// Runs the three CPU peers on the same files with the same threads, batch and epochs.
pub(super) fn compare(
    args: &BenchArgs,
    data: &Path,
    threads: usize,
    ours: (&str, f64),
) -> Vec<PeerResult> {
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
    let (python, dir) = match peer_setup(args, data) {
        Ok(found) => found,
        Err(why) => return runs.iter().map(|r| failed(r.0, why.clone())).collect(),
    };
    runs.iter()
        .map(|(name, script, extra, threads_flag)| {
            let mut flags = vec![data.display().to_string()];
            flags.extend(extra.iter().map(|s| s.to_string()));
            flags.extend([
                threads_flag.to_string(),
                threads.to_string(),
                "--batch".into(),
                args.spec.batch.to_string(),
                "--epochs".into(),
                (args.warmup + args.epochs.max(1)).to_string(),
            ]);
            run_peer(&python, &dir.join(script), &flags, name, ours)
        })
        .collect()
}

/// The peer of an `s3://` dataset: Amazon's s3torchconnector (`S3MapDataset`, one object per
/// sample) with the PyTorch DataLoader and `threads` workers, reading from the same server
/// (`AWS_ENDPOINT_URL`, path-style) every epoch, after one untimed epoch.
pub(super) fn compare_s3(
    args: &BenchArgs,
    data: &Path,
    threads: usize,
    ours: (&str, f64),
) -> Vec<PeerResult> {
    let name = "s3torchconnector + DataLoader (from the server)";
    let (python, dir) = match peer_setup(args, data) {
        Ok(found) => found,
        Err(why) => return vec![failed(name, why)],
    };
    let mut uri = data.display().to_string();
    if !uri.ends_with('/') {
        uri.push('/');
    }
    let mut flags = vec![uri];
    if let Some(e) = std::env::var("AWS_ENDPOINT_URL")
        .ok()
        .filter(|e| !e.is_empty())
    {
        flags.extend(["--endpoint".into(), e]);
    }
    if let Some(r) = ["AWS_REGION", "AWS_DEFAULT_REGION"]
        .iter()
        .find_map(|v| std::env::var(v).ok().filter(|r| !r.is_empty()))
    {
        flags.extend(["--region".into(), r]);
    }
    flags.extend([
        "--workers".into(),
        threads.to_string(),
        "--batch".into(),
        args.spec.batch.to_string(),
        "--warmup".into(),
        "1".into(),
        "--epochs".into(),
        args.epochs.max(1).to_string(),
    ]);
    vec![run_peer(
        &python,
        &dir.join("s3_loader.py"),
        &flags,
        name,
        ours,
    )]
}

/// stoker on `dir`, a local copy of `data`, warm, measured as `ours` was (end to end with
/// one client, or in process) twice, each time right after stoker on `data` again, so slow
/// drifts of a shared machine hit both alike: the ratio (sum over sum) says what reading from
/// the node cache costs next to a local folder.
pub(super) fn compare_local(
    args: &BenchArgs,
    opts: &BenchOptions,
    data: &Path,
    dir: &Path,
    threads: usize,
    ours: (&str, f64),
) -> PeerResult {
    let name = format!("stoker on a local copy ({})", dir.display());
    let dir = match std::fs::canonicalize(dir) {
        Ok(d) => d,
        Err(e) => return failed(&name, format!("{}: {e}", dir.display())),
    };
    let measure = |path: &Path| {
        if args.in_process {
            let o = BenchOptions {
                data: path.to_owned(),
                ..opts.clone()
            };
            run_in_process(&o)
                .map(|r| r.images_per_s)
                .map_err(|e| e.to_string())
        } else {
            run_served(args, path, 1, threads, CacheState::Warm, None).map(|r| r.images_per_s)
        }
    };
    let (mut mine, mut theirs) = (0.0, 0.0);
    for round in 1..=2 {
        progress(&format!(
            "stoker on {} and on the local copy {}, round {round} of 2",
            data.display(),
            dir.display()
        ));
        match (measure(data), measure(&dir)) {
            (Ok(a), Ok(b)) => (mine, theirs) = (mine + a, theirs + b),
            (Err(e), _) | (_, Err(e)) => return failed(&name, e),
        }
    }
    PeerResult {
        name,
        images_per_s: Some(theirs / 2.0),
        ratio: Some(mine / theirs.max(1e-9)),
        against: Some(format!(
            "{}, alternated with the local copy: {:.1} img/s",
            ours.0,
            mine / 2.0
        )),
        error: None,
    }
}

/// The last "= N img/s" figure a peer printed.
pub(super) fn parse_rate(text: &str) -> Option<f64> {
    text.lines()
        .rev()
        .filter_map(|l| {
            let i = l.rfind("= ")?;
            let rest = l[i + 2..].strip_suffix("img/s")?.trim();
            rest.parse().ok()
        })
        .next()
}
