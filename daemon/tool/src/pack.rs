//! Tar shards (WebDataset layout) written by stoker: `stoker pack` turns any dataset into
//! shards of a target size, and `stoker synth --shards` writes generated images straight into
//! shards. Each sample is two members, `KEY.jpg` and `KEY.cls` (the label as ASCII, omitted
//! when the sample has none), which is what [`stoker_pipeline::source::index`] reads back.
//!
//! # Design
//! - Plain ustar headers (names up to 100 bytes, sizes below 8 GiB), written with one buffered
//!   writer per shard; nothing is compressed (the reader reads samples by offset).
//! - A shard is closed once it reaches the target size, so shards are at most one sample
//!   larger than the target.
//! - Shards are written to `NAME.tar.partial` and renamed when complete, so an interrupted
//!   pack never leaves a truncated shard that looks finished.
//! - `--restart` ([`PackOptions::restart`]) losslessly rewrites every JPEG it can with restart
//!   markers ([`stoker_pipeline::transform::decode::add_restart_markers`]: same pixels, proven
//!   per file by decoding both), so the decoder entropy decodes only the intervals a crop
//!   touches; any other file (progressive, arithmetic, CMYK, not a JPEG, corrupt) is stored as
//!   it is, and counted.
//! - Beside each shard of samples goes its index, `NAME.tar.idx` ([`stoker_pipeline::source::object::sidecar`]):
//!   an `s3://` dataset of shards is indexed from it without downloading the shards.

#![forbid(unsafe_code)]

use std::borrow::Cow;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use stoker_pipeline::source::index::{Dataset, DatasetError, OpenOptions};
use stoker_pipeline::source::local::fsopen::open_input;
use stoker_pipeline::source::object::client::S3Error;
use stoker_pipeline::source::object::sidecar::{self, IndexedSample};
use stoker_pipeline::transform::decode::add_restart_markers;

/// Default target shard size: 256 MB.
pub(crate) const DEFAULT_SHARD_BYTES: u64 = 256 * 1000 * 1000;

/// Why a pack (or a shard written by [`TarWriter`]) failed.
#[derive(Debug, thiserror::Error)]
pub enum PackError {
    /// A shard, its sidecar index or the output folder could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The file or folder (a shard is written as `NAME.tar.partial` until complete).
        path: PathBuf,
        /// The write's error.
        source: std::io::Error,
    },
    /// A sample's bytes could not be read from the dataset.
    #[error("cannot read sample {sample}: {source}")]
    Read {
        /// The sample's display name in the dataset.
        sample: String,
        /// The open's or read's error.
        source: std::io::Error,
    },
    /// A sample's indexed length does not fit this machine's `usize`.
    #[error("cannot read sample {sample}: {len} bytes")]
    TooLarge {
        /// The sample's display name in the dataset.
        sample: String,
        /// Its length in bytes, as indexed.
        len: u64,
    },
    /// The dataset to pack could not be opened.
    #[error(transparent)]
    Dataset(#[from] DatasetError),
    /// A member name does not fit a ustar header (at most 100 bytes).
    #[error("tar member name {0:?} is longer than 100 bytes")]
    NameTooLong(String),
    /// The `s3://` output is not a URL stoker can upload to; `reason` is the URL parser's.
    #[error("cannot upload {path}: {reason}")]
    BadUrl {
        /// The output as given.
        path: PathBuf,
        /// What is wrong with it.
        #[source]
        reason: stoker_pipeline::source::url::UrlError,
    },
    /// The output is not an `s3://` URL at all.
    #[error("cannot upload {path}: not an s3:// URL")]
    NotS3 {
        /// The output as given.
        path: PathBuf,
    },
    /// A shard or its sidecar index could not be uploaded.
    #[error("cannot upload {path}: {source}")]
    Upload {
        /// The local file being uploaded.
        path: PathBuf,
        /// The S3 request's error.
        source: S3Error,
    },
}

