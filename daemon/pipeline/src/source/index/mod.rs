//! Datasets: a named collection of samples, indexed once and cached on disk.
//!
//! [`Dataset::open`] (in the parent room, which routes URLs to object storage) and
//! [`Dataset::open_local`] detect the layout of a path (or takes it from [`OpenOptions::kind`]):
//! - **ImageFolder**: a folder with one subfolder per class (searched recursively); labels are
//!   the index of the class in the sorted class names.
//! - **Flat**: a folder of images with no subfolders of images; every label is -1.
//! - **FileList**: a text file of `path<TAB>label` lines; relative paths are resolved against
//!   the list's folder. Empty lines and lines starting with `#` are skipped.
//! - **TarShards**: one `.tar` file, or a folder of `*.tar` files, WebDataset-style: members
//!   `key.jpg` / `key.jpeg` and `key.cls` (an ASCII integer label). Samples are read from the
//!   shard by (offset, length); nothing is extracted.
//!
//! Samples are files whose extension is jpg, jpeg, jpe, jfif, mpo, png or webp (any case; the
//! decoder goes by the content, not the name); hidden entries
//! (names starting with `.`) are skipped. Order is deterministic: classes in sorted order,
//! files in byte order of their paths within a class, shards in sorted order and members in
//! shard order.
//!
//! # Design
//! - Storage is compact: one arena of path bytes for the files (one per image, or one per
//!   shard), and per sample a u32 file id, a u64 offset, a u64 length and an i64 label
//!   (28 bytes a sample, plus the path bytes).
//! - Indexing lists class folders, or reads shard headers, in parallel (std threads), then
//!   stats files in parallel chunks; a `tracing` info line reports progress every second.
//! - The index is cached under `$STOKER_CACHE_DIR`, else `$XDG_CACHE_HOME/stoker`, else
//!   `~/.cache/stoker`, in a file named after a hash of the canonical path and the kind. The
//!   cache records the mtime of every folder walked (entries added or removed change it) and
//!   the mtime and size of file lists and shards, with the (device, inode) of each (a file
//!   replaced by rename is another file); any difference re-indexes.
//! - Folder walks are bounded and loop-proof (see [`walk`]): folders met twice are skipped,
//!   entries and depth are capped by [`WalkLimits`], `/` is refused. A cache whose
//!   recorded times are within [`RACY_WINDOW_NS`] of the time it was written is not trusted
//!   (a change in the same timestamp tick would go unseen). A corrupt or stale cache is
//!   ignored and rewritten; failure to write it is a warning.
//!
//! # Limitations
//! - A file rewritten in place with a different size, in a folder dataset, is not noticed by
//!   the cache (folder mtimes do not change); the reader reports "file shorter than indexed",
//!   or the decoder sees a truncated image. Files named by a file list are likewise not
//!   re-checked.
//! - Tar shards must be uncompressed.

mod cache;
mod error;
pub mod fields;
mod file_list;
mod folder;
mod tar;

use cache::*;
pub use fields::{FieldRef, SampleFields};
use file_list::*;
use folder::*;
use tar::*;

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufReader, Read};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A change within this many nanoseconds of the cache's writing might be invisible in mtimes.
pub const RACY_WINDOW_NS: i128 = 100_000_000;

/// File extensions (lowercase) taken as images in folder layouts.
pub const IMAGE_EXTENSIONS: &[&str] = &[
    "jpg", "jpeg", "jpe", "jfif", "mpo", "png", "webp", "bmp", "tif", "tiff", "ppm", "pgm",
];

const CACHE_MAGIC: &[u8; 8] = b"STKINDEX";

mod skipped;
mod walk;
pub use error::DatasetError;
pub use skipped::{Skipped, METADATA_EXTENSIONS, SKIPPED_NAMED, SKIP_REASON};
pub use walk::WalkLimits;
use walk::{Walk, WalkBudget};
/// 2: stamps carry (device, inode), so a file replaced by rename is seen as changed.
/// 3: PNG and WebP files are samples (a folder indexed before held none).
/// 4: the files a folder walk skipped (count and first names).
/// 5: tar samples' fields (their other members, see [`fields`]).
/// 6: folders' sidecar files as fields.
/// 7: BMP, TIFF, PPM and PGM files are samples (issue 43; a folder indexed before skipped them).
const CACHE_VERSION: u32 = 7;

