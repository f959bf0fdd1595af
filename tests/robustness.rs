//! Never break a training run: bad data, crashes on either side, exact resume, hostile
//! clients. Real `stokerd` processes, real sockets, real files.

use std::collections::{BTreeMap, BTreeSet};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use stoker::protocol::{
    Attach, Attached, Message, Ready, Release, StartPosition, MAX_MESSAGE_BYTES,
};
use stoker::sock::SeqPacket;
use stoker::{AttachOptions, Client, ClientError, DType, ErrorCode, PipelineSpec, SampleStatus};
use stoker_daemon::decode::Limits;
use stoker_daemon::pipeline::{
    Engine, EngineConfig, FeedEvent, HeapRing, Job, Position, SlotMemory,
};
use stoker_daemon::source::index::{Dataset, OpenOptions};
use stoker_testkit::batches::{drain, got, write_config, Got};
use stoker_testkit::child::{self, OTHER_UID};
use stoker_testkit::{write_image_folder, Daemon};

use stoker_testkit::edge_manifest;

use edge_manifest::Expected;

fn spec(batch: u32, side: u32, epochs: Option<u32>) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs,
        ..PipelineSpec::train(batch, side)
    }
}

fn options(data: &str, job: &str, rank: u32, world: u32, spec: PipelineSpec) -> AttachOptions {
    AttachOptions {
        rank,
        world_size: world,
        seed: 77,
        connect_timeout: Duration::ZERO,
        ..AttachOptions::new(job, data, spec)
    }
}

fn tiny_dataset(dir: &Path, classes: u32, per_class: u32) -> PathBuf {
    let data = dir.join("data");
    write_image_folder(&data, classes, per_class, 20);
    data
}

/// The daemon log with ANSI colour codes removed.
fn read_log(path: &Path) -> String {
    let raw = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::with_capacity(raw.len());
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            for d in chars.by_ref() {
                if d.is_ascii_alphabetic() {
                    break;
                }
            }
        } else {
            out.push(c);
        }
    }
    out
}

// ---------------------------------------------------------------------------------------
// Bad samples: the edge corpus plus real photos, two epochs, four ranks.

fn shared_data() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data");
    if dir.join("edge/MANIFEST.tsv").is_file() && dir.join("photos").is_dir() {
        Some(dir.canonicalize().unwrap())
    } else {
        eprintln!(
            "SKIP edge_and_photos_serve_two_epochs_to_four_ranks_bit_identically: no {} \
             (edge/MANIFEST.tsv and photos/)",
            dir.display()
        );
        None
    }
}

/// Serves the file list for two epochs to four ranks; returns every rank's batches and the
/// daemon's log.
fn serve_list(list: &Path, dir: &Path, spec: &PipelineSpec) -> (Vec<Vec<Got>>, String) {
    let config = write_config(dir, "[limits]\nlog_bad_samples_per_second = 100000\n");
    let log = dir.join("stokerd.log");
    let daemon = Daemon::start_logged(
        dir,
        &["--threads", "2", "--config", config.to_str().unwrap()],
        &log,
    );
    let socket = daemon.socket().to_owned();
    let handles: Vec<_> = (0..4)
        .map(|rank| {
            let (socket, list, spec) = (socket.clone(), list.to_owned(), spec.clone());
            std::thread::spawn(move || {
                let o = options(list.to_str().unwrap(), "edge", rank, 4, spec);
                let mut c = Client::attach(&socket, o).unwrap();
                drain(&mut c)
            })
        })
        .collect();
    let ranks = handles.into_iter().map(|h| h.join().unwrap()).collect();
    drop(daemon);
    (ranks, read_log(&log))
}

