//! What a dataset needs of object storage, named here so that `index` never names `object`.
//!
//! # Design
//! Object storage is an owned value (`object::ObjectStore`), made by whoever reads object
//! storage (the service, each tool) and handed to [`Dataset::open`] in
//! [`OpenOptions::objects`]. A dataset with samples in object storage (an `s3://` prefix, a
//! file list naming `s3://` URLs) holds it, so its reads, its prefetching and its eviction go
//! through its own store, never a process-wide one.
//!
//! # Limitations
//! A dataset opened without a store cannot name object storage: an `s3://` path or entry is
//! refused, saying so.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::{Dataset, DatasetError, OpenOptions};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

/// Object storage as a dataset holds it (implemented by `object::ObjectStore`).
pub trait ObjectStorage: Send + Sync + std::fmt::Debug {
    /// Opens the dataset at the `s3://` URL `url`; the dataset holds this store.
    fn open(self: Arc<Self>, url: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError>;

    /// HEADs every URL in `urls` (a file list's entries), one result each in order: the URL
    /// as the reader knows it and the object's size, or why it cannot be read.
    fn head(&self, urls: &[&Path]) -> Vec<Result<RemoteFile, String>>;

    /// Reads `reqs` into the buffers of the same index: local files with `reader`, objects
    /// from their node-cache copies (fetched first where needed, all at once), read with
    /// `reader` too. One result per request; errors name the request's path or URL.
    fn read(
        &self,
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<(), ReadError>>;

    /// The local file holding the bytes of `path`: itself, or an object's node-cache copy
    /// (fetched first if needed).
    fn local_file(&self, path: &Path) -> io::Result<PathBuf>;

    /// Whether samples of `ds` are fetched ahead of the readers (see [`Self::schedule`]).
    fn prefetches(&self, ds: &Dataset) -> bool;

    /// Starts fetching the objects of samples `order` of `ds` (global sample indices, in the
    /// order one rank reads them from now on, `epoch`'s) in the background, while `current`
    /// says the schedule is still that rank's newest.
    fn schedule(
        &self,
        ds: &Arc<Dataset>,
        epoch: u64,
        order: Vec<u64>,
        current: Box<dyn Fn() -> bool + Send + Sync>,
    );

    /// Deletes the node-cache copies of the samples of `ds`, so that the next read fetches
    /// them from the server; how many copies were deleted.
    fn evict(&self, ds: &Dataset) -> usize;
}

/// A file named by URL: the URL as the reader knows it (normalised) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    pub url: String,
    pub size: u64,
}

impl Dataset {
    /// The object storage this dataset's samples are read from; `None` for local datasets.
    pub fn objects(&self) -> Option<&Arc<dyn ObjectStorage>> {
        self.objects.as_ref()
    }

    /// Makes `objects` this dataset's object storage.
    pub(crate) fn set_objects(&mut self, objects: Option<Arc<dyn ObjectStorage>>) {
        self.objects = objects;
    }
}
