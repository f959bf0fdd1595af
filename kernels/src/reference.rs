//! Straightforward CPU reference implementations of every kernel: the oracle that both the CPU
//! backend's fast code and the GPU kernels are tested against. Written for clarity, not speed.

#![forbid(unsafe_code)]

pub use crate::image::{CropBox, RgbImage};
use stoker_wire::spec::{DType, Layout, PipelineSpec};

/// What [`augment_reference`] writes besides the pixels: element type, layout and the
/// normalisation applied to float outputs.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct OutputParams {
    /// The element type written.
    pub dtype: DType,
    /// NCHW or NHWC.
    pub layout: Layout,
    /// Channel means, 0..1 scale (float outputs only).
    pub mean: [f32; 3],
    /// Channel standard deviations, 0..1 scale (float outputs only).
    pub std: [f32; 3],
    /// Filter taps stay inside the crop box (torchvision's RandomResizedCrop crops, then
    /// resizes) rather than the whole image (Resize + CenterCrop resizes, then crops).
    pub clamp_to_crop: bool,
}

impl From<&PipelineSpec> for OutputParams {
    fn from(spec: &PipelineSpec) -> OutputParams {
        OutputParams {
            dtype: spec.dtype,
            layout: spec.layout,
            mean: spec.mean,
            std: spec.std,
            clamp_to_crop: matches!(spec.crop, stoker_wire::spec::Crop::RandomResized { .. }),
        }
    }
}

/// The triangle ("bilinear") filter: `max(0, 1 - |t|)`.
fn triangle(t: f64) -> f64 {
    (1.0 - t.abs()).max(0.0)
}

/// The source taps of one output sample along one axis: the first source index and the
/// normalised weights of `first..first + weights.len()`.
#[derive(Debug, Clone, PartialEq)]
pub struct Taps {
    /// The first source sample read.
    pub first: usize,
    /// The weight of each source sample from `first` on, summing to 1.
    pub weights: Vec<f64>,
}

/// The source window `[lo, hi)` filter taps may read along one axis of `in_size` samples for
/// a box `[start, start + len)`: the whole axis, or with `clamp_to_crop` the box widened to
/// whole pixels (exactly torchvision's crop for the integer boxes RandomResizedCrop draws).
/// A box wholly outside the axis falls back to the whole axis.
// `lo` is at least 0 and `hi` at most `in_size`, so both fit a u32.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn tap_window(start: f64, len: f64, in_size: u32, clamp_to_crop: bool) -> (u32, u32) {
    if !clamp_to_crop {
        return (0, in_size);
    }
    let lo = start.floor().max(0.0);
    let hi = (start + len).ceil().min(f64::from(in_size));
    if lo < hi {
        (lo as u32, hi as u32)
    } else {
        (0, in_size)
    }
}

/// Pillow's / torchvision's antialiased bilinear taps for output sample `o` of `out_len`
/// samples covering `[start, start + len)` of an axis whose readable samples are
/// `window.0..window.1` (see [`tap_window`]).
///
/// `scale = len / out_len`, `filterscale = max(scale, 1)`, `support = filterscale`,
/// `center = start + (o + 0.5) * scale`; taps are the source samples
/// `max(floor(center - support + 0.5), lo) .. min(floor(center + support + 0.5), hi)`,
/// weighted `triangle((x - center + 0.5) / filterscale)` and normalised to sum to 1.
/// A box lying wholly outside the axis takes the nearest edge sample.
// `lo` and `hi` are clamped into `window`, a range of u32s, before they become indices.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn antialias_taps(start: f64, len: f64, out_len: u32, window: (u32, u32), o: u32) -> Taps {
    let (win_lo, win_hi) = window;
    assert!(win_hi > win_lo && out_len > 0, "empty axis");
    let scale = len / f64::from(out_len);
    let filterscale = scale.max(1.0);
    let support = filterscale;
    let center = start + (f64::from(o) + 0.5) * scale;
    let lo = (center - support + 0.5).floor().max(f64::from(win_lo));
    let hi = (center + support + 0.5).floor().min(f64::from(win_hi));
    let mut first = lo as usize;
    let end = hi as usize;
    let mut weights: Vec<f64> = (first..end.max(first))
        .map(|x| triangle((x as f64 - center + 0.5) / filterscale))
        .collect();
    let total: f64 = weights.iter().sum();
    if total > 0.0 {
        for w in &mut weights {
            *w /= total;
        }
    } else {
        // Only reachable for a box outside the image: take the nearest edge sample.
        first = (center.floor().max(f64::from(win_lo)) as usize).min(win_hi as usize - 1);
        weights = vec![1.0];
    }
    Taps { first, weights }
}

