//! The on-disk index cache: where it lives, its binary format, and when it is trusted.
//!
//! # Design
//! - One file per (canonical path, kind), named by an FNV-1a hash; stamps of every folder,
//!   list and shard decide freshness; a cache written within the racy window is not trusted.
//! - Every cache file is signed: its keyed hash under the folder's key
//!   ([`crate::source::integrity`], the node cache's rule) is recorded beside it (`NAME.sum`)
//!   when written, and a file whose bytes do not give it (planted, altered, or written by a
//!   build from before signing) is not used: the dataset is indexed again and the cache
//!   rewritten.
//!
//! # Limitations
//! - Corrupt or stale caches are ignored and rewritten; a failed write is only a warning.
//! - The folder is private (0700, files 0600); one another uid owns or may write to is not
//!   used at all (a warning names it and why). Whoever can read the folder's key (this uid,
//!   root) can sign a file.

#![forbid(unsafe_code)]

use super::*;
use crate::source::integrity::{self, TagKey};

// ---- The on-disk cache ----

/// The cache folder, made private to this uid (0700, see `stoker_private`); `None` when there
/// is none, or when it is refused (another uid's, writable by others: a warning says which
/// and why), since an index planted there would be served as the dataset.
pub(super) fn private_cache_dir(opts: &OpenOptions) -> Option<PathBuf> {
    let dir = cache_dir(opts)?;
    match stoker_private::ensure_dir(&dir) {
        Ok(()) => Some(dir),
        Err(e) => {
            tracing::warn!(error = %e, "not using the dataset index cache");
            None
        }
    }
}

pub(super) fn cache_dir(opts: &OpenOptions) -> Option<PathBuf> {
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
pub(super) fn fnv1a(data: &[u8], mut h: u64) -> u64 {
    for &b in data {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

pub(super) const FNV_OFFSET: u64 = 0xcbf2_9ce4_8422_2325;

pub(super) fn cache_file_name(root: &Path, kind: DatasetKind) -> String {
    let h = fnv1a(
        &[kind.code()],
        fnv1a(root.as_os_str().as_bytes(), FNV_OFFSET),
    );
    format!("index-{h:016x}.bin")
}

pub(super) struct Enc(Vec<u8>);

impl Dataset {
    /// Whether `o` indexes the same samples from the same files (paths, offsets, lengths,
    /// labels, and every file's stamp: size, mtime, device, inode), as a fresh cache would
    /// say: jobs may share one such index.
    pub fn same_index(&self, o: &Dataset) -> bool {
        self.root == o.root
            && self.kind == o.kind
            && self.classes == o.classes
            && self.files == o.files
            && self.members == o.members
            && self.file_id == o.file_id
            && self.offset == o.offset
            && self.len == o.len
            && self.label == o.label
            && self.stamps == o.stamps
            && self.object_files == o.object_files
    }
}

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

pub(super) struct Dec<'a>(&'a [u8]);

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

pub(super) fn encode(ds: &Dataset, written_at: i128) -> Vec<u8> {
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
    e.u64(ds.skipped.count);
    e.u64(ds.skipped.first.len() as u64);
    for name in &ds.skipped.first {
        e.bytes(name.as_bytes());
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
    ds.fields.encode(&mut e.0);
    let sum = fnv1a(&e.0, FNV_OFFSET);
    e.u64(sum);
    e.0
}

pub(super) fn decode(data: &[u8], root: &Path, kind: DatasetKind) -> Option<(Dataset, i128)> {
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
    ds.skipped.count = d.u64()?;
    for _ in 0..d.u64()? {
        ds.skipped.first.push(String::from_utf8(d.bytes()?).ok()?);
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
        // Written as the label's eight bytes (`to_le_bytes`): the same bits back.
        ds.label.push(i64::from_ne_bytes(d.u64()?.to_ne_bytes()));
    }
    let (fields, rest) = SampleFields::decode(d.0, n, ds.files.len())?;
    (ds.fields, d.0) = (fields, rest);
    let nfiles = ds.files.len();
    if !d.0.is_empty()
        || ds.file_id.iter().any(|&f| f as usize >= nfiles)
        || (kind == DatasetKind::TarShards && ds.members.len() != n)
    {
        return None;
    }
    Some((ds, written_at))
}

// ---- Signed files ----

/// The bytes of the cache file `file`, if its keyed hash is the one recorded beside it; an
/// unsigned or altered file is an `InvalidData` error.
pub(super) fn read_signed(file: &Path) -> io::Result<Vec<u8>> {
    let data = fs::read(file)?;
    let key = TagKey::open(file.parent().unwrap_or(Path::new(".")))?;
    if integrity::read_tag(file) != Some(key.tag_of_bytes(&data)) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidData,
            "its keyed hash is not the one recorded beside it (written by another program, or changed since)",
        ));
    }
    Ok(data)
}

/// Writes `data` as the cache file `file`: to a temporary file beside it, then its keyed hash
/// beside `file`, then moved into place (a crash between leaves a file that fails its check).
pub(super) fn write_signed(file: &Path, data: &[u8]) -> io::Result<()> {
    let dir = file.parent().unwrap_or(Path::new("."));
    let tmp = dir.join(format!(
        ".{}.{}.tmp",
        file.file_name()
            .map(|n| n.to_string_lossy())
            .unwrap_or_default(),
        std::process::id()
    ));
    let result = TagKey::open(dir).and_then(|key| {
        stoker_private::write_file(&tmp, data)?;
        integrity::write_tag(file, &key.tag_of_bytes(data))?;
        fs::rename(&tmp, file)
    });
    if result.is_err() {
        let _ = fs::remove_file(&tmp);
    }
    result
}

pub(super) fn load_cache(file: &Path, root: &Path, kind: DatasetKind) -> Option<Dataset> {
    let data = match read_signed(file) {
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

pub(super) fn save_cache(file: &Path, ds: &Dataset, written_at: i128) -> io::Result<()> {
    write_signed(file, &encode(ds, written_at))
}
