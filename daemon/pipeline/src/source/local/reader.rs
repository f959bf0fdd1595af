//! Batched reads of sample bytes: io_uring, with a `pread` fallback.
//!
//! [`Reader::read_batch`] takes a batch of (path, offset, len) requests of local files and
//! fills one caller-owned buffer per request (`crate::source::read_batch` puts object storage
//! in front of it; this room knows nothing of it). A failed request (missing file, permission, a file shorter
//! than indexed) is that request's error; the rest of the batch still succeeds.
//!
//! # Design
//! - **io_uring**: files are opened (O_RDONLY|O_CLOEXEC), then every read of the batch is
//!   queued and submitted together, up to `queue_depth` in flight per `io_uring_enter`;
//!   completions are reaped as they come and the freed slots refilled. A short read resubmits
//!   the remainder; a read returning 0 before the end is "file shorter than indexed";
//!   EINTR/EAGAIN resubmit.
//! - Files read at a nonzero offset (tar shards, read many times) keep their fds open in an LRU
//!   of [`FD_CACHE_CAPACITY`] entries; whole files (offset 0: one image per file) are opened
//!   per read and closed after the batch.
//! - Buffers are the caller's `Vec<u8>`s, sized to each request's length: their capacity is
//!   reused, so a steady state allocates nothing per batch beyond the returned result vector.
//!   The io_uring reader reads into spare capacity and sets the length to what the kernel
//!   wrote, skipping the zero-fill that the pread reader (which needs `&mut [u8]`) does.
//! - Registered (fixed) buffers are not used: the buffers belong to the caller and change size
//!   with every sample, so registering them would mean copying out of a registered pool; with
//!   the page cache warm the copy would cost what registration saves. Not measured.
//! - **pread**: chosen at start when io_uring cannot be set up (ENOSYS, EPERM from seccomp or
//!   `kernel.io_uring_disabled`), or forced with `STOKER_READER=pread`; logged with the reason.
//!   A batch is split over a few scoped worker threads (std only), each doing blocking
//!   `pread`s. Spawning them per batch costs tens of microseconds, small beside the reads, and
//!   keeps the borrowed buffers safe without unsafe code.
//!
//! - Every open goes through [`crate::source::local::fsopen::open_sample`] under the job's
//!   [`OpenRules`](crate::source::local::fsopen::OpenRules) (set with [`Reader::set_rules`]): non-blocking,
//!   regular files only, the client's credentials, no symlinks where the job says so, and a
//!   tar shard must still be the indexed inode. Cached fds are keyed by (rules, path), so
//!   one job never reads through an fd opened for another (or with other credentials).
//!
//! # Limitations
//! - Opens are synchronous (one `openat` each); on cold network filesystems they dominate. The
//!   io_uring `openat` opcode would overlap them.
//! - One request reads at most `usize::MAX` bytes; a single io_uring read op is capped at 1 GiB
//!   and longer requests continue in further ops.

use std::collections::{HashMap, VecDeque};
use std::fs::File;
use std::io;
use std::os::unix::fs::FileExt;
use std::os::unix::io::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use io_uring::{opcode, squeue, types, IoUring, Probe};

use crate::source::local::fsopen::{self, OpenError, OpenRules};

mod error;
use error::setup_error;
pub use error::{ReadError, SetupError};

/// Open fds kept for files read at an offset (tar shards).
pub const FD_CACHE_CAPACITY: usize = 128;

/// The most bytes one io_uring read op asks for.
const MAX_OP_LEN: u64 = 1 << 30;

/// Which reader to use (also the config file's `pipeline.reader`: `auto`, `io_uring`,
/// `pread`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReaderKind {
    /// io_uring when the kernel allows it, else pread (logged).
    #[default]
    Auto,
    /// io_uring or an error.
    IoUring,
    /// The pread thread pool.
    Pread,
}

/// One read: `len` bytes at `offset` of `path`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReadRequest<'a> {
    /// The local file, or an object's URL (its name in errors).
    pub path: &'a Path,
    /// Byte offset of the read in the file.
    pub offset: u64,
    /// Bytes to read.
    pub len: u64,
    /// The file id of the object holding the bytes, in its dataset's object table
    /// (`source::read_batch` reads it from there); `None`: `path` is a local file.
    pub object: Option<u32>,
}

