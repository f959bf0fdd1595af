//! Bad data and bad bytes: the edge corpus with real photos, oversized files, malformed
//! messages on the socket.

use super::*;
use stoker_testkit::tiny_dataset;
use stoker_testkit::wire::raw_attach;

fn options(data: &str, job: &str, rank: u32, world: u32, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (rank, world), 77, spec)
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
        policy: stoker_pipeline::engine::BadSamplePolicy::Fail,
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
        device: stoker::Device::Cpu,
        spec: spec(2, 8, None),
        dataset: data_s.clone(),
        seed: 1,
        start: Position::default(),
        offset: None,
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
            if *what == "wrong version" {
                // The refusal comes in the sender's own version (ERROR reads the same in
                // every version: ipc/wire/src/protocol/version.rs), so a client of that version reads it.
                assert_eq!(buf[2..4], [99, 0], "{what}: answered in another version");
                buf[2..4].copy_from_slice(&stoker::protocol::PROTOCOL_VERSION.to_le_bytes());
            }
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
