//! Whom a client trusts as its daemon, and where a daemon may listen: a daemon of another uid
//! (a relay a neighbour put where this user's socket would be) gets nothing from the Rust
//! client or `stoker status`; a socket folder another uid made first is refused by the client
//! and by the daemon's bind.

use super::*;
use std::process::{Command, Output, Stdio};

/// The `stoker` tool beside the test's `stokerd`.
fn stoker_tool() -> std::path::PathBuf {
    stoker_testkit::stokerd_path().with_file_name("stoker")
}

/// Runs `cmd`, failing the test if it has not exited within 20 s (it serves: killed).
fn exits_soon(cmd: &mut Command, what: &str) -> Output {
    let mut child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let started = Instant::now();
    while child.try_wait().unwrap().is_none() {
        if started.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let out = child.wait_with_output().unwrap();
            panic!("{what} did not exit: {}", child::output_text(&out));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.wait_with_output().unwrap()
}

#[test]
fn a_daemon_of_another_uid_gets_nothing_from_the_client_nor_from_status() {
    if !child::can_run_as_other_uid(
        "a_daemon_of_another_uid_gets_nothing_from_the_client_nor_from_status",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let data = top.join("data");
    write_image_folder(&data, 1, 2, 16);
    // The neighbour's daemon (uid 65534) listens in a folder it made itself in a shared,
    // sticky folder open to everyone (as /tmp/stoker-<victim uid> would be).
    let shared = top.join("tmp");
    let theirs = shared.join("stoker");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o1777)).unwrap();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    let mut mkdir = Command::new("mkdir");
    mkdir.arg(&theirs);
    assert!(child::as_other_uid(&mut mkdir).status().unwrap().success());
    let log = top.join("theirs.log");
    let daemon = Daemon::start_logged_with(&theirs, &["--threads", "1"], &log, |cmd| {
        child::as_other_uid(cmd);
    });
    let attached = Client::attach(
        daemon.socket(),
        options(
            data.to_str().unwrap(),
            "victim-job",
            0,
            1,
            spec(2, 8, Some(1)),
        ),
    );
    let msg = match attached {
        Ok(_) => panic!("attached to a daemon of uid {OTHER_UID}"),
        Err(e) => e.to_string(),
    };
    assert!(
        msg.contains("refusing the stoker daemon") && msg.contains(&format!("uid {OTHER_UID}")),
        "{msg}"
    );
    let out = exits_soon(
        Command::new(stoker_tool())
            .arg("status")
            .arg("--socket")
            .arg(daemon.socket()),
        "stoker status",
    );
    let text = child::output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(text.contains(&format!("runs as uid {OTHER_UID}")), "{text}");
    drop(daemon);
    let logged = read_log(&log);
    assert!(
        !logged.contains("victim-job"),
        "the daemon of uid {OTHER_UID} received the attach:\n{logged}"
    );
}

#[test]
fn a_socket_folder_another_uid_owns_or_may_write_to_is_refused_by_the_daemon() {
    if !child::can_run_as_other_uid(
        "a_socket_folder_another_uid_owns_or_may_write_to_is_refused_by_the_daemon",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let theirs = dir.path().join("theirs");
    let open = dir.path().join("open");
    for d in [&theirs, &open] {
        std::fs::create_dir(d).unwrap();
    }
    std::os::unix::fs::chown(&theirs, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    for (folder, reason) in [
        (&theirs, format!("belongs to uid {OTHER_UID}")),
        (&open, "may write to it".to_string()),
    ] {
        let out = exits_soon(
            Command::new(stoker_testkit::stokerd_path())
                .arg("--socket")
                .arg(folder.join("stoker.sock"))
                .env("XDG_CACHE_HOME", dir.path().join("cache")),
            "stokerd",
        );
        let text = child::output_text(&out);
        assert!(!out.status.success(), "{text}");
        assert!(
            text.contains(&folder.display().to_string()) && text.contains(&reason),
            "{text}"
        );
        assert!(!folder.join("stoker.sock").exists());
    }
}

#[test]
fn a_user_socket_folder_another_uid_made_first_is_refused_by_the_client() {
    if !child::can_run_as_other_uid(
        "a_user_socket_folder_another_uid_made_first_is_refused_by_the_client",
    ) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    // uid 65534's runtime folder; root made its `stoker/` first, open to everyone, with a
    // daemon in it.
    let runtime = top.join("run");
    let folder = runtime.join("stoker");
    std::fs::create_dir_all(&folder).unwrap();
    std::os::unix::fs::chown(&runtime, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    let config = write_config(top, &format!("[access]\nallowed_uids = [0, {OTHER_UID}]\n"));
    let _daemon = Daemon::start_configured(&folder, &config, &["--threads", "1"]);
    std::fs::set_permissions(&folder, std::fs::Permissions::from_mode(0o777)).unwrap();
    std::fs::set_permissions(
        folder.join("stoker.sock"),
        std::fs::Permissions::from_mode(0o777),
    )
    .unwrap();
    let mut cmd = Command::new(stoker_tool());
    cmd.arg("status")
        .env_remove("STOKER_SOCKET")
        .env("XDG_RUNTIME_DIR", &runtime);
    let out = exits_soon(child::as_other_uid(&mut cmd), "stoker status");
    let text = child::output_text(&out);
    assert!(!out.status.success(), "{text}");
    assert!(
        text.contains(&folder.display().to_string()) && text.contains("belongs to uid 0"),
        "{text}"
    );
}
