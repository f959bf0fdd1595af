//! `stoker check PATH`: decode every sample and report each failure with its reason.
//!
//! The core, [`check_samples`], takes `(display name, bytes)` pairs and does not care where they
//! come from; `stoker check PATH` reads every sample of the dataset at PATH (any layout), and
//! `sample_files` walks a folder for regular files (sorted), skipping hidden
//! files and metadata beside the images (the indexer's `METADATA_EXTENSIONS`).
//! Everything else is decoded: the format is recognised by its bytes, so a GIF named `.jpg`
//! is reported as an unknown format, and a JPEG named `.png` is checked like any other.
//!
//! Files the dataset's index leaves out (not a supported image format by name, see
//! `stoker_pipeline::source::index::Skipped`) are counted and the first few named in the
//! report, so that nothing is dropped silently.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use std::collections::BTreeMap;
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};

use serde::Serialize;
use stoker_kernels::image::RgbImage;

use stoker_pipeline::source::index::{
    Dataset, DatasetError, OpenOptions, Skipped, METADATA_EXTENSIONS,
};
use stoker_pipeline::source::local::fsopen::open_input;
use stoker_pipeline::source::object::ObjectStore;
use stoker_pipeline::sync::lock;
use stoker_pipeline::transform::decode::{CpuDecoder, DecodeError, Limits};

/// Reason code for a sample whose bytes could not be read.
pub(crate) const REASON_IO: &str = "io_error";

/// Arguments of `stoker check`.
#[derive(Debug, clap::Args)]
pub struct CheckArgs {
    /// A file or a directory (walked recursively).
    pub(crate) path: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub(crate) json: bool,
    /// Decode threads (default: all cores).
    #[arg(long)]
    pub(crate) threads: Option<usize>,
}

/// Options of [`check_samples`].
#[derive(Debug, Clone, Copy)]
pub struct CheckOptions {
    /// Decode threads (0 counts as 1).
    pub threads: usize,
    /// The decoder's limits on a sample (what is too large); `stoker check` uses the defaults.
    pub limits: Limits,
}

/// One sample that did not decode.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct CheckFailure {
    /// The sample's display name (its path, or shard and member).
    pub name: String,
    /// A stable code ([`DecodeError::reason`] or [`REASON_IO`]).
    pub reason: &'static str,
    /// The error as a person reads it.
    pub message: String,
}

/// The outcome of checking a set of samples.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct CheckReport {
    /// Samples checked.
    pub total: usize,
    /// Samples that decoded.
    pub ok: usize,
    /// In input order.
    pub failures: Vec<CheckFailure>,
    /// Number of failures per reason code.
    pub by_reason: BTreeMap<&'static str, usize>,
    /// Files under the path that are no samples: not a supported image format.
    pub skipped: Skipped,
}

impl CheckReport {
    pub(crate) fn all_ok(&self) -> bool {
        self.failures.is_empty()
    }
}

