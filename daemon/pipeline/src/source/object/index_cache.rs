//! The index of an `s3://` dataset kept on disk, beside the local index caches, so that a
//! second open (a restarted daemon, `stoker check`) does not list the prefix again.
//!
//! # Design
//! - Keyed by the URL, the connection it uses and the `AWS_*` environment (all hashed), and
//!   stored with every object the dataset reads (key, size, ETag), which are remembered for
//!   the reader on load as a listing would.
//! - Trusted for `s3.index_ttl_s` seconds after it was written (default 600; 0 turns it
//!   off): no request checks it, so that is how long a change under the prefix can go unseen.
//!
//! # Limitations
//! - Within the time to live, objects added under the prefix are not seen, a deleted one is
//!   a bad sample `not_found`, and one replaced by another of a different size `io`.

use std::path::Path;
use std::sync::Arc;

use super::client::{ObjectInfo, Remote};
use super::{ObjectStore, S3Url};
use crate::source::index::{load_remote_index, save_remote_index, Dataset, OpenOptions};

/// The URL, its connection and the environment a connection takes what it leaves out from
/// (so another key or endpoint, even from the environment, never reuses this index).
fn cache_key(store: &ObjectStore, url: &S3Url) -> String {
    // "folder": listed as `prefix/` (an index cached before could hold a neighbour's objects).
    let mut key = format!(
        "{}\nfolder\n{:?}",
        url.as_string(),
        store.connection_for(url)
    );
    for var in ENV_KEYS {
        key += &format!("\n{var}={:?}", std::env::var_os(var));
    }
    key
}

const ENV_KEYS: [&str; 8] = [
    "AWS_ENDPOINT_URL",
    "AWS_ENDPOINT",
    "AWS_REGION",
    "AWS_DEFAULT_REGION",
    "AWS_ACCESS_KEY_ID",
    "AWS_SECRET_ACCESS_KEY",
    "AWS_SESSION_TOKEN",
    "AWS_PROFILE",
];

fn ttl_ns(store: &ObjectStore) -> i128 {
    i128::from(store.config().index_ttl_s) * 1_000_000_000
}

/// The dataset at `url` from its cached index, its objects remembered; `None` on a miss.
pub(super) fn load(
    store: &ObjectStore,
    path: &Path,
    url: &S3Url,
    remote: &Arc<Remote>,
    opts: &OpenOptions,
) -> Option<Dataset> {
    let cached = load_remote_index(path, &cache_key(store, url), opts, ttl_ns(store))?;
    let objects = parse(&cached.extra)?;
    store.remember(remote, &objects);
    Some(cached.dataset)
}

/// Writes the index of `ds` (just indexed from `url`) with its objects.
pub(super) fn save(store: &ObjectStore, url: &S3Url, opts: &OpenOptions, ds: &Dataset) {
    if ttl_ns(store) <= 0 {
        return;
    }
    let mut text = String::new();
    {
        let map = store.objects.read().unwrap_or_else(|e| e.into_inner());
        let mut last: Option<&Path> = None;
        for i in 0..ds.len() {
            let p = ds.sample(i).path;
            if last == Some(p) {
                continue; // the samples of one shard
            }
            last = Some(p);
            let Some(o) = map.get(p.to_string_lossy().as_ref()).map(|r| &r.object) else {
                return;
            };
            if o.key.contains('\n') || o.etag.contains(['\t', '\n']) {
                return; // not representable in the text form: not cached
            }
            text += &format!("{}\t{}\t{}\n", o.size, o.etag, o.key);
        }
    }
    save_remote_index(&cache_key(store, url), opts, ds, &text);
}

/// `size<TAB>etag<TAB>key` lines; `None` if any is malformed.
fn parse(text: &str) -> Option<Vec<ObjectInfo>> {
    text.lines()
        .map(|l| {
            let mut f = l.splitn(3, '\t');
            Some(ObjectInfo {
                size: f.next()?.parse().ok()?,
                etag: f.next()?.to_owned(),
                key: f.next()?.to_owned(),
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn object_lines_round_trip_and_bad_ones_miss() {
        let got = parse("12\t\"abc\"\tdata/a b.jpg\n3\t\tk\tx\n").unwrap();
        assert_eq!(got[0].size, 12);
        assert_eq!(got[0].etag, "\"abc\"");
        assert_eq!(got[0].key, "data/a b.jpg");
        assert_eq!(got[1].key, "k\tx");
        assert!(parse("x\te\tk\n").is_none());
        assert!(parse("1\te\n").is_none());
    }
}
