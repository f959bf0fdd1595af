//! `stokerd --detach` and `--idle-exit`, the way the Python package starts a per-user daemon,
//! and the data stall a real client reports, as `stoker status` shows it.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use stoker::protocol::DaemonStatus;
use stoker::{AttachOptions, Client, PipelineSpec};
use stoker_testkit::{stokerd_path, write_image_folder};

fn status(socket: &Path) -> DaemonStatus {
    stoker_tool::cli::status::query(socket).expect("status")
}

fn alive(pid: u32) -> bool {
    // A zombie is not alive: its stat says Z.
    std::fs::read_to_string(format!("/proc/{pid}/stat"))
        .map(|s| {
            !s.rsplit(')')
                .next()
                .unwrap_or("")
                .trim_start()
                .starts_with('Z')
        })
        .unwrap_or(false)
}

#[test]
fn a_detached_daemon_serves_reports_the_stall_and_exits_when_idle() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 8, 40);
    let socket = dir.path().join("u").join("stoker.sock");
    let log = std::fs::File::create(dir.path().join("stokerd.log")).unwrap();
    let started = Instant::now();
    let out = Command::new(stokerd_path())
        .args([
            "--detach",
            "--threads",
            "2",
            "--idle-exit",
            "2",
            "--socket-mode",
            "600",
        ])
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .stdout(log.try_clone().unwrap())
        .stderr(log)
        .status()
        .unwrap();
    assert!(out.success(), "stokerd --detach: {out}");
    // The starter returned because the daemon listens, not after a guess.
    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&socket).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o600);
    let pid = status(&socket).pid;
    assert!(alive(pid));
    assert!(started.elapsed() < Duration::from_secs(30));

    let mut opts = AttachOptions::new("stall", data.to_str().unwrap(), PipelineSpec::train(4, 16));
    opts.connect_timeout = Duration::ZERO;
    let mut client = Client::attach(&socket, opts).unwrap();
    assert!(client.attached().accepts_stats);
    // Compute-bound: 30 ms of "work" per batch, well over the time a batch of 4 tiny images
    // takes, for longer than two report intervals.
    let until = Instant::now() + Duration::from_millis(1300);
    while Instant::now() < until {
        let batch = client.next_batch().unwrap().expect("a batch");
        drop(batch);
        std::thread::sleep(Duration::from_millis(30));
    }
    let mine = client.stall();
    assert!(mine.batches > 10, "{mine:?}");
    assert!(mine.wait_fraction() < 0.5, "{mine:?}");
    let shown = status(&socket);
    let job = shown.jobs.iter().find(|j| j.job == "stall").expect("job");
    let [rank] = job.stalls.as_slice() else {
        panic!("one rank's stall: {:?}", job.stalls)
    };
    assert_eq!(rank.rank, 0);
    assert!(rank.batches > 0 && rank.batches <= mine.batches);
    assert!(rank.wait_fraction < 0.5, "{rank:?}");
    let text = stoker_tool::cli::status::render(&shown);
    // The job's name, then its owner (this user), then the rank.
    assert!(
        text.contains("  stall (") && text.contains(") rank 0: wait "),
        "{text}"
    );

    // Busy while attached; after the detach, gone within the idle time (plus a tick).
    drop(client);
    let detached = Instant::now();
    while alive(pid) && detached.elapsed() < Duration::from_secs(20) {
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(!alive(pid), "the daemon did not exit after its idle time");
    // The supervisor looks every quarter of the idle time, so the idle time counts from
    // its last look that saw the connection: at most 0.5 s before the detach.
    assert!(
        detached.elapsed() >= Duration::from_millis(1450),
        "{:?}",
        detached.elapsed()
    );
    assert!(!socket.exists(), "the socket file is left behind");
}

#[test]
fn a_detached_daemon_that_cannot_start_returns_its_exit_code() {
    let dir = tempfile::tempdir().unwrap();
    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[server]\nno_such_key = 1\n").unwrap();
    let out = Command::new(stokerd_path())
        .args(["--detach", "--config"])
        .arg(&bad)
        .arg("--socket")
        .arg(dir.path().join("s.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(78), "{out:?}");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("no_such_key"), "{err}");
}

/// Issue 43 item 4: outside systemd, a detached daemon logs to a named file (stokerd.log
/// beside its socket, or --log-file), not to the terminal of the admin who started it (it kept
/// writing there after the starter returned).
#[test]
fn a_detached_daemon_logs_to_a_named_file_not_the_terminal() {
    let dir = tempfile::tempdir().unwrap();
    let socket = dir.path().join("u").join("stoker.sock");
    let out = Command::new(stokerd_path())
        .args(["--detach", "--idle-exit", "2"])
        .arg("--socket")
        .arg(&socket)
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let log = dir.path().join("u").join("stokerd.log");
    assert!(
        err.contains(&format!("it logs to {}", log.display())),
        "{err}"
    );
    assert!(
        !err.contains("stokerd starting"),
        "the log came to the terminal: {err}"
    );
    let pid = status(&socket).pid;
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("stokerd starting"), "{text}");
    use std::os::unix::fs::PermissionsExt;
    assert_eq!(
        std::fs::metadata(&log).unwrap().permissions().mode() & 0o777,
        0o600
    );
    let named = dir.path().join("elsewhere.log");
    let out = Command::new(stokerd_path())
        .args(["--detach", "--idle-exit", "2", "--log-file"])
        .arg(&named)
        .arg("--socket")
        .arg(dir.path().join("v.sock"))
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    assert!(std::fs::read_to_string(&named)
        .unwrap()
        .contains("stokerd starting"));
    // Both go away after their idle time.
    let until = Instant::now() + Duration::from_secs(20);
    while alive(pid) && Instant::now() < until {
        std::thread::sleep(Duration::from_millis(100));
    }
}
