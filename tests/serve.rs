//! The real `stokerd` on a temp socket, real JPEG files, real clients.

use std::collections::BTreeSet;
use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker::protocol::{Attach, ErrorCode, Message, StartPosition, MAX_MESSAGE_BYTES};
use stoker::sock::SeqPacket;
use stoker::{AttachOptions, Client, ClientError, DType, PipelineSpec, SampleStatus};
use stoker_daemon::pipeline::{Engine, EngineConfig, FeedEvent, HeapRing, Job, Position};
use stoker_daemon::source::index::{Dataset, OpenOptions};
use stoker_testkit::{write_image_folder, Daemon};

/// u8 output keeps the rings small; one epoch so the data ends.
fn spec(batch: u32) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        ..PipelineSpec::train(batch, 16)
    }
}

fn options(data: &Path, job: &str, rank: u32, world: u32, batch: u32) -> AttachOptions {
    AttachOptions {
        rank,
        world_size: world,
        seed: 1234,
        ..AttachOptions::new(job, data.to_str().unwrap(), spec(batch))
    }
}

struct Seen {
    epoch: u64,
    step: u64,
    indices: Vec<u64>,
    labels: Vec<i64>,
    images: Vec<u8>,
}

fn drain(client: &mut Client) -> Vec<Seen> {
    let mut out = Vec::new();
    while let Some(b) = client.next_batch().unwrap() {
        assert!(b.status().iter().all(|&s| s == SampleStatus::Ok as u8));
        out.push(Seen {
            epoch: b.epoch(),
            step: b.step(),
            indices: b.indices().to_vec(),
            labels: b.labels().to_vec(),
            images: b.images().to_vec(),
        });
    }
    out
}

fn setup(classes: u32, per_class: u32) -> (tempfile::TempDir, std::path::PathBuf, usize) {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = write_image_folder(&data, classes, per_class, 24);
    (dir, data, n)
}

#[test]
fn one_rank_receives_the_whole_epoch_in_order() {
    let (dir, data, n) = setup(3, 5);
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "3"]);
    let mut client = Client::attach(daemon.socket(), options(&data, "one", 0, 1, 4)).unwrap();
    let info = client.attached().clone();
    assert_eq!(info.dataset_len, n as u64);
    assert_eq!(info.classes, 3);
    assert_eq!(info.steps_per_epoch, 4); // ceil(15 / 4)
    assert_eq!(info.slots, 3);
    assert!(info.created_job);
    let seen = drain(&mut client);
    assert_eq!(seen.len(), 4);
    for (i, s) in seen.iter().enumerate() {
        assert_eq!((s.epoch, s.step), (0, i as u64));
        assert_eq!(s.images.len(), s.indices.len() * 16 * 16 * 3);
        assert!(s.labels.iter().all(|&l| (0..3).contains(&l)));
    }
    let mut all: Vec<u64> = seen.iter().flat_map(|s| s.indices.clone()).collect();
    assert_eq!(all.len(), n);
    all.sort_unstable();
    assert_eq!(all, (0..n as u64).collect::<Vec<_>>());
    // Five images per class.
    let labels: Vec<i64> = seen.iter().flat_map(|s| s.labels.clone()).collect();
    for c in 0..3 {
        assert_eq!(labels.iter().filter(|&&l| l == c).count(), 5);
    }
    assert_eq!(client.position(), StartPosition::at(1, 0));
}

#[test]
fn ranks_split_the_permutation_disjointly_and_match_the_in_process_pipeline() {
    let (dir, data, n) = setup(4, 4);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let socket = daemon.socket().to_owned();
    let ranks: Vec<_> = (0..2)
        .map(|r| {
            let (socket, data) = (socket.clone(), data.clone());
            std::thread::spawn(move || {
                let mut c = Client::attach(&socket, options(&data, "two", r, 2, 4)).unwrap();
                drain(&mut c)
            })
        })
        .collect();
    let seen: Vec<Vec<Seen>> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
    let sets: Vec<BTreeSet<u64>> = seen
        .iter()
        .map(|r| r.iter().flat_map(|s| s.indices.clone()).collect())
        .collect();
    assert_eq!(
        sets[0].len() + sets[1].len(),
        n,
        "ranks overlap or lose samples"
    );
    assert!(sets[0].is_disjoint(&sets[1]));
    let union: BTreeSet<u64> = sets[0].union(&sets[1]).copied().collect();
    assert_eq!(union, (0..n as u64).collect());

    // The same rank, in process, yields the same bytes.
    let dataset = Arc::new(Dataset::open(&data, &OpenOptions::default()).unwrap());
    let job = Job::new(dataset, spec(4), 1234, 2).unwrap();
    let engine = Engine::new(EngineConfig {
        threads: 1,
        ..EngineConfig::default()
    })
    .unwrap();
    let ring = Arc::new(HeapRing::new(&spec(4), 2));
    let feed = engine
        .start_feed(job, 1, ring.clone(), Position { epoch: 0, step: 0 })
        .unwrap();
    for s in &seen[1] {
        let FeedEvent::Ready(r) = feed.recv().unwrap() else {
            panic!("in-process feed ended early")
        };
        assert_eq!((r.epoch, r.step), (s.epoch, s.step));
        let slot = ring.images_of(r.slot);
        assert_eq!(
            &slot[..s.images.len()],
            &s.images[..],
            "pixels of step {}",
            s.step
        );
        feed.release(r.slot, r.generation).unwrap();
    }
}

