//! Request slots are shared fairly (issue 42 item 1): one user's jobs on a server that sends
//! half a body and stalls cannot hold every S3 slot while another user's job on a healthy
//! server waits; a stalled body is given up by its own deadline.

use super::fake::{Behaviour, FakeS3};
use super::stalls::objects_of;
use super::*;
use std::io::{BufRead, BufReader};
use std::os::unix::fs::PermissionsExt;
use std::process::Stdio;
use stoker_testkit::child::{self, OTHER_UID};

#[test]
fn one_users_jobs_on_a_stalling_server_do_not_hold_another_users_s3_slots() {
    let test = "one_users_jobs_on_a_stalling_server_do_not_hold_another_users_s3_slots";
    if !child::can_run_as_other_uid(test) {
        return;
    }
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let top = dir.path();
    // The stalling server: every GET sends its headers and half the body, then nothing.
    let stalled = top.join("stalled");
    write_image_folder(&stalled, 1, 64, 24);
    let always = Behaviour {
        stalls: Some(Arc::new(|_| true)),
        ..Behaviour::default()
    };
    let bad = FakeS3::start_with("stall", objects_of(&stalled, "data"), always);
    // The healthy server: a 12-image folder.
    let healthy = top.join("healthy");
    write_image_folder(&healthy, 3, 4, 24);
    let good = FakeS3::start_with("good", objects_of(&healthy, "data"), Behaviour::default());

    // 4 slots for the whole daemon; a batch is due 15 s after it starts.
    let connection = |fake: &FakeS3| {
        format!(
            "endpoint = \"{}\"\nregion = \"us-east-1\"\npath_style = true\n\
             access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET}\"\n",
            fake.endpoint()
        )
    };
    let config = top.join("stoker.toml");
    let text = format!(
        "[s3]\ncache_dir = \"{}\"\nprefetch = false\nmax_in_flight = 4\n\
         fetch_deadline_ms = 15000\n\n[s3.default]\n{}\n[s3.datasets.reg]\n{}\n\
         [access]\nallowed_uids = [0, {OTHER_UID}]\n\n[datasets]\nreg = \"s3://stall/data\"\n",
        top.join("objects").display(),
        connection(&good),
        connection(&bad),
    );
    std::fs::write(&config, text).unwrap();
    let daemon = Daemon::start_configured(top, &config, &["--threads", "2"]);
    std::fs::set_permissions(top, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(daemon.socket(), std::fs::Permissions::from_mode(0o777)).unwrap();

    // The local folder's batches: what the healthy job must get.
    let local = run(daemon.socket(), healthy.to_str().unwrap(), "local", 4);

    // uid 65534 runs 8 jobs on the stalling server, taking batches for a minute.
    let socket = daemon.socket().as_os_str();
    let mut cmd =
        stoker_testkit::client_process::test_client("hog", &[socket, "8".as_ref(), "60".as_ref()]);
    let mut hog = child::as_other_uid(&mut cmd)
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut out = BufReader::new(hog.stdout.take().unwrap());
    let mut said = String::new();
    loop {
        let mut line = String::new();
        if out.read_line(&mut line).unwrap() == 0 || line.trim() == "attached" {
            break;
        }
        said.push_str(&line);
    }
    assert_eq!(said.matches(": attached").count(), 8, "{said}");
    // Their first fetches are stalling before root's job starts.
    let deadline = Instant::now() + Duration::from_secs(30);
    while bad.gets() < 8 {
        assert!(Instant::now() < deadline, "the 8 jobs did not fetch");
        std::thread::sleep(Duration::from_millis(20));
    }

    // Root's 12-object job on the healthy server, beside them.
    let seen = run(daemon.socket(), "s3://good/data", "healthy", 4);
    let _ = hog.kill();
    let _ = hog.wait();
    let status: Vec<u8> = seen.iter().flat_map(|s| s.status.clone()).collect();
    let ok = status
        .iter()
        .filter(|&&s| s == SampleStatus::Ok as u8)
        .count();
    eprintln!(
        "root's job beside 8 stalled jobs of uid {OTHER_UID}: {ok} of 12 samples OK \
         ({} GETs to the stalling server)",
        bad.gets()
    );
    assert_eq!(
        ok, 12,
        "root's healthy samples waited behind uid {OTHER_UID}'s stalled downloads: {status:?}"
    );
    assert!(seen == local, "the local folder's batches");
}
