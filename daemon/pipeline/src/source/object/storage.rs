//! The store as datasets hold it: [`ObjectStorage`] for [`ObjectStore`], and a dataset's
//! object table bound to its store ([`Bound`], its [`DatasetObjects`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use super::slots::Flow;
use super::{ObjectRef, ObjectStore};
use crate::source::index::{
    Dataset, DatasetError, DatasetObjects, HeadError, ObjectStorage, OpenOptions, RemoteFile,
    SampleRef, Staged, Storage,
};
use crate::source::local::reader::{ReadError, ReadRequest, Reader};

/// A dataset's objects by file id (`None` for its local files), shared with the
/// prefetcher's planning task.
pub(super) type ObjectTable = Arc<Vec<Option<ObjectRef>>>;

/// A dataset's objects: its object table and the store it reads them through.
#[derive(Debug)]
pub(super) struct Bound {
    store: Arc<ObjectStore>,
    table: ObjectTable,
    /// Whether it is an `s3://` dataset, whose objects are fetched ahead while
    /// `s3.prefetch` is on (a file list's objects are not).
    ahead: bool,
    /// Whose downloads they are (the job's user and the dataset), for fair request slots.
    flow: Flow,
}

impl ObjectStore {
    /// The objects of `ds` by file id, from the objects this store listed or HEADed, bound
    /// to this store; fetched ahead when `ahead` (see [`Bound`]).
    fn bind_table(
        self: Arc<Self>,
        ds: &Dataset,
        ahead: bool,
        user: Option<u32>,
    ) -> Arc<dyn DatasetObjects> {
        let map = self.objects.read().unwrap_or_else(|e| e.into_inner());
        let mut table: Vec<Option<ObjectRef>> = Vec::new();
        for i in 0..ds.len() {
            let s = ds.sample(i);
            let at = s.file as usize;
            if s.storage != Storage::Object || table.get(at).is_some_and(Option::is_some) {
                continue;
            }
            if table.len() <= at {
                table.resize(at + 1, None);
            }
            table[at] = map
                .get(s.path.to_string_lossy().as_ref())
                .map(|r| r.object.clone());
        }
        drop(map);
        let flow = Flow {
            user,
            dataset: ds.root().to_string_lossy().as_ref().into(),
        };
        Arc::new(Bound {
            store: self,
            table: Arc::new(table),
            ahead,
            flow,
        })
    }
}

impl Drop for Bound {
    /// The dataset is gone (its job ended): its objects are forgotten by the store once no
    /// other dataset holds them, so a large listing's memory is given back (a later open
    /// lists again, or reads its index cache, and remembers them anew).
    fn drop(&mut self) {
        self.store.forget(&self.table);
    }
}

impl ObjectStore {
    /// Lets go of the objects of `table` (see `remember`): each is forgotten once no other
    /// dataset, open or being opened, holds it.
    fn forget(&self, table: &[Option<ObjectRef>]) {
        let mut map = self.objects.write().unwrap_or_else(|e| e.into_inner());
        for o in table.iter().flatten() {
            let url = o.remote.url(&o.key);
            if let Some(r) = map.get_mut(&url) {
                r.holders = r.holders.saturating_sub(1);
                if r.holders == 0 {
                    map.remove(&url);
                }
            }
        }
        map.shrink_to_fit();
    }

    /// How many listed or HEADed objects this store remembers now (those of the datasets
    /// opened through it that are still open).
    pub fn objects_remembered(&self) -> usize {
        self.objects.read().unwrap_or_else(|e| e.into_inner()).len()
    }
}

impl ObjectStorage for ObjectStore {
    fn open(self: Arc<Self>, url: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        let mut ds = super::index::open_dataset(&self, url, opts)?;
        ds.set_objects(Some(self.bind_table(&ds, true, opts.owner)));
        Ok(ds)
    }

    fn head(&self, urls: &[&Path]) -> Vec<Result<RemoteFile, HeadError>> {
        self.head_urls(urls)
            .into_iter()
            .map(|r| {
                r.map(|e| RemoteFile {
                    url: e.url,
                    size: e.size,
                })
                .map_err(HeadError::from)
            })
            .collect()
    }

    fn bind(self: Arc<Self>, ds: &Dataset) -> Arc<dyn DatasetObjects> {
        self.bind_table(ds, false, None)
    }
}

impl DatasetObjects for Bound {
    fn read(
        &self,
        reader: &mut Reader,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
        due: Option<Instant>,
    ) -> Vec<Result<(), ReadError>> {
        self.store
            .read(&self.table, reader, reqs, bufs, due, &self.flow)
    }

    fn stage(
        &self,
        reqs: &[ReadRequest<'_>],
        wake: Arc<dyn Fn() + Send + Sync>,
    ) -> Option<Box<dyn Staged>> {
        self.store.stage(&self.table, reqs, wake, &self.flow)
    }

    fn local_file(&self, sample: SampleRef<'_>) -> std::io::Result<PathBuf> {
        (self.store).local_file(&self.table, sample.request(), &self.flow)
    }

    fn prefetches(&self) -> bool {
        self.ahead && self.store.config().prefetch
    }

    fn schedule(
        &self,
        ds: &Arc<Dataset>,
        epoch: u64,
        order: Vec<u64>,
        current: Box<dyn Fn() -> bool + Send + Sync>,
    ) {
        self.store
            .schedule_prefetch(ds, &self.table, epoch, order, current, &self.flow);
    }

    fn evict(&self, ds: &Dataset) -> usize {
        self.store.evict(&self.table, ds)
    }
}
