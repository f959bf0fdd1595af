//! A vanished client, a client process killed with SIGKILL: its rank resumes.

use super::*;
use stoker_testkit::client_process;
use stoker_testkit::wire::raw_attach;

#[test]
fn a_vanished_client_loses_its_leases_and_its_rank_resumes() {
    let (dir, data, _) = temp_image_folder(4, 6); // 24 samples, world 2: 12 per rank, 6 steps of 2
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let mut rank1 = Client::attach(daemon.socket(), options(&data, "k", 1, 2, 2)).unwrap();

    let o = options(&data, "k", 0, 2, 2);
    let attach = Attach {
        job: o.job.clone(),
        rank: 0,
        world_size: 2,
        device: stoker::Device::Cpu,
        spec: o.spec.clone(),
        dataset: o.dataset.clone(),
        seed: o.seed,
        start: Position::default(),
        offset: None,
    };
    let (sock, ring_fd, answer) = raw_attach(daemon.socket(), &attach);
    assert!(matches!(answer, Message::Attached(_)), "{answer:?}");
    assert!(ring_fd.is_some(), "no ring with ATTACHED");
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
        o.start = Position::at(0, 2);
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
fn a_sigkilled_client_process_is_reclaimed_and_its_rank_resumes() {
    let (dir, data, _) = temp_image_folder(4, 6); // world 2: 6 steps of 2 per rank
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let mut rank1 = Client::attach(daemon.socket(), options(&data, "kill", 1, 2, 2)).unwrap();

    let ready = dir.path().join("child-holds");
    let args = [
        daemon.socket().as_os_str(),
        data.as_os_str(),
        ready.as_os_str(),
    ];
    let mut child = client_process::test_client("hold", &args).spawn().unwrap();
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
        o.start = Position::at(0, 2);
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