#[test]
fn edge_and_photos_serve_two_epochs_to_four_ranks_bit_identically() {
    let Some(shared) = shared_data() else {
        return;
    };
    let edge = shared.join("edge");
    let manifest: Vec<(PathBuf, Expected)> = edge_manifest::read(&edge)
        .into_iter()
        .map(|(name, e)| (edge.join(name), e))
        .collect();
    let mut photos: Vec<PathBuf> = std::fs::read_dir(shared.join("photos"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_file())
        .collect();
    photos.sort();
    let dir = tempfile::tempdir().unwrap();
    // A file list pointing at the shared files: nothing is copied.
    let mut list = String::new();
    let mut files: Vec<(PathBuf, Expected)> = manifest.clone();
    files.extend(photos.iter().map(|p| (p.clone(), Expected::DecodeOk)));
    for (i, (p, _)) in files.iter().enumerate() {
        let label = if i < manifest.len() { 0 } else { 1 };
        list.push_str(&format!("{}\t{label}\n", p.display()));
    }
    let list_path = dir.path().join("edge+photos.tsv");
    std::fs::write(&list_path, list).unwrap();
    let spec = spec(16, 32, Some(2));

    let t0 = Instant::now();
    let run1 = dir.path().join("run1");
    std::fs::create_dir_all(&run1).unwrap();
    let (ranks, log) = serve_list(&list_path, &run1, &spec);
    eprintln!("first run: {:.1} s", t0.elapsed().as_secs_f64());

    // Which index is which file: the dataset's own order.
    let dataset = Dataset::open(&list_path, &OpenOptions::default()).unwrap();
    let index_of: BTreeMap<String, u64> = (0..dataset.len())
        .map(|i| (dataset.sample(i).path.display().to_string(), i as u64))
        .collect();
    let expected_of: BTreeMap<u64, Expected> = files
        .iter()
        .map(|(p, e)| (index_of[&p.display().to_string()], *e))
        .collect();

    // Every decode-OK file appears decoded (status Ok) in each epoch; no must-reject file does.
    for epoch in 0..2 {
        let mut ok: BTreeSet<u64> = BTreeSet::new();
        let mut replaced = 0;
        for r in &ranks {
            for g in r.iter().filter(|g| g.epoch == epoch) {
                for (i, &s) in g.status.iter().enumerate() {
                    if s == SampleStatus::Ok as u8 {
                        ok.insert(g.indices[i]);
                    } else if s == SampleStatus::Replaced as u8 {
                        replaced += 1;
                    } else {
                        assert_eq!(s, SampleStatus::Empty as u8, "epoch {epoch}: status {s}");
                    }
                }
            }
        }
        for (&i, &e) in &expected_of {
            let name = dataset.display_name(i as usize);
            match e {
                Expected::DecodeOk => {
                    assert!(
                        ok.contains(&i),
                        "epoch {epoch}: decode-OK {name} not decoded"
                    )
                }
                Expected::MustReject => {
                    assert!(
                        !ok.contains(&i),
                        "epoch {epoch}: must-reject {name} decoded"
                    )
                }
                Expected::MayReject => {}
            }
        }
        let must = expected_of
            .values()
            .filter(|e| **e == Expected::MustReject)
            .count();
        assert!(
            replaced >= must,
            "epoch {epoch}: {replaced} replaced < {must} must-reject files"
        );
    }

    // Every must-reject file is reported once in the log with its path and a reason; no
    // decode-OK file is.
    let mut logged: BTreeMap<String, String> = BTreeMap::new();
    for line in log.lines().filter(|l| l.contains("bad sample ")) {
        let Some(rest) = line.split_once("sample=").map(|x| x.1) else {
            continue;
        };
        let (path, rest) = rest.split_once(" reason=").expect("reason after sample");
        let reason = rest.split_whitespace().next().unwrap().to_owned();
        assert!(
            logged.insert(path.to_owned(), reason).is_none(),
            "{path} logged twice"
        );
    }
    let mut by_reason: BTreeMap<String, usize> = BTreeMap::new();
    let mut by_category: BTreeMap<String, usize> = BTreeMap::new();
    for (p, e) in &files {
        let key = p.display().to_string();
        match (e, logged.get(&key)) {
            (Expected::MustReject, None) => panic!("must-reject {key} was not reported"),
            (Expected::DecodeOk, Some(r)) => panic!("decode-OK {key} was reported: {r}"),
            (_, Some(r)) => {
                *by_reason.entry(r.clone()).or_default() += 1;
                *by_category.entry(format!("{e:?}/{r}")).or_default() += 1;
            }
            _ => {}
        }
    }
    assert_eq!(logged.len(), by_reason.values().sum::<usize>());
    eprintln!("bad files by reason: {by_reason:?}");
    eprintln!("bad files by manifest category/reason: {by_category:?}");
    // Files outside the manifest's rejection categories carry no reason: reasons per
    // category add up to the rejected files of that category.
    let must = files
        .iter()
        .filter(|(_, e)| *e == Expected::MustReject)
        .count();
    let must_logged: usize = by_category
        .iter()
        .filter(|(k, _)| k.starts_with("MustReject/"))
        .map(|(_, n)| n)
        .sum();
    assert_eq!(must_logged, must);

    // A second run yields bit-identical batches.
    let run2 = dir.path().join("run2");
    std::fs::create_dir_all(&run2).unwrap();
    let (again, _) = serve_list(&list_path, &run2, &spec);
    for (r, (a, b)) in ranks.iter().zip(&again).enumerate() {
        assert_eq!(a.len(), b.len(), "rank {r}");
        for (x, y) in a.iter().zip(b) {
            assert_eq!(
                (x.epoch, x.step, x.hash),
                (y.epoch, y.step, y.hash),
                "rank {r} differs"
            );
        }
    }
}

#[test]
fn oversized_files_are_bad_samples_counted_by_reason_without_being_read() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 2, 3);
    let dataset = Arc::new(Dataset::open(&data, &OpenOptions::default()).unwrap());
    let spec = spec(2, 8, Some(1));
    let job = Job::new(dataset, spec.clone(), 1, 1).unwrap();
    let engine = Engine::new(EngineConfig {
        threads: 1,
        limits: Limits {
            max_pixels: 1 << 20,
            max_file_bytes: 16,
        },
        policy: stoker_daemon::pipeline::BadSamplePolicy::Fail,
        ..EngineConfig::default()
    })
    .unwrap();
    let ring = Arc::new(HeapRing::new(&spec, 2));
    let feed = engine
        .start_feed(job, 0, ring.clone(), Position::default())
        .unwrap();
    let mut failed = 0;
    while let FeedEvent::Ready(r) = feed.recv().unwrap() {
        let l = ring.layout().slot;
        failed += ring.host_of(r.slot)[l.status..l.status + r.n]
            .iter()
            .filter(|&&s| s == SampleStatus::Failed as u8)
            .count();
        feed.release(r.slot, r.generation).unwrap();
    }
    assert_eq!(failed, 6);
    assert_eq!(
        engine.bad_by_reason(),
        BTreeMap::from([("file_too_large", 6)])
    );
    assert_eq!(engine.stats().bytes_read, 0, "an oversized file was read");
}

