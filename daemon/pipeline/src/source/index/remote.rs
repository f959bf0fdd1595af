//! What object storage needs to build a dataset whose files are `s3://` URLs.
//!
//! # Design
//! A child module, so the dataset's storage stays private: `s3` pushes samples through these
//! few methods only.
//!
//! The on-disk index of an `s3://` dataset is the local index cache's format (no stamps), in
//! `s3-index-<hash of URL and connection key>.bin`, with the caller's text (its objects)
//! beside it in `.objects`; it is trusted for a time the caller gives (no stamps to check).
//!
//! # Limitations
//! Remote datasets carry no stamps: a cached index is only as fresh as its age.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use super::cache::{
    decode, fnv1a, private_cache_dir, read_signed, save_cache, write_signed, FNV_OFFSET,
};
use super::{cache_dir, now_ns, Dataset, DatasetError, DatasetKind, IndexOrigin, OpenOptions};

/// One sample of a shard as its sidecar index (`NAME.tar.idx`) gives it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IndexedSample {
    /// Byte offset of the image member's data in the shard.
    pub offset: u64,
    /// Length of the image member's data in bytes.
    pub len: u64,
    /// The sample's label (-1 where it has none).
    pub label: i64,
    /// The image member's name in the shard.
    pub name: String,
}

/// An `s3://` dataset's index read from disk, and the text stored beside it.
pub(crate) struct CachedIndex {
    pub dataset: Dataset,
    pub extra: String,
}

/// `<cache dir>/s3-index-<hash>` (without extension), `None` when the cache is off.
fn remote_index_base(url: &Path, key: &str, opts: &OpenOptions) -> Option<PathBuf> {
    if !opts.use_cache {
        return None;
    }
    let h = fnv1a(
        key.as_bytes(),
        fnv1a(url.as_os_str().as_encoded_bytes(), FNV_OFFSET),
    );
    Some(private_cache_dir(opts)?.join(format!("s3-index-{h:016x}")))
}

/// The index of the dataset at `url` (cache key `key`) written less than `ttl_ns` ago.
pub(crate) fn load_remote_index(
    url: &Path,
    key: &str,
    opts: &OpenOptions,
    ttl_ns: i128,
) -> Option<CachedIndex> {
    let base = remote_index_base(url, key, opts).filter(|_| ttl_ns > 0)?;
    let data = read_signed(&base.with_extension("bin")).ok()?;
    let kinds = [
        DatasetKind::Flat,
        DatasetKind::ImageFolder,
        DatasetKind::TarShards,
    ];
    let (mut dataset, written_at) = kinds
        .into_iter()
        .filter(|k| opts.kind.is_none_or(|o| o == *k))
        .find_map(|k| decode(&data, url, k))?;
    let age = now_ns() - written_at;
    if !(0..ttl_ns).contains(&age) {
        return None;
    }
    let extra = String::from_utf8(read_signed(&base.with_extension("objects")).ok()?).ok()?;
    dataset.origin = IndexOrigin::Cache;
    // Every file of an `s3://` dataset is an object.
    dataset.object_files = vec![true; dataset.files.len()];
    Some(CachedIndex { dataset, extra })
}

/// Writes the index of `ds` (cache key `key`) and `extra` beside it; a failure is a warning.
pub(crate) fn save_remote_index(key: &str, opts: &OpenOptions, ds: &Dataset, extra: &str) {
    let Some(base) = remote_index_base(&ds.root, key, opts) else {
        return;
    };
    // The objects first, the index last: an index is read only with its objects beside it.
    let written = write_signed(&base.with_extension("objects"), extra.as_bytes())
        .and_then(|()| save_cache(&base.with_extension("bin"), ds, now_ns()));
    if let Err(e) = written {
        tracing::warn!(cache = %base.display(), error = %e, "cannot write the s3 dataset index cache");
    }
}

/// The folder local index caches live in (`$STOKER_CACHE_DIR`, ...); `None` without one.
pub fn default_cache_dir() -> Option<PathBuf> {
    cache_dir(&OpenOptions::default())
}

impl Dataset {
    /// An empty dataset named by the URL `root`.
    pub(crate) fn remote(root: &Path, kind: DatasetKind) -> Dataset {
        Dataset::empty(root, kind)
    }

    /// The label of class `name`, added after the others when new (names arrive sorted).
    pub(crate) fn class_label(&mut self, name: &str) -> i64 {
        if self.classes.last().map(String::as_str) != Some(name) {
            self.classes.push(name.to_owned());
        }
        i64::try_from(self.classes.len()).map_or(i64::MAX, |n| n - 1)
    }

    /// One whole object as one sample.
    pub(crate) fn push_object(
        &mut self,
        url: &[u8],
        len: u64,
        label: i64,
    ) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        self.mark_object(id);
        self.push_sample(id, 0, len, label);
        Ok(())
    }

    /// The samples a shard's sidecar index lists, as samples of the shard at `url`.
    pub(crate) fn append_indexed_shard(
        &mut self,
        url: &[u8],
        samples: &[IndexedSample],
    ) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        self.mark_object(id);
        for s in samples {
            self.push_sample(id, s.offset, s.len, s.label);
            self.members.push(s.name.as_bytes());
        }
        Ok(())
    }

    /// Every sample of `shard` (indexed from a local copy) as a sample of the shard at `url`.
    pub(crate) fn append_shard(&mut self, url: &[u8], shard: &Dataset) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        self.mark_object(id);
        for i in 0..shard.len() {
            self.fields.push_sample(self.len(), &shard.fields.of(i));
            self.push_sample(id, shard.offset[i], shard.len[i], shard.label[i]);
            self.members.push(shard.members.get(i));
        }
        Ok(())
    }
}
