//! The edge corpus's `MANIFEST.tsv` (`shared/data/edge`): what each file must do. Read by the
//! CPU decoder's and `stoker check`'s test (`daemon/tool/tests/edge_manifest.rs`), the nvJPEG
//! tests (`tests/cuda_nvjpeg.rs`) and the tests that serve the corpus through the daemon.

#![forbid(unsafe_code)]

use std::path::Path;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    DecodeOk,
    MustReject,
    MayReject,
}

/// `(file name, expected outcome)` for every row of `edge/MANIFEST.tsv`, in its order. The
/// columns are found by their header names; an unknown expectation fails the test.
pub fn read(edge: &Path) -> Vec<(String, Expected)> {
    let path = edge.join("MANIFEST.tsv");
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
    let column = |name: &str| {
        header
            .iter()
            .position(|c| *c == name)
            .unwrap_or_else(|| panic!("{}: no column {name:?}", path.display()))
    };
    let (file_col, exp_col) = (column("file"), column("expected"));
    lines
        .filter(|l| !l.trim().is_empty())
        .map(|l| {
            let cols: Vec<&str> = l.split('\t').collect();
            let expected = match cols[exp_col] {
                "decode OK" => Expected::DecodeOk,
                "must be rejected with a clear error" => Expected::MustReject,
                "may be rejected" => Expected::MayReject,
                other => panic!("{}: unknown expectation {other:?}", path.display()),
            };
            (cols[file_col].to_owned(), expected)
        })
        .collect()
}
