//! Datasets in object storage: `s3://bucket/prefix` wherever a dataset path is accepted.
//!
//! A prefix holding `.tar` objects is a set of WebDataset tar shards; otherwise its image
//! objects form an ImageFolder (the first path component under the prefix is the class) or,
//! when no object is under a sub-prefix, a flat dataset. A sample's file is an object found by
//! its file id in its dataset's object table (built at open from the objects its store listed
//! or HEADed); its `s3://` URL stays its path, the name errors and logs give it.
//!
//! # Design
//! - All state is one owned value, [`ObjectStore`]: the `[s3]` config, the buckets' clients,
//!   the listed objects, the node cache, the runtime and the request limits. The service
//!   makes one at start (a reload reconfigures it: connections and registered datasets at
//!   once, the cache folder, cap and in-flight limit as at its first use), each tool makes
//!   its own, and a dataset opened through it holds its objects bound to it (see
//!   `index::ObjectStorage` and `storage`): reads, prefetch and eviction go through the
//!   dataset's own store. Two stores share nothing.
//!   Without an `[s3]` section, connections come from the standard AWS environment and the
//!   node cache lives in `<cache dir>/objects`.
//! - A store's runtime (two threads) runs every request of the store; at most
//!   `max_in_flight` downloads are in flight at once, all its datasets together, each within
//!   the whole-request deadline `fetch_deadline_ms` (attempts, retries and backoffs
//!   together) and given up once an answer brings no byte for `stall_timeout_ms`. The slots
//!   are shared fairly between the users and datasets waiting for them, and an endpoint that
//!   stalls holds at most a quarter of them (`slots`). Decode workers never run a request nor wait for one: a feed stages a batch
//!   (`DatasetObjects::stage`: the missing downloads started at once, the batch's objects
//!   pinned in the [`cache::NodeCache`]) and hands it to workers once its objects are local
//!   or it is due; the workers then copy the objects just received from memory (their
//!   files are written behind: `cache`) and read older ones' local copies with their own
//!   reader, and what is still missing is a bad sample. Each download is one pass over its
//!   bytes: tagged as they arrive, nothing read back. Background tasks hold the runtime's handle and the
//!   limits, never the store. Each rank's feed tells its [`Prefetch`] the order it reads each
//!   epoch in, and its objects are fetched in that order in the background (up to the cache
//!   cap, with at most half of the requests, so the workers' own requests never queue behind
//!   it), so a worker usually finds its object local or on its way.
//! - Objects up to `whole_object_max_bytes` are cached whole (image objects, small shards);
//!   the samples of larger ones (tar shards) are fetched by ranged GETs, each its own cache
//!   file, neighbours in a chunk merged into one GET (`ranged`). Shards are indexed from the
//!   sidecar `NAME.tar.idx` that `stoker pack` writes (`sidecar`), else downloaded once.
//! - Failures are per object: a missing object is `not_found`, a refused one `permission`,
//!   anything else (server down after every retry) `io`; the bad-sample policy does the rest.
//!
//! # Limitations
//! - Shards without a sidecar are downloaded (into the node cache) to read their tar headers.
//!   The index is kept on disk for `s3.index_ttl_s` (`index_cache`), then listed again.
//! - Credentials from `~/.aws` profiles are not read (object_store does not); environment,
//!   web identity, container and instance credentials are.
//! - The cache's bookkeeping is per store: two stores (or daemons) sharing one folder do not
//!   see each other's use (files stay consistent; the cap may be overrun).
//! - Every listed object is remembered in its store (URL, size, ETag) while a dataset opened
//!   with it lives (`storage`: forgotten when the last dataset holding it goes). An open that
//!   fails after listing, and a file list naming one URL twice, leave their objects
//!   remembered until the store goes.

#![forbid(unsafe_code)]

