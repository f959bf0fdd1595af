//! The soak: 8 clients attaching and detaching under full load against one real `stokerd`,
//! sampling the daemon's RSS and fd count every few seconds. Run by `scripts/soak` (ignored in
//! the ordinary test run):
//!
//! `STOKER_SOAK_SECS=1800 cargo test --test serve -- --ignored --nocapture`
//!
//! Clients 0-1 stay attached and drain batches as fast as they come (the full load); clients
//! 2-7 attach, take a few batches (sometimes leaving with leases held), detach, and attach
//! again, for the whole duration. Verdicts printed at the end:
//! - RSS: the peak of the last quarter of the samples after warm-up (a fifth of the run, at
//!   least 30 s) against the peak of the first quarter; passes under 5% growth. Peaks, not
//!   single samples: RSS swings by a few hundred KiB with the clients' attach phase.
//! - fds: the idle fd count after every client has left against the idle count before the
//!   first one came; passes when equal (and no ring is left open).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};
use stoker::{AttachOptions, Client, DType, PipelineSpec};
use stoker_testkit::{write_image_folder, Daemon};

const CLIENTS: u32 = 8;

const STEADY: u32 = 2;

const SAMPLE_EVERY: Duration = Duration::from_secs(5);

fn secs_from_env() -> u64 {
    std::env::var("STOKER_SOAK_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(300)
}

#[test]
#[ignore = "long: run with scripts/soak"]
fn soak() {
    let secs = secs_from_env();
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = write_image_folder(&data, 8, 32, 96);
    let data = data.to_str().unwrap().to_owned();
    let daemon = Daemon::start(dir.path(), &["--threads", "2", "--slots", "3"]);
    let socket = daemon.socket().to_owned();
    std::thread::sleep(Duration::from_millis(200));
    let (idle_fds, idle_rss) = (daemon.fd_count(), daemon.rss_kib());
    println!(
        "soak: {secs} s, {CLIENTS} clients ({STEADY} steady), {n} images, daemon pid {}",
        daemon.pid()
    );
    println!("idle before: fds {idle_fds}, rss {idle_rss} KiB");

    let stop = Arc::new(AtomicBool::new(false));
    let batches = Arc::new(AtomicU64::new(0));
    let attaches = Arc::new(AtomicU64::new(0));
    let spec = PipelineSpec {
        dtype: DType::U8,
        epochs: None,
        ..PipelineSpec::train(16, 64)
    };
    let handles: Vec<_> = (0..CLIENTS)
        .map(|c| {
            let (stop, batches, attaches) = (stop.clone(), batches.clone(), attaches.clone());
            let (socket, data, spec) = (socket.clone(), data.clone(), spec.clone());
            std::thread::spawn(move || {
                let mut round: u64 = 0;
                while !stop.load(Ordering::Relaxed) {
                    let opts = AttachOptions {
                        rank: 0,
                        world_size: 1,
                        seed: c as u64,
                        ..AttachOptions::new(format!("soak-{c}"), data.as_str(), spec.clone())
                    };
                    let mut client = Client::attach(&socket, opts).expect("attach");
                    attaches.fetch_add(1, Ordering::Relaxed);
                    let take = if c < STEADY {
                        u64::MAX
                    } else {
                        1 + (round * 7 + c as u64) % 12
                    };
                    let mut held = Vec::new();
                    let mut got = 0;
                    while got < take && !stop.load(Ordering::Relaxed) {
                        let b = client.next_batch().expect("batch").expect("endless");
                        batches.fetch_add(1, Ordering::Relaxed);
                        got += 1;
                        // Now and then leave holding a lease.
                        if round % 4 == 1 && got + 1 == take {
                            held.push(b);
                        }
                    }
                    drop(client);
                    drop(held);
                    round += 1;
                }
            })
        })
        .collect();

    let start = Instant::now();
    let warmup = Duration::from_secs((secs / 5).max(30).min(secs));
    let mut samples: Vec<(f64, u64, usize, usize)> = Vec::new();
    println!("   t(s)  rss(KiB)  fds  rings  attaches  batches");
    while start.elapsed() < Duration::from_secs(secs) {
        std::thread::sleep(SAMPLE_EVERY.min(Duration::from_secs(secs)));
        let s = (
            start.elapsed().as_secs_f64(),
            daemon.rss_kib(),
            daemon.fd_count(),
            daemon.ring_count(),
        );
        println!(
            "{:7.0} {:9} {:4} {:6} {:9} {:8}",
            s.0,
            s.1,
            s.2,
            s.3,
            attaches.load(Ordering::Relaxed),
            batches.load(Ordering::Relaxed)
        );
        samples.push(s);
    }
    stop.store(true, Ordering::Relaxed);
    for h in handles {
        h.join().unwrap();
    }
    let deadline = Instant::now() + Duration::from_secs(10);
    while daemon.ring_count() > 0 && Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(50));
    }
    std::thread::sleep(Duration::from_millis(300));
    let (end_fds, end_rings) = (daemon.fd_count(), daemon.ring_count());

    let after: Vec<_> = samples
        .iter()
        .filter(|s| s.0 >= warmup.as_secs_f64())
        .collect();
    let quarter = (after.len() / 4).max(1);
    let peak = |w: &[&(f64, u64, usize, usize)]| w.iter().map(|s| s.1).max();
    let (first, last) = match (
        peak(&after[..quarter.min(after.len())]),
        peak(&after[after.len().saturating_sub(quarter)..]),
    ) {
        (Some(f), Some(l)) => (f, l),
        _ => (idle_rss, daemon.rss_kib()),
    };
    let growth = (last as f64 - first as f64) / first.max(1) as f64 * 100.0;
    let peak_fds = samples.iter().map(|s| s.2).max().unwrap_or(0);
    println!(
        "total: {} attaches, {} batches in {:.0} s",
        attaches.load(Ordering::Relaxed),
        batches.load(Ordering::Relaxed),
        start.elapsed().as_secs_f64()
    );
    println!(
        "RSS peak after warm-up ({} s), first vs last quarter: {first} -> {last} KiB, growth \
         {growth:+.2}% ({})",
        warmup.as_secs(),
        if growth < 5.0 {
            "PASS < 5%"
        } else {
            "FAIL >= 5%"
        }
    );
    println!(
        "fds idle before {idle_fds}, idle after {end_fds} (peak under load {peak_fds}), rings \
         left {end_rings} ({})",
        if end_fds == idle_fds && end_rings == 0 {
            "PASS flat"
        } else {
            "FAIL"
        }
    );
    assert!(growth < 5.0, "RSS grew {growth:.2}% after warm-up");
    assert_eq!(end_fds, idle_fds, "fd count not flat");
    assert_eq!(end_rings, 0);
}