/// Whether io_uring can be used here, and if not, why.
pub fn probe_io_uring() -> Result<(), ReadError> {
    UringReader::new(2).map(|_| ())
}

/// Reads batches of requests into caller-owned buffers.
pub struct Reader {
    backend: Backend,
    /// How files are opened (the job being served); see [`Reader::set_rules`].
    rules: Arc<OpenRules>,
    /// Why the calling thread could not take the rules' credentials: every read fails so.
    rules_error: Option<String>,
}

enum Backend {
    Uring(Box<UringReader>),
    Pread(PreadReader),
}

impl std::fmt::Debug for Reader {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reader")
            .field("kind", &self.kind())
            .finish()
    }
}

impl Reader {
    /// A reader of `kind` keeping up to `queue_depth` reads in flight (clamped to 1..=4096).
    /// `STOKER_READER=pread` in the environment forces the pread reader.
    pub fn new(kind: ReaderKind, queue_depth: usize) -> Result<Reader, ReadError> {
        let depth = queue_depth.clamp(1, 4096);
        let kind = effective_kind(kind, std::env::var("STOKER_READER").ok().as_deref());
        let backend = match kind {
            ReaderKind::Pread => Backend::Pread(PreadReader::new()),
            ReaderKind::IoUring => Backend::Uring(Box::new(UringReader::new(depth)?)),
            ReaderKind::Auto => match UringReader::new(depth) {
                Ok(u) => Backend::Uring(Box::new(u)),
                Err(e) => {
                    tracing::warn!(reason = %e, "io_uring unavailable; falling back to the pread reader");
                    Backend::Pread(PreadReader::new())
                }
            },
        };
        Ok(Reader::from_backend(backend))
    }

    fn from_backend(backend: Backend) -> Reader {
        Reader {
            backend,
            rules: Arc::default(),
            rules_error: None,
        }
    }

    /// Opens files from now on under `rules` (the job about to be read), assuming its
    /// credentials on the calling thread; does nothing when they are in force already.
    pub fn set_rules(&mut self, rules: &Arc<OpenRules>) {
        if Arc::ptr_eq(&self.rules, rules) {
            return;
        }
        self.rules_error = fsopen::assume(rules.policy.credentials.as_ref())
            .err()
            .map(|e| e.to_string());
        self.rules = Arc::clone(rules);
    }

    /// "io_uring" or "pread".
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Uring(_) => "io_uring",
            Backend::Pread(_) => "pread",
        }
    }

    /// Reads every request into the buffer of the same index (resized to the request's
    /// length; on error, truncated to the bytes read). Returns one result per request.
    ///
    /// # Panics
    /// If `bufs` is shorter than `reqs`.
    pub fn read_batch(
        &mut self,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
    ) -> Vec<Result<(), ReadError>> {
        assert!(
            bufs.len() >= reqs.len(),
            "read_batch: {} buffers for {} requests",
            bufs.len(),
            reqs.len()
        );
        let bufs = &mut bufs[..reqs.len()];
        if let Some(why) = &self.rules_error {
            return reqs
                .iter()
                .map(|r| {
                    Err(ReadError::Credentials {
                        path: r.path.to_owned(),
                        source: OpenError::Io(io::Error::other(why.clone())),
                    })
                })
                .collect();
        }
        let rules = &self.rules;
        match &mut self.backend {
            Backend::Uring(u) => u.read_batch(reqs, bufs, rules),
            Backend::Pread(p) => p.read_batch(reqs, bufs, rules),
        }
    }
}

/// The kind to use, given the requested one and the value of `STOKER_READER`.
fn effective_kind(kind: ReaderKind, env: Option<&str>) -> ReaderKind {
    match env {
        Some("pread") => {
            tracing::warn!("STOKER_READER=pread: using the pread reader");
            ReaderKind::Pread
        }
        Some("io_uring") => ReaderKind::IoUring,
        Some("auto") | Some("") | None => kind,
        Some(other) => {
            tracing::warn!(value = other, "ignoring unknown STOKER_READER value");
            kind
        }
    }
}

