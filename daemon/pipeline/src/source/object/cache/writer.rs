//! The node cache's writer: one thread per cache that writes the files of objects handed to
//! their readers from memory ([`super::NodeCache::write_behind`]), in the order they came,
//! and how a file is written ([`Writer::publish`]).
//!
//! # Design
//! - One inode per object, no rename: the bytes go to an unnamed file (`O_TMPFILE`), its tag
//!   on the same inode ([`integrity::record_tag`]), and the file gets its name (`linkat`) only
//!   once whole and tagged, so no reader sees it partial. The earlier scheme (a tag file made,
//!   a temporary file made, then renamed) cost ext4 two inode allocations and a rename per
//!   object, most of the writer's CPU (measured on the photos bench, issue 44). Where the
//!   folder refuses unnamed files (no `O_TMPFILE`, no `/proc`), a named temporary file moved
//!   into place does the same.
//! - One thread, fed by a channel, rather than a blocking task per object: a burst of
//!   hundreds of downloads would otherwise start as many threads (a stack each), which cost
//!   more CPU than the writes (measured on the photos bench, issue 44). The thread holds the
//!   cache weakly and ends when the cache goes (its sender with it).

use std::fs;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{channel, Sender};
use std::sync::{Arc, Mutex, Weak};

use bytes::Bytes;
use rustix::fs::{AtFlags, Mode, OFlags, CWD};
use rustix::io::Errno;

use super::NodeCache;
use crate::source::integrity::{self, Tag};

/// One file to write: the entry's name, its bytes and their tag.
type Job = (String, Bytes, Tag);

/// The sending end of a cache's writer thread, started at its first file.
#[derive(Debug, Default)]
pub(super) struct Writer {
    tx: Mutex<Option<Sender<Job>>>,
    /// Whether the folder refused an unnamed file: files go through named temporary ones.
    pub(super) named: AtomicBool,
}

impl Writer {
    /// Writes `bytes` (tagged `tag`) as the file `path` of the cache's folder `dir`, never
    /// seen partial under its name: as an unnamed file named once whole and tagged, or,
    /// where `dir` refuses those, as the temporary file `temp()` moved into place. A file of
    /// that name already there (another process's copy) is replaced, as a rename would.
    pub(super) fn publish(
        &self,
        dir: &Path,
        path: &Path,
        temp: impl FnOnce() -> PathBuf,
        bytes: &[u8],
        tag: &Tag,
    ) -> std::io::Result<()> {
        if !self.named.load(Ordering::Relaxed) {
            match write_unnamed(dir, path, bytes, tag) {
                Err(e) if e.kind() == std::io::ErrorKind::Unsupported => {
                    tracing::debug!(dir = %dir.display(), error = %e, "node cache: no unnamed files here; writing through temporary names");
                    self.named.store(true, Ordering::Relaxed);
                }
                written => return written,
            }
        }
        let temp = temp();
        let written = write_named(&temp, path, bytes, tag);
        if written.is_err() {
            let _ = fs::remove_file(&temp);
        }
        written
    }

    /// Queues the file of `name` for `cache`'s writer thread (starting it if needed); writes
    /// it on this thread when no thread can be started.
    pub(super) fn queue(&self, cache: &Arc<NodeCache>, name: String, bytes: Bytes, tag: Tag) {
        let mut tx = self.tx.lock().unwrap_or_else(|e| e.into_inner());
        if tx.is_none() {
            *tx = start(cache);
        }
        let job = match tx.as_ref() {
            Some(t) => match t.send((name, bytes, tag)) {
                Ok(()) => return,
                Err(e) => e.0,
            },
            None => (name, bytes, tag),
        };
        drop(tx);
        cache.write_behind(&job.0, &job.1, &job.2);
    }
}

/// Starts the writer thread of `cache`; `None` (logged) when no thread can be started.
fn start(cache: &Arc<NodeCache>) -> Option<Sender<Job>> {
    let (tx, rx) = channel::<Job>();
    let weak: Weak<NodeCache> = Arc::downgrade(cache);
    let started = std::thread::Builder::new()
        .name("stoker-cache-w".into())
        .spawn(move || {
            while let Ok((name, bytes, tag)) = rx.recv() {
                let Some(cache) = weak.upgrade() else { return };
                cache.write_behind(&name, &bytes, &tag);
            }
        });
    match started {
        Ok(_) => Some(tx),
        Err(e) => {
            tracing::warn!(error = %e, "node cache: no writer thread; files are written on the request threads");
            None
        }
    }
}

/// [`Writer::publish`] through an unnamed file; an `Unsupported` error when the folder (or
/// the kernel) has no unnamed files, or no `/proc` to name one through.
fn write_unnamed(dir: &Path, path: &Path, bytes: &[u8], tag: &Tag) -> std::io::Result<()> {
    let flags = OFlags::TMPFILE | OFlags::WRONLY | OFlags::CLOEXEC;
    let fd = rustix::fs::open(dir, flags, Mode::RUSR | Mode::WUSR).map_err(|e| match e {
        // Refused by the file system, or a kernel without O_TMPFILE (EISDIR).
        Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL => unsupported("O_TMPFILE", e),
        e => e.into(),
    })?;
    let mut file = fs::File::from(fd);
    file.write_all(bytes)?;
    integrity::record_tag(&file, path, tag)?;
    // linkat with AT_EMPTY_PATH needs CAP_DAC_READ_SEARCH; through /proc it needs nothing.
    let me = format!("/proc/self/fd/{}", file.as_raw_fd());
    let link = || rustix::fs::linkat(CWD, me.as_str(), CWD, path, AtFlags::SYMLINK_FOLLOW);
    match link() {
        Err(Errno::EXIST) => {
            fs::remove_file(path)?;
            link()?;
        }
        Err(Errno::NOENT) if !Path::new(&me).exists() => {
            return Err(unsupported("/proc", Errno::NOENT))
        }
        got => got?,
    }
    Ok(())
}

/// [`Writer::publish`] through the temporary file `temp`.
fn write_named(temp: &Path, path: &Path, bytes: &[u8], tag: &Tag) -> std::io::Result<()> {
    let mut file = stoker_private::replace_file(temp)?;
    file.write_all(bytes)?;
    integrity::record_tag(&file, path, tag)?;
    fs::rename(temp, path)
}

fn unsupported(what: &str, e: Errno) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::Unsupported, format!("{what}: {e}"))
}
