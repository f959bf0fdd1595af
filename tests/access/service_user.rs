//! A daemon run as a service user (uid [`SERVICE_UID`], with only `CAP_SETUID` and
//! `CAP_SETGID`, as deploy/stokerd.service runs it): a client's own 0700 dataset is resolved
//! and read with the client's credentials; a `socket_group` the service user is not in is
//! refused at start with what to do; root and the daemon's own uid are never locked out by
//! `allowed_gids`, which takes group names.

use super::*;
use std::process::Command;

/// The service user's uid (and gid): neither root nor [`OTHER_UID`], the client.
const SERVICE_UID: u32 = 65533;

/// `setpriv` running its arguments as [`SERVICE_UID`] with no groups and the two
/// capabilities of deploy/stokerd.service (ambient, so they survive the exec).
fn as_service_user() -> Vec<String> {
    let id = SERVICE_UID.to_string();
    vec![
        "setpriv".into(),
        format!("--reuid={id}"),
        format!("--regid={id}"),
        "--clear-groups".into(),
        "--inh-caps=+setuid,+setgid".into(),
        "--ambient-caps=+setuid,+setgid".into(),
    ]
}

/// Whether `setpriv` can run processes as the service user here; says SKIPPED when not.
fn can_run_as_service_user(test: &str) -> bool {
    if !child::can_run_as_other_uid(test) {
        return false;
    }
    let ok = Command::new("setpriv")
        .args(&as_service_user()[1..])
        .arg("true")
        .status()
        .is_ok_and(|s| s.success());
    if !ok {
        eprintln!("SKIPPED {test}: setpriv cannot give uid {SERVICE_UID} CAP_SETUID/CAP_SETGID");
    }
    ok
}

/// The socket folder of a service user: `top/run/stoker`, the service user's, in a folder
/// only root may write to (as systemd's `RuntimeDirectory=` under `/run`), so clients trust it.
fn service_socket_dir(top: &Path) -> std::path::PathBuf {
    let run = top.join("run");
    let dir = run.join("stoker");
    std::fs::create_dir_all(&dir).unwrap();
    std::os::unix::fs::chown(&dir, Some(SERVICE_UID), Some(SERVICE_UID)).unwrap();
    for p in [top, &run, &dir] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    dir
}

/// A daemon run as the service user on `top/run/stoker/stoker.sock` with `config`.
fn service_daemon(top: &Path, config: &str) -> Daemon {
    let dir = service_socket_dir(top);
    let config = write_config(top, config);
    let wrapper = as_service_user();
    let wrapper: Vec<&str> = wrapper.iter().map(String::as_str).collect();
    Daemon::start_wrapped(
        &dir,
        &wrapper,
        &["--threads", "1", "--config", config.to_str().unwrap()],
        std::process::Stdio::inherit(),
    )
}

