//! Batch mixes: torchvision.transforms.v2's `MixUp` and `CutMix` (and a `RandomChoice` of
//! them) over a whole batch of converted images, with the soft labels they make.
//!
//! # Design
//! - One draw per batch ([`draw`]), keyed by (seed, epoch, the batch's number) on its own
//!   [`Stream::BatchMix`], so no other draw moves and the batch is the same whatever the
//!   threads, workers or timing: the choice (if any), then `lam ~ Beta(alpha, alpha)` from
//!   two gammas (Marsaglia–Tsang, in log space so a small alpha never gives 0/0), rounded to
//!   f32 as torch's sampler gives it, then for CutMix the box centre `r_x < W`, `r_y < H`.
//! - The arithmetic is torchvision's, in its order and precision: MixUp's image is
//!   `rolled * (1 - lam) + x * lam`, each product rounded to the output dtype before the sum
//!   (torch's `roll(1, 0).mul_(1 - lam).add_(x.mul(lam))` on f16 and bf16 tensors), the
//!   factors rounded to f32 (torch's float opmath); the labels the same over one-hot rows.
//!   CutMix pastes the rolled batch's box and sets the label weight to
//!   `1 - box area / (W * H)`.
//! - The batch is mixed in place: `roll(1, 0)` pairs position `i` with `i - 1` (0 with the
//!   last), so positions are rewritten from the last down, and only the last image (or its
//!   box) is kept aside in a scratch buffer the caller reuses.
//! - The CUDA backend's kernel (`stoker_mix` in kernels/cu/augment.cu, `engine::mix`) computes
//!   the same in device memory with the same [`draw`] and [`factors`]; [`mix_images`] is its
//!   reference (equal bit for bit on the emulated GPU, `tests/cuda_mix.rs`).
//!
//! # Limitations
//! - Every view is mixed with the same draw; CutMix's box is in view 0's pixels, so a spec
//!   whose views differ in size cannot ask for CutMix (validation refuses it, as
//!   torchvision's `query_size` does).

#![forbid(unsafe_code)]

use std::ops::Range;

use stoker_kernels::augment::{dtype_code, layout_code};
use stoker_kernels::mix::{MixBatch, MIX_CUT, MIX_UP};
use stoker_wire::spec::{BatchMix, DType, Layout};

use super::rng::{KeyedRng, Stream};

/// Which mix a batch got.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MixKind {
    /// `out = lam * x + (1 - lam) * x.roll(1, 0)`.
    MixUp,
    /// The rolled batch's `box` pasted into each image.
    CutMix,
}

/// CutMix's box in an image's pixels: columns `x1..x2`, rows `y1..y2` (maybe empty).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutBox {
    /// First column.
    pub x1: usize,
    /// First row.
    pub y1: usize,
    /// One past the last column.
    pub x2: usize,
    /// One past the last row.
    pub y2: usize,
}

impl CutBox {
    /// Pixels inside the box.
    pub fn area(&self) -> usize {
        (self.x2 - self.x1) * (self.y2 - self.y1)
    }
}

/// What one batch draws: the mix, the Beta draw, and the weight of each sample's own label.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct MixDraw {
    /// The mix applied (a choice's pick).
    pub kind: MixKind,
    /// Index of the pick in a choice's `mixes` (0 for a single mix).
    pub pick: usize,
    /// `lam ~ Beta(alpha, alpha)`, an f32 value.
    pub lam: f64,
    /// The weight of each sample's own label (and of its own pixels in MixUp): `lam` for
    /// MixUp, CutMix's `1 - box area / (W * H)`.
    pub label_lam: f64,
    /// CutMix's box (`None` for MixUp).
    pub cut: Option<CutBox>,
}

