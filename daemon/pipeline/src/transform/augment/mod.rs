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
//! - Two copies of the hot loops: the portable one (SSE2, every x86_64) and one compiled for
//!   AVX2, chosen per call where the CPU has it. Both run the same f32 operations in the same
//!   order (Rust never fuses a multiply and an add), so they give the same bytes (tested), and
//!   hosts and remote workers with and without AVX2 agree.
//! - f32 output rows go to the slot with streaming stores (`stream`): the slot is read next by
//!   another process, so it is not worth caching, and a cached write would first read every
//!   line it writes.
//!
//! # Limitations
//! - A CenterCrop larger than the resized image (possible only with a non-square `size`) is
//!   not zero-padded as torchvision pads it: taps are clamped to the image, so edges repeat.
//! - f32 arithmetic: u8 outputs are within 1 of the f64 reference, float outputs within 1e-3
//!   (plus one unit in the last place of f16 / bf16).

use half::slice::HalfFloatSliceExt;
pub use stoker_kernels::image::{CropBox, RgbImage};
use stoker_kernels::reference::tap_window;
use stoker_wire::spec::{Crop, DType, Layout, PipelineSpec};

use crate::transform::rng::{KeyedRng, Stream};

/// torchvision's `RandomResizedCrop.get_params`: up to 10 tries at a box of `scale` x the
/// image's area and aspect ratio (width / height) log-uniform in `ratio`, placed uniformly;
/// failing that, the centred box of the whole image clamped to `ratio`. Python's `round` (half
/// to even) is used where torchvision uses it. Integer boxes, in source pixels.
// `w` and `h` are checked in `(0, width]` and `(0, height]` before they narrow; the fallback's
// clamped side is at most the other side's image dimension, a u32.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
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
    /// `weights` for output samples taken two at a time (`2p`, `2p + 1`), `stride` entries
    /// per pair: tap `k`'s weight of the first sample in lanes 0-3, of the second in lanes
    /// 4-7, so that one 8-lane multiply resamples two RGB pixels (`rows::pairs_avx2`). Built
    /// only by [`AxisTable::build_with_pairs`] (the horizontal table).
    paired: Vec<[f32; 8]>,
    /// Scratch of `build`: every output sample's unnormalised f64 weights, back to back, and
    /// their sums.
    raw: Vec<f64>,
    totals: Vec<f64>,
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
    // Taps are clamped into the axis window, whose bounds are u32s; weights are f32 by design.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
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
        // Pass 1: each output sample's tap range and its weights in f64 (each evaluated
        // once); the stride is the longest range.
        self.first.clear();
        self.count.clear();
        self.raw.clear();
        self.totals.clear();
        for slot in 0..n {
            let c = center(slot);
            let xmin = (c - support + 0.5).floor().max(f64::from(win_lo)) as usize;
            let xmax = ((c + support + 0.5).floor().min(f64::from(win_hi)) as usize).max(xmin);
            let mark = self.raw.len();
            self.raw.extend((xmin..xmax).map(|x| weight(x, c)));
            let total: f64 = self.raw[mark..].iter().sum();
            let (first, count) = if total > 0.0 {
                (xmin, xmax - xmin)
            } else {
                // Only reachable for a box outside the image: the nearest edge sample.
                self.raw.truncate(mark);
                let nearest = (c.floor().max(f64::from(win_lo)) as usize).min(win_hi as usize - 1);
                (nearest, 0)
            };
            self.first.push(first as u32);
            self.count.push(count as u32);
            self.totals.push(total);
        }
        self.stride = self
            .count
            .iter()
            .map(|&c| c.max(1) as usize)
            .max()
            .unwrap_or(1);
        // Pass 2: weights normalised in f64, stored as f32; zero past each sample's count.
        self.weights.clear();
        self.weights.resize(n * self.stride, 0.0);
        let (mut lo, mut hi) = (usize::MAX, 0usize);
        let mut raw = self.raw.iter();
        for slot in 0..n {
            let first = self.first[slot] as usize;
            let count = self.count[slot] as usize;
            let row = &mut self.weights[slot * self.stride..][..self.stride];
            if count == 0 {
                row[0] = 1.0;
                self.count[slot] = 1;
            } else {
                let total = self.totals[slot];
                for (dst, w) in row[..count].iter_mut().zip(raw.by_ref()) {
                    *dst = (w / total) as f32;
                }
            }
            lo = lo.min(first);
            hi = hi.max(first + self.count[slot] as usize);
        }
        self.lo = lo;
        self.hi = hi;
        self.key = Some(key);
    }

    /// [`AxisTable::build`], and `paired` with it: the horizontal table, whose AVX2 step reads
    /// two pixels' weights at a time.
    fn build_with_pairs(&mut self, key: AxisKey) {
        if self.key != Some(key) {
            self.build(key);
            rows::pair_weights(self.stride, &self.weights, &mut self.paired);
        }
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
    /// Never the AVX2 copy ([`Augmenter::use_portable_code`]).
    #[cfg_attr(not(target_arch = "x86_64"), allow(dead_code))]
    portable: bool,
}

