//! Listings are bounded (issue 42 item 3): a server that lists empty pages without end, or
//! pages too large to be a listing, is refused; a listing stops when its client has gone; a
//! listing counts as a job of its user while it runs.

use super::fake::{Behaviour, FakeS3, Listing};
use super::stalls::{fake_config, objects_of};
use super::*;
use std::sync::mpsc;
use stoker::protocol::{Attach, Message};
use stoker::socket::SeqPacket;

/// A daemon (in `dir`) reading `fake`, with `extra` config after its `[s3]` tables.
fn daemon_for(dir: &Path, fake: &FakeS3, extra: &str) -> Daemon {
    std::fs::create_dir_all(dir).unwrap();
    let config = fake_config(dir, fake, "prefetch = false");
    let text = std::fs::read_to_string(&config).unwrap() + "\n" + extra;
    std::fs::write(&config, text).unwrap();
    Daemon::start_configured(dir, &config, &["--threads", "1"])
}

/// Attaches job `job` to `url` in a thread; its outcome (the refusal's text) within `bound`,
/// failing the test past it.
fn attach_within(socket: &Path, url: &str, job: &str, bound: Duration) -> Result<(), String> {
    let (tx, rx) = mpsc::channel();
    let (socket, o) = (socket.to_owned(), options(url, job, 0, 1, 2));
    std::thread::spawn(move || {
        let _ = tx.send(
            Client::attach(&socket, o)
                .map(drop)
                .map_err(|e| e.to_string()),
        );
    });
    rx.recv_timeout(bound)
        .unwrap_or_else(|_| panic!("the attach of {url} did not end within {bound:?}"))
}

/// Sends an ATTACH of job `job` to `url` and returns the connection without waiting for the
/// answer: a client that will leave while its dataset is listed.
fn attach_and_leave_later(socket: &Path, url: &str, job: &str) -> SeqPacket {
    let o = options(url, job, 0, 1, 2);
    let a = Attach {
        job: o.job.clone(),
        rank: 0,
        world_size: 1,
        device: stoker::Device::Cpu,
        spec: o.spec.clone(),
        dataset: o.dataset.clone(),
        seed: o.seed,
        start: stoker::Position::default(),
        offset: None,
    };
    let s = SeqPacket::connect(socket).unwrap();
    s.send(&Message::Attach(Box::new(a)).encode().unwrap(), &[])
        .unwrap();
    s
}

/// Waits (60 s at most) until `count` stays the same for a second; fails the test if it never
/// does.
fn until_still(count: impl Fn() -> u64, what: &str) -> u64 {
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut last = count();
    loop {
        std::thread::sleep(Duration::from_secs(1));
        let now = count();
        if now == last {
            return now;
        }
        assert!(
            Instant::now() < deadline,
            "{what} still growing after 60 s: {now}"
        );
        last = now;
    }
}

/// A server listing as `listing`, each page `list_delay` late, holding a small image folder
/// under `data/` (made in `dir`).
fn server(dir: &Path, listing: Listing, list_delay: Duration) -> (FakeS3, PathBuf) {
    let folder = dir.join("folder");
    write_image_folder(&folder, 1, 4, 24);
    let behaviour = Behaviour {
        listing,
        list_delay,
        ..Behaviour::default()
    };
    let fake = FakeS3::start_with("b", objects_of(&folder, "data"), behaviour);
    (fake, folder)
}

const BOUND: Duration = Duration::from_secs(60);

#[test]
fn listings_of_empty_pages_without_end_or_of_huge_pages_are_refused_naming_the_bound() {
    let dir = tempfile::tempdir().unwrap();
    let bound = BOUND;

    // Empty truncated pages without end: refused, naming why.
    let (fake, _) = server(
        &dir.path().join("s1"),
        Listing::EmptyPagesForever,
        Duration::ZERO,
    );
    let d = daemon_for(&dir.path().join("empty"), &fake, "");
    let e = attach_within(d.socket(), "s3://b/data", "empty", bound).unwrap_err();
    assert!(e.contains("listed no object"), "{e}");
    drop(d);

    // A page of 64 MiB: refused once past 16 MiB, naming the bound.
    let (fake, _) = server(
        &dir.path().join("s2"),
        Listing::PaddedTo(64 << 20),
        Duration::ZERO,
    );
    let d = daemon_for(&dir.path().join("padded"), &fake, "");
    let e = attach_within(d.socket(), "s3://b/data", "padded", bound).unwrap_err();
    assert!(e.contains("larger than 16777216 bytes"), "{e}");
}

#[test]
fn a_listing_counts_as_a_job_of_its_user_and_stops_when_its_client_leaves() {
    let dir = tempfile::tempdir().unwrap();
    let bound = BOUND;
    // Pages of one new object each, without end, 20 ms apart. Two jobs of one user listing
    // take its two jobs (max_jobs_per_uid): a third is refused while they list.
    let (fake, folder) = server(
        dir.path(),
        Listing::OneObjectPagesForever,
        Duration::from_millis(20),
    );
    let d = daemon_for(
        &dir.path().join("slow"),
        &fake,
        "[limits]\nmax_jobs_per_uid = 2\n",
    );
    let leaving: Vec<SeqPacket> = ["a", "b"]
        .iter()
        .map(|job| attach_and_leave_later(d.socket(), "s3://b/data", job))
        .collect();
    let deadline = Instant::now() + bound;
    while fake.lists() < 20 {
        assert!(Instant::now() < deadline, "the two listings did not start");
        std::thread::sleep(Duration::from_millis(20));
    }
    let e = attach_within(d.socket(), "s3://b/data", "c", bound).unwrap_err();
    assert!(
        e.contains("limits.max_jobs_per_uid") && e.contains("2 of them opening"),
        "{e}"
    );

    // The two clients leave: their listings stop, and their jobs' places are free again.
    drop(leaving);
    let pages = until_still(|| fake.lists(), "pages listed after the clients left");
    eprintln!("{pages} pages listed in all");
    let local = folder.to_str().unwrap();
    let held: Vec<Client> = ["d", "e"]
        .iter()
        .map(|job| {
            Client::attach(d.socket(), options(local, job, 0, 1, 2))
                .unwrap_or_else(|e| panic!("job {job} after the listings stopped: {e}"))
        })
        .collect();
    assert_eq!(held.len(), 2);
}
