//! An object replaced on the server after it was listed (issue 42 item 2) is a `changed` bad
//! sample, never served as OK and never cached: downloads ask with If-Match and compare the
//! answer's ETag and size with the index's, whole objects and the ranges of tar shards alike.

use super::fake::{Behaviour, FakeS3};
use super::stalls::objects_of;
use super::*;

/// `jpeg` (or a shard of JPEGs) with the first value of every quantisation table halved: the
/// same size, still valid JPEG, other pixels.
fn altered(jpeg: &[u8]) -> Vec<u8> {
    let mut out = jpeg.to_vec();
    let mut i = 0;
    // DQT: FF DB, a 2-byte length, the precision and table byte, then the 64 values (8-bit
    // here). FF DB cannot occur in entropy-coded data (an FF there is followed by 00 or RSTn).
    while i + 5 < out.len() {
        if out[i] == 0xff && out[i + 1] == 0xdb {
            let v = out[i + 5];
            out[i + 5] = if v > 1 { v / 2 } else { 2 };
            i += 6;
        } else {
            i += 1;
        }
    }
    assert_ne!(out, jpeg, "a quantisation table was altered");
    out
}

/// A daemon config reading `fake` with its node cache in `<dir>/<objects>`: no prefetch (each
/// batch fetches its own objects), objects over `max_whole` read by ranges, bad samples failed.
fn config(dir: &Path, fake: &FakeS3, objects: &str, max_whole: u64) -> PathBuf {
    let text = format!(
        "[s3]\ncache_dir = \"{}\"\nprefetch = false\nwhole_object_max_bytes = {max_whole}\n\n\
         [s3.default]\nendpoint = \"{}\"\nregion = \"us-east-1\"\npath_style = true\n\
         access_key_id = \"{ACCESS_KEY}\"\nsecret_access_key = \"{SECRET}\"\n\n\
         [pipeline]\nbad_samples = \"fail\"\n",
        dir.join(objects).display(),
        fake.endpoint()
    );
    let path = dir.join(format!("{objects}.toml"));
    std::fs::write(&path, text).unwrap();
    path
}

/// Per sample of `seen` against the same position of `local`: (Ok with other pixels than the
/// local file's, not Ok).
fn against(seen: &[Seen], local: &[Seen]) -> (usize, usize) {
    assert_eq!(seen.len(), local.len(), "as many batches as the local run");
    let (mut new_pixels, mut bad) = (0, 0);
    for (s, l) in seen.iter().zip(local) {
        assert_eq!(s.indices, l.indices, "the local run's order");
        let per = s.images.len() / s.status.len();
        for (j, &st) in s.status.iter().enumerate() {
            let (a, b) = (j * per, (j + 1) * per);
            if st == SampleStatus::Empty as u8 {
                continue;
            }
            if st != SampleStatus::Ok as u8 {
                bad += 1;
            } else if s.images[a..b] != l.images[a..b] {
                new_pixels += 1;
            }
        }
    }
    (new_pixels, bad)
}

#[test]
fn an_object_replaced_on_the_server_is_a_changed_sample_and_never_cached() {
    // Twice: a server that answers If-Match with 412 (as S3 does), and one that ignores it
    // (the answer's ETag is compared then).
    for ignores_if_match in [false, true] {
        replaced_objects_are_changed_samples(ignores_if_match);
    }
}

fn replaced_objects_are_changed_samples(ignores_if_match: bool) {
    let dir = tempfile::tempdir().unwrap();
    let dir = dir.path();
    let (folder, shards) = datasets(dir);
    let mut objects = objects_of(&folder, "data");
    objects.extend(objects_of(&shards, "shards"));
    let images: Vec<String> = (objects.keys())
        .filter(|k| k.ends_with(".jpg"))
        .cloned()
        .collect();
    let shard_keys: Vec<String> = (objects.keys())
        .filter(|k| k.ends_with(".tar"))
        .cloned()
        .collect();
    // Images are fetched whole, shards by ranged GETs.
    let max_whole = images.iter().map(|k| objects[k].len()).max().unwrap() as u64;
    assert!(shard_keys
        .iter()
        .all(|k| objects[k].len() as u64 > max_whole));
    let behaviour = Behaviour {
        ignores_if_match,
        ..Behaviour::default()
    };
    let fake = FakeS3::start_with("changes", objects, behaviour);
    let urls = ["s3://changes/data", "s3://changes/shards"];
    let log = dir.join("stokerd.log");
    let flags =
        |config: &Path| ["--threads", "2", "--config", config.to_str().unwrap()].map(String::from);
    let start = |config: &Path| {
        let f = flags(config);
        let f: Vec<&str> = f.iter().map(String::as_str).collect();
        Daemon::start_logged(dir, &f, &log)
    };

    // Daemon A lists both prefixes (its index cache keeps the listings, ETags included) and
    // reads every object: the local copies' batches.
    let a = start(&config(dir, &fake, "objects-a", max_whole));
    let local = [
        run(a.socket(), folder.to_str().unwrap(), "local-folder", 4),
        run(a.socket(), shards.to_str().unwrap(), "local-shards", 4),
    ];
    for (url, local) in urls.iter().zip(&local) {
        let seen = run(a.socket(), url, "first", 4);
        assert!(all_ok(&seen) && seen == *local, "{url}: the local batches");
    }
    drop(a);

    // 9 images and one shard replaced by bytes of the same size and other pixels.
    let swapped: Vec<&String> = images.iter().take(9).chain(&shard_keys[..1]).collect();
    let originals: Vec<Vec<u8>> = swapped.iter().map(|k| fake.object(k)).collect();
    for (k, bytes) in swapped.iter().zip(&originals) {
        fake.replace(k, altered(bytes));
    }
    let in_shard = originals[9]
        .windows(3)
        .filter(|w| *w == [0xff, 0xd8, 0xff])
        .count();

    // Daemon B: a node cache of its own, the same index cache, so the old ETags.
    let b = start(&config(dir, &fake, "objects-b", max_whole));
    let lists = fake.lists();
    let want_bad = [9, in_shard];
    for ((url, local), want_bad) in urls.iter().zip(&local).zip(want_bad) {
        let seen = run(b.socket(), url, "swapped", 4);
        let (new_pixels, bad) = against(&seen, local);
        assert_eq!(
            new_pixels, 0,
            "{url} (server ignores If-Match: {ignores_if_match}): {new_pixels} samples of the \
             replaced objects' pixels marked OK"
        );
        assert_eq!(
            bad, want_bad,
            "{url}: exactly the replaced objects' samples are bad"
        );
    }
    assert_eq!(fake.lists(), lists, "the index came from the cache");
    let text = stoker_testkit::daemon::read_log(&log);
    assert!(
        text.contains("reason=\"changed\""),
        "the log says changed:\n{text}"
    );

    // The server goes back: nothing of the replaced bytes was cached.
    for (k, bytes) in swapped.iter().zip(originals) {
        fake.replace(k, bytes);
    }
    for (url, local) in urls.iter().zip(&local) {
        let seen = run(b.socket(), url, "restored", 4);
        let (new_pixels, bad) = against(&seen, local);
        assert_eq!(
            (new_pixels, bad),
            (0, 0),
            "{url}: after the server went back, every sample is the original"
        );
    }
}