/// Decodes every sample on `opts.threads` threads and reports the failures in input order.
/// Each item is a display name (a path) and the sample's bytes, or the error reading them.
pub fn check_samples<I>(samples: I, opts: &CheckOptions) -> CheckReport
where
    I: IntoIterator<Item = (String, io::Result<Vec<u8>>)>,
    I::IntoIter: Send,
{
    let queue = Mutex::new(samples.into_iter().enumerate());
    let results: Mutex<Vec<(usize, Option<CheckFailure>)>> = Mutex::new(Vec::new());
    let threads = opts.threads.max(1);
    std::thread::scope(|scope| {
        for _ in 0..threads {
            scope.spawn(|| {
                let mut decoder = CpuDecoder::new(opts.limits);
                let mut img = RgbImage::default();
                let mut local = Vec::new();
                loop {
                    // Take the next sample (reading it, if the iterator reads) under the lock.
                    let next = lock(&queue).next();
                    let Some((i, (name, bytes))) = next else {
                        break;
                    };
                    let outcome = match (&mut decoder, bytes) {
                        (_, Err(e)) => Err((REASON_IO, e.to_string())),
                        (Err(e), _) => Err((e.reason(), e.to_string())),
                        (Ok(d), Ok(bytes)) => d
                            .decode_full(&bytes, &mut img)
                            .map_err(|e: DecodeError| (e.reason(), e.to_string())),
                    };
                    let failure = outcome.err().map(|(reason, message)| CheckFailure {
                        name,
                        reason,
                        message,
                    });
                    local.push((i, failure));
                }
                lock(&results).extend(local);
            });
        }
    });
    let mut results = results.into_inner().unwrap_or_else(|p| p.into_inner());
    results.sort_by_key(|(i, _)| *i);
    let mut report = CheckReport {
        total: results.len(),
        ..CheckReport::default()
    };
    for (_, failure) in results {
        match failure {
            None => report.ok += 1,
            Some(f) => {
                *report.by_reason.entry(f.reason).or_insert(0) += 1;
                report.failures.push(f);
            }
        }
    }
    report
}

/// Every regular file under `root` (or `root` itself if it is a file), sorted, without hidden
/// files and sidecar files.
pub fn sample_files(root: &Path) -> io::Result<Vec<PathBuf>> {
    let mut files = Vec::new();
    if std::fs::metadata(root)?.is_file() {
        files.push(root.to_path_buf());
        return Ok(files);
    }
    let mut dirs = vec![root.to_path_buf()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let path = entry?.path();
            let name = path.file_name().map(|n| n.to_string_lossy().into_owned());
            if name.as_deref().is_none_or(|n| n.starts_with('.')) {
                continue;
            }
            let meta = std::fs::metadata(&path)?;
            if meta.is_dir() {
                dirs.push(path);
            } else if meta.is_file() && !is_sidecar(&path) {
                files.push(path);
            }
        }
    }
    files.sort();
    Ok(files)
}

fn is_sidecar(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| METADATA_EXTENSIONS.contains(&e.to_ascii_lowercase().as_str()))
}

/// Runs `stoker check`; returns the exit code (0: every sample decoded, 1: some did not).
/// Reads `len` bytes at `offset` of `path` (a whole file, or a member of a tar shard).
fn read_range(objects: &ObjectStore, path: &Path, offset: u64, len: u64) -> io::Result<Vec<u8>> {
    use std::io::{Read, Seek, SeekFrom};
    let mut f = open_input(&objects.local_file_at(path)?)?;
    f.seek(SeekFrom::Start(offset))?;
    let mut buf = Vec::with_capacity(usize::try_from(len).map_err(io::Error::other)?);
    f.take(len).read_to_end(&mut buf)?;
    if (buf.len() as u64) < len {
        return Err(io::Error::new(
            io::ErrorKind::UnexpectedEof,
            format!(
                "file is shorter than indexed ({} of {len} bytes)",
                buf.len()
            ),
        ));
    }
    Ok(buf)
}

/// Why the samples under a path could not be listed (the caller names the path).
#[derive(Debug, thiserror::Error)]
enum SamplesError {
    #[error("{0}")]
    Stat(io::Error),
    #[error("{0}")]
    Dataset(DatasetError),
}

/// One sample to check: its name, its file, and the offset and length of its bytes there.
type SampleFile = (String, PathBuf, u64, u64);