mod buffers;
pub mod cache;
pub mod client;
pub mod config;
mod entries;
mod error;
mod index;
mod index_cache;
mod listing;
mod prefetch;
mod ranged;
mod read;
pub mod sidecar;
mod slots;
mod storage;

use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, OnceLock, RwLock};
use std::time::Duration;

use tokio::runtime::Runtime;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use slots::{Flow, Slot, Slots};

use crate::source::integrity;
use crate::source::url::join_key;
pub use crate::source::url::{is_url, S3Url};
use cache::{Cached, Claim, Fetched, NodeCache, Pending, Pin};
use client::{Expected, ObjectInfo, Remote, S3Error};
pub use config::{Connection, S3Config};
pub use entries::Entry;
pub use prefetch::Prefetch;
use ranged::Started;

/// Object storage's series, as the metrics catalogue declares them
/// ([`crate::metrics::catalogue`], which also describes and registers them).
pub mod metric {
    pub use crate::metrics::catalogue::{
        S3_BYTES_TOTAL as BYTES_TOTAL, S3_CACHE_REQUESTS_TOTAL as CACHE_REQUESTS_TOTAL,
        S3_ERRORS_TOTAL as ERRORS_TOTAL, S3_IN_FLIGHT as IN_FLIGHT,
        S3_RETRIES_TOTAL as RETRIES_TOTAL,
    };
}

/// An object a sample lives in: its bucket's client, size and ETag.
#[derive(Debug, Clone)]
struct ObjectRef {
    remote: Arc<Remote>,
    key: String,
    size: u64,
    etag: String,
}

impl ObjectRef {
    /// The service and bucket it lives in: what [`Slots`] caps when it stalls.
    fn endpoint(&self) -> String {
        format!("{} {}", self.remote.origin, self.remote.bucket())
    }

    /// What an answer for this object must be: its listed size and ETag.
    fn expected(&self) -> Expected<'_> {
        Expected {
            size: self.size,
            etag: &self.etag,
        }
    }

    fn cache_name(&self) -> String {
        NodeCache::name(
            &self.remote.origin,
            self.remote.bucket(),
            &self.key,
            &self.etag,
            self.size,
        )
    }
}

/// An object the store remembers: what it is, and how many datasets (open, or being
/// opened) hold it; forgotten when the last one goes.
#[derive(Debug)]
struct Remembered {
    object: ObjectRef,
    holders: u32,
}

/// Why an [`ObjectStore`] cannot download: its runtime or its node cache could not start. Kept
/// once made, so every later use says the same.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreSetupError {
    /// The tokio runtime the S3 requests run on could not start.
    #[error("cannot start the S3 runtime: {0}")]
    Runtime(Arc<std::io::Error>),
    /// Neither `s3.cache_dir` nor a home folder names where the node cache goes.
    #[error("no cache folder: set s3.cache_dir or HOME")]
    NoCacheFolder,
    /// The node cache's folder could not be made or used.
    #[error("node cache {}: {source}", dir.display())]
    NodeCache {
        /// The node cache's folder.
        dir: PathBuf,
        /// Why.
        source: Arc<std::io::Error>,
    },
}

/// Object storage: the `[s3]` config, the buckets' clients, the listed objects, the node
/// cache, the request limit and the runtime that runs every request. One is made by whoever
/// reads object storage (the service at start, each tool) and handed to every dataset it
/// opens ([`OpenOptions::objects`]), which holds it; two stores share nothing.
pub struct ObjectStore {
    config: RwLock<S3Config>,
    /// Connections of registered datasets, by their URL.
    by_url: RwLock<HashMap<String, Connection>>,
    remotes: Mutex<HashMap<(Connection, String), Arc<Remote>>>,
    /// Every object of the datasets opened through this store, by URL: what their object
    /// tables are built from when they are opened (`storage`).
    objects: RwLock<HashMap<String, Remembered>>,
    cache: OnceLock<Result<Arc<NodeCache>, StoreSetupError>>,
    runtime: OnceLock<Result<Runtime, StoreSetupError>>,
    /// The request slots (`max_in_flight`), shared fairly between users and datasets.
    slots: OnceLock<Arc<Slots>>,
    /// The prefetcher's share of the slots (at most half of them, see `prefetch`).
    prefetch_share: OnceLock<Arc<Semaphore>>,
    /// Bytes downloaded through this store (the `s3` source of the bytes metric).
    downloaded: Arc<AtomicU64>,
}

