//! The node cache: one local copy of every fetched object, shared by every job and rank the
//! daemon serves, under a size cap with least-recently-used eviction.
//!
//! Files are named `<hash of service, bucket, key>-<hash of ETag>-<size>`, so a changed object
//! (new ETag or size) never reuses a stale copy. Every entry is checked before it is served:
//! its size, and the keyed hash of its bytes recorded when they were fetched, hashed again
//! whenever the file changed since its last check ([`crate::source::integrity`]); an entry that fails
//! is deleted and fetched again, never served.
//! An entry is one file holding the object's bytes, its tag on its inode (format 2; format 1,
//! a tag file beside it, is still read, and written where the file system has no user
//! extended attributes: [`crate::source::integrity`]). It gets its name only once whole and
//! tagged ([`writer`]), so a reader never sees a partial file. One download per object at a
//! time: later askers wait for the one in flight.
//!
//! # Design
//! - The bookkeeping (sizes, last use as a counter, downloads in flight) is one mutex-guarded
//!   map; waiters block on the download's condition variable, woken when it ends.
//! - An object is tagged once, as its bytes arrive (`client`), never by reading its copy
//!   back. One received into memory (most: see `MEMORY_MAX_BYTES` in the store) is handed to
//!   its waiters from memory at once ([`Cached::Memory`], a *hot copy*) and its file written
//!   behind ([`NodeCache::write_behind`], on the cache's one writer thread). Until its file is in
//!   place the entry is not evicted (a removal waits for it), and its hot copy is kept; after that the
//!   hot copy goes once a reader took it and the last pin on it went, or, past
//!   [`HOT_MAX_BYTES`] of hot copies, oldest first. A hot copy needs no check: it is the
//!   bytes received, in the daemon's own memory. Measured on the photos bench (issue 44):
//!   the tag computed again from the file at first use, the write's read-back and the
//!   reader's read of the fresh file were most of the cold path's cost between the server's
//!   bytes and the decoder.
//!
//! # Limitations
//! Eviction scans the map (linear in objects cached). Use order is not persisted: after a
//! restart every file already there is equally old. A hot copy that was never read (fetched
//! far ahead) and is pushed out by newer ones is read from its file later, hashed once.
//! Files still queued for writing when the process ends are not written: those objects are
//! fetched again after a restart.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use bytes::Bytes;

use super::client::S3Error;
use crate::source::integrity::{self, Stamp, Tag, TagKey};

/// The most bytes of hot copies (objects just received, handed to readers from memory) the
/// cache keeps at once, besides those whose file is still being written.
pub const HOT_MAX_BYTES: u64 = 256 << 20;

/// Where an object's bytes are for a reader.
#[derive(Debug, Clone)]
pub enum Cached {
    /// In memory, as received (the hot copy): no file to read, no check to make.
    Memory(Bytes),
    /// In the node cache's file, checked.
    File(PathBuf),
}

/// What a download brought, for [`NodeCache::finish`], with the tag of its bytes computed
/// as they were received.
#[derive(Debug)]
pub(crate) enum Fetched<'a> {
    /// Bytes received into memory: the file is written behind.
    Memory { bytes: Bytes, tag: Tag },
    /// Bytes received into the temporary file `temp` ([`NodeCache::temp_path`]): it is moved
    /// into place.
    File { temp: &'a Path, size: u64, tag: Tag },
}

/// The outcome of one download, shared by everyone waiting for it.
#[derive(Default)]
pub struct Pending {
    done: Mutex<Outcome>,
    cond: Condvar,
}

/// A download's outcome once it ended, and who is to be told when it does.
#[derive(Default)]
struct Outcome {
    result: Option<Result<Cached, S3Error>>,
    watchers: Vec<Box<dyn FnOnce() + Send>>,
}

impl std::fmt::Debug for Pending {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Pending")
            .field("done", &self.is_done())
            .finish_non_exhaustive()
    }
}

