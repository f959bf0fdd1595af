//! What `crate::s3` needs to build a dataset whose files are `s3://` URLs.
//!
//! # Design
//! A child module, so the dataset's storage stays private: `s3` pushes samples through these
//! few methods only.
//!
//! # Limitations
//! Remote datasets carry no stamps: the on-disk index cache is not used for them.

use std::path::{Path, PathBuf};

use super::{cache_dir, Dataset, DatasetError, DatasetKind, OpenOptions};

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
        self.classes.len() as i64 - 1
    }

    /// One whole object as one sample.
    pub(crate) fn push_object(
        &mut self,
        url: &[u8],
        len: u64,
        label: i64,
    ) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        self.push_sample(id, 0, len, label);
        Ok(())
    }

    /// The samples a shard's sidecar index lists, as samples of the shard at `url`.
    pub(crate) fn append_indexed_shard(
        &mut self,
        url: &[u8],
        samples: &[crate::s3::sidecar::IndexedSample],
    ) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        for s in samples {
            self.push_sample(id, s.offset, s.len, s.label);
            self.members.push(s.name.as_bytes());
        }
        Ok(())
    }

    /// Every sample of `shard` (indexed from a local copy) as a sample of the shard at `url`.
    pub(crate) fn append_shard(&mut self, url: &[u8], shard: &Dataset) -> Result<(), DatasetError> {
        let id = self.push_file(url)?;
        for i in 0..shard.len() {
            self.push_sample(id, shard.offset[i], shard.len[i], shard.label[i]);
            self.members.push(shard.members.get(i));
        }
        Ok(())
    }
}
