//! What one peer may hold on a worker: jobs per connection, pixel memory per peer address,
//! and connections that have not authenticated, which never keep an authenticated home
//! daemon out.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use stoker_daemon::remote::auth;
use stoker_daemon::remote::seal::Session;
use stoker_daemon::remote::unit::fingerprint;
use stoker_daemon::remote::wire::{Message, OpenJob};
use stoker_pipeline::engine::BadSamplePolicy;
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_testkit::attach::u8_spec;

use super::refusals::{secret, wait_for_line};
use super::*;

fn soon() -> Instant {
    Instant::now() + Duration::from_secs(30)
}

/// An authenticated connection to the worker at `addr`, and its session.
fn home_connection(world: &World, addr: &str) -> (TcpStream, Session) {
    let mut s = TcpStream::connect(addr).unwrap();
    let session = auth::connect(
        &mut s,
        &secret(world, "a-test-secret-of-some-length"),
        soon(),
    )
    .unwrap();
    (s, session)
}

/// What a home daemon sends to open `world`'s dataset as job `job` with output `side`.
fn open_job(world: &World, job: u32, seed: u64, side: u32) -> Message {
    let ds = Dataset::open_local(&world.data, &OpenOptions::default()).unwrap();
    Message::Open(Box::new(OpenJob {
        job,
        dataset: world.data.to_str().unwrap().to_owned(),
        fingerprint: fingerprint(&ds),
        spec: u8_spec(4, side, None),
        seed,
        policy: BadSamplePolicy::Skip,
        max_pixels: 1 << 26,
        max_file_bytes: 1 << 26,
    }))
}

fn ask((s, session): &mut (TcpStream, Session), message: &Message) -> Message {
    session.write(s, message, &[]).unwrap();
    session.read(s, Some(soon())).unwrap()
}

#[test]
fn a_connection_keeps_a_bounded_number_of_jobs_and_names_those_it_lets_go() {
    let world = World::new();
    let (_worker, log, addr) = world.worker("worker");
    let mut s = home_connection(&world, &addr);
    let closed: Vec<u32> = (0..40)
        .flat_map(
            |job| match ask(&mut s, &open_job(&world, job, u64::from(job), 32)) {
                Message::Opened { closed, .. } => closed,
                other => panic!("{other:?}"),
            },
        )
        .collect();
    // The worker keeps 8: each job past the 8th lets the least recently used go.
    assert_eq!(closed, (0..32).collect::<Vec<u32>>());
    let unit = |id, job| Message::Unit {
        id,
        job,
        epoch: 0,
        indices: vec![0, 1],
    };
    match ask(&mut s, &unit(1, 0)) {
        Message::Refused { reason, .. } => assert!(reason.contains("no such job"), "{reason}"),
        other => panic!("{other:?}"),
    }
    s.1.write(&mut s.0, &unit(2, 39), &[]).unwrap();
    assert!(matches!(
        s.1.read(&mut s.0, Some(soon())).unwrap(),
        Message::Done { id: 2, .. }
    ));
    wait_for_line(&log, "jobs open on this connection");
}

#[test]
fn the_pixel_memory_of_one_peer_is_capped_and_freed_when_it_goes() {
    let world = World::new();
    let (worker, log, addr) = world.worker("worker");
    let idle = worker.rss_kib();
    // 2048x2048x3 bytes an image, 20 a unit: 252 MB, under worker.max_unit_bytes (256 MiB).
    let indices: Vec<u64> = (0..20).collect();
    let mut held = Vec::new();
    let mut answers = Vec::new();
    for c in 0..5u32 {
        let mut s = home_connection(&world, &addr);
        assert!(matches!(
            ask(&mut s, &open_job(&world, 1, 7, 2048)),
            Message::Opened { job: 1, .. }
        ));
        let unit = Message::Unit {
            id: u64::from(c),
            job: 1,
            epoch: 0,
            indices: indices.clone(),
        };
        s.1.write(&mut s.0, &unit, &[]).unwrap();
        let answer = s.1.read(&mut s.0, Some(soon())).unwrap();
        if let Message::Done { bytes, .. } = &answer {
            let mut pixels = vec![0u8; usize::try_from(*bytes).unwrap()];
            s.1.read_into(&mut s.0, &mut pixels, Some(soon())).unwrap();
        }
        answers.push(answer);
        held.push(s);
    }
    let done = answers
        .iter()
        .filter(|a| matches!(a, Message::Done { .. }))
        .count();
    assert_eq!(done, 4, "units of 252 MB done for one peer: {answers:?}");
    let Some(Message::Refused { reason, .. }) = answers.last() else {
        panic!("{:?}", answers.last());
    };
    assert!(reason.contains("worker.max_bytes_per_peer"), "{reason}");
    wait_for_line(&log, "worker.max_bytes_per_peer");
    drop(held);
    let deadline = Instant::now() + Duration::from_secs(10);
    while worker.rss_kib() > idle + 200 * 1024 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    assert!(
        worker.rss_kib() <= idle + 200 * 1024,
        "the worker holds {} KiB once its peer has gone (idle: {idle} KiB)",
        worker.rss_kib()
    );
}

