//! `stoker bench DATA --workers ADDR,...`: what remote CPU workers add, end to end to a
//! client process, measured against the home daemon alone in the same run.
//!
//! # Design
//! - Rounds alternate: a fresh home `stokerd` alone, then a fresh one with `[remote] workers`
//!   (`--worker-connections` each), each serving one `stoker bench-client` that reads every
//!   byte; the medians of the rounds are compared. The home daemon and the client inherit
//!   this process's CPU affinity, so `taskset -c 0 stoker bench ...` pins them together
//!   (the workers are pinned by whoever started them).
//! - The wire and its CPU cost come from the daemons' own `/metrics`: the home's bytes each
//!   way, images filled remotely and the CPU its connections spent receiving
//!   (`stoker_remote_*`), and, with `--worker-metrics`, each worker's CPU seconds working and
//!   sending and its bytes sent (`stoker_worker_*`), read before and after each round.
//!
//! # Limitations
//! - The workers must be running already (another host, or `stokerd --worker` here): the
//!   bench starts only home daemons. Without `--worker-metrics` the workers' CPU is unknown.
//! - Bytes are the TCP payload (frames and pixels), without TCP/IP headers.

#![forbid(unsafe_code)]

use std::path::Path;

use clap::Args;
use serde::Serialize;
use stoker_wire::spec::PipelineSpec;

use super::*;

/// The workers row's options (with `--workers`, only this comparison runs).
#[derive(Debug, Clone, Args)]
pub(crate) struct WorkersArgs {
    /// Remote workers (`host:port` of running `stokerd --worker`s): measure images/s end to
    /// end with the home daemon alone and with these workers, alternating rounds; only this
    /// comparison runs.
    #[arg(long, value_delimiter = ',')]
    pub workers: Vec<String>,
    /// The secret file the workers hold (the home daemon's `remote.secret_file`).
    #[arg(long)]
    pub worker_secret: Option<PathBuf>,
    /// The workers' metrics addresses (`host:port`), for their CPU seconds per GB.
    #[arg(long, value_delimiter = ',')]
    pub worker_metrics: Vec<String>,
    /// Connections (units in flight) from the home daemon to each worker; unset, the home
    /// daemon's default (`remote.connections`).
    #[arg(long)]
    pub worker_connections: Option<usize>,
    /// Rounds of each (alone, with the workers), alternating; with `--recipe`, rounds of
    /// stoker and its peers.
    #[arg(long, default_value_t = 3)]
    pub rounds: usize,
}

/// One round of one setup.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct WorkersRound {
    pub with_workers: bool,
    pub images_per_s: f64,
    /// Home daemon + client CPU seconds per 1000 images (warm-up included on both sides).
    pub home_cpu_s_per_1000: f64,
    /// Images the workers filled, and the share of every image.
    pub remote_images: f64,
    pub remote_share: f64,
    /// TCP payload bytes the home daemon sent and received, and the CPU its connections
    /// spent receiving.
    pub bytes_sent: f64,
    pub bytes_received: f64,
    pub receive_cpu_s: f64,
    /// The workers' CPU seconds working and sending, and bytes sent, in this round.
    pub worker_work_cpu_s: Option<f64>,
    pub worker_send_cpu_s: Option<f64>,
    pub worker_bytes_sent: Option<f64>,
}

/// The comparison: every round and the medians.
#[derive(Debug, Clone, Serialize)]
pub(super) struct WorkersReport {
    pub dataset: String,
    pub spec: PipelineSpec,
    pub decode_threads: usize,
    pub workers: Vec<String>,
    /// `None`: the home daemon's default.
    pub worker_connections: Option<usize>,
    pub rounds: Vec<WorkersRound>,
    pub alone_images_per_s: f64,
    pub with_workers_images_per_s: f64,
    /// With the workers over alone (medians).
    pub ratio: f64,
    pub remote_share: f64,
    /// Bytes on the wire (both ways) per image the workers filled.
    pub wire_bytes_per_image: f64,
    /// The home daemon's CPU seconds receiving, per GB received.
    pub home_receive_cpu_s_per_gb: f64,
    /// The workers' CPU seconds (working and sending; sending alone) per GB sent.
    pub worker_cpu_s_per_gb: Option<f64>,
    pub worker_send_cpu_s_per_gb: Option<f64>,
    /// The host's load averages (1, 5, 15 min) at the end.
    pub load: Option<[f64; 3]>,
}

