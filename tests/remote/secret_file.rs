//! A secret file others may read, or owned by another user, stops the daemon at start with
//! an error naming the file and the reason (as ssh refuses such a key).

use std::os::unix::fs::PermissionsExt;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stoker_testkit::child::OTHER_UID;
use stoker_testkit::daemon::stokerd_path;

use super::*;

/// Starts stokerd with `config`; its stderr once it exits, or `None` when it still runs
/// after 10 s (it started).
fn refused_start(dir: &Path, config: &str) -> Option<String> {
    let config = write_config(dir, config);
    let log = dir.join("stderr");
    let mut child = Command::new(stokerd_path())
        .args(["--socket", dir.join("stoker.sock").to_str().unwrap()])
        .args(["--config", config.to_str().unwrap()])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&log).unwrap())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(10);
    while Instant::now() < deadline {
        if let Some(status) = child.try_wait().unwrap() {
            assert!(!status.success());
            return Some(read_log(&log));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    None
}

#[test]
fn a_secret_file_of_another_user_or_readable_by_others_is_refused_naming_it() {
    let world = World::new();
    let foreign = world.tmp.path().join("foreign-secret");
    std::fs::write(&foreign, "a-test-secret-of-some-length\n").unwrap();
    std::fs::set_permissions(&foreign, std::fs::Permissions::from_mode(0o600)).unwrap();
    std::os::unix::fs::chown(&foreign, Some(OTHER_UID), None).unwrap();
    let shared = world.tmp.path().join("group-secret");
    std::fs::write(&shared, "a-test-secret-of-some-length\n").unwrap();
    // Group-writable: refused even when root owns it (a root-owned secret may be 0640, as a
    // Kubernetes Secret under an fsGroup is mounted 0440; auth.rs's unit test covers that).
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o660)).unwrap();
    let port = free_port();
    let cases = [
        ("worker", &foreign, format!("owned by uid {OTHER_UID}")),
        ("remote", &foreign, format!("owned by uid {OTHER_UID}")),
        ("worker", &shared, "mode 660".to_owned()),
    ];
    for (i, (section, file, reason)) in cases.iter().enumerate() {
        let keys = match *section {
            "worker" => format!("listen = \"127.0.0.1:{port}\"\n"),
            _ => format!("workers = [\"127.0.0.1:{port}\"]\n"),
        };
        let config = format!("[{section}]\n{keys}secret_file = {file:?}\n");
        let dir = world.dir(&format!("case-{i}"));
        let err = refused_start(&dir, &config)
            .unwrap_or_else(|| panic!("[{section}] started with the secret {file:?}"));
        assert!(
            err.contains(file.to_str().unwrap()) && err.contains(reason.as_str()),
            "[{section}] {reason}: {err}"
        );
        assert!(!err.contains("a-test-secret"), "{err}");
    }
}