// ---------------------------------------------------------------------------------------
// Crash safety.

#[test]
fn a_sigkilled_daemon_restarts_and_resumed_batches_equal_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 4, 6); // 24 samples; world 2, batch 2: 6 steps
    let data = data.to_str().unwrap().to_owned();
    let spec = spec(2, 16, Some(2));

    // The uninterrupted run.
    let reference: Vec<Vec<Got>> = {
        let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
        (0..2)
            .map(|r| {
                let mut c =
                    Client::attach(daemon.socket(), options(&data, "crash", r, 2, spec.clone()))
                        .unwrap();
                drain(&mut c)
            })
            .collect()
    };
    assert_eq!(reference[0].len(), 12);

    // The run with a SIGKILL mid-epoch: rank 0 has had 4 batches, rank 1 has had 7.
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let socket = daemon.socket().to_owned();
    let mut clients: Vec<Client> = (0..2)
        .map(|r| {
            let mut o = options(&data, "crash", r, 2, spec.clone());
            o.spec.epochs = Some(2);
            Client::attach(&socket, o).unwrap()
        })
        .collect();
    let mut seen: Vec<Vec<Got>> = vec![Vec::new(), Vec::new()];
    for (r, want) in [(0usize, 4), (1, 7)] {
        for _ in 0..want {
            let b = clients[r].next_batch().unwrap().unwrap();
            seen[r].push(got(&b));
        }
    }
    drop(daemon); // SIGKILL
    for c in &mut clients {
        let err = loop {
            match c.next_batch() {
                Ok(Some(_)) => continue, // already published before the kill: not counted
                Ok(None) => panic!("data ended instead of an error"),
                Err(e) => break e,
            }
        };
        assert!(err.is_disconnected(), "{err}");
    }
    let positions: Vec<StartPosition> = seen
        .iter()
        .map(|s| {
            let last = s.last().unwrap();
            if last.step + 1 == 6 {
                StartPosition::at(last.epoch + 1, 0)
            } else {
                StartPosition::at(last.epoch, last.step + 1)
            }
        })
        .collect();
    assert_eq!(positions[0], StartPosition::at(0, 4));
    assert_eq!(positions[1], StartPosition::at(1, 1));

    // systemd restarts the daemon a little later; the clients retry meanwhile.
    let restart_dir = dir.path().to_owned();
    let restarter = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(400));
        Daemon::start(&restart_dir, &["--threads", "2"])
    });
    let resumed: Vec<_> = (0..2u32)
        .map(|r| {
            let (socket, data, spec) = (socket.clone(), data.clone(), spec.clone());
            let start = positions[r as usize];
            std::thread::spawn(move || {
                let mut o = options(&data, "crash", r, 2, spec);
                o.start = start;
                o.connect_timeout = Duration::from_secs(20);
                let t = Instant::now();
                let mut c = Client::attach(&socket, o).unwrap();
                (t.elapsed(), drain(&mut c))
            })
        })
        .collect();
    let resumed: Vec<(Duration, Vec<Got>)> =
        resumed.into_iter().map(|h| h.join().unwrap()).collect();
    let _daemon = restarter.join().unwrap();
    assert!(
        resumed[0].0 >= Duration::from_millis(200),
        "attach did not wait for the restart"
    );
    for r in 0..2 {
        let mut all = seen[r].clone();
        all.extend(resumed[r].1.iter().cloned());
        let a: Vec<(u64, u64, u64)> = all.iter().map(|g| (g.epoch, g.step, g.hash)).collect();
        let b: Vec<(u64, u64, u64)> = reference[r]
            .iter()
            .map(|g| (g.epoch, g.step, g.hash))
            .collect();
        assert_eq!(
            a, b,
            "rank {r}: resumed run differs from the uninterrupted one"
        );
    }
}

