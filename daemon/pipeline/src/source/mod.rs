//! Where a dataset's bytes come from.
//!
//! - `index`: what a dataset is (layouts: ImageFolder, file list, tar shards; the index cache);
//! - `local`: local storage: the batched io_uring / pread reader and the safe open rules;
//! - `object`: object storage (`s3://`): client, ranged reads, prefetch and the node cache;
//! - `url`: the `s3://` URL rules both `index` and `object` use.
//!
//! # Design
//! `index` never names `object`: it defines what a dataset needs of object storage
//! ([`index::ObjectStorage`]: open a prefix, HEAD a file list's URLs, bind a dataset's
//! objects; [`index::DatasetObjects`]: read, prefetch, evict) and `object` implements it
//! ([`object::ObjectStore`]). A store is an owned value: whoever reads object storage makes
//! one (the service at start, each tool) and hands it to [`index::Dataset::open`] in
//! [`index::OpenOptions::objects`]; a dataset with samples in object storage holds its
//! objects by file id, bound to that store, so its reads, prefetching and eviction go
//! through its own store and two stores share nothing. A path is routed here
//! ([`index::Dataset::open`]): a URL to object storage, anything else to the local index. A
//! sample says where its file is ([`index::Storage`] and its file id, carried by its
//! [`local::reader::ReadRequest`]), and a batch is routed by that ([`read_batch`]), never by
//! the shape of its path: an object's URL is only its name in errors and logs.
//!
//! # Limitations
//! The object table is built at open from the objects the store listed or HEADed, by URL.

pub mod index;
pub(crate) mod integrity;
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
/// files directly, objects ([`ReadRequest::object`]) through the dataset's own objects (from
/// their node-cache copies, fetched first where needed and waited for until `due` at most,
/// see [`index::DatasetObjects::read`]). One result per request; errors name the request's
/// path or URL.
///
/// # Panics
/// If `bufs` is shorter than `reqs`.
pub fn read_batch(
    ds: &Dataset,
    reader: &mut Reader,
    reqs: &[ReadRequest<'_>],
    bufs: &mut [Vec<u8>],
    due: Option<std::time::Instant>,
) -> Vec<Result<(), ReadError>> {
    match ds.objects() {
        Some(objects) => objects.read(reader, reqs, bufs, due),
        None => reader.read_batch(reqs, bufs),
    }
}
