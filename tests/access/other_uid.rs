//! Clients of another uid: refused by credentials, denied what they could not read themselves,
//! and not locked out by another uid's idle connections.

use super::*;
use stoker_testkit::client_process;

fn options(data: &str, job: &str, spec: PipelineSpec) -> AttachOptions {
    rank_options(data, job, (0, 1), 7, spec)
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
    let text = client_process::run_as_other_uid("refused", &[daemon.socket().as_os_str()]);
    assert!(text.contains("refused as expected"), "{text}");
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
    let daemon = Daemon::start_configured(top, &config, &["--threads", "2", "--slots", "2"]);
    mode(daemon.socket(), 0o777);
    let out = client_process::run_as_other_uid(
        "permissions",
        &[daemon.socket().as_os_str(), root.as_os_str()],
    );
    assert!(
        out.contains("refused as expected") && out.contains("symlink was refused"),
        "{out}"
    );
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
    let out = client_process::run_as_other_uid("lobby", &[daemon.socket().as_os_str()]);
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
