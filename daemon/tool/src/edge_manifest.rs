//! The edge corpus's `MANIFEST.tsv`: what each file must do. Read by `stoker selftest` and,
//! through the test kit, by every test that serves or decodes the corpus.
//!
//! # Design
//! Columns are found by their header names (`file`, `expected`), so the corpus may add
//! columns; rows are kept in the file's order.
//! The manifest predates the other formats: a file whose content is one stoker decodes besides
//! JPEG (its `notjpeg__png_*`, `notjpeg__bmp_*` and `notjpeg__tiff_*` rows, "must be rejected"
//! there) must now decode, as formats are told by content, whatever the name. [`read`] says so,
//! for every reader.
//!
//! # Limitations
//! Only the three expectations the corpus uses are known; any other is an error naming the
//! line.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use stoker_pipeline::transform::decode::ImageFormat;

/// What the manifest says an edge file must do.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Expected {
    /// `decode OK`: the file decodes.
    DecodeOk,
    /// `must be rejected with a clear error`: decoding fails with an error that says why.
    MustReject,
    /// `may be rejected`: either outcome is right, as long as nothing crashes.
    MayReject,
}

/// Why a manifest could not be read.
#[derive(Debug, thiserror::Error)]
pub enum ManifestError {
    /// The manifest file could not be read.
    #[error("{}: {source}", path.display())]
    Read {
        /// The manifest's path.
        path: PathBuf,
        /// The read's error.
        source: std::io::Error,
    },
    /// The header line lacks a column this reader needs.
    #[error("{}: no column {column:?}", path.display())]
    NoColumn {
        /// The manifest's path.
        path: PathBuf,
        /// The missing column's name (`file` or `expected`).
        column: &'static str,
    },
    /// A row's `expected` cell is none of the three known texts.
    #[error("{} line {line}: unknown expectation {found:?}", path.display())]
    UnknownExpectation {
        /// The manifest's path.
        path: PathBuf,
        /// The row's line number in the file, from 1 (the header is line 1).
        line: usize,
        /// The cell's text.
        found: String,
    },
}

/// `(file, expected)` per row of `dir/MANIFEST.tsv`, in its order.
pub fn read(dir: &Path) -> Result<Vec<(String, Expected)>, ManifestError> {
    let path = dir.join("MANIFEST.tsv");
    let text = std::fs::read_to_string(&path).map_err(|source| ManifestError::Read {
        path: path.clone(),
        source,
    })?;
    let rows = parse(&path, &text)?;
    Ok(rows
        .into_iter()
        .map(|(file, expected)| {
            let decoded = std::fs::read(dir.join(&file)).is_ok_and(|b| {
                matches!(
                    ImageFormat::detect(&b),
                    Some(f) if f != ImageFormat::Jpeg
                )
            });
            (
                file,
                if decoded {
                    Expected::DecodeOk
                } else {
                    expected
                },
            )
        })
        .collect())
}

/// The rows of the manifest text `text` (read from `path`, named in errors).
fn parse(path: &Path, text: &str) -> Result<Vec<(String, Expected)>, ManifestError> {
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split('\t').collect();
    let col = |column: &'static str| {
        header
            .iter()
            .position(|c| *c == column)
            .ok_or_else(|| ManifestError::NoColumn {
                path: path.to_owned(),
                column,
            })
    };
    let (file_col, exp_col) = (col("file")?, col("expected")?);
    let mut rows = Vec::new();
    for (n, line) in lines.enumerate().filter(|(_, l)| !l.trim().is_empty()) {
        let cols: Vec<&str> = line.split('\t').collect();
        let cell = |i: usize| cols.get(i).copied().unwrap_or("");
        let expected = match cell(exp_col) {
            "decode OK" => Expected::DecodeOk,
            "must be rejected with a clear error" => Expected::MustReject,
            "may be rejected" => Expected::MayReject,
            other => {
                return Err(ManifestError::UnknownExpectation {
                    path: path.to_owned(),
                    line: n + 2,
                    found: other.to_owned(),
                })
            }
        };
        rows.push((cell(file_col).to_owned(), expected));
    }
    Ok(rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rows_are_read_by_column_name_and_an_unknown_expectation_names_its_line() {
        let path = Path::new("edge/MANIFEST.tsv");
        let text = "note\texpected\tfile\nx\tdecode OK\ta.jpg\n\ny\tmay be rejected\tb.jpg\n";
        let rows = parse(path, text).unwrap();
        let want = [
            ("a.jpg", Expected::DecodeOk),
            ("b.jpg", Expected::MayReject),
        ];
        assert_eq!(rows, want.map(|(f, e)| (f.to_owned(), e)));
        let err = parse(path, "file\texpected\nc.jpg\tfine\n").unwrap_err();
        assert_eq!(
            err.to_string(),
            "edge/MANIFEST.tsv line 2: unknown expectation \"fine\""
        );
        let err = parse(path, "file\n").unwrap_err();
        assert_eq!(err.to_string(), "edge/MANIFEST.tsv: no column \"expected\"");
    }
}