impl std::fmt::Debug for ObjectStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ObjectStore")
            .field("cache_dir", &self.config().cache_dir)
            .field("downloaded", &self.bytes_downloaded())
            .finish_non_exhaustive()
    }
}

impl Drop for ObjectStore {
    fn drop(&mut self) {
        // The last holder may be a task of the store's own runtime (a prefetch holding its
        // dataset): a plain drop would wait for the runtime's threads from inside one.
        if let Some(Ok(rt)) = self.runtime.take() {
            rt.shutdown_background();
        }
    }
}

impl ObjectStore {
    /// A store with the `[s3]` section `cfg`; `datasets` are the registered datasets (name
    /// -> path), whose `s3://` URLs get the connection `[s3.datasets.<name>]` gives them.
    /// Nothing is opened or started before the first use.
    pub fn new(cfg: &S3Config, datasets: &BTreeMap<String, PathBuf>) -> Arc<ObjectStore> {
        let store = ObjectStore {
            config: RwLock::new(S3Config::default()),
            by_url: RwLock::default(),
            remotes: Mutex::default(),
            objects: RwLock::default(),
            cache: OnceLock::new(),
            runtime: OnceLock::new(),
            slots: OnceLock::new(),
            prefetch_share: OnceLock::new(),
            downloaded: Arc::default(),
        };
        store.configure(cfg, datasets);
        Arc::new(store)
    }

    /// The store a tool uses: no `[s3]` section (connections from the AWS environment, the
    /// node cache in `<cache dir>/objects`), no registered datasets.
    pub fn from_environment() -> Arc<ObjectStore> {
        ObjectStore::new(&S3Config::default(), &BTreeMap::new())
    }

    /// Replaces the `[s3]` section and the registered datasets (a reload). The cache folder,
    /// cap and in-flight limit keep what they were at the first use of the store.
    pub fn configure(&self, cfg: &S3Config, datasets: &BTreeMap<String, PathBuf>) {
        *self.config.write().unwrap_or_else(|e| e.into_inner()) = cfg.clone();
        let mut by_url = self.by_url.write().unwrap_or_else(|e| e.into_inner());
        by_url.clear();
        for (name, path) in datasets {
            if let (Some(conn), Some(Ok(url))) = (cfg.datasets.get(name), S3Url::parse(path)) {
                by_url.insert(url.as_string(), conn.clone());
            }
        }
    }

