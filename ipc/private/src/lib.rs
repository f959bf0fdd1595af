//! Folders and files private to this process's uid: the one rule every cache (the dataset
//! index cache, the node cache of objects, the kernel cache) and the socket folder follow.
//!
//! A private folder is a real directory (not a symlink), owned by this process's effective
//! uid, that no other user may write to. [`ensure_dir`] creates a missing one (and its missing
//! parents) mode 0700 whatever the umask; an existing one of ours that others may only read
//! or enter is tightened to 0700 (what an older version left under the default umask); one
//! that another uid owns, or that others may write to, is refused with an error naming the
//! path, the reason and what to do. [`create_file`] makes a new file mode 0600.
//!
//! # Design
//! - Why refuse rather than repair a folder others may write to: they may already have put
//!   their own entries (an index, an object, a cubin, a socket) there, which we would then
//!   trust. A folder of ours they may only read exposes names and contents but plants
//!   nothing, so tightening it is safe.
//! - Only the folder itself is checked, not its parents: `$STOKER_CACHE_DIR` may live under
//!   a shared sticky `/tmp`.
//!
//! # Limitations
//! - The check and the later use are separate steps; they hold together because nobody but
//!   this uid (and root) may change a folder that passed.

#![forbid(unsafe_code)]

use std::fs::{self, DirBuilder, File, OpenOptions};
use std::io::{self, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

/// Mode of the folders made here.
const DIR_MODE: u32 = 0o700;
/// Mode of the files made here.
const FILE_MODE: u32 = 0o600;

/// Why a folder is not private.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Untrusted {
    /// The path is a symlink (never followed).
    #[error("it is a symlink")]
    Symlink,
    /// The path is a file or another non-directory.
    #[error("it is not a directory")]
    NotADirectory,
    /// Another uid owns the folder.
    #[error("it belongs to uid {owner}, not to this process's uid {ours}")]
    OwnedByAnother {
        /// The folder's owner.
        owner: u32,
        /// This process's effective uid.
        ours: u32,
    },
    /// Group or others may write to the folder.
    #[error("users other than its owner may write to it (mode {mode:03o})")]
    WritableByOthers {
        /// The folder's permission bits (`0o7777` of its mode).
        mode: u32,
    },
}

/// A folder that cannot be used as a private one.
#[derive(Debug, thiserror::Error)]
pub enum PrivateDirError {
    /// Creating, inspecting or tightening the folder failed.
    #[error("cannot create or inspect the folder {}: {source}", path.display())]
    Io {
        /// The folder.
        path: PathBuf,
        /// The OS error.
        source: io::Error,
    },
    /// The folder exists and is not private.
    #[error(
        "refusing the folder {}: {reason}; remove it (or name another folder) so that a \
         private one (mode 700) is made",
        path.display()
    )]
    Untrusted {
        /// The folder.
        path: PathBuf,
        /// Why it is refused.
        reason: Untrusted,
    },
}

impl PrivateDirError {
    /// Why the folder was refused, when it exists and is not private.
    pub fn untrusted(&self) -> Option<&Untrusted> {
        match self {
            PrivateDirError::Untrusted { reason, .. } => Some(reason),
            PrivateDirError::Io { .. } => None,
        }
    }
}

/// This process's effective uid.
pub fn euid() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// Makes `path` a private folder: creates it (and missing parents) mode 0700, tightens one of
/// ours to 0700, and refuses one that is a symlink, not a folder, another uid's, or writable
/// by others.
pub fn ensure_dir(path: &Path) -> Result<(), PrivateDirError> {
    let meta = create_dir(path)?;
    if meta.mode() & 0o077 != 0 {
        fs::set_permissions(path, fs::Permissions::from_mode(DIR_MODE)).map_err(|source| {
            PrivateDirError::Io {
                path: path.to_owned(),
                source,
            }
        })?;
    }
    Ok(())
}

/// Creates `path` (and missing parents) mode 0700 when missing, then [`check_dir`]s it; an
/// existing folder keeps its mode (a socket folder may be open to a group to read).
pub fn create_dir(path: &Path) -> Result<fs::Metadata, PrivateDirError> {
    DirBuilder::new()
        .recursive(true)
        .mode(DIR_MODE)
        .create(path)
        .map_err(|source| PrivateDirError::Io {
            path: path.to_owned(),
            source,
        })?;
    check_dir(path)
}

