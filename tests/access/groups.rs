//! Supplementary groups are the socket's (SO_PEERGROUPS, recorded when the client connected),
//! never read from `/proc/<pid>` later: a client that connected without the allowed group and
//! exited, its pid then taken by a process of the same uid in that group, is refused; a client
//! in the group that exited after connecting is still served as a member.

use super::*;
use std::os::fd::AsFd;
use std::process::{Child, Command, Stdio};

/// The group `allowed_gids` names and the dataset folder belongs to.
const GROUP: u32 = 4242;
const TEST: &str = "groups::groups_are_the_sockets_not_those_of_a_process_that_took_its_pid";

/// In the role `connect`: connects to `$STOKER_TEST_SOCKET`, hands the connection to the
/// parent over stdin (a socket pair) with this process's pid, and exits without a word.
fn connect_and_hand_over() {
    let socket = std::env::var_os("STOKER_TEST_SOCKET").expect("STOKER_TEST_SOCKET");
    let daemon = SeqPacket::connect(Path::new(&socket)).expect("connect to the daemon");
    let parent = SeqPacket::from(std::io::stdin().as_fd().try_clone_to_owned().unwrap());
    let pid = std::process::id().to_string();
    parent
        .send(pid.as_bytes(), &[daemon.as_fd()])
        .expect("hand over");
}

/// A connection to `socket` made by a process of uid [`OTHER_UID`] in `groups` that has
/// exited since, and that process's pid.
fn connection_of_an_exited_client(socket: &Path, groups: &[u32]) -> (SeqPacket, i32) {
    let (mine, theirs) = SeqPacket::pair().unwrap();
    child::rerun_test(TEST, "connect", |cmd| {
        cmd.stdin(Stdio::from(OwnedFd::from(theirs)))
            .env("STOKER_TEST_SOCKET", socket);
        child::as_other_uid_in_groups(cmd, groups);
    });
    let mut buf = [0u8; 64];
    let r = mine
        .recv(&mut buf)
        .unwrap()
        .expect("the handed-over connection");
    let pid = std::str::from_utf8(&buf[..r.len]).unwrap().parse().unwrap();
    let conn = SeqPacket::from(r.fds.into_iter().next().expect("an fd"));
    (conn, pid)
}

/// A process of uid [`OTHER_UID`] in `groups` with the pid `pid` (the kernel's next pid set
/// with `ns_last_pid`, retried while other processes take it first).
fn take_pid(pid: i32, groups: &[u32]) -> Child {
    for _ in 0..200 {
        std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string())
            .expect("write ns_last_pid (root)");
        let mut cmd = Command::new("sleep");
        cmd.arg("60");
        let mut c = child::as_other_uid_in_groups(&mut cmd, groups)
            .spawn()
            .unwrap();
        if i64::from(c.id()) == i64::from(pid) {
            return c;
        }
        let _ = c.kill();
        let _ = c.wait();
    }
    panic!("pid {pid} could not be taken again in 200 tries");
}

/// Sends ATTACH on `conn` and returns the answer.
fn attach_on(conn: &SeqPacket, data: &Path) -> Message {
    let a = Attach {
        job: "grp".into(),
        rank: 0,
        world_size: 1,
        device: stoker::Device::Cpu,
        spec: spec(2, 8, Some(1)),
        dataset: data.to_str().unwrap().into(),
        seed: 1,
        start: Position::default(),
        offset: None,
    };
    conn.send(&Message::Attach(Box::new(a)).encode().unwrap(), &[])
        .unwrap();
    let mut buf = vec![0u8; MAX_MESSAGE_BYTES];
    let r = conn.recv(&mut buf).unwrap().expect("an answer");
    Message::decode(&buf[..r.len]).unwrap()
}

#[test]
fn groups_are_the_sockets_not_those_of_a_process_that_took_its_pid() {
    if child::role().as_deref() == Some("connect") {
        return connect_and_hand_over();
    }
    if !child::can_run_as_other_uid(TEST) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let root = top.join("root");
    let data = root.join("grp");
    write_image_folder(&data, 1, 4, 24);
    // A folder only root and group GROUP may read.
    for e in walk(&data) {
        std::os::unix::fs::chown(&e, Some(0), Some(GROUP)).unwrap();
        let mode = if e.is_dir() { 0o750 } else { 0o640 };
        std::fs::set_permissions(&e, std::fs::Permissions::from_mode(mode)).unwrap();
    }
    for p in [top, &root] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let config = write_config(
        top,
        &format!(
            "[access]\nallowed_gids = [{GROUP}]\ndataset_roots = [\"{}\"]\n",
            root.display()
        ),
    );
    let daemon = Daemon::start_configured(top, &config, &["--threads", "1"]);
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();

    // A client outside the group connects and exits; a member of the group (same uid) takes
    // its pid before the first message.
    let (conn, pid) = connection_of_an_exited_client(daemon.socket(), &[]);
    let mut taker = take_pid(pid, &[GROUP]);
    let answer = attach_on(&conn, &data);
    let _ = taker.kill();
    let _ = taker.wait();
    match answer {
        Message::Error(e) => assert!(
            e.code == ErrorCode::PermissionDenied && e.message.contains("groups []"),
            "{e:?}"
        ),
        other => panic!(
            "a client outside gid {GROUP} was served with the groups of the process that took \
             its pid {pid}: {other:?}"
        ),
    }

    // A member of the group connects and exits before its first message: still a member.
    let (conn, _) = connection_of_an_exited_client(daemon.socket(), &[GROUP]);
    let answer = attach_on(&conn, &data);
    assert!(
        matches!(answer, Message::Attached(_)),
        "a member of gid {GROUP} that exited after connecting: {answer:?}"
    );
    drop(conn);
}

/// `dir` and everything under it.
fn walk(dir: &Path) -> Vec<std::path::PathBuf> {
    let mut all = vec![dir.to_path_buf()];
    for e in std::fs::read_dir(dir).unwrap() {
        let p = e.unwrap().path();
        if p.is_dir() {
            all.extend(walk(&p));
        } else {
            all.push(p);
        }
    }
    all
}
