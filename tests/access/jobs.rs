//! Jobs belong to the uid that made them: another uid's attach under the same key makes a job
//! of its own (so torchrun's predictable `ADDR:PORT/dataset` keys stay usable by both users,
//! and neither can take the other's ranks or data share), its STATS count for its own job
//! only, and `stoker status` shows each user only their own jobs (root sees all).

use super::*;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use stoker::protocol::DaemonStatus;

/// torchrun's key for a job on `reg`: anyone on the host can guess it.
const KEY: &str = "10.0.0.1:29500/reg";
const PRIVATE_KEY: &str = "victim-private-run";

/// `stoker status --json` against `socket`, as root or as uid [`OTHER_UID`].
fn status_as(socket: &Path, other_uid: bool) -> DaemonStatus {
    let tool = stoker_testkit::stokerd_path().with_file_name("stoker");
    let mut cmd = Command::new(tool);
    cmd.args(["status", "--json", "--socket"]).arg(socket);
    if other_uid {
        child::as_other_uid(&mut cmd);
    }
    let out = child::output_within(&mut cmd, Duration::from_secs(20), "stoker status");
    assert!(out.status.success(), "{}", child::output_text(&out));
    serde_json::from_slice(&out.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", child::output_text(&out)))
}

#[test]
fn another_uids_attach_under_the_same_key_is_a_job_of_its_own() {
    if !child::can_run_as_other_uid("another_uids_attach_under_the_same_key_is_a_job_of_its_own") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let data = top.join("data");
    write_image_folder(&data, 2, 4, 24);
    let private = top.join("victim-private-data");
    write_image_folder(&private, 1, 4, 24);
    let config = write_config(
        top,
        &format!(
            "[access]\nallowed_uids = [0, {OTHER_UID}]\n[datasets]\nreg = \"{}\"\n",
            data.display()
        ),
    );
    let daemon = Daemon::start_configured(top, &config, &["--threads", "1", "--slots", "2"]);
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Root's job under the guessable key (rank 0 of 2; rank 1 yet to come), and a private one.
    // The seed and spec the intruder guesses (stoker-test-client's).
    let guessed = rank_options("reg", KEY, (0, 2), 7, spec(2, 16, None));
    let mut victim = Client::attach(daemon.socket(), guessed).unwrap();
    let _held = victim.next_batch().unwrap().unwrap();
    let private_spec = spec(2, 16, None);
    let mut mine = Client::attach(
        daemon.socket(),
        options(private.to_str().unwrap(), PRIVATE_KEY, 0, 1, private_spec),
    )
    .unwrap();
    let _held_too = mine.next_batch().unwrap().unwrap();

    let mut cmd = stoker_testkit::client_process::test_client(
        "intruder",
        &[daemon.socket().as_os_str(), KEY.as_ref()],
    );
    let mut intruder = child::as_other_uid(&mut cmd)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut said = String::new();
    for line in BufReader::new(intruder.stdout.take().unwrap()).lines() {
        let line = line.unwrap();
        said.push_str(&line);
        said.push('\n');
        if line == "ready" {
            break;
        }
    }
    println!("uid {OTHER_UID} under root's key {KEY:?}:\n{said}");
    let as_root = status_as(daemon.socket(), false);
    let as_other = status_as(daemon.socket(), true);
    let _ = intruder.kill();
    let _ = intruder.wait();

    assert!(
        said.contains("rank 0: created_job true ranks_attached 1")
            && said.contains("rank 1: created_job false ranks_attached 2"),
        "uid {OTHER_UID}'s ranks joined root's job or were refused:\n{said}"
    );
    let keyed: Vec<_> = as_root.jobs.iter().filter(|j| j.job == KEY).collect();
    assert_eq!(
        keyed.len(),
        2,
        "root sees both jobs of key {KEY:?}: {keyed:?}"
    );
    let roots = keyed.iter().find(|j| j.owner == 0).expect("root's job");
    let theirs = keyed
        .iter()
        .find(|j| j.owner == OTHER_UID)
        .expect("their job");
    assert_eq!(roots.ranks, vec![0], "{roots:?}");
    assert!(
        roots.stalls.iter().all(|s| s.rank == 0),
        "uid {OTHER_UID}'s STATS counted for root's job: {roots:?}"
    );
    assert_eq!(theirs.ranks, vec![0, 1], "{theirs:?}");
    assert!(
        theirs.stalls.iter().any(|s| s.rank == 1),
        "their STATS count for their own job: {theirs:?}"
    );
    assert!(as_root.jobs.iter().any(|j| j.job == PRIVATE_KEY));
    let shown = serde_json::to_string(&as_other).unwrap();
    assert!(
        as_other.jobs.iter().all(|j| j.owner == OTHER_UID)
            && as_other.jobs.len() == 1
            && !shown.contains(PRIVATE_KEY)
            && !shown.contains("victim-private-data"),
        "uid {OTHER_UID} sees another user's jobs: {shown}"
    );
}
