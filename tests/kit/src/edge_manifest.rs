//! The edge corpus's `MANIFEST.tsv` (`shared/data/edge`) for tests: the tool's one reader
//! (`stoker_tool::edge_manifest`), with an unreadable manifest failing the test. Used by the
//! CPU decoder's and `stoker check`'s test (`daemon/tool/tests/edge_manifest.rs`), the nvJPEG
//! tests (`tests/cuda_nvjpeg.rs`) and the tests that serve the corpus through the daemon.

#![forbid(unsafe_code)]

use std::path::Path;

pub use stoker_tool::edge_manifest::Expected;

/// `(file name, expected outcome)` for every row of `edge/MANIFEST.tsv`, in its order (the
/// tool's reader); a manifest that cannot be read fails the test.
pub fn read(edge: &Path) -> Vec<(String, Expected)> {
    stoker_tool::edge_manifest::read(edge).unwrap_or_else(|e| panic!("{e}"))
}