impl Augmenter {
    /// An augmenter with empty scratch buffers (they grow on first use).
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
        #[cfg(target_arch = "x86_64")]
        if !self.portable && std::is_x86_feature_detected!("avx2") {
            // SAFETY: the CPU has AVX2, checked just above.
            unsafe { self.augment_avx2(img, crop, flip, spec, out) };
            return;
        }
        // SAFETY: the portable copy has no precondition.
        unsafe { self.augment::<false>(img, crop, flip, spec, out) };
    }

    /// Runs only the code built for every x86_64 CPU (SSE2), never the AVX2 copy: for the
    /// tests that show both give the same bytes.
    #[doc(hidden)]
    pub fn use_portable_code(&mut self, portable: bool) {
        self.portable = portable;
    }

    /// [`Augmenter::augment`] compiled for AVX2: the same operations in the same order (Rust
    /// never fuses a multiply and an add), on 8 lanes where the portable copy has 4, and the
    /// horizontal pass two pixels at a time (`rows`).
    ///
    /// # Safety
    /// The CPU must have AVX2.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx2")]
    unsafe fn augment_avx2(
        &mut self,
        img: &RgbImage,
        crop: CropBox,
        flip: bool,
        spec: &PipelineSpec,
        out: &mut [u8],
    ) {
        // SAFETY: the CPU has AVX2 (this function's own precondition).
        unsafe { self.augment::<true>(img, crop, flip, spec, out) };
    }

    /// The body of [`Augmenter::augment_into`], inlined into each copy; `AVX2` says which.
    ///
    /// # Safety
    /// With `AVX2`, the CPU must have AVX2.
    #[inline(always)]
    unsafe fn augment<const AVX2: bool>(
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
        self.horizontal.build_with_pairs(AxisKey {
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
                    // SAFETY: with `AVX2`, the CPU has AVX2 (this function's precondition).
                    unsafe { self.horizontal_pass::<AVX2>(img, y, slot, w) };
                    self.ring_holds[slot] = y;
                }
            }
            self.vertical_pass(oy, ring_rows, w);
            self.store_row(spec, &scale, &bias, oy, h, w, es, out);
        }
        stream::fence();
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
            of(&h.paired),
            of(&h.raw),
            of(&h.totals),
            of(&v.raw),
            of(&v.totals),
            of(&self.source_row),
            of(&self.ring),
            of(&self.ring_holds),
            of(&self.acc),
            of(&self.values),
            of(&self.halves),
        ]
    }

    /// Resamples source row `y` horizontally into ring slot `slot`.
    ///
    /// # Safety
    /// With `AVX2`, the CPU must have AVX2.
    #[inline(always)]
    unsafe fn horizontal_pass<const AVX2: bool>(
        &mut self,
        img: &RgbImage,
        y: usize,
        slot: usize,
        w: usize,
    ) {
        let table = &self.horizontal;
        let (lo, hi) = (table.lo, table.hi);
        let row_start = y * img.width as usize * 3;
        let src = &img.data[row_start + lo * 3..row_start + hi * 3];
        // The row past `hi - lo` pixels stays zero: padding.
        for (d, &s) in self.source_row.iter_mut().zip(src) {
            *d = f32::from(s);
        }
        let dst = &mut self.ring[slot * w..(slot + 1) * w];
        // SAFETY: with `AVX2`, the CPU has AVX2 (this function's precondition).
        unsafe { rows::horizontal::<AVX2>(table, &self.source_row, dst) };
    }

    /// Sums the ring rows output row `oy` needs, weighted, into `acc`.
    #[inline(always)]
    fn vertical_pass(&mut self, oy: usize, ring_rows: usize, w: usize) {
        let (first, wy) = self.vertical.taps(oy);
        let ring = &self.ring;
        let row = |k: usize| {
            let slot = (first + k) % ring_rows;
            ring[slot * w..(slot + 1) * w].as_flattened()
        };
        rows::vertical_row(wy, row, self.acc.as_flattened_mut());
    }

    /// Normalises and converts `acc` (output row `oy`) and stores it in `out`.
    #[allow(clippy::too_many_arguments)]
    #[inline(always)]
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
    // 0..=255 (see above).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let b = i as u8;
    b
}

/// `(v / 255 - mean) / std` as `v * scale + bias`.
// The kernels compute in f32: the narrowing is the point.
#[allow(clippy::cast_possible_truncation)]
#[inline(always)]
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
#[inline(always)]
fn encode(values: &[f32], dtype: DType, dst: &mut [u8], halves: &mut Vec<half::f16>) {
    match dtype {
        DType::F32 => {
            // SAFETY: `encode` runs only in `store_row`, inside `Augmenter::augment`, which
            // calls `stream::fence` after the image's last row, before it returns.
            if unsafe { stream::store_f32(values, dst) } {
                return;
            }
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
pub(crate) mod planar_probe;
mod rows;
mod stream;
#[cfg(test)]
mod tests;
