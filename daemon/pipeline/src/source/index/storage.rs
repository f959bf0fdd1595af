//! What a dataset needs of object storage, named here so that `index` never names `object`.
//!
//! # Design
//! Object storage is an owned value (`object::ObjectStore`), made by whoever reads object
//! storage (the service, each tool) and handed to [`Dataset::open`] in
//! [`OpenOptions::objects`] ([`ObjectStorage`]). Each file of a dataset is local or an object
//! ([`Storage`], by file id, in every [`SampleRef`]). A dataset with objects (an `s3://`
//! prefix, a file list naming `s3://` URLs) holds its [`DatasetObjects`]: its object table by
//! file id, bound to its store when it is opened ([`ObjectStorage::bind`]), so its reads, its
//! prefetching and its eviction find each object by file id through its own store, never by
//! URL and never through a process-wide one. An object's URL stays its sample path: the name
//! errors and logs give it.
//!
//! # Limitations
//! A dataset opened without a store cannot name object storage: an `s3://` path or entry is
//! refused, saying so.

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::{Dataset, DatasetError, OpenOptions, SampleRef};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

/// Where a dataset's file is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Storage {
    /// A local file, read at its path.
    Local,
    /// An object in the dataset's object storage, found by its file id.
    Object,
}

/// Why an object cannot be HEADed, as the object store says it (its own error type, which
/// this room does not name).
pub type HeadError = Box<dyn std::error::Error + Send + Sync>;

/// Object storage as datasets are opened from it (implemented by `object::ObjectStore`).
pub trait ObjectStorage: Send + Sync + std::fmt::Debug {
    /// Opens the dataset at the `s3://` URL `url`; the dataset holds its objects, bound to
    /// this store.
    fn open(self: Arc<Self>, url: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError>;

    /// HEADs every URL in `urls` (a file list's entries), one result each in order: the URL
    /// as the reader knows it and the object's size, or why it cannot be read.
    fn head(&self, urls: &[&Path]) -> Vec<Result<RemoteFile, HeadError>>;

    /// The object table of `ds` (its object files, listed or HEADed by this store), bound to
    /// this store.
    fn bind(self: Arc<Self>, ds: &Dataset) -> Arc<dyn DatasetObjects>;
}

/// A dataset's objects as it holds them: its object table by file id and its store.
pub trait DatasetObjects: Send + Sync + std::fmt::Debug {
    /// Reads `reqs` into the buffers of the same index: local files with `reader`, objects
    /// (found by [`ReadRequest::object`]) from their node-cache copies (fetched first where
    /// needed, all at once, waited for until `due` at most: past it an object still on its
    /// way is an `io` error), read with `reader` too. One result per request; errors name the
    /// request's path or URL.
    fn read(
        &self,
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
        due: Option<Instant>,
    ) -> Vec<Result<(), ReadError>>;

    /// Starts fetching the objects of `reqs` (one batch's) that are not local, without
    /// waiting for any, and keeps them in the node cache while the [`Staged`] lives; `wake`
    /// is called (from another thread) once every fetch ended, or when the batch is due.
    /// `None` when no request is for an object.
    fn stage(
        &self,
        reqs: &[ReadRequest<'_>],
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> Option<Box<dyn Staged>>;

    /// The local file holding the bytes of `sample`: its own, or its object's node-cache copy
    /// (fetched first if needed).
    fn local_file(&self, sample: SampleRef<'_>) -> io::Result<PathBuf>;

    /// Whether samples of `ds` are fetched ahead of the readers (see [`Self::schedule`]).
    fn prefetches(&self) -> bool;

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

/// One batch's objects on their way into the node cache ([`DatasetObjects::stage`]), kept
/// there while this lives. A batch is read once it is settled or due, whichever comes first:
/// nobody waits for the network meanwhile.
pub trait Staged: Send + Sync + std::fmt::Debug {
    /// Whether every fetch ended (well or not).
    fn settled(&self) -> bool;

    /// When the batch is due: its reads wait no longer (the whole-request deadline from the
    /// time it was staged).
    fn due(&self) -> Instant;
}

/// A file named by URL: the URL as the reader knows it (normalised) and its size.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteFile {
    /// The normalised `s3://` URL.
    pub url: String,
    /// The object's size in bytes.
    pub size: u64,
}

impl<'a> SampleRef<'a> {
    /// The read of this sample's bytes.
    pub fn request(self) -> ReadRequest<'a> {
        ReadRequest {
            path: self.path,
            offset: self.offset,
            len: self.len,
            object: (self.storage == Storage::Object).then_some(self.file),
        }
    }
}

impl Dataset {
    /// This dataset's objects and the store they are read from; `None` when it has none.
    pub fn objects(&self) -> Option<&Arc<dyn DatasetObjects>> {
        self.objects.as_ref()
    }

    /// Makes `objects` this dataset's objects.
    pub(crate) fn set_objects(&mut self, objects: Option<Arc<dyn DatasetObjects>>) {
        self.objects = objects;
    }

    /// Where file `file` is.
    pub(super) fn storage_of(&self, file: u32) -> Storage {
        match self.object_files.get(file as usize) {
            Some(true) => Storage::Object,
            _ => Storage::Local,
        }
    }

    /// Records that file `file` is an object.
    pub(super) fn mark_object(&mut self, file: u32) {
        let at = file as usize;
        if self.object_files.len() <= at {
            self.object_files.resize(at + 1, false);
        }
        self.object_files[at] = true;
    }

    /// Whether any file of this dataset is an object.
    pub(super) fn has_objects(&self) -> bool {
        self.object_files.contains(&true)
    }
}
