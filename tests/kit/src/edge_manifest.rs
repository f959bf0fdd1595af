//! The edge corpus's `MANIFEST.tsv` (`shared/data/edge`) for tests: the tool's one reader
//! (`stoker_tool::edge_manifest`), with an unreadable manifest failing the test. Used by the
//! CPU decoder's and `stoker check`'s test (`daemon/tool/tests/edge_manifest.rs`), the nvJPEG
//! tests (`tests/cuda_nvjpeg.rs`) and the tests that serve the corpus through the daemon.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

pub use stoker_tool::edge_manifest::Expected;

/// The edge corpus beside the repository (`../shared/data/edge`), or `None` with a loud
/// SKIPPED line naming `test` where it is missing.
pub fn edge_dir(test: &str) -> Option<PathBuf> {
    let edge = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/edge");
    if edge.join("MANIFEST.tsv").is_file() {
        return Some(edge);
    }
    eprintln!("SKIPPED {test}: no {}", edge.display());
    None
}

/// `(file name, expected outcome)` for every row of `edge/MANIFEST.tsv`, in its order (the
/// tool's reader); a manifest that cannot be read fails the test.
pub fn read(edge: &Path) -> Vec<(String, Expected)> {
    stoker_tool::edge_manifest::read(edge).unwrap_or_else(|e| panic!("{e}"))
}
