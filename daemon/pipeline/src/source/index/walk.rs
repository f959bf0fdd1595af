//! The folder walk of indexing, bounded and loop-proof.
//!
//! # Design
//! - **Cycles**: every folder walked is remembered by (device, inode); a folder met again (a
//!   symlink to an ancestor, `ln -s .. up`, or a second path to a folder already listed) is
//!   skipped, so a loop of symlinks costs one entry, not an exponential tree. Symlinked
//!   folders that lead somewhere new are still followed (ImageNet subsets made of symlinks).
//! - **Bounds**: entries looked at (files and folders, images or not) and depth are capped by
//!   [`WalkLimits`] (`[limits] max_index_entries`, `max_index_depth`); past either the index
//!   fails with [`DatasetError::WalkLimit`] naming the folder and the limit, instead of
//!   eating memory. The entry budget is shared by every walking thread of one index.
//! - **Pseudo filesystems** (proc, sysfs, cgroup, debugfs, tracefs, securityfs, devpts, bpf,
//!   pstore) are never datasets: a folder on one is skipped with a log line. The filesystem
//!   root `/` is refused as a dataset ([`refuse_root`]).
//!
//! # Limitations
//! - Visited folders are remembered per class folder (classes are walked in parallel), so a
//!   folder reachable from two classes is listed in both.

#![forbid(unsafe_code)]

use std::collections::HashSet;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

use super::skipped::{is_skipped_name, Skipped};
use super::{entry_is_dir, is_image_name, read_dir_sorted, DatasetError, Stamp};

/// Entries one index may look at, by default.
pub(crate) const DEFAULT_MAX_INDEX_ENTRIES: u64 = 50_000_000;
/// Folder depth below the dataset's root, by default.
pub(crate) const DEFAULT_MAX_INDEX_DEPTH: u32 = 64;

/// How far an index may walk.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct WalkLimits {
    /// Directory entries looked at, all folders and threads together.
    pub max_entries: u64,
    /// Folders below the dataset's root.
    pub max_depth: u32,
}

impl Default for WalkLimits {
    fn default() -> Self {
        WalkLimits {
            max_entries: DEFAULT_MAX_INDEX_ENTRIES,
            max_depth: DEFAULT_MAX_INDEX_DEPTH,
        }
    }
}

/// The limits and the entries spent so far, shared by the threads of one index.
#[derive(Debug)]
pub(super) struct WalkBudget {
    pub(super) limits: WalkLimits,
    pub(super) entries: AtomicU64,
}

impl WalkBudget {
    pub(super) fn new(limits: WalkLimits) -> WalkBudget {
        WalkBudget {
            limits,
            entries: AtomicU64::new(0),
        }
    }

    fn spend(&self, n: u64, dir: &Path) -> Result<(), DatasetError> {
        let spent = self.entries.fetch_add(n, Ordering::Relaxed) + n;
        if spent > self.limits.max_entries {
            return Err(DatasetError::WalkLimit {
                path: dir.to_owned(),
                reason: format!(
                    "more than {} entries looked at (limits.max_index_entries)",
                    self.limits.max_entries
                ),
            });
        }
        Ok(())
    }
}

/// Filesystem magic numbers (statfs f_type) of pseudo filesystems, never datasets.
const PSEUDO_FS: &[(i64, &str)] = &[
    (0x9fa0, "proc"),
    (0x6265_6572, "sysfs"),
    (0x0027_e0eb, "cgroup"),
    (0x6367_7270, "cgroup2"),
    (0x6462_6720, "debugfs"),
    (0x7472_6163, "tracefs"),
    (0x7363_6673, "securityfs"),
    (0x1cd1, "devpts"),
    (0xcafe_4a11, "bpf"),
    (0x6165_676c, "pstore"),
];

/// The name of the pseudo filesystem `dir` is on, if it is on one.
pub(super) fn pseudo_fs(dir: &Path) -> Option<&'static str> {
    let st = rustix::fs::statfs(dir).ok()?;
    #[allow(clippy::unnecessary_cast)] // f_type's width differs between targets
    let kind = st.f_type as i64;
    PSEUDO_FS.iter().find(|(m, _)| *m == kind).map(|(_, n)| *n)
}

/// Refuses the filesystem root and pseudo filesystems as datasets.
pub(super) fn refuse_root(root: &Path) -> Result<(), DatasetError> {
    if root.parent().is_none() {
        return Err(DatasetError::WrongKind {
            path: root.to_owned(),
            reason: "the filesystem root is not a dataset (name the folder of the images)".into(),
        });
    }
    if let Some(fs) = pseudo_fs(root) {
        return Err(DatasetError::WrongKind {
            path: root.to_owned(),
            reason: format!("on a {fs} pseudo filesystem, not a dataset"),
        });
    }
    Ok(())
}

