//! Limits and fair share per user: one uid cannot hold every job or ring (the per-uid caps
//! default to half the totals, and a refusal names the user's own limit), and one uid's many
//! jobs do not take another's share of the workers (shared evenly between users by default).

use super::*;
use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};

/// A daemon serving `reg` (2 classes x `per_class` images of `side` px) to root and uid
/// [`OTHER_UID`], with `limits` in its `[limits]` table, reachable by both.
fn shared_daemon(top: &Path, limits: &str, per_class: u32, side: u32, threads: &str) -> Daemon {
    let data = top.join("data");
    write_image_folder(&data, 2, per_class, side);
    let config = write_config(
        top,
        &format!(
            "[limits]\n{limits}\n[access]\nallowed_uids = [0, {OTHER_UID}]\n[datasets]\n\
             reg = \"{}\"\n",
            data.display()
        ),
    );
    let daemon = Daemon::start_configured(top, &config, &["--threads", threads]);
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    daemon
}

/// `stoker-test-client hog <socket> <n> <seconds>` as uid [`OTHER_UID`], and what it said up
/// to its `attached` line.
pub(super) fn hog(
    socket: &Path,
    n: usize,
    seconds: f64,
) -> (Child, BufReader<std::process::ChildStdout>, String) {
    let (n, seconds) = (n.to_string(), seconds.to_string());
    let mut cmd = stoker_testkit::client_process::test_client(
        "hog",
        &[socket.as_os_str(), n.as_ref(), seconds.as_ref()],
    );
    let mut child = child::as_other_uid(&mut cmd)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(child.stdout.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 || line.trim() == "attached" {
            break;
        }
        said.push_str(&line);
    }
    (child, out, said)
}

#[test]
fn one_user_cannot_hold_every_job_or_ring() {
    if !child::can_run_as_other_uid("one_user_cannot_hold_every_job_or_ring") {
        return;
    }
    for (limits, limit) in [
        ("max_jobs = 2", "limits.max_jobs_per_uid) is 1"),
        ("max_clients = 2", "limits.max_clients_per_uid) is 1"),
    ] {
        let dir = tempfile::tempdir().unwrap();
        let daemon = shared_daemon(dir.path(), limits, 2, 24, "1");
        let (mut child, _, said) = hog(daemon.socket(), 2, 0.0);
        let mine = Client::attach(
            daemon.socket(),
            options("reg", "root-job", 0, 1, spec(2, 16, None)),
        );
        let _ = child.kill();
        let _ = child.wait();
        println!("{limits}: uid {OTHER_UID} said:\n{said}");
        assert!(
            said.contains("job 0: attached")
                && said.contains("job 1: refused")
                && said.contains(&format!("uid {OTHER_UID}"))
                && said.contains(limit),
            "{limits}: uid {OTHER_UID} took every place or was refused without its own limit:\n{said}"
        );
        if let Err(e) = mine {
            panic!("{limits}: root was locked out by uid {OTHER_UID}'s jobs: {e}");
        }
    }
}

#[test]
fn four_jobs_of_one_user_do_not_take_anothers_share() {
    if !child::can_run_as_other_uid("four_jobs_of_one_user_do_not_take_anothers_share") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let daemon = shared_daemon(dir.path(), "", 16, 96, "1");
    let seconds = 4.0;
    let (mut child, mut out, said) = hog(daemon.socket(), 4, seconds);
    assert_eq!(said.matches(": attached").count(), 4, "{said}");
    let mut mine = Client::attach(
        daemon.socket(),
        options("reg", "root-job", 0, 1, spec(2, 16, None)),
    )
    .unwrap();
    let t0 = Instant::now();
    let mut root = 0u64;
    while t0.elapsed() < Duration::from_secs_f64(seconds) {
        root += mine.next_batch().unwrap().unwrap().n() as u64;
    }
    let mut rest = String::new();
    out.read_line(&mut rest).unwrap();
    let _ = child.wait();
    let theirs: u64 = rest
        .trim()
        .strip_prefix("delivered ")
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("{rest:?}"));
    let share = root as f64 / (root + theirs) as f64;
    println!(
        "root's 1 job: {root} images, uid {OTHER_UID}'s 4 jobs: {theirs} images in {seconds} s; \
         root's share {share:.2} (even split between users: 0.50, per job: 0.20)"
    );
    assert!(
        share > 0.33,
        "root's one job got {share:.2} of the workers beside 4 jobs of uid {OTHER_UID}"
    );
}