#[test]
fn attach_retries_until_its_timeout_then_says_no_daemon() {
    let dir = tempfile::tempdir().unwrap();
    let mut o = options("/nowhere", "j", 0, 1, spec(2, 8, Some(1)));
    o.connect_timeout = Duration::from_millis(300);
    let t = Instant::now();
    let err = Client::attach(&dir.path().join("none.sock"), o).unwrap_err();
    assert!(matches!(err, ClientError::NoDaemon(_)), "{err}");
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(3));
}

#[test]
fn a_thousand_attach_detach_cycles_leak_no_fds_rings_or_memory() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 4);
    let data = data.to_str().unwrap().to_owned();
    let daemon = Daemon::start(dir.path(), &["--threads", "1", "--slots", "2"]);
    let spec = spec(2, 8, None);
    // A new job each cycle: the job registry is cleaned up too.
    let cycle = |i: usize| {
        let job = format!("cycle-{i}");
        let mut c =
            Client::attach(daemon.socket(), options(&data, &job, 0, 1, spec.clone())).unwrap();
        if i.is_multiple_of(3) {
            // Leave holding a lease now and then: the daemon reclaims it.
            let b = c.next_batch().unwrap().unwrap();
            std::mem::forget(b);
        }
    };
    let settle = |want_rings: usize| {
        let deadline = Instant::now() + Duration::from_secs(5);
        while daemon.ring_count() != want_rings && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(20));
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    for i in 0..50 {
        cycle(i);
    }
    settle(0);
    let (fds0, rss0) = (daemon.fd_count(), daemon.rss_kib());
    assert_eq!(daemon.ring_count(), 0);
    let t = Instant::now();
    for i in 0..1000 {
        cycle(i);
    }
    settle(0);
    let (fds1, rss1) = (daemon.fd_count(), daemon.rss_kib());
    eprintln!(
        "1000 cycles in {:.1} s: fds {fds0} -> {fds1}, rss {rss0} -> {rss1} KiB",
        t.elapsed().as_secs_f64()
    );
    assert_eq!(daemon.ring_count(), 0, "rings left open");
    assert_eq!(fds1, fds0, "fd count changed");
    assert!(
        rss1 < rss0 + rss0 / 5 + 4096,
        "RSS grew from {rss0} to {rss1} KiB"
    );
}

