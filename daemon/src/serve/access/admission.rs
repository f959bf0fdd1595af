//! One attach's access decision, and the dataset opened with it.
//!
//! # Design
//! [`AccessPolicy::admit`](super::AccessPolicy::admit) answers every question access
//! has about a dataset a client names at once: the path to open (a registered name resolved,
//! a path checked against the roots), how its files are read (the client's credentials or the
//! daemon's, symlinks followed or not), and the roots every file of the opened dataset must
//! resolve under. The registry holds that one [`Admission`]: a job's first rank opens the
//! dataset with it ([`Admission::open`]), the other ranks are compared with its policy.
//!
//! # Limitations
//! The files of a dataset are checked against the roots once, when it is opened; a file
//! swapped for a symlink later is refused by the open rules (no symlink followed), not here.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use super::{root_list, AccessError};
use stoker_pipeline::source::index::{Dataset, DatasetError, OpenOptions};
use stoker_pipeline::source::local::fsopen::{self, OpenPolicy};

/// What access decided for one dataset a client named.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Admission {
    /// The name the client gave (for messages).
    name: String,
    /// The path (or `s3://` URL) to open.
    pub path: PathBuf,
    /// The credentials and symlink rule the dataset's files are read with.
    pub policy: OpenPolicy,
    /// The roots (as configured, canonical) every file of the dataset must resolve under;
    /// empty when no such rule applies (registered datasets, object storage, no roots).
    roots: Vec<(PathBuf, PathBuf)>,
}

impl Admission {
    pub(super) fn new(
        name: &str,
        path: PathBuf,
        policy: OpenPolicy,
        roots: Vec<(PathBuf, PathBuf)>,
    ) -> Admission {
        Admission {
            name: name.to_owned(),
            path,
            policy,
            roots,
        }
    }

    /// Opens (indexes) the dataset under the decision's policy, then checks that every file
    /// it reads resolves under the roots (a file list or a symlink could point anywhere).
    pub(crate) fn open(&self, opts: &OpenOptions) -> Result<Dataset, OpenDatasetError> {
        let dataset = open_dataset(&self.name, &self.path, opts, &self.policy)?;
        // Resolved as the client, as they will be read (a 0700 folder of its own included).
        let creds = self.policy.credentials.as_ref();
        fsopen::as_client(creds, || self.check_files(&dataset))
            .map_err(|e| {
                OpenDatasetError::Access(AccessError::Dataset(format!(
                    "dataset {:?}: {e}",
                    self.name
                )))
            })?
            .map_err(OpenDatasetError::Access)?;
        Ok(dataset)
    }

    fn check_files(&self, dataset: &Dataset) -> Result<(), AccessError> {
        if self.roots.is_empty() {
            return Ok(());
        }
        let name = &self.name;
        let mut last: Option<&Path> = None;
        for i in 0..dataset.len() {
            let sample = dataset.sample(i);
            let file = sample.path;
            if last == Some(file)
                || sample.storage == stoker_pipeline::source::index::Storage::Object
            {
                continue; // samples of one tar shard; a file list's objects
            }
            last = Some(file);
            let canonical = std::fs::canonicalize(file).map_err(|e| {
                AccessError::Dataset(format!(
                    "dataset {name:?}: cannot resolve its file {}: {e}",
                    file.display()
                ))
            })?;
            if !self.roots.iter().any(|(_, c)| canonical.starts_with(c)) {
                return Err(AccessError::Dataset(format!(
                    "dataset {name:?}: its file {} resolves to {}, outside the allowed roots {:?}",
                    file.display(),
                    canonical.display(),
                    root_list(&self.roots)
                )));
            }
        }
        Ok(())
    }
}

/// Opens (indexes) the dataset `name` at `path` under `policy`: with the client's credentials
/// when it has them, and then checks that the client may list every folder and read every
/// file list and shard the index was made from (an index loaded from the cache was made by
/// someone else). A refusal for lack of permission is [`AccessError::Dataset`].
fn open_dataset(
    name: &str,
    path: &Path,
    opts: &OpenOptions,
    policy: &OpenPolicy,
) -> Result<Dataset, OpenDatasetError> {
    let creds = policy.credentials.as_ref();
    let denied = |what: String| {
        let uid = creds.map_or(String::new(), |c| format!("uid {} ", c.uid));
        OpenDatasetError::Access(AccessError::Dataset(format!(
            "dataset {name:?}: {uid}may not read it: {what}"
        )))
    };
    // A file list's s3:// entries are read with the daemon's credentials: allowed exactly
    // where the client could name those URLs itself (registered dataset, daemon's uid, root).
    let opts = &OpenOptions {
        s3_entries: creds.is_none(),
        ..opts.clone()
    };
    let opened = fsopen::as_client(creds, || Dataset::open(path, opts))
        .map_err(|e| denied(e.to_string()))?;
    let dataset = match opened {
        Ok(d) => d,
        Err(e) if is_permission(&e) => return Err(denied(e.to_string())),
        Err(e) => return Err(OpenDatasetError::Dataset(e)),
    };
    if creds.is_some() {
        // The first file the client may not read, and why.
        let check = || -> Result<(), (&Path, fsopen::OpenError)> {
            for p in dataset.indexed_paths() {
                fsopen::check_readable(p).map_err(|e| (p, e))?;
            }
            Ok(())
        };
        fsopen::as_client(creds, check)
            .map_err(|e| denied(e.to_string()))?
            .map_err(|(p, e)| denied(format!("{}: {e}", p.display())))?;
    }
    Ok(dataset)
}

/// Whether indexing failed for lack of permission.
fn is_permission(e: &DatasetError) -> bool {
    let source = match e {
        DatasetError::UnreadableDir { source, .. } | DatasetError::Io { source, .. } => source,
        _ => return false,
    };
    source.kind() == std::io::ErrorKind::PermissionDenied
}

/// Why [`open_dataset`] failed.
#[derive(Debug, thiserror::Error)]
pub(crate) enum OpenDatasetError {
    /// The client may not read it.
    #[error("{0}")]
    Access(AccessError),
    /// It is no dataset (or cannot be indexed).
    #[error("{0}")]
    Dataset(DatasetError),
}