#[test]
fn peers_that_never_authenticate_do_not_keep_a_home_daemon_out() {
    let world = World::new();
    let (_worker, log, addr) = world.worker("worker");
    // More silent connections than worker.max_connections (64), from the home's address.
    let silent: Vec<TcpStream> = (0..80)
        .filter_map(|_| TcpStream::connect(&addr).ok())
        .collect();
    assert_eq!(silent.len(), 80);
    let started = Instant::now();
    let mut s = TcpStream::connect(&addr).unwrap();
    let quick = Instant::now() + Duration::from_secs(1);
    let key = secret(&world, "a-test-secret-of-some-length");
    let session = auth::connect(&mut s, &key, quick).unwrap_or_else(|e| {
        panic!(
            "an authenticated home was kept out by silent peers ({e}); worker log:\n{}",
            read_log(&log)
        )
    });
    assert!(started.elapsed() < Duration::from_secs(1));
    let mut s = (s, session);
    assert!(matches!(
        ask(&mut s, &open_job(&world, 0, 1, 32)),
        Message::Opened { job: 0, .. }
    ));
    wait_for_line(&log, "handshake");
    drop(silent);
}

#[test]
fn a_connect_and_drop_flood_writes_a_few_log_lines_and_fails_no_handshake() {
    use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
    use std::sync::Arc;
    let world = World::new();
    let (_worker, log, addr) = world.worker("worker");
    let key = secret(&world, "a-test-secret-of-some-length");
    // The worker is up and logs before the flood: what the log holds then.
    drop(home_connection(&world, &addr));
    wait_for_line(&log, "home daemon disconnected");
    let before = read_log(&log).len();
    // 8 threads connecting and dropping at once, for 3 s.
    let stop = Arc::new(AtomicBool::new(false));
    let dropped = Arc::new(AtomicU64::new(0));
    let flood: Vec<_> = (0..8)
        .map(|_| {
            let (addr, stop, dropped) = (addr.clone(), stop.clone(), dropped.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    if TcpStream::connect(&addr).is_ok() {
                        dropped.fetch_add(1, Ordering::Relaxed);
                    }
                }
            })
        })
        .collect();
    // Meanwhile 24 genuine handshakes, one every 100 ms.
    let mut failed = Vec::new();
    for i in 0..24 {
        std::thread::sleep(Duration::from_millis(100));
        let mut s = TcpStream::connect(&addr).unwrap();
        if let Err(e) = auth::connect(&mut s, &key, Instant::now() + Duration::from_secs(2)) {
            failed.push(format!("handshake {i}: {e}"));
        }
    }
    std::thread::sleep(Duration::from_millis(600));
    stop.store(true, Ordering::Relaxed);
    for t in flood {
        t.join().unwrap();
    }
    std::thread::sleep(Duration::from_millis(300));
    let text = read_log(&log);
    let during = &text[before.min(text.len())..];
    let refusals = during
        .lines()
        .filter(|l| l.contains("refused") || l.contains("TCP options"))
        .count();
    println!(
        "{} connect-and-drop connections: {} bytes of log, {refusals} refusal lines, {} of 24 \
         handshakes failed",
        dropped.load(Ordering::Relaxed),
        during.len(),
        failed.len()
    );
    assert!(failed.is_empty(), "genuine handshakes failed: {failed:?}");
    assert!(
        refusals <= 10,
        "{refusals} refusal lines for one flood ({} bytes of log)",
        during.len()
    );
    assert!(
        during.contains("more refused"),
        "the refusals are counted in an aggregate line:\n{during}"
    );
}

/// `open_job` for the dataset named `spelled` (another spelling of `world`'s dataset path).
fn open_spelled(world: &World, job: u32, spelled: &str) -> Message {
    let Message::Open(mut open) = open_job(world, job, 1, 32) else {
        unreachable!("open_job makes an Open")
    };
    open.dataset = spelled.to_owned();
    Message::Open(open)
}

#[test]
fn spellings_of_one_dataset_share_one_index_and_index_memory_counts_for_its_peer() {
    let world = World::new();
    let (_worker, log, addr) = world.worker("worker");
    let path = world.data.to_str().unwrap().to_owned();
    let parent = world.data.parent().unwrap().to_str().unwrap().to_owned();
    // The same folder, six ways: what a home names is resolved before it is opened.
    let spellings = [
        path.clone(),
        format!("{parent}//data"),
        format!("{parent}///data"),
        format!("{parent}/data/"),
        format!("/{path}"),
        format!("{parent}//data//"),
    ];
    let mut s = home_connection(&world, &addr);
    for (job, spelled) in spellings.iter().enumerate() {
        let answer = ask(
            &mut s,
            &open_spelled(&world, u32::try_from(job).unwrap(), spelled),
        );
        assert!(
            matches!(answer, Message::Opened { .. }),
            "{spelled}: {answer:?}"
        );
    }
    drop(s);
    wait_for_line(&log, "home daemon disconnected");
    let text = read_log(&log);
    let indexed = text
        .lines()
        .filter(|l| l.contains("dataset index") && l.contains("/data"))
        .count();
    assert_eq!(
        indexed, 1,
        "one index for six spellings of one folder:\n{text}"
    );

    // A dataset's index counts against its peer's worker.max_bytes_per_peer.
    let (_small, log, addr) = world.worker_at(
        "small",
        &format!("127.0.0.1:{}", free_port()),
        "max_bytes_per_peer = 100\n",
    );
    let mut s = home_connection(&world, &addr);
    let answer = ask(&mut s, &open_spelled(&world, 0, &path));
    let Message::Refused { reason, .. } = &answer else {
        panic!("an index over max_bytes_per_peer was opened: {answer:?}");
    };
    assert!(
        reason.contains("worker.max_bytes_per_peer 100") && reason.contains("index"),
        "{reason}"
    );
    wait_for_line(&log, "worker.max_bytes_per_peer");
}