#[test]
fn a_users_own_0700_dataset_is_served_by_a_daemon_running_as_a_service_user() {
    let test = "a_users_own_0700_dataset_is_served_by_a_daemon_running_as_a_service_user";
    if !can_run_as_service_user(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let home = top.join("home");
    let user = home.join("user");
    let mine = user.join("mine");
    write_image_folder(&mine, 2, 4, 24);
    for e in [&user, &mine, &mine.join("c0"), &mine.join("c1")] {
        std::os::unix::fs::chown(e, Some(OTHER_UID), Some(OTHER_UID)).unwrap();
    }
    for class in ["c0", "c1"] {
        for e in std::fs::read_dir(mine.join(class)).unwrap() {
            std::os::unix::fs::chown(e.unwrap().path(), Some(OTHER_UID), Some(OTHER_UID)).unwrap();
        }
    }
    // The user's own folder, closed to everyone else (the service user included).
    std::fs::set_permissions(&user, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::set_permissions(&home, std::fs::Permissions::from_mode(0o755)).unwrap();
    let daemon = service_daemon(
        top,
        &format!(
            "[server]\nsocket_mode = 0o666\n[access]\nallowed_uids = [{OTHER_UID}]\n\
             dataset_roots = [\"{}\"]\n",
            home.display()
        ),
    );
    let mut cmd = stoker_testkit::client_process::test_client(
        "train",
        &[daemon.socket().as_os_str(), mine.as_os_str()],
    );
    let out = child::as_other_uid(&mut cmd).output().unwrap();
    let text = child::output_text(&out);
    assert!(
        out.status.success() && text.contains("trained 8 images"),
        "uid {OTHER_UID}'s own 0700 dataset under a daemon of uid {SERVICE_UID}: {text}"
    );
}

#[test]
fn a_socket_group_the_service_user_is_not_in_is_refused_at_start_saying_what_to_do() {
    let test = "a_socket_group_the_service_user_is_not_in_is_refused_at_start_saying_what_to_do";
    if !can_run_as_service_user(test) {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let socket_dir = service_socket_dir(top);
    let config = write_config(top, "[server]\nsocket_group = \"4243\"\n");
    let out = child::output_within(
        Command::new(as_service_user()[0].clone())
            .args(&as_service_user()[1..])
            .arg(stoker_testkit::stokerd_path())
            .arg("--socket")
            .arg(socket_dir.join("stoker.sock"))
            .arg("--config")
            .arg(&config)
            .env("XDG_CACHE_HOME", socket_dir.join("cache"))
            .stdin(std::process::Stdio::null()),
        Duration::from_secs(20),
        "stokerd with a socket_group it is not in",
    );
    let text = child::output_text(&out);
    assert_eq!(out.status.code(), Some(78), "{text}");
    assert!(
        text.contains("socket_group \"4243\"")
            && text.contains(&format!("uid {SERVICE_UID}) is not a member"))
            && text.contains("usermod -aG 4243"),
        "{text}"
    );
}

#[test]
fn root_and_the_daemons_own_uid_are_never_locked_out_by_allowed_gids_named_by_name() {
    let test = "root_and_the_daemons_own_uid_are_never_locked_out_by_allowed_gids_named_by_name";
    if !can_run_as_service_user(test) {
        return;
    }
    let Some(group) = stoker::socket::groups::name_of(OTHER_UID) else {
        eprintln!("SKIPPED {test}: gid {OTHER_UID} has no name on this host");
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    let data = top.join("data");
    write_image_folder(&data, 2, 4, 24);
    let daemon = service_daemon(
        top,
        &format!(
            "[server]\nsocket_mode = 0o666\n[access]\nallowed_gids = [\"{group}\"]\n\
             [datasets]\nreg = \"{}\"\n",
            data.display()
        ),
    );
    let socket = daemon.socket().as_os_str();
    let status = |wrapper: &[String]| {
        let mut cmd = Command::new(&wrapper[0]);
        cmd.args(&wrapper[1..])
            .arg(stoker_testkit::stokerd_path().with_file_name("stoker"))
            .args(["status".as_ref(), "--socket".as_ref(), socket]);
        child::output_within(&mut cmd, Duration::from_secs(20), "stoker status")
    };
    // Root (a readiness probe) and the daemon's own uid (its operator).
    for (who, wrapper) in [
        ("root", vec!["env".to_owned()]),
        ("the daemon's uid", as_service_user()),
    ] {
        let out = status(&wrapper);
        let text = child::output_text(&out);
        assert!(
            out.status.success() && text.contains("serving on"),
            "stoker status as {who} under allowed_gids = [{group:?}]: {text}"
        );
    }
    // A member of the group, by its primary gid.
    let mut cmd = stoker_testkit::client_process::test_client("train", &[socket, "reg".as_ref()]);
    let out = child::as_other_uid(&mut cmd).output().unwrap();
    let text = child::output_text(&out);
    assert!(
        out.status.success() && text.contains("trained 8 images"),
        "{text}"
    );
}
