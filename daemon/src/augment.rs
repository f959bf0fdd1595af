//! Augmentation on the CPU: the random parameters of each sample (crop box, flip) and the fused
//! crop → antialiased resize → flip → normalise → convert that writes one output image into its
//! place in a batch slot.
//!
//! The math is `kernels::reference::augment_reference` (torchvision's `resize(antialias=True)`
//! bilinear, which is Pillow's separable triangle filter); `docs/augment.md` writes it down.
//!
//! # Design
//! - Parameters are a pure function of (seed, epoch, index): [`sample_params`] draws from
//!   `KeyedRng::new(seed, epoch, index, Stream::Augment)`, the crop box first, then the flip.
//! - [`Augmenter`] is one per thread and owns every buffer it needs, so steady state allocates
//!   nothing. It is separable: a horizontal pass over only the source rows the vertical taps
//!   need, into an f32 ring of `max vertical taps` rows, then a vertical pass per output row
//!   whose result is normalised, converted and stored in the spec's dtype and layout. Flip is
//!   folded into the horizontal weight table (its columns are listed in reverse).
//! - Resampled pixels are `[f32; 4]` (RGB + a spare lane) so the per-tap multiply-adds are one
//!   SIMD operation; rows are flat f32 slices so the vertical pass vectorises along the row.
//! - No state depends on the thread or on earlier images: the same inputs give the same bytes.
//!
//! # Limitations
//! - A CenterCrop larger than the resized image (possible only with a non-square `size`) is
//!   not zero-padded as torchvision pads it: taps are clamped to the image, so edges repeat.
//! - f32 arithmetic: u8 outputs are within 1 of the f64 reference, float outputs within 1e-3
//!   (plus one unit in the last place of f16 / bf16).

use half::slice::HalfFloatSliceExt;
use stoker::spec::{Crop, DType, Layout, PipelineSpec};
use stoker_kernels::reference::tap_window;
pub use stoker_kernels::reference::{CropBox, RgbImage};

use crate::rng::{KeyedRng, Stream};

/// torchvision's `RandomResizedCrop.get_params`: up to 10 tries at a box of `scale` x the
/// image's area and aspect ratio (width / height) log-uniform in `ratio`, placed uniformly;
/// failing that, the centred box of the whole image clamped to `ratio`. Python's `round` (half
/// to even) is used where torchvision uses it. Integer boxes, in source pixels.
pub fn random_resized_crop(
    width: u32,
    height: u32,
    scale: [f32; 2],
    ratio: [f32; 2],
    rng: &mut KeyedRng,
) -> CropBox {
    if width == 0 || height == 0 {
        return CropBox::full(width, height);
    }
    let (fw, fh) = (f64::from(width), f64::from(height));
    let area = fw * fh;
    let (log_lo, log_hi) = (f64::from(ratio[0]).ln(), f64::from(ratio[1]).ln());
    for _ in 0..10 {
        let target_area = area * rng.uniform(f64::from(scale[0]), f64::from(scale[1]));
        let aspect = rng.uniform(log_lo, log_hi).exp();
        let w = (target_area * aspect).sqrt().round_ties_even();
        let h = (target_area / aspect).sqrt().round_ties_even();
        if 0.0 < w && w <= fw && 0.0 < h && h <= fh {
            let (w, h) = (w as u64, h as u64);
            let i = rng.below(u64::from(height) - h + 1);
            let j = rng.below(u64::from(width) - w + 1);
            return CropBox::new(j as f64, i as f64, w as f64, h as f64);
        }
    }
    // Fallback: a centred crop of the whole image, its ratio clamped into `ratio`.
    let in_ratio = fw / fh;
    let (lo, hi) = (f64::from(ratio[0]), f64::from(ratio[1]));
    let (w, h) = if in_ratio < lo {
        (width, (fw / lo).round_ties_even() as u32)
    } else if in_ratio > hi {
        ((fh * hi).round_ties_even() as u32, height)
    } else {
        (width, height)
    };
    let i = (height - h) / 2;
    let j = (width - w) / 2;
    CropBox::new(f64::from(j), f64::from(i), f64::from(w), f64::from(h))
}

/// `Resize(resize)` (shorter side) then `CenterCrop(out_h, out_w)` as one box in the source
/// image's pixel coordinates.
///
/// As torchvision computes it: the shorter side becomes `resize`, the longer
/// `floor(resize * long / short)`; the crop's top-left in the resized image is
/// `round_half_even((resized - crop) / 2)` on each axis; the box is that crop scaled back by
/// `source / resized` per axis. Resampling this box straight to `out_h` x `out_w` uses the same
/// filter scale and tap centres as resizing the whole image and then cropping, so it gives the
/// same pixels (up to float rounding) while touching only the box.
pub fn center_crop_box(
    width: u32,
    height: u32,
    resize: u32,
    (out_h, out_w): (u32, u32),
) -> CropBox {
    let (w, h) = (u64::from(width.max(1)), u64::from(height.max(1)));
    let resize = u64::from(resize);
    let (new_w, new_h) = if w <= h {
        (resize, resize * h / w)
    } else {
        (resize * w / h, resize)
    };
    let top = ((new_h as f64 - f64::from(out_h)) / 2.0).round_ties_even();
    let left = ((new_w as f64 - f64::from(out_w)) / 2.0).round_ties_even();
    let sx = w as f64 / new_w as f64;
    let sy = h as f64 / new_h as f64;
    CropBox::new(
        left * sx,
        top * sy,
        f64::from(out_w) * sx,
        f64::from(out_h) * sy,
    )
}

