//! `stoker bench --compare`: the CPU peers (DALI, the PyTorch DataLoader) run on the same
//! files, and where their scripts are found at run time.
//!
//! # Design
//! - Peers are found by `--peers`, `$STOKER_PEERS`, or beside the working directory or the
//!   dataset; never a path of the source tree.
//!
//! # Limitations
//! - Peers need their own Python (`--peer-python`).

use super::*;

pub const PEERS_ENV: &str = "STOKER_PEERS";

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
pub(super) fn compare(args: &BenchArgs, data: &Path, threads: usize, ours: f64) -> Vec<PeerResult> {
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