/// The layout of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetKind {
    /// A folder with one subfolder per class; labels are class indices.
    ImageFolder,
    /// A folder of images without class subfolders; every label is -1.
    Flat,
    /// A text file of `path<TAB>label` lines.
    FileList,
    /// One `.tar` file, or a folder of them, in the WebDataset layout.
    TarShards,
}

impl DatasetKind {
    /// The name in logs, status and the `kind` option (`image_folder`, `tar_shards`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            DatasetKind::ImageFolder => "image_folder",
            DatasetKind::Flat => "flat",
            DatasetKind::FileList => "file_list",
            DatasetKind::TarShards => "tar_shards",
        }
    }

    fn code(self) -> u8 {
        match self {
            DatasetKind::ImageFolder => 1,
            DatasetKind::Flat => 2,
            DatasetKind::FileList => 3,
            DatasetKind::TarShards => 4,
        }
    }

    fn from_code(c: u8) -> Option<DatasetKind> {
        Some(match c {
            1 => DatasetKind::ImageFolder,
            2 => DatasetKind::Flat,
            3 => DatasetKind::FileList,
            4 => DatasetKind::TarShards,
            _ => return None,
        })
    }
}

impl std::str::FromStr for DatasetKind {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s {
            "image_folder" | "imagefolder" => DatasetKind::ImageFolder,
            "flat" => DatasetKind::Flat,
            "file_list" | "filelist" => DatasetKind::FileList,
            "tar_shards" | "tar" | "webdataset" => DatasetKind::TarShards,
            _ => return Err(format!("unknown dataset kind {s:?}")),
        })
    }
}

/// How to open a dataset.
#[derive(Debug, Clone)]
pub struct OpenOptions {
    /// The layout; `None` detects it from the path.
    pub kind: Option<DatasetKind>,
    /// Whether to load and save the on-disk index cache.
    pub use_cache: bool,
    /// Where the cache lives; `None` uses the environment (see the module docs).
    pub cache_dir: Option<PathBuf>,
    /// Indexing threads; 0 means the number of cores.
    pub threads: usize,
    /// How far a folder walk may go (see [`walk`]).
    pub limits: WalkLimits,
    /// Whether a file list may name `s3://` URLs (read with the daemon's credentials: the
    /// daemon refuses them to clients that could not name those URLs directly).
    pub s3_entries: bool,
    /// The object storage `s3://` paths and entries are read from (the opened dataset holds
    /// it); `None` refuses them.
    pub objects: Option<std::sync::Arc<dyn ObjectStorage>>,
    /// Who asked for the open (a client's connection): an `s3://` listing stops once it has
    /// gone. `None`: nobody leaves (a tool).
    pub asker: Option<Asker>,
    /// The user whose job opens it (`None`: the daemon itself, a tool): an `s3://` dataset's
    /// downloads share the request slots fairly by user and dataset.
    pub owner: Option<u32>,
}

/// Whether whoever asked for an open is still there to receive it: the daemon gives one that
/// looks at the client's connection, so that a listing whose client has gone stops.
#[derive(Clone)]
pub struct Asker(std::sync::Arc<dyn Fn() -> bool + Send + Sync>);

impl Asker {
    /// An asker that has gone once `gone` says so.
    pub fn new(gone: impl Fn() -> bool + Send + Sync + 'static) -> Asker {
        Asker(std::sync::Arc::new(gone))
    }

    /// Whether the asker has gone (the open may stop).
    pub fn gone(&self) -> bool {
        (self.0)()
    }
}

