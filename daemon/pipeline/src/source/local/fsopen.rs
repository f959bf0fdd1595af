//! Opening a sample file the way a hostile filesystem cannot exploit: never blocking, regular
//! files only, optionally with no symlink anywhere in the path, with the client's filesystem
//! credentials, and checked against the identity the index recorded.
//!
//! # Design
//! - **Never blocks**: every open is `O_RDONLY | O_NONBLOCK | O_NOCTTY | O_CLOEXEC`, so a FIFO
//!   (or a device) swapped in for a sample returns at once; `fstat` on the opened fd then
//!   refuses anything but a regular file ([`OpenError::NotRegular`]). `O_NONBLOCK` is then
//!   cleared: read(2) ignores it on regular files, but io_uring would answer EAGAIN for data
//!   not yet in the page cache.
//! - **No symlinks** (datasets a client named by path under `access.dataset_roots`): opened
//!   with `openat2(RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS)`, so a component swapped for a
//!   symlink after the attach is refused ([`OpenError::Symlink`]); where the kernel has no
//!   `openat2` (before 5.6), `O_NOFOLLOW` guards the last component only.
//! - **Syscalls through rustix** (opens, `fcntl`, ids, `setgroups`), except `setfsuid` /
//!   `setfsgid`, which rustix has no call for: those two stay raw `libc::syscall`s.
//! - **The client's credentials**: [`assume`] sets the calling thread's fsuid, fsgid and
//!   supplementary groups (raw `setfsuid` / `setfsgid` / `setgroups` syscalls, which on Linux
//!   change the calling thread only; glibc's `setgroups` wrapper would change every thread;
//!   rustix's `set_thread_groups` is the raw one).
//!   The kernel then decides each open as it would for the client (modes, ACLs, every
//!   directory on the path). Threads remember what they assumed, so a worker switches only
//!   when the job it serves changes. Threads spawned while credentials are assumed inherit
//!   them (the pread reader's helpers).
//! - **Identity**: a file with an expected [`FileIdentity`] (a tar shard: device, inode, size,
//!   mtime at indexing) must still be that file, else [`OpenError::Changed`]: a shard replaced
//!   by rename is never read at the offsets of the old one. A job holds the shards it opened
//!   ([`OpenRules`], up to [`MAX_HELD_SHARDS`]) for its lifetime: a running job reads the
//!   files it indexed (a snapshot); a new job indexes again and reads the new files.
//!
//! # Limitations
//! - Assuming another uid needs `CAP_SETUID` and `CAP_SETGID` (a root daemon); without them
//!   [`assume`] fails and the attach is refused, naming the reason.
//! - A device node is opened (non-blocking) before `fstat` refuses it; opening some devices
//!   has side effects. Files named by a dataset are data, so this is accepted.
//! - A job with more than [`MAX_HELD_SHARDS`] shards opens the rest per use: if one of those
//!   is replaced while the job runs, its samples are `changed` bad samples (never the new
//!   bytes at the old offsets).

use std::cell::RefCell;
use std::collections::HashMap;
use std::fs::File;
use std::io;
use std::os::fd::OwnedFd;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use rustix::fs::{fcntl_getfl, fcntl_setfl, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;
use rustix::process::Gid;

/// Whose filesystem credentials open a job's files.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct Credentials {
    /// The filesystem uid.
    pub uid: u32,
    /// The filesystem gid.
    pub gid: u32,
    /// Supplementary groups.
    pub groups: Vec<u32>,
}

/// Which file a path must still name: what `fstat` said when it was indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct FileIdentity {
    /// The device holding the file.
    pub dev: u64,
    /// Its inode number on that device.
    pub ino: u64,
    /// Its size in bytes.
    pub size: u64,
    /// Its modification time, in nanoseconds since the Unix epoch.
    pub mtime_ns: i128,
}

impl FileIdentity {
    /// The identity `meta` (a `stat` of the file) gives.
    pub fn of(meta: &std::fs::Metadata) -> FileIdentity {
        FileIdentity {
            dev: meta.dev(),
            ino: meta.ino(),
            size: meta.size(),
            mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        }
    }
}

/// How a job's files are opened.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct OpenPolicy {
    /// Open as this client; `None`: with the daemon's own credentials.
    pub credentials: Option<Credentials>,
    /// Refuse a symlink anywhere in the path.
    pub no_symlinks: bool,
}

