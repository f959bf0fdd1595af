//! A view's 8-bit pixels, after its operations, into its place in the slot: torchvision's
//! `ToDtype(scale=True)` then `Normalize(mean, std)` (`(px / 255 - mean) / std` in f32), or the
//! pixels as they are for `u8` output, in the spec's layout.

use half::{bf16, f16};
use stoker_kernels::image::RgbImage;
use stoker_wire::spec::{DType, Layout, PipelineSpec};

/// Writes `pixels` (the spec's output size) into `out` (`spec.image_bytes()` bytes) in the
/// spec's dtype and layout, native byte order.
///
/// An 8-bit input has 256 values per channel: each channel's 256 output elements are computed
/// once (the same f32 arithmetic per value) and the image is a table lookup per element.
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
    match spec.dtype {
        DType::U8 => scatter(pixels, spec.layout, out, &identity_table()),
        DType::F32 => scatter(pixels, spec.layout, out, &table(spec, f32::to_ne_bytes)),
        DType::F16 => scatter(
            pixels,
            spec.layout,
            out,
            &table(spec, |v| f16::from_f32(v).to_ne_bytes()),
        ),
        DType::Bf16 => scatter(
            pixels,
            spec.layout,
            out,
            &table(spec, |v| bf16::from_f32(v).to_ne_bytes()),
        ),
    }
}

/// Per channel, the output element of each 8-bit value: `(px / 255 - mean) / std` in f32,
/// encoded by `encode`.
fn table<const N: usize>(
    spec: &PipelineSpec,
    encode: impl Fn(f32) -> [u8; N],
) -> [[[u8; N]; 256]; 3] {
    let mut t = [[[0u8; N]; 256]; 3];
    for (c, channel) in t.iter_mut().enumerate() {
        for (px, slot) in (0u8..=255).zip(channel.iter_mut()) {
            *slot = encode((f32::from(px) * (1.0 / 255.0) - spec.mean[c]) / spec.std[c]);
        }
    }
    t
}

/// The `u8` output: each value as it is.
fn identity_table() -> [[[u8; 1]; 256]; 3] {
    let mut t = [[[0u8; 1]; 256]; 3];
    for channel in &mut t {
        for (px, slot) in (0u8..=255).zip(channel.iter_mut()) {
            *slot = [px];
        }
    }
    t
}

/// Writes each element of `pixels` (interleaved RGB) through its channel's `table` into
/// `out`, planar (NCHW) or interleaved (NHWC).
fn scatter<const N: usize>(
    pixels: &RgbImage,
    layout: Layout,
    out: &mut [u8],
    table: &[[[u8; N]; 256]; 3],
) {
    match layout {
        Layout::Nhwc => {
            for (px, dst) in pixels.data.chunks_exact(3).zip(out.chunks_exact_mut(3 * N)) {
                for c in 0..3 {
                    dst[c * N..][..N].copy_from_slice(&table[c][usize::from(px[c])]);
                }
            }
        }
        Layout::Nchw => {
            let plane = out.len() / 3;
            let (r, rest) = out.split_at_mut(plane);
            let (g, b) = rest.split_at_mut(plane);
            let planes = r
                .chunks_exact_mut(N)
                .zip(g.chunks_exact_mut(N))
                .zip(b.chunks_exact_mut(N));
            for (px, ((r, g), b)) in pixels.data.chunks_exact(3).zip(planes) {
                r.copy_from_slice(&table[0][usize::from(px[0])]);
                g.copy_from_slice(&table[1][usize::from(px[1])]);
                b.copy_from_slice(&table[2][usize::from(px[2])]);
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

    /// The table gives, element for element, the formula computed per element (through
    /// `store`, which encodes each dtype), in every dtype and layout.
    #[test]
    fn the_table_gives_the_formula_for_every_dtype_and_layout() {
        let (w, h) = (7u32, 5u32);
        let mut data: Vec<u8> = (0..w * h * 3)
            .map(|i| (i.wrapping_mul(2_654_435_761) >> 24) as u8)
            .collect();
        (data[0], data[1]) = (0, 255);
        let pixels = RgbImage {
            width: w,
            height: h,
            data,
        };
        for dtype in [DType::U8, DType::F32, DType::F16, DType::Bf16] {
            for layout in [Layout::Nchw, Layout::Nhwc] {
                let mut spec = PipelineSpec::eval(1, 2);
                spec.crop = stoker_wire::spec::Crop::CenterCrop {
                    resize: 7,
                    size: [h, w],
                };
                spec.dtype = dtype;
                spec.layout = layout;
                let mut got = vec![0u8; spec.image_bytes()];
                convert_into(&pixels, &spec, &mut got);
                let mut want = vec![0u8; spec.image_bytes()];
                for y in 0..h {
                    for x in 0..w {
                        for (c, &px) in pixels.pixel(x, y).iter().enumerate() {
                            let v = f32::from(px);
                            let v = if dtype == DType::U8 {
                                v
                            } else {
                                (v * (1.0 / 255.0) - spec.mean[c]) / spec.std[c]
                            };
                            store(&spec, &mut want, c, y as usize, x as usize, v);
                        }
                    }
                }
                assert_eq!(got, want, "{dtype:?} {layout:?}");
            }
        }
    }

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