#[test]
fn mismatched_terms_and_taken_ranks_are_refused_by_name() {
    let (dir, data, _) = setup(2, 3);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let _rank0 = Client::attach(daemon.socket(), options(&data, "job", 0, 2, 2)).unwrap();

    let mut other = options(&data, "job", 1, 2, 2);
    other.spec.dtype = DType::F32;
    let err = Client::attach(daemon.socket(), other).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SpecMismatch), "{err}");
    assert!(err.to_string().contains("dtype"), "{err}");

    let mut other = options(&data, "job", 1, 2, 2);
    other.seed = 99;
    let err = Client::attach(daemon.socket(), other).unwrap_err();
    assert!(err.to_string().contains("seed"), "{err}");

    let err = Client::attach(daemon.socket(), options(&data, "job", 0, 2, 2)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::RankTaken), "{err}");

    let err = Client::attach(
        daemon.socket(),
        options(&dir.path().join("missing"), "other", 0, 1, 2),
    )
    .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownDataset), "{err}");

    // The agreeing rank still gets in.
    Client::attach(daemon.socket(), options(&data, "job", 1, 2, 2)).unwrap();
}

#[test]
fn malformed_bytes_close_only_that_connection() {
    let (dir, data, _) = setup(2, 3);
    let mut daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let mut good = Client::attach(daemon.socket(), options(&data, "j", 0, 1, 2)).unwrap();

    let raw = SeqPacket::connect(daemon.socket()).unwrap();
    raw.send(b"this is not a stoker message", &[]).unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = raw.recv(&mut buf).unwrap().expect("an error message");
    match Message::decode(&buf[..r.len]).unwrap() {
        Message::Error(e) => assert_eq!(e.code, ErrorCode::BadMessage),
        other => panic!("expected ERROR, got {other:?}"),
    }
    assert!(
        raw.recv(&mut buf).unwrap().is_none(),
        "connection stays open"
    );

    assert!(daemon.is_running());
    assert!(good.next_batch().unwrap().is_some());
}

/// Attaches with raw messages, so the "client" can vanish without releasing or detaching,
/// as a SIGKILLed process does.
fn raw_attach(socket: &Path, a: Attach) -> (SeqPacket, OwnedFd) {
    let s = SeqPacket::connect(socket).unwrap();
    s.send(&Message::Attach(Box::new(a)).encode().unwrap(), &[])
        .unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = s.recv(&mut buf).unwrap().unwrap();
    assert!(matches!(
        Message::decode(&buf[..r.len]).unwrap(),
        Message::Attached(_)
    ));
    let fd = r.fds.into_iter().next().unwrap();
    (s, fd)
}

#[test]
fn a_vanished_client_loses_its_leases_and_its_rank_resumes() {
    let (dir, data, _) = setup(4, 6); // 24 samples, world 2: 12 per rank, 6 steps of 2
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let mut rank1 = Client::attach(daemon.socket(), options(&data, "k", 1, 2, 2)).unwrap();

    let o = options(&data, "k", 0, 2, 2);
    let attach = Attach {
        job: o.job.clone(),
        rank: 0,
        world_size: 2,
        device: "cpu".into(),
        spec: o.spec.clone(),
        dataset: o.dataset.clone(),
        seed: o.seed,
        start: StartPosition::default(),
    };
    let (sock, ring_fd) = raw_attach(daemon.socket(), attach);
    // Take both slots' READYs and never release them.
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    for _ in 0..2 {
        let r = sock.recv(&mut buf).unwrap().unwrap();
        assert!(matches!(
            Message::decode(&buf[..r.len]).unwrap(),
            Message::Ready(_)
        ));
    }
    drop((sock, ring_fd));

    // Rank 1 goes on regardless.
    let b = rank1.next_batch().unwrap().unwrap();
    assert_eq!(b.step(), 0);
    drop(b);

    // Rank 0 re-attaches at step 2 within a second of vanishing.
    let deadline = Instant::now() + Duration::from_secs(1);
    let mut resumed = loop {
        let mut o = options(&data, "k", 0, 2, 2);
        o.start = StartPosition::at(0, 2);
        match Client::attach(daemon.socket(), o) {
            Ok(c) => break c,
            Err(e) if e.code() == Some(ErrorCode::RankTaken) && Instant::now() < deadline => {
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("re-attach failed: {e}"),
        }
    };
    let rest = drain(&mut resumed);
    assert_eq!(
        rest.iter().map(|s| s.step).collect::<Vec<_>>(),
        vec![2, 3, 4, 5]
    );
    assert_eq!(drain(&mut rank1).len(), 5);
}

#[test]
fn no_daemon_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("stoker.sock");
    let mut o = options(dir.path(), "j", 0, 1, 2);
    o.connect_timeout = Duration::ZERO;
    let err = Client::attach(&path, o).unwrap_err();
    assert!(matches!(err, ClientError::NoDaemon(_)));
    assert_eq!(
        err.to_string(),
        format!("no stoker daemon at {}", path.display())
    );
}

