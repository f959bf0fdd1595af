//! Attach and detach a thousand times: no fd, ring or memory is left behind.

use super::*;
use stoker_testkit::attach::{rank_options, u8_spec as spec};
use stoker_testkit::tiny_dataset;

fn options(data: &str, job: &str, rank: u32, world: u32, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (rank, world), 77, spec)
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
