//! Objects, shards and file lists read as local files are; deleted objects; one fetch per byte.

use super::*;
use stoker_testkit::prometheus;

#[test]
fn s3_objects_and_shards_give_the_batches_of_local_files_and_bad_credentials_are_refused() {
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    let (folder, shards) = datasets(dir.path());
    assert!(
        std::fs::read_dir(&shards).unwrap().count() >= 2,
        "several shards"
    );
    let weed = Weed::start(dir.path());
    weed.upload(&folder, "folder");
    weed.upload(&shards, "shards");
    // Shards are indexed from the sidecars `pack` wrote beside them: no shard is downloaded,
    // only the sidecars, into the node cache: a second open downloads nothing.
    let shard_sizes: Vec<u64> = std::fs::read_dir(&shards)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "tar"))
        .map(|p| p.metadata().unwrap().len())
        .collect();
    let smallest_shard = *shard_sizes.iter().min().unwrap();
    let url = format!("s3://{BUCKET}/shards");
    let no_cache = weed.no_cache();
    let before = weed.store.bytes_downloaded();
    let ds = Dataset::open(Path::new(&url), &no_cache).unwrap();
    assert_eq!(ds.len(), 18);
    let sidecars = weed.store.bytes_downloaded() - before;
    assert!(
        sidecars > 0 && sidecars < smallest_shard,
        "{sidecars} bytes for indexing"
    );
    let before = weed.store.bytes_downloaded();
    Dataset::open(Path::new(&url), &no_cache).unwrap();
    assert_eq!(
        weed.store.bytes_downloaded(),
        before,
        "the sidecars come from the node cache"
    );
    the_index_is_cached_on_disk(dir.path(), &weed.store, &ds);
    let extra = format!(
        "[datasets]\nwrongsecret = \"s3://{BUCKET}/folder/\"\n\n\
         [s3.datasets.wrongsecret]\nendpoint = \"{}\"\npath_style = true\nregion = \"us-east-1\"\n\
         access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"not-the-secret\"\n",
        weed.endpoint()
    );
    // Every shard is "large": its samples are read by ranged GETs, not the whole shard.
    let config = write_config(dir.path(), &weed, "whole_object_max_bytes = 1", &extra);
    let daemon = Daemon::start_configured(dir.path(), &config, &["--threads", "2"]);
    let socket = daemon.socket();

    let local = run(socket, folder.to_str().unwrap(), "local-folder", 4);
    let remote = run(socket, &format!("s3://{BUCKET}/folder"), "s3-folder", 4);
    assert_eq!(local.len(), 5); // ceil(18 / 4)
    assert!(all_ok(&local) && all_ok(&remote));
    assert!(
        local == remote,
        "s3:// objects must give the local folder's batches"
    );

    let local = run(socket, shards.to_str().unwrap(), "local-shards", 4);
    let remote = run(socket, &format!("s3://{BUCKET}/shards"), "s3-shards", 4);
    assert!(all_ok(&local) && all_ok(&remote));
    assert!(
        local == remote,
        "s3:// shards must give the local shards' batches"
    );
    // Only samples came down: no file of the node cache is as large as a shard.
    let want = 36 + shard_sizes.len();
    let cached = cached_settled(&dir.path().join("objects"), want);
    assert_eq!(
        cached.len(),
        want,
        "18 images, 18 shard samples, the sidecars"
    );
    assert!(cached.iter().all(|&n| n < smallest_shard), "{cached:?}");

    file_lists_naming_objects_give_the_batches_of_local_files(dir.path(), &folder, socket);
    // A list's objects are the folder's: read from the node cache, not fetched again.
    let files = cached_objects(&dir.path().join("objects")).len();
    assert_eq!(files, want, "the lists' objects come from the node cache");

    // A wrong secret refuses the attach, naming the dataset and the S3 code.
    let err = Client::attach(socket, options("wrongsecret", "bad", 0, 1, 4)).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::UnknownDataset), "{err}");
    let text = err.to_string();
    assert!(text.contains("SignatureDoesNotMatch"), "{text}");
    assert!(text.contains("s3://stoker/folder"), "{text}");
    // So does a missing bucket.
    let err = Client::attach(socket, options("s3://no-such-bucket/x", "nb", 0, 1, 4)).unwrap_err();
    assert!(err.to_string().contains("NoSuchBucket"), "{err}");
}

