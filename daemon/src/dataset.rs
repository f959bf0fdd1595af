//! Datasets: a named collection of samples, indexed once and cached on disk.
//!
//! [`Dataset::open`] detects the layout of a path (or takes it from [`OpenOptions::kind`]):
//! - **ImageFolder**: a folder with one subfolder per class (searched recursively); labels are
//!   the index of the class in the sorted class names.
//! - **Flat**: a folder of images with no subfolders of images; every label is -1.
//! - **FileList**: a text file of `path<TAB>label` lines; relative paths are resolved against
//!   the list's folder. Empty lines and lines starting with `#` are skipped.
//! - **TarShards**: one `.tar` file, or a folder of `*.tar` files, WebDataset-style: members
//!   `key.jpg` / `key.jpeg` and `key.cls` (an ASCII integer label). Samples are read from the
//!   shard by (offset, length); nothing is extracted.
//!
//! Samples are files whose extension is jpg, jpeg, jpe or jfif (any case); hidden entries
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

use std::collections::HashMap;
use std::ffi::OsStr;
use std::fs::{self, File};
use std::io::{self, BufReader, Read, Write};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

/// A change within this many nanoseconds of the cache's writing might be invisible in mtimes.
pub const RACY_WINDOW_NS: i128 = 100_000_000;

/// File extensions (lowercase) taken as images in folder layouts.
pub const IMAGE_EXTENSIONS: &[&str] = &["jpg", "jpeg", "jpe", "jfif", "mpo"];

const CACHE_MAGIC: &[u8; 8] = b"STKINDEX";

mod walk;
pub use walk::WalkLimits;
use walk::{Walk, WalkBudget};
/// 2: stamps carry (device, inode), so a file replaced by rename is seen as changed.
const CACHE_VERSION: u32 = 2;

/// Why a dataset cannot be opened. Each variant names the path and the reason.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    #[error("dataset {path}: not found")]
    NotFound { path: PathBuf },
    #[error("dataset {path}: no samples ({reason})")]
    Empty { path: PathBuf, reason: String },
    #[error("file list {path}, line {line}: {reason}")]
    BadListLine {
        path: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("tar shard {path}, at byte {offset}: {reason}")]
    BadTar {
        path: PathBuf,
        offset: u64,
        reason: String,
    },
    #[error("cannot read directory {path}: {source}")]
    UnreadableDir { path: PathBuf, source: io::Error },
    #[error("cannot read {path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("dataset {path}: {reason}")]
    WrongKind { path: PathBuf, reason: String },
    #[error("dataset {path}: more than {max} files", max = u32::MAX)]
    TooManyFiles { path: PathBuf },
    #[error("dataset indexing stopped at {path}: {reason}")]
    WalkLimit { path: PathBuf, reason: String },
    #[error("dataset {path}: S3 error {code}: {reason}")]
    Remote {
        path: PathBuf,
        code: String,
        reason: String,
    },
}

impl DatasetError {
    fn io(path: &Path, source: io::Error) -> DatasetError {
        if source.kind() == io::ErrorKind::NotFound {
            DatasetError::NotFound {
                path: path.to_owned(),
            }
        } else {
            DatasetError::Io {
                path: path.to_owned(),
                source,
            }
        }
    }
}

/// The layout of a dataset.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum DatasetKind {
    ImageFolder,
    Flat,
    FileList,
    TarShards,
}

impl DatasetKind {
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
}