/// Writes one tar file member by member.
pub struct TarWriter {
    out: BufWriter<File>,
    path: PathBuf,
    partial: PathBuf,
    bytes: u64,
    /// The samples [`append_sample`] wrote, for the sidecar index.
    samples: Vec<IndexedSample>,
}

impl std::fmt::Debug for TarWriter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TarWriter")
            .field("path", &self.path)
            .field("bytes", &self.bytes)
            .field("samples", &self.samples.len())
            .finish_non_exhaustive()
    }
}

impl TarWriter {
    /// Creates `path` (written as `path.partial` until [`TarWriter::finish`]).
    pub fn create(path: &Path) -> Result<TarWriter, PackError> {
        let partial = path.with_extension("tar.partial");
        let file = File::create(&partial).map_err(|source| PackError::Write {
            path: partial.clone(),
            source,
        })?;
        Ok(TarWriter {
            out: BufWriter::with_capacity(1 << 20, file),
            path: path.to_owned(),
            partial,
            bytes: 0,
            samples: Vec::new(),
        })
    }

    /// Bytes written so far (headers and padding included).
    pub(crate) fn bytes(&self) -> u64 {
        self.bytes
    }

    /// Appends a regular file member.
    pub fn append(&mut self, name: &str, data: &[u8]) -> Result<(), PackError> {
        let header = ustar_header(name, data.len() as u64)?;
        let pad = (512 - data.len() % 512) % 512;
        let w = |out: &mut BufWriter<File>, b: &[u8]| out.write_all(b);
        w(&mut self.out, &header)
            .and_then(|()| w(&mut self.out, data))
            .and_then(|()| w(&mut self.out, &[0u8; 512][..pad]))
            .map_err(|source| PackError::Write {
                path: self.partial.clone(),
                source,
            })?;
        self.bytes += 512 + (data.len() + pad) as u64;
        Ok(())
    }

    /// Writes the end-of-archive blocks, flushes, and renames the shard into place.
    pub fn finish(mut self) -> Result<u64, PackError> {
        let err = |path: &Path| {
            let path = path.to_owned();
            move |source| PackError::Write { path, source }
        };
        self.out
            .write_all(&[0u8; 1024])
            .map_err(err(&self.partial))?;
        let file = self.out.into_inner().map_err(|e| PackError::Write {
            path: self.partial.clone(),
            source: e.into_error(),
        })?;
        file.sync_data().map_err(err(&self.partial))?;
        std::fs::rename(&self.partial, &self.path).map_err(err(&self.path))?;
        let total = self.bytes + 1024;
        if !self.samples.is_empty() {
            let mut idx = self.path.clone().into_os_string();
            idx.push(sidecar::SUFFIX);
            let idx = PathBuf::from(idx);
            let temp = idx.with_extension("idx.partial");
            std::fs::write(&temp, sidecar::render(total, &self.samples))
                .and_then(|()| std::fs::rename(&temp, &idx))
                .map_err(err(&idx))?;
        }
        Ok(total)
    }
}

/// A ustar header block for a regular file of `size` bytes named `name`.
fn ustar_header(name: &str, size: u64) -> Result<[u8; 512], PackError> {
    if name.len() > 100 {
        return Err(PackError::NameTooLong(name.into()));
    }
    let mut h = [0u8; 512];
    h[..name.len()].copy_from_slice(name.as_bytes());
    let octal = |field: &mut [u8], v: u64| {
        let s = format!("{:0width$o}\0", v, width = field.len() - 1);
        field.copy_from_slice(s.as_bytes());
    };
    octal(&mut h[100..108], 0o644); // mode
    octal(&mut h[108..116], 0); // uid
    octal(&mut h[116..124], 0); // gid
    octal(&mut h[124..136], size);
    octal(&mut h[136..148], 0); // mtime: fixed, so packs are reproducible
    h[156] = b'0'; // regular file
    h[257..263].copy_from_slice(b"ustar\0");
    h[263..265].copy_from_slice(b"00");
    h[148..156].copy_from_slice(b"        ");
    let sum: u32 = h.iter().map(|&b| u32::from(b)).sum();
    let s = format!("{sum:06o}\0 ");
    h[148..156].copy_from_slice(s.as_bytes());
    Ok(h)
}

