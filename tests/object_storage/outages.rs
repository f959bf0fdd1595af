//! A server restarted mid-epoch or down for good; the tools reading s3://.

use super::*;

#[test]
fn a_server_restarted_mid_epoch_loses_no_batch() {
    let mut s = Served::folder();
    let folder = &s.folder;
    // Retries back off 0.1 s, 0.2 s, ... up to 5 s: about 26 s in all, longer than the restart.
    let keys = "prefetch = false\nretries = 10\nbackoff_ms = 100";
    let daemon = s.daemon(keys, &["--threads", "1", "--slots", "2"]);
    let local = run(daemon.socket(), folder.to_str().unwrap(), "local", 2);
    let mut c = Client::attach(
        daemon.socket(),
        options(&format!("s3://{BUCKET}/folder"), "restart", 0, 1, 2),
    )
    .unwrap();
    let mut seen = Vec::new();
    for _ in 0..2 {
        let b = c.next_batch().unwrap().unwrap();
        seen.push(Seen {
            indices: b.indices().to_vec(),
            labels: b.labels().to_vec(),
            status: b.status().to_vec(),
            images: b.images().to_vec(),
        });
    }
    s.weed.stop();
    std::thread::sleep(Duration::from_secs(2));
    s.weed.spawn();
    seen.extend(drain(&mut c));
    assert!(all_ok(&seen), "every sample fetched after the restart");
    assert!(seen == local, "the batches of the local files, none lost");
}

#[test]
fn a_server_that_stays_down_fails_samples_while_another_job_is_served() {
    let mut s = Served::folder();
    let folder = &s.folder;
    let keys = "prefetch = false\nretries = 2\nbackoff_ms = 20";
    let daemon = s.daemon(keys, &["--threads", "2", "--slots", "2"]);
    let url = format!("s3://{BUCKET}/folder");
    let mut remote = Client::attach(daemon.socket(), options(&url, "down", 0, 1, 2)).unwrap();
    s.weed.stop();
    let socket = daemon.socket().to_owned();
    let local_folder = folder.clone();
    let other =
        std::thread::spawn(move || run(&socket, local_folder.to_str().unwrap(), "local", 3));
    let failed = drain(&mut remote);
    let local = other.join().unwrap();
    assert!(all_ok(&local), "the local job is served in full");
    assert_eq!(local.len(), 6);
    let statuses: Vec<u8> = failed.iter().flat_map(|s| s.status.clone()).collect();
    assert_eq!(statuses.len(), 18, "the s3 job still ends its epoch");
    // At most the ring's 2 slots of 2 samples were read before the stop; every later sample
    // is bad: failed, or replaced by one of those read before (the policy is `skip`).
    let bad = statuses
        .iter()
        .filter(|&&s| s != SampleStatus::Ok as u8)
        .count();
    assert!(bad >= 18 - 4, "{statuses:?}");
}

/// `stoker check` and `stoker bench` take an `s3://` URL, with the connection from the
/// standard environment; bench's cold rows read from the server (the node cache emptied).
#[test]
fn stoker_check_and_bench_read_s3_with_credentials_from_the_environment() {
    let s = Served::folder();
    let (dir, folder) = (s.dir.path(), &s.folder);
    let stoker = stoker_testkit::stokerd_path().with_file_name("stoker");
    let stoker_s3 = |args: &[&str], secret: &str| {
        Command::new(&stoker)
            .args(args)
            .env("AWS_ENDPOINT_URL", s.weed.endpoint())
            .env("AWS_REGION", "us-east-1")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", secret)
            .env("STOKER_CACHE_DIR", dir.join("check-cache"))
            .output()
            .unwrap()
    };
    // The stdout of a run that must succeed.
    let ok = |args: &[&str]| {
        let out = stoker_s3(args, SECRET);
        let text = String::from_utf8_lossy(&out.stdout).into_owned();
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{args:?}: {text}{err}");
        text
    };
    // `stoker pack` writes shards (and their sidecars) straight to a bucket.
    let packed = format!("s3://{BUCKET}/packed");
    ok(&["pack", folder.to_str().unwrap(), &packed, "--shard-mb", "1"]);
    let text = ok(&["check", &packed]);
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");
    let url = format!("s3://{BUCKET}/folder");
    let check = |secret: &str| stoker_s3(&["check", &url], secret);
    let out = check(SECRET);
    let text =
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{text}");
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");
    let out = check("wrong");
    assert!(!out.status.success());
    let text = String::from_utf8_lossy(&out.stderr);
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    // A file list naming the objects is checked through the same fetches.
    let list = write_list(dir, "list.txt", folder, |_, rel, _| {
        format!("s3://{BUCKET}/folder/{rel}")
    });
    let text = ok(&["check", list.to_str().unwrap()]);
    assert!(text.contains("checked 18 samples: 18 ok"), "{text}");

    let json = dir.join("bench.json");
    let svg = dir.join("bench.svg");
    let text = ok(&[
        "bench",
        &url,
        "--storage-only",
        "--cold",
        "--threads",
        "1",
        "--json",
        json.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(text.contains("read from the server"), "{text}");
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["eviction"], "NodeCache", "{report}");
    let rows: Vec<(String, String, u64)> = report["stages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            let field = |k: &str| r[k].as_str().unwrap().to_owned();
            (
                field("stage"),
                field("cache"),
                r["images"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = |cache: &str| ("storage".to_owned(), cache.to_owned(), 18);
    assert_eq!(rows, vec![want("warm"), want("cold")], "{report}");
}
