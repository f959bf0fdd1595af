//! The node cache: one local copy of every fetched object, shared by every job and rank the
//! daemon serves, under a size cap with least-recently-used eviction.
//!
//! Files are named `<hash of service, bucket, key>-<hash of ETag>-<size>`, so a changed object
//! (new ETag or size) never reuses a stale copy. Every entry is checked before it is served:
//! its size, and the keyed hash of its bytes recorded when they were fetched, hashed again
//! whenever the file changed since its last check ([`crate::source::integrity`]); an entry that fails
//! is deleted and fetched again, never served.
//! Downloads go to a temporary name in the same folder and are renamed into place, so a
//! reader never sees a partial file. One download per object at a time: later askers wait for
//! the one in flight.
//!
//! # Design
//! The bookkeeping (sizes, last use as a counter, downloads in flight) is one mutex-guarded
//! map; waiters block on the download's condition variable, woken when it ends.
//!
//! # Limitations
//! Eviction scans the map (linear in objects cached). Use order is not persisted: after a
//! restart every file already there is equally old.

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex};
use std::time::Instant;

use super::client::S3Error;
use crate::source::integrity::{self, Stamp, Tag, TagKey};

/// The outcome of one download, shared by everyone waiting for it.
#[derive(Default)]
pub struct Pending {
    done: Mutex<Outcome>,
    cond: Condvar,
}

/// A download's outcome once it ended, and who is to be told when it does.
#[derive(Default)]
struct Outcome {
    result: Option<Result<PathBuf, S3Error>>,
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
    pub fn wait(&self) -> Result<PathBuf, S3Error> {
        loop {
            if let Some(r) = self.wait_until(None) {
                return r;
            }
        }
    }

    /// Blocks until the download finished or `deadline` passed (`None`: no deadline);
    /// `None` when it had not finished by then.
    pub fn wait_until(&self, deadline: Option<Instant>) -> Option<Result<PathBuf, S3Error>> {
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

    fn set(&self, r: Result<PathBuf, S3Error>) {
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
    Ready(PathBuf),
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
}

#[derive(Debug, Default)]
struct State {
    entries: HashMap<String, Entry>,
    total: u64,
    tick: u64,
    pending: HashMap<String, Arc<Pending>>,
    /// Objects held by a [`Pin`] (here or on their way), by name: never evicted.
    pins: HashMap<String, u32>,
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
            temp_counter: AtomicU64::new(0),
        })
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

    /// Asks for the object stored as `name` (see [`NodeCache::name`]).
    pub fn claim(&self, name: &str) -> Claim {
        if let Some(path) = self.checked(name) {
            return Claim::Ready(path);
        }
        let mut st = self.lock();
        if let Some(p) = st.pending.get(name) {
            return Claim::Wait(p.clone());
        }
        let p = Arc::new(Pending::default());
        st.pending.insert(name.to_owned(), p.clone());
        Claim::Fetch(p)
    }

