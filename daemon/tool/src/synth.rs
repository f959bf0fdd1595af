//! Generated datasets: N JPEGs of realistic size and quality in ImageFolder layout or in
//! WebDataset tar shards, for the demo, tests and scale benchmarks (`stoker synth`).
//!
//! # Design
//! Each image is a pure function of (seed, index): sizes are drawn from ImageNet's common
//! shapes, content is smooth colour fields plus blobs and fine texture so that the encoded
//! size per pixel is close to a photo's (about 1 byte per pixel at quality 90, 4:2:0). Images
//! are written with a bounded number of threads and progress is logged.

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};

use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
use stoker_pipeline::transform::rng::{mix64, KeyedRng, Stream};

/// What to generate.
#[derive(Debug, Clone)]
pub struct SynthOptions {
    /// Images to write.
    pub images: usize,
    /// Classes (labels `0..classes`; image `i` is in class `i % classes`); at least 1.
    pub classes: usize,
    /// With the index, what each image's shape and content are drawn from.
    pub seed: u64,
    /// JPEG quality, 1-100.
    pub quality: u8,
    /// Scale of image sides (1.0: ImageNet-like, about 500x375).
    pub size_scale: f64,
    /// Encoding threads (0: one per core).
    pub threads: usize,
    /// Write this many tar shards (`shard-NNNNNN.tar`, members `KEY.jpg` + `KEY.cls`) instead
    /// of an ImageFolder; 0 writes the folder. Image `i` is the same either way.
    pub shards: usize,
}

impl Default for SynthOptions {
    fn default() -> Self {
        SynthOptions {
            images: 1000,
            classes: 10,
            seed: 0,
            quality: 90,
            size_scale: 1.0,
            threads: 0,
            shards: 0,
        }
    }
}