/// The crop box and flip of sample `index` in `epoch` of a job with `seed`, for a source image
/// of `width` x `height` pixels: a pure function of its arguments.
pub fn sample_params(
    spec: &PipelineSpec,
    width: u32,
    height: u32,
    seed: u64,
    epoch: u64,
    index: u64,
) -> (CropBox, bool) {
    let mut rng = KeyedRng::new(seed, epoch, index, Stream::Augment);
    let crop = match spec.crop {
        Crop::RandomResized { scale, ratio, .. } => {
            random_resized_crop(width, height, scale, ratio, &mut rng)
        }
        Crop::CenterCrop { resize, size } => {
            center_crop_box(width, height, resize, (size[0], size[1]))
        }
    };
    let flip = rng.next_f64() < f64::from(spec.flip_prob);
    (crop, flip)
}

/// The taps of every output sample along one axis, f32 weights at a fixed stride.
#[derive(Debug, Default)]
struct AxisTable {
    /// What the table was built for; a call with the same key reuses it.
    key: Option<AxisKey>,
    /// Per output sample: the first source index.
    first: Vec<u32>,
    /// Per output sample: how many taps.
    count: Vec<u32>,
    /// The most taps of any output sample; `weights` holds `stride` per output sample.
    stride: usize,
    weights: Vec<f32>,
    /// The union of every output sample's taps: source indices `lo..hi`.
    lo: usize,
    hi: usize,
}

#[derive(Debug, Clone, Copy, PartialEq)]
struct AxisKey {
    start: f64,
    len: f64,
    out_len: u32,
    /// Readable source samples `window.0..window.1` (`reference::tap_window`).
    window: (u32, u32),
    reversed: bool,
}

impl AxisTable {
    /// Builds the table for output samples `0..out_len` covering `[start, start + len)` of an
    /// axis readable within `window`; `reversed` lists the output samples last to first (a flip).
    /// The tap rule is `reference::antialias_taps`, computed here without allocating.
    fn build(&mut self, key: AxisKey) {
        if self.key == Some(key) {
            return;
        }
        let AxisKey {
            start,
            len,
            out_len,
            window: (win_lo, win_hi),
            reversed,
        } = key;
        let scale = len / f64::from(out_len);
        let filterscale = scale.max(1.0);
        let support = filterscale;
        let n = out_len as usize;
        let center = |slot: usize| {
            let o = if reversed { n - 1 - slot } else { slot };
            start + (o as f64 + 0.5) * scale
        };
        let weight = |x: usize, center: f64| {
            let t = (x as f64 - center + 0.5) / filterscale;
            (1.0 - t.abs()).max(0.0)
        };
        // Pass 1: each output sample's tap range; the stride is the longest.
        self.first.clear();
        self.count.clear();
        for slot in 0..n {
            let c = center(slot);
            let xmin = (c - support + 0.5).floor().max(f64::from(win_lo)) as usize;
            let xmax = ((c + support + 0.5).floor().min(f64::from(win_hi)) as usize).max(xmin);
            let total: f64 = (xmin..xmax).map(|x| weight(x, c)).sum();
            let (first, count) = if total > 0.0 {
                (xmin, xmax - xmin)
            } else {
                // Only reachable for a box outside the image: the nearest edge sample.
                let nearest = (c.floor().max(f64::from(win_lo)) as usize).min(win_hi as usize - 1);
                (nearest, 0)
            };
            self.first.push(first as u32);
            self.count.push(count as u32);
        }
        self.stride = self
            .count
            .iter()
            .map(|&c| c.max(1) as usize)
            .max()
            .unwrap_or(1);
        // Pass 2: weights, normalised in f64, stored as f32; zero past each sample's count.
        self.weights.clear();
        self.weights.resize(n * self.stride, 0.0);
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        for slot in 0..n {
            let c = center(slot);
            let first = self.first[slot] as usize;
            let count = self.count[slot] as usize;
            let row = &mut self.weights[slot * self.stride..][..self.stride];
            if count == 0 {
                row[0] = 1.0;
                self.count[slot] = 1;
            } else {
                let total: f64 = (first..first + count).map(|x| weight(x, c)).sum();
                for (k, dst) in row[..count].iter_mut().enumerate() {
                    *dst = (weight(first + k, c) / total) as f32;
                }
            }
            lo = lo.min(first);
            hi = hi.max(first + self.count[slot] as usize);
        }
        self.lo = lo;
        self.hi = hi;
        self.key = Some(key);
    }

    #[inline]
    fn taps(&self, slot: usize) -> (usize, &[f32]) {
        let off = slot * self.stride;
        (
            self.first[slot] as usize,
            &self.weights[off..off + self.count[slot] as usize],
        )
    }
}

