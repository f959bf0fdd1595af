//! The self-test's kernel checks: `stoker_augment` on the GPU against
//! `kernels::reference::augment_reference`, for every dtype and layout.
//!
//! # Design
//! - Inputs are a generated image (smooth and noisy halves) and up to three photos decoded by
//!   the CPU decoder; each batch runs twice, with the training transform (random crops and
//!   flips drawn by `augment::sample_params`, taps clamped to the crop) and the evaluation
//!   transform (resize + centre crop, taps over the whole image).
//! - The output is poisoned (0xFF bytes: NaN in f32, f16 and bf16) before each launch, so an
//!   element the kernel did not write fails.
//! - Tolerances (`reference::tolerance_units`): u8 1, f32 1e-3, f16 / bf16 one unit in the
//!   last place.
//!
//! # Limitations
//! - One launch per (dtype, layout, transform); speed is not measured here.

use std::path::PathBuf;

use stoker_kernels::augment::{AugmentBatch, AugmentSample};
use stoker_kernels::image::RgbImage;
use stoker_kernels::reference::{augment_reference, test_image, tolerance_units, OutputParams};
use stoker_nvidia::cuda::DeviceBuffer;
use stoker_wire::spec::{DType, Layout, PipelineSpec};

use super::GpuUnderTest;
use stoker_pipeline::transform::decode::{CpuDecoder, Limits};

/// Photos used as kernel inputs, besides the generated image.
const PHOTOS: usize = 3;

/// The kernel's inputs: the generated image and up to [`PHOTOS`] decoded photos.
fn inputs(photos: &[PathBuf]) -> Vec<RgbImage> {
    let mut images = vec![test_image(97, 61, 0x9e37_79b9_7f4a_7c15)];
    let Ok(mut cpu) = CpuDecoder::new(Limits::default()) else {
        return images;
    };
    for p in photos {
        if images.len() > PHOTOS {
            break;
        }
        let mut img = RgbImage::default();
        if let Ok(bytes) = std::fs::read(p) {
            if cpu.decode_full(&bytes, &mut img).is_ok() {
                images.push(img);
            }
        }
    }
    images
}

/// `stoker_augment` vs the reference for each dtype x layout: (check name, outcome).
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
pub(super) fn augment(
    gpu: &GpuUnderTest,
    photos: &[PathBuf],
    size: u32,
) -> Vec<(String, Result<String, String>)> {
    let images = inputs(photos);
    // String error: a failed check is one line of the selftest report, composed here from the
    // failing call and printed as is.
    let uploaded: Result<Vec<DeviceBuffer>, String> = images
        .iter()
        .map(|img| {
            let buf = gpu
                .device
                .alloc(img.data.len())
                .map_err(|e| e.to_string())?;
            gpu.stream
                .copy_to_device(&buf, 0, &img.data)
                .map_err(|e| e.to_string())?;
            Ok(buf)
        })
        .collect();
    let mut out = Vec::new();
    for dtype in [DType::U8, DType::F16, DType::Bf16, DType::F32] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let name = format!("stoker_augment {dtype:?} {layout:?} vs reference").to_lowercase();
            let name = name.replacen("stoker_augment", "kernel: stoker_augment", 1);
            let outcome = match &uploaded {
                Ok(bufs) => compare(gpu, &images, bufs, size, dtype, layout),
                Err(e) => Err(format!("uploading the inputs: {e}")),
            };
            out.push((name, outcome));
        }
    }
    out
}

/// One dtype x layout, with the training and the evaluation transform.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn compare(
    gpu: &GpuUnderTest,
    images: &[RgbImage],
    bufs: &[DeviceBuffer],
    size: u32,
    dtype: DType,
    layout: Layout,
) -> Result<String, String> {
    let mut worst = 0f64;
    let n = u32::try_from(images.len()).map_err(|_| format!("{} images", images.len()))?;
    for base in [PipelineSpec::train(n, size), PipelineSpec::eval(n, size)] {
        let spec = PipelineSpec {
            dtype,
            layout,
            ..base
        };
        worst = worst.max(launch_and_compare(gpu, images, bufs, &spec)?);
    }
    let detail = format!(
        "{} images x (random crop + flip, centre crop) at {size}x{size}: worst {worst:.2} of \
         the tolerance",
        images.len()
    );
    if worst <= 1.0 {
        Ok(detail)
    } else {
        Err(detail)
    }
}

/// Launches one batch of `spec` over `images` and returns the worst difference from the
/// reference, in tolerance units.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn launch_and_compare(
    gpu: &GpuUnderTest,
    images: &[RgbImage],
    bufs: &[DeviceBuffer],
    spec: &PipelineSpec,
) -> Result<f64, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let params: Vec<_> = images
        .iter()
        .enumerate()
        .map(|(i, img)| {
            stoker_pipeline::transform::augment::sample_params(
                spec, img.width, img.height, 0, 0, i as u64,
            )
        })
        .collect();
    let samples: Vec<AugmentSample> = images
        .iter()
        .zip(bufs)
        .zip(&params)
        .map(|((img, buf), &(crop, flip))| {
            let pitch = u64::from(img.width) * 3;
            AugmentSample::new(buf.ptr(), pitch, img.width, img.height, crop, flip)
        })
        .collect();
    let sample_bytes = AugmentSample::as_bytes(&samples);
    let sample_buf = gpu.device.alloc(sample_bytes.len()).map_err(|e| err(&e))?;
    gpu.stream
        .copy_to_device(&sample_buf, 0, sample_bytes)
        .map_err(|e| err(&e))?;
    let image_bytes = spec.image_bytes();
    let out = gpu
        .device
        .alloc(image_bytes * images.len())
        .map_err(|e| err(&e))?;
    let poison = vec![0xFFu8; out.len()];
    gpu.stream
        .copy_to_device(&out, 0, &poison)
        .map_err(|e| err(&e))?;
    let n = u32::try_from(images.len()).map_err(|_| format!("{} images", images.len()))?;
    let batch = AugmentBatch::new(spec, out.ptr(), sample_buf.ptr(), n);
    // SAFETY: `out` holds n * image_bytes bytes, `sample_buf` n samples, and each sample's
    // source is a live upload of height * pitch bytes; all are kept until the stream is
    // synchronised below.
    let launched = unsafe { gpu.kernels.augment(&gpu.stream, &batch) };
    let synced = gpu.stream.synchronize();
    launched.map_err(|e| err(&e))?;
    synced.map_err(|e| err(&e))?;
    let mut got = vec![0u8; out.len()];
    out.read(&mut got).map_err(|e| err(&e))?;
    let (out_h, out_w) = spec.crop.output_size();
    let mut worst = 0f64;
    for (k, (img, &(crop, flip))) in images.iter().zip(&params).enumerate() {
        let want = augment_reference(img, crop, flip, out_h, out_w, &OutputParams::from(spec));
        let part = &got[k * image_bytes..(k + 1) * image_bytes];
        worst = worst.max(tolerance_units(part, &want, spec.dtype));
    }
    Ok(worst)
}
