//! The store as a dataset holds it: [`ObjectStorage`] for [`ObjectStore`].

use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::ObjectStore;
use crate::source::index::{Dataset, DatasetError, ObjectStorage, OpenOptions, RemoteFile};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

impl ObjectStorage for ObjectStore {
    fn open(self: Arc<Self>, url: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        let mut ds = super::index::open_dataset(&self, url, opts)?;
        ds.set_objects(Some(self));
        Ok(ds)
    }

    fn head(&self, urls: &[&Path]) -> Vec<Result<RemoteFile, String>> {
        self.head_urls(urls)
            .into_iter()
            .map(|r| {
                r.map(|e| RemoteFile {
                    url: e.url,
                    size: e.size,
                })
                .map_err(|e| e.to_string())
            })
            .collect()
    }

    fn read(
        &self,
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<(), ReadError>> {
        ObjectStore::read(self, reader, reqs, bufs)
    }

    fn local_file(&self, path: &Path) -> std::io::Result<PathBuf> {
        ObjectStore::local_file(self, path)
    }

    fn prefetches(&self, ds: &Dataset) -> bool {
        ObjectStore::prefetches(self, ds)
    }

    fn schedule(
        &self,
        ds: &Arc<Dataset>,
        epoch: u64,
        order: Vec<u64>,
        current: Box<dyn Fn() -> bool + Send + Sync>,
    ) {
        self.schedule_prefetch(ds, epoch, order, current);
    }

    fn evict(&self, ds: &Dataset) -> usize {
        ObjectStore::evict(self, ds)
    }
}