// ---------------------------------------------------------------------------------------
// Access control.

#[test]
fn a_client_outside_the_allowed_uids_and_gids_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 2);
    // SAFETY: getuid/getgid cannot fail.
    let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
    let other = if uid == 4242 { 4343 } else { 4242 };
    let config = write_config(
        dir.path(),
        &format!("[access]\nallowed_uids = [{other}]\nallowed_gids = [{other}]\n"),
    );
    let daemon = Daemon::start(dir.path(), &["--config", config.to_str().unwrap()]);
    let err = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), "j", 0, 1, spec(2, 8, Some(1))),
    )
    .unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    let msg = err.to_string();
    assert!(msg.contains(&format!("uid {uid}")), "{msg}");
    assert!(msg.contains(&format!("allowed uids [{other}]")), "{msg}");
    drop(daemon);

    // Our group is allowed: accepted.
    let dir2 = tempfile::tempdir().unwrap();
    let config = write_config(
        dir2.path(),
        &format!("[access]\nallowed_uids = [{other}]\nallowed_gids = [{gid}]\n"),
    );
    let daemon = Daemon::start(dir2.path(), &["--config", config.to_str().unwrap()]);
    let mut c = Client::attach(
        daemon.socket(),
        options(data.to_str().unwrap(), "j", 0, 1, spec(2, 8, Some(1))),
    )
    .unwrap();
    assert!(c.next_batch().unwrap().is_some());
}

#[test]
fn dataset_paths_escaping_the_roots_are_refused_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    write_image_folder(&root.join("inside"), 1, 2, 16);
    write_image_folder(&outside, 1, 2, 16);
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    // A file list inside the root naming a file outside it.
    let outside_file = outside.join("c0/img000.jpg");
    std::fs::write(
        root.join("list.tsv"),
        format!("{}\t0\n", outside_file.display()),
    )
    .unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[access]\ndataset_roots = [\"{}\"]\n[datasets]\nregistered = \"{}\"\n",
            root.display(),
            outside.display()
        ),
    );
    let daemon = Daemon::start(dir.path(), &["--config", config.to_str().unwrap()]);
    let attach = |name: &str| {
        Client::attach(
            daemon.socket(),
            options(name, "j", 0, 1, spec(2, 8, Some(1))),
        )
    };
    let refused = |name: &str, rule: &str| {
        let err = attach(name).expect_err(name);
        assert_eq!(
            err.code(),
            Some(ErrorCode::PermissionDenied),
            "{name}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(name), "{msg} does not name {name}");
        assert!(msg.contains(rule), "{msg} does not say {rule:?}");
    };
    refused(
        &format!("{}/inside/../../outside", root.display()),
        "'..' components",
    );
    refused(
        outside.to_str().unwrap(),
        "absolute path outside the allowed roots",
    );
    refused("/etc", "absolute path outside the allowed roots");
    refused(
        root.join("escape").to_str().unwrap(),
        "through a symlink, leaving the root",
    );
    refused(
        root.join("list.tsv").to_str().unwrap(),
        "outside the allowed roots",
    );
    refused("relative/path", "not an absolute path");
    // Allowed: a path under the root, and a registered name.
    let mut c = attach(root.join("inside").to_str().unwrap()).unwrap();
    assert!(c.next_batch().unwrap().is_some());
    drop(c);
    let mut c = attach("registered").unwrap();
    assert!(c.next_batch().unwrap().is_some());
}

