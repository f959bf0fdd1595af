//! A daemon killed with SIGKILL, and no daemon at all.

use super::*;
use stoker_testkit::attach::{rank_options, u8_spec as spec};
use stoker_testkit::batches::{drain, got, Got};
use stoker_testkit::tiny_dataset;

fn options(data: &str, job: &str, rank: u32, world: u32, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (rank, world), 77, spec)
}

// ---------------------------------------------------------------------------------------
// Crash safety.

/// Every batch of both ranks of a 2-rank job `job` on a daemon left alone: what a run that
/// the daemon's restarts interrupt must equal.
fn uninterrupted(dir: &Path, data: &str, job: &str, spec: &PipelineSpec) -> Vec<Vec<Got>> {
    let daemon = Daemon::start(dir, &["--threads", "2"]);
    (0..2)
        .map(|r| {
            let o = options(data, job, r, 2, spec.clone());
            drain(&mut Client::attach(daemon.socket(), o).unwrap())
        })
        .collect()
}

#[test]
fn a_sigkilled_daemon_restarts_and_resumed_batches_equal_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 4, 6); // 24 samples; world 2, batch 2: 6 steps
    let data = data.to_str().unwrap().to_owned();
    let spec = spec(2, 16, Some(2));

    // The uninterrupted run.
    let reference = uninterrupted(dir.path(), &data, "crash", &spec);
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
    let positions: Vec<Position> = seen
        .iter()
        .map(|s| {
            let last = s.last().unwrap();
            if last.step + 1 == 6 {
                Position::at(last.epoch + 1, 0)
            } else {
                Position::at(last.epoch, last.step + 1)
            }
        })
        .collect();
    assert_eq!(positions[0], Position::at(0, 4));
    assert_eq!(positions[1], Position::at(1, 1));

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

/// Takes `n` batches from each client.
fn take(clients: &mut [Client], n: usize, seen: &mut [Vec<Got>]) {
    for (c, seen) in clients.iter_mut().zip(seen.iter_mut()) {
        for _ in 0..n {
            seen.push(got(&c.next_batch().unwrap().unwrap()));
        }
    }
}

/// Starts a daemon in `dir` after `after`, as systemd restarts one.
fn restart_later(dir: &Path, after: Duration) -> std::thread::JoinHandle<Daemon> {
    let dir = dir.to_owned();
    std::thread::spawn(move || {
        std::thread::sleep(after);
        Daemon::start(&dir, &["--threads", "2", "--slots", "2"])
    })
}

#[test]
fn with_reattach_a_2_rank_job_goes_on_through_a_sigterm_restart_and_a_sigkill() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 4, 6); // 24 samples; world 2, batch 2: 6 steps
    let data = data.to_str().unwrap().to_owned();
    let spec = spec(2, 16, Some(2));
    let reference = uninterrupted(dir.path(), &data, "reattach", &spec);
    assert_eq!(reference[0].len(), 12);

    let mut daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "2"]);
    let mut clients: Vec<Client> = (0..2)
        .map(|r| {
            let mut o = options(&data, "reattach", r, 2, spec.clone());
            o.reattach = Some(Duration::from_secs(20));
            Client::attach(daemon.socket(), o).unwrap()
        })
        .collect();
    let mut seen: Vec<Vec<Got>> = vec![Vec::new(), Vec::new()];
    take(&mut clients, 3, &mut seen);
    // systemd's restart: SIGTERM (the daemon drains and exits), a new daemon a little later.
    daemon.signal(libc::SIGTERM);
    assert!(daemon.wait_exit(Duration::from_secs(15)).success());
    let restarted = restart_later(dir.path(), Duration::from_millis(300));
    let t = Instant::now();
    take(&mut clients, 4, &mut seen);
    assert!(
        t.elapsed() >= Duration::from_millis(200),
        "next_batch waited for the daemon"
    );
    drop(restarted.join().unwrap()); // SIGKILL mid-epoch
    let restarted = restart_later(dir.path(), Duration::from_millis(300));
    for (c, seen) in clients.iter_mut().zip(seen.iter_mut()) {
        seen.extend(drain(c));
    }
    drop(restarted.join().unwrap());
    let key = |g: &Got| (g.epoch, g.step, g.hash, g.indices.clone());
    for r in 0..2 {
        let a: Vec<_> = seen[r].iter().map(key).collect();
        let b: Vec<_> = reference[r].iter().map(key).collect();
        assert_eq!(a, b, "rank {r}: the batches of an uninterrupted run");
    }
}

#[test]
fn with_reattach_a_daemon_that_stays_away_is_named_with_the_wait() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 2, 4);
    let daemon = Daemon::start(dir.path(), &["--threads", "1", "--slots", "2"]);
    let socket = daemon.socket().to_owned();
    let mut o = options(data.to_str().unwrap(), "away", 0, 1, spec(2, 8, None));
    o.reattach = Some(Duration::from_millis(400));
    let mut c = Client::attach(&socket, o).unwrap();
    c.next_batch().unwrap().unwrap();
    drop(daemon); // SIGKILL, and no restart
    let t = Instant::now();
    let err = loop {
        match c.next_batch() {
            Ok(_) => continue, // announced before the kill
            Err(e) => break e,
        }
    };
    assert!(t.elapsed() >= Duration::from_millis(400), "{err}");
    assert!(matches!(err, ClientError::StayedAway { .. }), "{err}");
    assert!(err.is_disconnected());
    let msg = err.to_string();
    assert!(
        msg.contains(&format!("the daemon at {} went away", socket.display())),
        "{msg}"
    );
    assert!(msg.contains("within 0.4 s"), "{msg}");
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

// ---------------------------------------------------------------------------------------
// Positions at the edge of their range.

#[test]
fn an_epoch_at_the_top_of_its_range_is_refused_not_wrapped() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 2, 2); // 4 samples; batch 2: 2 steps an epoch
    let data = data.to_str().unwrap().to_owned();
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let top = stoker::protocol::position::MAX_EPOCH;
    for epoch in [u64::MAX, top + 1] {
        let mut o = options(&data, "top", 0, 1, spec(2, 16, Some(2)));
        o.start = Position::at(epoch, 0);
        let e = match Client::attach(daemon.socket(), o) {
            Ok(mut c) => panic!(
                "ATTACH at epoch {epoch} was taken (it would wrap to epoch 0): {:?}",
                c.next_batch().map(|b| b.map(|b| (b.epoch(), b.step())))
            ),
            Err(e) => e,
        };
        assert_eq!(e.code(), Some(ErrorCode::InvalidSpec), "{e}");
        assert!(e.to_string().contains(&epoch.to_string()), "{e}");
    }
    // The last epoch a job may start at is served, and an endless stream goes on past it.
    let mut o = options(&data, "top", 0, 1, spec(2, 16, None));
    o.start = Position::at(top, 0);
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let epochs: Vec<u64> = (0..4)
        .map(|_| c.next_batch().unwrap().unwrap().epoch())
        .collect();
    assert_eq!(epochs, vec![top, top, top + 1, top + 1]);
}
