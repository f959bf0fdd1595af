//! Where a dataset's bytes come from.
//!
//! - `index`: what a dataset is (layouts: ImageFolder, file list, tar shards; the index cache);
//! - `local`: local storage: the batched io_uring / pread reader and the safe open rules;
//! - `object`: object storage (`s3://`): client, ranged reads, prefetch and the node cache.

pub mod index;
pub mod local;
pub mod object;

use local::reader::{ReadError, ReadRequest, Reader};

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
