//! What the tests of the CUDA serving path's clients share: the emulated GPU's environment
//! for the processes they start (daemon, C and Python clients), batches copied back to the
//! host, and how a device batch is compared with the CPU backend's batch for the same (seed,
//! epoch, step): indices, labels and statuses equal, pixels at a PSNR of at least 40 dB.
//!
//! # Design
//! PSNR is taken on the pixel scale (0..255): float outputs are de-normalised with the spec's
//! mean and std per channel (NCHW or NHWC), u8 outputs are pixels already. Equal crop boxes show
//! as pixels: a crop or flip that differs drops the PSNR far below 40 dB.
//!
//! # Limitations
//! The emulated GPU decodes with libjpeg-turbo and runs the kernel compiled for the host: this
//! proves the data path, not nvJPEG's own pixels (docs/cuda.md).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use stoker::{Batch, DType, Layout, PipelineSpec};

use crate::daemon::profile_dir;

/// `lib<name>.so` of this build (the emulated GPU's stand-ins), in the profile directory or
/// its `deps/`.
fn built_library(name: &str) -> PathBuf {
    let file = format!("lib{name}.so");
    let dir = profile_dir();
    [dir.clone(), dir.join("deps")]
        .iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "{file} not found in {} (cargo build -p stoker-emu-cuda -p stoker-emu-nvjpeg)",
                dir.display()
            )
        })
}

/// The environment a process needs to run on the emulated GPU: the gate, the stand-ins'
/// paths, and where NVIDIA's NVRTC and nvJPEG wheels are (scripts/cuda-wheels).
pub fn emulator_env() -> Vec<(String, String)> {
    let mut env = vec![
        ("STOKER_GPU_EMULATOR".into(), "1".into()),
        (
            "STOKER_LIBCUDA".into(),
            built_library("stoker_emu_cuda").display().to_string(),
        ),
        (
            "STOKER_NVJPEG".into(),
            built_library("stoker_emu_nvjpeg").display().to_string(),
        ),
    ];
    if let Some(dir) = stoker_nvidia::loader::wheel_dir() {
        env.push(("STOKER_NVIDIA_DIR".into(), dir.display().to_string()));
    }
    env
}

/// Whether NVIDIA's NVRTC wheel is installed (the daemon's CUDA backend compiles its kernel
/// with it); without it the tests say SKIPPED, or fail when `CI` is set.
pub fn have_nvrtc(test: &str) -> bool {
    let found = stoker_nvidia::loader::wheel_dir().is_some_and(|d| d.join("nvidia").is_dir());
    if !found {
        let msg = format!("{test}: NVIDIA wheels not found (run scripts/cuda-wheels)");
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("SKIPPED {msg}");
    }
    found
}

/// An ImageFolder of smooth JPEGs under `root`: `classes` x `per_class` images of about
/// `side` pixels (sizes vary), colours in low-frequency gradients without the wrap-around
/// edges of [`crate::synthetic_rgb`]. Photos are smooth; hard edges would measure how two
/// decoders round a DCT-scaled decode, not whether two pipelines agree.
pub fn write_smooth_folder(root: &Path, classes: u32, per_class: u32, side: u32) -> usize {
    crate::images::write_folder_of(root, classes, per_class, |c, i| {
        let (w, h) = (side + (i % 5) * 6, side + (i % 3) * 8);
        let phase = f64::from(c * per_class + i);
        let mut rgb = Vec::with_capacity((w * h * 3) as usize);
        for y in 0..h {
            for x in 0..w {
                let (fx, fy) = (f64::from(x) / f64::from(w), f64::from(y) / f64::from(h));
                let wave = (std::f64::consts::TAU * (fx + 0.5 * fy) + phase).sin();
                rgb.push((40.0 + 170.0 * fx) as u8);
                rgb.push((40.0 + 170.0 * fy) as u8);
                rgb.push((128.0 + 90.0 * wave) as u8);
            }
        }
        crate::encode_jpeg(&rgb, w, h, 92)
    })
}

/// One batch as the host sees it.
#[derive(Debug, Clone, PartialEq)]
pub struct HostBatch {
    /// The epoch the batch belongs to.
    pub epoch: u64,
    /// Its step within the epoch.
    pub step: u64,
    /// The dataset index of each sample.
    pub indices: Vec<u64>,
    /// Each sample's label.
    pub labels: Vec<i64>,
    /// Each sample's `SampleStatus` as its byte.
    pub status: Vec<u8>,
    /// The `n` images in the spec's dtype and layout.
    pub images: Vec<u8>,
}

impl HostBatch {
    /// Whether every sample of the batch is Ok.
    pub fn all_ok(&self) -> bool {
        self.status
            .iter()
            .all(|&s| s == stoker::SampleStatus::Ok as u8)
    }