impl Default for OpenOptions {
    fn default() -> Self {
        OpenOptions {
            kind: None,
            use_cache: true,
            cache_dir: None,
            threads: 0,
            limits: WalkLimits::default(),
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
    pub path: &'a Path,
    pub offset: u64,
    pub len: u64,
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
    file_id: Vec<u32>,
    offset: Vec<u64>,
    len: Vec<u64>,
    label: Vec<i64>,
    stamps: Vec<Stamp>,
    origin: IndexOrigin,
}

impl Dataset {
    /// Opens the dataset at `path`: from the cache when it is unchanged, else by indexing it.
    pub fn open(path: &Path, opts: &OpenOptions) -> Result<Dataset, DatasetError> {
        if crate::s3::is_url(path) {
            return crate::s3::open_dataset(path, opts);
        }
        let root = fs::canonicalize(path).map_err(|e| DatasetError::io(path, e))?;
        walk::refuse_root(&root)?;
        let kind = match opts.kind {
            Some(k) => k,
            None => detect_kind(&root)?,
        };
        let cache_file = if opts.use_cache {
            cache_dir(opts).map(|d| d.join(cache_file_name(&root, kind)))
        } else {
            None
        };
        if let Some(cf) = &cache_file {
            if let Some(ds) = load_cache(cf, &root, kind) {
                tracing::info!(
                    dataset = %root.display(), samples = ds.len(), cache = %cf.display(),
                    "dataset index loaded from cache"
                );
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
            DatasetKind::FileList => index_file_list(&root, threads)?,
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
        if let Some(cf) = &cache_file {
            if let Err(e) = save_cache(cf, &ds, written_at) {
                tracing::warn!(cache = %cf.display(), error = %e, "cannot write dataset index cache");
            }
        }
        Ok(ds)
    }

    pub fn len(&self) -> usize {
        self.label.len()
    }

    pub fn is_empty(&self) -> bool {
        self.label.is_empty()
    }

    /// Sample `i`. Panics if `i >= len()`.
    pub fn sample(&self, i: usize) -> SampleRef<'_> {
        SampleRef {
            path: Path::new(OsStr::from_bytes(self.files.get(self.file_id[i] as usize))),
            offset: self.offset[i],
            len: self.len[i],
            label: self.label[i],
        }
    }

    /// Class names (ImageFolder); empty for other layouts.
    pub fn classes(&self) -> &[String] {
        &self.classes
    }

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
    pub fn file_identities(&self) -> HashMap<PathBuf, crate::fsopen::FileIdentity> {
        if self.kind != DatasetKind::TarShards {
            return HashMap::new();
        }
        self.stamps
            .iter()
            .filter(|s| is_tar_name(s.path.as_os_str()))
            .map(|s| {
                let id = crate::fsopen::FileIdentity {
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
            file_id: Vec::new(),
            offset: Vec::new(),
            len: Vec::new(),
            label: Vec::new(),
            stamps: Vec::new(),
            origin: IndexOrigin::Walked,
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
        .map_or(0, |d| d.as_nanos() as i128)
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
    use crate::fsopen::{open_sample, OpenError, OpenPolicy};
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

/// Sizes of `paths`, statted in parallel chunks.
fn stat_sizes(
    root: &Path,
    paths: &[PathBuf],
    threads: usize,
) -> Vec<Result<u64, (PathBuf, io::Error)>> {
    let done = AtomicU64::new(0);
    let chunk = paths.len().div_ceil(threads.max(1)).max(1);
    std::thread::scope(|s| {
        let handles = paths
            .chunks(chunk)
            .map(|c| {
                let done = &done;
                s.spawn(move || {
                    c.iter()
                        .map(|p| {
                            let r = fs::metadata(p).map(|m| m.len()).map_err(|e| (p.clone(), e));
                            done.fetch_add(1, Ordering::Relaxed);
                            r
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        wait_with_progress(root, "stat", &done, handles)
            .into_iter()
            .flatten()
            .collect()
    })
}

fn index_folder(
    root: &Path,
    kind: DatasetKind,
    threads: usize,
    budget: &WalkBudget,
) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(root, kind);
    let done = AtomicU64::new(0);
    // (class label, folder, recurse)
    let mut work: Vec<(i64, PathBuf, bool)> = Vec::new();
    if kind == DatasetKind::ImageFolder {
        for e in read_dir_sorted(root)? {
            if entry_is_dir(&e) {
                let label = ds.classes.len() as i64;
                ds.classes
                    .push(e.file_name().to_string_lossy().into_owned());
                work.push((label, e.path(), true));
            }
        }
        ds.stamps
            .push(Stamp::of(root).map_err(|e| DatasetError::io(root, e))?);
    } else {
        work.push((-1, root.to_owned(), false));
    }
    let next = AtomicUsize::new(0);
    type Listed = Vec<(usize, Vec<PathBuf>, Vec<Stamp>)>;
    let per_worker: Vec<Result<Listed, DatasetError>> = std::thread::scope(|s| {
        let handles = (0..threads.min(work.len()).max(1))
            .map(|_| {
                let (next, work, done) = (&next, &work, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let w = next.fetch_add(1, Ordering::Relaxed);
                        let Some((_, dir, recurse)) = work.get(w) else {
                            return Ok(mine);
                        };
                        let (mut files, mut stamps) = (Vec::new(), Vec::new());
                        let depth = u32::from(*recurse);
                        Walk::new(budget, root).list_images(
                            dir,
                            *recurse,
                            depth,
                            &mut files,
                            &mut stamps,
                            done,
                        )?;
                        files.sort_unstable_by(|a, b| {
                            a.as_os_str().as_bytes().cmp(b.as_os_str().as_bytes())
                        });
                        mine.push((w, files, stamps));
                    }
                })
            })
            .collect();
        wait_with_progress(root, "listing", &done, handles)
    });
    let mut listed: Vec<(usize, Vec<PathBuf>, Vec<Stamp>)> = Vec::with_capacity(work.len());
    for r in per_worker {
        listed.extend(r?);
    }
    listed.sort_unstable_by_key(|(w, _, _)| *w);
    let mut all = Vec::new();
    let mut labels = Vec::new();
    for (w, files, stamps) in listed {
        if files.is_empty() && kind == DatasetKind::ImageFolder {
            tracing::warn!(class = %ds.classes[w], dataset = %root.display(), "class folder has no images");
        }
        labels.resize(labels.len() + files.len(), work[w].0);
        all.extend(files);
        ds.stamps.extend(stamps);
    }
    for (i, size) in stat_sizes(root, &all, threads).into_iter().enumerate() {
        let size = size.map_err(|(p, e)| DatasetError::io(&p, e))?;
        let id = ds.push_file(all[i].as_os_str().as_bytes())?;
        ds.push_sample(id, 0, size, labels[i]);
    }
    Ok(ds)
}

fn index_file_list(list: &Path, threads: usize) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(list, DatasetKind::FileList);
    if !fs::metadata(list)
        .map_err(|e| DatasetError::io(list, e))?
        .is_file()
    {
        return Err(DatasetError::WrongKind {
            path: list.to_owned(),
            reason: "a file list must be a text file".into(),
        });
    }
    ds.stamps
        .push(Stamp::of(list).map_err(|e| DatasetError::io(list, e))?);
    let mut text = Vec::new();
    open_regular(list)?
        .read_to_end(&mut text)
        .map_err(|e| DatasetError::io(list, e))?;
    let base = list.parent().unwrap_or(Path::new("/"));
    let mut paths = Vec::new();
    let mut labels = Vec::new();
    let mut lines = Vec::new();
    for (n, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line_no = n + 1;
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        if line.iter().all(u8::is_ascii_whitespace) || line.first() == Some(&b'#') {
            continue;
        }
        let bad = |reason: String| DatasetError::BadListLine {
            path: list.to_owned(),
            line: line_no,
            reason,
        };
        let Some(tab) = line.iter().rposition(|&b| b == b'\t') else {
            return Err(bad("expected `path<TAB>label`, found no tab".into()));
        };
        let (p, l) = (&line[..tab], &line[tab + 1..]);
        if p.is_empty() {
            return Err(bad("empty path".into()));
        }
        let label: i64 = std::str::from_utf8(l)
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .ok_or_else(|| {
                bad(format!(
                    "label {:?} is not an integer",
                    String::from_utf8_lossy(l)
                ))
            })?;
        let p = Path::new(OsStr::from_bytes(p));
        paths.push(if p.is_absolute() {
            p.to_owned()
        } else {
            base.join(p)
        });
        labels.push(label);
        lines.push(line_no);
    }
    for (i, size) in stat_sizes(list, &paths, threads).into_iter().enumerate() {
        let size = size.map_err(|(p, e)| DatasetError::BadListLine {
            path: list.to_owned(),
            line: lines[i],
            reason: format!("cannot stat {}: {e}", p.display()),
        })?;
        let id = ds.push_file(paths[i].as_os_str().as_bytes())?;
        ds.push_sample(id, 0, size, labels[i]);
    }
    Ok(ds)
}

fn index_tar_shards(root: &Path, threads: usize) -> Result<Dataset, DatasetError> {
    let mut ds = Dataset::empty(root, DatasetKind::TarShards);
    let meta = fs::metadata(root).map_err(|e| DatasetError::io(root, e))?;
    let shards: Vec<PathBuf> = if meta.is_dir() {
        ds.stamps
            .push(Stamp::of(root).map_err(|e| DatasetError::io(root, e))?);
        read_dir_sorted(root)?
            .into_iter()
            .filter(|e| is_tar_name(&e.file_name()) && !entry_is_dir(e))
            .map(|e| e.path())
            .collect()
    } else {
        vec![root.to_owned()]
    };
    // Shard headers are read in parallel, one shard per task, in any order.
    let next = AtomicUsize::new(0);
    let done = AtomicU64::new(0);
    type Indexed = Vec<(usize, Result<(Stamp, Vec<TarMember>), DatasetError>)>;
    let per_worker: Vec<Indexed> = std::thread::scope(|s| {
        let handles = (0..threads.min(shards.len()).max(1))
            .map(|_| {
                let (next, shards, done) = (&next, &shards, &done);
                s.spawn(move || {
                    let mut mine = Vec::new();
                    loop {
                        let i = next.fetch_add(1, Ordering::Relaxed);
                        let Some(shard) = shards.get(i) else {
                            return mine;
                        };
                        let stamp = Stamp::of(shard).map_err(|e| DatasetError::io(shard, e));
                        mine.push((
                            i,
                            stamp.and_then(|st| Ok((st, read_tar_index(shard, done)?))),
                        ));
                    }
                })
            })
            .collect();
        wait_with_progress(root, "tar headers", &done, handles)
    });
    let mut indexed: Indexed = per_worker.into_iter().flatten().collect();
    indexed.sort_unstable_by_key(|(i, _)| *i);
    for (i, r) in indexed {
        let shard = &shards[i];
        let (stamp, members) = r?;
        ds.stamps.push(stamp);
        let id = ds.push_file(shard.as_os_str().as_bytes())?;
        // Group by WebDataset key (the name up to the first dot of its last component).
        let mut by_key: HashMap<&[u8], usize> = HashMap::new();
        let mut samples: Vec<(Option<usize>, i64)> = Vec::new();
        for (m, member) in members.iter().enumerate() {
            let name = &member.name[..];
            let base_start = name.iter().rposition(|&b| b == b'/').map_or(0, |i| i + 1);
            let Some(dot) = name[base_start..].iter().position(|&b| b == b'.') else {
                continue;
            };
            let (key, ext) = (&name[..base_start + dot], &name[base_start + dot + 1..]);
            let is_image = IMAGE_EXTENSIONS
                .iter()
                .any(|e| ext.eq_ignore_ascii_case(e.as_bytes()));
            let is_cls = ext.eq_ignore_ascii_case(b"cls");
            if !is_image && !is_cls {
                continue;
            }
            let s = *by_key.entry(key).or_insert_with(|| {
                samples.push((None, -1));
                samples.len() - 1
            });
            if is_image {
                samples[s].0 = Some(m);
            } else {
                let text = member.data.as_deref().unwrap_or_default();
                samples[s].1 = std::str::from_utf8(text)
                    .ok()
                    .and_then(|t| t.trim().parse().ok())
                    .ok_or_else(|| DatasetError::BadTar {
                        path: shard.clone(),
                        offset: member.offset,
                        reason: format!(
                            "member {} is not an integer label",
                            String::from_utf8_lossy(name)
                        ),
                    })?;
            }
        }
        for (image, label) in samples {
            if let Some(m) = image {
                let member = &members[m];
                ds.push_sample(id, member.offset, member.size, label);
                ds.members.push(&member.name);
            }
        }
    }
    Ok(ds)
}

/// One regular-file member of a tar archive.
#[derive(Debug)]
struct TarMember {
    name: Vec<u8>,
    /// Byte offset of the member's data in the archive.
    offset: u64,
    size: u64,
    /// The contents, read only for small label members.
    data: Option<Vec<u8>>,
}

fn parse_octal(field: &[u8]) -> Option<u64> {
    if field.first().is_some_and(|&b| b & 0x80 != 0) {
        // GNU base-256: big-endian, the top bit of the first byte is the marker.
        let mut v: u64 = u64::from(field[0] & 0x7f);
        for &b in &field[1..] {
            v = v.checked_mul(256)?.checked_add(u64::from(b))?;
        }
        return Some(v);
    }
    let s = field
        .iter()
        .copied()
        .skip_while(|&b| b == b' ')
        .take_while(|&b| b != 0 && b != b' ');
    let mut v: u64 = 0;
    let mut any = false;
    for b in s {
        if !(b'0'..=b'7').contains(&b) {
            return None;
        }
        v = v.checked_mul(8)?.checked_add(u64::from(b - b'0'))?;
        any = true;
    }
    any.then_some(v)
}

fn cstr(field: &[u8]) -> &[u8] {
    let end = field.iter().position(|&b| b == 0).unwrap_or(field.len());
    &field[..end]
}

/// Parses pax extended header records (`"<len> <key>=<value>\n"`), returning path and size.
fn parse_pax(data: &[u8]) -> Option<(Option<Vec<u8>>, Option<u64>)> {
    let (mut path, mut size) = (None, None);
    let mut rest = data;
    while !rest.is_empty() {
        let sp = rest.iter().position(|&b| b == b' ')?;
        let len: usize = std::str::from_utf8(&rest[..sp]).ok()?.parse().ok()?;
        if len <= sp + 1 || len > rest.len() {
            return None;
        }
        let rec = &rest[sp + 1..len];
        let rec = rec.strip_suffix(b"\n").unwrap_or(rec);
        let eq = rec.iter().position(|&b| b == b'=')?;
        let (k, v) = (&rec[..eq], &rec[eq + 1..]);
        match k {
            b"path" => path = Some(v.to_vec()),
            b"size" => size = Some(std::str::from_utf8(v).ok()?.parse().ok()?),
            _ => {}
        }
        rest = &rest[len..];
    }
    Some((path, size))
}

/// Reads the headers of a tar archive (ustar, GNU long names, pax), skipping member data.
fn read_tar_index(path: &Path, done: &AtomicU64) -> Result<Vec<TarMember>, DatasetError> {
    const MAX_META: u64 = 1 << 20;
    let file = open_regular(path)?;
    let file_len = file
        .metadata()
        .map_err(|e| DatasetError::io(path, e))?
        .len();
    let mut r = BufReader::with_capacity(64 * 1024, file);
    let mut members = Vec::new();
    let mut pos: u64 = 0;
    let mut long_name: Option<Vec<u8>> = None;
    let mut pax: Option<(Option<Vec<u8>>, Option<u64>)> = None;
    let mut header = [0u8; 512];
    let bad = |offset: u64, reason: String| DatasetError::BadTar {
        path: path.to_owned(),
        offset,
        reason,
    };
    loop {
        if pos == file_len {
            break; // No end-of-archive blocks: accepted, as GNU tar does with a warning.
        }
        if pos + 512 > file_len {
            return Err(bad(pos, "truncated header".into()));
        }
        r.read_exact(&mut header)
            .map_err(|e| DatasetError::io(path, e))?;
        if header.iter().all(|&b| b == 0) {
            break; // End of archive.
        }
        let want =
            parse_octal(&header[148..156]).ok_or_else(|| bad(pos, "bad checksum field".into()))?;
        let sum: u64 = header
            .iter()
            .enumerate()
            .map(|(i, &b)| {
                if (148..156).contains(&i) {
                    32
                } else {
                    u64::from(b)
                }
            })
            .sum();
        if sum != want {
            return Err(bad(
                pos,
                format!("header checksum {want} != computed {sum}"),
            ));
        }
        let mut size =
            parse_octal(&header[124..136]).ok_or_else(|| bad(pos, "bad size field".into()))?;
        let typeflag = header[156];
        let data_off = pos + 512;
        let mut name = cstr(&header[0..100]).to_vec();
        if &header[257..263] == b"ustar\0" {
            let prefix = cstr(&header[345..500]);
            if !prefix.is_empty() {
                name = [prefix, b"/", &name[..]].concat();
            }
        }
        if let Some((p, s)) = pax.take() {
            if let Some(p) = p {
                name = p;
            }
            if let Some(s) = s {
                size = s;
            }
        }
        if let Some(l) = long_name.take() {
            name = l;
        }
        let padded = size.div_ceil(512) * 512;
        if data_off + size > file_len {
            return Err(bad(
                pos,
                format!("member data of {size} bytes runs past the end of the file"),
            ));
        }
        let read_meta = |r: &mut BufReader<File>| -> Result<Vec<u8>, DatasetError> {
            if size > MAX_META {
                return Err(bad(
                    pos,
                    format!("metadata member of {size} bytes is too large"),
                ));
            }
            let mut buf = vec![0u8; padded as usize];
            r.read_exact(&mut buf)
                .map_err(|e| DatasetError::io(path, e))?;
            buf.truncate(size as usize);
            Ok(buf)
        };
        match typeflag {
            b'L' => long_name = Some(cstr(&read_meta(&mut r)?).to_vec()),
            b'x' => {
                let data = read_meta(&mut r)?;
                pax =
                    Some(parse_pax(&data).ok_or_else(|| bad(pos, "malformed pax header".into()))?);
            }
            b'0' | 0 | b'7' => {
                let is_cls = has_ext(&name, &["cls"]);
                let data = if is_cls && size <= 64 {
                    Some(read_meta(&mut r)?)
                } else {
                    r.seek_relative(padded as i64)
                        .map_err(|e| DatasetError::io(path, e))?;
                    None
                };
                members.push(TarMember {
                    name,
                    offset: data_off,
                    size,
                    data,
                });
            }
            _ => {
                // Directories, links, global pax headers, GNU long link names: skipped.
                r.seek_relative(padded as i64)
                    .map_err(|e| DatasetError::io(path, e))?;
            }
        }
        pos = data_off + padded;
        done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(members)
}

// ---- The on-disk cache ----

fn cache_dir(opts: &OpenOptions) -> Option<PathBuf> {
    if let Some(d) = &opts.cache_dir {
        return Some(d.clone());
    }
    let env = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    env("STOKER_CACHE_DIR")
        .or_else(|| env("XDG_CACHE_HOME").map(|d| d.join("stoker")))
        .or_else(|| env("HOME").map(|d| d.join(".cache").join("stoker")))
}

/// FNV-1a, 64 bits: stable across Rust versions, unlike `DefaultHasher`.
fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

fn cache_file_name(root: &Path, kind: DatasetKind) -> String {
    let h = fnv1a(
        &[kind.code()],
        fnv1a(root.as_os_str().as_bytes(), FNV_OFFSET),
    );
    format!("index-{h:016x}.bin")
}

struct Enc(Vec<u8>);

impl Enc {
    fn u64(&mut self, v: u64) {
        self.0.extend_from_slice(&v.to_le_bytes());
    }
    fn bytes(&mut self, b: &[u8]) {
        self.u64(b.len() as u64);
        self.0.extend_from_slice(b);
    }
    fn u64s(&mut self, v: &[u64]) {
        self.u64(v.len() as u64);
        for &x in v {
            self.u64(x);
        }
    }
}

struct Dec<'a>(&'a [u8]);

impl Dec<'_> {
    fn take(&mut self, n: usize) -> Option<&[u8]> {
        if n > self.0.len() {
            return None;
        }
        let (a, b) = self.0.split_at(n);
        self.0 = b;
        Some(a)
    }
    fn u64(&mut self) -> Option<u64> {
        Some(u64::from_le_bytes(self.take(8)?.try_into().ok()?))
    }
    fn bytes(&mut self) -> Option<Vec<u8>> {
        let n = usize::try_from(self.u64()?).ok()?;
        Some(self.take(n)?.to_vec())
    }
    fn u64s(&mut self) -> Option<Vec<u64>> {
        let n = usize::try_from(self.u64()?).ok()?;
        let raw = self.take(n.checked_mul(8)?)?;
        Some(
            raw.chunks_exact(8)
                .map(|c| u64::from_le_bytes(c.try_into().unwrap_or([0; 8])))
                .collect(),
        )
    }
}

fn encode(ds: &Dataset, written_at: i128) -> Vec<u8> {
    let mut e = Enc(Vec::with_capacity(
        64 + ds.files.bytes.len() + ds.len() * 36,
    ));
    e.0.extend_from_slice(CACHE_MAGIC);
    e.0.extend_from_slice(&CACHE_VERSION.to_le_bytes());
    e.0.push(ds.kind.code());
    e.bytes(ds.root.as_os_str().as_bytes());
    e.0.extend_from_slice(&written_at.to_le_bytes());
    e.u64(ds.stamps.len() as u64);
    for s in &ds.stamps {
        e.bytes(s.path.as_os_str().as_bytes());
        e.0.extend_from_slice(&s.mtime_ns.to_le_bytes());
        e.u64(s.size);
        e.u64(s.dev);
        e.u64(s.ino);
    }
    e.u64(ds.classes.len() as u64);
    for c in &ds.classes {
        e.bytes(c.as_bytes());
    }
    for arena in [&ds.files, &ds.members] {
        e.bytes(&arena.bytes);
        e.u64s(&arena.ends);
    }
    e.u64(ds.len() as u64);
    for &v in &ds.file_id {
        e.0.extend_from_slice(&v.to_le_bytes());
    }
    for v in [&ds.offset, &ds.len] {
        for &x in v.iter() {
            e.u64(x);
        }
    }
    for &x in &ds.label {
        e.0.extend_from_slice(&x.to_le_bytes());
    }
    let sum = fnv1a(&e.0, FNV_OFFSET);
    e.u64(sum);
    e.0
}

fn decode(data: &[u8], root: &Path, kind: DatasetKind) -> Option<(Dataset, i128)> {
    let (body, sum) = data.split_at_checked(data.len().checked_sub(8)?)?;
    if fnv1a(body, FNV_OFFSET) != u64::from_le_bytes(sum.try_into().ok()?) {
        return None;
    }
    let mut d = Dec(body);
    if d.take(8)? != CACHE_MAGIC
        || u32::from_le_bytes(d.take(4)?.try_into().ok()?) != CACHE_VERSION
        || DatasetKind::from_code(d.take(1)?[0])? != kind
        || d.bytes()? != root.as_os_str().as_bytes()
    {
        return None;
    }
    let i128_of = |d: &mut Dec| Some(i128::from_le_bytes(d.take(16)?.try_into().ok()?));
    let written_at = i128_of(&mut d)?;
    let mut ds = Dataset::empty(root, kind);
    for _ in 0..d.u64()? {
        let path = PathBuf::from(OsStr::from_bytes(&d.bytes()?));
        let mtime_ns = i128_of(&mut d)?;
        ds.stamps.push(Stamp {
            path,
            mtime_ns,
            size: d.u64()?,
            dev: d.u64()?,
            ino: d.u64()?,
        });
    }
    for _ in 0..d.u64()? {
        ds.classes.push(String::from_utf8(d.bytes()?).ok()?);
    }
    for arena in [&mut ds.files, &mut ds.members] {
        arena.bytes = d.bytes()?;
        arena.ends = d.u64s()?;
        if arena.ends.windows(2).any(|w| w[0] > w[1])
            || arena
                .ends
                .last()
                .is_some_and(|&e| e != arena.bytes.len() as u64)
        {
            return None;
        }
    }
    let n = usize::try_from(d.u64()?).ok()?;
    let ids = d.take(n.checked_mul(4)?)?;
    ds.file_id = ids
        .chunks_exact(4)
        .map(|c| u32::from_le_bytes(c.try_into().unwrap_or([0; 4])))
        .collect();
    for _ in 0..n {
        ds.offset.push(d.u64()?);
    }
    for _ in 0..n {
        ds.len.push(d.u64()?);
    }
    for _ in 0..n {
        ds.label.push(d.u64()? as i64);
    }
    let nfiles = ds.files.len();
    if !d.0.is_empty()
        || ds.file_id.iter().any(|&f| f as usize >= nfiles)
        || (kind == DatasetKind::TarShards && ds.members.len() != n)
    {
        return None;
    }
    Some((ds, written_at))
}

fn load_cache(file: &Path, root: &Path, kind: DatasetKind) -> Option<Dataset> {
    let data = match fs::read(file) {
        Ok(d) => d,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return None,
        Err(e) => {
            tracing::warn!(cache = %file.display(), error = %e, "cannot read dataset index cache; re-indexing");
            return None;
        }
    };
    let Some((mut ds, written_at)) = decode(&data, root, kind) else {
        tracing::warn!(cache = %file.display(), "dataset index cache is corrupt or from another version; re-indexing");
        return None;
    };
    for s in &ds.stamps {
        let now = Stamp::of(&s.path).ok();
        let same = now.as_ref().is_some_and(|n| n.same_file(s));
        if !same || s.mtime_ns >= written_at - RACY_WINDOW_NS {
            tracing::info!(dataset = %root.display(), changed = %s.path.display(), "dataset changed since it was indexed; re-indexing");
            return None;
        }
    }
    ds.origin = IndexOrigin::Cache;
    Some(ds)
}

fn save_cache(file: &Path, ds: &Dataset, written_at: i128) -> io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = (|| {
        let mut f = File::create(&tmp)?;
        f.write_all(&encode(ds, written_at))?;
        f.sync_all()?;
        fs::rename(&tmp, file)
    })();
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

mod remote;
pub use remote::default_cache_dir;

#[cfg(test)]
mod tests;
