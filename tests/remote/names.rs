//! A worker given as a DNS name is resolved again every `remote.resolve_interval_s`: the
//! home daemon runs in a mount namespace of its own whose /etc/hosts is a file this test
//! rewrites, so the name `workers.test` gains a second worker's address and then loses the
//! first's while the home daemon runs. The new address gets connections, the vanished
//! one's are drained, and every job's batches are the local ones.

use std::process::Stdio;

use super::*;

/// Writes `addrs` as the addresses of `workers.test` (in place: the namespace's bind mount
/// keeps showing this file).
fn point(hosts: &Path, addrs: &[&str]) {
    let text: String = addrs
        .iter()
        .map(|a| format!("{a} workers.test\n"))
        .collect();
    std::fs::write(hosts, format!("127.0.0.1 localhost\n{text}")).unwrap();
}

/// Serves jobs until `done` holds (at most 8; the home's own thread may take every unit of
/// one), each equal to `expected`.
fn serve_until(home: &Daemon, world: &World, expected: &[Vec<Got>], done: impl Fn() -> bool) {
    for _ in 0..8 {
        assert_eq!(serve_job(home.socket(), &world.data, 0, || {}), expected);
        if done() {
            return;
        }
        std::thread::sleep(Duration::from_millis(300));
    }
    panic!("the home daemon did not follow the name");
}

#[test]
fn a_worker_name_is_followed_as_its_addresses_come_and_go() {
    let probe = std::process::Command::new("unshare")
        .args(["--mount", "true"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!("SKIPPED a_worker_name_is_followed: unshare --mount is not permitted here");
        return;
    }
    let world = World::new();
    let expected = reference(&world);
    let port = free_port();
    let (_a, log_a, _) = world.worker_at("worker-a", &format!("127.0.0.2:{port}"), "");
    let (_b, log_b, _) = world.worker_at("worker-b", &format!("127.0.0.3:{port}"), "");
    let hosts = world.tmp.path().join("hosts");
    point(&hosts, &["127.0.0.2"]);
    let dir = world.dir("home");
    let config = write_config(
        &dir,
        &format!(
            "[pipeline]\nthreads = 1\n[remote]\nworkers = [\"workers.test:{port}\"]\n\
             secret_file = {:?}\nconnections = 2\nunit_timeout_ms = 3000\n\
             resolve_interval_s = 1\n",
            world.secret
        ),
    );
    let home_log = dir.join("log");
    let stderr = std::fs::File::create(&home_log).unwrap();
    let hosts_arg = hosts.to_str().unwrap();
    let wrapper = [
        "unshare",
        "--mount",
        "sh",
        "-c",
        "mount --bind \"$0\" /etc/hosts && exec \"$@\"",
        hosts_arg,
    ];
    let args = ["--config", config.to_str().unwrap()];
    let home = Daemon::start_wrapped(&dir, &wrapper, &args, Stdio::from(stderr));
    let connected = |log: &Path| read_log(log).matches("home daemon connected").count();

    serve_until(&home, &world, &expected, || connected(&log_a) > 0);
    assert_eq!(connected(&log_b), 0, "{}", read_log(&home_log));

    // A second pod: the connection whose place is now its own moves there.
    point(&hosts, &["127.0.0.2", "127.0.0.3"]);
    std::thread::sleep(Duration::from_millis(1200));
    serve_until(&home, &world, &expected, || connected(&log_b) > 0);

    // The first pod goes: its connections are drained, the second serves.
    point(&hosts, &["127.0.0.3"]);
    std::thread::sleep(Duration::from_millis(1200));
    let drained = || {
        let a = read_log(&log_a);
        a.matches("home daemon connected").count() == a.matches("home daemon disconnected").count()
    };
    serve_until(&home, &world, &expected, drained);
    let log = read_log(&home_log);
    assert!(log.contains("resolves to other addresses"), "{log}");
    assert!(log.contains("leads this connection elsewhere"), "{log}");
}