/// Why [`generate`] stopped.
#[derive(Debug, thiserror::Error)]
pub enum SynthError {
    /// A folder or an image file could not be written.
    #[error("cannot write {path}: {source}")]
    Write {
        /// The folder or file.
        path: PathBuf,
        /// The write's error.
        source: std::io::Error,
    },
    /// The JPEG encoder failed.
    #[error("encoder: {0}")]
    Encode(#[from] stoker_pipeline::transform::decode::DecodeError),
    /// [`SynthOptions::classes`] is 0.
    #[error("classes must be at least 1")]
    NoClasses,
    /// A tar shard could not be written (`shards` > 0).
    #[error(transparent)]
    Shard(#[from] crate::pack::PackError),
}

/// ImageNet's most common (width, height) shapes.
const SHAPES: [(u32, u32); 6] = [
    (500, 375),
    (500, 333),
    (375, 500),
    (500, 400),
    (640, 480),
    (333, 500),
];

/// The path of image `i` under `root`.
pub(crate) fn image_path(root: &Path, opts: &SynthOptions, i: usize) -> PathBuf {
    root.join(format!("class_{:04}", i % opts.classes))
        .join(format!("img_{i:08}.jpg"))
}

/// Pixels of image `i`: (width, height, packed RGB).
// The shape index is below SHAPES.len(); sizes are small positive multiples of the shapes.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn image_pixels(opts: &SynthOptions, i: usize) -> (u32, u32, Vec<u8>) {
    let mut rng = KeyedRng::new(opts.seed, 0, i as u64, Stream::Augment);
    let (bw, bh) = SHAPES[rng.below(SHAPES.len() as u64) as usize];
    let w = ((f64::from(bw) * opts.size_scale).round() as u32).max(8);
    let h = ((f64::from(bh) * opts.size_scale).round() as u32).max(8);
    let base: [f64; 3] = [
        rng.uniform(20.0, 230.0),
        rng.uniform(20.0, 230.0),
        rng.uniform(20.0, 230.0),
    ];
    let grad: [f64; 3] = [
        rng.uniform(-0.3, 0.3),
        rng.uniform(-0.3, 0.3),
        rng.uniform(-0.3, 0.3),
    ];
    let blobs: Vec<(f64, f64, f64, [f64; 3])> = (0..6)
        .map(|_| {
            (
                rng.uniform(0.0, f64::from(w)),
                rng.uniform(0.0, f64::from(h)),
                rng.uniform(10.0, f64::from(w.min(h)) / 2.0),
                [
                    rng.uniform(-90.0, 90.0),
                    rng.uniform(-90.0, 90.0),
                    rng.uniform(-90.0, 90.0),
                ],
            )
        })
        .collect();
    let noise_seed = rng.next_u64();
    let mut px = Vec::with_capacity(w as usize * h as usize * 3);
    for y in 0..h {
        for x in 0..w {
            let (fx, fy) = (f64::from(x), f64::from(y));
            let mut c = [0.0f64; 3];
            for k in 0..3 {
                c[k] = base[k] + grad[k] * (fx - fy);
            }
            for &(bx, by, r, col) in &blobs {
                let d2 = ((fx - bx).powi(2) + (fy - by).powi(2)) / (r * r);
                if d2 < 1.0 {
                    let t = 1.0 - d2;
                    for k in 0..3 {
                        c[k] += col[k] * t;
                    }
                }
            }
            // Fine texture: photos have detail at every scale, which is what costs bytes.
            let n = mix64(noise_seed ^ (u64::from(y) << 32 | u64::from(x)));
            let texture = ((n & 0xff) as f64 - 127.5) * 0.12;
            for v in c {
                // Clamped into 0..=255 first.
                #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                let v = (v + texture).round().clamp(0.0, 255.0) as u8;
                px.push(v);
            }
        }
    }
    (w, h, px)
}

/// Writes the dataset under `root` (ImageFolder layout); returns the bytes written.
pub fn generate(root: &Path, opts: &SynthOptions) -> Result<u64, SynthError> {
    if opts.classes == 0 {
        return Err(SynthError::NoClasses);
    }
    if opts.shards > 0 {
        return generate_shards(root, opts);
    }
    for c in 0..opts.classes.min(opts.images.max(1)) {
        let dir = root.join(format!("class_{c:04}"));
        std::fs::create_dir_all(&dir).map_err(|source| SynthError::Write { path: dir, source })?;
    }
    let encoded = Encoded::new(opts);
    in_parallel(effective_threads(opts), opts.images, |enc, i| {
        let jpeg = encoded.image(enc, i)?;
        let path = image_path(root, opts, i);
        std::fs::write(&path, &jpeg).map_err(|source| SynthError::Write { path, source })
    })?;
    Ok(encoded.bytes.into_inner())
}

/// Encodes images and counts what was encoded, with progress every 1000 images.
struct Encoded<'a> {
    opts: &'a SynthOptions,
    enc_opts: EncodeOptions,
    done: AtomicUsize,
    bytes: std::sync::atomic::AtomicU64,
}

impl<'a> Encoded<'a> {
    fn new(opts: &'a SynthOptions) -> Encoded<'a> {
        Encoded {
            opts,
            enc_opts: EncodeOptions {
                quality: opts.quality,
                subsampling: Subsampling::S420,
                progressive: false,
                restart_rows: 0,
                arithmetic: false,
            },
            done: AtomicUsize::new(0),
            bytes: std::sync::atomic::AtomicU64::new(0),
        }
    }

    /// The JPEG of image `i`.
    fn image(&self, enc: &mut JpegEncoder, i: usize) -> Result<Vec<u8>, SynthError> {
        let (w, h, px) = image_pixels(self.opts, i);
        let jpeg = enc.encode_rgb(&px, w, h, &self.enc_opts)?;
        self.bytes.fetch_add(jpeg.len() as u64, Ordering::Relaxed);
        let d = self.done.fetch_add(1, Ordering::Relaxed) + 1;
        if d.is_multiple_of(1000) {
            tracing::info!("synth: {d}/{} images", self.opts.images);
        }
        Ok(jpeg)
    }
}

/// Runs `work(encoder, job)` for every job in `0..jobs` on `threads` threads, each with its
/// own encoder; the first error ends the run.
fn in_parallel<F>(threads: usize, jobs: usize, work: F) -> Result<(), SynthError>
where
    F: Fn(&mut JpegEncoder, usize) -> Result<(), SynthError> + Sync,
{
    let next = AtomicUsize::new(0);
    std::thread::scope(|s| -> Result<(), SynthError> {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                s.spawn(|| -> Result<(), SynthError> {
                    let mut enc = JpegEncoder::new()?;
                    loop {
                        let job = next.fetch_add(1, Ordering::Relaxed);
                        if job >= jobs {
                            return Ok(());
                        }
                        work(&mut enc, job)?;
                    }
                })
            })
            .collect();
        for w in workers {
            w.join().expect("synth worker panicked")?;
        }
        Ok(())
    })
}