/// Checks that the existing `path` is a real folder owned by this uid that no other user may
/// write to; returns its metadata.
pub fn check_dir(path: &Path) -> Result<fs::Metadata, PrivateDirError> {
    let meta = fs::symlink_metadata(path).map_err(|source| PrivateDirError::Io {
        path: path.to_owned(),
        source,
    })?;
    let refuse = |reason| {
        Err(PrivateDirError::Untrusted {
            path: path.to_owned(),
            reason,
        })
    };
    let ours = euid();
    if meta.file_type().is_symlink() {
        refuse(Untrusted::Symlink)
    } else if !meta.is_dir() {
        refuse(Untrusted::NotADirectory)
    } else if meta.uid() != ours {
        refuse(Untrusted::OwnedByAnother {
            owner: meta.uid(),
            ours,
        })
    } else if meta.mode() & 0o022 != 0 {
        refuse(Untrusted::WritableByOthers {
            mode: meta.mode() & 0o7777,
        })
    } else {
        Ok(meta)
    }
}

/// Creates the new file `path` mode 0600 (never an existing one, never through a symlink).
pub fn create_file(path: &Path) -> io::Result<File> {
    OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(FILE_MODE)
        .open(path)
}

/// Removes whatever is at `path` (a leftover temporary file of a process that died, an
/// earlier try of a download), then creates the new file `path` mode 0600.
pub fn replace_file(path: &Path) -> io::Result<File> {
    match fs::remove_file(path) {
        Err(e) if e.kind() != io::ErrorKind::NotFound => return Err(e),
        _ => {}
    }
    create_file(path)
}

/// Writes `bytes` to the file `path` made by [`replace_file`] (mode 0600) and syncs it.
pub fn write_file(path: &Path, bytes: &[u8]) -> io::Result<()> {
    let mut f = replace_file(path)?;
    f.write_all(bytes)?;
    f.sync_all()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mode(p: &Path) -> u32 {
        fs::symlink_metadata(p).unwrap().mode() & 0o7777
    }

    #[test]
    fn a_missing_folder_and_its_parents_are_made_0700_and_files_0600() {
        let dir = tempfile::tempdir().unwrap();
        let leaf = dir.path().join("a/b");
        ensure_dir(&leaf).unwrap();
        assert_eq!(mode(&dir.path().join("a")), 0o700);
        assert_eq!(mode(&leaf), 0o700);
        write_file(&leaf.join("f"), b"x").unwrap();
        write_file(&leaf.join("f"), b"yz").unwrap();
        assert_eq!(mode(&leaf.join("f")), 0o600);
        assert_eq!(fs::read(leaf.join("f")).unwrap(), b"yz");
    }

    #[test]
    fn a_readable_folder_of_ours_is_tightened_and_a_writable_one_refused() {
        let dir = tempfile::tempdir().unwrap();
        let open = dir.path().join("open");
        fs::create_dir(&open).unwrap();
        fs::set_permissions(&open, fs::Permissions::from_mode(0o755)).unwrap();
        ensure_dir(&open).unwrap();
        assert_eq!(mode(&open), 0o700);
        fs::set_permissions(&open, fs::Permissions::from_mode(0o777)).unwrap();
        let e = ensure_dir(&open).unwrap_err();
        assert_eq!(
            e.untrusted(),
            Some(&Untrusted::WritableByOthers { mode: 0o777 })
        );
        assert!(e.to_string().contains(&open.display().to_string()), "{e}");
        assert_eq!(mode(&open), 0o777, "a refused folder is left as it was");
    }

    #[test]
    fn a_symlink_and_a_file_are_refused() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        ensure_dir(&real).unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        assert_eq!(
            ensure_dir(&link).unwrap_err().untrusted(),
            Some(&Untrusted::Symlink)
        );
        let file = dir.path().join("file");
        fs::write(&file, b"").unwrap();
        assert!(ensure_dir(&file).is_err());
        assert_eq!(
            check_dir(&file).unwrap_err().untrusted(),
            Some(&Untrusted::NotADirectory)
        );
    }

    #[test]
    fn a_folder_of_another_uid_is_refused() {
        if euid() != 0 {
            eprintln!("SKIPPED a_folder_of_another_uid_is_refused: needs root to chown");
            return;
        }
        let dir = tempfile::tempdir().unwrap();
        let theirs = dir.path().join("theirs");
        fs::create_dir(&theirs).unwrap();
        fs::set_permissions(&theirs, fs::Permissions::from_mode(0o700)).unwrap();
        std::os::unix::fs::chown(&theirs, Some(65534), Some(65534)).unwrap();
        let e = ensure_dir(&theirs).unwrap_err();
        assert_eq!(
            e.untrusted(),
            Some(&Untrusted::OwnedByAnother {
                owner: 65534,
                ours: 0
            })
        );
        assert!(e.to_string().contains("belongs to uid 65534"), "{e}");
    }
}
