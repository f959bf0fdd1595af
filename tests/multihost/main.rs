//! Beyond one host: two real `stokerd` processes standing for two hosts (each with its own
//! socket, config, dataset copy and cache, and its own network namespace where `unshare --net`
//! works here) serve one job whose ranks are real client processes; and a checkpoint taken at
//! one world size resumes at others.
//!
//! The client processes are the kit's `stoker-test-client rank`, told what to do by their
//! `RankOrders`. Each writes one line per batch to its own log file (flushed at once), which
//! is how the parent watches progress and checks what was delivered.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod deploy;
mod elastic;
mod hosts;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stoker::protocol::{EpochOffset, ErrorCode, Position};
use stoker::{AttachOptions, Client};
use stoker_pipeline::transform::sampler::Sampler;
use stoker_testkit::client_process;
use stoker_testkit::rank_orders::{spec, wait_for, RankOrders as Orders, DATASET, PATIENCE, SEED};
use stoker_testkit::{write_image_folder, Daemon};

/// A client process running `stoker-test-client rank`.
struct RankProcess {
    child: Child,
    log: PathBuf,
}

impl RankProcess {
    fn spawn(orders: &Orders) -> RankProcess {
        let json = orders.to_json();
        let child = client_process::test_client("rank", &[json.as_ref()])
            .stdout(Stdio::null())
            .spawn()
            .unwrap();
        RankProcess {
            child,
            log: orders.log.clone(),
        }
    }

    fn lines(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_owned)
            .collect()
    }

    fn count(&self, tag: &str) -> usize {
        self.lines()
            .iter()
            .filter(|l| l.split(' ').next() == Some(tag))
            .count()
    }

    fn finish(mut self) -> Vec<String> {
        let deadline = Instant::now() + PATIENCE;
        let status = loop {
            if let Some(s) = self.child.try_wait().unwrap() {
                break s;
            }
            assert!(
                Instant::now() < deadline,
                "{} did not finish",
                self.log.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        assert!(status.success(), "{}: {status}", self.log.display());
        self.lines()
    }
}

impl Drop for RankProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One delivered batch, from a `B` log line.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Delivered {
    epoch: u64,
    step: u64,
    hash: String,
    indices: Vec<u64>,
}

fn delivered(lines: &[String]) -> Vec<Delivered> {
    lines
        .iter()
        .filter_map(|l| l.strip_prefix("B "))
        .map(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            Delivered {
                epoch: f[0].parse().unwrap(),
                step: f[1].parse().unwrap(),
                hash: f[2].to_owned(),
                indices: f[3].split(',').map(|i| i.parse().unwrap()).collect(),
            }
        })
        .collect()
}

/// Checks that the ranks' batches of `epoch` are an exact partition of the dataset (each
/// sample once) with equal batch counts, and returns the batch count.
fn assert_exact_partition(ranks: &[Vec<Delivered>], epoch: u64, len: u64) -> usize {
    let mut count = vec![0u32; len as usize];
    let steps = ranks[0].iter().filter(|d| d.epoch == epoch).count();
    for (r, rank) in ranks.iter().enumerate() {
        let mine: Vec<&Delivered> = rank.iter().filter(|d| d.epoch == epoch).collect();
        assert_eq!(mine.len(), steps, "rank {r}: batch count in epoch {epoch}");
        for i in mine.iter().flat_map(|d| &d.indices) {
            count[*i as usize] += 1;
        }
    }
    for (i, c) in count.iter().enumerate() {
        assert_eq!(*c, 1, "epoch {epoch}: sample {i} delivered {c} times");
    }
    steps
}

/// One host: its folder (socket, config, dataset copy, cache) and its daemon.
struct Host {
    dir: PathBuf,
    daemon: Option<Daemon>,
}

impl Host {
    /// Lays out `root/<name>` with its own copy of the dataset registered as [`DATASET`].
    fn new(root: &Path, name: &str, classes: u32, per_class: u32) -> Host {
        let dir = root.join(name);
        let data = dir.join("data");
        write_image_folder(&data, classes, per_class, 24);
        let config = format!(
            "[server]\nslots_per_rank = 2\n[pipeline]\nthreads = 1\n[datasets]\n{DATASET} = {:?}\n",
            data.display().to_string()
        );
        std::fs::write(dir.join("stoker.toml"), config).unwrap();
        Host { dir, daemon: None }
    }

    fn socket(&self) -> PathBuf {
        self.dir.join("stoker.sock")
    }

    /// Starts (or restarts) the host's daemon; in a network namespace of its own with its
    /// Prometheus endpoint on `metrics_port` when `netns` (two hosts may use one port).
    fn start(&mut self, netns: Option<u16>) {
        let config = self.dir.join("stoker.toml");
        let config = config.to_str().unwrap();
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("stokerd.log"))
            .unwrap();
        let daemon = match netns {
            Some(port) => {
                let listen = format!("127.0.0.1:{port}");
                let extra = ["--config", config, "--metrics-listen", &listen];
                Daemon::start_wrapped(&self.dir, &["unshare", "--net"], &extra, log.into())
            }
            None => Daemon::start_wrapped(&self.dir, &[], &["--config", config], log.into()),
        };
        self.daemon = Some(daemon);
    }

    /// SIGKILL, as a host crash would.
    fn kill(&mut self) {
        drop(self.daemon.take());
    }

    fn pid(&self) -> u32 {
        self.daemon.as_ref().expect("running").pid()
    }
}

/// Whether this machine lets us make network namespaces (`unshare --net`); the reason if not.
fn netns_available() -> Result<(), String> {
    match Command::new("unshare").args(["--net", "true"]).output() {
        Ok(o) if o.status.success() => Ok(()),
        Ok(o) => Err(String::from_utf8_lossy(&o.stderr).trim().to_owned()),
        Err(e) => Err(format!("cannot run unshare: {e}")),
    }
}

fn net_namespace(pid: u32) -> PathBuf {
    std::fs::read_link(format!("/proc/{pid}/ns/net")).unwrap()
}

/// A free TCP port on this host's loopback (each namespace has its own; any port will do).
fn some_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn orders(dir: &Path, socket: &Path, job: &str, rank: u32, world: u32) -> Orders {
    Orders {
        socket: socket.to_owned(),
        job: job.into(),
        rank,
        world,
        batch: 2,
        epochs: 3,
        start: Position::default(),
        offset: None,
        log: dir.join(format!("{job}-rank{rank}.log")),
        hold_after: None,
        gate: dir.join(format!("{job}-gate")),
        stop_after: None,
    }
}