/// A request's length as a buffer length; `Err` when it cannot be one.
fn buffer_len(req: &ReadRequest<'_>) -> Result<usize, ReadError> {
    usize::try_from(req.len)
        .ok()
        .filter(|&l| l <= isize::MAX as usize)
        .ok_or_else(|| ReadError::Io {
            path: req.path.to_owned(),
            source: io::Error::new(io::ErrorKind::InvalidInput, "request too large"),
        })
}

/// Sizes `buf` for a request, zero-filling it.
fn size_buffer(req: &ReadRequest<'_>, buf: &mut Vec<u8>) -> Result<(), ReadError> {
    let len = buffer_len(req)?;
    buf.clear();
    buf.resize(len, 0);
    Ok(())
}

/// Open fds of files read at an offset, least recently used evicted first. Keyed by the
/// rules they were opened under (one job's) and the path: a job reads its shards through fds
/// opened under its own credentials and checked against its own index.
struct FdCache {
    files: HashMap<(u64, PathBuf), (Arc<File>, u64)>,
    tick: u64,
}

impl FdCache {
    fn get_or_open(
        &mut self,
        path: &Path,
        offset: u64,
        rules: &Arc<OpenRules>,
    ) -> Result<Arc<File>, OpenError> {
        self.tick += 1;
        let key = (rules.id(), path.to_owned());
        if let Some((f, used)) = self.files.get_mut(&key) {
            *used = self.tick;
            return Ok(f.clone());
        }
        let f = rules.open(path)?;
        if offset > 0 {
            if self.files.len() >= FD_CACHE_CAPACITY {
                let oldest = self
                    .files
                    .iter()
                    .min_by_key(|(_, (_, used))| *used)
                    .map(|(p, _)| p.clone());
                if let Some(p) = oldest {
                    // In-flight reads hold their own Arc: evicting never closes a busy fd.
                    self.files.remove(&p);
                }
            }
            self.files.insert(key, (f.clone(), self.tick));
        }
        Ok(f)
    }
}

/// Per-request progress within one batch.
struct Pending {
    file: Option<Arc<File>>,
    done: u64,
    result: Option<Result<(), ReadError>>,
}

/// io_uring reads. Field order is drop order: the ring goes before the fds it may reference.
struct UringReader {
    ring: IoUring,
    depth: usize,
    fds: FdCache,
    pending: Vec<Pending>,
    ready: VecDeque<usize>,
    /// The most bytes one op asks for ([`MAX_OP_LEN`]; tests lower it to split reads).
    max_op_len: u64,
    /// Punt every read to io_uring's worker threads (IOSQE_ASYNC) instead of copying from
    /// the page cache inline in `io_uring_enter`.
    async_punt: bool,
}

impl UringReader {
    fn new(depth: usize) -> Result<UringReader, ReadError> {
        let entries = u32::try_from(depth.next_power_of_two())
            .map_err(|e| setup_error(io::Error::other(e)))?;
        let ring = IoUring::new(entries).map_err(setup_error)?;
        let mut probe = Probe::new();
        ring.submitter()
            .register_probe(&mut probe)
            .map_err(|e| ReadError::Setup(SetupError::Probe(e)))?;
        if !probe.is_supported(opcode::Read::CODE) {
            return Err(ReadError::Setup(SetupError::NoRead));
        }
        // Never more in flight than the completion queue holds.
        let depth = depth.min(ring.params().cq_entries() as usize);
        Ok(UringReader {
            ring,
            depth,
            fds: FdCache {
                files: HashMap::new(),
                tick: 0,
            },
            pending: Vec::new(),
            ready: VecDeque::new(),
            max_op_len: MAX_OP_LEN,
            async_punt: false,
        })
    }

