//! `stoker status`: asks the running daemon over its socket (a STATUS message instead of
//! ATTACH) and prints what it serves: jobs, ranks, throughput, backend, errors. `--json`
//! prints the daemon's reply as is, for scripts.
//!
//! Job keys and dataset paths come from clients: the table shows their control characters
//! escaped as the daemon's logs do (`stoker_wire::escape`), so none can write
//! terminal escapes or forge a row, and cuts them to [`MAX_CELL_CHARS`] (the JSON keeps them
//! whole), so a huge key cannot push other jobs out of view.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::Args;
use stoker_wire::escape::{escape_controls, escape_lines};
use stoker_wire::protocol::{
    DaemonStatus, DecodeError, JobStatus, Message, VersionMismatch, MAX_MESSAGE_BYTES,
    PROTOCOL_VERSION, VERSION,
};
use stoker_wire::socket::SeqPacket;

/// The most characters of a job key or dataset path the table shows; longer ones end in `…`.
pub(crate) const MAX_CELL_CHARS: usize = 64;

/// How long the daemon may take to answer.
const STATUS_TIMEOUT: Duration = Duration::from_secs(5);

/// Arguments of `stoker status`.
#[derive(Debug, Args)]
pub struct StatusArgs {
    /// The daemon's socket. Default: $STOKER_SOCKET, else /run/stoker/stoker.sock if a daemon
    /// answers there, else this user's own ($XDG_RUNTIME_DIR/stoker/stoker.sock, else
    /// /tmp/stoker-<uid>/stoker.sock), where `stoker.Loader` starts one.
    #[arg(long)]
    pub(crate) socket: Option<PathBuf>,
    /// Print the daemon's reply as JSON.
    #[arg(long)]
    pub(crate) json: bool,
    /// Show whole job keys (up to 64 characters) instead of short names.
    #[arg(long)]
    pub(crate) wide: bool,
}