#[test]
fn ring_requests_over_the_quotas_and_limits_are_refused_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 4);
    let data = data.to_str().unwrap().to_owned();
    let config = write_config(
        dir.path(),
        "[limits]\nmax_client_ring_bytes = 1000000\nmax_job_ring_bytes = 1000000\n\
         max_clients = 2\nmax_jobs = 2\n",
    );
    let daemon = Daemon::start(
        dir.path(),
        &["--config", config.to_str().unwrap(), "--slots", "2"],
    );
    // 2 slots x 8 images of 256x256x3 bytes: about 3 MB.
    let big = spec(8, 256, None);
    let err = Client::attach(daemon.socket(), options(&data, "big", 0, 1, big)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("max_client_ring_bytes") && msg.contains("1000000 bytes"),
        "{msg}"
    );
    // Within the quota: accepted; two jobs at most, two clients at most.
    let small = spec(2, 8, None);
    let _a = Client::attach(daemon.socket(), options(&data, "a", 0, 1, small.clone())).unwrap();
    let _b = Client::attach(daemon.socket(), options(&data, "b", 0, 2, small.clone())).unwrap();
    let err =
        Client::attach(daemon.socket(), options(&data, "c", 0, 1, small.clone())).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    assert!(err.to_string().contains("max_jobs"), "{err}");
    let err =
        Client::attach(daemon.socket(), options(&data, "b", 1, 2, small.clone())).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    assert!(err.to_string().contains("max_clients"), "{err}");
    // Quotas are given back on detach.
    drop(_b);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match Client::attach(daemon.socket(), options(&data, "c", 0, 1, small.clone())) {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("quota not given back: {e}"),
        }
    }
}

fn raw_attach(socket: &Path, a: &Attach) -> (SeqPacket, Option<OwnedFd>, Message) {
    let s = SeqPacket::connect(socket).unwrap();
    s.send(&Message::Attach(Box::new(a.clone())).encode().unwrap(), &[])
        .unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = s.recv(&mut buf).unwrap().unwrap();
    let msg = Message::decode(&buf[..r.len]).unwrap();
    (s, r.fds.into_iter().next(), msg)
}

fn inode(fd: &OwnedFd) -> (u64, u64) {
    // SAFETY: fstat on a valid fd into a zeroed stat.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: as above.
    assert_eq!(unsafe { libc::fstat(fd.as_raw_fd(), &mut st) }, 0);
    (st.st_dev, st.st_ino)
}

/// Every fd that arrives on `s` until the daemon closes it (or 300 ms of silence).
fn fds_until_closed(s: &SeqPacket) -> Vec<OwnedFd> {
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let _ = s.set_read_timeout(Some(Duration::from_millis(300)));
    let mut fds = Vec::new();
    while let Ok(Some(r)) = s.recv(&mut buf) {
        fds.extend(r.fds);
    }
    fds
}

