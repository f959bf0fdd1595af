//! A job a home daemon reads with its client's credentials is never sent to a worker, which
//! could only read as itself: a client served through workers gets exactly what it could read
//! alone, as from a local-only daemon (DESIGN: a client is served only what it could read).

use std::os::unix::fs::PermissionsExt;

use stoker_testkit::child::{self, OTHER_UID};
use stoker_testkit::client_process;

use super::*;

const CLIENT_EPOCHS: &str = "6";

/// The batches and statuses uid [`OTHER_UID`] is served of `data` by `home`.
fn served_to_other_uid(home: &Daemon, data: &Path) -> String {
    std::fs::set_permissions(home.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let args = [
        home.socket().as_os_str(),
        data.as_os_str(),
        std::ffi::OsStr::new(CLIENT_EPOCHS),
    ];
    client_process::run_as_other_uid("statuses", &args)
}

#[test]
fn a_file_the_client_may_not_read_is_not_read_for_it_by_a_worker() {
    let test = "a_file_the_client_may_not_read_is_not_read_for_it_by_a_worker";
    if !child::can_run_as_other_uid(test) {
        return;
    }
    let world = World::new();
    let data = world.tmp.path().join("private");
    write_image_folder(&data, 1, 8, 32);
    // Root's own photo in a folder the client may list: the client may not read it.
    let secret = data.join("c0").join("img003.jpg");
    std::fs::set_permissions(&secret, std::fs::Permissions::from_mode(0o600)).unwrap();
    for dir in [world.tmp.path().to_owned(), data.clone(), data.join("c0")] {
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let (_worker, worker_log, addr) = world.worker("worker");
    let allow = format!(
        "[access]\nallowed_uids = [0, {OTHER_UID}]\ndataset_roots = [{:?}]\n",
        world.tmp.path()
    );
    let (local, _, _) = world.home_configured("local", &[], &allow);
    let (remote, _, _) = world.home_configured("remote", &[&addr], &allow);
    let alone = served_to_other_uid(&local, &data);
    let through_workers = served_to_other_uid(&remote, &data);
    // img003 is index 3 of the single class: replaced (status 1) wherever it falls, so the
    // local daemon never serves index 3 as read (3:0).
    assert!(
        alone.contains(":1") && !alone.contains(" 3:0"),
        "the local daemon served the unreadable file:\n{alone}"
    );
    assert_eq!(
        through_workers, alone,
        "workers served uid {OTHER_UID} other batches than a local-only daemon"
    );
    drop(remote);
    println!("worker log:\n{}", read_log(&worker_log));
}
