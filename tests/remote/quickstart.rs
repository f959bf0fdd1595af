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

/// Issue 43 item 5: a worker binds no local socket unless asked. As root, `stokerd --worker`
/// bound the system daemon's socket (/run/stoker/stoker.sock), so root's clients on that host
/// attached to the worker; as another user it bound that user's own socket.
#[test]
fn a_worker_binds_no_local_socket_unless_asked() {
    let dir = tempfile::tempdir().unwrap();
    // What the daemon would bind by default: root's is the system socket.
    // SAFETY: geteuid has no preconditions and cannot fail.
    let default = if unsafe { libc::geteuid() } == 0 {
        PathBuf::from("/run/stoker/stoker.sock")
    } else {
        dir.path().join("stoker").join("stoker.sock")
    };
    if default.exists() {
        eprintln!(
            "SKIPPED a_worker_binds_no_local_socket_unless_asked: {} exists on this host",
            default.display()
        );
        return;
    }
    let secret = dir.path().join("worker.secret");
    let addr = format!("127.0.0.1:{}", free_port());
    let mut worker = std::process::Command::new(stoker_testkit::stokerd_path())
        .args(["--worker", &addr, "--secret-file", secret.to_str().unwrap()])
        .env_remove("STOKER_SOCKET")
        .env("XDG_RUNTIME_DIR", dir.path())
        .env("XDG_CACHE_HOME", dir.path())
        .stderr(std::fs::File::create(dir.path().join("log")).unwrap())
        .spawn()
        .unwrap();
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(30);
    while std::net::TcpStream::connect(&addr).is_err() {
        assert!(
            worker.try_wait().unwrap().is_none(),
            "the worker exited: {}",
            std::fs::read_to_string(dir.path().join("log")).unwrap()
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the worker never listened"
        );
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    // A socket is bound before the worker's port listens, if at all.
    let bound = default.exists();
    let _ = worker.kill();
    let _ = worker.wait();
    if bound {
        let _ = std::fs::remove_file(&default);
        // The folder too, when the worker made it (it is empty then).
        let _ = std::fs::remove_dir(default.parent().unwrap());
    }
    assert!(!bound, "the worker bound {}", default.display());
}

/// The commands of docs/multi-host.md's config-file steps (between its `config-steps`
/// markers), without comments, in order.
fn config_steps() -> Vec<String> {
    let doc = Path::new(env!("CARGO_MANIFEST_DIR")).join("docs/multi-host.md");
    let text = std::fs::read_to_string(doc).unwrap();
    let block = text
        .split("<!-- config-steps")
        .nth(1)
        .and_then(|b| b.split("<!-- /config-steps -->").next())
        .expect("docs/multi-host.md has its config-steps block");
    block
        .lines()
        .skip_while(|l| !l.starts_with("```sh"))
        .skip(1)
        .take_while(|l| !l.starts_with("```"))
        .filter(|l| !l.trim().is_empty() && !l.trim_start().starts_with('#'))
        .map(str::to_owned)
        .collect()
}

/// Issue 43 item 6: docs/multi-host.md's config-file steps, run as written (the paths and port
/// in temp folders): the secret made once and copied to two CPU hosts and the GPU host, each
/// worker started from its config; the home daemon then has units done on both workers and
/// serves the local-only batches. The steps made a secret on each host (every worker but one
/// refused the home) and wrote into /etc/stoker without making it.
#[test]
fn the_documented_config_steps_give_two_workers_one_secret() {
    let world = World::new();
    let expected = reference(&world);
    let steps = config_steps();
    assert_eq!(steps.len(), 5, "{steps:?}");
    let sh = |line: &str, etc: &Path, addr: &str| {
        let line = line
            .replace("/etc/stoker", etc.to_str().unwrap())
            .replace("\"/data\"", &format!("{:?}", world.tmp.path()))
            .replace("0.0.0.0:7411", addr);
        let out = std::process::Command::new("bash")
            .args(["-c", &line])
            .output()
            .unwrap();
        assert!(out.status.success(), "{line}: {out:?}");
        line
    };
    // Once, on one host.
    let first = world.dir("first-host").join("etc-stoker");
    sh(&steps[0], &first, "");
    sh(&steps[1], &first, "");
    let secret = first.join("worker.secret");
    let mut workers = Vec::new();
    let mut addrs = Vec::new();
    for name in ["cpu-1", "cpu-2"] {
        let etc = world.dir(name).join("etc-stoker");
        let addr = format!("127.0.0.1:{}", free_port());
        sh(&steps[2], &etc, &addr);
        // The copy the doc asks for (scp -p keeps the mode).
        std::fs::copy(&secret, etc.join("worker.secret")).unwrap();
        sh(&steps[3], &etc, &addr);
        let start = steps[4]
            .replace("/etc/stoker", etc.to_str().unwrap())
            .replace("stokerd", stoker_testkit::stokerd_path().to_str().unwrap());
        let argv: Vec<&str> = start.split_whitespace().collect();
        let log = std::fs::File::create(world.dir(name).join("log")).unwrap();
        let child = std::process::Command::new(argv[0])
            .args(&argv[1..])
            .env_remove("STOKER_SOCKET")
            .env("XDG_RUNTIME_DIR", world.dir(name))
            .stderr(log)
            .spawn()
            .unwrap();
        workers.push(child);
        addrs.push(addr);
    }
    for addr in &addrs {
        let deadline = Instant::now() + Duration::from_secs(30);
        while std::net::TcpStream::connect(addr).is_err() {
            assert!(
                Instant::now() < deadline,
                "the worker at {addr} never listened"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }
    // The GPU host: the same file where its [remote] section reads it.
    std::fs::copy(&secret, &world.secret).unwrap();
    let named: Vec<&str> = addrs.iter().map(String::as_str).collect();
    let (home, log, metrics) = world.home("gpu-host", &named);
    let batches = serve_job(home.socket(), &world.data, 0, || {});
    let text = stoker_testkit::prometheus::http_get(&metrics, "/metrics").1;
    for mut w in workers {
        let _ = w.kill();
        let _ = w.wait();
    }
    for addr in &addrs {
        assert!(
            remote_units(&text, addr, "done") > 0.0,
            "no unit done on {addr}: {text}\n{}",
            read_log(&log)
        );
    }
    assert_eq!(batches, expected);
}