impl Pending {
    /// Blocks until the download finished.
    pub fn wait(&self) -> Result<Cached, S3Error> {
        loop {
            if let Some(r) = self.wait_until(None) {
                return r;
            }
        }
    }

    /// Blocks until the download finished or `deadline` passed (`None`: no deadline);
    /// `None` when it had not finished by then.
    pub fn wait_until(&self, deadline: Option<Instant>) -> Option<Result<Cached, S3Error>> {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        loop {
            if let Some(r) = &g.result {
                return Some(r.clone());
            }
            g = match deadline {
                None => self.cond.wait(g).unwrap_or_else(|e| e.into_inner()),
                Some(d) => {
                    let left = d.checked_duration_since(Instant::now())?;
                    self.cond
                        .wait_timeout(g, left)
                        .unwrap_or_else(|e| e.into_inner())
                        .0
                }
            };
        }
    }

    /// Whether the download ended (well or not).
    pub fn is_done(&self) -> bool {
        self.done
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .result
            .is_some()
    }

    /// Calls `f` once the download ended, on the thread that ends it; returns `false` (and
    /// drops `f` uncalled) when it ended already.
    pub fn on_done(&self, f: Box<dyn FnOnce() + Send>) -> bool {
        let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
        if g.result.is_some() {
            return false;
        }
        g.watchers.push(f);
        true
    }

    fn set(&self, r: Result<Cached, S3Error>) {
        let watchers = {
            let mut g = self.done.lock().unwrap_or_else(|e| e.into_inner());
            g.result = Some(r);
            std::mem::take(&mut g.watchers)
        };
        self.cond.notify_all();
        // Outside the lock: a watcher may take other locks (the engine's scheduler).
        for w in watchers {
            w();
        }
    }
}

/// What asking the cache for an object gives.
#[derive(Debug)]
pub enum Claim {
    /// It is here.
    Ready(Cached),
    /// Someone is downloading it: wait on this.
    Wait(Arc<Pending>),
    /// Nobody is: the caller downloads it to [`NodeCache::temp_path`], then calls
    /// [`NodeCache::finish`].
    Fetch(Arc<Pending>),
}

#[derive(Debug, Clone, Copy)]
struct Entry {
    size: u64,
    tick: u64,
    /// The keyed hash of the bytes fetched.
    tag: Tag,
    /// The file as it was at its last good check (`None`: not checked by this process yet).
    stamp: Option<Stamp>,
    /// Whether its file is in place (`false` while it is written behind: see [`Cached`]).
    written: bool,
}

/// An object's bytes as received, kept to hand to readers from memory.
#[derive(Debug)]
struct Hot {
    bytes: Bytes,
    /// When it came (the cache's tick): the oldest go first past [`HOT_MAX_BYTES`].
    tick: u64,
    /// Whether a reader took it: it goes with the last pin on it.
    taken: bool,
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    total: u64,
    tick: u64,
    pending: HashMap<String, Arc<Pending>>,
    /// Objects held by a [`Pin`] (here or on their way), by name: never evicted.
    pins: HashMap<String, u32>,
    /// Hot copies, by name, and their bytes together.
    hot: HashMap<String, Hot>,
    hot_bytes: u64,
}

/// A hold on one object of the cache, there or on its way: it is not evicted while a pin on
/// it lives (a read between its fetch and its read, a batch waiting for its objects). The
/// cap may be overrun by what is pinned; the excess goes when the last pin does.
#[derive(Debug)]
pub struct Pin {
    cache: Arc<NodeCache>,
    name: String,
}

impl Drop for Pin {
    fn drop(&mut self) {
        self.cache.unpin(&self.name);
    }
}

/// The folder, its cap and what is in it.
#[derive(Debug)]
pub struct NodeCache {
    dir: PathBuf,
    cap: u64,
    key: TagKey,
    state: Mutex<State>,
    /// Woken whenever a file written behind is in place (or failed).
    written: Condvar,
    writer: writer::Writer,
    temp_counter: AtomicU64,
}