/// Rounds half away from zero and clamps into 0..=255.
// Clamped into 0..=255 first.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn to_u8(v: f64) -> u8 {
    v.round().clamp(0.0, 255.0) as u8
}

/// Crops `crop` out of `img`, resizes it to `out_h` x `out_w` with torchvision's antialiased
/// bilinear filter, flips it horizontally if `flip`, normalises and converts it as `params`
/// says, and returns the bytes of that one image (native byte order).
///
/// The oracle: f64 throughout, one direct 2-D weighted sum per output pixel. See
/// `docs/augment.md` for the math and the rounding rules.
pub fn augment_reference(
    img: &RgbImage,
    crop: CropBox,
    flip: bool,
    out_h: u32,
    out_w: u32,
    params: &OutputParams,
) -> Vec<u8> {
    let (h, w) = (out_h as usize, out_w as usize);
    let mut values = vec![0.0f64; h * w * 3]; // HWC, 0..255 scale
    let wx = tap_window(crop.x, crop.w, img.width, params.clamp_to_crop);
    let wy = tap_window(crop.y, crop.h, img.height, params.clamp_to_crop);
    for oy in 0..out_h {
        let ty = antialias_taps(crop.y, crop.h, out_h, wy, oy);
        for ox in 0..out_w {
            let src_ox = if flip { out_w - 1 - ox } else { ox };
            let tx = antialias_taps(crop.x, crop.w, out_w, wx, src_ox);
            let mut acc = [0.0f64; 3];
            for (dy, wy) in ty.weights.iter().enumerate() {
                for (dx, wx) in tx.weights.iter().enumerate() {
                    // Taps lie inside the source window, whose bounds are u32s.
                    #[allow(clippy::cast_possible_truncation)]
                    let px = img.pixel((tx.first + dx) as u32, (ty.first + dy) as u32);
                    for c in 0..3 {
                        acc[c] += wy * wx * f64::from(px[c]);
                    }
                }
            }
            let i = (oy as usize * w + ox as usize) * 3;
            values[i..i + 3].copy_from_slice(&acc);
        }
    }

    let mut out = Vec::with_capacity(h * w * 3 * params.dtype.size());
    for n in 0..h * w * 3 {
        // n walks the output in its own layout; find the HWC element it holds.
        let (y, x, c) = match params.layout {
            Layout::Nhwc => (n / (w * 3), n / 3 % w, n % 3),
            Layout::Nchw => (n % (h * w) / w, n % w, n / (h * w)),
        };
        let v = values[(y * w + x) * 3 + c];
        let norm = (v / 255.0 - f64::from(params.mean[c])) / f64::from(params.std[c]);
        match params.dtype {
            DType::U8 => out.push(to_u8(v)),
            // f32 output is f32's precision, as the kernels compute it.
            #[allow(clippy::cast_possible_truncation)]
            DType::F32 => out.extend_from_slice(&(norm as f32).to_ne_bytes()),
            DType::F16 => out.extend_from_slice(&half::f16::from_f64(norm).to_ne_bytes()),
            DType::Bf16 => out.extend_from_slice(&half::bf16::from_f64(norm).to_ne_bytes()),
        }
    }
    out
}

/// A deterministic test image: a repeating ramp on the left half, xorshift noise (from
/// `seed`, nonzero) on the right: smooth and sharp parts for the kernel checks.
// The noise is the xorshift state's low byte.
#[allow(clippy::cast_possible_truncation)]
pub fn test_image(w: u32, h: u32, seed: u64) -> RgbImage {
    let mut x = seed.max(1);
    let data = (0..w * h * 3)
        .map(|i| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            if (i / 3) % w < w / 2 {
                (i % 251) as u8
            } else {
                x as u8
            }
        })
        .collect();
    RgbImage {
        width: w,
        height: h,
        data,
    }
}