/// One thread's augmentation engine: weight tables and scratch rows, reused between images.
#[derive(Debug, Default)]
pub struct Augmenter {
    horizontal: AxisTable,
    vertical: AxisTable,
    /// One source row's `horizontal.lo..horizontal.hi` pixels as interleaved f32 RGB, then
    /// zero padding.
    source_row: Vec<f32>,
    /// Ring of horizontally resampled rows, `vertical.stride` rows of `out_w` pixels; source
    /// row `y` lives in slot `y % vertical.stride`.
    ring: Vec<[f32; 4]>,
    /// The source row each ring slot holds (`usize::MAX`: none).
    ring_holds: Vec<usize>,
    /// One vertically resampled output row, 0..255 scale.
    acc: Vec<[f32; 4]>,
    /// One output row normalised, in output order (interleaved or planar).
    values: Vec<f32>,
    halves: Vec<half::f16>,
}

impl Augmenter {
    pub fn new() -> Augmenter {
        Augmenter::default()
    }

    /// Crops `crop` out of `img`, resizes it to the spec's output size with torchvision's
    /// antialiased bilinear filter, flips it if `flip`, normalises and converts it to the
    /// spec's dtype and layout, and writes it to `out` (native byte order).
    ///
    /// # Panics
    /// If `img` is empty or `out.len() != spec.image_bytes()`.
    pub fn augment_into(
        &mut self,
        img: &RgbImage,
        crop: CropBox,
        flip: bool,
        spec: &PipelineSpec,
        out: &mut [u8],
    ) {
        let (out_h, out_w) = spec.crop.output_size();
        assert!(img.width > 0 && img.height > 0, "empty image");
        assert_eq!(out.len(), spec.image_bytes(), "output buffer size");
        assert_eq!(img.data.len(), img.width as usize * img.height as usize * 3);
        let clamp_to_crop = matches!(spec.crop, Crop::RandomResized { .. });
        self.horizontal.build(AxisKey {
            start: crop.x,
            len: crop.w,
            out_len: out_w,
            window: tap_window(crop.x, crop.w, img.width, clamp_to_crop),
            reversed: flip,
        });
        self.vertical.build(AxisKey {
            start: crop.y,
            len: crop.h,
            out_len: out_h,
            window: tap_window(crop.y, crop.h, img.height, clamp_to_crop),
            reversed: false,
        });
        let w = out_w as usize;
        let h = out_h as usize;
        let ring_rows = self.vertical.stride;
        self.source_row.clear();
        // Padding: `stride` pixels for the fixed-length tap loops, one float for the 4-lane
        // load of the last pixel.
        self.source_row.resize(
            (self.horizontal.hi - self.horizontal.lo + self.horizontal.stride) * 3 + 1,
            0.0,
        );
        self.ring.clear();
        self.ring.resize(ring_rows * w, [0.0; 4]);
        self.ring_holds.clear();
        self.ring_holds.resize(ring_rows, usize::MAX);
        self.acc.clear();
        self.acc.resize(w, [0.0; 4]);
        self.values.clear();
        self.values.resize(w * 3, 0.0);

        let (scale, bias) = normalisation(spec);
        let es = spec.dtype.size();
        for oy in 0..h {
            // Resample the source rows this output row needs that the ring lacks. Windows
            // slide forward, so each source row is resampled once.
            let first = self.vertical.first[oy] as usize;
            let count = self.vertical.count[oy] as usize;
            for y in first..first + count {
                let slot = y % ring_rows;
                if self.ring_holds[slot] != y {
                    self.horizontal_pass(img, y, slot, w);
                    self.ring_holds[slot] = y;
                }
            }
            self.vertical_pass(oy, ring_rows, w);
            self.store_row(spec, &scale, &bias, oy, h, w, es, out);
        }
    }

    /// (address, capacity) of every buffer, to show that steady state reallocates nothing.
    #[cfg(test)]
    fn buffers(&self) -> Vec<(usize, usize)> {
        fn of<T>(v: &Vec<T>) -> (usize, usize) {
            (v.as_ptr() as usize, v.capacity())
        }
        let (h, v) = (&self.horizontal, &self.vertical);
        vec![
            of(&h.first),
            of(&h.count),
            of(&h.weights),
            of(&v.first),
            of(&v.count),
            of(&v.weights),
            of(&self.source_row),
            of(&self.ring),
            of(&self.ring_holds),
            of(&self.acc),
            of(&self.values),
            of(&self.halves),
        ]
    }

    /// Resamples source row `y` horizontally into ring slot `slot`.
    fn horizontal_pass(&mut self, img: &RgbImage, y: usize, slot: usize, w: usize) {
        let table = &self.horizontal;
        let (lo, hi) = (table.lo, table.hi);
        let row_start = y * img.width as usize * 3;
        let src = &img.data[row_start + lo * 3..row_start + hi * 3];
        // The row past `hi - lo` pixels stays zero: padding.
        for (d, &s) in self.source_row.iter_mut().zip(src) {
            *d = f32::from(s);
        }
        let dst = &mut self.ring[slot * w..(slot + 1) * w];
        let src = &self.source_row[..];
        // A loop of exactly `stride` taps (zero weights past each column's count) unrolls into
        // straight-line SIMD; adding 0 * pixel changes no bit of the sum.
        match table.stride {
            1 => horizontal_row::<1>(table, src, dst),
            2 => horizontal_row::<2>(table, src, dst),
            3 => horizontal_row::<3>(table, src, dst),
            4 => horizontal_row::<4>(table, src, dst),
            5 => horizontal_row::<5>(table, src, dst),
            6 => horizontal_row::<6>(table, src, dst),
            7 => horizontal_row::<7>(table, src, dst),
            8 => horizontal_row::<8>(table, src, dst),
            _ => {
                for (ox, d) in dst.iter_mut().enumerate() {
                    let (first, wx) = table.taps(ox);
                    let px = &src[(first - lo) * 3..];
                    let mut a = [0.0f32; 4];
                    for (k, &wt) in wx.iter().enumerate() {
                        let p = &px[k * 3..k * 3 + 4];
                        for c in 0..4 {
                            a[c] += wt * p[c];
                        }
                    }
                    *d = a;
                }
            }
        }
    }