pub(super) fn run(args: &BenchArgs, spec: &PipelineSpec, json_path: &Path) -> Exit {
    let report = match measure(args, spec) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stoker bench: {e}");
            return Exit::Failure;
        }
    };
    println!("{}", table(&report));
    let text = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
    if let Err(e) = std::fs::write(json_path, text) {
        eprintln!("stoker bench: cannot write {}: {e}", json_path.display());
        return Exit::Failure;
    }
    eprintln!("stoker bench: wrote {}", json_path.display());
    Exit::Ok
}

// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn measure(args: &BenchArgs, spec: &PipelineSpec) -> Result<WorkersReport, String> {
    let w = &args.remote;
    let secret = w
        .worker_secret
        .as_ref()
        .ok_or("--workers needs --worker-secret (the secret file the workers hold)")?;
    if !w.worker_metrics.is_empty() && w.worker_metrics.len() != w.workers.len() {
        return Err("--worker-metrics names one address per worker, in the same order".into());
    }
    let data =
        std::fs::canonicalize(&args.data).map_err(|e| format!("{}: {e}", args.data.display()))?;
    let threads = effective_threads(args.threads);
    let mut rounds = Vec::new();
    for r in 0..w.rounds.max(1) {
        for with_workers in [false, true] {
            progress(&format!(
                "round {}/{}: home daemon {}",
                r + 1,
                w.rounds.max(1),
                if with_workers {
                    "with workers"
                } else {
                    "alone"
                }
            ));
            let remote = with_workers.then_some(secret.as_path());
            rounds.push(one_round(args, &data, threads, remote)?);
        }
    }
    Ok(summary(args, spec, &data, threads, rounds))
}

