//! A peer without the secret, and a job naming a dataset outside a worker's roots, are
//! refused, and the worker logs why.

use std::net::TcpStream;
use std::time::{Duration, Instant};

use stoker_daemon::remote::auth::{self, AuthError, Secret};
use stoker_daemon::remote::wire::{Message, OpenJob};
use stoker_pipeline::engine::BadSamplePolicy;
use stoker_testkit::attach::u8_spec;

use super::*;

pub(crate) fn secret(world: &World, text: &str) -> Secret {
    use std::os::unix::fs::PermissionsExt;
    let path = world.tmp.path().join(format!("secret-{}", text.len()));
    std::fs::write(&path, text).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)).unwrap();
    Secret::load(&path).unwrap()
}

pub(crate) fn wait_for_line(log: &Path, needle: &str) -> String {
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let text = read_log(log);
        if let Some(line) = text.lines().find(|l| l.contains(needle)) {
            return line.to_owned();
        }
        assert!(
            Instant::now() < deadline,
            "no {needle:?} in the log:\n{text}"
        );
        std::thread::sleep(Duration::from_millis(20));
    }
}

#[test]
fn a_peer_without_the_secret_and_a_dataset_outside_the_roots_are_refused_and_logged() {
    let world = World::new();
    let (_worker, log, addr) = world.worker("worker");
    let soon = || Instant::now() + Duration::from_secs(5);

    let mut stranger = TcpStream::connect(&addr).unwrap();
    let wrong = secret(&world, "not-the-shared-secret");
    let e = auth::connect(&mut stranger, &wrong, soon()).unwrap_err();
    assert!(
        matches!(&e, AuthError::Refused(r) if r == "authentication failed"),
        "{e:?}"
    );
    let line = wait_for_line(&log, "refused an unauthenticated peer");
    assert!(
        line.contains("proof of the shared secret is wrong"),
        "{line}"
    );
    assert!(!read_log(&log).contains("not-the-shared-secret"));
    assert!(!read_log(&log).contains("a-test-secret"));

    // With the secret: a dataset outside the worker's roots (another temp folder).
    let outside = tempfile::tempdir().unwrap();
    write_image_folder(outside.path(), 1, 2, 20);
    let mut home = TcpStream::connect(&addr).unwrap();
    let right = secret(&world, "a-test-secret-of-some-length");
    let mut session = auth::connect(&mut home, &right, soon()).unwrap();
    let open = OpenJob {
        job: 3,
        dataset: outside.path().to_str().unwrap().to_owned(),
        fingerprint: String::new(),
        spec: u8_spec(4, 32, None),
        seed: 1,
        policy: BadSamplePolicy::Skip,
        max_pixels: 1 << 20,
        max_file_bytes: 1 << 20,
    };
    session
        .write(&mut home, &Message::Open(Box::new(open)), &[])
        .unwrap();
    match session.read(&mut home, Some(soon())).unwrap() {
        Message::Refused {
            job: Some(3),
            reason,
            ..
        } => {
            assert!(reason.contains("outside the allowed roots"), "{reason}");
        }
        other => panic!("{other:?}"),
    }
    let line = wait_for_line(&log, "worker refused a job");
    assert!(line.contains("outside the allowed roots"), "{line}");
    // A unit of a job never opened is refused too, and the connection stays.
    let unit = Message::Unit {
        id: 9,
        job: 3,
        epoch: 0,
        indices: vec![0],
    };
    session.write(&mut home, &unit, &[]).unwrap();
    assert!(matches!(
        session.read(&mut home, Some(soon())).unwrap(),
        Message::Refused { unit: Some(9), .. }
    ));
}