    /// Sums the ring rows output row `oy` needs, weighted, into `acc`.
    fn vertical_pass(&mut self, oy: usize, ring_rows: usize, w: usize) {
        let (first, wy) = self.vertical.taps(oy);
        let acc = self.acc.as_flattened_mut();
        acc.fill(0.0);
        for (k, &wt) in wy.iter().enumerate() {
            let slot = (first + k) % ring_rows;
            let row = self.ring[slot * w..(slot + 1) * w].as_flattened();
            for (a, p) in acc.iter_mut().zip(row) {
                *a += wt * p;
            }
        }
    }

    /// Normalises and converts `acc` (output row `oy`) and stores it in `out`.
    #[allow(clippy::too_many_arguments)]
    fn store_row(
        &mut self,
        spec: &PipelineSpec,
        scale: &[f32; 3],
        bias: &[f32; 3],
        oy: usize,
        h: usize,
        w: usize,
        es: usize,
        out: &mut [u8],
    ) {
        if spec.dtype == DType::U8 {
            // Round half away from zero (values are clamped non-negative first), clamp.
            match spec.layout {
                Layout::Nhwc => {
                    let dst = &mut out[oy * w * 3..(oy + 1) * w * 3];
                    for (d, a) in dst.chunks_exact_mut(3).zip(&self.acc) {
                        for c in 0..3 {
                            d[c] = to_byte(a[c]);
                        }
                    }
                }
                Layout::Nchw => {
                    for c in 0..3 {
                        let plane = &mut out[(c * h + oy) * w..(c * h + oy + 1) * w];
                        for (d, a) in plane.iter_mut().zip(&self.acc) {
                            *d = to_byte(a[c]);
                        }
                    }
                }
            }
            return;
        }
        let values = &mut self.values;
        match spec.layout {
            Layout::Nhwc => {
                for (v, a) in values.chunks_exact_mut(3).zip(&self.acc) {
                    for c in 0..3 {
                        v[c] = a[c] * scale[c] + bias[c];
                    }
                }
                let dst = &mut out[oy * w * 3 * es..(oy + 1) * w * 3 * es];
                encode(values, spec.dtype, dst, &mut self.halves);
            }
            Layout::Nchw => {
                for c in 0..3 {
                    let plane = &mut values[c * w..(c + 1) * w];
                    for (v, a) in plane.iter_mut().zip(&self.acc) {
                        *v = a[c] * scale[c] + bias[c];
                    }
                    let start = ((c * h + oy) * w) * es;
                    encode(
                        plane,
                        spec.dtype,
                        &mut out[start..start + w * es],
                        &mut self.halves,
                    );
                }
            }
        }
    }
}

/// One row of the horizontal pass with exactly `K` (the table's stride) taps per column.
/// `src` holds source columns `table.lo..` as interleaved RGB f32, then at least `K` zero
/// pixels and one float of padding. Each tap loads 4 lanes (RGB + the next pixel's R): lane 3
/// is a harmless finite by-product that the store ignores.
#[inline(always)]
fn horizontal_row<const K: usize>(table: &AxisTable, src: &[f32], dst: &mut [[f32; 4]]) {
    let lo = table.lo;
    let columns = dst
        .iter_mut()
        .zip(&table.first)
        .zip(table.weights.chunks_exact(K));
    for ((d, &first), w) in columns {
        let px = &src[(first as usize - lo) * 3..][..3 * K + 1];
        let w: &[f32; K] = w.try_into().unwrap();
        let mut a = [0.0f32; 4];
        for k in 0..K {
            let p: &[f32; 4] = px[3 * k..3 * k + 4].try_into().unwrap();
            for c in 0..4 {
                a[c] += w[k] * p[c];
            }
        }
        *d = a;
    }
}

/// Rounds half away from zero and clamps into 0..=255 (NaN gives 0).
///
/// `as i32` would saturate and map NaN to 0 on every element, which keeps the compiler from
/// vectorising the conversion (u8 output measured 40% slower than f32 with it); the value is
/// made finite and in range first, so the unchecked truncation is exact.
#[inline(always)]
fn to_byte(v: f32) -> u8 {
    // `max` returns the other operand when one is NaN, so `x` is a number in 0.5..=255.5.
    #[allow(clippy::manual_clamp, reason = "clamp keeps NaN, max drops it")]
    let x = v.max(0.0).min(255.0) + 0.5;
    // SAFETY: `x` is finite and within i32's range, as to_int_unchecked requires.
    let i: i32 = unsafe { x.to_int_unchecked() };
    i as u8
}

/// `(v / 255 - mean) / std` as `v * scale + bias`.
fn normalisation(spec: &PipelineSpec) -> ([f32; 3], [f32; 3]) {
    let mut scale = [0.0f32; 3];
    let mut bias = [0.0f32; 3];
    for c in 0..3 {
        let std = f64::from(spec.std[c]);
        scale[c] = (1.0 / (255.0 * std)) as f32;
        bias[c] = (-f64::from(spec.mean[c]) / std) as f32;
    }
    (scale, bias)
}