/// One home daemon (with the workers when `secret` is given) serving one client.
// String error: as `measure`.
fn one_round(
    args: &BenchArgs,
    data: &Path,
    threads: usize,
    secret: Option<&Path>,
) -> Result<WorkersRound, String> {
    let w = &args.remote;
    let dir = std::env::temp_dir().join(format!(
        "stoker-bench-workers-{}-{}",
        std::process::id(),
        secret.is_some()
    ));
    std::fs::create_dir_all(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let _cleanup = RemoveDir(dir.clone());
    let metrics = free_local_addr()?;
    let mut config = format!("[metrics]\nlisten = {metrics:?}\n");
    if let Some(secret) = secret {
        config += &format!(
            "[remote]\nworkers = {:?}\nsecret_file = {:?}\n",
            w.workers, secret
        );
        if let Some(n) = w.worker_connections {
            config += &format!("connections = {n}\n");
        }
    }
    let (socket, daemon) = start_stokerd(args, &dir, threads, &config)?;
    let pid = daemon.as_ref().map(|d| d.0.id());
    let cpu0 = pid.and_then(crate::bench::cpu_seconds_of).unwrap_or(0.0);
    let workers0 = secret.and_then(|_| worker_figures(&w.worker_metrics));
    let stats = run_clients(
        args,
        &socket,
        data,
        1,
        CacheState::Warm,
        (args.warmup, args.epochs.max(1)),
    )?;
    let home_cpu = pid.and_then(crate::bench::cpu_seconds_of).unwrap_or(0.0) - cpu0;
    let workers1 = secret.and_then(|_| worker_figures(&w.worker_metrics));
    let home = http_get(&metrics, "/metrics")?;
    drop(daemon);
    Ok(round_of(
        secret.is_some(),
        &stats,
        home_cpu,
        &home,
        workers0.zip(workers1),
    ))
}

/// The round's figures from the client's, the home's CPU, its metrics and the workers'
/// figures before and after.
fn round_of(
    with_workers: bool,
    stats: &[ClientStats],
    home_cpu: f64,
    home: &str,
    workers: Option<([f64; 3], [f64; 3])>,
) -> WorkersRound {
    let images: u64 = stats.iter().map(|s| s.images).sum();
    let images_all: u64 = stats.iter().map(|s| s.images_all).sum();
    let seconds = stats.iter().map(|s| s.seconds).fold(0.0, f64::max);
    let client_cpu: f64 = stats.iter().map(|s| s.cpu_s).sum();
    let diff = workers.map(|(a, b)| [b[0] - a[0], b[1] - a[1], b[2] - a[2]]);
    WorkersRound {
        with_workers,
        images_per_s: images as f64 / seconds.max(1e-9),
        home_cpu_s_per_1000: (home_cpu + client_cpu) / images_all.max(1) as f64 * 1000.0,
        remote_images: metric_sum(home, "stoker_remote_images_total", &[]),
        remote_share: metric_sum(home, "stoker_remote_share", &[]),
        bytes_sent: metric_sum(home, "stoker_remote_bytes_total", &["direction=\"sent\""]),
        bytes_received: metric_sum(
            home,
            "stoker_remote_bytes_total",
            &["direction=\"received\""],
        ),
        receive_cpu_s: metric_sum(home, "stoker_remote_receive_cpu_seconds_total", &[]),
        worker_work_cpu_s: diff.map(|d| d[0]),
        worker_send_cpu_s: diff.map(|d| d[1]),
        worker_bytes_sent: diff.map(|d| d[2]),
    }
}

/// Every worker's (work CPU s, send CPU s, bytes sent), summed; `None` without their
/// metrics or when one does not answer.
fn worker_figures(addrs: &[String]) -> Option<[f64; 3]> {
    if addrs.is_empty() {
        return None;
    }
    let mut sum = [0.0; 3];
    for a in addrs {
        let text = http_get(a, "/metrics").ok()?;
        sum[0] += metric_sum(&text, "stoker_worker_cpu_seconds_total", &["part=\"work\""]);
        sum[1] += metric_sum(&text, "stoker_worker_cpu_seconds_total", &["part=\"send\""]);
        sum[2] += metric_sum(&text, "stoker_worker_bytes_total", &["direction=\"sent\""]);
    }
    Some(sum)
}

/// The medians and the figures per image and per GB.
fn summary(
    args: &BenchArgs,
    spec: &PipelineSpec,
    data: &Path,
    threads: usize,
    rounds: Vec<WorkersRound>,
) -> WorkersReport {
    let of = |with: bool, f: &dyn Fn(&WorkersRound) -> Option<f64>| {
        median(
            rounds
                .iter()
                .filter(|r| r.with_workers == with)
                .filter_map(f)
                .collect(),
        )
    };
    let alone = of(false, &|r| Some(r.images_per_s));
    let with = of(true, &|r| Some(r.images_per_s));
    let gb = |b: f64| (b / 1e9).max(1e-12);
    let per_gb = |cpu: Option<f64>, bytes: Option<f64>| Some(cpu? / gb(bytes?));
    let worker_cpu = |r: &WorkersRound| {
        per_gb(
            r.worker_work_cpu_s
                .zip(r.worker_send_cpu_s)
                .map(|(a, b)| a + b),
            r.worker_bytes_sent,
        )
    };
    WorkersReport {
        dataset: data.display().to_string(),
        spec: spec.clone(),
        decode_threads: threads,
        workers: args.remote.workers.clone(),
        worker_connections: args.remote.worker_connections,
        alone_images_per_s: alone,
        with_workers_images_per_s: with,
        ratio: with / alone.max(1e-9),
        remote_share: of(true, &|r| Some(r.remote_share)),
        wire_bytes_per_image: of(true, &|r| {
            Some((r.bytes_sent + r.bytes_received) / r.remote_images.max(1.0))
        }),
        home_receive_cpu_s_per_gb: of(true, &|r| Some(r.receive_cpu_s / gb(r.bytes_received))),
        worker_cpu_s_per_gb: Some(of(true, &worker_cpu))
            .filter(|_| rounds.iter().any(|r| r.worker_bytes_sent.is_some())),
        worker_send_cpu_s_per_gb: Some(of(true, &|r| {
            per_gb(r.worker_send_cpu_s, r.worker_bytes_sent)
        }))
        .filter(|_| rounds.iter().any(|r| r.worker_bytes_sent.is_some())),
        rounds,
        load: load_average(),
    }
}

/// The median of `values` (the mean of the middle two for an even count; 0 for none).
pub(super) fn median(mut values: Vec<f64>) -> f64 {
    values.sort_by(f64::total_cmp);
    match values.len() {
        0 => 0.0,
        n if n % 2 == 1 => values[n / 2],
        n => (values[n / 2 - 1] + values[n / 2]) / 2.0,
    }
}

/// The sum of the samples of `name` whose labels hold every one of `labels`.
fn metric_sum(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| {
            l.strip_prefix(name)
                .is_some_and(|rest| rest.starts_with('{') || rest.starts_with(' '))
        })
        .filter(|l| labels.iter().all(|x| l.contains(x)))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// A loopback address with a port free now.
// String error: as `measure`.
fn free_local_addr() -> Result<String, String> {
    let l = std::net::TcpListener::bind("127.0.0.1:0").map_err(|e| format!("a free port: {e}"))?;
    let a = l.local_addr().map_err(|e| format!("a free port: {e}"))?;
    Ok(a.to_string())
}

/// An HTTP GET of `path` on `addr` (the daemons' metrics listener): the body.
// String error: as `measure`.
fn http_get(addr: &str, path: &str) -> Result<String, String> {
    use std::io::{Read, Write};
    let fail = |e: std::io::Error| format!("metrics at {addr}: {e}");
    let mut s = std::net::TcpStream::connect(addr).map_err(fail)?;
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .map_err(fail)?;
    write!(s, "GET {path} HTTP/1.1\r\nHost: {addr}\r\n\r\n").map_err(fail)?;
    let mut text = String::new();
    s.read_to_string(&mut text).map_err(fail)?;
    Ok(text
        .split_once("\r\n\r\n")
        .map_or(String::new(), |(_, b)| b.to_owned()))
}

/// /proc/loadavg's three figures.
fn load_average() -> Option<[f64; 3]> {
    let text = std::fs::read_to_string("/proc/loadavg").ok()?;
    let mut f = text.split_whitespace().map(|v| v.parse::<f64>().ok());
    Some([f.next()??, f.next()??, f.next()??])
}

/// What a person reads.
fn table(r: &WorkersReport) -> String {
    let mut out = format!(
        "remote workers {} ({} connections each), home {} decode threads, batch {}:\n",
        r.workers.join(", "),
        r.worker_connections
            .map_or_else(|| "the default".to_owned(), |n| n.to_string()),
        r.decode_threads,
        r.spec.batch_size
    );
    for (i, x) in r.rounds.iter().enumerate() {
        out += &format!(
            "  round {} {:<13} {:>8.1} img/s  home+client CPU {:.2} s/1000 img{}\n",
            i / 2 + 1,
            if x.with_workers {
                "with workers"
            } else {
                "alone"
            },
            x.images_per_s,
            x.home_cpu_s_per_1000,
            if x.with_workers {
                format!("  remote share {:.0}%", x.remote_share * 100.0)
            } else {
                String::new()
            }
        );
    }
    out += &format!(
        "medians: alone {:.1} img/s, with workers {:.1} img/s = {:.2}x; {:.0}% of images remote\n\
         wire: {:.0} bytes per remote image; home CPU receiving {:.3} s/GB",
        r.alone_images_per_s,
        r.with_workers_images_per_s,
        r.ratio,
        r.remote_share * 100.0,
        r.wire_bytes_per_image,
        r.home_receive_cpu_s_per_gb
    );
    match (r.worker_cpu_s_per_gb, r.worker_send_cpu_s_per_gb) {
        (Some(all), Some(send)) => {
            out += &format!("; workers' CPU {all:.2} s/GB sent ({send:.3} s/GB of it sending)")
        }
        _ => out += "; workers' CPU unknown (give --worker-metrics)",
    }
    if let Some(l) = r.load {
        out += &format!("\nload average {:.2} {:.2} {:.2}", l[0], l[1], l[2]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_pick_the_series_and_labels_asked_for() {
        let text = [
            "# TYPE stoker_remote_bytes_total counter",
            r#"stoker_remote_bytes_total{worker="a:1",direction="sent"} 10"#,
            r#"stoker_remote_bytes_total{worker="a:1",direction="received"} 1000"#,
            r#"stoker_remote_bytes_total{worker="b:1",direction="received"} 500"#,
            "stoker_remote_bytes_totals 7",
            "stoker_remote_share 0.25",
        ]
        .join("\n");
        let text = text.as_str();
        let received = metric_sum(
            text,
            "stoker_remote_bytes_total",
            &["direction=\"received\""],
        );
        assert_eq!(received, 1500.0);
        assert_eq!(metric_sum(text, "stoker_remote_bytes_total", &[]), 1510.0);
        assert_eq!(metric_sum(text, "stoker_remote_share", &[]), 0.25);
        assert_eq!(median(vec![3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(vec![4.0, 1.0]), 2.5);
        assert_eq!(median(Vec::new()), 0.0);
    }
}
