//! Beyond one host: two real `stokerd` processes standing for two hosts (each with its own
//! socket, config, dataset copy and cache, and its own network namespace where `unshare --net`
//! works here) serve one job whose ranks are real client processes; and a checkpoint taken at
//! one world size resumes at others.
//!
//! The client processes are this test binary again, filtered to [`child_rank`] and told what
//! to do through [`CHILD_ENV`]. Each writes one line per batch to its own log file (flushed at
//! once), which is how the parent watches progress and checks what was delivered.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::{json, Value};
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

/// World size 4, ranks 0-1 on host A and 2-3 on host B, 3 epochs: every epoch is the exact
/// DistributedSampler partition, and every rank gets exactly the batches (indices and pixels)
/// one daemon serving all four ranks gives. Host B is killed (SIGKILL) mid-epoch while its
/// ranks are between batches; host A's ranks keep receiving batches while it is down, and once
/// B is back its ranks resume exactly where they were.
#[test]
fn two_hosts_serve_one_job_exactly_and_a_crashed_host_resumes_its_ranks() {
    let tmp = tempfile::tempdir().unwrap();
    let (classes, per_class) = (4, 10); // 40 samples: 10 per rank, 5 steps of 2 per epoch
    let len = u64::from(classes * per_class);
    let mut a = Host::new(tmp.path(), "host-a", classes, per_class);
    let mut b = Host::new(tmp.path(), "host-b", classes, per_class);
    let netns = match netns_available() {
        Ok(()) => Some(some_port()),
        Err(why) => {
            eprintln!(
                "two_hosts_serve_one_job_exactly_and_a_crashed_host_resumes_its_ranks: \
                 NOT using network namespaces (unshare --net: {why}); the two daemons share \
                 this machine's network stack"
            );
            None
        }
    };
    a.start(netns);
    b.start(netns);
    if netns.is_some() {
        let own = net_namespace(std::process::id());
        let (na, nb) = (net_namespace(a.pid()), net_namespace(b.pid()));
        assert!(na != own && nb != own && na != nb, "{na:?} {nb:?} {own:?}");
    }

    // The reference: one daemon (host A) serves all four ranks of another job.
    let reference: Vec<RankProcess> = (0..4)
        .map(|r| RankProcess::spawn(&orders(tmp.path(), &a.socket(), "ref", r, 4)))
        .collect();
    let reference: Vec<Vec<Delivered>> = reference
        .into_iter()
        .map(|p| delivered(&p.finish()))
        .collect();
    for epoch in 0..3 {
        assert_eq!(assert_exact_partition(&reference, epoch, len), 5);
    }

    // The two-host job. Every rank pauses after 6 batches (the next is epoch 1, step 1).
    let ranks: Vec<RankProcess> = (0..4)
        .map(|r| {
            let host = if r < 2 { &a } else { &b };
            let mut o = orders(tmp.path(), &host.socket(), "job", r, 4);
            o.hold_after = Some(6);
            o.gate = tmp.path().join(if r < 2 { "gate-a" } else { "gate-b" });
            RankProcess::spawn(&o)
        })
        .collect();
    wait_for(
        || ranks.iter().all(|p| p.count("H") == 1),
        "every rank at its hold",
    );

    // Host B crashes. Host A's ranks go on and finish all three epochs while B is down.
    b.kill();
    std::fs::write(tmp.path().join("gate-a"), "").unwrap();
    wait_for(
        || ranks[..2].iter().all(|p| p.count("E") == 1),
        "host A's ranks to finish while host B is down",
    );
    assert!(ranks[..2].iter().all(|p| p.count("B") == 15));
    assert!(ranks[2..].iter().all(|p| p.count("D") == 0));
    // B's ranks take the batches already announced to them (up to the 2 slots of their
    // rings, complete before the crash), find their daemon gone and retry; then B comes back
    // and they resume, still inside epoch 1.
    std::fs::write(tmp.path().join("gate-b"), "").unwrap();
    wait_for(
        || ranks[2..].iter().all(|p| p.count("D") == 1),
        "host B's ranks to see their daemon gone",
    );
    assert!(ranks[2..].iter().all(|p| (6..=8).contains(&p.count("B"))));
    b.start(netns);

    let logs: Vec<Vec<String>> = ranks.into_iter().map(RankProcess::finish).collect();
    for log in &logs[2..] {
        let at = log.iter().position(|l| l == "D").expect("a D line");
        let last = delivered(&log[..at]).pop().unwrap();
        let resumed = format!("R {} {}", last.epoch, last.step + 1);
        assert_eq!(log[at + 1], resumed, "{log:?}");
        assert!(
            last.epoch == 1 && last.step + 1 < 5,
            "not mid-epoch: {log:?}"
        );
    }
    let got: Vec<Vec<Delivered>> = logs.iter().map(|l| delivered(l)).collect();
    for epoch in 0..3 {
        assert_eq!(assert_exact_partition(&got, epoch, len), 5);
    }
    // No batch lost or repeated across the crash, and the same batches as one daemon's.
    for r in 0..4 {
        assert_eq!(
            got[r], reference[r],
            "rank {r} differs from the one-daemon run"
        );
    }
}

