//! Clients of another uid: refused by credentials, denied what they could not read themselves,
//! and not locked out by another uid's idle connections.

use super::*;

fn options(data: &str, job: &str, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (0, 1), 7, spec)
}

/// Set in the child process of `a_process_of_another_uid_is_refused_by_its_credentials`: the
/// socket to attach to.
const UID_CHILD_ENV: &str = "STOKER_TEST_UID_CHILD";

/// Not a test on its own: the client process, running as another uid, that the credential
/// test starts. Without the variable it does nothing.
#[test]
fn child_attaches_as_another_uid() {
    let Some(socket) = std::env::var_os(UID_CHILD_ENV) else {
        return;
    };
    let err = Client::attach(
        Path::new(&socket),
        options("/nowhere", "j", spec(2, 8, Some(1))),
    )
    .expect_err("a process of another uid was let in");
    assert_eq!(err.code(), Some(ErrorCode::PermissionDenied), "{err}");
    assert!(
        err.to_string().contains(&format!("uid {OTHER_UID}")),
        "{err}"
    );
    println!("refused as expected: {err}");
}

#[test]
fn a_process_of_another_uid_is_refused_by_its_credentials() {
    use std::os::unix::fs::PermissionsExt;
    if !child::can_run_as_other_uid("a_process_of_another_uid_is_refused_by_its_credentials") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    // The default rules: the daemon's own uid (root) only.
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    // Let the other uid reach the socket, so that only the credential check stands.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let out = child::rerun_test(
        "other_uid::child_attaches_as_another_uid",
        "attach",
        |cmd| {
            child::as_other_uid(cmd.env(UID_CHILD_ENV, daemon.socket()));
        },
    );
    let text = child::output_text(&out);
    assert!(text.contains("refused as expected"), "{text}");
}

// ---------------------------------------------------------------------------------------
// (4) Access decided with the client's credentials, at open time. (5) below.

/// The socket, and the folder the child of another uid works in.
const CHILD_SOCKET_ENV: &str = "STOKER_HOSTILE_SOCKET";

const CHILD_DIR_ENV: &str = "STOKER_HOSTILE_DIR";

/// Runs this test binary's `hostile_child` test as uid [`OTHER_UID`] in `mode`; returns its
/// output, failing when it fails.
fn run_child(mode: &str, socket: &Path, dir: &Path) -> String {
    let out = child::rerun_test("other_uid::hostile_child", mode, |cmd| {
        child::as_other_uid(cmd.env(CHILD_SOCKET_ENV, socket).env(CHILD_DIR_ENV, dir));
    });
    child::output_text(&out)
}

/// Not a test on its own: the client process of another uid that the permission and lobby
/// tests start. Without the variable it does nothing.
#[test]
fn hostile_child() {
    let Some(mode) = child::role() else {
        return;
    };
    let socket = PathBuf::from(std::env::var_os(CHILD_SOCKET_ENV).unwrap());
    let dir = PathBuf::from(std::env::var_os(CHILD_DIR_ENV).unwrap());
    match mode.as_str() {
        "permissions" => child_permissions(&socket, &dir),
        "lobby" => child_lobby(&socket),
        other => panic!("unknown child mode {other}"),
    }
}

fn child_permissions(socket: &Path, root: &Path) {
    let attach = |data: &Path, epochs: u32| {
        Client::attach(
            socket,
            options(data.to_str().unwrap(), "perm", spec(4, 16, Some(epochs))),
        )
    };
    for unreadable in ["secret", "secret.tsv"] {
        let err = attach(&root.join(unreadable), 1).expect_err(unreadable);
        assert_eq!(
            err.code(),
            Some(ErrorCode::PermissionDenied),
            "{unreadable}: {err}"
        );
        assert!(
            err.to_string().contains(&format!("uid {OTHER_UID}")),
            "{err}"
        );
        println!("refused as expected: {err}");
    }
    // A folder it may read: served; then one of its files becomes a symlink to a file it may
    // not read, outside the roots. From then on that sample fails (policy fail).
    let mut c = attach(&root.join("open"), 6).unwrap();
    let first = got(&c.next_batch().unwrap().unwrap());
    assert!(first.status.iter().all(|&s| s == SampleStatus::Ok as u8));
    let swapped = root.join("open/c0/img002.jpg");
    std::fs::remove_file(&swapped).unwrap();
    // Beside the roots: the parent test wrote it, mode 0600, owned by root.
    let outside = root.parent().unwrap().join("outside/secret.jpg");
    std::os::unix::fs::symlink(outside, &swapped).unwrap();
    let rest = drain(&mut c);
    let late: Vec<&Got> = rest.iter().filter(|g| g.epoch >= 4).collect();
    assert_eq!(late.len(), 2);
    for g in late {
        for (k, &i) in g.indices.iter().enumerate() {
            let want = if i == 2 {
                SampleStatus::Failed
            } else {
                SampleStatus::Ok
            };
            assert_eq!(g.status[k], want as u8, "index {i} in {g:?}");
        }
    }
    println!("the swapped-in symlink was refused");
}

