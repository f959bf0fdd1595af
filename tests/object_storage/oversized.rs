//! A body larger than the object listed (issue 42 item 9) is refused at its headers, or once
//! past the listed size: never downloaded in full.

use super::fake::{Behaviour, FakeS3};
use super::stalls::{fake_config, objects_of};
use super::*;

#[test]
fn a_body_larger_than_the_listed_object_is_refused_without_being_downloaded() {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let folder = dir.join("folder");
    write_image_folder(&folder, 1, 3, 24);
    let objects = objects_of(&folder, "data");
    let listed: u64 = objects.values().map(|b| b.len() as u64).max().unwrap();
    // Each GET claims (Content-Length) and sends 128 MiB for an object listed at about 1 KB.
    let claimed: u64 = 128 << 20;
    let behaviour = Behaviour {
        oversized_body: Some(claimed),
        ..Behaviour::default()
    };
    let fake = FakeS3::start_with("big", objects, behaviour);
    let config = fake_config(dir, &fake, "prefetch = false");
    let text = std::fs::read_to_string(&config).unwrap() + "\n[pipeline]\nbad_samples = \"fail\"\n";
    std::fs::write(&config, text).unwrap();
    let log = dir.join("stokerd.log");
    let flags = ["--threads", "2", "--config", config.to_str().unwrap()];
    let daemon = Daemon::start_logged(dir, &flags, &log);
    let seen = run(daemon.socket(), "s3://big/data", "big", 3);
    let status: Vec<u8> = seen.iter().flat_map(|s| s.status.clone()).collect();
    assert_eq!(status.len(), 3);
    assert!(
        status.iter().all(|&s| s == SampleStatus::Failed as u8),
        "no oversized object is delivered: {status:?}"
    );
    // What the server could write before the daemon hung up: socket buffers, not bodies.
    let sent = fake.body_bytes();
    eprintln!("the server wrote {sent} bytes of bodies (claimed: 3 x {claimed})");
    assert!(
        sent < claimed,
        "the server wrote {sent} bytes of bodies for 3 objects listed at most {listed} bytes \
         each: at least one body of {claimed} bytes was read in full"
    );
    let text = stoker_testkit::daemon::read_log(&log);
    assert!(
        text.contains("reason=\"changed\"") && text.contains(&claimed.to_string()),
        "the log names the refusal and the length:\n{text}"
    );
}