/// Why [`query`] got no status from the daemon.
#[derive(Debug, thiserror::Error)]
pub enum StatusError {
    /// The socket could not be connected to, or the peer is not a daemon this user trusts.
    #[error("cannot reach the daemon at {}: {source}{}", path.display(), stoker_wire::socket_env_note(path))]
    Connect {
        /// The socket tried.
        path: PathBuf,
        /// The connect or trust check's error.
        source: stoker_wire::socket::SockError,
    },
    #[error("cannot reach the daemon at {}: {reason}", path.display())]
    /// Nothing listens on the socket (the connection was refused or the file is missing).
    Refused {
        /// The socket tried.
        path: PathBuf,
        /// What is at `path` and what to do about it, for a person.
        reason: String,
    },
    /// Sending the request or receiving the answer failed.
    #[error("talking to the daemon: {0}")]
    Socket(#[from] stoker_wire::socket::SockError),
    /// The daemon hung up before it answered.
    #[error("the daemon closed the connection without answering")]
    Closed,
    /// The answer was not a status reply: an error from the daemon, another message, or
    /// bytes that do not decode (the text says which).
    #[error("the daemon's answer: {0}")]
    Protocol(String),
    #[error("the daemon at {}: {mismatch}", socket.display())]
    /// The daemon speaks another protocol version.
    Version {
        /// The socket asked.
        socket: PathBuf,
        /// Both versions and what to do.
        mismatch: VersionMismatch,
    },
    #[error("the daemon at {} refused: {message}", path.display())]
    /// The daemon refused this user the status (its access rules).
    Denied {
        /// The socket asked.
        path: PathBuf,
        /// The daemon's reason, as it sent it.
        message: String,
    },
}

/// Asks the daemon at `socket` for its status.
pub fn query(socket: &Path) -> Result<DaemonStatus, StatusError> {
    let connect = |socket: &Path| {
        let sock = SeqPacket::connect(socket)?;
        // Nothing is sent to a daemon this user does not trust (stoker_wire::socket::trust).
        stoker_wire::socket::trust::check_daemon(&sock, socket)?;
        Ok(sock)
    };
    let sock = connect(socket).map_err(|source: stoker_wire::socket::SockError| {
        if stoker_wire::socket::path::is_refusal(source.raw_os_error()) {
            return StatusError::Refused {
                path: socket.to_owned(),
                reason: stoker_wire::socket::path::explain_refusal(socket),
            };
        }
        StatusError::Connect {
            path: socket.to_owned(),
            source,
        }
    })?;
    let bytes = Message::Status
        .encode()
        .map_err(|e| StatusError::Protocol(e.to_string()))?;
    sock.send(&bytes, &[])?;
    sock.set_read_timeout(Some(STATUS_TIMEOUT))?;
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let Some(r) = sock.recv(&mut buf)? else {
        return Err(StatusError::Closed);
    };
    match Message::decode(&buf[..r.len]) {
        Ok(Message::StatusReply(s)) => Ok(*s),
        Ok(Message::Error(e)) if e.code == stoker_wire::ErrorCode::PermissionDenied => {
            Err(StatusError::Denied {
                path: socket.to_owned(),
                message: e.message,
            })
        }
        Ok(Message::Error(e)) => Err(StatusError::Protocol(format!("{}: {}", e.code, e.message))),
        Ok(other) => Err(StatusError::Protocol(format!(
            "expected STATUS_REPLY, got {:?}",
            other.kind()
        ))),
        Err(DecodeError::Version { got, peer_version }) => Err(StatusError::Version {
            socket: socket.to_owned(),
            mismatch: VersionMismatch::with_daemon(got, peer_version),
        }),
        Err(e) => Err(StatusError::Protocol(e.to_string())),
    }
}

/// Runs `stoker status`: prints the table (or the JSON) and returns the exit code.
pub fn run(args: &StatusArgs) -> Exit {
    let socket = args
        .socket
        .clone()
        .unwrap_or_else(stoker_wire::client_socket_path);
    match query(&socket) {
        Ok(s) if args.json => {
            println!(
                "{}",
                serde_json::to_string_pretty(&s).expect("status serialises")
            );
            Exit::Ok
        }
        Ok(s) => {
            let names = if args.wide {
                JobNames::Whole
            } else {
                JobNames::Short
            };
            print!("{}", escape_lines(&render_as(&s, names)));
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker status: {e}");
            Exit::NoDaemon
        }
    }
}

/// How the table names jobs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum JobNames {
    /// [`short_job`]: at most [`JOB_CHARS`] characters.
    Short,
    /// The key, cut only at [`MAX_CELL_CHARS`] (`--wide`).
    Whole,
}

/// The most characters of a job's short name.
pub(crate) const JOB_CHARS: usize = 32;

/// The table a person reads, with short job names.
pub fn render(s: &DaemonStatus) -> String {
    render_as(s, JobNames::Short)
}

/// The table a person reads.
pub(crate) fn render_as(s: &DaemonStatus, names: JobNames) -> String {
    let mut out = String::new();
    let state = if s.stopping { "stopping" } else { "serving" };
    out.push_str(&format!(
        "stokerd {} (protocol {}, pid {}) {state} on {}{} for {}\n",
        s.daemon_version,
        s.protocol,
        s.pid,
        s.socket,
        if s.activated {
            " (socket-activated)"
        } else {
            ""
        },
        human_duration(s.uptime_s)
    ));
    out.push_str(&format!(
        "backend {}  reader {}  threads {}  clients {}  {:.0} img/s  delivered {}  bad samples {}  rings {}\n",
        s.backend,
        s.reader,
        s.threads,
        s.clients,
        s.images_per_s,
        s.images_delivered,
        s.bad_samples,
        human_bytes(s.ring_bytes)
    ));
    out.push_str(&format!(
        "this tool: stoker {VERSION} (protocol {PROTOCOL_VERSION})\n"
    ));
    if !s.datasets.is_empty() {
        out.push_str(&format!("datasets: {}\n", s.datasets.join(", ")));
    }
    for g in &s.gpus {
        out.push_str(&render_gpu(g));
    }
    out.push_str(&render_workers(s));
    if s.jobs.is_empty() {
        out.push_str("no jobs\n");
        return out;
    }
    out.push_str(&render_jobs(&s.jobs, names));
    if s.jobs_left_out > 0 {
        out.push_str(&format!(
            "({} more jobs not shown: the reply hit the message size limit)\n",
            s.jobs_left_out
        ));
    }
    out.push_str(&render_stalls(s, names));
    out
}

