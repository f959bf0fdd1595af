//! Files a folder walk and tar members a shard index leave out, counted and named: a dataset
//! says what it did not take instead of dropping it silently (`stoker check`, the daemon's log
//! when it indexes).
//!
//! # Design
//! - The rule is the indexer's own: a file is a sample when its name has one of
//!   [`IMAGE_EXTENSIONS`](super::IMAGE_EXTENSIONS), the formats the decoder reads (it then
//!   tells the format by content); any other file is skipped as "not a supported image format",
//!   except metadata beside the images ([`METADATA_EXTENSIONS`]: labels, lists, captions,
//!   READMEs) and hidden files. A format the decoder learns joins that list and is no longer
//!   skipped.
//! - The count is exact; the first [`SKIPPED_NAMED`] names, in walk order, say which files.
//!
//! # Limitations
//! - A tar shard's members follow the same rule by their extension (after the key's first
//!   dot, WebDataset's convention), named `SHARD:MEMBER`; a member with no extension is
//!   skipped too. A file list has nothing to skip: every line it names is a sample, and one
//!   of no decoded format is a bad sample naming its reason.

#![forbid(unsafe_code)]

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;

use serde::Serialize;

/// Files that are metadata beside the images (labels, lists, captions, notes), not skipped
/// samples.
pub const METADATA_EXTENSIONS: &[&str] = &["tsv", "txt", "md", "json", "csv", "cls", "tar"];

/// How many skipped files are named; the rest are counted.
pub const SKIPPED_NAMED: usize = 5;

/// Why a skipped file is skipped.
pub const SKIP_REASON: &str = "not a supported image format";

/// Files left out of a dataset: how many, and the first few (paths below the dataset's root).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
pub struct Skipped {
    /// Files left out.
    pub count: u64,
    /// The first few of them, below the dataset's root.
    pub first: Vec<String>,
}

impl Skipped {
    /// Counts `name` (a path below the root), naming it while fewer than [`SKIPPED_NAMED`] are.
    pub(super) fn add(&mut self, name: String) {
        self.count += 1;
        if self.first.len() < SKIPPED_NAMED {
            self.first.push(name);
        }
    }

    /// Adds `other`'s files after this one's.
    pub(super) fn extend(&mut self, other: Skipped) {
        self.count += other.count;
        let room = SKIPPED_NAMED.saturating_sub(self.first.len());
        self.first.extend(other.first.into_iter().take(room));
    }

    /// `3 files skipped (not a supported image format): a.gif, b/c.tiff, d.bmp`, or `None`
    /// when nothing was.
    pub fn summary(&self) -> Option<String> {
        if self.count == 0 {
            return None;
        }
        let more = self.count.saturating_sub(self.first.len() as u64);
        let mut names = self.first.join(", ");
        if more > 0 {
            names.push_str(&format!(" and {more} more"));
        }
        let files = if self.count == 1 { "file" } else { "files" };
        Some(format!(
            "{} {files} skipped ({SKIP_REASON}): {names}",
            self.count
        ))
    }
}

/// Whether a folder walk skips the file `name` (see the module's rule).
pub(super) fn is_skipped_name(name: &OsStr) -> bool {
    !super::is_image_name(name) && !super::has_ext(name.as_bytes(), METADATA_EXTENSIONS)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_the_first_few_and_counts_the_rest() {
        let mut a = Skipped::default();
        a.add("x.gif".into());
        let mut b = Skipped::default();
        for i in 0..6 {
            b.add(format!("c/{i}.bmp"));
        }
        a.extend(b);
        assert_eq!(a.count, 7);
        assert_eq!(
            a.first,
            ["x.gif", "c/0.bmp", "c/1.bmp", "c/2.bmp", "c/3.bmp"]
        );
        assert_eq!(
            a.summary().unwrap(),
            "7 files skipped (not a supported image format): x.gif, c/0.bmp, c/1.bmp, c/2.bmp, \
             c/3.bmp and 2 more"
        );
        assert_eq!(Skipped::default().summary(), None);
        assert!(is_skipped_name(OsStr::new("a.GIF")));
        assert!(!is_skipped_name(OsStr::new("a.JPG")));
        assert!(!is_skipped_name(OsStr::new("a.png")));
        assert!(!is_skipped_name(OsStr::new("labels.txt")));
    }
}