impl NodeCache {
    /// Opens (creating) `dir`, private to this uid (`stoker_private`: 0700, files 0600; a
    /// folder another uid owns or may write to is refused, since an object planted there
    /// would be served as the bucket's), takes in the complete files already there with their
    /// recorded tags (checked when first claimed), and removes leftover temporary files and
    /// entries without a tag.
    pub fn open(dir: &Path, cap: u64) -> std::io::Result<NodeCache> {
        stoker_private::ensure_dir(dir).map_err(std::io::Error::other)?;
        let key = TagKey::open(dir)?;
        let mut st = State::default();
        for e in fs::read_dir(dir)? {
            let e = e?;
            let name = e.file_name().to_string_lossy().into_owned();
            if name.contains(".tmp.") {
                let _ = fs::remove_file(e.path());
                continue;
            }
            if let Some(entry) = name.strip_suffix(integrity::TAG_SUFFIX) {
                if !dir.join(entry).exists() {
                    let _ = fs::remove_file(e.path());
                }
                continue;
            }
            let (Some(size), Ok(meta)) = (size_of_name(&name), e.metadata()) else {
                continue;
            };
            match integrity::read_tag(&e.path()) {
                Some(tag) if meta.len() == size => {
                    st.total += size;
                    let entry = Entry {
                        size,
                        tick: 0,
                        tag,
                        stamp: None,
                        written: true,
                    };
                    st.entries.insert(name, entry);
                }
                _ => remove_entry_files(&e.path()),
            }
        }
        Ok(NodeCache {
            dir: dir.to_owned(),
            cap,
            key,
            state: Mutex::new(st),
            written: Condvar::new(),
            writer: writer::Writer::default(),
            temp_counter: AtomicU64::new(0),
        })
    }

    /// The key downloads are tagged with as they arrive.
    pub(crate) fn tags(&self) -> &TagKey {
        &self.key
    }

    /// The cache's folder.
    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Bytes held now.
    pub fn total(&self) -> u64 {
        self.lock().total
    }