impl std::fmt::Debug for Asker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Asker").field("gone", &self.gone()).finish()
    }
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            kind: None,
            use_cache: true,
            cache_dir: None,
            threads: 0,
            limits: WalkLimits::default(),
            s3_entries: true,
            objects: None,
            asker: None,
            owner: None,
        }
    }
}

/// Where the index came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum IndexOrigin {
    /// Loaded from the on-disk cache.
    Cache,
    /// Built by walking the dataset.
    Walked,
}

/// One sample: where its bytes are, and its label (-1 when the layout has none).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SampleRef<'a> {
    /// The local file, or the object's URL (its name in messages, never how it is found).
    pub path: &'a Path,
    /// The file (image or shard) holding the sample, by its id in the dataset.
    pub file: u32,
    /// Where that file is: local, or an object in the dataset's object storage.
    pub storage: Storage,
    /// Byte offset of the encoded image in that file (0 for a file of its own).
    pub offset: u64,
    /// Length of the encoded image in bytes.
    pub len: u64,
    /// The sample's label (-1 where the layout has none).
    pub label: i64,
}

/// Many paths in one allocation.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
struct PathArena {
    bytes: Vec<u8>,
    ends: Vec<u64>,
}

impl PathArena {
    fn push(&mut self, p: &[u8]) {
        self.bytes.extend_from_slice(p);
        self.ends.push(self.bytes.len() as u64);
    }

    // `ends` are lengths of `bytes`, a Vec: they fit a usize.
    #[allow(clippy::cast_possible_truncation)]
    fn get(&self, i: usize) -> &[u8] {
        let start = if i == 0 { 0 } else { self.ends[i - 1] as usize };
        &self.bytes[start..self.ends[i] as usize]
    }

    fn len(&self) -> usize {
        self.ends.len()
    }
}

/// What the cache checks to decide whether a dataset changed: a path's mtime and size, and
/// which file it is (device, inode: a file replaced by rename is another file).
#[derive(Debug, Clone, PartialEq, Eq)]
struct Stamp {
    path: PathBuf,
    mtime_ns: i128,
    size: u64,
    dev: u64,
    ino: u64,
}

impl Stamp {
    fn of(path: &Path) -> io::Result<Stamp> {
        let m = fs::metadata(path)?;
        Ok(Stamp {
            path: path.to_owned(),
            mtime_ns: i128::from(m.mtime()) * 1_000_000_000 + i128::from(m.mtime_nsec()),
            // A folder's size says nothing useful; its mtime does.
            size: if m.is_dir() { 0 } else { m.size() },
            dev: m.dev(),
            ino: m.ino(),
        })
    }

    fn same_file(&self, other: &Stamp) -> bool {
        (self.mtime_ns, self.size, self.dev, self.ino)
            == (other.mtime_ns, other.size, other.dev, other.ino)
    }
}

/// An indexed dataset.
#[derive(Debug, Clone)]
pub struct Dataset {
    root: PathBuf,
    kind: DatasetKind,
    classes: Vec<String>,
    /// One path per image (folders, file lists) or per shard (tar).
    files: PathArena,
    /// Member names, tar shards only (for messages).
    members: PathArena,
    /// The samples' other members, tar shards only (see [`fields`]).
    fields: SampleFields,
    file_id: Vec<u32>,
    offset: Vec<u64>,
    len: Vec<u64>,
    label: Vec<i64>,
    stamps: Vec<Stamp>,
    /// Files a folder walk left out (see [`Skipped`]).
    skipped: Skipped,
    origin: IndexOrigin,
    /// Per file id, whether the file is an object (empty: all local; see [`storage`]).
    object_files: Vec<bool>,
    /// The objects of this dataset and the store they are read from (see [`storage`]).
    objects: Option<std::sync::Arc<dyn DatasetObjects>>,
}

impl Dataset {
    /// Bytes the index holds in memory: its per-sample arrays and path arenas (what a worker
    /// counts against the peer that had it opened).
    pub fn index_bytes(&self) -> u64 {
        let arena = |a: &PathArena| a.bytes.capacity() + a.ends.capacity() * 8;
        let samples = self.file_id.capacity() * 4
            + (self.offset.capacity() + self.len.capacity()) * 8
            + self.label.capacity() * 8
            + self.stamps.capacity() * std::mem::size_of::<Stamp>();
        let classes: usize = self.classes.iter().map(|c| c.capacity() + 24).sum();
        (arena(&self.files) + arena(&self.members) + samples + classes) as u64
    }