#[test]
fn a_client_uid_gets_permission_denied_for_what_it_cannot_read_itself() {
    if !child::can_run_as_other_uid(
        "a_client_uid_gets_permission_denied_for_what_it_cannot_read_itself",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let root = top.join("root");
    let mode =
        |p: &Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    stoker_testkit::write_image_folder(&root.join("secret"), 1, 4, 24);
    mode(&root.join("secret"), 0o700);
    stoker_testkit::write_image_folder(&root.join("open"), 1, 4, 24);
    let list = root.join("secret.tsv");
    std::fs::write(
        &list,
        format!("{}\t0\n", root.join("open/c0/img000.jpg").display()),
    )
    .unwrap();
    mode(&list, 0o600);
    let outside = top.join("outside/secret.jpg");
    std::fs::create_dir_all(outside.parent().unwrap()).unwrap();
    write_jpeg(&outside, 24, 24, 77);
    mode(&outside, 0o600);
    // The child owns the open dataset: it may swap its files.
    for p in [root.join("open"), root.join("open/c0")] {
        std::os::unix::fs::chown(&p, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    for e in std::fs::read_dir(root.join("open/c0")).unwrap() {
        std::os::unix::fs::chown(e.unwrap().path(), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    for p in [top, &root, &top.join("outside")] {
        mode(p, 0o755);
    }
    let config = write_config(
        top,
        &format!(
            "[pipeline]\nbad_samples = \"fail\"\n[access]\nallowed_uids = [0, {OTHER_UID}]\n\
             dataset_roots = [\"{}\"]\n",
            root.display()
        ),
    );
    let daemon = Daemon::start(
        top,
        &[
            "--threads",
            "2",
            "--slots",
            "2",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    mode(daemon.socket(), 0o777);
    let out = run_child("permissions", daemon.socket(), &root);
    assert!(
        out.contains("refused as expected") && out.contains("symlink was refused"),
        "{out}"
    );
}

// ---------------------------------------------------------------------------------------
// (7) Connections that never attach.

fn child_lobby(socket: &Path) {
    let t0 = Instant::now();
    let mut c = Client::attach(socket, options("reg", "lobby-other", spec(2, 16, Some(1))))
        .expect("the other uid attaches");
    assert!(c.next_batch().unwrap().is_some());
    let took = t0.elapsed();
    println!("attached and received in {} ms", took.as_millis());
    assert!(took < Duration::from_secs(1), "attach took {took:?}");
}

#[test]
fn idle_connections_of_one_uid_do_not_lock_out_another_under_a_low_fd_limit() {
    if !child::can_run_as_other_uid(
        "idle_connections_of_one_uid_do_not_lock_out_another_under_a_low_fd_limit",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stoker_testkit::write_image_folder(&data, 2, 4, 24);
    let config = write_config(
        dir.path(),
        &format!(
            "[access]\nallowed_uids = [0, {OTHER_UID}]\n[datasets]\nreg = \"{}\"\n",
            data.display()
        ),
    );
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged_with(
        dir.path(),
        &["--threads", "1", "--config", config.to_str().unwrap()],
        &log,
        |cmd| {
            // SAFETY: setrlimit is async-signal-safe; nothing else runs in the child yet.
            unsafe {
                cmd.pre_exec(|| {
                    let lim = libc::rlimit {
                        rlim_cur: 200,
                        rlim_max: 200,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                })
            };
        },
    );
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    // Index once, so the other uid's attach measures the lobby, not the walk.
    let mut warm = Client::attach(
        daemon.socket(),
        options("reg", "warm", spec(2, 16, Some(1))),
    )
    .unwrap();
    drain(&mut warm);
    drop(warm);
    let idle: Vec<SeqPacket> = (0..300)
        .map(|_| SeqPacket::connect(daemon.socket()).unwrap())
        .collect();
    let out = run_child("lobby", daemon.socket(), dir.path());
    let line = out.lines().find(|l| l.contains("attached and received"));
    println!("uid {OTHER_UID}, beside 300 idle connections: {line:?}");
    assert!(line.is_some(), "{out}");
    drop(idle);
    drop(daemon);
    let text = read_log(&log);
    let closed = text.matches("connection closed before attaching").count();
    assert!(
        closed > 0 && closed <= 60,
        "{closed} lobby lines (rate-limited):\n{text}"
    );
}