    /// The most bytes it holds (`s3.cache_max_bytes`); older objects are evicted past it.
    pub fn cap(&self) -> u64 {
        self.cap
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The file name of an object.
    pub fn name(origin: &str, bucket: &str, key: &str, etag: &str, size: u64) -> String {
        let k = fnv1a(&[origin.as_bytes(), bucket.as_bytes(), key.as_bytes()]);
        format!("{k:016x}-{:016x}-{size}", fnv1a(&[etag.as_bytes()]))
    }

    /// Asks for the object stored as `name` (see [`NodeCache::name`]), `object` in logs.
    pub fn claim(&self, name: &str, object: &dyn std::fmt::Display) -> Claim {
        if let Some(bytes) = self.take_hot(name) {
            return Claim::Ready(Cached::Memory(bytes));
        }
        if let Some(path) = self.checked(name, object) {
            return Claim::Ready(Cached::File(path));
        }
        let mut st = self.lock();
        if let Some(p) = st.pending.get(name) {
            return Claim::Wait(p.clone());
        }
        let p = Arc::new(Pending::default());
        st.pending.insert(name.to_owned(), p.clone());
        Claim::Fetch(p)
    }

    /// The hot copy of `name`, if there is one, marked taken (it goes with the last pin).
    fn take_hot(&self, name: &str) -> Option<Bytes> {
        let mut st = self.lock();
        st.tick += 1;
        let tick = st.tick;
        let hot = st.hot.get_mut(name)?;
        hot.taken = true;
        let bytes = hot.bytes.clone();
        if let Some(e) = st.entries.get_mut(name) {
            e.tick = tick;
        }
        Some(bytes)
    }

    /// Drops the hot copy of `name`, if any.
    fn drop_hot(st: &mut State, name: &str) {
        if let Some(h) = st.hot.remove(name) {
            st.hot_bytes -= h.bytes.len() as u64;
        }
    }

    /// Drops the oldest hot copies whose files are in place until they fit [`HOT_MAX_BYTES`].
    fn trim_hot(st: &mut State) {
        while st.hot_bytes > HOT_MAX_BYTES {
            let oldest = (st.hot.iter())
                .filter(|(n, _)| st.entries.get(n.as_str()).is_none_or(|e| e.written))
                .min_by_key(|(_, h)| h.tick)
                .map(|(n, _)| n.clone());
            let Some(name) = oldest else { return };
            Self::drop_hot(st, &name);
        }
    }

    /// The path of `name` if it is here and passes its check (see the module's docs); an entry
    /// that fails is forgotten and deleted. The file is hashed outside the lock.
    fn checked(&self, name: &str, object: &dyn std::fmt::Display) -> Option<PathBuf> {
        let e = self.lock().entries.get(name).copied()?;
        let path = self.dir.join(name);
        let meta = fs::metadata(&path).ok().filter(|m| m.len() == e.size);
        let now = meta.as_ref().map(Stamp::of);
        let good = now.is_some()
            && (e.stamp.is_some() && e.stamp == now
                || self.key.tag_of(&path).is_ok_and(|t| t == e.tag));
        let stamp = meta.as_ref().and_then(Stamp::settled);
        let mut st = self.lock();
        if st.entries.get(name)?.tag != e.tag {
            return None; // fetched again meanwhile: the caller claims anew
        }
        if good {
            st.tick += 1;
            let tick = st.tick;
            st.entries
                .insert(name.to_owned(), Entry { tick, stamp, ..e });
            return Some(path);
        }
        // Removed, or changed behind our back: never served, fetched again.
        if meta.is_some() {
            tracing::warn!(%object, file = %path.display(), "node cache: the copy of an object no longer holds the bytes fetched (its keyed hash differs: torn by a crash, or changed); deleted, fetching it again");
            metrics::counter!(super::metric::CACHE_REQUESTS_TOTAL, "result" => "rejected")
                .increment(1);
        }
        st.total -= e.size;
        st.entries.remove(name);
        remove_entry_files(&path);
        None
    }

    /// Pins the object stored as `name` (see [`Pin`]).
    pub fn pin(self: &Arc<Self>, name: &str) -> Pin {
        *self.lock().pins.entry(name.to_owned()).or_default() += 1;
        Pin {
            cache: self.clone(),
            name: name.to_owned(),
        }
    }

    fn unpin(&self, name: &str) {
        let mut st = self.lock();
        if let Some(n) = st.pins.get_mut(name) {
            *n -= 1;
            if *n == 0 {
                st.pins.remove(name);
                // Read, and its file in place: the next reader reads the file.
                let written = st.entries.get(name).is_none_or(|e| e.written);
                if written && st.hot.get(name).is_some_and(|h| h.taken) {
                    Self::drop_hot(&mut st, name);
                }
            }
        }
        if st.total > self.cap {
            self.evict(&mut st, "");
        }
    }

    /// Deletes least recently used objects nobody pins until `bytes` are freed, or none is
    /// left: what a write that found the disk full does before it tries again. Returns the
    /// bytes freed.
    pub fn make_room(&self, bytes: u64) -> u64 {
        let mut st = self.lock();
        let mut freed = 0;
        while freed < bytes {
            let Some(size) = self.evict_one(&mut st, "") else {
                break;
            };
            freed += size;
        }
        tracing::debug!(freed, wanted = bytes, dir = %self.dir.display(), "node cache: disk full, evicted");
        freed
    }

    /// Whether `name` is here or being downloaded (claims nothing).
    pub fn known(&self, name: &str) -> bool {
        let st = self.lock();
        st.entries.contains_key(name) || st.pending.contains_key(name)
    }

    /// Whether `name` is here (claims nothing; the file is checked when claimed).
    pub fn ready(&self, name: &str) -> bool {
        self.lock().entries.contains_key(name)
    }

    /// A fresh temporary path for a download of `name`.
    pub fn temp_path(&self, name: &str) -> PathBuf {
        let n = self.temp_counter.fetch_add(1, Ordering::Relaxed);
        self.dir
            .join(format!("{name}.tmp.{}.{n}", std::process::id()))
    }

    /// Ends the download of `name` that [`Claim::Fetch`] gave, and wakes the waiters. Bytes
    /// received into memory are handed to them from there (the caller then writes the file
    /// with [`NodeCache::write_behind`]); a temporary file is moved into place. Either is
    /// recorded with the tag computed as it arrived, and the least recently used objects over
    /// the cap are evicted.
    pub(crate) fn finish(
        &self,
        name: &str,
        pending: &Pending,
        got: Result<Fetched<'_>, S3Error>,
        url: &str,
    ) -> Result<Cached, S3Error> {
        let path = self.dir.join(name);
        let got = got.and_then(|f| match f {
            Fetched::Memory { bytes, tag } => Ok((bytes.len() as u64, tag, None, Some(bytes))),
            Fetched::File { temp, size, tag } => self
                .put_in_place(temp, &path, &tag)
                .map(|stamp| (size, tag, stamp, None))
                .map_err(|e| {
                    let _ = fs::remove_file(temp);
                    S3Error::local(url, format!("{}: {e}", path.display()))
                }),
        });
        let mut st = self.lock();
        st.pending.remove(name);
        let out = got.map(|(size, tag, stamp, bytes)| {
            st.tick += 1;
            let tick = st.tick;
            let entry = Entry {
                size,
                tick,
                tag,
                stamp,
                written: bytes.is_none(),
            };
            if let Some(old) = st.entries.insert(name.to_owned(), entry) {
                st.total -= old.size;
            }
            st.total += size;
            self.evict(&mut st, name);
            match bytes {
                Some(bytes) => {
                    Self::drop_hot(&mut st, name);
                    st.hot_bytes += size;
                    let hot = Hot {
                        bytes: bytes.clone(),
                        tick,
                        taken: false,
                    };
                    st.hot.insert(name.to_owned(), hot);
                    Self::trim_hot(&mut st);
                    Cached::Memory(bytes)
                }
                None => Cached::File(path),
            }
        });
        drop(st);
        pending.set(out.clone());
        out
    }

    /// Writes the file of `name`, whose bytes `bytes` (tagged `tag`) [`NodeCache::finish`]
    /// handed to readers from memory: one file, tagged on its inode, named once whole
    /// ([`writer::Writer::publish`]), making room while the disk is full (for a second at
    /// most). Blocking: call it off the request threads. Should it fail, the entry is
    /// forgotten (its readers had their bytes; the next one fetches it again).
    pub(crate) fn write_behind(&self, name: &str, bytes: &[u8], tag: &Tag) {
        let path = self.dir.join(name);
        // No sync: a file torn by a crash fails its tag at the next start and is fetched again.
        let temp = || self.temp_path(name);
        let written = self
            .retry_full(bytes.len() as u64, || {
                (self.writer).publish(&self.dir, &path, temp, bytes, tag)
            })
            .map(|()| fs::metadata(&path).ok().and_then(|m| Stamp::settled(&m)));
        let mut st = self.lock();
        match written {
            Ok(stamp) => {
                if let Some(e) = st.entries.get_mut(name) {
                    e.written = true;
                    e.stamp = stamp;
                }
                // Read already, and nobody holds it: the next reader reads the file.
                let unpinned = !st.pins.contains_key(name);
                if unpinned && st.hot.get(name).is_some_and(|h| h.taken) {
                    Self::drop_hot(&mut st, name);
                }
                // Entries being written were spared by every eviction until now.
                if st.total > self.cap {
                    self.evict(&mut st, "");
                }
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e, "node cache: an object's file could not be written; it will be fetched again");
                if let Some(old) = st.entries.remove(name) {
                    st.total -= old.size;
                }
                Self::drop_hot(&mut st, name);
                remove_entry_files(&path);
            }
        }
        drop(st);
        self.written.notify_all();
    }