/// Shard fds one job holds open at most (its snapshot); past it shards are opened per use.
pub const MAX_HELD_SHARDS: usize = 1024;

/// How one job opens its files: the policy, the identity each tar shard must still have, and
/// the shards it holds open.
#[derive(Debug, Default)]
pub struct OpenRules {
    /// Unique per rules made (a job): what cached fds are keyed by.
    id: u64,
    /// Whose credentials open the files, and whether symlinks are refused.
    pub policy: OpenPolicy,
    /// Files that must still be the ones indexed (tar shards), by path.
    pub identities: HashMap<PathBuf, FileIdentity>,
    /// Shards opened (and checked against `identities`) by this job, kept for its lifetime:
    /// every worker reads a shard through the same fd, so a running job keeps reading the
    /// inode it indexed even after the path is replaced (a snapshot, never a mix).
    held: Mutex<HashMap<PathBuf, Arc<File>>>,
}

impl OpenRules {
    /// Rules opening under `policy`, holding the files of `identities` to those identities.
    pub fn new(policy: OpenPolicy, identities: HashMap<PathBuf, FileIdentity>) -> OpenRules {
        static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
        OpenRules {
            id: NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed),
            policy,
            identities,
            held: Mutex::default(),
        }
    }

    /// Tells these rules from any other made in this process (0: the default rules).
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Opens `path` under these rules (see [`open_sample`]); a tar shard through the fd this
    /// job holds for it.
    pub fn open(&self, path: &Path) -> Result<Arc<File>, OpenError> {
        let Some(expected) = self.identities.get(path) else {
            return open_sample(path, &self.policy, None).map(Arc::new);
        };
        let mut held = self.held.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(f) = held.get(path) {
            return Ok(Arc::clone(f));
        }
        let f = Arc::new(open_sample(path, &self.policy, Some(expected))?);
        if held.len() < MAX_HELD_SHARDS {
            held.insert(path.to_owned(), Arc::clone(&f));
        }
        Ok(f)
    }
}

/// Why a file could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    /// The open (or its `fstat`) failed.
    #[error("{0}")]
    Io(io::Error),
    /// Not a regular file (a FIFO, a device, a socket, a folder).
    #[error("not a regular file but a {kind}: refused without reading")]
    NotRegular {
        /// What it is instead (`FIFO`, `character device`, ...).
        kind: &'static str,
    },
    /// A symlink on the path, under a policy that refuses them.
    #[error("a symlink on the path: refused (datasets named by path are read without symlinks)")]
    Symlink,
    /// Another file than the one indexed now has the path.
    #[error("changed since it was indexed ({was:?} then, {now:?} now): refused")]
    Changed {
        /// The identity indexed.
        was: Box<FileIdentity>,
        /// The identity found now.
        now: Box<FileIdentity>,
    },
    /// The thread could not take the client's filesystem credentials.
    #[error("cannot take the client's credentials (uid {uid}, gid {gid}): {reason}")]
    Credentials {
        /// The uid to take.
        uid: u32,
        /// The gid to take.
        gid: u32,
        /// Which call failed, and why.
        reason: String,
    },
}

/// What kind of non-regular file this is, for messages.
fn file_kind(t: std::fs::FileType) -> &'static str {
    if t.is_fifo() {
        "FIFO"
    } else if t.is_char_device() {
        "character device"
    } else if t.is_block_device() {
        "block device"
    } else if t.is_socket() {
        "socket"
    } else if t.is_dir() {
        "directory"
    } else if t.is_symlink() {
        "symlink"
    } else {
        "special file"
    }
}

/// How every file is opened: read-only, never blocking, never a controlling terminal.
const OPEN_FLAGS: OFlags = OFlags::RDONLY
    .union(OFlags::NONBLOCK)
    .union(OFlags::NOCTTY)
    .union(OFlags::CLOEXEC);