/// An `s3://` index is kept with the local index caches: a second open does not list.
fn the_index_is_cached_on_disk(dir: &Path, store: &Arc<ObjectStore>, listed: &Dataset) {
    let cached = OpenOptions {
        cache_dir: Some(dir.join("index-cache")),
        objects: Some(store.clone()),
        ..OpenOptions::default()
    };
    let first = Dataset::open(listed.root(), &cached).unwrap();
    assert_eq!(first.origin(), IndexOrigin::Walked);
    let second = Dataset::open(listed.root(), &cached).unwrap();
    assert_eq!(second.origin(), IndexOrigin::Cache, "not listed again");
    assert_eq!(second.len(), listed.len());
    for i in 0..listed.len() {
        assert_eq!(second.sample(i), listed.sample(i));
    }
    // Read through the cached index: the reader knows its objects.
    let objects = second
        .objects()
        .expect("an s3:// dataset holds its objects");
    let path = objects.local_file(second.sample(0)).unwrap();
    assert!(path.is_file(), "{}", path.display());
}

/// File lists naming `s3://` URLs (all, or every other line) give the batches of the same
/// list naming local files; a missing object refuses the list naming the URL; without the
/// daemon's credentials allowed, `s3://` entries are refused at indexing.
fn file_lists_naming_objects_give_the_batches_of_local_files(
    dir: &Path,
    folder: &Path,
    socket: &Path,
) {
    let local = write_list(dir, "local.txt", folder, |_, _, abs| {
        abs.display().to_string()
    });
    let remote = write_list(dir, "remote.txt", folder, |_, rel, _| {
        format!("s3://{BUCKET}/folder/{rel}")
    });
    let mixed = write_list(dir, "mixed.txt", folder, |i, rel, abs| match i % 2 {
        0 => format!("s3://{BUCKET}/folder/{rel}"),
        _ => abs.display().to_string(),
    });
    let want = run(socket, local.to_str().unwrap(), "local-list", 4);
    assert_eq!(want.len(), 5);
    assert!(all_ok(&want));
    for (list, job) in [(&remote, "s3-list"), (&mixed, "mixed-list")] {
        let got = run(socket, list.to_str().unwrap(), job, 4);
        assert!(
            all_ok(&got) && got == want,
            "{job}: the local list's batches"
        );
    }
    let missing = dir.join("missing.txt");
    std::fs::write(&missing, format!("s3://{BUCKET}/folder/no-such.jpg\t0\n")).unwrap();
    let err = Client::attach(
        socket,
        options(missing.to_str().unwrap(), "missing", 0, 1, 4),
    )
    .unwrap_err();
    let text = err.to_string();
    assert!(
        text.contains("s3://stoker/folder/no-such.jpg") && text.contains("line 1"),
        "{text}"
    );
    // What the daemon asks for a client that is neither its own uid nor root.
    let refused = OpenOptions {
        use_cache: false,
        s3_entries: false,
        ..OpenOptions::default()
    };
    let text = Dataset::open(&mixed, &refused).unwrap_err().to_string();
    assert!(
        text.contains("daemon's credentials") && text.contains("s3://stoker/folder/"),
        "{text}"
    );
}

#[test]
fn a_deleted_object_is_a_replaced_bad_sample() {
    let s = Served::folder();
    let folder = &s.folder;
    // No background fetching, and a ring of 2 slots of 2: at most 4 samples are read before
    // the client asks, so the epoch's last sample is still in the bucket only.
    let daemon = s.daemon("prefetch = false", &["--threads", "1", "--slots", "2"]);
    let mut c = Client::attach(
        daemon.socket(),
        options(&format!("s3://{BUCKET}/folder"), "del", 0, 1, 2),
    )
    .unwrap();
    let n = c.attached().dataset_len;
    let mut order = Vec::new();
    stoker_pipeline::transform::sampler::permutation_into(n, 77, 0, &mut order);
    let last = *order.last().unwrap();
    let ds = Dataset::open(
        folder,
        &OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        },
    )
    .unwrap();
    let rel = ds
        .sample(last as usize)
        .path
        .strip_prefix(folder)
        .unwrap()
        .to_owned();
    s.weed.delete(&format!("folder/{}", rel.display()));
    let seen = drain(&mut c);
    let statuses: Vec<(u64, u8)> = seen
        .iter()
        .flat_map(|s| s.indices.iter().copied().zip(s.status.iter().copied()))
        .collect();
    assert_eq!(statuses.len() as u64, n);
    let bad: Vec<&(u64, u8)> = statuses
        .iter()
        .filter(|(_, s)| *s != SampleStatus::Ok as u8)
        .collect();
    assert_eq!(bad.len(), 1, "{statuses:?}");
    assert_eq!(bad[0].1, SampleStatus::Replaced as u8);
}