#[test]
fn a_second_connection_cannot_obtain_the_first_ones_ring() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 4);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let a = Attach {
        job: "j".into(),
        rank: 0,
        world_size: 2,
        device: "cpu".into(),
        spec: spec(2, 8, None),
        dataset: data.to_str().unwrap().into(),
        seed: 1,
        start: StartPosition::default(),
    };
    let (_first, fd, msg) = raw_attach(daemon.socket(), &a);
    assert!(matches!(msg, Message::Attached(_)));
    let theirs = inode(&fd.expect("ring fd"));

    let attached = Attached {
        slots: 4,
        slot_bytes: 1,
        ring_bytes: 1,
        steps_per_epoch: 1,
        offset_epoch_steps: None,
        dataset_len: 1,
        classes: 1,
        ranks_attached: 1,
        created_job: false,
        daemon_version: "x".into(),
        accepts_stats: false,
        ..Attached::default()
    };
    let mut probes: Vec<Vec<u8>> = [
        Message::Attach(Box::new(a.clone())), // the same rank: RANK_TAKEN
        Message::Release(Release {
            slot: 0,
            generation: 1,
        }),
        Message::Ready(Ready {
            slot: 0,
            generation: 1,
            epoch: 0,
            step: 0,
            n: 2,
        }),
        Message::Attached(attached),
        Message::Detach,
        Message::EndOfData,
        Message::error(ErrorCode::Internal, "x"),
    ]
    .iter()
    .map(|m| m.encode().unwrap())
    .collect();
    probes.push(b"garbage".to_vec());
    for bytes in &probes {
        let s = SeqPacket::connect(daemon.socket()).unwrap();
        s.send(bytes, &[]).unwrap();
        for fd in fds_until_closed(&s) {
            assert_ne!(
                inode(&fd),
                theirs,
                "a second connection got the first one's ring"
            );
        }
    }
    // Attached as the other rank, then asking for the first rank's slots: its own ring only.
    let mut b = a.clone();
    b.rank = 1;
    let (s, fd, msg) = raw_attach(daemon.socket(), &b);
    assert!(matches!(msg, Message::Attached(_)));
    assert_ne!(inode(&fd.unwrap()), theirs);
    s.send(
        &Message::Release(Release {
            slot: 0,
            generation: 1,
        })
        .encode()
        .unwrap(),
        &[],
    )
    .unwrap();
    for fd in fds_until_closed(&s) {
        assert_ne!(inode(&fd), theirs);
    }
}