/// Opens `path` for reading under `policy` (with the credentials the calling thread has
/// assumed), refusing anything but a regular file, and one that is not `expected`.
pub fn open_sample(
    path: &Path,
    policy: &OpenPolicy,
    expected: Option<&FileIdentity>,
) -> Result<File, OpenError> {
    let fd = if policy.no_symlinks {
        open_no_symlinks(path, OPEN_FLAGS)?
    } else {
        open_raw(path, OPEN_FLAGS)?
    };
    let file = File::from(fd);
    let meta = file.metadata().map_err(OpenError::Io)?;
    if !meta.file_type().is_file() {
        return Err(OpenError::NotRegular {
            kind: file_kind(meta.file_type()),
        });
    }
    if let Some(want) = expected {
        let now = FileIdentity::of(&meta);
        if now != *want {
            return Err(OpenError::Changed {
                was: Box::new(*want),
                now: Box::new(now),
            });
        }
    }
    clear_nonblock(&file)?;
    Ok(file)
}

/// Opens an input file of a tool (`stoker check`, `pack`, `decode`, `bench`) as a sample is
/// opened ([`open_sample`] with the process's own credentials): never blocking, regular files
/// only. The error says why (a FIFO or device: "not a regular file but a FIFO: refused
/// without reading"); the caller names the path.
pub fn open_input(path: &Path) -> io::Result<File> {
    open_sample(path, &OpenPolicy::default(), None).map_err(|e| match e {
        OpenError::Io(e) => e,
        e => io::Error::new(io::ErrorKind::InvalidInput, e.to_string()),
    })
}

/// Clears `O_NONBLOCK` on a regular file: read(2) ignores it, but io_uring would return
/// EAGAIN for data not yet in the page cache instead of reading it.
fn clear_nonblock(file: &File) -> Result<(), OpenError> {
    let flags = fcntl_getfl(file).map_err(errno)?;
    fcntl_setfl(file, flags - OFlags::NONBLOCK).map_err(errno)
}

fn errno(e: rustix::io::Errno) -> OpenError {
    OpenError::Io(io::Error::from(e))
}

/// Refuses a path holding a NUL byte (no syscall could name it) before rustix sees it.
fn check_path(path: &Path) -> Result<(), OpenError> {
    if path.as_os_str().as_bytes().contains(&0) {
        return Err(OpenError::Io(io::Error::new(
            io::ErrorKind::InvalidInput,
            "path holds a NUL byte",
        )));
    }
    Ok(())
}

fn open_raw(path: &Path, flags: OFlags) -> Result<OwnedFd, OpenError> {
    check_path(path)?;
    match rustix::fs::open(path, flags, Mode::empty()) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP) if flags.contains(OFlags::NOFOLLOW) => Err(OpenError::Symlink),
        Err(e) => Err(errno(e)),
    }
}

fn open_no_symlinks(path: &Path, flags: OFlags) -> Result<OwnedFd, OpenError> {
    check_path(path)?;
    let resolve = ResolveFlags::NO_SYMLINKS | ResolveFlags::NO_MAGICLINKS;
    match rustix::fs::openat2(CWD, path, flags, Mode::empty(), resolve) {
        Ok(fd) => Ok(fd),
        Err(Errno::LOOP) => Err(OpenError::Symlink),
        // No openat2 (Linux < 5.6, or a seccomp filter): guard the last component.
        Err(Errno::NOSYS | Errno::PERM) => open_raw(path, flags | OFlags::NOFOLLOW),
        Err(e) => Err(errno(e)),
    }
}

thread_local! {
    /// The credentials this thread has assumed (`None`: the daemon's own).
    static ASSUMED: RefCell<Option<Credentials>> = const { RefCell::new(None) };
}

/// The daemon's own credentials, read once (supplementary groups as the process has them).
fn own_credentials() -> &'static Credentials {
    static OWN: std::sync::OnceLock<Credentials> = std::sync::OnceLock::new();
    OWN.get_or_init(|| {
        let groups = rustix::process::getgroups().unwrap_or_default();
        Credentials {
            uid: rustix::process::geteuid().as_raw(),
            gid: rustix::process::getegid().as_raw(),
            groups: groups.into_iter().map(Gid::as_raw).collect(),
        }
    })
}

