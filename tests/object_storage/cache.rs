//! The node cache never costs a sample (issue 23 item 6): a cap smaller than what is being
//! read evicts nothing between its fetch and its read, and a full disk is made room on. Its
//! entries are checked before use (item 7): a changed one is fetched again, never served.

use super::*;

/// Runs `data` (one epoch, batches of 6) as job `job`; every batch.
fn batches(socket: &Path, data: &str, job: &str) -> Vec<Seen> {
    run(socket, data, job, 6)
}

#[test]
fn a_cache_cap_smaller_than_a_batch_replaces_no_sample() {
    let s = Served::folder();
    let folder = &s.folder;
    // 18 objects of about 1 KB, a cap of 2 KB: every batch's 6 objects overrun it.
    let keys = "prefetch = false\ncache_max_bytes = 2000";
    let daemon = s.daemon(keys, &["--threads", "2"]);
    let local = batches(daemon.socket(), folder.to_str().unwrap(), "local");
    let url = format!("s3://{BUCKET}/folder");
    for job in ["first", "again"] {
        let remote = batches(daemon.socket(), &url, job);
        let status: Vec<u8> = remote.iter().flat_map(|b| b.status.clone()).collect();
        assert!(
            all_ok(&remote),
            "{job}: no sample lost to the cache: {status:?}"
        );
        assert!(remote == local, "{job}: the local folder's batches");
    }
    // Once nothing is pinned the cap holds again: the last batch's pins go when the daemon
    // has taken its slot back, a moment after the client's job ended.
    // The cap counts objects' bytes, not the folder's key or the entries' tag files.
    let held = || -> u64 { cached_objects(&s.dir.path().join("objects")).iter().sum() };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
    while held() > 2000 && std::time::Instant::now() < deadline {
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    assert!(held() <= 2000, "{} bytes left in the cache", held());
}

/// A tmpfs of `bytes` mounted at `at` (made 0700), unmounted on drop.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(at: &Path, bytes: u64) -> Option<Tmpfs> {
        std::fs::create_dir_all(at).unwrap();
        let ok = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={bytes},mode=0700")])
            .arg("tmpfs")
            .arg(at)
            .status()
            .is_ok_and(|s| s.success());
        ok.then(|| Tmpfs(at.to_owned()))
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

#[test]
fn a_full_cache_disk_evicts_and_retries_instead_of_failing_samples() {
    let s = Served::folder();
    let dir = s.dir.path();
    let big = dir.join("big");
    write_image_folder(&big, 2, 24, 200);
    let total: u64 = Dataset::open(&big, &s.weed.no_cache())
        .map(|ds| (0..ds.len()).map(|i| ds.sample(i).len).sum())
        .unwrap();
    s.weed.upload(&big, "big");
    // The node cache on a disk that holds about half of the dataset (a few batches), the cap
    // far above.
    let disk = (total / 2).max(256 << 10);
    let Some(_mounted) = Tmpfs::mount(&dir.join("objects"), disk) else {
        eprintln!(
            "SKIPPED a_full_cache_disk_evicts_and_retries_instead_of_failing_samples: cannot \
             mount a tmpfs here (needs root)"
        );
        return;
    };
    eprintln!("dataset {total} bytes, cache disk {disk} bytes");
    let daemon = s.daemon("prefetch = false", &["--threads", "2"]);
    let local = batches(daemon.socket(), big.to_str().unwrap(), "local");
    let remote = batches(daemon.socket(), &format!("s3://{BUCKET}/big"), "s3");
    let status: Vec<u8> = remote.iter().flat_map(|b| b.status.clone()).collect();
    assert!(
        all_ok(&remote),
        "no sample lost to the full disk: {status:?}"
    );
    assert!(remote == local, "the local folder's batches");
}

/// Every cache file changed on disk behind the daemon's back (same size, so a size check
/// passes: bytes flipped in the middle), between two runs of the same `s3://` dataset, and
/// after a restart: each entry is found not to match the keyed hash recorded when it was
/// fetched, is fetched again, and the batches are the local folder's.
#[test]
fn a_cache_file_changed_on_disk_is_fetched_again_never_served() {
    let s = Served::folder();
    let objects = s.dir.path().join("objects");
    let corrupt_all = || {
        // Every file in place first (files are written behind the reads).
        cached_settled(&objects, 18);
        let mut n = 0;
        for e in std::fs::read_dir(&objects).unwrap() {
            let path = e.unwrap().path();
            if path.extension().is_some() {
                continue;
            }
            let mut bytes = std::fs::read(&path).unwrap();
            if bytes.len() < 64 {
                continue;
            }
            let mid = bytes.len() / 2;
            bytes[mid - 16..mid + 16]
                .iter_mut()
                .for_each(|b| *b ^= 0x5a);
            std::fs::write(&path, bytes).unwrap();
            n += 1;
        }
        assert!(n >= 18, "{n} cache files changed");
    };
    let url = format!("s3://{BUCKET}/folder");
    let check = |seen: &[Seen], local: &[Seen], when: &str| {
        let status: Vec<u8> = seen.iter().flat_map(|b| b.status.clone()).collect();
        assert!(all_ok(seen), "{when}: {status:?}");
        assert!(seen == local, "{when}: the local folder's batches");
    };
    let local = {
        let daemon = s.daemon("prefetch = false", &["--threads", "2"]);
        let local = batches(daemon.socket(), s.folder.to_str().unwrap(), "local");
        check(&batches(daemon.socket(), &url, "first"), &local, "first");
        corrupt_all();
        check(
            &batches(daemon.socket(), &url, "again"),
            &local,
            "changed in place",
        );
        // The files fetched again are written behind: in place before the daemon stops.
        cached_settled(&objects, 18);
        local
    };
    corrupt_all();
    let config = write_config(s.dir.path(), &s.weed, "prefetch = false", "");
    let log = s.dir.path().join("restarted.log");
    let flags = ["--threads", "2", "--config", config.to_str().unwrap()];
    let daemon = Daemon::start_logged(s.dir.path(), &flags, &log);
    check(
        &batches(daemon.socket(), &url, "restarted"),
        &local,
        "changed before a restart",
    );
    // Each refusal is logged with the object it holds, not only its hashed file name.
    let log = std::fs::read_to_string(&log).unwrap();
    let refused = (log.lines())
        .filter(|l| l.contains("no longer holds the bytes fetched") && l.contains(&url))
        .count();
    assert!(refused >= 18, "{refused} refusals naming the object: {log}");
}

/// Two daemons on one node-cache folder (a restart overlapping the old daemon, or two
/// daemons of one uid): both read the dataset, each writes the objects it fetched, and the
/// folder keeps one file per object, no temporary file left, and a tag file beside an entry
/// only where the file system has no extended attributes to hold its tag.
#[test]
fn two_daemons_sharing_a_node_cache_keep_one_file_per_object() {
    let s = Served::folder();
    let objects = s.dir.path().join("objects");
    let config = write_config(s.dir.path(), &s.weed, "prefetch = false", "");
    let other = s.dir.path().join("other");
    std::fs::create_dir_all(&other).unwrap();
    let a = Daemon::start_configured(s.dir.path(), &config, &["--threads", "2"]);
    let b = Daemon::start_configured(&other, &config, &["--threads", "2"]);
    let local = batches(a.socket(), s.folder.to_str().unwrap(), "local");
    let url = format!("s3://{BUCKET}/folder");
    for (daemon, job) in [(&a, "a"), (&b, "b"), (&a, "a again"), (&b, "b again")] {
        let seen = batches(daemon.socket(), &url, job);
        assert!(
            all_ok(&seen) && seen == local,
            "{job}: the local folder's batches"
        );
    }
    assert_eq!(cached_settled(&objects, 18).len(), 18);
    let names: Vec<String> = (std::fs::read_dir(&objects).unwrap())
        .map(|e| e.unwrap().file_name().into_string().unwrap())
        .filter(|n| n != "key")
        .collect();
    let tags = names.iter().filter(|n| n.ends_with(".sum")).count();
    assert!(
        names.len() == 18 + tags && (tags == 0 || tags == 18),
        "one file per object, nothing left beside: {names:?}"
    );
}