fn effective_threads(opts: &SynthOptions) -> usize {
    if opts.threads == 0 {
        std::thread::available_parallelism().map_or(1, |n| n.get())
    } else {
        opts.threads
    }
}

/// Images `[start, end)` of shard `s` of `opts.shards`: contiguous, sizes differ by at most one.
pub(crate) fn shard_range(opts: &SynthOptions, s: usize) -> (usize, usize) {
    let (n, k) = (opts.images, opts.shards.max(1));
    (s * n / k, (s + 1) * n / k)
}

/// Writes `opts.shards` tar shards under `root`, shards spread over the threads.
fn generate_shards(root: &Path, opts: &SynthOptions) -> Result<u64, SynthError> {
    std::fs::create_dir_all(root).map_err(|source| SynthError::Write {
        path: root.to_owned(),
        source,
    })?;
    let encoded = Encoded::new(opts);
    let threads = effective_threads(opts).min(opts.shards);
    in_parallel(threads, opts.shards, |enc, shard| {
        let (start, end) = shard_range(opts, shard);
        let mut tar = crate::pack::TarWriter::create(&crate::pack::shard_path(root, shard))?;
        for i in start..end {
            let jpeg = encoded.image(enc, i)?;
            let label = i64::try_from(i % opts.classes).unwrap_or(i64::MAX);
            crate::pack::append_sample(&mut tar, &format!("{i:09}"), &jpeg, label)?;
        }
        tar.finish()?;
        Ok(())
    })?;
    Ok(encoded.bytes.into_inner())
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker_pipeline::source::index::{Dataset, OpenOptions};

    #[test]
    fn generates_an_imagefolder_that_indexes_and_decodes() {
        let dir = tempfile::tempdir().unwrap();
        let opts = SynthOptions {
            images: 12,
            classes: 3,
            size_scale: 0.25,
            threads: 2,
            ..SynthOptions::default()
        };
        let bytes = generate(dir.path(), &opts).unwrap();
        assert!(bytes > 12 * 1000, "{bytes}");
        let ds = Dataset::open(
            dir.path(),
            &OpenOptions {
                use_cache: false,
                ..OpenOptions::default()
            },
        )
        .unwrap();
        assert_eq!(ds.len(), 12);
        assert_eq!(ds.classes().len(), 3);
        // Same (seed, index), same pixels.
        assert_eq!(image_pixels(&opts, 5), image_pixels(&opts, 5));
        assert_ne!(image_pixels(&opts, 5).2, image_pixels(&opts, 6).2);
    }

    #[test]
    fn shards_hold_the_same_images_and_labels_as_the_folder() {
        let dir = tempfile::tempdir().unwrap();
        let folder = SynthOptions {
            images: 10,
            classes: 3,
            size_scale: 0.1,
            threads: 2,
            ..SynthOptions::default()
        };
        let shards = SynthOptions {
            shards: 3,
            ..folder.clone()
        };
        generate(&dir.path().join("f"), &folder).unwrap();
        generate(&dir.path().join("s"), &shards).unwrap();
        let no_cache = OpenOptions {
            use_cache: false,
            ..OpenOptions::default()
        };
        let f = Dataset::open(&dir.path().join("f"), &no_cache).unwrap();
        let s = Dataset::open(&dir.path().join("s"), &no_cache).unwrap();
        assert_eq!(s.len(), 10);
        // Shards hold images in index order; the folder sorts by class first.
        for i in 0..10 {
            let fi = (0..10)
                .find(|&k| f.sample(k).path.ends_with(format!("img_{i:08}.jpg")))
                .unwrap();
            assert_eq!(s.sample(i).label, f.sample(fi).label);
            assert_eq!(s.sample(i).len, f.sample(fi).len);
        }
    }
}
