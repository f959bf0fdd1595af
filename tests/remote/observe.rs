//! Operating remote workers (issue 27 item 7): a home daemon's `stoker status` and `/metrics`
//! show each worker (units in flight, images/s, done and re-issued units, round trip, bytes)
//! and the share of images filled remotely; a worker's own `/metrics` counts its units,
//! images, bytes, refusals by reason and the home daemons connected. Real processes: a home
//! daemon, a worker, a client rank.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

use stoker::protocol::{DaemonStatus, WorkerStatus};
use stoker_testkit::prometheus::{http_get, sample};

use super::*;

/// Pixel bytes of one image of the job (`u8_spec(BATCH, 32, ..)`: 32 x 32 x 3).
const IMAGE_BYTES: f64 = 32.0 * 32.0 * 3.0;

/// A worker as [`World::worker`] that also serves `/metrics`; its address and metrics'.
pub(super) fn worker_with_metrics(world: &World) -> (Daemon, String, String) {
    let dir = world.dir("observed-worker");
    let (addr, metrics) = (
        format!("127.0.0.1:{}", free_port()),
        format!("127.0.0.1:{}", free_port()),
    );
    let config = write_config(
        &dir,
        &format!(
            "[pipeline]\nthreads = 1\n[metrics]\nlisten = {metrics:?}\n[access]\n\
             dataset_roots = [{:?}]\n[worker]\nlisten = {addr:?}\nsecret_file = {:?}\n",
            world.tmp.path(),
            world.secret
        ),
    );
    let log = dir.join("log");
    let d = Daemon::start_logged(&dir, &["--config", config.to_str().unwrap()], &log);
    (d, addr, metrics)
}

fn status(home: &Daemon) -> DaemonStatus {
    stoker_tool::cli::status::query(home.socket()).expect("status")
}

fn row(s: &DaemonStatus) -> WorkerStatus {
    assert_eq!(s.workers.len(), 1, "{s:?}");
    s.workers[0].clone()
}

/// The first sample of `name` whose labels hold every one of `labels`, 0 when absent.
fn value(text: &str, name: &str, labels: &[&str]) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && labels.iter().all(|x| l.contains(x)))
        .find_map(|l| l.rsplit(' ').next()?.parse().ok())
        .unwrap_or(0.0)
}