/// The largest difference between a kernel's output `got` and the reference `want` (both of
/// `dtype`), in units of the GPU self-test's tolerance (docs/cuda.md): u8 1, f32 1e-3, f16 and
/// bf16 one unit in the last place of the reference value. At most 1.0 passes.
pub fn tolerance_units(got: &[u8], want: &[u8], dtype: DType) -> f64 {
    assert_eq!(got.len(), want.len(), "outputs of different sizes");
    let mut worst = 0f64;
    match dtype {
        DType::U8 => {
            for (a, b) in got.iter().zip(want) {
                worst = worst.max((f64::from(*a) - f64::from(*b)).abs());
            }
        }
        DType::F32 => {
            for (a, b) in got.chunks_exact(4).zip(want.chunks_exact(4)) {
                let a = f32::from_ne_bytes(a.try_into().expect("4 bytes"));
                let b = f32::from_ne_bytes(b.try_into().expect("4 bytes"));
                // NaN never passes.
                let d = f64::from((a - b).abs());
                worst = worst.max(if d.is_nan() { f64::INFINITY } else { d / 1e-3 });
            }
        }
        DType::F16 | DType::Bf16 => {
            for (a, b) in got.chunks_exact(2).zip(want.chunks_exact(2)) {
                let a = u16::from_ne_bytes(a.try_into().expect("2 bytes"));
                let b = u16::from_ne_bytes(b.try_into().expect("2 bytes"));
                let (va, vb, ulp) = if dtype == DType::F16 {
                    let next = half::f16::from_bits(b.wrapping_add(1)).to_f64();
                    let vb = half::f16::from_bits(b).to_f64();
                    (half::f16::from_bits(a).to_f64(), vb, (next - vb).abs())
                } else {
                    let next = half::bf16::from_bits(b.wrapping_add(1)).to_f64();
                    let vb = half::bf16::from_bits(b).to_f64();
                    (half::bf16::from_bits(a).to_f64(), vb, (next - vb).abs())
                };
                let d = (va - vb).abs() / (ulp + 1e-6);
                worst = worst.max(if d.is_nan() { f64::INFINITY } else { d });
            }
        }
    }
    worst
}

/// Peak signal-to-noise ratio of two 8-bit images of the same length, in dB (infinite when
/// they are equal): how the decoders and the augment kernels are compared with each other.
pub fn psnr(a: &[u8], b: &[u8]) -> f64 {
    assert_eq!(a.len(), b.len(), "psnr of images of different sizes");
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / a.len().max(1) as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64 * 255.0 / mse).log10()
    }
}