    /// Writes the file of `name` behind (see [`NodeCache::write_behind`]) on the cache's
    /// writer thread.
    pub(crate) fn queue_write(self: &Arc<Self>, name: &str, bytes: Bytes, tag: Tag) {
        self.writer.queue(self, name.to_owned(), bytes, tag);
    }

    /// The file of `name` once it is in place (waiting for its write behind); `None` when
    /// there is none (never fetched, evicted, or its write failed).
    pub fn file(&self, name: &str) -> Option<PathBuf> {
        let mut st = self.lock();
        loop {
            match st.entries.get(name) {
                None => return None,
                Some(e) if e.written => return Some(self.dir.join(name)),
                Some(_) => st = self.written.wait(st).unwrap_or_else(|e| e.into_inner()),
            }
        }
    }

    /// Runs `write` (of about `bytes`) again while it finds the disk full (making room, or
    /// waiting a moment when nothing can be evicted), 100 times at most.
    fn retry_full(
        &self,
        bytes: u64,
        mut write: impl FnMut() -> std::io::Result<()>,
    ) -> std::io::Result<()> {
        let mut tries = 0;
        loop {
            match write() {
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull && tries < 100 => {
                    tries += 1;
                    if self.make_room(bytes.max(1 << 12)) == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                written => return written,
            }
        }
    }

    /// Records `tag` (the keyed hash of the bytes in `temp`, computed as they were received)
    /// on `temp`, then moves it to `path`; the file's stamp, once settled.
    fn put_in_place(&self, temp: &Path, path: &Path, tag: &Tag) -> std::io::Result<Option<Stamp>> {
        let file = fs::File::open(temp)?;
        self.retry_full(0, || integrity::record_tag(&file, path, tag))?;
        fs::rename(temp, path)?;
        Ok(fs::metadata(path).ok().and_then(|m| Stamp::settled(&m)))
    }

    /// Deletes the copy stored as `name`, if there is one and no download of it is under way
    /// (a reader that opened it keeps reading), once its file is in place if it is being
    /// written behind. Returns whether a copy was deleted.
    pub fn remove(&self, name: &str) -> bool {
        let mut st = self.lock();
        // A file being written behind is waited for (the writer never waits on this).
        while st.entries.get(name).is_some_and(|e| !e.written) {
            st = self.written.wait(st).unwrap_or_else(|e| e.into_inner());
        }
        if st.pending.contains_key(name) {
            return false;
        }
        let Some(e) = st.entries.remove(name) else {
            return false;
        };
        Self::drop_hot(&mut st, name);
        st.total -= e.size;
        let path = self.dir.join(name);
        let removed = fs::remove_file(&path).is_ok();
        let _ = fs::remove_file(integrity::tag_path(&path));
        removed
    }

    /// Removes least recently used objects (never `keep`, never a pinned one) until the total
    /// fits the cap.
    fn evict(&self, st: &mut State, keep: &str) {
        while st.total > self.cap {
            if self.evict_one(st, keep).is_none() {
                return;
            }
        }
    }

    /// Removes the least recently used object that is not `keep` and not pinned; its size.
    fn evict_one(&self, st: &mut State, keep: &str) -> Option<u64> {
        let (victim, e) = st
            .entries
            .iter()
            .filter(|(n, e)| e.written && n.as_str() != keep && !st.pins.contains_key(n.as_str()))
            .min_by_key(|(_, e)| e.tick)
            .map(|(n, e)| (n.clone(), *e))?;
        st.entries.remove(&victim);
        Self::drop_hot(st, &victim);
        st.total -= e.size;
        // A reader that opened the file already keeps reading it.
        remove_entry_files(&self.dir.join(&victim));
        tracing::debug!(file = %victim, bytes = e.size, "node cache evicted an object");
        Some(e.size)
    }
}

/// Deletes the entry at `path` and its tag.
fn remove_entry_files(path: &Path) {
    let _ = fs::remove_file(path);
    let _ = fs::remove_file(integrity::tag_path(path));
}

mod names;
#[cfg(test)]
mod tests;
mod writer;

use names::{fnv1a, size_of_name};