/// What a walk found below one folder: image files, the other files (sidecars, maybe),
/// folder stamps, files it skipped.
#[derive(Default)]
pub(super) struct Listing {
    pub(super) files: Vec<PathBuf>,
    pub(super) others: Vec<PathBuf>,
    pub(super) stamps: Vec<Stamp>,
    pub(super) skipped: Skipped,
}

/// One thread's walk: the folders it has listed.
pub(super) struct Walk<'a> {
    pub(super) budget: &'a WalkBudget,
    visited: HashSet<(u64, u64)>,
    /// The dataset's root, which skipped files are named below.
    root: PathBuf,
}

impl<'a> Walk<'a> {
    /// A walk below the dataset's `root`, which counts as walked already.
    pub(super) fn new(budget: &'a WalkBudget, root: &Path) -> Walk<'a> {
        Walk {
            budget,
            visited: dir_identity(root).into_iter().collect(),
            root: root.to_owned(),
        }
    }

    /// Lists image files under `dir` (recursively when `recurse`), recording folder stamps;
    /// `depth` is `dir`'s depth below the dataset's root.
    pub(super) fn list_images(
        &mut self,
        dir: &Path,
        recurse: bool,
        depth: u32,
        found: &mut Listing,
        done: &AtomicU64,
    ) -> Result<(), DatasetError> {
        let stamp = Stamp::of(dir).map_err(|source| DatasetError::UnreadableDir {
            path: dir.to_owned(),
            source,
        })?;
        // The dataset's root (depth 0, a flat dataset) is seeded as walked; below it, a
        // folder met again is a loop or a second path.
        if !self.visited.insert((stamp.dev, stamp.ino)) && depth > 0 {
            tracing::info!(
                folder = %dir.display(),
                "folder walked already (a symlink loop or a second path to it); skipped"
            );
            return Ok(());
        }
        if let Some(fs) = pseudo_fs(dir) {
            tracing::warn!(folder = %dir.display(), fs, "folder on a pseudo filesystem; skipped");
            return Ok(());
        }
        if depth > self.budget.limits.max_depth {
            return Err(DatasetError::WalkLimit {
                path: dir.to_owned(),
                reason: format!(
                    "deeper than {} folders below the dataset (limits.max_index_depth)",
                    self.budget.limits.max_depth
                ),
            });
        }
        found.stamps.push(stamp);
        let entries = read_dir_sorted(dir)?;
        self.budget.spend(entries.len() as u64, dir)?;
        for e in entries {
            if entry_is_dir(&e) {
                if recurse {
                    self.list_images(&e.path(), true, depth + 1, found, done)?;
                }
            } else if is_image_name(&e.file_name()) {
                found.files.push(e.path());
                done.fetch_add(1, Ordering::Relaxed);
            } else {
                let path = e.path();
                if is_skipped_name(&e.file_name()) {
                    let below = path.strip_prefix(&self.root).unwrap_or(&path);
                    found.skipped.add(below.to_string_lossy().into_owned());
                }
                found.others.push(path);
            }
        }
        Ok(())
    }
}

/// The (device, inode) of a folder, for seeding a walk's visited set with the root.
fn dir_identity(dir: &Path) -> Option<(u64, u64)> {
    std::fs::metadata(dir).ok().map(|m| (m.dev(), m.ino()))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::source::index::{Dataset, OpenOptions};

    fn open(root: &Path, limits: WalkLimits) -> Result<Dataset, DatasetError> {
        let opts = OpenOptions {
            use_cache: false,
            limits,
            ..OpenOptions::default()
        };
        Dataset::open(root, &opts)
    }

    #[test]
    fn a_symlink_loop_is_walked_once_and_limits_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("L");
        std::fs::create_dir_all(root.join("a/b")).unwrap();
        std::fs::write(root.join("a/x.jpg"), b"x").unwrap();
        std::fs::write(root.join("a/b/y.jpg"), b"y").unwrap();
        std::os::unix::fs::symlink("..", root.join("a/up")).unwrap();
        std::os::unix::fs::symlink("../..", root.join("a/b/up")).unwrap();
        std::os::unix::fs::symlink(root.join("a/b"), root.join("a/again")).unwrap();
        let ds = open(&root, WalkLimits::default()).unwrap();
        assert_eq!(ds.len(), 2, "each image once");
        let shallow = WalkLimits {
            max_depth: 1,
            ..WalkLimits::default()
        };
        let e = open(&root, shallow).unwrap_err().to_string();
        assert!(
            e.contains("limits.max_index_depth") && e.contains("L/a/"),
            "{e}"
        );
        let narrow = WalkLimits {
            max_entries: 3,
            ..WalkLimits::default()
        };
        let e = open(&root, narrow).unwrap_err().to_string();
        assert!(e.contains("limits.max_index_entries"), "{e}");
        let e = open(Path::new("/"), WalkLimits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("filesystem root"), "{e}");
        let e = open(Path::new("/proc/self"), WalkLimits::default())
            .unwrap_err()
            .to_string();
        assert!(e.contains("proc pseudo filesystem"), "{e}");
    }
}