#[cfg(test)]
mod tests {
    #![allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_possible_wrap
    )]

    use super::*;

    fn params(dtype: DType, layout: Layout) -> OutputParams {
        OutputParams {
            dtype,
            layout,
            mean: [0.0; 3],
            std: [1.0; 3],
            clamp_to_crop: false,
        }
    }

    fn gradient(width: u32, height: u32) -> RgbImage {
        let mut img = RgbImage::default();
        img.reset(width, height);
        for y in 0..height {
            for x in 0..width {
                let i = ((y * width + x) * 3) as usize;
                img.data[i] = (x * 10) as u8;
                img.data[i + 1] = (y * 10) as u8;
                img.data[i + 2] = 7;
            }
        }
        img
    }

    /// A deterministic test image with detail at every pixel.
    fn textured(width: u32, height: u32) -> RgbImage {
        let mut img = RgbImage::default();
        img.reset(width, height);
        for (i, v) in img.data.iter_mut().enumerate() {
            *v = ((i * 7919) % 251) as u8;
        }
        img
    }

    #[test]
    fn clamped_crop_equals_resizing_the_cropped_image() {
        // torchvision's RandomResizedCrop crops first, then resizes: the taps of a clamped
        // interior box must never read outside it.
        let img = textured(40, 30);
        let (x, y, w, h) = (7u32, 5u32, 19u32, 13u32);
        let mut cropped = RgbImage::default();
        cropped.reset(w, h);
        for yy in 0..h {
            for xx in 0..w {
                let p = img.pixel(x + xx, y + yy);
                let i = ((yy * w + xx) * 3) as usize;
                cropped.data[i..i + 3].copy_from_slice(&p);
            }
        }
        let mut params = params(DType::F32, Layout::Nhwc);
        for (ow, oh) in [(8, 6), (19, 13), (31, 27)] {
            params.clamp_to_crop = false;
            let want = augment_reference(&cropped, CropBox::full(w, h), false, oh, ow, &params);
            params.clamp_to_crop = true;
            let box_ = CropBox::new(x as f64, y as f64, w as f64, h as f64);
            let got = augment_reference(&img, box_, false, oh, ow, &params);
            assert_eq!(got, want, "{ow}x{oh}");
            if ow < w {
                // Downscaling widens the filter past the box's edge: unclamped it reads there.
                params.clamp_to_crop = false;
                let unclamped = augment_reference(&img, box_, false, oh, ow, &params);
                assert!(
                    unclamped != want,
                    "{ow}x{oh}: edge taps should differ unclamped"
                );
            }
        }
    }

    #[test]
    fn tap_window_widens_to_whole_pixels_and_stays_inside() {
        assert_eq!(tap_window(2.5, 3.0, 10, false), (0, 10));
        assert_eq!(tap_window(2.5, 3.0, 10, true), (2, 6));
        assert_eq!(tap_window(-3.0, 20.0, 10, true), (0, 10));
        assert_eq!(tap_window(12.0, 3.0, 10, true), (0, 10));
    }

    #[test]
    fn taps_match_pillow_for_a_halving() {
        // 4 -> 2: scale 2, support 2, center of output 0 is 1.0; taps 0..3 with
        // triangle((x - 0.5) / 2) = 0.75, 0.75, 0.25, normalised by 1.75.
        let t = antialias_taps(0.0, 4.0, 2, (0, 4), 0);
        assert_eq!(t.first, 0);
        let want = [0.75 / 1.75, 0.75 / 1.75, 0.25 / 1.75];
        assert_eq!(t.weights.len(), 3);
        for (a, b) in t.weights.iter().zip(want) {
            assert!((a - b).abs() < 1e-12, "{:?}", t.weights);
        }
    }

    #[test]
    fn taps_for_an_upscale_interpolate_linearly() {
        // 2 -> 4: scale 0.5, output 1 has center 0.75: taps 0..2, weights 0.75, 0.25.
        let t = antialias_taps(0.0, 2.0, 4, (0, 2), 1);
        assert_eq!(t.first, 0);
        assert!((t.weights[0] - 0.75).abs() < 1e-12 && (t.weights[1] - 0.25).abs() < 1e-12);
        // Output 0 has center 0.25: tap -1 is clamped away, leaving pixel 0 alone.
        let t = antialias_taps(0.0, 2.0, 4, (0, 2), 0);
        assert_eq!((t.first, t.weights.as_slice()), (0, &[1.0][..]));
    }

    #[test]
    fn identity_crop_returns_the_pixels_and_flip_mirrors_them() {
        let img = gradient(5, 3);
        let p = params(DType::U8, Layout::Nhwc);
        let out = augment_reference(&img, CropBox::full(5, 3), false, 3, 5, &p);
        assert_eq!(out, img.data);
        let flipped = augment_reference(&img, CropBox::full(5, 3), true, 3, 5, &p);
        for y in 0..3u32 {
            for x in 0..5u32 {
                let i = ((y * 5 + x) * 3) as usize;
                assert_eq!(flipped[i..i + 3], img.pixel(4 - x, y));
            }
        }
    }

    #[test]
    fn layouts_and_dtypes_hold_the_same_values() {
        let img = gradient(6, 4);
        let crop = CropBox::new(1.0, 0.5, 4.0, 3.0);
        let hwc = augment_reference(&img, crop, false, 2, 3, &params(DType::U8, Layout::Nhwc));
        let chw = augment_reference(&img, crop, false, 2, 3, &params(DType::U8, Layout::Nchw));
        for y in 0..2 {
            for x in 0..3 {
                for c in 0..3 {
                    assert_eq!(hwc[(y * 3 + x) * 3 + c], chw[c * 6 + y * 3 + x]);
                }
            }
        }
        let mut p = params(DType::F32, Layout::Nhwc);
        p.mean = [0.5; 3];
        p.std = [0.25; 3];
        let f = augment_reference(&img, crop, false, 2, 3, &p);
        assert_eq!(f.len(), 2 * 3 * 3 * 4);
        for (i, bytes) in f.chunks_exact(4).enumerate() {
            let v = f32::from_ne_bytes(bytes.try_into().unwrap());
            let back = (v * 0.25 + 0.5) * 255.0;
            assert!(
                (back - f32::from(hwc[i])).abs() <= 0.51,
                "{i}: {back} vs {}",
                hwc[i]
            );
        }
        for dtype in [DType::F16, DType::Bf16] {
            p.dtype = dtype;
            assert_eq!(
                augment_reference(&img, crop, false, 2, 3, &p).len(),
                2 * 3 * 3 * 2
            );
        }
    }

    #[test]
    fn constant_image_stays_constant_at_any_scale() {
        let mut img = RgbImage::default();
        img.reset(7, 5);
        img.data.fill(200);
        let p = params(DType::U8, Layout::Nchw);
        for (crop, oh, ow) in [
            (CropBox::full(7, 5), 13, 2),
            (CropBox::new(2.5, 1.25, 0.5, 0.75), 4, 4),
            (CropBox::new(0.0, 0.0, 1.0, 1.0), 1, 1),
        ] {
            let out = augment_reference(&img, crop, true, oh, ow, &p);
            assert!(out.iter().all(|&v| v == 200), "{crop:?}");
        }
    }

    #[test]
    fn psnr_is_infinite_for_equal_images_and_48db_for_an_error_of_one() {
        assert_eq!(psnr(&[1, 2, 3], &[1, 2, 3]), f64::INFINITY);
        let p = psnr(&[10; 64], &[11; 64]);
        assert!((p - 48.1308).abs() < 1e-3, "{p}");
    }
}
