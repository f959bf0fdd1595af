//! One rank, several ranks, refusals, malformed bytes, a missing or killed daemon.

use super::*;

#[test]
fn one_rank_receives_the_whole_epoch_in_order() {
    let (dir, data, n) = temp_image_folder(3, 5);
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "3"]);
    let mut client = Client::attach(daemon.socket(), options(&data, "one", 0, 1, 4)).unwrap();
    let info = client.attached().clone();
    assert_eq!(info.dataset_len, n as u64);
    assert_eq!(info.classes, 3);
    // The class folders' names, in label order (issue 24 item 9).
    assert_eq!(info.class_names, ["c0", "c1", "c2"]);
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
    assert_eq!(client.position(), Position::at(1, 0));
}

#[test]
fn ranks_split_the_permutation_disjointly_and_match_the_in_process_pipeline() {
    let (dir, data, n) = temp_image_folder(4, 4);
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
    let seen: Vec<Vec<HostBatch>> = ranks.into_iter().map(|h| h.join().unwrap()).collect();
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
    let (dir, data, _) = temp_image_folder(2, 3);
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
    let (dir, data, _) = temp_image_folder(2, 3);
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

#[test]
fn malformed_bytes_close_only_that_connection() {
    let (dir, data, _) = temp_image_folder(2, 3);
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