/// The samples under `path`: a single image file, or every sample of a dataset in any
/// layout (`stoker_pipeline::source::index`), named by path (or `shard.tar:member`); and the
/// dataset, which the caller keeps while it reads them (its objects are known to `objects`
/// while it lives).
fn dataset_samples(
    path: &Path,
    objects: &Arc<ObjectStore>,
) -> Result<(Vec<SampleFile>, Option<Dataset>), SamplesError> {
    let meta = match stoker_pipeline::source::object::is_url(path) {
        true => None,
        false => Some(std::fs::metadata(path).map_err(SamplesError::Stat)?),
    };
    let is_dataset_file = path.extension().and_then(|e| e.to_str()).is_some_and(|e| {
        matches!(
            e.to_ascii_lowercase().as_str(),
            "tar" | "txt" | "tsv" | "list"
        )
    });
    if let Some(meta) = meta.filter(|m| m.is_file() && !is_dataset_file) {
        let file = (
            path.display().to_string(),
            path.to_path_buf(),
            0,
            meta.len(),
        );
        return Ok((vec![file], None));
    }
    let opts = OpenOptions {
        objects: Some(objects.clone()),
        ..OpenOptions::default()
    };
    let ds = Dataset::open(path, &opts).map_err(SamplesError::Dataset)?;
    let samples = (0..ds.len())
        .map(|i| {
            let s = ds.sample(i);
            (ds.display_name(i), s.path.to_path_buf(), s.offset, s.len)
        })
        .collect();
    Ok((samples, Some(ds)))
}

/// Runs `stoker check`: prints the report and returns the exit code (failure if a sample
/// did not decode).
pub fn run(args: &CheckArgs) -> Exit {
    let objects = ObjectStore::from_environment();
    let (files, dataset) = match dataset_samples(&args.path, &objects) {
        Ok(f) => f,
        Err(e) => {
            eprintln!("stoker check: {}: {e}", args.path.display());
            return Exit::Usage;
        }
    };
    let threads = args.threads.unwrap_or_else(|| {
        std::thread::available_parallelism()
            .map(|n| n.get())
            .unwrap_or(1)
    });
    let opts = CheckOptions {
        threads,
        limits: Limits::default(),
    };
    let samples = files
        .into_iter()
        .map(|(name, path, offset, len)| (name, read_range(&objects, &path, offset, len)));
    let mut report = check_samples(samples, &opts);
    if let Some(ds) = &dataset {
        report.skipped = ds.skipped().clone();
    }
    if args.json {
        match serde_json::to_string_pretty(&report) {
            Ok(s) => println!("{s}"),
            Err(e) => {
                eprintln!("stoker check: cannot write JSON: {e}");
                return Exit::Failure;
            }
        }
    } else {
        print_text(&report);
    }
    if report.all_ok() {
        Exit::Ok
    } else {
        Exit::Failure
    }
}

fn print_text(report: &CheckReport) {
    for f in &report.failures {
        println!("FAIL {}: {} ({})", f.name, f.message, f.reason);
    }
    println!(
        "checked {} samples: {} ok, {} failed",
        report.total,
        report.ok,
        report.failures.len()
    );
    for (reason, n) in &report.by_reason {
        println!("  {reason:<16} {n}");
    }
    if let Some(summary) = report.skipped.summary() {
        println!("{summary}");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reports_failures_in_input_order_with_reasons() {
        let samples = vec![
            ("a.jpg".to_owned(), Ok(b"GIF89a\x01\x00\x01\x00".to_vec())),
            ("b.jpg".to_owned(), Err(io::Error::other("gone"))),
            ("c.jpg".to_owned(), Ok(b"hello".to_vec())),
            ("d.jpg".to_owned(), Ok(vec![0xFF, 0xD8, 0xFF, 0xD9])),
        ];
        let opts = CheckOptions {
            threads: 3,
            limits: Limits::default(),
        };
        let r = check_samples(samples, &opts);
        assert_eq!((r.total, r.ok), (4, 0));
        let names: Vec<_> = r
            .failures
            .iter()
            .map(|f| (f.name.as_str(), f.reason))
            .collect();
        assert_eq!(names[0], ("a.jpg", "unknown_format"));
        assert_eq!(names[1], ("b.jpg", REASON_IO));
        assert_eq!(names[2], ("c.jpg", "unknown_format"));
        assert_eq!(names[3].0, "d.jpg");
        assert_eq!(r.by_reason["unknown_format"], 2);
        assert!(r.failures[0].message.contains("GIF"));
    }
}