/// The value of the series `name{labels}` in Prometheus text.
#[test]
fn two_jobs_of_two_ranks_fetch_each_byte_once() {
    let s = Served::folder();
    let (dir, folder) = (s.dir.path(), &s.folder);
    let total: u64 = walk_sizes(folder);
    let port = 21_000 + (std::process::id() % 2000) as u16;
    let addr = format!("127.0.0.1:{port}");
    let config = write_config(
        dir,
        &s.weed,
        "",
        &format!("[metrics]\nlisten = \"{addr}\"\n"),
    );
    let daemon = Daemon::start_configured(dir, &config, &["--threads", "2"]);
    let url = format!("s3://{BUCKET}/folder");
    let socket = daemon.socket().to_owned();
    let mut ranks = Vec::new();
    for job in ["job-a", "job-b"] {
        for rank in 0..2 {
            let (socket, url) = (socket.clone(), url.clone());
            ranks.push(std::thread::spawn(move || {
                let mut c = Client::attach(&socket, options(&url, job, rank, 2, 3)).unwrap();
                drain(&mut c)
            }));
        }
    }
    for r in ranks {
        assert!(all_ok(&r.join().unwrap()));
    }
    let (_, text) = prometheus::http_get(&addr, "/metrics");
    let bytes = |source| {
        prometheus::sample(
            &text,
            &format!("stoker_s3_bytes_total{{source=\"{source}\"}}"),
        )
    };
    let (from_s3, from_cache) = (bytes("s3").unwrap_or(0.0), bytes("cache").unwrap_or(0.0));
    assert_eq!(
        from_s3 as u64, total,
        "each byte from the server once:\n{text}"
    );
    // The second job reads everything from the cache (the first partly, after prefetching).
    assert!(from_cache >= total as f64, "reads hit the cache:\n{text}");
}

fn walk_sizes(dir: &Path) -> u64 {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| {
            let e = e.unwrap();
            if e.file_type().unwrap().is_dir() {
                walk_sizes(&e.path())
            } else {
                e.metadata().unwrap().len()
            }
        })
        .sum()
}

/// Shards packed with `--restart` (JPEGs rewritten with restart markers) give, from a bucket,
/// the batches plain shards of the same images give: the crops that decode only the restart
/// intervals they touch are bit-identical to full decodes.
#[test]
fn s3_restart_indexed_shards_give_the_batches_of_plain_shards() {
    use stoker_tool::pack::{pack_dataset_with, PackOptions};
    let _one = SERIAL.lock().unwrap_or_else(|e| e.into_inner());
    let dir = tempfile::tempdir().unwrap();
    // Large enough for crops to skip restart intervals (16x16 outputs from 160-190 px images).
    let folder = dir.path().join("big");
    write_image_folder(&folder, 2, 6, 160);
    let no_cache = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    let ds = Dataset::open(&folder, &no_cache).unwrap();
    let pack = |name: &str, restart: bool| {
        let out = dir.path().join(name);
        std::fs::create_dir_all(&out).unwrap();
        let opts = PackOptions {
            restart,
            ..PackOptions::plain(1 << 20)
        };
        let summary = pack_dataset_with(&ds, &out, &opts, &mut |_| Ok(())).unwrap();
        (out, summary)
    };
    let (plain, _) = pack("plain", false);
    let (restart, summary) = pack("restart", true);
    assert_eq!(summary.restart_indexed, 12, "{summary:?}");
    let weed = Weed::start(dir.path());
    weed.upload(&restart, "restart");
    let config = write_config(dir.path(), &weed, "", "");
    let daemon = Daemon::start_configured(dir.path(), &config, &["--threads", "2"]);
    let socket = daemon.socket();
    let want = run(socket, plain.to_str().unwrap(), "plain-shards", 4);
    let local = run(socket, restart.to_str().unwrap(), "restart-shards", 4);
    let remote = run(socket, &format!("s3://{BUCKET}/restart"), "s3-restart", 4);
    assert_eq!(want.len(), 3);
    assert!(all_ok(&want) && all_ok(&local) && all_ok(&remote));
    assert!(
        local == want,
        "local restart-indexed shards differ from plain shards"
    );
    assert!(
        remote == want,
        "s3:// restart-indexed shards differ from plain shards"
    );
}