/// The draw of batch `batch` (the rank's step times the world size plus the rank) of `epoch`
/// in the job seeded `seed`, for images of `height` x `width` (view 0's).
pub fn draw(mix: &BatchMix, seed: u64, epoch: u64, batch: u64, height: u32, width: u32) -> MixDraw {
    let mut rng = KeyedRng::new(seed, epoch, batch, Stream::BatchMix);
    let (pick, one) = match mix {
        BatchMix::Choice { mixes, p } => {
            let i = choose(&mut rng, mixes.len(), p.as_deref());
            (i, &mixes[i])
        }
        single => (0, single),
    };
    let (kind, alpha) = match *one {
        BatchMix::MixUp { alpha, .. } => (MixKind::MixUp, alpha),
        BatchMix::CutMix { alpha, .. } => (MixKind::CutMix, alpha),
        BatchMix::Choice { .. } => unreachable!("validation refuses a choice inside a choice"),
    };
    // torch samples Beta in f32; its value, promoted to a Python float, is what it uses.
    #[allow(clippy::cast_possible_truncation)]
    let lam = f64::from(beta(&mut rng, f64::from(alpha)) as f32);
    match kind {
        MixKind::MixUp => MixDraw {
            kind,
            pick,
            lam,
            label_lam: lam,
            cut: None,
        },
        MixKind::CutMix => {
            // Below a u32 side: it fits a usize.
            #[allow(clippy::cast_possible_truncation)]
            let (r_x, r_y) = (
                rng.below(u64::from(width)) as usize,
                rng.below(u64::from(height)) as usize,
            );
            let (cut, label_lam) = cut_box(lam, r_x, r_y, height as usize, width as usize);
            MixDraw {
                kind,
                pick,
                lam,
                label_lam,
                cut: Some(cut),
            }
        }
    }
}

/// CutMix's box centred at (`r_x`, `r_y`) for `lam` in an image of `h` x `w`, clamped to the
/// image, and the label weight it leaves: `1 - area / (w * h)`.
pub fn cut_box(lam: f64, r_x: usize, r_y: usize, h: usize, w: usize) -> (CutBox, f64) {
    let r = 0.5 * (1.0 - lam).sqrt();
    // int() of a non-negative float below the side: truncation is the rule.
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let (half_w, half_h) = ((r * w as f64) as usize, (r * h as f64) as usize);
    let cut = CutBox {
        x1: r_x.saturating_sub(half_w),
        y1: r_y.saturating_sub(half_h),
        x2: (r_x + half_w).min(w),
        y2: (r_y + half_h).min(h),
    };
    (cut, 1.0 - cut.area() as f64 / (w * h) as f64)
}

/// Index `i` of `n` with probability `p[i] / sum(p)` (equal without `p`): torch's
/// `multinomial` over the normalised weights.
fn choose(rng: &mut KeyedRng, n: usize, p: Option<&[f32]>) -> usize {
    let weight = |i: usize| p.map_or(1.0, |p| f64::from(p[i]));
    let total: f64 = (0..n).map(weight).sum();
    let t = rng.next_f64() * total;
    let mut cum = 0.0;
    for i in 0..n {
        cum += weight(i);
        if t < cum && weight(i) > 0.0 {
            return i;
        }
    }
    // Rounding left `t` at the total: the last mix that can be picked.
    (0..n).rev().find(|&i| weight(i) > 0.0).unwrap_or(0)
}

/// A draw of `Beta(alpha, alpha)`: `X / (X + Y)` for two `Gamma(alpha)` draws, from their
/// logarithms so that small alphas (whose gammas underflow) still give a number in 0..=1.
pub fn beta(rng: &mut KeyedRng, alpha: f64) -> f64 {
    let lx = ln_gamma_draw(rng, alpha);
    let ly = ln_gamma_draw(rng, alpha);
    1.0 / (1.0 + (ly - lx).exp())
}

/// The logarithm of a `Gamma(shape, 1)` draw: Marsaglia and Tsang's method (2000), with
/// `Gamma(a) = Gamma(a + 1) * U^(1/a)` for shapes below 1.
fn ln_gamma_draw(rng: &mut KeyedRng, shape: f64) -> f64 {
    if shape < 1.0 {
        let u = 1.0 - rng.next_f64();
        return ln_gamma_draw(rng, shape + 1.0) + u.ln() / shape;
    }
    let d = shape - 1.0 / 3.0;
    let c = 1.0 / (9.0 * d).sqrt();
    loop {
        let x = normal(rng);
        let v = 1.0 + c * x;
        if v <= 0.0 {
            continue;
        }
        let v = v * v * v;
        let u = 1.0 - rng.next_f64();
        let x2 = x * x;
        if u < 1.0 - 0.0331 * x2 * x2 || u.ln() < 0.5 * x2 + d * (1.0 - v + v.ln()) {
            return d.ln() + v.ln();
        }
    }
}