/// The name of shard `n` in `out`.
pub(crate) fn shard_path(out: &Path, n: usize) -> PathBuf {
    out.join(format!("shard-{n:06}.tar"))
}

/// Appends one sample (`KEY.jpg`, and `KEY.cls` when the label is not negative).
pub(crate) fn append_sample(
    tar: &mut TarWriter,
    key: &str,
    jpeg: &[u8],
    label: i64,
) -> Result<(), PackError> {
    let name = format!("{key}.jpg");
    let offset = tar.bytes() + 512;
    tar.append(&name, jpeg)?;
    tar.samples.push(IndexedSample {
        offset,
        len: jpeg.len() as u64,
        label: label.max(-1),
        name,
    });
    if label >= 0 {
        tar.append(&format!("{key}.cls"), label.to_string().as_bytes())?;
    }
    Ok(())
}

/// How to pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PackOptions {
    /// Target shard size in bytes.
    pub shard_bytes: u64,
    /// Progress on stderr about once a second.
    pub progress: bool,
    /// Rewrite JPEGs with restart markers (module docs).
    pub restart: bool,
}

impl PackOptions {
    /// Shards of `shard_bytes`, no progress, files stored as they are.
    pub fn plain(shard_bytes: u64) -> PackOptions {
        PackOptions {
            shard_bytes,
            progress: false,
            restart: false,
        }
    }
}

/// What a pack wrote.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PackSummary {
    /// Samples written.
    pub samples: usize,
    /// Shards written (complete and renamed into place).
    pub shards: usize,
    /// Bytes of all shards (tar headers and padding included, sidecars not).
    pub bytes: u64,
    /// Samples rewritten with restart markers (`--restart`).
    pub restart_indexed: usize,
    /// Samples `--restart` stored as they are (they cannot be rewritten).
    pub kept_as_is: usize,
    /// Bytes of the rewritten samples before the rewrite.
    pub rewritten_bytes_in: u64,
    /// Bytes of the rewritten samples after the rewrite.
    pub rewritten_bytes_out: u64,
}

/// The bytes to store for `data`: rewritten with restart markers when `restart` is set and
/// the file allows it, else as it is; counted in `summary`.
fn stored_bytes<'a>(data: &'a [u8], restart: bool, summary: &mut PackSummary) -> Cow<'a, [u8]> {
    if !restart {
        return Cow::Borrowed(data);
    }
    match add_restart_markers(data) {
        Ok(v) => {
            summary.restart_indexed += 1;
            summary.rewritten_bytes_in += data.len() as u64;
            summary.rewritten_bytes_out += v.len() as u64;
            Cow::Owned(v)
        }
        Err(_) => {
            summary.kept_as_is += 1;
            Cow::Borrowed(data)
        }
    }
}

/// Packs every sample of the dataset at `src` (any layout) into shards of about
/// `shard_bytes` under `out`, in dataset order, labels preserved. Progress goes to stderr
/// about once a second when `progress` is set.
pub(crate) fn pack(src: &Path, out: &Path, opts: &PackOptions) -> Result<PackSummary, PackError> {
    let ds = Dataset::open(src, &OpenOptions::default())?;
    std::fs::create_dir_all(out).map_err(|source| PackError::Write {
        path: out.to_owned(),
        source,
    })?;
    pack_dataset_with(&ds, out, opts, &mut |_| Ok(()))
}