    fn read_batch(
        &mut self,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
        rules: &Arc<OpenRules>,
    ) -> Vec<Result<(), ReadError>> {
        self.prepare(reqs, bufs, rules);
        let mut inflight = InFlight {
            ring: &mut self.ring,
            count: 0,
        };
        loop {
            while inflight.count < self.depth {
                let Some(i) = self.ready.pop_front() else {
                    break;
                };
                let (req, p) = (&reqs[i], &self.pending[i]);
                let Some(file) = &p.file else { continue };
                // At most MAX_OP_LEN (1 GiB), a u32.
                #[allow(clippy::cast_possible_truncation)]
                let op_len = (req.len - p.done).min(self.max_op_len) as u32;
                // `done < len <= capacity` (reserved by `prepare`), so this stays in the allocation.
                #[allow(clippy::cast_possible_truncation)]
                let ptr = bufs[i].as_mut_ptr().wrapping_add(p.done as usize);
                let entry = opcode::Read::new(types::Fd(file.as_raw_fd()), ptr, op_len)
                    .offset(req.offset + p.done)
                    .build()
                    .user_data(i as u64);
                let entry = if self.async_punt {
                    entry.flags(squeue::Flags::ASYNC)
                } else {
                    entry
                };
                // SAFETY: the allocation of `bufs[i]` (borrowed mutably for this whole call and
                // not resized while ops are out) and the fd (held by `pending[i].file`) outlive the op: this
                // function reaps every op before returning, and `InFlight`'s Drop reaps them
                // on unwinding. The SQ has room: at most `depth <= cq_entries` ops are out and
                // each push is submitted before the next loop turn.
                let pushed = unsafe { inflight.ring.submission().push(&entry) };
                if pushed.is_err() {
                    self.ready.push_front(i);
                    break;
                }
                inflight.count += 1;
            }
            if inflight.count == 0 {
                break;
            }
            if let Err(e) = inflight.ring.submit_and_wait(1) {
                match e.raw_os_error() {
                    Some(libc::EINTR) | Some(libc::EAGAIN) | Some(libc::EBUSY) => {}
                    _ => {
                        tracing::warn!(error = %e, "io_uring_enter failed; retrying");
                        std::thread::yield_now();
                    }
                }
            }
            let mut cq = inflight.ring.completion();
            cq.sync();
            let mut reaped = 0;
            for cqe in &mut cq {
                reaped += 1;
                // The request index this reader put in `user_data`.
                #[allow(clippy::cast_possible_truncation)]
                let i = cqe.user_data() as usize;
                let more = settle(&reqs[i], &mut self.pending[i], cqe.result());
                if more {
                    self.ready.push_back(i);
                }
            }
            drop(cq);
            inflight.count -= reaped;
        }
        drop(inflight);
        // SAFETY: `inflight` was dropped, which reaps every op still out.
        unsafe { self.finish(bufs) }
    }

    /// Opens each request's file and makes room in its buffer: `pending` gets one entry per
    /// request, `ready` the requests to submit (the others are settled already).
    fn prepare(&mut self, reqs: &[ReadRequest<'_>], bufs: &mut [Vec<u8>], rules: &Arc<OpenRules>) {
        self.pending.clear();
        self.ready.clear();
        for (i, (req, buf)) in reqs.iter().zip(bufs.iter_mut()).enumerate() {
            let mut p = Pending {
                file: None,
                done: 0,
                result: None,
            };
            // Empty, with room for the request: the kernel fills the spare capacity and the
            // length is set to what it wrote, so nothing is zero-filled first.
            buf.clear();
            match buffer_len(req).map(|len| buf.reserve(len)) {
                Err(e) => p.result = Some(Err(e)),
                Ok(()) if req.len == 0 => p.result = Some(Ok(())),
                Ok(()) => match self.fds.get_or_open(req.path, req.offset, rules) {
                    Ok(f) => {
                        p.file = Some(f);
                        self.ready.push_back(i);
                    }
                    Err(e) => p.result = Some(Err(ReadError::from_open(req.path, e))),
                },
            }
            self.pending.push(p);
        }
    }

    /// Sets each buffer's length to what was read into it; returns the results.
    ///
    /// # Safety
    /// Every op of the batch must have been reaped (no kernel write is still pending).
    // `done <= capacity`, a usize.
    #[allow(clippy::cast_possible_truncation)]
    unsafe fn finish(&mut self, bufs: &mut [Vec<u8>]) -> Vec<Result<(), ReadError>> {
        let mut out = Vec::with_capacity(self.pending.len());
        for (p, buf) in self.pending.iter_mut().zip(bufs.iter_mut()) {
            let r = p.result.take().unwrap_or(Ok(()));
            debug_assert!(p.done as usize <= buf.capacity());
            // SAFETY: every op was reaped (the caller's promise); the kernel wrote bytes
            // `0..done` of the buffer (successful completions advance `done` by exactly what was
            // written), and `done <= capacity` as reserved by `prepare`.
            unsafe { buf.set_len(p.done as usize) };
            p.file = None;
            out.push(r);
        }
        out
    }
}

/// Records one completion (`res`: bytes read, or a negated errno) of `req`'s read; true when
/// the read must be submitted again (interrupted, or short of the requested length).
fn settle(req: &ReadRequest<'_>, p: &mut Pending, res: i32) -> bool {
    if res < 0 {
        match -res {
            libc::EINTR | libc::EAGAIN => return true,
            errno => {
                p.result = Some(Err(ReadError::from_io(
                    req.path,
                    io::Error::from_raw_os_error(errno),
                )))
            }
        }
    } else if res == 0 {
        p.result = Some(Err(ReadError::ShortRead {
            path: req.path.to_owned(),
            offset: req.offset,
            want: req.len,
            got: p.done,
        }));
    } else {
        p.done += u64::from(res.unsigned_abs());
        if p.done < req.len {
            return true;
        }
        p.result = Some(Ok(()));
    }
    false
}

/// Counts ops the kernel may still write for; on drop (also when unwinding) waits for them, so
/// no buffer is freed under a pending read.
struct InFlight<'r> {
    ring: &'r mut IoUring,
    count: usize,
}