/// A standard normal draw (Box–Muller).
fn normal(rng: &mut KeyedRng) -> f64 {
    let u1 = 1.0 - rng.next_f64();
    let u2 = rng.next_f64();
    (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
}

/// One view's images as the mix sees them: `n` images of `height` x `width` x 3 in `dtype`
/// and `layout`, one after another.
#[derive(Debug, Clone, Copy)]
pub struct MixImages {
    /// Images in the batch (the served ones; the padding of a short batch is left alone).
    pub n: usize,
    /// Height in pixels.
    pub height: usize,
    /// Width in pixels.
    pub width: usize,
    /// Element type (a float one).
    pub dtype: DType,
    /// Memory layout.
    pub layout: Layout,
}

impl MixImages {
    fn image_bytes(&self) -> usize {
        self.height * self.width * 3 * self.dtype.size()
    }

    /// The byte ranges of `cut` in one image: one per row (NHWC) or per channel row (NCHW).
    fn box_rows(&self, cut: CutBox) -> impl Iterator<Item = Range<usize>> + '_ {
        let es = self.dtype.size();
        let (h, w) = (self.height, self.width);
        let channels = match self.layout {
            Layout::Nchw => 0..3,
            Layout::Nhwc => 0..1,
        };
        let empty = cut.x1 >= cut.x2;
        channels
            .flat_map(move |c| (cut.y1..cut.y2).map(move |y| (c, y)))
            .filter(move |_| !empty)
            .map(move |(c, y)| match self.layout {
                Layout::Nchw => {
                    let at = ((c * h + y) * w + cut.x1) * es;
                    at..at + (cut.x2 - cut.x1) * es
                }
                Layout::Nhwc => {
                    let at = (y * w + cut.x1) * 3 * es;
                    at..at + (cut.x2 - cut.x1) * 3 * es
                }
            })
    }
}

/// Mixes one view's batch in place by `d` (see the module docs); `scratch` holds the last
/// image (or its box) meanwhile and is kept for the next batch.
///
/// # Panics
/// If `bytes` is shorter than the `n` images, or the dtype is `u8` (validation refuses it).
pub fn mix_images(d: &MixDraw, im: &MixImages, bytes: &mut [u8], scratch: &mut Vec<u8>) {
    let ib = im.image_bytes();
    assert!(
        bytes.len() >= im.n * ib,
        "{} bytes for {} images",
        bytes.len(),
        im.n
    );
    if im.n == 0 {
        return;
    }
    let last = (im.n - 1) * ib;
    match (d.kind, d.cut) {
        (MixKind::CutMix, Some(cut)) => {
            scratch.clear();
            for r in im.box_rows(cut) {
                scratch.extend_from_slice(&bytes[last + r.start..last + r.end]);
            }
            for i in (1..im.n).rev() {
                for r in im.box_rows(cut) {
                    bytes.copy_within(
                        (i - 1) * ib + r.start..(i - 1) * ib + r.end,
                        i * ib + r.start,
                    );
                }
            }
            let mut from = 0;
            for r in im.box_rows(cut) {
                let len = r.len();
                bytes[r].copy_from_slice(&scratch[from..from + len]);
                from += len;
            }
        }
        _ => {
            scratch.clear();
            scratch.extend_from_slice(&bytes[last..last + ib]);
            let (own, other) = factors(d.label_lam);
            for i in (1..im.n).rev() {
                let (head, tail) = bytes.split_at_mut(i * ib);
                blend(im.dtype, &mut tail[..ib], &head[(i - 1) * ib..], own, other);
            }
            blend(im.dtype, &mut bytes[..ib], scratch, own, other);
        }
    }
}