/// Sets the calling thread's filesystem credentials to `creds` (`None`: back to the daemon's
/// own). Does nothing when the thread holds them already.
pub fn assume(creds: Option<&Credentials>) -> Result<(), OpenError> {
    let same = ASSUMED.with(|a| a.borrow().as_ref() == creds);
    if same {
        return Ok(());
    }
    let target = creds.unwrap_or_else(|| own_credentials());
    let fail = |reason: String| OpenError::Credentials {
        uid: target.uid,
        gid: target.gid,
        reason,
    };
    let groups: Vec<Gid> = target.groups.iter().map(|&g| Gid::from_raw(g)).collect();
    // The raw setgroups: the calling thread only.
    if let Err(e) = rustix::thread::set_thread_groups(&groups) {
        // Without CAP_SETGID the daemon can only keep its own groups.
        if creds.is_some() || e != Errno::PERM {
            return Err(fail(format!("setgroups: {}", io::Error::from(e))));
        }
    }
    // setfsgid / setfsuid return the previous value and never fail visibly; calling them
    // again with -1 (an invalid id, changing nothing) returns the value in force.
    // rustix has no setfsuid / setfsgid.
    // SAFETY: the raw syscalls change only the calling thread's fs ids.
    let gid_now = unsafe {
        libc::syscall(libc::SYS_setfsgid, target.gid);
        libc::syscall(libc::SYS_setfsgid, u32::MAX)
    };
    // SAFETY: as above.
    let uid_now = unsafe {
        libc::syscall(libc::SYS_setfsuid, target.uid);
        libc::syscall(libc::SYS_setfsuid, u32::MAX)
    };
    if gid_now != i64::from(target.gid) || uid_now != i64::from(target.uid) {
        return Err(fail(format!(
            "the daemon lacks CAP_SETUID / CAP_SETGID (fsuid is {uid_now}, fsgid {gid_now})"
        )));
    }
    ASSUMED.with(|a| *a.borrow_mut() = creds.cloned());
    Ok(())
}

/// Runs `f` with the calling thread's filesystem credentials set to `creds`, then restores
/// the daemon's own.
pub fn as_client<T>(creds: Option<&Credentials>, f: impl FnOnce() -> T) -> Result<T, OpenError> {
    assume(creds)?;
    let out = f();
    // Going back to the daemon's own credentials is always permitted.
    let _ = assume(None);
    Ok(out)
}

/// Whether the client (credentials assumed by the calling thread) may read `path`: a folder
/// must be listable, a file readable. Refuses FIFOs and devices without blocking.
pub fn check_readable(path: &Path) -> Result<(), OpenError> {
    let fd = open_raw(path, OPEN_FLAGS)?;
    let meta = File::from(fd).metadata().map_err(OpenError::Io)?;
    if meta.is_dir() || meta.is_file() {
        Ok(())
    } else {
        Err(OpenError::NotRegular {
            kind: file_kind(meta.file_type()),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fifo_is_refused_without_blocking_and_a_file_opens() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("f.jpg");
        rustix::fs::mkfifoat(CWD, &fifo, Mode::from_raw_mode(0o644)).unwrap();
        let e = open_sample(&fifo, &OpenPolicy::default(), None).unwrap_err();
        assert!(matches!(e, OpenError::NotRegular { kind: "FIFO" }), "{e}");
        let file = dir.path().join("a.jpg");
        std::fs::write(&file, b"abc").unwrap();
        let f = open_sample(&file, &OpenPolicy::default(), None).unwrap();
        let flags = fcntl_getfl(&f).unwrap();
        assert!(
            !flags.contains(OFlags::NONBLOCK),
            "O_NONBLOCK is cleared after the check"
        );
        let id = FileIdentity::of(&f.metadata().unwrap());
        open_sample(&file, &OpenPolicy::default(), Some(&id)).unwrap();
        let other = dir.path().join("b.jpg");
        std::fs::write(&other, b"abcd").unwrap();
        std::fs::rename(&other, &file).unwrap();
        let e = open_sample(&file, &OpenPolicy::default(), Some(&id)).unwrap_err();
        assert!(matches!(e, OpenError::Changed { .. }), "{e}");
    }

    #[test]
    fn symlinks_are_refused_when_the_policy_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.jpg");
        std::fs::write(&file, b"abc").unwrap();
        let link = dir.path().join("l.jpg");
        std::os::unix::fs::symlink(&file, &link).unwrap();
        let strict = OpenPolicy {
            no_symlinks: true,
            ..OpenPolicy::default()
        };
        open_sample(&link, &OpenPolicy::default(), None).unwrap();
        let e = open_sample(&link, &strict, None).unwrap_err();
        assert!(matches!(e, OpenError::Symlink), "{e}");
        open_sample(&file.canonicalize().unwrap(), &strict, None).unwrap();
    }
}
