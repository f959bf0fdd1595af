//! The README's two commands for adding a CPU host: flags only, no config file.

use super::*;

/// `stokerd --worker ADDR --secret-file F --dataset-root DIR` on the CPU host makes the secret
/// (0600, in a 0700 folder) since it does not exist yet; `stokerd --remote-worker ADDR
/// --secret-file F` on the GPU host then serves the local batches bit for bit, with units done
/// on the worker.
#[test]
fn the_readme_two_commands_add_a_worker() {
    use std::os::unix::fs::PermissionsExt;
    let world = World::new();
    let expected = reference(&world);
    let secret = world.tmp.path().join("keys").join("worker.secret");
    let addr = format!("127.0.0.1:{}", free_port());
    let root = world.tmp.path().to_str().unwrap();
    let dir = world.dir("cpu-host");
    let args = [
        "--worker",
        &addr,
        "--secret-file",
        secret.to_str().unwrap(),
        "--dataset-root",
        root,
        "--threads",
        "1",
    ];
    let _worker = Daemon::start_logged(&dir, &args, &dir.join("log"));
    let mode = |p: &Path| std::fs::metadata(p).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode(&secret), 0o600);
    assert_eq!(mode(secret.parent().unwrap()), 0o700);
    assert_eq!(std::fs::read_to_string(&secret).unwrap().trim().len(), 64);
    let dir = world.dir("gpu-host");
    let metrics = format!("127.0.0.1:{}", free_port());
    let args = [
        "--remote-worker",
        &addr,
        "--secret-file",
        secret.to_str().unwrap(),
        "--threads",
        "1",
        "--metrics-listen",
        &metrics,
    ];
    let home = Daemon::start_logged(&dir, &args, &dir.join("log"));
    let batches = serve_job(home.socket(), &world.data, 0, || {});
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    assert!(remote_units(&text, &addr, "done") > 0.0, "{text}");
    assert_eq!(batches, expected);
}

/// A secret file the worker cannot make is a configuration error (exit 78) naming the file.
#[test]
fn a_secret_file_the_worker_cannot_make_is_refused_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let secret = "/proc/self/no-such-folder/worker.secret";
    let addr = format!("127.0.0.1:{}", free_port());
    let out = std::process::Command::new(stoker_testkit::stokerd_path())
        .args(["--worker", &addr, "--secret-file", secret])
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .env("XDG_CACHE_HOME", dir.path())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    assert!(stderr.contains(secret), "{stderr}");
}