/// A job's name in the table: its key, escaped; for [`JobNames::Short`], a dataset path the
/// key ends with (the Python Loader's keys are `<run>/<dataset>`) shortened to its last
/// component, and a key still longer than [`JOB_CHARS`] cut in the middle, so that both the
/// run and what tells its loaders apart stay in view.
pub(crate) fn job_name(job: &JobStatus, names: JobNames) -> String {
    if names == JobNames::Whole {
        return cell(&job.job);
    }
    let mut key = job.job.clone();
    let dataset = job.dataset.trim_end_matches('/');
    if let Some((_, last)) = dataset.rsplit_once('/') {
        if let Some(run) = key.strip_suffix(dataset).filter(|r| r.ends_with('/')) {
            key = format!("{run}{last}");
        }
    }
    let key = escape_controls(&key);
    let n = key.chars().count();
    if n <= JOB_CHARS {
        return key;
    }
    let tail = JOB_CHARS / 3;
    let head: String = key.chars().take(JOB_CHARS - tail - 1).collect();
    let end: String = key.chars().skip(n - tail).collect();
    format!("{head}…{end}")
}

/// A job owner's user name, else the uid.
fn owner_name(uid: u32) -> String {
    stoker_wire::socket::users::user_name(uid).unwrap_or_else(|| uid.to_string())
}

