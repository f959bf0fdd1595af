//! The Python package (python/stoker) against the real stokerd, through libstoker.so.

use std::path::Path;
use std::process::Command;

use stoker_suite::{write_image_folder, Daemon};

#[test]
fn python_package_tests_pass_against_a_daemon() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let lib = stoker_suite::stokerd_path()
        .parent()
        .unwrap()
        .join("libstoker.so");
    assert!(lib.exists(), "no {}", lib.display());
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = write_image_folder(&data, 3, 5, 24);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let out = match Command::new("python3")
        .args(["-m", "unittest", "discover", "-v", "-s"])
        .arg(root.join("python/tests"))
        .env("STOKER_LIB", &lib)
        .env("STOKER_SOCKET", daemon.socket())
        .env("STOKER_TEST_DATA", &data)
        .env("STOKER_TEST_SAMPLES", n.to_string())
        .output()
    {
        Ok(o) => o,
        Err(e) => {
            eprintln!("SKIPPED python_package_tests_pass_against_a_daemon: no python3: {e}");
            return;
        }
    };
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "python tests failed:\n{stderr}");
    assert!(
        !stderr.contains("skipped"),
        "python tests were skipped:\n{stderr}"
    );
}
