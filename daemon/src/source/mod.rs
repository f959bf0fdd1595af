//! Where a dataset's bytes come from.
//!
//! - `index`: what a dataset is (layouts: ImageFolder, file list, tar shards; the index cache);
//! - `local`: local storage: the batched io_uring / pread reader and the safe open rules;
//! - `object`: object storage (`s3://`): client, ranged reads, prefetch and the node cache;
//! - `url`: the `s3://` URL rules both `index` and `object` use.
//!
//! # Design
//! `index` never names `object`: it defines what it needs of object storage
//! ([`index::RemoteFiles`], HEAD a file list's URLs) and this room hands it over. A path is
//! routed here ([`index::Dataset::open`]): a URL to object storage, anything else to the local
//! index.
//!
//! # Limitations
//! Object storage's state is still process-wide (`object`'s hub), not owned by the dataset.

pub mod index;
pub mod local;
pub mod object;
pub mod url;

use std::path::Path;

use index::{Dataset, DatasetError, OpenOptions};
use local::reader::{ReadError, ReadRequest, Reader};

impl Dataset {
    /// Opens the dataset at `path`: an `s3://` URL from object storage, anything else from the
    /// local index (its cache when unchanged, else by indexing it; a file list's `s3://`
    /// entries HEADed in object storage).
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        if url::is_url(path) {
            object::open_dataset(path, opts)
        } else {
            Dataset::open_local(path, opts, &object::ObjectStorage)
        }
    }
}

/// Reads `reqs` into the buffers of the same index with `reader`: local files directly, and
/// `s3://` samples from their node-cache copies, fetched first where needed (all of the
/// batch's fetches in flight at once). One result per request; errors name the request's
/// path or URL.
///
/// # Panics
/// If `bufs` is shorter than `reqs`.
pub fn read_batch(
    reader: &mut Reader,
    reqs: &[ReadRequest<'_>],
    bufs: &mut [Vec<u8>],
) -> Vec<Result<(), ReadError>> {
    match object::localize(reqs) {
        Some(local) => object::read_localized(reqs, local, bufs, |r, b| reader.read_batch(r, b)),
        None => reader.read_batch(reqs, bufs),
    }
}
