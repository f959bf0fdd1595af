//! Why a read, or the reader itself, failed: [`ReadError`], and [`SetupError`] for io_uring.

use std::io;
use std::path::{Path, PathBuf};

use crate::source::local::fsopen::OpenError;

/// Why a read, or the reader itself, failed.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// io_uring could not be set up (the pread reader serves instead where allowed).
    #[error("io_uring setup failed: {0}")]
    Setup(#[from] SetupError),
    /// The file does not exist (any more).
    #[error("{path}: not found")]
    NotFound {
        /// The file.
        path: PathBuf,
    },
    /// The file is not readable with the credentials it was opened under.
    #[error("{path}: permission denied")]
    Permission {
        /// The file.
        path: PathBuf,
    },
    /// The file ended before the indexed range did.
    #[error(
        "{path}: file shorter than indexed (wanted {want} bytes at offset {offset}, got {got})"
    )]
    ShortRead {
        /// The file.
        path: PathBuf,
        /// Byte offset of the read.
        offset: u64,
        /// Bytes asked for.
        want: u64,
        /// Bytes there were.
        got: u64,
    },
    /// Any other error of the open or the read.
    #[error("{path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The error.
        source: io::Error,
    },
    /// Not a regular file: refused without reading.
    #[error("{path}: {source}")]
    NotRegular {
        /// The file.
        path: PathBuf,
        /// The open's refusal.
        source: OpenError,
    },
    /// A symlink on the path, refused by the job's open policy.
    #[error("{path}: {source}")]
    Symlink {
        /// The file.
        path: PathBuf,
        /// The open's refusal.
        source: OpenError,
    },
    /// Another file than the one indexed now has the path.
    #[error("{path}: {source}")]
    Changed {
        /// The file.
        path: PathBuf,
        /// The open's refusal.
        source: OpenError,
    },
    /// An object whose server copy is not the one indexed: another ETag or size (replaced
    /// since it was listed), or a body longer than listed. Nothing of it is kept.
    #[error("{path}: {detail}")]
    ObjectChanged {
        /// The object's URL.
        path: PathBuf,
        /// What the server answered, and what the index said.
        detail: String,
    },
    /// The worker could not take the client's credentials to open it.
    #[error("{path}: {source}")]
    Credentials {
        /// The file.
        path: PathBuf,
        /// The open's refusal.
        source: OpenError,
    },
}

/// Why io_uring could not be set up.
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// The kernel was built without io_uring.
    #[error("the kernel has no io_uring (ENOSYS)")]
    NoIoUring,
    /// seccomp or the `kernel.io_uring_disabled` sysctl forbids it.
    #[error("io_uring is not permitted (EPERM: seccomp, or kernel.io_uring_disabled={sysctl})")]
    NotPermitted {
        /// The sysctl's value as read (`unknown` where it cannot be read).
        sysctl: String,
    },
    /// Another error of the ring's creation.
    #[error("{0}")]
    Io(io::Error),
    /// The ring's opcodes could not be probed.
    #[error("cannot probe io_uring opcodes: {0}")]
    Probe(io::Error),
    /// The kernel's io_uring is older than IORING_OP_READ.
    #[error("the kernel's io_uring lacks IORING_OP_READ (needs Linux 5.6)")]
    NoRead,
}

impl ReadError {
    /// A short code for metrics and per-sample status.
    pub fn reason(&self) -> &'static str {
        match self {
            ReadError::Setup(_) => "setup",
            ReadError::NotFound { .. } => "not_found",
            ReadError::Permission { .. } => "permission",
            ReadError::ShortRead { .. } => "short_read",
            ReadError::Io { .. } => "io",
            ReadError::NotRegular { .. } => "not_regular",
            ReadError::Symlink { .. } => "symlink",
            ReadError::Changed { .. } | ReadError::ObjectChanged { .. } => "changed",
            ReadError::Credentials { .. } => "credentials",
        }
    }

    pub(super) fn from_open(path: &Path, e: OpenError) -> ReadError {
        let path = path.to_owned();
        match e {
            OpenError::Io(e) => ReadError::from_io(&path, e),
            e @ OpenError::NotRegular { .. } => ReadError::NotRegular { path, source: e },
            e @ OpenError::Symlink => ReadError::Symlink { path, source: e },
            e @ OpenError::Changed { .. } => ReadError::Changed { path, source: e },
            e @ OpenError::Credentials { .. } => ReadError::Credentials { path, source: e },
        }
    }

    pub(super) fn from_io(path: &Path, e: io::Error) -> ReadError {
        match e.kind() {
            io::ErrorKind::NotFound => ReadError::NotFound {
                path: path.to_owned(),
            },
            io::ErrorKind::PermissionDenied => ReadError::Permission {
                path: path.to_owned(),
            },
            _ => ReadError::Io {
                path: path.to_owned(),
                source: e,
            },
        }
    }
}

pub(super) fn setup_error(e: io::Error) -> ReadError {
    let why = match e.raw_os_error() {
        Some(libc::ENOSYS) => SetupError::NoIoUring,
        Some(libc::EPERM) => {
            let sysctl = std::fs::read_to_string("/proc/sys/kernel/io_uring_disabled")
                .map(|s| s.trim().to_string())
                .unwrap_or_else(|_| "unknown".into());
            SetupError::NotPermitted { sysctl }
        }
        _ => SetupError::Io(e),
    };
    ReadError::Setup(why)
}