/// A world-size-4 checkpoint taken mid-epoch resumes at world size 2 and at 8: that epoch's
/// samples are each delivered exactly once (before and after the checkpoint together), every
/// new rank gets as many batches, and the next epoch is the usual partition at the new size.
#[test]
fn a_world_4_checkpoint_resumes_at_world_2_and_8() {
    let tmp = tempfile::tempdir().unwrap();
    let (classes, per_class) = (4, 10);
    let len = u64::from(classes * per_class);
    let mut host = Host::new(tmp.path(), "host", classes, per_class);
    host.start(None);
    let socket = host.socket();

    // World 4: every rank takes 2 batches of 2, then checkpoints.
    let before: Vec<RankProcess> = (0..4)
        .map(|r| {
            let mut o = orders(tmp.path(), &socket, "w4", r, 4);
            o.epochs = 2;
            o.stop_after = Some(2);
            RankProcess::spawn(&o)
        })
        .collect();
    let before: Vec<Vec<String>> = before.into_iter().map(RankProcess::finish).collect();
    let point = EpochOffset {
        epoch: 0,
        consumed: 2 * 2 * 4,
    };
    for log in &before {
        assert_eq!(log.last().unwrap(), &format!("C 0 {}", point.consumed));
    }
    let mut first: BTreeMap<u64, u32> = BTreeMap::new();
    for i in before
        .iter()
        .flat_map(|l| delivered(l))
        .flat_map(|d| d.indices)
    {
        *first.entry(i).or_default() += 1;
    }
    assert_eq!(first.len() as u64, point.consumed);

    for world in [2u32, 8] {
        let job = format!("w{world}");
        let ranks: Vec<RankProcess> = (0..world)
            .map(|r| {
                let mut o = orders(tmp.path(), &socket, &job, r, world);
                o.epochs = 2;
                o.start = StartPosition::resume(point);
                RankProcess::spawn(&o)
            })
            .collect();
        let got: Vec<Vec<Delivered>> = ranks.into_iter().map(|p| delivered(&p.finish())).collect();
        // Epoch 0: the rest, split evenly, each sample once; with what came before: all once.
        let rest_steps = got[0].iter().filter(|d| d.epoch == 0).count();
        let mut count = first.clone();
        for (r, rank) in got.iter().enumerate() {
            let mine: Vec<&Delivered> = rank.iter().filter(|d| d.epoch == 0).collect();
            assert_eq!(mine.len(), rest_steps, "world {world} rank {r}");
            for i in mine.iter().flat_map(|d| &d.indices) {
                *count.entry(*i).or_default() += 1;
            }
        }
        assert_eq!(count.len() as u64, len, "world {world}: samples missed");
        assert!(
            count.values().all(|&c| c == 1),
            "world {world}: samples repeated: {count:?}"
        );
        // The sampler is the oracle for which batch is which; epoch 1 is the usual partition.
        let steps = len.div_ceil(u64::from(world)).div_ceil(2);
        assert_eq!(assert_exact_partition(&got, 1, len) as u64, steps);
        for (r, rank) in got.iter().enumerate() {
            let plain = Sampler::new(len, SEED, r as u64, u64::from(world), 2, false).unwrap();
            let mut resumed = plain.clone().with_offset(point).unwrap();
            let mut plain = plain;
            for d in rank {
                let want = if d.epoch == 0 {
                    resumed.batch_indices(d.epoch, d.step)
                } else {
                    plain.batch_indices(d.epoch, d.step)
                };
                assert_eq!(d.indices, want, "world {world} rank {r} at {d:?}");
            }
        }
    }
}

/// The Rust client's view of an elastic resume: its position keeps the offset (so a reconnect
/// resumes the same job), its checkpoint counts from the epoch's start, and the resumed epoch
/// is as long as the daemon said.
#[test]
fn a_resumed_client_knows_its_epoch_length_and_checkpoints_from_the_epoch_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut host = Host::new(tmp.path(), "host", 4, 10);
    host.start(None);
    let point = EpochOffset {
        epoch: 0,
        consumed: 16,
    };
    let mut o = orders(tmp.path(), &host.socket(), "one", 0, 2);
    o.start = StartPosition::resume(point);
    let mut client = Client::attach(&host.socket(), o.options()).unwrap();
    assert_eq!(client.attached().offset_epoch_steps, Some(6)); // 24 left: 12 per rank
    assert_eq!(client.steps_in(0), 6);
    assert_eq!(client.steps_in(1), 10);
    for _ in 0..2 {
        client.next_batch().unwrap().unwrap();
    }
    let pos = StartPosition {
        epoch: 0,
        step: 2,
        offset: Some(point),
    };
    assert_eq!(client.position(), pos);
    let at = EpochOffset {
        epoch: 0,
        consumed: 16 + 2 * 2 * 2,
    };
    assert_eq!(client.checkpoint(), at);
    for _ in 2..6 {
        client.next_batch().unwrap().unwrap();
    }
    assert_eq!(
        client.position(),
        StartPosition {
            epoch: 1,
            step: 0,
            offset: Some(point)
        }
    );
    assert_eq!(
        client.checkpoint(),
        EpochOffset {
            epoch: 1,
            consumed: 0
        }
    );
    let b = client.next_batch().unwrap().unwrap();
    assert_eq!((b.epoch(), b.step()), (1, 0));

    // Another rank of the job without the offset is refused, naming it.
    let plain = orders(tmp.path(), &host.socket(), "one", 1, 2);
    let err = Client::attach(&host.socket(), plain.options()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SpecMismatch), "{err}");
    assert!(
        err.to_string()
            .contains("elastic offset (none) differs from the job's (epoch 0 after 16 samples)"),
        "{err}"
    );
    // An offset past the end of the epoch is refused, naming the numbers.
    let mut past = orders(tmp.path(), &host.socket(), "past", 0, 2);
    past.start = StartPosition::resume(EpochOffset {
        epoch: 0,
        consumed: 41,
    });
    let err = Client::attach(&host.socket(), past.options()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidSpec), "{err}");
    assert!(
        err.to_string().contains("41 samples consumed of epoch 0"),
        "{err}"
    );
    assert!(err.to_string().contains("only 40"), "{err}");
}

