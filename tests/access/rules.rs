//! Allowed uids and gids, dataset roots, quotas and limits.

use super::*;

// ---------------------------------------------------------------------------------------
// Access control.

#[test]
fn a_client_outside_the_allowed_uids_and_gids_is_refused() {
    let test = "a_client_outside_the_allowed_uids_and_gids_is_refused";
    if !child::can_run_as_other_uid(test) {
        return;
    }
    let other = 4242;
    for (gids, served) in [(other, false), (OTHER_UID, true)] {
        let dir = tempfile::tempdir().unwrap();
        let data = tiny_dataset(dir.path(), 1, 2);
        let config = write_config(
            dir.path(),
            &format!(
                "[access]\nallowed_uids = [{other}]\nallowed_gids = [{gids}]\n[datasets]\n\
                 reg = \"{}\"\n",
                data.display()
            ),
        );
        let daemon = Daemon::start_configured(dir.path(), &config, &[]);
        std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
        std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();
        // The daemon's own uid (root here) is served whatever the lists say.
        let mut mine = Client::attach(
            daemon.socket(),
            options("reg", "mine", 0, 1, spec(2, 8, Some(1))),
        )
        .unwrap();
        assert!(mine.next_batch().unwrap().is_some());
        let mut cmd = stoker_testkit::client_process::test_client(
            "train",
            &[daemon.socket().as_os_str(), "reg".as_ref()],
        );
        let out = child::as_other_uid(&mut cmd).output().unwrap();
        let text = child::output_text(&out);
        if served {
            // Its primary group is allowed.
            assert!(out.status.success() && text.contains("trained"), "{text}");
        } else {
            assert!(!out.status.success(), "{text}");
            assert!(
                text.contains("permission denied")
                    && text.contains(&format!("uid {OTHER_UID}"))
                    && text.contains(&format!("uids [{other}], gids [{other}]"))
                    && text.contains(&daemon.socket().display().to_string()),
                "{text}"
            );
        }
    }
}

#[test]
fn dataset_paths_escaping_the_roots_are_refused_with_the_rule() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("root");
    let outside = dir.path().join("outside");
    write_image_folder(&root.join("inside"), 1, 2, 16);
    write_image_folder(&outside, 1, 2, 16);
    std::os::unix::fs::symlink(&outside, root.join("escape")).unwrap();
    // A file list inside the root naming a file outside it.
    let outside_file = outside.join("c0/img000.jpg");
    std::fs::write(
        root.join("list.tsv"),
        format!("{}\t0\n", outside_file.display()),
    )
    .unwrap();
    let config = write_config(
        dir.path(),
        &format!(
            "[access]\ndataset_roots = [\"{}\"]\n[datasets]\nregistered = \"{}\"\n",
            root.display(),
            outside.display()
        ),
    );
    let daemon = Daemon::start_configured(dir.path(), &config, &[]);
    let attach = |name: &str| {
        Client::attach(
            daemon.socket(),
            options(name, "j", 0, 1, spec(2, 8, Some(1))),
        )
    };
    let refused = |name: &str, rule: &str| {
        let err = attach(name).expect_err(name);
        assert_eq!(
            err.code(),
            Some(ErrorCode::PermissionDenied),
            "{name}: {err}"
        );
        let msg = err.to_string();
        assert!(msg.contains(name), "{msg} does not name {name}");
        assert!(msg.contains(rule), "{msg} does not say {rule:?}");
    };
    refused(
        &format!("{}/inside/../../outside", root.display()),
        "'..' components",
    );
    refused(
        outside.to_str().unwrap(),
        "absolute path outside the allowed roots",
    );
    refused("/etc", "absolute path outside the allowed roots");
    refused(
        root.join("escape").to_str().unwrap(),
        "through a symlink, leaving the root",
    );
    refused(
        root.join("list.tsv").to_str().unwrap(),
        "outside the allowed roots",
    );
    // A relative path is not found (issue 24 item 12), never "permission denied".
    let err = attach("relative/path").expect_err("relative/path");
    assert_eq!(err.code(), Some(ErrorCode::UnknownDataset), "{err}");
    assert!(err.to_string().contains("not found"), "{err}");
    // Allowed: a path under the root, and a registered name.
    let mut c = attach(root.join("inside").to_str().unwrap()).unwrap();
    assert!(c.next_batch().unwrap().is_some());
    drop(c);
    let mut c = attach("registered").unwrap();
    assert!(c.next_batch().unwrap().is_some());
}

#[test]
fn ring_requests_over_the_quotas_and_limits_are_refused_with_the_numbers() {
    let dir = tempfile::tempdir().unwrap();
    let data = tiny_dataset(dir.path(), 1, 4);
    let data = data.to_str().unwrap().to_owned();
    let config = write_config(
        dir.path(),
        "[limits]\nmax_client_ring_bytes = 1000000\nmax_job_ring_bytes = 1000000\n\
         max_clients = 2\nmax_jobs = 2\nmax_clients_per_uid = 2\nmax_jobs_per_uid = 2\n",
    );
    let daemon = Daemon::start(
        dir.path(),
        &["--config", config.to_str().unwrap(), "--slots", "2"],
    );
    // 2 slots x 8 images of 256x256x3 bytes: about 3 MB.
    let big = spec(8, 256, None);
    let err = Client::attach(daemon.socket(), options(&data, "big", 0, 1, big)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("max_client_ring_bytes") && msg.contains("1000000 bytes"),
        "{msg}"
    );
    // Within the quota: accepted; two jobs at most, two clients at most.
    let small = spec(2, 8, None);
    let _a = Client::attach(daemon.socket(), options(&data, "a", 0, 1, small.clone())).unwrap();
    let _b = Client::attach(daemon.socket(), options(&data, "b", 0, 2, small.clone())).unwrap();
    let err =
        Client::attach(daemon.socket(), options(&data, "c", 0, 1, small.clone())).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    assert!(err.to_string().contains("max_jobs"), "{err}");
    let err =
        Client::attach(daemon.socket(), options(&data, "b", 1, 2, small.clone())).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::Quota), "{err}");
    assert!(err.to_string().contains("max_clients"), "{err}");
    // Quotas are given back on detach.
    drop(_b);
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        match Client::attach(daemon.socket(), options(&data, "c", 0, 1, small.clone())) {
            Ok(_) => break,
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                std::thread::sleep(Duration::from_millis(20))
            }
            Err(e) => panic!("quota not given back: {e}"),
        }
    }
}
