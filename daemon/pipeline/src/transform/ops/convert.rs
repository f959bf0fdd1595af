//! A view's 8-bit pixels, after its operations, into its place in the slot: torchvision's
//! `ToDtype(scale=True)` then `Normalize(mean, std)` (`(px / 255 - mean) / std` in f32), or the
//! pixels as they are for `u8` output, in the spec's layout.

use half::{bf16, f16};
use stoker_kernels::image::RgbImage;
use stoker_wire::spec::{DType, Layout, PipelineSpec};

/// Writes `pixels` (the spec's output size) into `out` (`spec.image_bytes()` bytes) in the
/// spec's dtype and layout, native byte order.
///
/// # Panics
/// If `pixels` is not the spec's output size or `out` is not one image's bytes.
pub fn convert_into(pixels: &RgbImage, spec: &PipelineSpec, out: &mut [u8]) {
    let (h, w) = spec.crop.output_size();
    assert_eq!(
        (pixels.height, pixels.width),
        (h, w),
        "pixels of the output size"
    );
    assert_eq!(out.len(), spec.image_bytes(), "output buffer size");
    let n = h as usize * w as usize;
    let size = spec.dtype.size();
    // Element (pixel, channel) goes to this element index of the image.
    let at = |p: usize, c: usize| match spec.layout {
        Layout::Nchw => c * n + p,
        Layout::Nhwc => p * 3 + c,
    };
    for (p, px) in pixels.data.chunks_exact(3).enumerate() {
        for c in 0..3 {
            let dst = &mut out[at(p, c) * size..][..size];
            if spec.dtype == DType::U8 {
                dst[0] = px[c];
                continue;
            }
            let v = (f32::from(px[c]) * (1.0 / 255.0) - spec.mean[c]) / spec.std[c];
            match spec.dtype {
                DType::F32 => dst.copy_from_slice(&v.to_ne_bytes()),
                DType::F16 => dst.copy_from_slice(&f16::from_f32(v).to_ne_bytes()),
                DType::Bf16 => dst.copy_from_slice(&bf16::from_f32(v).to_ne_bytes()),
                DType::U8 => unreachable!("handled above"),
            }
        }
    }
}

/// Writes `value` into element (`c`, `y`, `x`) of an output image of the spec's dtype and
/// layout: f32 as f32, f16 and bf16 rounded, u8 clamped and truncated (as torch assigns a
/// float into a `uint8` tensor).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(super) fn store(spec: &PipelineSpec, out: &mut [u8], c: usize, y: usize, x: usize, value: f32) {
    let (h, w) = spec.crop.output_size();
    let (h, w) = (h as usize, w as usize);
    let index = match spec.layout {
        Layout::Nchw => (c * h + y) * w + x,
        Layout::Nhwc => (y * w + x) * 3 + c,
    };
    let size = spec.dtype.size();
    let dst = &mut out[index * size..][..size];
    match spec.dtype {
        DType::U8 => dst[0] = value.clamp(0.0, 255.0) as u8,
        DType::F32 => dst.copy_from_slice(&value.to_ne_bytes()),
        DType::F16 => dst.copy_from_slice(&f16::from_f32(value).to_ne_bytes()),
        DType::Bf16 => dst.copy_from_slice(&bf16::from_f32(value).to_ne_bytes()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pixels_are_normalised_into_the_layout() {
        let mut spec = PipelineSpec::eval(1, 2);
        spec.crop = stoker_wire::spec::Crop::CenterCrop {
            resize: 2,
            size: [1, 2],
        };
        let pixels = RgbImage {
            width: 2,
            height: 1,
            data: vec![0, 128, 255, 10, 20, 30],
        };
        let mut out = vec![0u8; spec.image_bytes()];
        convert_into(&pixels, &spec, &mut out);
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        // NCHW: red of both pixels first.
        assert!((f[0] - (0.0 - 0.485) / 0.229).abs() < 1e-6);
        assert!((f[1] - (10.0 / 255.0 - 0.485) / 0.229).abs() < 1e-6);
        assert!((f[4] - (1.0 - 0.406) / 0.225).abs() < 1e-6);
        spec.dtype = DType::U8;
        spec.layout = Layout::Nhwc;
        let mut out = vec![0u8; spec.image_bytes()];
        convert_into(&pixels, &spec, &mut out);
        assert_eq!(out, pixels.data);
    }
}
