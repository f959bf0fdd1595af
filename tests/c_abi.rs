//! The C test client (`tests/c/client.c`, which includes only `stoker.h`) compiled with the
//! system C compiler against `libstoker.so`, run as real processes against a real `stokerd`.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stoker_testkit::daemon::build_c_client;
use stoker_testkit::{write_image_folder, Daemon};

/// Compiles the C client into `dir`; `None` (skipped loudly) without a C compiler.
fn build_client(dir: &Path, test: &str) -> Option<PathBuf> {
    build_c_client(dir, "client.c", test)
}

/// Runs the C client. It does not retry connecting: every test here starts its daemon first,
/// and the missing-daemon test would otherwise wait the 10 s default.
fn run(exe: &Path, args: &[&str]) -> Output {
    Command::new(exe)
        .args(args)
        .env("STOKER_CONNECT_TIMEOUT", "0")
        .output()
        .unwrap()
}

#[test]
fn c_client_reports_a_missing_daemon_with_the_connect_error() {
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_client(dir.path(), "c_client_reports_a_missing_daemon") else {
        return;
    };
    let sock = dir.path().join("nobody.sock");
    let out = run(&exe, &[sock.to_str().unwrap(), "/data", "1", "4", "32"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("STOKER_ERR_CONNECT"), "{stderr}");
    assert!(stderr.contains("no stoker daemon at"), "{stderr}");
}

/// Two C clients, ranks 0 and 1 of one job, read one epoch each: every sample index appears
/// exactly once across them (DistributedSampler semantics), and every check in client.c holds
/// (labels < classes, statuses, DLPack shape/dtype, zero-copy labels/indices).
#[test]
fn two_c_client_ranks_share_one_epoch_exactly() {
    const TEST: &str = "two_c_client_ranks_share_one_epoch_exactly";
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_client(dir.path(), TEST) else {
        return;
    };
    let data = dir.path().join("data");
    assert_eq!(write_image_folder(&data, 3, 8, 64), 24);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let sock = daemon.socket().to_str().unwrap().to_owned();
    let data = data.to_str().unwrap().to_owned();
    // 24 samples, 2 ranks, batches of 4: 3 steps per epoch per rank.
    let spawn = |rank: &str| {
        Command::new(&exe)
            .args([&sock, &data, "3", "4", "32", rank, "2", "c-job", "7"])
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap()
    };
    let children = [spawn("0"), spawn("1")];
    let mut seen = BTreeSet::new();
    let mut total = 0;
    for child in children {
        let out = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            out.status.success(),
            "client failed ({}):\n{stdout}\n{stderr}",
            out.status
        );
        let summary = stdout.lines().find(|l| l.starts_with("summary")).unwrap();
        assert!(summary.contains("batches=3 samples=12"), "{summary}");
        assert!(summary.contains("classes=3 dataset_len=24"), "{summary}");
        for line in stdout.lines().filter(|l| l.starts_with("batch ")) {
            let f: Vec<u64> = line[6..].split(' ').map(|x| x.parse().unwrap()).collect();
            assert_eq!(f[0], 0, "epoch of {line}");
            assert_eq!(f[2] as usize, f.len() - 3, "n of {line}");
            for &i in &f[3..] {
                total += 1;
                seen.insert(i);
            }
        }
    }
    assert_eq!(total, 24, "every rank got its 12 samples");
    assert_eq!(
        seen,
        (0..24).collect(),
        "ranks are disjoint and cover the epoch"
    );
}