#[test]
fn a_killed_daemon_reads_as_a_closed_connection() {
    let (dir, data, _) = setup(2, 3);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let mut o = options(&data, "j", 0, 1, 2);
    o.spec.epochs = None; // endless, so only the kill can end it
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    drop(daemon);
    let err = loop {
        match c.next_batch() {
            Ok(Some(_)) => continue,
            Ok(None) => panic!("data ended instead of an error"),
            Err(e) => break e,
        }
    };
    assert!(err.is_disconnected(), "{err}");
}

#[test]
fn bad_config_exits_78() {
    let dir = tempfile::tempdir().unwrap();
    let status = std::process::Command::new(stoker_testkit::stokerd_path())
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .args(["--slots", "1"])
        .status()
        .unwrap();
    assert_eq!(status.code(), Some(78));
}

/// Set in the child process of `a_sigkilled_client_process_is_reclaimed_and_its_rank_resumes`:
/// the socket path, the dataset, and a file to create once the child holds its leases.
const CHILD_ENV: &str = "STOKER_TEST_CHILD_CLIENT";

/// Not a test on its own: the client process the SIGKILL test starts (this same test binary,
/// filtered to this function). Without the variable it does nothing.
#[test]
fn child_client_holds_leases() {
    let Some(arg) = std::env::var_os(CHILD_ENV) else {
        return;
    };
    let arg = arg.into_string().unwrap();
    let mut parts = arg.split('\n');
    let (socket, data, ready) = (
        parts.next().unwrap(),
        parts.next().unwrap(),
        parts.next().unwrap(),
    );
    let mut c =
        Client::attach(Path::new(socket), options(Path::new(data), "kill", 0, 2, 2)).unwrap();
    let held: Vec<_> = (0..2).map(|_| c.next_batch().unwrap().unwrap()).collect();
    std::fs::write(ready, format!("holding {}", held.len())).unwrap();
    std::thread::sleep(Duration::from_secs(120));
}

#[test]
fn a_sigkilled_client_process_is_reclaimed_and_its_rank_resumes() {
    let (dir, data, _) = setup(4, 6); // world 2: 6 steps of 2 per rank
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let mut rank1 = Client::attach(daemon.socket(), options(&data, "kill", 1, 2, 2)).unwrap();

    let ready = dir.path().join("child-holds");
    let mut child = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", "child_client_holds_leases", "--test-threads=1"])
        .env(
            CHILD_ENV,
            format!(
                "{}\n{}\n{}",
                daemon.socket().display(),
                data.display(),
                ready.display()
            ),
        )
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(30);
    while !ready.exists() {
        if let Some(status) = child.try_wait().unwrap() {
            panic!("child client exited early: {status}");
        }
        assert!(
            Instant::now() < deadline,
            "child client never held its leases"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let killed = Instant::now();

    // The other rank goes on.
    assert_eq!(rank1.next_batch().unwrap().unwrap().step(), 0);

    // The killed rank re-attaches within a second and resumes at step 2.
    let mut resumed = loop {
        let mut o = options(&data, "kill", 0, 2, 2);
        o.start = StartPosition::at(0, 2);
        match Client::attach(daemon.socket(), o) {
            Ok(c) => break c,
            Err(e) if e.code() == Some(ErrorCode::RankTaken) => {
                assert!(
                    killed.elapsed() < Duration::from_secs(1),
                    "rank not freed in 1 s"
                );
                std::thread::sleep(Duration::from_millis(10))
            }
            Err(e) => panic!("re-attach failed: {e}"),
        }
    };
    let rest = drain(&mut resumed);
    let steps: Vec<u64> = rest.iter().map(|s| s.step).collect();
    assert_eq!(steps, vec![2, 3, 4, 5]);

    // The resumed batches equal an uninterrupted run's from the same step on (batches depend
    // on the job's terms, not its key).
    let mut reference =
        Client::attach(daemon.socket(), options(&data, "kill-ref", 0, 2, 2)).unwrap();
    let whole = drain(&mut reference);
    assert_eq!(whole.len(), 6);
    for (a, b) in rest.iter().zip(&whole[2..]) {
        assert_eq!(a.step, b.step);
        assert_eq!(a.indices, b.indices, "step {}", a.step);
        assert_eq!(a.labels, b.labels, "step {}", a.step);
        assert!(a.images == b.images, "step {}: pixels differ", a.step);
    }
}