/// [`pack`] for an opened dataset.
pub fn pack_dataset(
    ds: &Dataset,
    out: &Path,
    shard_bytes: u64,
    progress: bool,
) -> Result<PackSummary, PackError> {
    let opts = PackOptions {
        progress,
        ..PackOptions::plain(shard_bytes)
    };
    pack_dataset_with(ds, out, &opts, &mut |_| Ok(()))
}

/// [`pack_dataset`], calling `done` with each shard's path once it (and its sidecar) is
/// complete, e.g. to upload it and remove the local copy.
pub fn pack_dataset_with(
    ds: &Dataset,
    out: &Path,
    opts: &PackOptions,
    done: &mut dyn FnMut(&Path) -> Result<(), PackError>,
) -> Result<PackSummary, PackError> {
    let (shard_bytes, progress) = (opts.shard_bytes, opts.progress);
    let t0 = Instant::now();
    let mut last = Instant::now();
    let mut summary = PackSummary::default();
    let mut tar: Option<TarWriter> = None;
    let mut buf = Vec::new();
    let mut open: Option<(&Path, File)> = None;
    for i in 0..ds.len() {
        let s = ds.sample(i);
        if open.as_ref().map(|(p, _)| *p) != Some(s.path) {
            let f = open_input(s.path).map_err(|source| PackError::Read {
                sample: ds.display_name(i),
                source,
            })?;
            open = Some((s.path, f));
        }
        let file = &open.as_ref().expect("opened above").1;
        let len = usize::try_from(s.len).map_err(|_| PackError::TooLarge {
            sample: ds.display_name(i),
            len: s.len,
        })?;
        buf.resize(len, 0);
        file.read_exact_at(&mut buf, s.offset)
            .map_err(|source| PackError::Read {
                sample: ds.display_name(i),
                source,
            })?;
        if tar.is_none() {
            tar = Some(TarWriter::create(&shard_path(out, summary.shards))?);
        }
        let t = tar.as_mut().expect("created above");
        let data = stored_bytes(&buf, opts.restart, &mut summary);
        append_sample(t, &format!("{i:09}"), &data, s.label)?;
        summary.samples += 1;
        if t.bytes() >= shard_bytes {
            summary.bytes += tar.take().expect("open shard").finish()?;
            done(&shard_path(out, summary.shards))?;
            summary.shards += 1;
        }
        if progress && last.elapsed() >= Duration::from_secs(1) {
            last = Instant::now();
            eprintln!(
                "stoker pack: {}/{} samples, {} shards, {:.1} MB/s",
                summary.samples,
                ds.len(),
                summary.shards,
                (summary.bytes + tar.as_ref().map_or(0, TarWriter::bytes)) as f64
                    / 1e6
                    / t0.elapsed().as_secs_f64()
            );
        }
    }
    if let Some(t) = tar {
        summary.bytes += t.finish()?;
        done(&shard_path(out, summary.shards))?;
        summary.shards += 1;
    }
    Ok(summary)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::synth::{generate, SynthOptions};

    #[test]
    fn a_packed_folder_reads_back_with_the_same_bytes_and_labels() {
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let opts = SynthOptions {
            images: 30,
            classes: 4,
            size_scale: 0.1,
            threads: 2,
            ..SynthOptions::default()
        };
        generate(&src, &opts).unwrap();
        let out = dir.path().join("shards");
        // Small target: several shards.
        let summary = pack(&src, &out, &PackOptions::plain(4000)).unwrap();
        assert_eq!(summary.samples, 30);
        assert!(summary.shards > 1, "{summary:?}");
        let no_cache = OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        };
        let a = Dataset::open(&src, &no_cache).unwrap();
        let b = Dataset::open(&out, &no_cache).unwrap();
        assert_eq!(b.kind().as_str(), "tar_shards");
        assert_eq!(a.len(), b.len());
        for i in 0..a.len() {
            let (sa, sb) = (a.sample(i), b.sample(i));
            assert_eq!(sa.label, sb.label, "sample {i}");
            let read = |s: stoker_pipeline::source::index::SampleRef<'_>| {
                // Lengths index memory on the 64-bit hosts stoker runs on.
                #[allow(clippy::cast_possible_truncation)]
                let mut v = vec![0u8; s.len as usize];
                File::open(s.path)
                    .unwrap()
                    .read_exact_at(&mut v, s.offset)
                    .unwrap();
                v
            };
            assert_eq!(read(sa), read(sb), "sample {i}");
        }
        assert!(!out.join("shard-000000.tar.partial").exists());
        // Each shard's sidecar lists exactly the samples its headers give.
        let mut i = 0;
        for n in 0..summary.shards {
            let shard = shard_path(&out, n);
            let size = std::fs::metadata(&shard).unwrap().len();
            let text = std::fs::read_to_string(shard.with_extension("tar.idx")).unwrap();
            for x in sidecar::parse(&text, size).unwrap() {
                let s = b.sample(i);
                assert_eq!(
                    (s.path, s.offset, s.len, s.label),
                    (&*shard, x.offset, x.len, x.label)
                );
                assert_eq!(b.display_name(i).rsplit(':').next(), Some(x.name.as_str()));
                i += 1;
            }
        }
        assert_eq!(i, b.len());
    }

    #[test]
    fn restart_packing_rewrites_jpegs_to_the_same_pixels_and_keeps_the_rest() {
        use stoker_kernels::image::RgbImage;
        use stoker_pipeline::transform::decode::{CpuDecoder, Limits};
        let dir = tempfile::tempdir().unwrap();
        let src = dir.path().join("src");
        let opts = SynthOptions {
            images: 12,
            classes: 3,
            size_scale: 0.3,
            threads: 2,
            ..SynthOptions::default()
        };
        generate(&src, &opts).unwrap();
        // One file that is no JPEG: stored as it is.
        let odd = std::fs::read_dir(
            src.join(
                std::fs::read_dir(&src)
                    .unwrap()
                    .next()
                    .unwrap()
                    .unwrap()
                    .file_name(),
            ),
        )
        .unwrap()
        .next()
        .unwrap()
        .unwrap()
        .path();
        std::fs::write(&odd, b"not an image at all").unwrap();
        let out = dir.path().join("shards");
        let opts = PackOptions {
            restart: true,
            ..PackOptions::plain(1 << 20)
        };
        let summary = pack(&src, &out, &opts).unwrap();
        assert_eq!(
            (summary.restart_indexed, summary.kept_as_is),
            (11, 1),
            "{summary:?}"
        );
        let no_cache = OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        };
        let a = Dataset::open(&src, &no_cache).unwrap();
        let b = Dataset::open(&out, &no_cache).unwrap();
        let mut dec = CpuDecoder::new(Limits::default()).unwrap();
        let (mut pa, mut pb) = (RgbImage::default(), RgbImage::default());
        let mut rewritten = 0;
        for i in 0..a.len() {
            let read = |s: stoker_pipeline::source::index::SampleRef<'_>| {
                // Lengths index memory on the 64-bit hosts stoker runs on.
                #[allow(clippy::cast_possible_truncation)]
                let mut v = vec![0u8; s.len as usize];
                File::open(s.path)
                    .unwrap()
                    .read_exact_at(&mut v, s.offset)
                    .unwrap();
                v
            };
            let (ba, bb) = (read(a.sample(i)), read(b.sample(i)));
            if ba == bb {
                assert!(
                    dec.decode_full(&ba, &mut pa).is_err(),
                    "sample {i} not rewritten"
                );
                continue;
            }
            rewritten += 1;
            dec.decode_full(&ba, &mut pa).unwrap();
            dec.decode_full(&bb, &mut pb).unwrap();
            assert!(pa == pb, "sample {i}: the rewrite changed pixels");
        }
        assert_eq!(rewritten, 11);
    }
}