/// The `stoker.toml` the Kubernetes ConfigMap gives every node's daemon is one stokerd
/// accepts, and agrees with the DaemonSet: the socket in the hostPath folder, metrics on the
/// port the scrape annotation names. (scripts/k8s-validate checks the manifests themselves
/// against the Kubernetes schemas.)
#[test]
fn the_kubernetes_config_map_holds_a_valid_config() {
    let deploy = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/kubernetes");
    let manifest = std::fs::read_to_string(deploy.join("configmap.yaml")).unwrap();
    // The block scalar under `stoker.toml: |`, indented by four spaces.
    let toml: String = manifest
        .lines()
        .skip_while(|l| l.trim() != "stoker.toml: |")
        .skip(1)
        .take_while(|l| l.is_empty() || l.starts_with("    "))
        .map(|l| format!("{}\n", l.get(4..).unwrap_or("")))
        .collect();
    assert!(toml.contains("[server]"), "no stoker.toml block found");
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("stoker.toml");
    std::fs::write(&path, &toml).unwrap();
    let config = stoker_daemon::config::Config::load(&path).unwrap();
    assert_eq!(
        config.server.socket.as_deref(),
        Some(Path::new("/run/stoker/stoker.sock"))
    );
    assert_eq!(config.metrics.listen.as_deref(), Some("0.0.0.0:9464"));
    let daemonset = std::fs::read_to_string(deploy.join("daemonset.yaml")).unwrap();
    assert!(daemonset.contains("prometheus.io/port: \"9464\""));
    assert!(daemonset.contains("mountPath: /run/stoker\n"));
    assert!(daemonset.contains("value: compute,utility,video"));
}

/// The Slurm recipe's node script (`deploy/slurm/stokerd-job.sh`, what `srun
/// --ntasks-per-node=1` runs on every node) starts a daemon on the job's own socket, which a
/// rank started before it listens reaches; when Slurm ends the step (SIGTERM) the daemon drains
/// and the job's folder is gone.
#[test]
fn the_slurm_node_script_serves_the_job_on_its_own_socket_and_cleans_up() {
    let tmp = tempfile::tempdir().unwrap();
    let data = tmp.path().join("data");
    let n = write_image_folder(&data, 2, 4, 24);
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/slurm/stokerd-job.sh");
    let job = |cmd: &mut Command| {
        cmd.env("SLURM_JOB_ID", "777")
            .env("TMPDIR", tmp.path())
            .env("STOKERD", stoker_testkit::stokerd_path());
    };
    let mut print = Command::new("bash");
    print.arg(&script).arg("--print-socket");
    job(&mut print);
    let out = print.output().unwrap();
    assert!(out.status.success());
    let socket = PathBuf::from(String::from_utf8(out.stdout).unwrap().trim());
    let folder = tmp.path().join("stoker-job-777");
    assert_eq!(socket, folder.join("stoker.sock"));

    let mut step = Command::new("bash");
    step.arg(&script).stderr(Stdio::null());
    job(&mut step);
    let mut step = step.spawn().unwrap();
    // A rank may start first: attach retries until the daemon listens.
    let opts = AttachOptions {
        connect_timeout: PATIENCE,
        ..AttachOptions::new("slurm", data.to_str().unwrap(), spec(2, 1))
    };
    let mut client = Client::attach(&socket, opts).unwrap();
    let mut samples = 0;
    while let Some(b) = client.next_batch().unwrap() {
        samples += b.n();
    }
    assert_eq!(samples, n);
    drop(client);
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&folder).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "the job's folder is private");

    // Slurm ends the step.
    let pid = step.id() as libc::pid_t;
    // SAFETY: kill(2) on our own child's pid.
    let sent = unsafe { libc::kill(pid, libc::SIGTERM) };
    assert_eq!(sent, 0);
    let status = step.wait().unwrap();
    assert!(status.success(), "{status}");
    assert!(!folder.exists(), "the job's folder is removed");
}
