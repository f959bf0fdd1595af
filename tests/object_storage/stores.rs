//! Object storage is an owned value: two stores in one process share nothing.

use super::*;
use stoker_pipeline::source::local::reader::{ReadRequest, Reader, ReaderKind};

/// Reads every sample of `ds` through its own storage; the bytes of each.
fn read_all(ds: &Dataset) -> Vec<Vec<u8>> {
    let mut reader = Reader::new(ReaderKind::Pread, 4).unwrap();
    let reqs: Vec<ReadRequest<'_>> = (0..ds.len()).map(|i| ds.sample(i).request()).collect();
    let mut bufs = vec![Vec::new(); reqs.len()];
    let got = stoker_pipeline::source::read_batch(ds, &mut reader, &reqs, &mut bufs, None);
    for (i, r) in got.iter().enumerate() {
        assert!(r.is_ok(), "sample {i}: {r:?}");
    }
    bufs
}

fn files_in(dir: &Path) -> usize {
    cached_objects(dir).len()
}

/// The files in `dir` once `want` are there (written behind, see `cached_settled`).
fn files_settled(dir: &Path, want: usize) -> usize {
    cached_settled(dir, want).len()
}

#[test]
fn two_stores_in_one_process_share_nothing() {
    let s = Served::folder();
    let (dir, folder, weed) = (s.dir.path(), &s.folder, &s.weed);
    let (cache_a, cache_b) = (dir.join("cache-a"), dir.join("cache-b"));
    let (a, b) = (
        weed.store_with_cache(&cache_a),
        weed.store_with_cache(&cache_b),
    );
    let url = format!("s3://{BUCKET}/folder");
    let open = |store: &Arc<ObjectStore>| {
        let opts = OpenOptions {
            use_cache: false,
            objects: Some(store.clone()),
            ..OpenOptions::default()
        };
        Dataset::open(Path::new(&url), &opts)
    };
    let local = Dataset::open(folder, &weed.no_cache()).unwrap();
    let want: Vec<Vec<u8>> = read_all(&local);
    let total: u64 = want.iter().map(|b| b.len() as u64).sum();

    // Reading through `a` fills `a`'s cache and counts in `a` only.
    let ds_a = open(&a).unwrap();
    assert_eq!(read_all(&ds_a), want, "the local folder's bytes");
    assert_eq!(a.bytes_downloaded(), total);
    assert_eq!(b.bytes_downloaded(), 0, "b fetched nothing");
    assert_eq!(files_settled(&cache_a, 18), 18);
    assert_eq!(files_in(&cache_b), 0, "b's cache is untouched");

    // The same URL through `b`: nothing of `a`'s is seen, every object is fetched again.
    let ds_b = open(&b).unwrap();
    assert_eq!(read_all(&ds_b), want);
    assert_eq!(b.bytes_downloaded(), total);
    assert_eq!(a.bytes_downloaded(), total, "a fetched nothing more");
    assert_eq!(files_settled(&cache_b, 18), 18);

    // Evicting through one dataset's store empties that store's cache only.
    assert_eq!(ds_a.objects().unwrap().evict(&ds_a), 18);
    assert_eq!(files_in(&cache_a), 0);
    assert_eq!(files_in(&cache_b), 18, "b's copies stay");

    // A store with another config (a wrong secret) is refused alone; `a` still reads.
    let wrong = ObjectStore::new(
        &S3Config {
            default: weed.connection("not-the-secret"),
            retries: 0,
            cache_dir: Some(dir.join("cache-wrong")),
            ..S3Config::default()
        },
        &BTreeMap::new(),
    );
    let e = open(&wrong).unwrap_err().to_string();
    assert!(e.contains("SignatureDoesNotMatch"), "{e}");
    assert_eq!(read_all(&ds_a), want, "a fetches its objects again");
    assert_eq!(a.bytes_downloaded(), 2 * total);
    assert_eq!(b.bytes_downloaded(), total);
}
