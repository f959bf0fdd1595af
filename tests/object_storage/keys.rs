//! Listings (issue 23 item 9): a key object_store cannot fetch is one bad sample, not a refused
//! dataset; listings are bounded like folder walks; a listing is forgotten with its dataset.

use super::fake::FakeS3;
use super::stalls::{fake_config, objects_of};
use super::*;

/// A JPEG's bytes: an image of `folder`.
fn a_jpeg(folder: &Path) -> Vec<u8> {
    objects_of(folder, "x").into_values().next().unwrap()
}

#[test]
fn odd_keys_are_bad_samples_and_the_rest_of_the_bucket_serves() {
    let dir = tempfile::tempdir().unwrap();
    let folder = dir.path().join("folder");
    write_image_folder(&folder, 2, 5, 24);
    let mut objects = objects_of(&folder, "data");
    let jpeg = a_jpeg(&folder);
    // An empty segment and a control character: object_store refuses both keys.
    objects.insert("data/c0//odd.jpg".into(), jpeg.clone());
    objects.insert("data/c1/ctl\u{1}.jpg".into(), jpeg);
    let fake = FakeS3::start("keys", objects, Arc::new(|_| false));
    let config = fake_config(dir.path(), &fake, "prefetch = false");
    let daemon = Daemon::start_configured(dir.path(), &config, &["--threads", "2"]);
    let url = "s3://keys/data";
    let mut c = Client::attach(daemon.socket(), options(url, "odd", 0, 1, 4))
        .unwrap_or_else(|e| panic!("one odd key refused the whole bucket: {e}"));
    let seen = drain(&mut c);
    let status: Vec<u8> = seen.iter().flat_map(|s| s.status.clone()).collect();
    assert_eq!(status.len(), 12, "10 images and the 2 odd keys");
    let bad = status
        .iter()
        .filter(|&&s| s != SampleStatus::Ok as u8)
        .count();
    assert_eq!(bad, 2, "exactly the odd keys are bad samples: {status:?}");
}

#[test]
fn a_listing_past_max_index_entries_is_refused_naming_the_limit() {
    let dir = tempfile::tempdir().unwrap();
    // 2,500 objects: three pages of the server's 1,000.
    let objects: BTreeMap<String, Vec<u8>> = (0..2500)
        .map(|i| (format!("data/{i:05}.jpg"), vec![0xff, 0xd8, 0xff]))
        .collect();
    let fake = FakeS3::start("many", objects, Arc::new(|_| false));
    let config = fake_config(dir.path(), &fake, "prefetch = false");
    let text = std::fs::read_to_string(&config).unwrap() + "\n[limits]\nmax_index_entries = 2000\n";
    std::fs::write(&config, text).unwrap();
    let daemon = Daemon::start_configured(dir.path(), &config, &["--threads", "1"]);
    let e = match Client::attach(daemon.socket(), options("s3://many/data", "many", 0, 1, 4)) {
        Ok(_) => panic!("more objects than max_index_entries are refused"),
        Err(e) => e.to_string(),
    };
    assert!(
        e.contains("limits.max_index_entries") && e.contains("2000"),
        "{e}"
    );

    // Within the limit, every page is read; the store forgets them when the dataset goes.
    let cfg = S3Config {
        default: Connection {
            endpoint: Some(fake.endpoint()),
            region: Some("us-east-1".into()),
            path_style: Some(true),
            access_key_id: Some(ACCESS_KEY.into()),
            secret_access_key: Some(SECRET.into()),
            session_token: None,
        },
        cache_dir: Some(dir.path().join("test-objects")),
        ..S3Config::default()
    };
    let store = ObjectStore::new(&cfg, &BTreeMap::new());
    let opts = OpenOptions {
        use_cache: false,
        objects: Some(store.clone()),
        ..OpenOptions::default()
    };
    let ds = Dataset::open(Path::new("s3://many/data"), &opts).unwrap();
    assert_eq!(ds.len(), 2500);
    assert_eq!(store.objects_remembered(), 2500);
    drop(ds);
    assert_eq!(
        store.objects_remembered(),
        0,
        "the listing is given back with its dataset"
    );
}