    fn config(&self) -> S3Config {
        self.config
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn runtime(&self) -> Result<&Runtime, StoreSetupError> {
        self.runtime
            .get_or_init(|| {
                tokio::runtime::Builder::new_multi_thread()
                    .worker_threads(2)
                    .thread_name("stoker-s3")
                    .enable_all()
                    .build()
                    .map_err(|e| StoreSetupError::Runtime(Arc::new(e)))
            })
            .as_ref()
            .map_err(Clone::clone)
    }

    fn slots(&self) -> Arc<Slots> {
        self.slots
            .get_or_init(|| Arc::new(Slots::new(self.config().max_in_flight)))
            .clone()
    }

    /// The node cache (opened at first use).
    pub fn node_cache(&self) -> Result<Arc<NodeCache>, StoreSetupError> {
        self.cache
            .get_or_init(|| {
                let cfg = self.config();
                let dir = match &cfg.cache_dir {
                    Some(d) => d.clone(),
                    None => crate::source::index::default_cache_dir()
                        .ok_or(StoreSetupError::NoCacheFolder)?
                        .join("objects"),
                };
                let c = NodeCache::open(&dir, cfg.cache_max_bytes).map_err(|e| {
                    StoreSetupError::NodeCache {
                        dir: dir.clone(),
                        source: Arc::new(e),
                    }
                })?;
                tracing::info!(dir = %dir.display(), cap = cfg.cache_max_bytes, "node cache opened");
                Ok(Arc::new(c))
            })
            .clone()
    }

    /// The client for the bucket of `url` (shared by every dataset on the same connection).
    fn remote_for(&self, url: &S3Url) -> Result<Arc<Remote>, S3Error> {
        let cfg = self.config();
        let conn = self.connection_for(url);
        let mut remotes = self.remotes.lock().unwrap_or_else(|e| e.into_inner());
        let key = (conn, url.bucket.clone());
        if let Some(r) = remotes.get(&key) {
            return Ok(r.clone());
        }
        let r = Arc::new(Remote::new(&key.0, &url.bucket, &cfg)?);
        remotes.insert(key, r.clone());
        Ok(r)
    }

    /// The connection the dataset at `url` uses: its registered one, else `[s3.default]`.
    fn connection_for(&self, url: &S3Url) -> Connection {
        self.by_url
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .get(&url.as_string())
            .cloned()
            .unwrap_or_else(|| self.config().default)
    }

    /// Bytes of objects this store downloaded so far (what
    /// `stoker_s3_bytes_total{source="s3"}` counts, readable without a metrics recorder).
    pub fn bytes_downloaded(&self) -> u64 {
        self.downloaded.load(Ordering::Relaxed)
    }

    /// Runs `f` on the S3 runtime and waits for it (never call from inside the runtime).
    fn block_on<T>(&self, f: impl std::future::Future<Output = T>) -> Result<T, StoreSetupError> {
        Ok(self.runtime()?.block_on(f))
    }

    /// Remembers the objects of a dataset being opened, so its object table can be built;
    /// each counts a holder until the dataset that binds them goes (`storage`).
    fn remember(&self, remote: &Arc<Remote>, objects: &[ObjectInfo]) {
        let mut map = self.objects.write().unwrap_or_else(|e| e.into_inner());
        for o in objects {
            let object = ObjectRef {
                remote: remote.clone(),
                key: o.key.clone(),
                size: o.size,
                etag: o.etag.clone(),
            };
            let r = map.entry(remote.url(&o.key)).or_insert(Remembered {
                object: object.clone(),
                holders: 0,
            });
            r.object = object;
            r.holders += 1;
        }
    }

    /// What a request started in the background needs: the runtime, the request slots,
    /// the whole-request deadline and the downloaded-bytes counter (not the store: a task
    /// never holds the store whose runtime runs it).
    fn fetcher(&self) -> Result<Fetcher, StoreSetupError> {
        Ok(Fetcher {
            rt: self.runtime()?.handle().clone(),
            slots: self.slots(),
            deadline: Duration::from_millis(self.config().fetch_deadline_ms),
            downloaded: self.downloaded.clone(),
        })
    }

    /// Starts making every object in `objects` local, all downloads in flight at once, each
    /// pinned (see [`Pin`]) while the pins returned live; one claim each, waited for by
    /// [`ranged::wait`].
    fn start_all(&self, objects: &[ObjectRef], flow: &Flow) -> (Vec<Started>, Vec<Pin>) {
        let ready = self.node_cache().and_then(|c| Ok((c, self.fetcher()?)));
        let (cache, fetcher) = match ready {
            Ok(r) => r,
            Err(e) => {
                let failed = objects
                    .iter()
                    .map(|o| Started::Failed(S3Error::local(&o.remote.url(&o.key), e.to_string())))
                    .collect();
                return (failed, Vec::new());
            }
        };
        let pins = objects.iter().map(|o| cache.pin(&o.cache_name())).collect();
        let claims = objects
            .iter()
            .map(|o| {
                let c = fetcher.start(&cache, o, None, flow);
                // A download started here is a miss; one found local or already under way is
                // a hit: its bytes come from the server once, whoever asked first.
                let hit = matches!(c, Claim::Ready(_) | Claim::Wait(_));
                let result = if hit { "hit" } else { "miss" };
                metrics::counter!(metric::CACHE_REQUESTS_TOTAL, "result" => result).increment(1);
                if hit {
                    metrics::counter!(metric::BYTES_TOTAL, "source" => "cache").increment(o.size);
                }
                match c {
                    Claim::Ready(p) => Started::Ready(p),
                    Claim::Wait(p) | Claim::Fetch(p) => Started::Pending(p),
                }
            })
            .collect();
        (claims, pins)
    }

    /// Makes every object in `objects` local, all downloads in flight at once; one file
    /// each (waited for while it is written behind), every object pinned while the pins
    /// returned live.
    fn fetch_all(
        &self,
        objects: &[ObjectRef],
        flow: &Flow,
    ) -> (Vec<Result<PathBuf, S3Error>>, Vec<Pin>) {
        let (started, pins) = self.start_all(objects, flow);
        let files = (ranged::wait(started, None).into_iter().zip(objects))
            .map(|(got, o)| self.file_of(got?, &o.cache_name(), &o.remote.url(&o.key)))
            .collect();
        (files, pins)
    }

    /// The node-cache file holding `got` (the object stored as `name`, at `url`): its file,
    /// waited for while it is written behind.
    fn file_of(&self, got: Cached, name: &str, url: &str) -> Result<PathBuf, S3Error> {
        match got {
            Cached::File(path) => Ok(path),
            Cached::Memory(_) => (self.node_cache().ok())
                .and_then(|c| c.file(name))
                .ok_or_else(|| S3Error::local(url, "its node-cache file was not written".into())),
        }
    }
}

/// Starts downloads in the background, within the request limit of its store.
#[derive(Clone)]
struct Fetcher {
    rt: tokio::runtime::Handle,
    slots: Arc<Slots>,
    /// How long one fetch may take, every attempt together (`s3.fetch_deadline_ms`).
    deadline: Duration,
    downloaded: Arc<AtomicU64>,
}

impl Fetcher {
    /// Starts the download of `obj` unless it is local or under way already. `held`: the
    /// share and slot the caller took already (the prefetcher's); without them the download
    /// waits for one of the `max_in_flight` slots, as `flow`.
    fn start(
        &self,
        cache: &Arc<NodeCache>,
        obj: &ObjectRef,
        held: Option<Held>,
        flow: &Flow,
    ) -> Claim {
        let name = obj.cache_name();
        // The URL is written out only if a log line names it.
        let claim = cache.claim(
            &name,
            &format_args!("s3://{}/{}", obj.remote.bucket(), obj.key),
        );
        if let Claim::Fetch(p) = &claim {
            let (cache, obj, p) = (cache.clone(), obj.clone(), p.clone());
            let (fetcher, flow) = (self.clone(), flow.clone());
            self.rt.spawn(async move {
                let Some(_held) = fetcher.take_slot(held, &flow, &obj).await else {
                    // Never closed; should it be, the waiters still wake, with an error.
                    let url = obj.remote.url(&obj.key);
                    let err = S3Error::local(&url, "the request slots are closed".into());
                    let _ = cache.finish(&name, &p, Err(err), &url);
                    return;
                };
                download(&cache, &obj, &name, &p, &fetcher).await;
            });
        }
        claim
    }