    /// The path of `name` if it is here and passes its check (see the module's docs); an entry
    /// that fails is forgotten and deleted. The file is hashed outside the lock.
    fn checked(&self, name: &str) -> Option<PathBuf> {
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
            tracing::warn!(file = %path.display(), "node cache: an entry no longer holds the bytes fetched (its keyed hash differs); deleted, fetching it again");
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

    /// Ends the download of `name` that [`Claim::Fetch`] gave: on success moves `temp` into
    /// place (evicting the least recently used objects over the cap), and wakes the waiters.
    pub fn finish(
        &self,
        name: &str,
        pending: &Pending,
        temp: &Path,
        result: Result<u64, S3Error>,
        url: &str,
    ) -> Result<PathBuf, S3Error> {
        let path = self.dir.join(name);
        let result = result.and_then(|size| {
            self.put_in_place(temp, &path)
                .map(|(tag, stamp)| (size, tag, stamp))
                .map_err(|e| S3Error::local(url, format!("{}: {e}", path.display())))
        });
        if result.is_err() {
            let _ = fs::remove_file(temp);
        }
        let mut st = self.lock();
        st.pending.remove(name);
        let out = result.map(|(size, tag, stamp)| {
            st.tick += 1;
            let tick = st.tick;
            let entry = Entry {
                size,
                tick,
                tag,
                stamp,
            };
            if let Some(old) = st.entries.insert(name.to_owned(), entry) {
                st.total -= old.size;
            }
            st.total += size;
            self.evict(&mut st, name);
            path
        });
        drop(st);
        pending.set(out.clone());
        out
    }

    /// Records the keyed hash of the download `temp` beside `path` (making room while the disk
    /// is full, for a second at most), then moves it there.
    fn put_in_place(&self, temp: &Path, path: &Path) -> std::io::Result<(Tag, Option<Stamp>)> {
        let tag = self.key.tag_of(temp)?;
        let mut tries = 0;
        loop {
            match integrity::write_tag(path, &tag) {
                Err(e) if e.kind() == std::io::ErrorKind::StorageFull && tries < 100 => {
                    tries += 1;
                    if self.make_room(1 << 12) == 0 {
                        std::thread::sleep(std::time::Duration::from_millis(10));
                    }
                }
                written => break written?,
            }
        }
        fs::rename(temp, path)?;
        Ok((
            tag,
            fs::metadata(path).ok().and_then(|m| Stamp::settled(&m)),
        ))
    }

    /// Deletes the copy stored as `name`, if there is one and no download of it is under way
    /// (a reader that opened it keeps reading). Returns whether a copy was deleted.
    pub fn remove(&self, name: &str) -> bool {
        let mut st = self.lock();
        if st.pending.contains_key(name) {
            return false;
        }
        let Some(e) = st.entries.remove(name) else {
            return false;
        };
        st.total -= e.size;
        let path = self.dir.join(name);
        let _ = fs::remove_file(integrity::tag_path(&path));
        fs::remove_file(path).is_ok()
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
            .filter(|(n, _)| n.as_str() != keep && !st.pins.contains_key(n.as_str()))
            .min_by_key(|(_, e)| e.tick)
            .map(|(n, e)| (n.clone(), *e))?;
        st.entries.remove(&victim);
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

/// The size at the end of a cache file name.
fn size_of_name(name: &str) -> Option<u64> {
    let mut parts = name.split('-');
    let (_, _, size) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() {
        return None;
    }
    size.parse().ok()
}

fn fnv1a(parts: &[&[u8]]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for p in parts {
        for &b in *p {
            h ^= u64::from(b);
            h = h.wrapping_mul(0x0100_0000_01b3);
        }
        h ^= 0xff;
        h = h.wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(c: &NodeCache, name: &str, bytes: &[u8]) -> PathBuf {
        let Claim::Fetch(p) = c.claim(name) else {
            panic!("{name} should be fetched");
        };
        let tmp = c.temp_path(name);
        fs::write(&tmp, bytes).unwrap();
        c.finish(name, &p, &tmp, Ok(bytes.len() as u64), "s3://b/k")
            .unwrap()
    }

    #[test]
    fn objects_are_reused_and_least_recently_used_evicted() {
        let dir = tempfile::tempdir().unwrap();
        let c = NodeCache::open(dir.path(), 10).unwrap();
        let a = NodeCache::name("e", "b", "a", "etag", 4);
        let b = NodeCache::name("e", "b", "b", "etag", 4);
        let d = NodeCache::name("e", "b", "d", "etag", 4);
        put(&c, &a, b"aaaa");
        put(&c, &b, b"bbbb");
        assert!(matches!(c.claim(&a), Claim::Ready(_)));
        put(&c, &d, b"dddd"); // over the cap: b is the least recently used
        assert_eq!(c.total(), 8);
        assert!(matches!(c.claim(&a), Claim::Ready(_)));
        assert!(!dir.path().join(&b).exists());
        // A new ETag is another object.
        assert_ne!(NodeCache::name("e", "b", "a", "other", 4), a);
        // Reopening takes the files in; a file of the wrong size is not reused.
        fs::write(dir.path().join(&d), b"short").unwrap();
        let c2 = NodeCache::open(dir.path(), 10).unwrap();
        assert!(matches!(c2.claim(&a), Claim::Ready(_)));
        assert!(matches!(c2.claim(&d), Claim::Fetch(_)));
        // Removing a copy deletes its file and frees its bytes.
        assert!(c2.remove(&a) && !dir.path().join(&a).exists());
        assert!(!c2.remove(&a));
    }

    #[test]
    fn a_pinned_object_is_not_evicted_and_room_is_made_from_the_others() {
        let dir = tempfile::tempdir().unwrap();
        let c = Arc::new(NodeCache::open(dir.path(), 4).unwrap());
        let a = NodeCache::name("e", "b", "a", "etag", 4);
        let b = NodeCache::name("e", "b", "b", "etag", 4);
        let pin = c.pin(&a);
        put(&c, &a, b"aaaa");
        put(&c, &b, b"bbbb"); // over the cap, but a is pinned: the cap is overrun
        assert!(dir.path().join(&a).exists() && dir.path().join(&b).exists());
        assert_eq!(c.total(), 8);
        drop(pin); // the cap holds again: a (least recently used) goes
        assert_eq!(c.total(), 4);
        assert!(!dir.path().join(&a).exists());
        // A full disk: room is made from what nobody pins.
        let _pin_b = c.pin(&b);
        assert_eq!(c.make_room(4), 0, "only a pinned object is left");
        drop(_pin_b);
        assert_eq!(c.make_room(4), 4);
        assert_eq!(c.total(), 0);
    }

    #[test]
    fn an_entry_whose_bytes_changed_is_deleted_and_fetched_again_never_served() {
        let dir = tempfile::tempdir().unwrap();
        let c = NodeCache::open(dir.path(), 100).unwrap();
        let a = NodeCache::name("e", "b", "a", "etag", 4);
        let b = NodeCache::name("e", "b", "b", "etag", 4);
        put(&c, &a, b"aaaa");
        put(&c, &b, b"bbbb");
        assert!(matches!(c.claim(&a), Claim::Ready(_)));
        // Same size, other bytes: the size check passes, the keyed hash does not.
        fs::write(dir.path().join(&a), b"aaab").unwrap();
        assert!(matches!(c.claim(&a), Claim::Fetch(_)));
        assert!(!dir.path().join(&a).exists() && c.total() == 4);
        // Changed while the daemon was down, or planted without a tag: not taken in.
        fs::write(dir.path().join(&b), b"bbbc").unwrap();
        let planted = NodeCache::name("e", "b", "p", "etag", 4);
        fs::write(dir.path().join(&planted), b"pppp").unwrap();
        let c2 = NodeCache::open(dir.path(), 100).unwrap();
        assert!(matches!(c2.claim(&b), Claim::Fetch(_)));
        assert!(matches!(c2.claim(&planted), Claim::Fetch(_)));
        assert!(!dir.path().join(&planted).exists());
    }

    #[test]
    fn a_failed_download_wakes_waiters_with_the_error() {
        let dir = tempfile::tempdir().unwrap();
        let c = NodeCache::open(dir.path(), 100).unwrap();
        let Claim::Fetch(p) = c.claim("x-y-3") else {
            panic!("first claim fetches")
        };
        let Claim::Wait(w) = c.claim("x-y-3") else {
            panic!("second claim waits")
        };
        let tmp = c.temp_path("x-y-3");
        let err = S3Error::local("s3://b/x", "boom".into());
        assert!(c.finish("x-y-3", &p, &tmp, Err(err), "s3://b/x").is_err());
        assert!(w.wait().is_err());
        assert!(matches!(c.claim("x-y-3"), Claim::Fetch(_)));
    }

    #[test]
    fn the_folder_is_made_private_and_one_of_another_uid_refused() {
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        let dir = tempfile::tempdir().unwrap();
        let objects = dir.path().join("cache/objects");
        NodeCache::open(&objects, 10).unwrap();
        let mode = |p: &Path| fs::metadata(p).unwrap().mode() & 0o777;
        assert_eq!(mode(&objects), 0o700);
        fs::set_permissions(&objects, fs::Permissions::from_mode(0o777)).unwrap();
        let e = NodeCache::open(&objects, 10).unwrap_err().to_string();
        assert!(
            e.contains(&objects.display().to_string()) && e.contains("may write"),
            "{e}"
        );
        if stoker_private::euid() == 0 {
            fs::set_permissions(&objects, fs::Permissions::from_mode(0o700)).unwrap();
            std::os::unix::fs::chown(&objects, Some(65534), Some(65534)).unwrap();
            let e = NodeCache::open(&objects, 10).unwrap_err().to_string();
            assert!(e.contains("belongs to uid 65534"), "{e}");
        }
    }
}