    /// Opens the local dataset at `path`: from the cache when it is unchanged, else by
    /// indexing it; a file list's `s3://` entries are HEADed in [`OpenOptions::objects`],
    /// which the dataset then holds.
    pub fn open_local(path: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        let root = fs::canonicalize(path).map_err(|e| DatasetError::io(path, e))?;
        walk::refuse_root(&root)?;
        let kind = match opts.kind {
            Some(k) => k,
            None => detect_kind(&root)?,
        };
        let cache_file = if opts.use_cache {
            private_cache_dir(opts).map(|d| d.join(cache_file_name(&root, kind)))
        } else {
            None
        };
        if let Some(cf) = &cache_file {
            if let Some(ds) = load_cache(cf, &root, kind) {
                tracing::info!(
                    dataset = %root.display(), samples = ds.len(), cache = %cf.display(),
                    "dataset index loaded from cache"
                );
                ds.log_skipped();
                return Ok(ds);
            }
        }
        let started = Instant::now();
        let threads = if opts.threads == 0 {
            std::thread::available_parallelism().map_or(2, |n| n.get())
        } else {
            opts.threads
        };
        let written_at = now_ns();
        let ds = match kind {
            DatasetKind::ImageFolder | DatasetKind::Flat => {
                index_folder(&root, kind, threads, &WalkBudget::new(opts.limits))?
            }
            DatasetKind::FileList => index_file_list(&root, threads, opts)?,
            DatasetKind::TarShards => index_tar_shards(&root, threads)?,
        };
        if ds.is_empty() {
            return Err(DatasetError::Empty {
                path: root,
                reason: format!("no images found as {}", kind.as_str()),
            });
        }
        tracing::info!(
            dataset = %root.display(), kind = kind.as_str(), samples = ds.len(),
            seconds = started.elapsed().as_secs_f64(), "dataset indexed"
        );
        ds.log_skipped();
        // A list's s3:// entries are known to the reader only once HEADed: not cached.
        let cache_file = cache_file.filter(|_| ds.objects.is_none());
        if let Some(cf) = &cache_file {
            if let Err(e) = save_cache(cf, &ds, written_at) {
                tracing::warn!(cache = %cf.display(), error = %e, "cannot write dataset index cache");
            }
        }
        Ok(ds)
    }

    /// Samples in the dataset.
    pub fn len(&self) -> usize {
        self.label.len()
    }

    /// Files the folder walk left out: how many, and the first few.
    pub fn skipped(&self) -> &Skipped {
        &self.skipped
    }

    fn log_skipped(&self) {
        if let Some(summary) = self.skipped.summary() {
            tracing::warn!(dataset = %self.root.display(), "{summary}");
        }
    }

    /// Whether it has no sample.
    pub fn is_empty(&self) -> bool {
        self.label.is_empty()
    }