    /// The slot a download of `obj` for `flow` runs under: `held` (the prefetcher's), else
    /// one waited for.
    async fn take_slot(&self, held: Option<Held>, flow: &Flow, obj: &ObjectRef) -> Option<Held> {
        match held {
            Some(h) => Some(h),
            None => Some(Held {
                _share: None,
                _slot: self.slots.acquire(flow, &obj.endpoint()).await?,
            }),
        }
    }
}

/// What a download holds while it runs: its request slot, and for the prefetcher's its
/// share of them.
#[derive(Debug)]
struct Held {
    _share: Option<OwnedSemaphorePermit>,
    _slot: Slot,
}

/// Runs `fetch` within the whole-request deadline: its attempts, retries and backoffs
/// together; past it the fetch fails with code `timeout`.
async fn within<T>(
    deadline: Duration,
    url: &str,
    fetch: impl std::future::Future<Output = Result<T, S3Error>>,
) -> Result<T, S3Error> {
    match tokio::time::timeout(deadline, fetch).await {
        Ok(r) => r,
        Err(_) => {
            metrics::counter!(metric::ERRORS_TOTAL, "code" => "timeout").increment(1);
            Err(S3Error::timeout(url, deadline))
        }
    }
}

/// Whether a fetch failed by stalling (no byte for `s3.stall_timeout_ms`) or by its deadline:
/// its endpoint then holds fewer slots for a while ([`Slots::stalled`]).
fn e_stalled<T>(got: &Result<T, S3Error>) -> bool {
    got.as_ref()
        .is_err_and(|e| e.code == "stalled" || e.code == "timeout")
}

/// Objects up to this size are received into memory, handed to readers from there and
/// written to the node cache behind them; larger ones (tar shards read whole) are received
/// into their file, so a download never holds more than this in memory.
const MEMORY_MAX_BYTES: u64 = 16 << 20;

/// How long a write that found the disk full, with nothing the cache could evict, waits before
/// it tries again: downloads still writing and batches still reading free the room soon.
const FULL_DISK_WAIT: Duration = Duration::from_millis(20);

/// Runs `write` (a download into the node cache) again for as long as it finds the disk full:
/// each time room is made by evicting what nobody pins, or, when every object is pinned by a
/// batch in flight or being written, after a short wait for them. The fetch's deadline
/// (`within`) bounds the whole. A sample is never lost to the cache's own disk use.
async fn until_room<T, F, Fut>(cache: &NodeCache, bytes: u64, mut write: F) -> Result<T, S3Error>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T, S3Error>>,
{
    loop {
        match write().await {
            Err(e) if e.is_disk_full() => {
                if cache.make_room(bytes) == 0 {
                    tokio::time::sleep(FULL_DISK_WAIT).await;
                }
            }
            got => return got,
        }
    }
}

/// Downloads `obj` (claimed as `name`, waited for on `p`): into memory, tagged as it arrives,
/// handed to its waiters from there, and its file written behind by the cache's writer; an
/// object over [`MEMORY_MAX_BYTES`] into a temporary file moved into place.
async fn download(cache: &Arc<NodeCache>, obj: &ObjectRef, name: &str, p: &Pending, f: &Fetcher) {
    metrics::gauge!(metric::IN_FLIGHT).increment(1.0);
    let url = obj.remote.url(&obj.key);
    let temp = (obj.size > MEMORY_MAX_BYTES).then(|| cache.temp_path(name));
    let fetch = until_room(cache, obj.size, || {
        let to = temp.as_deref();
        obj.remote
            .download(&obj.key, obj.expected(), cache.tags(), to)
    });
    let got = within(f.deadline, &url, fetch).await;
    metrics::gauge!(metric::IN_FLIGHT).decrement(1.0);
    if e_stalled(&got) {
        f.slots.stalled(&obj.endpoint());
    }
    let got = got.and_then(|r| {
        if r.size == obj.size {
            Ok(r)
        } else {
            Err(S3Error::local(
                &url,
                format!(
                    "got {} bytes, the listing said {} (changed since indexed?)",
                    r.size, obj.size
                ),
            ))
        }
    });
    if let (Err(_), Some(t)) = (&got, &temp) {
        let _ = std::fs::remove_file(t);
    }
    if let Ok(r) = &got {
        metrics::counter!(metric::BYTES_TOTAL, "source" => "s3").increment(r.size);
        f.downloaded.fetch_add(r.size, Ordering::Relaxed);
        tracing::debug!(url, bytes = r.size, "object fetched");
    }
    let behind = got
        .as_ref()
        .ok()
        .and_then(|r| Some((r.bytes.clone()?, r.tag)));
    let fetched = got.map(|r| match r.bytes {
        Some(bytes) => Fetched::Memory { bytes, tag: r.tag },
        None => Fetched::File {
            temp: (temp.as_deref()).expect("a download goes to a file only when given one"),
            size: r.size,
            tag: r.tag,
        },
    });
    let _ = cache.finish(name, p, fetched, &url);
    if let Some((bytes, tag)) = behind {
        write_behind(cache, name, bytes, tag);
    }
}

/// Writes the file of `name` (handed to its readers from memory) on the cache's writer
/// thread, off the request threads.
fn write_behind(cache: &Arc<NodeCache>, name: &str, bytes: bytes::Bytes, tag: integrity::Tag) {
    cache.queue_write(name, bytes, tag);
}

/// Writing and deleting objects: for tests, `pack` and users moving a dataset into a bucket.
impl ObjectStore {
    /// Uploads every file under `dir` to `url` (keys: the prefix, then the file's path
    /// relative to `dir`).
    pub fn upload_dir(&self, dir: &Path, url: &S3Url) -> Result<usize, S3Error> {
        let remote = self.remote_for(url)?;
        let mut files = Vec::new();
        walk(dir, &mut files)
            .map_err(|e| S3Error::local(&url.as_string(), format!("{}: {e}", dir.display())))?;
        let run = async {
            let mut tasks = Vec::new();
            for f in &files {
                let rel = f
                    .strip_prefix(dir)
                    .unwrap_or(f)
                    .to_string_lossy()
                    .into_owned();
                let key = join_key(&url.prefix, &rel);
                let data = std::fs::read(f).map_err(|e| {
                    S3Error::local(&remote.url(&key), format!("{}: {e}", f.display()))
                })?;
                let remote = remote.clone();
                tasks.push(tokio::spawn(async move { remote.put(&key, data).await }));
            }
            for t in tasks {
                t.await
                    .map_err(|e| S3Error::local(&url.as_string(), e.to_string()))??;
            }
            Ok(files.len())
        };
        self.block_on(run)
            .map_err(|e| S3Error::local(&url.as_string(), e.to_string()))?
    }

    /// Uploads `file` as the object at `url` (the prefix is the key).
    pub fn upload_file(&self, file: &Path, url: &S3Url) -> Result<(), S3Error> {
        let remote = self.remote_for(url)?;
        let data = std::fs::read(file)
            .map_err(|e| S3Error::local(&url.as_string(), format!("{}: {e}", file.display())))?;
        self.block_on(remote.put(&url.prefix, data))
            .map_err(|e| S3Error::local(&url.as_string(), e.to_string()))?
    }

    /// Deletes the object at `url` (the prefix is the key).
    pub fn delete(&self, url: &S3Url) -> Result<(), S3Error> {
        let remote = self.remote_for(url)?;
        self.block_on(remote.delete(&url.prefix))
            .map_err(|e| S3Error::local(&url.as_string(), e.to_string()))?
    }
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) -> std::io::Result<()> {
    let mut entries: Vec<_> = std::fs::read_dir(dir)?.collect::<Result<_, _>>()?;
    entries.sort_by_key(|e| e.file_name());
    for e in entries {
        if e.file_type()?.is_dir() {
            walk(&e.path(), out)?;
        } else {
            out.push(e.path());
        }
    }
    Ok(())
}