/// Polls the home's status until `done` holds of the worker's row (10 s at most); returns
/// that row and the highest images/s seen meanwhile.
fn wait_row(home: &Daemon, done: impl Fn(&WorkerStatus) -> bool) -> (WorkerStatus, f64) {
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut rate: f64 = 0.0;
    loop {
        let r = row(&status(home));
        rate = rate.max(r.images_per_s);
        if done(&r) {
            return (r, rate);
        }
        assert!(Instant::now() < deadline, "status never showed it: {r:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn status_and_metrics_show_each_worker_and_the_worker_counts_its_own() {
    let world = World::new();
    let (worker, addr, worker_metrics) = worker_with_metrics(&world);
    // Four connections against one local thread: the units after the pause go out too.
    let (home, home_log, home_metrics) = world.home_with("home", &[&addr], 4);
    let before = row(&status(&home));
    assert_eq!(
        (before.addr.as_str(), before.units_done),
        (addr.as_str(), 0)
    );
    // One rank reads batches of an endless job until told to stop.
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let rank = {
        let (socket, data, stop) = (home.socket().to_owned(), world.data.clone(), stop.clone());
        std::thread::spawn(move || {
            let spec = u8_spec(BATCH, 32, None);
            let opts = rank_options(data.to_str().unwrap(), "observed", (0, 1), SEED, spec);
            let mut c = Client::attach(&socket, opts).unwrap();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                c.next_batch().unwrap().expect("a batch");
            }
        })
    };
    // A connection has opened the job (a worker stopped in the handshake or the open
    // would hold no unit).
    wait_row(&home, |r| r.units_done >= 1);
    // The home may drop a connection whose unit ran late (on a loaded machine) and make it
    // again for the next unit: the worker shows the home while a connection is up.
    metrics_until(&worker_metrics, "one home, connected", |text| {
        sample(text, "stoker_worker_homes") == Some(1.0)
            && value(text, "stoker_worker_connections", &[]) >= 1.0
    });
    // A stopped worker holds its unit: in flight, then re-issued at the deadline.
    worker.signal(libc::SIGSTOP);
    let (flying, rate1) = wait_row(&home, |r| r.units_in_flight >= 1);
    let (reissued, rate2) = wait_row(&home, |r| r.units_reissued >= 1);
    worker.signal(libc::SIGCONT);
    // Back at work once its connections are made again.
    wait_row(&home, |r| r.units_done > reissued.units_done);
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    rank.join().unwrap();
    let rate = rate1.max(rate2);
    assert!(
        flying.units_done > 0 && rate > 0.0,
        "{flying:?} at {rate} img/s"
    );
    assert!(reissued.units_done >= flying.units_done, "{reissued:?}");
    let s = status(&home);
    let r = row(&s);
    assert!(
        r.units_done >= flying.units_done && r.images >= r.units_done,
        "{r:?}"
    );
    assert!(r.round_trip_ms > 0.0 && r.receive_cpu_s > 0.0, "{r:?}");
    assert!(
        r.bytes_received as f64 >= r.images as f64 * IMAGE_BYTES,
        "{r:?}"
    );
    assert!(r.bytes_sent > 0, "{r:?}");
    let share = s.remote_share.expect("a share with workers");
    assert!(
        share > 0.0 && share < 1.0,
        "share {share}: the re-issued unit was local"
    );

    let text = http_get(&home_metrics, "/metrics").1;
    let w = format!("worker=\"{addr}\"");
    let count = value(&text, "stoker_remote_round_trip_seconds_count", &[&w]);
    assert!(count >= r.units_done as f64, "{text}");
    let received = value(&text, "stoker_remote_bytes_total", &[&w, "received"]);
    assert!(received >= r.images as f64 * IMAGE_BYTES, "{text}");
    assert!(
        value(&text, "stoker_remote_receive_cpu_seconds_total", &[&w]) > 0.0,
        "{text}"
    );
    assert!(
        text.contains(&format!("stoker_remote_units_in_flight{{{w}}}")),
        "{text}"
    );
    assert!(
        text.contains(&format!("stoker_remote_images_per_second{{{w}}}")),
        "{text}"
    );
    let metric_share = sample(&text, "stoker_remote_share").unwrap();
    assert!(metric_share > 0.0 && metric_share < 1.0, "{text}");
    // The secret both sides hold is in none of what they show or log.
    let shown = [
        format!("{s:?}"),
        text.clone(),
        http_get(&worker_metrics, "/metrics").1,
        read_log(&home_log),
        read_log(&world.dir("observed-worker").join("log")),
    ];
    for what in &shown {
        assert!(!what.contains(SECRET), "the secret is shown: {what}");
    }

    // A peer that does not pass the handshake is refused, counted by reason (the home's
    // connections made while the worker was stopped may have failed theirs too).
    let handshake = "stoker_worker_refusals_total{reason=\"handshake\"}";
    let failed = sample(&http_get(&worker_metrics, "/metrics").1, handshake).unwrap();
    let mut peer = TcpStream::connect(&addr).unwrap();
    peer.set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    peer.write_all(b"\x05\x00\x00\x00hello").unwrap();
    let _ = peer.read_to_end(&mut Vec::new());
    let text = http_get(&worker_metrics, "/metrics").1;
    assert!(sample(&text, handshake).unwrap() > failed, "{text}");
    let images = sample(&text, "stoker_worker_images_total").unwrap();
    assert!(images >= r.images as f64, "{text}");
    let sent = value(&text, "stoker_worker_bytes_total", &["sent"]);
    assert!(sent >= images * IMAGE_BYTES, "{text}");
    assert!(value(&text, "stoker_worker_units_total", &["done"]) >= r.units_done as f64);
    assert!(
        value(&text, "stoker_worker_cpu_seconds_total", &["work"]) > 0.0,
        "{text}"
    );
    assert!(
        value(&text, "stoker_worker_cpu_seconds_total", &["send"]) > 0.0,
        "{text}"
    );

    // Its home daemon gone, the worker holds no home.
    drop(home);
    let text = metrics_until(&worker_metrics, "homes at 0", |text| {
        sample(text, "stoker_worker_homes") == Some(0.0)
    });
    assert_eq!(
        sample(&text, "stoker_worker_connections"),
        Some(0.0),
        "{text}"
    );
}

/// Polls the metrics at `url` until `done` holds of them (10 s at most, else fails naming
/// `what`); returns them.
fn metrics_until(url: &str, what: &str, done: impl Fn(&str) -> bool) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = http_get(url, "/metrics").1;
        if done(&text) {
            return text;
        }
        assert!(Instant::now() < deadline, "never {what}:\n{text}");
        std::thread::sleep(Duration::from_millis(20));
    }
}