/// The jobs' table: one row a job, columns padded to their widest cell. OWNER is the user
/// that made the job: two users' jobs may share a key, and only root and the daemon's uid
/// see others'.
fn render_jobs(jobs: &[JobStatus], names: JobNames) -> String {
    let mut out = String::new();
    let header = [
        "JOB",
        "OWNER",
        "DATASET",
        "SAMPLES",
        "RANKS",
        "BATCH",
        "STEPS/EPOCH",
        "DELIVERED",
    ];
    let rows: Vec<[String; 8]> = jobs
        .iter()
        .map(|j| {
            [
                job_name(j, names),
                cell(&owner_name(j.owner)),
                cell(&j.dataset),
                j.samples.to_string(),
                format!("{}/{} {}", j.ranks.len(), j.world_size, rank_list(&j.ranks)),
                j.batch_size.to_string(),
                j.steps_per_epoch.to_string(),
                j.images_delivered.to_string(),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let mut l = String::new();
        for (i, (c, w)) in cells.iter().zip(width).enumerate() {
            if i > 0 {
                l.push_str("  ");
            }
            l.push_str(&format!("{c:<w$}"));
        }
        l.trim_end().to_owned() + "\n"
    };
    out.push_str(&line(header.to_vec()));
    for r in &rows {
        out.push_str(&line(r.iter().map(String::as_str).collect()));
    }
    out
}

/// The data stall of every rank that reported one: the share of its training loop's time
/// spent waiting for data (recent), and the totals since it attached.
fn render_stalls(s: &DaemonStatus, names: JobNames) -> String {
    let mut out = String::new();
    for j in s.jobs.iter().filter(|j| !j.stalls.is_empty()) {
        if out.is_empty() {
            out.push_str("data stall (share of each rank's loop time spent waiting in next()):\n");
        }
        for r in &j.stalls {
            out.push_str(&format!(
                "  {} ({}) rank {}: wait {:.0}%  ({:.1}s waiting, {:.1}s computing, {} batches)\n",
                job_name(j, names),
                owner_name(j.owner),
                r.rank,
                r.wait_fraction * 100.0,
                r.wait_s,
                r.compute_s,
                r.batches
            ));
        }
    }
    out
}

/// The remote workers' table (a home daemon's `[remote] workers`): one row a worker, and
/// the share of images they filled.
fn render_workers(s: &DaemonStatus) -> String {
    let Some(share) = s.remote_share.filter(|_| !s.workers.is_empty()) else {
        return String::new();
    };
    let mut out = format!(
        "remote workers: {:.0}% of images (units) filled remotely
",
        share * 100.0
    );
    let header = [
        "WORKER",
        "IN FLIGHT",
        "IMG/S",
        "DONE",
        "REISSUED",
        "REFUSED",
        "RTT ms",
        "RECEIVED",
    ];
    let rows: Vec<[String; 8]> = s
        .workers
        .iter()
        .map(|w| {
            [
                cell(&w.addr),
                w.units_in_flight.to_string(),
                format!("{:.0}", w.images_per_s),
                w.units_done.to_string(),
                w.units_reissued.to_string(),
                w.units_refused.to_string(),
                format!("{:.1}", w.round_trip_ms),
                human_bytes(w.bytes_received),
            ]
        })
        .collect();
    let mut width = header.map(str::len);
    for r in &rows {
        for (w, c) in width.iter_mut().zip(r) {
            *w = (*w).max(c.chars().count());
        }
    }
    for r in std::iter::once(header.map(str::to_owned)).chain(rows) {
        let cells: Vec<String> = r
            .iter()
            .zip(width)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect();
        out.push_str(&format!("  {}\n", cells.join("  ").trim_end()));
    }
    out
}

/// A client's string as the table shows it: control characters escaped, at most
/// [`MAX_CELL_CHARS`] characters.
fn cell(text: &str) -> String {
    let escaped = escape_controls(text);
    if escaped.chars().count() <= MAX_CELL_CHARS {
        return escaped;
    }
    let mut cut: String = escaped.chars().take(MAX_CELL_CHARS - 1).collect();
    cut.push('…');
    cut
}

/// `[0-3,5]`.
fn rank_list(ranks: &[u32]) -> String {
    let mut parts = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let start = ranks[i];
        let mut end = start;
        while i + 1 < ranks.len() && ranks[i + 1] == end + 1 {
            i += 1;
            end = ranks[i];
        }
        parts.push(if start == end {
            start.to_string()
        } else {
            format!("{start}-{end}")
        });
        i += 1;
    }
    format!("[{}]", parts.join(","))
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < UNITS.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

// Whole seconds: `as` drops the fraction and saturates (a negative reads 0).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn human_duration(s: f64) -> String {
    let s = s as u64;
    match s {
        0..=59 => format!("{s}s"),
        60..=3599 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// One GPU's line: health, decode mix, batches, ring device memory, time per batch.
fn render_gpu(g: &stoker_wire::protocol::GpuStatus) -> String {
    let mut l = format!(
        "GPU {} ({}){}  decode mix hardware/hybrid/cpu {}/{}/{}  batches {} ({} in flight)  \
         ring device memory {}  decode {:.2} ms/batch  kernel {:.2} ms/batch\n",
        g.uuid,
        g.name,
        if g.emulated { " EMULATED" } else { "" },
        g.decoded_hardware,
        g.decoded_hybrid,
        g.decoded_cpu,
        g.batches,
        g.batches_in_flight,
        human_bytes(g.ring_device_bytes),
        g.decode_ms_per_batch,
        g.kernel_ms_per_batch,
    );
    if let Some(why) = &g.broken {
        l.push_str(&format!("  BROKEN: {why}\n"));
    }
    l
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_wire::protocol::JobStatus;

    #[test]
    fn renders_a_table() {
        let s = DaemonStatus {
            daemon_version: "0.1.0+g1234567890".into(),
            protocol: 2,
            pid: 7,
            uptime_s: 125.0,
            socket: "/run/stoker/stoker.sock".into(),
            backend: "cpu".into(),
            reader: "io_uring".into(),
            clients: 3,
            images_per_s: 1234.4,
            ring_bytes: 3 << 20,
            jobs: vec![JobStatus {
                job: "resnet".into(),
                owner: 0,
                dataset: "imagenet".into(),
                samples: 1000,
                world_size: 4,
                ranks: vec![0, 1, 2],
                batch_size: 256,
                steps_per_epoch: 1,
                images_delivered: 768,
                stalls: vec![stoker_wire::protocol::RankStall {
                    rank: 2,
                    wait_fraction: 0.376,
                    wait_s: 3.0,
                    compute_s: 5.0,
                    batches: 3,
                }],
            }],
            ..DaemonStatus::default()
        };
        let t = render(&s);
        assert!(
            t.starts_with("stokerd 0.1.0+g1234567890 (protocol 2, pid 7) serving on "),
            "{t}"
        );
        assert!(
            t.contains(&format!(
                "this tool: stoker {VERSION} (protocol {PROTOCOL_VERSION})"
            )),
            "{t}"
        );
        assert!(t.contains("serving on /run/stoker/stoker.sock"), "{t}");
        assert!(t.contains("2m05s"), "{t}");
        assert!(t.contains("1234 img/s"), "{t}");
        assert!(t.contains("3.0 MiB"), "{t}");
        assert!(t.contains("JOB     OWNER  DATASET   SAMPLES  RANKS"), "{t}");
        assert!(
            t.contains("resnet  root   imagenet  1000     3/4 [0-2]"),
            "{t}"
        );
        assert!(
            t.contains("resnet (root) rank 2: wait 38%  (3.0s waiting, 5.0s computing, 3 batches)"),
            "{t}"
        );
    }

    #[test]
    fn job_names_are_short_and_show_their_owner() {
        // The key a Loader under torchrun makes: the run's id, then the dataset's path.
        let train = "/home/alice/datasets/imagenet/train";
        let job = JobStatus {
            job: format!("torchrun-8f3c2a1e-4b5d-4e6f-9a0b-1c2d3e4f5a6b/{train}"),
            dataset: train.into(),
            owner: u32::MAX - 7,
            ..JobStatus::default()
        };
        let short = job_name(&job, JobNames::Short);
        assert_eq!(short, "torchrun-8f3c2a1e-4b5…5a6b/train");
        assert_eq!(short.chars().count(), JOB_CHARS);
        assert_eq!(job_name(&job, JobNames::Whole), cell(&job.job));
        let plain = JobStatus {
            job: "resnet-eval".into(),
            dataset: train.into(),
            ..JobStatus::default()
        };
        assert_eq!(job_name(&plain, JobNames::Short), "resnet-eval");
        let s = DaemonStatus {
            jobs: vec![job, plain],
            ..DaemonStatus::default()
        };
        let t = render(&s);
        // A uid without a name shows as its number; root by name.
        assert!(
            t.contains(&format!("{short}  {}  {train}", u32::MAX - 7)),
            "{t}"
        );
        assert!(
            t.contains("resnet-eval                       root  "),
            "{t}"
        );
    }

    #[test]
    fn client_strings_are_escaped_and_cut() {
        let s = DaemonStatus {
            jobs: vec![JobStatus {
                job: "\u{1b}[2J\rFORGED\n".into(),
                dataset: "d".repeat(70_000),
                ..JobStatus::default()
            }],
            ..DaemonStatus::default()
        };
        let t = render(&s);
        assert!(t.contains("\\e[2J\\rFORGED\\n  root   ddd"), "{t}");
        assert!(t.lines().all(|l| l.chars().count() < 200), "{t}");
        assert!(
            t.contains(&format!("{}…", "d".repeat(MAX_CELL_CHARS - 1))),
            "{t}"
        );
    }

    #[test]
    fn workers_get_a_row_each_and_the_remote_share() {
        let w = stoker_wire::protocol::WorkerStatus {
            addr: "10.0.0.7:7411".into(),
            units_in_flight: 2,
            units_done: 120,
            units_reissued: 3,
            images_per_s: 812.4,
            round_trip_ms: 21.25,
            bytes_received: 3 << 30,
            ..Default::default()
        };
        let s = DaemonStatus {
            workers: vec![w],
            remote_share: Some(0.456),
            ..DaemonStatus::default()
        };
        let t = render(&s);
        assert!(t.contains("remote workers: 46% of images"), "{t}");
        assert!(
            t.contains(
                "  10.0.0.7:7411  2          812    120   3         0        21.2    3.0 GiB\n"
            ),
            "{t}"
        );
        assert!(!render(&DaemonStatus::default()).contains("remote workers"));
    }

    #[test]
    fn rank_lists_collapse_runs() {
        assert_eq!(rank_list(&[0, 1, 2, 5, 7, 8]), "[0-2,5,7-8]");
        assert_eq!(rank_list(&[]), "[]");
    }
}
