//! A dataset that changed after a worker opened it (a file added, so the home's index, and its
//! fingerprint, differ from the worker's) is opened again by the worker instead of being
//! refused until the worker restarts; and the worker reads a dataset again at most once per
//! `unit::REREAD_INTERVAL` for homes whose fingerprint it cannot match.

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

fn open_job(
    (home, session): (&mut TcpStream, &mut Session),
    job: u32,
    data: &Path,
    fingerprint: &str,
) -> Message {
    let open = OpenJob {
        job,
        dataset: data.to_str().unwrap().to_owned(),
        fingerprint: fingerprint.to_owned(),
        spec: u8_spec(4, 32, None),
        seed: 1,
        policy: BadSamplePolicy::Skip,
        max_pixels: 1 << 20,
        max_file_bytes: 1 << 20,
    };
    session
        .write(home, &Message::Open(Box::new(open)), &[])
        .unwrap();
    session
        .read(home, Some(Instant::now() + Duration::from_secs(10)))
        .unwrap()
}

fn fingerprint_of(data: &Path) -> String {
    let opts = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    fingerprint(&Dataset::open(data, &opts).unwrap())
}

#[test]
fn a_dataset_that_changed_since_the_worker_opened_it_is_opened_again() {
    let world = World::new();
    let data = world.tmp.path().join("growing");
    write_image_folder(&data, 2, 3, 24);
    let (_worker, log, addr) = world.worker("worker");
    let mut home = TcpStream::connect(&addr).unwrap();
    let right = secret(&world, "a-test-secret-of-some-length");
    let mut session =
        auth::connect(&mut home, &right, Instant::now() + Duration::from_secs(5)).unwrap();

    let before = fingerprint_of(&data);
    let reply = open_job((&mut home, &mut session), 1, &data, &before);
    assert!(matches!(reply, Message::Opened { job: 1, .. }), "{reply:?}");

    // A new image in a class folder: the home indexes 7 samples, the worker had 6.
    let first = std::fs::read(data.join("c0").join("img000.jpg")).unwrap();
    std::fs::write(data.join("c0").join("img500.jpg"), first).unwrap();
    let after = fingerprint_of(&data);
    assert_ne!(before, after);
    let reply = open_job((&mut home, &mut session), 2, &data, &after);
    assert!(
        matches!(reply, Message::Opened { job: 2, .. }),
        "{reply:?}\n{}",
        read_log(&log)
    );
    // The new sample is served from the worker.
    let unit = Message::Unit {
        id: 7,
        job: 2,
        epoch: 0,
        indices: (0..7).collect(),
    };
    session.write(&mut home, &unit, &[]).unwrap();
    let reply = session
        .read(&mut home, Some(Instant::now() + Duration::from_secs(10)))
        .unwrap();
    let Message::Done {
        id: 7,
        samples,
        bytes,
    } = reply
    else {
        panic!("{reply:?}");
    };
    assert_eq!(samples.len(), 7);
    assert_eq!(bytes, 7 * 32 * 32 * 3);
    let mut pixels = vec![0u8; usize::try_from(bytes).unwrap()];
    session
        .read_into(
            &mut home,
            &mut pixels,
            Some(Instant::now() + Duration::from_secs(10)),
        )
        .unwrap();

    // A fingerprint no reading can match (another dataset's) is refused, and the worker does
    // not read the folder again for every such open: it just did.
    for job in 3..6 {
        let reply = open_job((&mut home, &mut session), job, &data, "0123abcd");
        match reply {
            Message::Refused { reason, .. } => assert!(reason.contains("differs here"), "{reason}"),
            other => panic!("{other:?}"),
        }
    }
    wait_for_line(&log, "worker refused a job");
    let rereads = read_log(&log)
        .matches("worker read the dataset again")
        .count();
    assert_eq!(
        rereads,
        1,
        "one reading for the change, none since:\n{}",
        read_log(&log)
    );
}