    /// Copies a received batch (host or device images) to the host.
    pub fn of(b: &Batch) -> HostBatch {
        let mut images = vec![0u8; b.images_len()];
        b.copy_images_to_host(&mut images)
            .unwrap_or_else(|e| panic!("copying batch ({}, {}) back: {e}", b.epoch(), b.step()));
        HostBatch {
            epoch: b.epoch(),
            step: b.step(),
            indices: b.indices().to_vec(),
            labels: b.labels().to_vec(),
            status: b.status().to_vec(),
            images,
        }
    }

    /// Reads the batches `tests/c/cuda_client.c` dumped.
    pub fn read_dump(path: &Path) -> Vec<HostBatch> {
        let bytes = std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let mut rest = bytes.as_slice();
        let mut take = |n: usize| {
            let (s, r) = rest.split_at(n);
            rest = r;
            s
        };
        let u64_at = |s: &[u8]| u64::from_le_bytes(s.try_into().unwrap());
        let mut out = Vec::new();
        let mut left = bytes.len();
        while left > 0 {
            let epoch = u64_at(take(8));
            let step = u64_at(take(8));
            let n = u32::from_le_bytes(take(4).try_into().unwrap()) as usize;
            take(4);
            let indices = take(8 * n).chunks(8).map(u64_at).collect();
            let labels = take(8 * n).chunks(8).map(|c| u64_at(c) as i64).collect();
            let status = take(n).to_vec();
            let len = u64_at(take(8)) as usize;
            let images = take(len).to_vec();
            left -= 8 + 8 + 4 + 4 + 17 * n + 8 + len;
            out.push(HostBatch {
                epoch,
                step,
                indices,
                labels,
                status,
                images,
            });
        }
        out
    }
}

/// The images' values on the pixel scale (0..255), in their own order.
pub fn pixels(spec: &PipelineSpec, bytes: &[u8]) -> Vec<f64> {
    let (h, w) = spec.crop.output_size();
    let plane = (h * w) as usize;
    let channel = |i: usize| match spec.layout {
        Layout::Nchw => (i / plane) % 3,
        Layout::Nhwc => i % 3,
    };
    let denorm = |i: usize, v: f64| {
        let c = channel(i);
        (v * f64::from(spec.std[c]) + f64::from(spec.mean[c])) * 255.0
    };
    match spec.dtype {
        DType::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .enumerate()
            .map(|(i, c)| denorm(i, half::f16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .enumerate()
            .map(|(i, c)| denorm(i, half::bf16::from_le_bytes([c[0], c[1]]).to_f64()))
            .collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .enumerate()
            .map(|(i, c)| denorm(i, f64::from(f32::from_le_bytes(c.try_into().unwrap()))))
            .collect(),
    }
}

/// Each view's `n` images of `b` copied to the host (from a device ring or a host one), for a
/// job whose elements are `element` bytes.
pub fn views_to_host(b: &Batch, element: usize) -> Vec<Vec<u8>> {
    (0..b.views())
        .map(|v| {
            let (h, w) = b.view_size(v);
            let mut host = vec![0u8; b.n() * h as usize * w as usize * 3 * element];
            b.copy_view_to_host(v, &mut host).unwrap();
            host
        })
        .collect()
}

/// PSNR in dB between two batches' images on the pixel scale (infinite when equal).
pub fn psnr(spec: &PipelineSpec, a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len(), "images of different sizes");
    let (a, b) = (pixels(spec, a), pixels(spec, b));
    let mse = a.iter().zip(&b).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64.powi(2) / mse).log10()
    }
}

/// Asserts that `got` (from a device ring) is `want` (the CPU backend's batches for the same
/// job terms) batch for batch: same (epoch, step), indices, labels and statuses, and pixels at
/// a PSNR of at least `min_db`. Returns the lowest PSNR seen.
pub fn assert_matches_cpu(
    what: &str,
    spec: &PipelineSpec,
    got: &[HostBatch],
    want: &[HostBatch],
    min_db: f64,
) -> f64 {
    assert_eq!(got.len(), want.len(), "{what}: batch count");
    let mut worst = f64::INFINITY;
    for (g, w) in got.iter().zip(want) {
        let at = format!("{what}, batch ({}, {})", w.epoch, w.step);
        assert_eq!((g.epoch, g.step), (w.epoch, w.step), "{at}: position");
        assert_eq!(g.indices, w.indices, "{at}: indices");
        assert_eq!(g.labels, w.labels, "{at}: labels");
        assert_eq!(g.status, w.status, "{at}: statuses");
        let db = psnr(spec, &g.images, &w.images);
        assert!(db >= min_db, "{at}: PSNR {db:.1} dB < {min_db} dB");
        worst = worst.min(db);
    }
    worst
}

/// Every (dtype, layout) the outputs come in, as specs of `batch_size` x `side`² crops.
pub fn all_outputs(batch_size: u32, side: u32) -> Vec<PipelineSpec> {
    let mut out = Vec::new();
    for dtype in [DType::U8, DType::F16, DType::Bf16, DType::F32] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            out.push(PipelineSpec {
                dtype,
                layout,
                epochs: Some(1),
                ..PipelineSpec::train(batch_size, side)
            });
        }
    }
    out
}
