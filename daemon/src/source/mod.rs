//! Where a dataset's bytes come from.
//!
//! - `index`: what a dataset is (layouts: ImageFolder, file list, tar shards; the index cache);
//! - `local`: local storage: the batched io_uring / pread reader and the safe open rules;
//! - `object`: object storage (`s3://`): client, ranged reads, prefetch and the node cache;
//! - `url`: the `s3://` URL rules both `index` and `object` use.
//!
//! # Design
//! `index` never names `object`: it defines what a dataset needs of object storage
//! ([`index::ObjectStorage`]: open a prefix, HEAD a file list's URLs, read, prefetch, evict)
//! and `object` implements it ([`object::ObjectStore`]). A store is an owned value: whoever
//! reads object storage makes one (the service at start, each tool) and hands it to
//! [`index::Dataset::open`] in [`index::OpenOptions::objects`]; a dataset with samples in
//! object storage holds it, so its reads, prefetching and eviction go through its own store
//! and two stores share nothing. A path is routed here ([`index::Dataset::open`]): a URL to
//! object storage, anything else to the local index; a batch likewise ([`read_batch`]).
//!
//! # Limitations
//! A sample in object storage is still named by its URL in the index (a path that is not
//! one); the store finds its object by that URL.

pub mod index;
pub mod local;
pub mod object;
pub mod url;

use std::path::Path;

use index::{Dataset, DatasetError, OpenOptions};
use local::reader::{ReadError, ReadRequest, Reader};

impl Dataset {
    /// Opens the dataset at `path`: an `s3://` URL from the object storage in `opts` (which
    /// the dataset then holds), anything else from the local index (its cache when
    /// unchanged, else by indexing it; a file list's `s3://` entries HEADed in that object
    /// storage).
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        if !url::is_url(path) {
            return Dataset::open_local(path, opts);
        }
        match &opts.objects {
            Some(objects) => objects.clone().open(path, opts),
            None => Err(DatasetError::WrongKind {
                path: path.to_owned(),
                reason: "an s3:// dataset, and no object storage was given to read it from".into(),
            }),
        }
    }
}

/// Reads `reqs` (samples of `ds`) into the buffers of the same index with `reader`: local
/// files directly, samples in object storage through the dataset's own store (from their
/// node-cache copies, fetched first where needed). One result per request; errors name the
/// request's path or URL.
///
/// # Panics
/// If `bufs` is shorter than `reqs`.
pub fn read_batch(
    ds: &Dataset,
    reader: &mut Reader,
    reqs: &[ReadRequest<'_>],
    bufs: &mut [Vec<u8>],
) -> Vec<Result<(), ReadError>> {
    match ds.objects() {
        Some(objects) => objects.read(reader, reqs, bufs),
        None => reader.read_batch(reqs, bufs),
    }
}