/// The mix kernel's launch (`stoker_mix`, kernels/cu/augment.cu) of `d` over one view's
/// images `im` at device address `dst`: this module's draw and [`factors`] as the kernel's
/// parameters (the region: the whole image for MixUp, the box for CutMix).
pub fn kernel_batch(d: &MixDraw, im: &MixImages, dst: u64) -> MixBatch {
    let (own, other) = factors(d.label_lam);
    // Sides and boxes of an output image (u32 sides), a batch below the spec's u32 size.
    #[allow(clippy::cast_possible_truncation)]
    let (kind, [x1, y1, x2, y2]) = match d.cut {
        Some(c) => (MIX_CUT, [c.x1, c.y1, c.x2, c.y2].map(|v| v as u32)),
        None => (MIX_UP, [0, 0, im.width as u32, im.height as u32]),
    };
    #[allow(clippy::cast_possible_truncation)]
    MixBatch {
        dst,
        image_bytes: im.image_bytes() as u64,
        n: im.n as u32,
        width: im.width as u32,
        height: im.height as u32,
        dtype: dtype_code(im.dtype),
        layout: layout_code(im.layout),
        kind,
        own,
        other,
        x1,
        y1,
        x2,
        y2,
    }
}

/// The two factors as torch multiplies by them: `lam` and `1 - lam` (in f64, as Python
/// computes it), each rounded to f32.
pub fn factors(lam: f64) -> (f32, f32) {
    // Rounding to torch's f32 opmath is the rule here.
    #[allow(clippy::cast_possible_truncation)]
    (lam as f32, (1.0 - lam) as f32)
}

/// `cur = round(prev * other) + round(cur * own)`, rounded, element by element in `dtype`.
fn blend(dtype: DType, cur: &mut [u8], prev: &[u8], own: f32, other: f32) {
    match dtype {
        DType::F32 => {
            for (c, p) in cur.chunks_exact_mut(4).zip(prev.chunks_exact(4)) {
                let (x, r) = (f32_of(c), f32_of(p));
                c.copy_from_slice(&(r * other + x * own).to_ne_bytes());
            }
        }
        DType::F16 => {
            let round = |v: f32| half::f16::from_f32(v).to_f32();
            for (c, p) in cur.chunks_exact_mut(2).zip(prev.chunks_exact(2)) {
                let x = half::f16::from_ne_bytes([c[0], c[1]]).to_f32();
                let r = half::f16::from_ne_bytes([p[0], p[1]]).to_f32();
                let out = half::f16::from_f32(round(r * other) + round(x * own));
                c.copy_from_slice(&out.to_ne_bytes());
            }
        }
        DType::Bf16 => {
            let round = |v: f32| half::bf16::from_f32(v).to_f32();
            for (c, p) in cur.chunks_exact_mut(2).zip(prev.chunks_exact(2)) {
                let x = half::bf16::from_ne_bytes([c[0], c[1]]).to_f32();
                let r = half::bf16::from_ne_bytes([p[0], p[1]]).to_f32();
                let out = half::bf16::from_f32(round(r * other) + round(x * own));
                c.copy_from_slice(&out.to_ne_bytes());
            }
        }
        DType::U8 => panic!("a batch mix of u8 images: validation refuses it"),
    }
}

fn f32_of(b: &[u8]) -> f32 {
    f32::from_ne_bytes([b[0], b[1], b[2], b[3]])
}

/// Writes the soft labels of a batch of `labels` mixed by `d`: row `i` of `out` (`num_classes`
/// floats) is `onehot(labels[i - 1]) * (1 - w) + onehot(labels[i]) * w` (row 0 pairs with the
/// last), `w` being [`MixDraw::label_lam`] rounded to f32 as torch does; rows past
/// `labels.len()` are zeroed. Every label must be below `num_classes`.
///
/// # Panics
/// If a label is outside `0..num_classes` (the job refuses such a dataset before serving) or
/// `out` is shorter than the labels' rows.
pub fn soft_labels(d: &MixDraw, labels: &[i64], num_classes: usize, out: &mut [f32]) {
    let n = labels.len();
    assert!(
        out.len() >= n * num_classes,
        "{} floats for {n} rows",
        out.len()
    );
    out.fill(0.0);
    let (own, other) = factors(d.label_lam);
    let class = |l: i64| {
        usize::try_from(l)
            .ok()
            .filter(|&c| c < num_classes)
            .unwrap_or_else(|| panic!("label {l} outside 0..{num_classes}"))
    };
    for i in 0..n {
        let prev = labels[(i + n - 1) % n];
        let row = &mut out[i * num_classes..(i + 1) * num_classes];
        row[class(prev)] = other;
        row[class(labels[i])] += own;
    }
}

#[cfg(test)]
mod tests;