/// Writes float `values` into `dst` as `dtype` (f32, f16 or bf16; round to nearest even),
/// native byte order.
fn encode(values: &[f32], dtype: DType, dst: &mut [u8], halves: &mut Vec<half::f16>) {
    match dtype {
        DType::F32 => {
            for (d, v) in dst.chunks_exact_mut(4).zip(values) {
                d.copy_from_slice(&v.to_ne_bytes());
            }
        }
        DType::F16 => {
            halves.clear();
            halves.resize(values.len(), half::f16::ZERO);
            halves.convert_from_f32_slice(values);
            for (d, v) in dst.chunks_exact_mut(2).zip(halves.iter()) {
                d.copy_from_slice(&v.to_ne_bytes());
            }
        }
        DType::Bf16 => {
            for (d, v) in dst.chunks_exact_mut(2).zip(values) {
                d.copy_from_slice(&half::bf16::from_f32(*v).to_ne_bytes());
            }
        }
        DType::U8 => unreachable!("u8 is stored without normalisation"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use stoker::spec::{IMAGENET_MEAN, IMAGENET_STD};
    use stoker_kernels::reference::{augment_reference, OutputParams};

    const DTYPES: [DType; 4] = [DType::U8, DType::F16, DType::Bf16, DType::F32];
    const LAYOUTS: [Layout; 2] = [Layout::Nchw, Layout::Nhwc];

    fn random_image(rng: &mut KeyedRng, width: u32, height: u32) -> RgbImage {
        let mut img = RgbImage::default();
        img.reset(width, height);
        // Mix smooth areas and noise so both rounding and large steps are exercised.
        let noisy = rng.below(2) == 0;
        for y in 0..height {
            for x in 0..width {
                let i = ((y * width + x) * 3) as usize;
                for c in 0..3 {
                    img.data[i + c] = if noisy {
                        rng.below(256) as u8
                    } else {
                        ((x * 7 + y * 3 + c as u32 * 50) % 256) as u8
                    };
                }
            }
        }
        img
    }

    #[test]
    fn to_byte_rounds_half_away_from_zero_and_clamps_everything_else() {
        let cases = [
            (f32::NAN, 0),
            (f32::NEG_INFINITY, 0),
            (-3.0, 0),
            (0.0, 0),
            (0.49, 0),
            (0.5, 1),
            (127.5, 128),
            (254.49, 254),
            (254.5, 255),
            (255.0, 255),
            (1e9, 255),
            (f32::INFINITY, 255),
        ];
        for (v, want) in cases {
            assert_eq!(to_byte(v), want, "{v}");
        }
    }

    fn spec_for(dtype: DType, layout: Layout, out_h: u32, out_w: u32) -> PipelineSpec {
        PipelineSpec {
            crop: Crop::RandomResized {
                size: [out_h, out_w],
                scale: [0.08, 1.0],
                ratio: [0.75, 4.0 / 3.0],
            },
            dtype,
            layout,
            mean: IMAGENET_MEAN,
            std: IMAGENET_STD,
            ..PipelineSpec::train(1, 224)
        }
    }

    /// Decodes output bytes into f64 values.
    fn decode(bytes: &[u8], dtype: DType) -> Vec<f64> {
        match dtype {
            DType::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
            DType::F32 => bytes
                .chunks_exact(4)
                .map(|b| f64::from(f32::from_ne_bytes(b.try_into().unwrap())))
                .collect(),
            DType::F16 => bytes
                .chunks_exact(2)
                .map(|b| half::f16::from_ne_bytes(b.try_into().unwrap()).to_f64())
                .collect(),
            DType::Bf16 => bytes
                .chunks_exact(2)
                .map(|b| half::bf16::from_ne_bytes(b.try_into().unwrap()).to_f64())
                .collect(),
        }
    }

    /// Largest allowed |fast - reference| for a reference value `r`.
    fn tolerance(dtype: DType, r: f64) -> f64 {
        match dtype {
            DType::U8 => 1.0,
            DType::F32 => 1e-3,
            // 1e-3 of arithmetic plus one unit in the last place of the format.
            DType::F16 => 1e-3 + r.abs() * 2f64.powi(-10),
            DType::Bf16 => 1e-3 + r.abs() * 2f64.powi(-7),
        }
    }

    fn check_against_reference(
        aug: &mut Augmenter,
        img: &RgbImage,
        crop: CropBox,
        flip: bool,
        spec: &PipelineSpec,
    ) {
        let (out_h, out_w) = spec.crop.output_size();
        let mut out = vec![0xA5u8; spec.image_bytes()];
        aug.augment_into(img, crop, flip, spec, &mut out);
        let want = augment_reference(img, crop, flip, out_h, out_w, &OutputParams::from(spec));
        assert_eq!(want.len(), out.len());
        let (got, want) = (decode(&out, spec.dtype), decode(&want, spec.dtype));
        for (i, (g, r)) in got.iter().zip(&want).enumerate() {
            assert!(
                (g - r).abs() <= tolerance(spec.dtype, *r),
                "element {i}: fast {g} vs reference {r}; image {}x{}, {crop:?}, flip {flip}, \
                 out {out_h}x{out_w}, {:?} {:?}",
                img.width,
                img.height,
                spec.dtype,
                spec.layout,
            );
        }
    }

    /// A crop box of one of several kinds: inside, at the edges, fractional, tiny (upscaling),
    /// the whole image.
    fn random_box(rng: &mut KeyedRng, width: u32, height: u32) -> CropBox {
        let (fw, fh) = (f64::from(width), f64::from(height));
        match rng.below(5) {
            0 => CropBox::full(width, height),
            1 => {
                let w = rng.uniform(0.05, 1.0) * fw;
                let h = rng.uniform(0.05, 1.0) * fh;
                CropBox::new(rng.uniform(0.0, fw - w), rng.uniform(0.0, fh - h), w, h)
            }
            2 => {
                // Flush with the right / bottom edge.
                let w = rng.uniform(0.1, 1.0) * fw;
                let h = rng.uniform(0.1, 1.0) * fh;
                CropBox::new(fw - w, fh - h, w, h)
            }
            3 => {
                // Smaller than a pixel or a few pixels: strong upscaling.
                let w = rng.uniform(0.2, 3.0).min(fw);
                let h = rng.uniform(0.2, 3.0).min(fh);
                CropBox::new(rng.uniform(0.0, fw - w), rng.uniform(0.0, fh - h), w, h)
            }
            _ => {
                // Integer boxes, as RandomResizedCrop makes.
                let w = 1 + rng.below(u64::from(width)) as u32;
                let h = 1 + rng.below(u64::from(height)) as u32;
                let x = rng.below(u64::from(width - w) + 1);
                let y = rng.below(u64::from(height - h) + 1);
                CropBox::new(x as f64, y as f64, f64::from(w), f64::from(h))
            }
        }
    }

    #[test]
    fn fast_matches_reference_on_random_images_boxes_dtypes_layouts() {
        let mut rng = KeyedRng::new(1, 0, 0, Stream::Augment);
        // One augmenter for every case, so stale tables or scratch would show.
        let mut aug = Augmenter::new();
        for case in 0..120 {
            let width = 1 + rng.below(if case % 10 == 0 { 3 } else { 60 }) as u32;
            let height = 1 + rng.below(if case % 10 == 0 { 3 } else { 60 }) as u32;
            let img = random_image(&mut rng, width, height);
            let crop = random_box(&mut rng, width, height);
            let out_h = 1 + rng.below(40) as u32;
            let out_w = 1 + rng.below(40) as u32;
            let flip = rng.below(2) == 1;
            for dtype in DTYPES {
                for layout in LAYOUTS {
                    let spec = spec_for(dtype, layout, out_h, out_w);
                    check_against_reference(&mut aug, &img, crop, flip, &spec);
                }
            }
        }
    }

    #[test]
    fn fast_matches_reference_at_training_size() {
        let mut rng = KeyedRng::new(2, 0, 0, Stream::Augment);
        let img = random_image(&mut rng, 333, 250);
        let mut aug = Augmenter::new();
        for (crop, flip) in [
            (CropBox::new(20.0, 5.0, 300.0, 240.0), true),
            (CropBox::new(100.0, 100.0, 80.0, 60.0), false),
            (center_crop_box(333, 250, 256, (224, 224)), false),
        ] {
            for dtype in DTYPES {
                let spec = spec_for(dtype, Layout::Nchw, 224, 224);
                check_against_reference(&mut aug, &img, crop, flip, &spec);
            }
        }
    }

    #[test]
    fn one_pixel_image_fills_the_output_with_its_pixel() {
        let mut img = RgbImage::default();
        img.reset(1, 1);
        img.data.copy_from_slice(&[10, 128, 250]);
        let mut aug = Augmenter::new();
        for crop in [CropBox::full(1, 1), CropBox::new(0.25, 0.5, 0.5, 0.25)] {
            for layout in LAYOUTS {
                let spec = spec_for(DType::U8, layout, 5, 7);
                let mut out = vec![0u8; spec.image_bytes()];
                aug.augment_into(&img, crop, true, &spec, &mut out);
                for (i, &v) in out.iter().enumerate() {
                    let c = match layout {
                        Layout::Nhwc => i % 3,
                        Layout::Nchw => i / 35,
                    };
                    assert_eq!(v, img.data[c], "element {i}, {layout:?}");
                }
                for dtype in DTYPES {
                    let spec = spec_for(dtype, layout, 5, 7);
                    check_against_reference(&mut aug, &img, crop, false, &spec);
                }
            }
        }
    }

    #[test]
    fn flip_mirrors_the_output_exactly() {
        let mut rng = KeyedRng::new(3, 0, 0, Stream::Augment);
        let img = random_image(&mut rng, 41, 29);
        let crop = CropBox::new(3.5, 2.25, 30.0, 20.5);
        let spec = spec_for(DType::F32, Layout::Nhwc, 11, 13);
        let mut aug = Augmenter::new();
        let mut plain = vec![0u8; spec.image_bytes()];
        let mut flipped = vec![0u8; spec.image_bytes()];
        aug.augment_into(&img, crop, false, &spec, &mut plain);
        aug.augment_into(&img, crop, true, &spec, &mut flipped);
        let px = 3 * 4;
        for y in 0..11 {
            for x in 0..13 {
                let a = (y * 13 + x) * px;
                let b = (y * 13 + 12 - x) * px;
                assert_eq!(plain[a..a + px], flipped[b..b + px], "pixel ({x}, {y})");
            }
        }
    }

    #[test]
    fn output_is_bit_identical_across_threads_and_reused_augmenters() {
        let mut rng = KeyedRng::new(4, 0, 0, Stream::Augment);
        let images: Vec<RgbImage> = (0..6)
            .map(|i| random_image(&mut rng, 90 + i * 13, 70 + i * 7))
            .collect();
        let spec = PipelineSpec::train(1, 56);
        let run = |order: Vec<usize>| -> Vec<Vec<u8>> {
            let mut aug = Augmenter::new();
            let mut outs = vec![Vec::new(); images.len()];
            for i in order {
                let img = &images[i];
                let (crop, flip) = sample_params(&spec, img.width, img.height, 9, 1, i as u64);
                let mut out = vec![0u8; spec.image_bytes()];
                aug.augment_into(img, crop, flip, &spec, &mut out);
                outs[i] = out;
            }
            outs
        };
        let serial = run((0..images.len()).collect());
        let threaded: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
            let handles: Vec<_> = [vec![5, 4, 3, 2, 1, 0], vec![2, 0, 4, 1, 5, 3]]
                .into_iter()
                .map(|order| s.spawn(|| run(order)))
                .collect();
            handles.into_iter().map(|h| h.join().unwrap()).collect()
        });
        for other in threaded {
            assert!(serial == other, "output depends on thread or order");
        }
    }

    #[test]
    fn a_cached_table_never_carries_pixels_from_the_previous_image() {
        let mut rng = KeyedRng::new(7, 0, 0, Stream::Augment);
        // 4 source rows to 2 output rows: the ring can hold most rows the image has, so a
        // stale ring would be read instead of resampled.
        let (a, b) = (random_image(&mut rng, 50, 4), random_image(&mut rng, 50, 4));
        let spec = spec_for(DType::U8, Layout::Nhwc, 2, 8);
        let crop = CropBox::full(50, 4);
        let mut reused = Augmenter::new();
        let mut first = vec![0u8; spec.image_bytes()];
        reused.augment_into(&a, crop, false, &spec, &mut first);
        let mut second = vec![0u8; spec.image_bytes()];
        reused.augment_into(&b, crop, false, &spec, &mut second);
        let mut fresh = vec![0u8; spec.image_bytes()];
        Augmenter::new().augment_into(&b, crop, false, &spec, &mut fresh);
        assert_ne!(first, second);
        assert!(
            second == fresh,
            "the reused augmenter kept rows of the first image"
        );
    }

    #[test]
    fn steady_state_reuses_every_buffer() {
        let mut rng = KeyedRng::new(6, 0, 0, Stream::Augment);
        let img = random_image(&mut rng, 320, 240);
        let mut aug = Augmenter::new();
        let mut spec = spec_for(DType::F16, Layout::Nhwc, 32, 32);
        let mut out = vec![0u8; spec.image_bytes()];
        // Warm up with the widest and tallest boxes this output size can meet.
        aug.augment_into(&img, CropBox::full(320, 240), false, &spec, &mut out);
        let warm = aug.buffers();
        for index in 0..50 {
            let (crop, flip) = sample_params(&spec, 320, 240, 3, 0, index);
            spec.dtype = DTYPES[index as usize % 4];
            spec.layout = LAYOUTS[index as usize % 2];
            let mut out = vec![0u8; spec.image_bytes()];
            aug.augment_into(&img, crop, flip, &spec, &mut out);
            assert_eq!(
                aug.buffers(),
                warm,
                "a buffer was reallocated at image {index}"
            );
        }
    }

    #[test]
    fn random_resized_crop_stays_in_bounds_and_in_range() {
        let (scale, ratio) = ([0.08f32, 1.0f32], [0.75f32, 4.0 / 3.0]);
        let mut flips = 0;
        let spec = PipelineSpec::train(1, 224);
        let mut area_fractions = Vec::new();
        let mut log_ratios = Vec::new();
        for index in 0..4000u64 {
            let (width, height) = (500, 500);
            let (crop, flip) = sample_params(&spec, width, height, 11, 0, index);
            flips += u32::from(flip);
            assert_eq!(
                crop.x.fract() + crop.y.fract() + crop.w.fract() + crop.h.fract(),
                0.0
            );
            assert!(crop.x >= 0.0 && crop.y >= 0.0 && crop.w >= 1.0 && crop.h >= 1.0);
            assert!(
                crop.x + crop.w <= 500.0 && crop.y + crop.h <= 500.0,
                "{crop:?}"
            );
            let frac = crop.w * crop.h / 250_000.0;
            let r = crop.w / crop.h;
            // Rounding w and h to integers moves area and ratio a little past the range.
            assert!((0.08 * 0.99..=1.0).contains(&frac), "{crop:?}");
            assert!((0.75 * 0.99..=4.0 / 3.0 * 1.01).contains(&r), "{crop:?}");
            area_fractions.push(frac);
            log_ratios.push(r.ln());
            // Same key, same box.
            let mut again = KeyedRng::new(11, 0, index, Stream::Augment);
            assert_eq!(
                random_resized_crop(width, height, scale, ratio, &mut again),
                crop
            );
        }
        assert!((1850..2150).contains(&flips), "{flips} flips of 4000");
        let n = area_fractions.len() as f64;
        let mean_frac = area_fractions.iter().sum::<f64>() / n;
        let mean_log_ratio = log_ratios.iter().sum::<f64>() / n;
        // Uniform(0.08, 1) has mean 0.54; large areas are rejected more often when the ratio
        // pushes a side past the image, so the accepted mean is a little lower.
        assert!(
            (0.45..0.56).contains(&mean_frac),
            "mean area fraction {mean_frac}"
        );
        assert!(
            mean_log_ratio.abs() < 0.02,
            "mean log ratio {mean_log_ratio}"
        );
        let small = area_fractions.iter().filter(|&&f| f < 0.2).count();
        let large = area_fractions.iter().filter(|&&f| f > 0.8).count();
        assert!(small > 300 && large > 100, "small {small}, large {large}");
    }

    #[test]
    fn random_resized_crop_falls_back_to_a_ratio_clamped_centre_crop() {
        // A 1000x10 strip: no box of ratio 3/4..4/3 with area >= 8% fits, so all 10 tries fail.
        let mut rng = KeyedRng::new(0, 0, 0, Stream::Augment);
        let crop = random_resized_crop(1000, 10, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
        // in_ratio 100 > 4/3: h = 10, w = round(10 * 4/3) = 13, centred: j = (1000 - 13) / 2.
        assert_eq!(crop, CropBox::new(493.0, 0.0, 13.0, 10.0));
        let crop = random_resized_crop(10, 1000, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
        // in_ratio 0.01 < 3/4: w = 10, h = round(10 / 0.75) = 13.
        assert_eq!(crop, CropBox::new(0.0, 493.0, 10.0, 13.0));
        // A 1x1 image: the only box is the whole image.
        let crop = random_resized_crop(1, 1, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
        assert_eq!(crop, CropBox::full(1, 1));
    }

    fn assert_box(got: CropBox, want: [f64; 4]) {
        let g = [got.x, got.y, got.w, got.h];
        for (a, b) in g.iter().zip(want) {
            assert!((a - b).abs() < 1e-9, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn center_crop_box_matches_torchvision() {
        // 500x375 -> Resize(256): 341x256 (int(256 * 500 / 375) = 341); CenterCrop(224):
        // left = round(117 / 2 = 58.5) = 58 (half to even), top = round(32 / 2) = 16.
        // Back to source pixels: x = 58 * 500/341, w = 224 * 500/341, y = 16 * 375/256,
        // h = 224 * 375/256.
        assert_box(
            center_crop_box(500, 375, 256, (224, 224)),
            [
                85.043_988_269_794_72,
                23.4375,
                328.445_747_800_586_5,
                328.125,
            ],
        );
        // Portrait: the same numbers transposed.
        assert_box(
            center_crop_box(375, 500, 256, (224, 224)),
            [
                23.4375,
                85.043_988_269_794_72,
                328.125,
                328.445_747_800_586_5,
            ],
        );
        // 343x256: resize is the identity; left = round(119 / 2 = 59.5) = 60 (half to even).
        assert_box(
            center_crop_box(343, 256, 256, (224, 224)),
            [60.0, 16.0, 224.0, 224.0],
        );
        // 640x480 -> 341x256, the same crop offsets as 500x375 at scale 640/341.
        assert_box(
            center_crop_box(640, 480, 256, (224, 224)),
            [
                58.0 * 640.0 / 341.0,
                16.0 * 1.875,
                224.0 * 640.0 / 341.0,
                224.0 * 1.875,
            ],
        );
        // Eval spec: flip_prob 0 never flips; the box ignores the seed.
        let spec = PipelineSpec::eval(1, 224);
        let a = sample_params(&spec, 500, 375, 1, 0, 0);
        let b = sample_params(&spec, 500, 375, 2, 3, 4);
        assert_eq!(a, b);
        assert!(!a.1);
    }

    /// CPU time of this thread: unlike wall time, not inflated by other processes on a shared
    /// machine.
    fn thread_cpu_seconds() -> f64 {
        let mut ts = libc::timespec {
            tv_sec: 0,
            tv_nsec: 0,
        };
        // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
        let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
        assert_eq!(rc, 0, "clock_gettime");
        ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
    }

    #[test]
    #[ignore = "timing; run with --release -- --ignored --nocapture"]
    fn timing_224_from_300_crop() {
        let mut rng = KeyedRng::new(5, 0, 0, Stream::Augment);
        let img = random_image(&mut rng, 400, 350);
        let crop = CropBox::new(40.0, 20.0, 300.0, 300.0);
        let mut aug = Augmenter::new();
        for dtype in DTYPES {
            for layout in LAYOUTS {
                let spec = spec_for(dtype, layout, 224, 224);
                let mut out = vec![0u8; spec.image_bytes()];
                let iters = 200;
                let mut best = f64::MAX;
                for _ in 0..10 {
                    let t = thread_cpu_seconds();
                    for i in 0..iters {
                        // Alternate flip so the tables are rebuilt every image, as in training.
                        aug.augment_into(&img, crop, i % 2 == 0, &spec, &mut out);
                    }
                    best = best.min((thread_cpu_seconds() - t) / f64::from(iters));
                }
                println!(
                    "augment 300x300 -> 224x224 {} {:?}: {:.1} us/image (thread CPU time)",
                    dtype.name(),
                    layout,
                    best * 1e6
                );
            }
        }
    }
}
