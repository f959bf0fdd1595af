//! Beyond one host: two real `stokerd` processes standing for two hosts (each with its own
//! socket, config, dataset copy and cache, and its own network namespace where `unshare --net`
//! works here) serve one job whose ranks are real client processes; and a checkpoint taken at
//! one world size resumes at others.
//!
//! The client processes are this test binary again, filtered to [`child_rank`] and told what
//! to do through [`CHILD_ENV`]. Each writes one line per batch to its own log file (flushed at
//! once), which is how the parent watches progress and checks what was delivered.

mod deploy;
mod elastic;
mod hosts;

use serde_json::{json, Value};
use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};
use stoker::protocol::{EpochOffset, ErrorCode, StartPosition};
use stoker::{AttachOptions, Client, DType, PipelineSpec, SampleStatus};
use stoker_daemon::sampler::Sampler;
use stoker_testkit::{fnv1a, write_image_folder, Daemon};

/// Set in a child process: its orders, as JSON (see [`Orders`]).
const CHILD_ENV: &str = "STOKER_TEST_MULTIHOST_RANK";

const SEED: u64 = 4242;

/// The dataset's name in every host's config.
const DATASET: &str = "train";

/// Longest wait for anything in these tests; they normally take a few seconds.
const PATIENCE: Duration = Duration::from_secs(120);

fn spec(batch: u32, epochs: u32) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(epochs),
        ..PipelineSpec::train(batch, 16)
    }
}

/// What one client process does.
struct Orders {
    socket: PathBuf,
    job: String,
    rank: u32,
    world: u32,
    batch: u32,
    epochs: u32,
    start: StartPosition,
    log: PathBuf,
    /// After this many batches, wait until `gate` exists.
    hold_after: Option<u64>,
    gate: PathBuf,
    /// Detach after this many batches (and log the checkpoint).
    stop_after: Option<u64>,
}

impl Orders {
    fn to_json(&self) -> String {
        json!({
            "socket": self.socket, "job": self.job, "rank": self.rank, "world": self.world,
            "batch": self.batch, "epochs": self.epochs, "start": self.start, "log": self.log,
            "hold_after": self.hold_after, "gate": self.gate, "stop_after": self.stop_after,
        })
        .to_string()
    }

    fn from_json(text: &str) -> Orders {
        let v: Value = serde_json::from_str(text).unwrap();
        let path = |k: &str| PathBuf::from(v[k].as_str().unwrap());
        let num = |k: &str| v[k].as_u64().unwrap();
        Orders {
            socket: path("socket"),
            job: v["job"].as_str().unwrap().to_owned(),
            rank: num("rank") as u32,
            world: num("world") as u32,
            batch: num("batch") as u32,
            epochs: num("epochs") as u32,
            start: serde_json::from_value(v["start"].clone()).unwrap(),
            log: path("log"),
            hold_after: v["hold_after"].as_u64(),
            gate: path("gate"),
            stop_after: v["stop_after"].as_u64(),
        }
    }

    fn options(&self) -> AttachOptions {
        AttachOptions {
            rank: self.rank,
            world_size: self.world,
            seed: SEED,
            start: self.start,
            // A restarting host takes a few seconds at most; the test bounds the whole run.
            connect_timeout: PATIENCE,
            ..AttachOptions::new(&self.job, DATASET, spec(self.batch, self.epochs))
        }
    }
}

/// Not a test on its own: one rank's client process. Without [`CHILD_ENV`] it does nothing.
///
/// Log lines: `B epoch step hash i,j,...` per batch; `D` when the daemon went away, `R epoch
/// step` once attached again there; `H` while held at the gate; `C epoch consumed` (the
/// elastic checkpoint) when told to stop; `E` at the end of the data.
#[test]
fn child_rank() {
    let Ok(orders) = std::env::var(CHILD_ENV) else {
        return;
    };
    let orders = Orders::from_json(&orders);
    let mut log = std::fs::File::create(&orders.log).unwrap();
    let mut line = |text: String| {
        log.write_all(format!("{text}\n").as_bytes()).unwrap();
        log.flush().unwrap();
    };
    let mut opts = orders.options();
    let mut client = Client::attach(&orders.socket, opts.clone()).unwrap();
    let mut received = 0u64;
    loop {
        if orders.stop_after == Some(received) {
            let c = client.checkpoint();
            line(format!("C {} {}", c.epoch, c.consumed));
            return;
        }
        if orders.hold_after == Some(received) {
            line("H".into());
            wait_for(|| orders.gate.exists(), "the gate");
        }
        match client.next_batch() {
            Ok(Some(b)) => {
                assert!(b.status().iter().all(|&s| s == SampleStatus::Ok as u8));
                let indices: Vec<String> = b.indices().iter().map(u64::to_string).collect();
                let hash = fnv1a(&[b.images(), bytes_of(b.labels())]);
                line(format!(
                    "B {} {} {hash:x} {}",
                    b.epoch(),
                    b.step(),
                    indices.join(",")
                ));
                received += 1;
            }
            Ok(None) => {
                line("E".into());
                return;
            }
            Err(e) if e.is_disconnected() => {
                line("D".into());
                opts.start = client.position();
                drop(client);
                client = Client::attach(&orders.socket, opts.clone()).unwrap();
                line(format!("R {} {}", opts.start.epoch, opts.start.step));
            }
            Err(e) => panic!("rank {}: {e}", orders.rank),
        }
    }
}

fn bytes_of(labels: &[i64]) -> &[u8] {
    // SAFETY: i64 has no padding; the slice's bytes are initialised and live as long.
    unsafe { std::slice::from_raw_parts(labels.as_ptr().cast(), std::mem::size_of_val(labels)) }
}

/// Polls `done` (a file appearing, a log growing) until it holds, for at most [`PATIENCE`].
fn wait_for(mut done: impl FnMut() -> bool, what: &str) {
    let deadline = Instant::now() + PATIENCE;
    while !done() {
        assert!(Instant::now() < deadline, "timed out waiting for {what}");
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// A client process running [`child_rank`].
struct RankProcess {
    child: Child,
    log: PathBuf,
}

impl RankProcess {
    fn spawn(orders: &Orders) -> RankProcess {
        let child = Command::new(std::env::current_exe().unwrap())
            .args(["--exact", "child_rank", "--nocapture", "--test-threads=1"])
            .env(CHILD_ENV, orders.to_json())
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
        start: StartPosition::default(),
        log: dir.join(format!("{job}-rank{rank}.log")),
        hold_after: None,
        gate: dir.join(format!("{job}-gate")),
        stop_after: None,
    }
}