#[test]
fn malformed_messages_close_only_their_connection_while_a_client_keeps_receiving() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 2, 4);
    let data_s = data.to_str().unwrap().to_owned();
    let mut daemon = Daemon::start(dir.path(), &["--threads", "1", "--slots", "2"]);
    let socket = daemon.socket().to_owned();

    // The concurrent client: endless epochs, counts batches until told to stop.
    let stop = Arc::new(AtomicBool::new(false));
    let received = Arc::new(AtomicU64::new(0));
    let good = {
        let (stop, received, socket, data) = (
            stop.clone(),
            received.clone(),
            socket.clone(),
            data_s.clone(),
        );
        std::thread::spawn(move || {
            let mut c =
                Client::attach(&socket, options(&data, "good", 0, 1, spec(2, 8, None))).unwrap();
            while !stop.load(Ordering::Relaxed) {
                let b = c.next_batch().unwrap().unwrap();
                assert!(b.status().iter().all(|&s| s == SampleStatus::Ok as u8));
                received.fetch_add(1, Ordering::Relaxed);
            }
        })
    };
    let wait_progress = |what: &str| {
        let before = received.load(Ordering::Relaxed);
        let deadline = Instant::now() + Duration::from_secs(10);
        while received.load(Ordering::Relaxed) < before + 3 {
            assert!(
                Instant::now() < deadline,
                "good client stalled after {what}"
            );
            std::thread::sleep(Duration::from_millis(5));
        }
    };
    wait_progress("start");

    let attach = Attach {
        job: "bad".into(),
        rank: 0,
        world_size: 1,
        device: "cpu".into(),
        spec: spec(2, 8, None),
        dataset: data_s.clone(),
        seed: 1,
        start: StartPosition::default(),
    };
    let valid = Message::Attach(Box::new(attach.clone())).encode().unwrap();
    let mut wrong_version = valid.clone();
    wrong_version[2] = 99;
    let truncated = valid[..valid.len() / 2].to_vec();
    let oversized = vec![b'S'; MAX_MESSAGE_BYTES + 4096];
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("garbage", b"\x00\xffnot stoker at all".to_vec()),
        ("oversized", oversized),
        ("truncated", truncated),
        ("wrong version", wrong_version),
        ("empty", Vec::new()),
    ];
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    for (what, bytes) in &cases {
        let s = SeqPacket::connect(&socket).unwrap();
        s.send(bytes, &[]).unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let r = s.recv(&mut buf).unwrap();
        if let Some(r) = r {
            match Message::decode(&buf[..r.len]).unwrap() {
                Message::Error(e) => assert_ne!(e.code, ErrorCode::Internal, "{what}"),
                other => panic!("{what}: expected ERROR, got {other:?}"),
            }
            assert!(
                s.recv(&mut buf).unwrap().is_none(),
                "{what}: connection left open"
            );
        }
        wait_progress(what);
    }
    // The same after a good attach: garbage, oversized, truncated, an fd passed along.
    let after: Vec<(&str, Vec<u8>)> = vec![
        ("garbage after attach", b"garbage".to_vec()),
        ("oversized after attach", vec![0u8; MAX_MESSAGE_BYTES * 2]),
        ("truncated release", {
            let r = Message::Release(Release {
                slot: 0,
                generation: 1,
            })
            .encode()
            .unwrap();
            r[..r.len() - 3].to_vec()
        }),
        ("release of a slot never leased", {
            Message::Release(Release {
                slot: 1,
                generation: 99,
            })
            .encode()
            .unwrap()
        }),
    ];
    for (i, (what, bytes)) in after.iter().enumerate() {
        let mut a = attach.clone();
        a.job = format!("bad{i}");
        let (s, _fd, msg) = raw_attach(&socket, &a);
        assert!(matches!(msg, Message::Attached(_)), "{what}");
        s.send(bytes, &[]).unwrap();
        let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
        let mut saw_error = false;
        while let Some(r) = s.recv(&mut buf).unwrap() {
            if let Ok(Message::Error(_)) = Message::decode(&buf[..r.len]) {
                saw_error = true;
            }
        }
        assert!(saw_error, "{what}: no ERROR before the close");
        wait_progress(what);
    }
    // An fd smuggled into a message.
    {
        let s = SeqPacket::connect(&socket).unwrap();
        let devnull = std::fs::File::open("/dev/null").unwrap();
        use std::os::fd::AsFd;
        s.send(&valid, &[devnull.as_fd()]).unwrap();
        let r = s.recv(&mut buf).unwrap().unwrap();
        assert!(matches!(
            Message::decode(&buf[..r.len]).unwrap(),
            Message::Error(_)
        ));
        wait_progress("fd passed");
    }
    assert!(daemon.is_running());
    stop.store(true, Ordering::Relaxed);
    good.join().unwrap();
}

/// Set in the child process of `a_process_of_another_uid_is_refused_by_its_credentials`: the
/// socket to attach to.
const UID_CHILD_ENV: &str = "STOKER_TEST_UID_CHILD";

/// Not a test on its own: the client process, running as another uid, that the credential
/// test starts. Without the variable it does nothing.
#[test]
fn child_attaches_as_another_uid() {
    let Some(socket) = std::env::var_os(UID_CHILD_ENV) else {
        return;
    };
    let err = Client::attach(
        Path::new(&socket),
        options("/nowhere", "j", 0, 1, spec(2, 8, Some(1))),
    )
    .expect_err("a process of another uid was let in");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    assert!(
        err.to_string().contains(&format!("uid {OTHER_UID}")),
        "{err}"
    );
    println!("refused as expected: {err}");
}

#[test]
fn a_process_of_another_uid_is_refused_by_its_credentials() {
    use std::os::unix::fs::PermissionsExt;
    if !child::can_run_as_other_uid("a_process_of_another_uid_is_refused_by_its_credentials") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The default rules: the daemon's own uid (root) only.
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    // Let the other uid reach the socket, so that only the credential check stands.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = child::rerun_test("child_attaches_as_another_uid", "attach", |cmd| {
        child::as_other_uid(cmd.env(UID_CHILD_ENV, daemon.socket()));
    });
    let text = child::output_text(&out);
    assert!(text.contains("refused as expected"), "{text}");
}