impl Drop for InFlight<'_> {
    fn drop(&mut self) {
        let mut failures = 0u32;
        while self.count > 0 {
            if self.ring.submit_and_wait(1).is_err() {
                failures += 1;
                if failures > 10_000 {
                    // Returning would free buffers the kernel still writes into.
                    eprintln!("stoker reader: cannot reap io_uring completions; aborting");
                    std::process::abort();
                }
            }
            let n = self.ring.completion().count();
            self.count = self.count.saturating_sub(n);
        }
    }
}

/// Blocking preads on a few scoped threads per batch.
struct PreadReader {
    threads: usize,
}

impl PreadReader {
    fn new() -> PreadReader {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        PreadReader {
            threads: cores.clamp(2, 4),
        }
    }

    fn read_one(
        req: &ReadRequest<'_>,
        buf: &mut Vec<u8>,
        rules: &OpenRules,
    ) -> Result<(), ReadError> {
        size_buffer(req, buf)?;
        if req.len == 0 {
            return Ok(());
        }
        let file = rules
            .open(req.path)
            .map_err(|e| ReadError::from_open(req.path, e))?;
        let mut done = 0usize;
        while done < buf.len() {
            match file.read_at(&mut buf[done..], req.offset + done as u64) {
                Ok(0) => {
                    buf.truncate(done);
                    return Err(ReadError::ShortRead {
                        path: req.path.to_owned(),
                        offset: req.offset,
                        want: req.len,
                        got: done as u64,
                    });
                }
                Ok(n) => done += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => std::thread::yield_now(),
                Err(e) => {
                    buf.truncate(done);
                    return Err(ReadError::from_io(req.path, e));
                }
            }
        }
        Ok(())
    }

    fn read_batch(
        &mut self,
        reqs: &[ReadRequest<'_>],
        bufs: &mut [Vec<u8>],
        rules: &OpenRules,
    ) -> Vec<Result<(), ReadError>> {
        let chunk = reqs.len().div_ceil(self.threads).max(1);
        if reqs.len() <= 1 {
            return reqs
                .iter()
                .zip(bufs.iter_mut())
                .map(|(r, b)| Self::read_one(r, b, rules))
                .collect();
        }
        std::thread::scope(|s| {
            let handles: Vec<_> = reqs
                .chunks(chunk)
                .zip(bufs.chunks_mut(chunk))
                .map(|(rs, bs)| {
                    s.spawn(move || {
                        rs.iter()
                            .zip(bs.iter_mut())
                            .map(|(r, b)| Self::read_one(r, b, rules))
                            .collect::<Vec<_>>()
                    })
                })
                .collect();
            handles
                .into_iter()
                .flat_map(|h| match h.join() {
                    Ok(v) => v,
                    Err(p) => std::panic::resume_unwind(p),
                })
                .collect()
        })
    }
}

#[cfg(test)]
mod tests;
