//! Where a dataset's bytes come from.
//!
//! - `index`: what a dataset is (layouts: ImageFolder, file list, tar shards; the index cache);
//! - `local`: local storage: the batched io_uring / pread reader and the safe open rules;
//! - `object`: object storage (`s3://`): client, ranged reads, prefetch and the node cache.

pub mod index;
pub mod local;
pub mod object;
