//! Issue 25 item 3's other half, for measurement only (never served): the crop of three
//! YCbCr planes resampled to the output size one plane at a time, then converted to RGB and
//! normalised at that size, as a colour-at-the-output-size path would do. The measurement in
//! `decode/restart_tests.rs` times it against [`super::Augmenter`] on today's RGB decode and
//! reports the PSNR between the two.
//!
//! # Design
//! - The same tap tables as the augmenter ([`AxisTable`], torchvision's antialiased
//!   bilinear), taps clamped to the crop; a chroma plane's box is the luma box divided by its
//!   subsampling (JPEG's chroma samples are centred on the luma samples they cover).
//! - Horizontal pass per source row the vertical taps need (one scalar multiply-add per tap),
//!   then a vertical pass along whole rows; JFIF's YCbCr to RGB, clamped, then the spec's
//!   normalisation; f32, planar (CHW), no flip.

use stoker_kernels::reference::{tap_window, CropBox};
use stoker_wire::spec::PipelineSpec;

use super::{normalisation, AxisKey, AxisTable};

/// One 8-bit plane, row-major, `stride` bytes per row.
pub(crate) struct Plane<'a> {
    pub(crate) data: &'a [u8],
    pub(crate) width: u32,
    pub(crate) height: u32,
    pub(crate) stride: usize,
}

/// Tables and scratch, reused between images.
#[derive(Default)]
pub(crate) struct PlanarProbe {
    horizontal: AxisTable,
    vertical: AxisTable,
    rows: Vec<f32>,
    resampled: [Vec<f32>; 3],
}

impl PlanarProbe {
    /// Resamples `crop` (luma sample coordinates) of Y, Cb and Cr to the spec's output size,
    /// the chroma planes subsampled by `sub` (horizontal, vertical), and writes the image as
    /// normalised f32 RGB planes into `out` (`3 * out_h * out_w` values).
    pub(crate) fn augment(
        &mut self,
        planes: &[Plane<'_>; 3],
        sub: (u32, u32),
        crop: CropBox,
        spec: &PipelineSpec,
        out: &mut [f32],
    ) {
        let (out_h, out_w) = spec.crop.output_size();
        for (c, plane) in planes.iter().enumerate() {
            let (sx, sy) = if c == 0 {
                (1.0, 1.0)
            } else {
                (f64::from(sub.0), f64::from(sub.1))
            };
            let b = CropBox::new(crop.x / sx, crop.y / sy, crop.w / sx, crop.h / sy);
            self.resample(plane, b, (out_h, out_w), c);
        }
        let (scale, bias) = normalisation(spec);
        let n = out_h as usize * out_w as usize;
        let [y, cb, cr] = &self.resampled;
        let (red, rest) = out[..3 * n].split_at_mut(n);
        let (green, blue) = rest.split_at_mut(n);
        for i in 0..n {
            let (l, u, v) = (y[i], cb[i] - 128.0, cr[i] - 128.0);
            let r = (l + 1.402 * v).clamp(0.0, 255.0);
            let g = (l - 0.344_136 * u - 0.714_136 * v).clamp(0.0, 255.0);
            let b = (l + 1.772 * u).clamp(0.0, 255.0);
            red[i] = r * scale[0] + bias[0];
            green[i] = g * scale[1] + bias[1];
            blue[i] = b * scale[2] + bias[2];
        }
    }

    /// Resamples box `b` of `plane` to `out_h` x `out_w` into `self.resampled[c]`.
    fn resample(&mut self, plane: &Plane<'_>, b: CropBox, (out_h, out_w): (u32, u32), c: usize) {
        self.horizontal.build(AxisKey {
            start: b.x,
            len: b.w,
            out_len: out_w,
            window: tap_window(b.x, b.w, plane.width, true),
            reversed: false,
        });
        self.vertical.build(AxisKey {
            start: b.y,
            len: b.h,
            out_len: out_h,
            window: tap_window(b.y, b.h, plane.height, true),
            reversed: false,
        });
        let (lo, hi) = (self.vertical.lo, self.vertical.hi);
        let w = out_w as usize;
        self.rows.clear();
        self.rows.resize((hi - lo) * w, 0.0);
        for y in lo..hi {
            let src = &plane.data[y * plane.stride..];
            let dst = &mut self.rows[(y - lo) * w..][..w];
            for (ox, d) in dst.iter_mut().enumerate() {
                let (first, taps) = self.horizontal.taps(ox);
                *d = taps
                    .iter()
                    .zip(&src[first..])
                    .map(|(&k, &s)| k * f32::from(s))
                    .sum();
            }
        }
        let out = &mut self.resampled[c];
        out.clear();
        out.resize(w * out_h as usize, 0.0);
        for oy in 0..out_h as usize {
            let (first, taps) = self.vertical.taps(oy);
            let dst = &mut out[oy * w..][..w];
            for (k, &weight) in taps.iter().enumerate() {
                let row = &self.rows[(first + k - lo) * w..][..w];
                for (d, &s) in dst.iter_mut().zip(row) {
                    *d += weight * s;
                }
            }
        }
    }
}