    /// Sample `i`. Panics if `i >= len()`.
    pub fn sample(&self, i: usize) -> SampleRef<'_> {
        let file = self.file_id[i];
        SampleRef {
            path: Path::new(OsStr::from_bytes(self.files.get(file as usize))),
            file,
            storage: self.storage_of(file),
            offset: self.offset[i],
            len: self.len[i],
            label: self.label[i],
        }
    }

    /// Field `name` (a lowercase extension, see [`fields`]) of sample `i`: where it lies in the
    /// sample's file, which [`Self::sample`] names. `None` when the sample has no such field.
    pub fn field(&self, i: usize, name: &str) -> Option<FieldRef> {
        self.fields.get(i, name.as_bytes())
    }

    /// Where field `r` of sample `i` is read: the sample's own file (a shard) or the field's
    /// sidecar file, at the field's offset and length.
    pub fn field_source(&self, i: usize, r: FieldRef) -> SampleRef<'_> {
        let own = self.sample(i);
        let file = r.file.unwrap_or(own.file);
        SampleRef {
            path: Path::new(OsStr::from_bytes(self.files.get(file as usize))),
            file,
            storage: self.storage_of(file),
            offset: r.offset,
            len: r.len,
            label: own.label,
        }
    }

    /// The names of the fields the dataset's samples have, sorted.
    pub fn field_names(&self) -> Vec<String> {
        self.fields.names()
    }

    /// Class names (ImageFolder); empty for other layouts.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

    /// Its layout.
    pub fn kind(&self) -> DatasetKind {
        self.kind
    }

    /// The canonical path the dataset was opened from.
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// Whether this index came from the cache or a walk.
    pub fn origin(&self) -> IndexOrigin {
        self.origin
    }

    /// For tar shards: the identity each shard had when indexed, which the reader checks at
    /// every open (a shard replaced by rename is not read at the old one's offsets). Empty
    /// for other layouts.
    pub fn file_identities(&self) -> HashMap<PathBuf, crate::source::local::fsopen::FileIdentity> {
        if self.kind != DatasetKind::TarShards {
            return HashMap::new();
        }
        self.stamps
            .iter()
            .filter(|s| is_tar_name(s.path.as_os_str()))
            .map(|s| {
                let id = crate::source::local::fsopen::FileIdentity {
                    dev: s.dev,
                    ino: s.ino,
                    size: s.size,
                    mtime_ns: s.mtime_ns,
                };
                (s.path.clone(), id)
            })
            .collect()
    }

    /// The folders and files the index was made from (folders walked, file lists, shards).
    pub fn indexed_paths(&self) -> impl Iterator<Item = &Path> {
        self.stamps.iter().map(|s| s.path.as_path())
    }

    /// Sample `i` for messages: its path, or `shard.tar:member` for tar shards.
    pub fn display_name(&self, i: usize) -> String {
        let s = self.sample(i);
        if self.kind == DatasetKind::TarShards {
            format!(
                "{}:{}",
                s.path.display(),
                String::from_utf8_lossy(self.members.get(i))
            )
        } else {
            s.path.display().to_string()
        }
    }

    fn empty(root: &Path, kind: DatasetKind) -> Dataset {
        Dataset {
            root: root.to_owned(),
            kind,
            classes: Vec::new(),
            files: PathArena::default(),
            members: PathArena::default(),
            fields: SampleFields::default(),
            file_id: Vec::new(),
            offset: Vec::new(),
            len: Vec::new(),
            label: Vec::new(),
            stamps: Vec::new(),
            skipped: Skipped::default(),
            origin: IndexOrigin::Walked,
            object_files: Vec::new(),
            objects: None,
        }
    }

    fn push_file(&mut self, path: &[u8]) -> Result<u32, DatasetError> {
        let id = u32::try_from(self.files.len()).map_err(|_| DatasetError::TooManyFiles {
            path: self.root.clone(),
        })?;
        self.files.push(path);
        Ok(id)
    }

    fn push_sample(&mut self, file_id: u32, offset: u64, len: u64, label: i64) {
        self.file_id.push(file_id);
        self.offset.push(offset);
        self.len.push(len);
        self.label.push(label);
    }
}

fn now_ns() -> i128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| i128::try_from(d.as_nanos()).unwrap_or(i128::MAX))
}

fn is_hidden(name: &OsStr) -> bool {
    name.as_bytes().first() == Some(&b'.')
}

fn has_ext(name: &[u8], exts: &[&str]) -> bool {
    match name.iter().rposition(|&b| b == b'.') {
        Some(dot) => {
            let ext = &name[dot + 1..];
            exts.iter().any(|e| ext.eq_ignore_ascii_case(e.as_bytes()))
        }
        None => false,
    }
}

fn is_image_name(name: &OsStr) -> bool {
    has_ext(name.as_bytes(), IMAGE_EXTENSIONS)
}

