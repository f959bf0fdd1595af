//! Why a dataset cannot be opened or indexed: [`DatasetError`].

use std::io;
use std::path::{Path, PathBuf};

/// Why a dataset cannot be opened. Each variant names the path and the reason.
#[derive(Debug, thiserror::Error)]
pub enum DatasetError {
    /// The path does not exist.
    #[error("dataset {path}: not found")]
    NotFound {
        /// The dataset's path (or the file of it that is missing).
        path: PathBuf,
    },
    /// The layout was recognised but holds no sample.
    #[error("dataset {path}: no samples ({reason})")]
    Empty {
        /// The dataset's path.
        path: PathBuf,
        /// What was looked for and not found.
        reason: String,
    },
    /// A file list line that is not `path<TAB>label`.
    #[error("file list {path}, line {line}: {reason}")]
    BadListLine {
        /// The file list.
        path: PathBuf,
        /// The line's number, from 1.
        line: usize,
        /// What is wrong with it.
        reason: String,
    },
    /// A tar shard whose headers cannot be walked.
    #[error("tar shard {path}, at byte {offset}: {reason}")]
    BadTar {
        /// The shard.
        path: PathBuf,
        /// Byte offset of the bad header in the shard.
        offset: u64,
        /// What is wrong with it.
        reason: String,
    },
    /// A folder of the dataset cannot be listed.
    #[error("cannot read directory {path}: {source}")]
    UnreadableDir {
        /// The folder.
        path: PathBuf,
        /// The listing's error.
        source: io::Error,
    },
    /// A file of the dataset cannot be read (or stat'ed).
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file.
        path: PathBuf,
        /// The read's error.
        source: io::Error,
    },
    /// The path is not the layout asked for or detected (e.g. a file list that is a folder).
    #[error("dataset {path}: {reason}")]
    WrongKind {
        /// The dataset's path.
        path: PathBuf,
        /// What it is and what was wanted.
        reason: String,
    },
    /// More files than a u32 file id can number.
    #[error("dataset {path}: more than {max} files", max = u32::MAX)]
    TooManyFiles {
        /// The dataset's path.
        path: PathBuf,
    },
    /// The folder walk hit a [`super::WalkLimits`] bound or a refused folder.
    #[error("dataset indexing stopped at {path}: {reason}")]
    WalkLimit {
        /// Where the walk stopped.
        path: PathBuf,
        /// Which limit, and its value.
        reason: String,
    },
    /// Object storage refused or failed a listing or a read of the dataset.
    #[error("dataset {path}: S3 error {code}: {reason}")]
    Remote {
        /// The dataset's `s3://` path.
        path: PathBuf,
        /// The S3 error code (`NoSuchBucket`, `AccessDenied`, ...).
        code: String,
        /// The service's message.
        reason: String,
    },
}

impl DatasetError {
    pub(super) fn io(path: &Path, source: io::Error) -> DatasetError {
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