fn is_tar_name(name: &OsStr) -> bool {
    has_ext(name.as_bytes(), &["tar"])
}

/// Whether a directory entry is a directory (following symlinks).
fn entry_is_dir(e: &fs::DirEntry) -> bool {
    match e.file_type() {
        Ok(t) if t.is_symlink() => fs::metadata(e.path()).is_ok_and(|m| m.is_dir()),
        Ok(t) => t.is_dir(),
        Err(_) => false,
    }
}

fn read_dir_sorted(dir: &Path) -> Result<Vec<fs::DirEntry>, DatasetError> {
    let unreadable = |source| DatasetError::UnreadableDir {
        path: dir.to_owned(),
        source,
    };
    let mut entries = fs::read_dir(dir)
        .map_err(unreadable)?
        .collect::<Result<Vec<_>, _>>()
        .map_err(unreadable)?;
    entries.retain(|e| !is_hidden(&e.file_name()));
    entries.sort_by_key(|e| e.file_name());
    Ok(entries)
}

/// Opens a file list or a shard without blocking (a FIFO swapped in is refused, not waited
/// on), regular files only.
fn open_regular(path: &Path) -> Result<File, DatasetError> {
    use crate::source::local::fsopen::{open_sample, OpenError, OpenPolicy};
    open_sample(path, &OpenPolicy::default(), None).map_err(|e| match e {
        OpenError::Io(e) => DatasetError::io(path, e),
        e => DatasetError::WrongKind {
            path: path.to_owned(),
            reason: e.to_string(),
        },
    })
}

/// Detects the layout of `root` (canonical).
fn detect_kind(root: &Path) -> Result<DatasetKind, DatasetError> {
    let meta = fs::metadata(root).map_err(|e| DatasetError::io(root, e))?;
    if meta.is_file() {
        return Ok(if is_tar_name(root.as_os_str()) {
            DatasetKind::TarShards
        } else {
            DatasetKind::FileList
        });
    }
    let entries = read_dir_sorted(root)?;
    let (mut images, mut tars, mut dirs) = (0, 0, 0);
    for e in &entries {
        let name = e.file_name();
        if entry_is_dir(e) {
            dirs += 1;
        } else if is_image_name(&name) {
            images += 1;
        } else if is_tar_name(&name) {
            tars += 1;
        }
    }
    if images > 0 {
        Ok(DatasetKind::Flat)
    } else if tars > 0 {
        Ok(DatasetKind::TarShards)
    } else if dirs > 0 {
        Ok(DatasetKind::ImageFolder)
    } else {
        Err(DatasetError::Empty {
            path: root.to_owned(),
            reason: "no images, class folders or .tar shards in it".into(),
        })
    }
}

/// Counts indexed files and logs progress once a second while workers run.
fn wait_with_progress<T>(
    root: &Path,
    what: &str,
    done: &AtomicU64,
    handles: Vec<std::thread::ScopedJoinHandle<'_, T>>,
) -> Vec<T> {
    let started = Instant::now();
    let mut last = Instant::now();
    let mut nap = Duration::from_micros(250);
    while !handles.iter().all(|h| h.is_finished()) {
        // Short naps first so small datasets open fast, up to 50 ms for long walks.
        std::thread::sleep(nap);
        nap = (nap * 2).min(Duration::from_millis(50));
        if last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            let n = done.load(Ordering::Relaxed);
            tracing::info!(
                dataset = %root.display(), files = n,
                rate = n as f64 / started.elapsed().as_secs_f64(), "indexing: {what}"
            );
        }
    }
    handles
        .into_iter()
        .map(|h| match h.join() {
            Ok(v) => v,
            Err(p) => std::panic::resume_unwind(p),
        })
        .collect()
}

mod remote;
mod storage;
pub use remote::{default_cache_dir, IndexedSample};
pub(crate) use remote::{load_remote_index, save_remote_index};
pub use storage::{DatasetObjects, HeadError, ObjectStorage, RemoteFile, Staged, Storage};

#[cfg(test)]
mod tests;
