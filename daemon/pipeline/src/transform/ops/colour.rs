//! The colour and intensity operations on 8-bit RGB, each the arithmetic of
//! torchvision.transforms.v2.functional's kernel for `uint8` tensors: the same f32
//! intermediate values, the same rounding (truncation where torchvision converts with
//! `.to(uint8)`, half to even where it rounds first), the same lookup tables.
//!
//! # Limitations
//! - torch may sum in another order or fuse a multiply-add; a value that lands within an f32
//!   rounding of an integer can then differ by one (never for the integer operations:
//!   posterize, solarize, equalize, autocontrast, grayscale, invert).

use stoker_kernels::image::RgbImage;

/// torchvision's grey weights (ITU-R 601-2 luma, as Pillow's `L` mode).
const LUMA: [f32; 3] = [0.2989, 0.587, 0.114];

/// The luma of one pixel in f32, as `r.mul(0.2989).add_(g, alpha=0.587).add_(b, alpha=0.114)`.
#[inline]
fn luma(p: &[u8]) -> f32 {
    f32::from(p[0]) * LUMA[0] + f32::from(p[1]) * LUMA[1] + f32::from(p[2]) * LUMA[2]
}

/// f32 to u8 as `.clamp_(0, 255).to(torch.uint8)`: clamped, then truncated.
#[inline]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn truncate(v: f32) -> u8 {
    v.clamp(0.0, 255.0) as u8
}

/// f32 to u8 as `.round_()` then `.to(torch.uint8)` (values already within 0..=255).
#[inline]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(super) fn round_even(v: f32) -> u8 {
    v.round_ties_even().clamp(0.0, 255.0) as u8
}

/// torchvision's `_blend(image, other, ratio)` for one value: `image * ratio + other * (1 -
/// ratio)`, clamped and truncated.
#[inline]
fn blend(v: u8, other: f32, ratio: f32) -> u8 {
    truncate(f32::from(v) * ratio + other * (1.0 - ratio))
}

/// `adjust_brightness(image, factor)`.
pub(super) fn brightness(img: &mut RgbImage, factor: f32) {
    for v in &mut img.data {
        *v = truncate(f32::from(*v) * factor);
    }
}

/// `adjust_contrast(image, factor)`: blended with the mean of the floored luma.
pub(super) fn contrast(img: &mut RgbImage, factor: f32) {
    let pixels = img.data.len() / 3;
    if pixels == 0 {
        return;
    }
    let sum: f64 = img
        .data
        .chunks_exact(3)
        .map(|p| f64::from(luma(p).floor()))
        .sum();
    #[allow(clippy::cast_possible_truncation)]
    let mean = (sum / pixels as f64) as f32;
    for v in &mut img.data {
        *v = blend(*v, mean, factor);
    }
}

/// `adjust_saturation(image, factor)`: each pixel blended with its floored luma.
pub(super) fn saturation(img: &mut RgbImage, factor: f32) {
    for p in img.data.chunks_exact_mut(3) {
        let grey = luma(p).floor();
        for v in p {
            *v = blend(*v, grey, factor);
        }
    }
}

/// `rgb_to_grayscale(image, num_output_channels=3)`: the luma, truncated, in every channel.
pub(super) fn grayscale(img: &mut RgbImage) {
    for p in img.data.chunks_exact_mut(3) {
        let grey = truncate(luma(p));
        p.fill(grey);
    }
}

/// `invert(image)`.
pub(super) fn invert(img: &mut RgbImage) {
    for v in &mut img.data {
        *v = !*v;
    }
}

/// `solarize(image, threshold)`: values at or above `threshold` inverted.
pub(super) fn solarize(img: &mut RgbImage, threshold: f32) {
    for v in &mut img.data {
        if f32::from(*v) >= threshold {
            *v = !*v;
        }
    }
}

/// `posterize(image, bits)`: the `bits` high bits of every value.
pub(super) fn posterize(img: &mut RgbImage, bits: u8) {
    if bits >= 8 {
        return;
    }
    let mask = !(0xffu8 >> bits);
    for v in &mut img.data {
        *v &= mask;
    }
}

/// `autocontrast(image)`: each channel's min..max stretched to 0..255 (a flat channel kept).
pub(super) fn autocontrast(img: &mut RgbImage) {
    for c in 0..3 {
        let values = img.data.iter().skip(c).step_by(3);
        let (lo, hi) = values.fold((255u8, 0u8), |(lo, hi), &v| (lo.min(v), hi.max(v)));
        if lo >= hi {
            continue;
        }
        let minimum = f32::from(lo);
        let inv_scale = (f32::from(hi) - minimum) * (1.0 / 255.0);
        for v in img.data.iter_mut().skip(c).step_by(3) {
            *v = truncate((f32::from(*v) - minimum) / inv_scale);
        }
    }
}

/// `equalize(image)`: per channel, Pillow's histogram-equalisation lookup table.
pub(super) fn equalize(img: &mut RgbImage) {
    let n = img.data.len() / 3;
    for c in 0..3 {
        let mut hist = [0usize; 256];
        for &v in img.data.iter().skip(c).step_by(3) {
            hist[usize::from(v)] += 1;
        }
        // The last non-empty bin holds the channel's largest value; its pixels do not count.
        let last = hist.iter().rposition(|&h| h > 0).unwrap_or(0);
        let step = (n - hist[last]) / 255;
        if step == 0 {
            continue;
        }
        let mut lut = [0u8; 256];
        let mut cumulative = 0usize;
        for k in 1..256 {
            cumulative += hist[k - 1];
            #[allow(clippy::cast_possible_truncation)]
            let value = ((cumulative + step / 2) / step).min(255) as u8;
            lut[k] = value;
        }
        for v in img.data.iter_mut().skip(c).step_by(3) {
            *v = lut[usize::from(*v)];
        }
    }
}

/// `adjust_sharpness(image, factor)`: the interior blended with its rounded 3x3 smoothing
/// (1s around a 5, over 13); the border rows and columns are kept. Images of 2 pixels or less
/// on a side are returned as they are.
///
/// The eight neighbours are summed exactly (integers) before the weights: the same value as
/// torch's convolution up to f32 rounding, row by row over contiguous values.
pub(super) fn sharpness(img: &mut RgbImage, factor: f32, scratch: &mut Vec<u8>) {
    let (w, h) = (img.width as usize, img.height as usize);
    if w <= 2 || h <= 2 {
        return;
    }
    let (a, b) = (1.0f32 / 13.0, 5.0f32 / 13.0);
    let keep = 1.0 - factor;
    scratch.clear();
    scratch.extend_from_slice(&img.data);
    let row = w * 3;
    for y in 1..h - 1 {
        let above = &scratch[(y - 1) * row..][..row];
        let here = &scratch[y * row..][..row];
        let below = &scratch[(y + 1) * row..][..row];
        let out = &mut img.data[y * row..][..row];
        for i in 3..row - 3 {
            let ring = u16::from(above[i - 3])
                + u16::from(above[i])
                + u16::from(above[i + 3])
                + u16::from(here[i - 3])
                + u16::from(here[i + 3])
                + u16::from(below[i - 3])
                + u16::from(below[i])
                + u16::from(below[i + 3]);
            let v = f32::from(here[i]);
            let blurred = (f32::from(ring) * a + v * b).round_ties_even();
            out[i] = truncate(v + (blurred - v) * keep);
        }
    }
}

/// `adjust_hue(image, factor)`: through HSV in f32 as torchvision converts (Pillow's
/// formulas), the hue turned by `factor` of a full turn, back to 8 bits as `to_dtype` scales.
///
/// Eight pixels at a time, branch-free (selects, truncation for `floor` of non-negative
/// values, a subtraction for `fmod`/`remainder` within one turn): the same f32 operations as
/// torchvision's, in a form the compiler vectorises.
pub(super) fn hue(img: &mut RgbImage, factor: f32) {
    const LANES: usize = 8;
    let mut chunks = img.data.chunks_exact_mut(3 * LANES);
    for chunk in &mut chunks {
        hue_lanes::<LANES>(chunk, factor);
    }
    for p in chunks.into_remainder().chunks_exact_mut(3) {
        hue_lanes::<1>(p, factor);
    }
}

/// [`hue`] on `N` interleaved RGB pixels.
#[inline(always)]
fn hue_lanes<const N: usize>(px: &mut [u8], factor: f32) {
    let mut rgb = [[0.0f32; N]; 3];
    for (i, p) in px.chunks_exact(3).enumerate() {
        for c in 0..3 {
            rgb[c][i] = f32::from(p[c]) * (1.0 / 255.0);
        }
    }
    let mut out = [[0.0f32; N]; 3];
    for i in 0..N {
        let (h, s, v) = rgb_to_hsv(rgb[0][i], rgb[1][i], rgb[2][i]);
        // `remainder(h + factor, 1)` for a value within (-1, 2): one turn added or taken.
        let turned = h + factor;
        let turned = if turned < 0.0 {
            turned + 1.0
        } else if turned >= 1.0 {
            turned - 1.0
        } else {
            turned
        };
        let [r, g, b] = hsv_to_rgb(turned, s, v);
        out[0][i] = r;
        out[1][i] = g;
        out[2][i] = b;
    }
    for (i, p) in px.chunks_exact_mut(3).enumerate() {
        for c in 0..3 {
            p[c] = to_u8_scaled(out[c][i]);
        }
    }
}

/// A 0..1 float to 8 bits as torchvision's `to_dtype(uint8, scale=True)`: times 255.999,
/// truncated.
#[inline]
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
fn to_u8_scaled(x: f32) -> u8 {
    (x * (255.0 + 1.0 - 1e-3)).clamp(0.0, 255.0) as u8
}

/// torchvision's `_rgb_to_hsv` for one pixel.
#[inline(always)]
fn rgb_to_hsv(r: f32, g: f32, b: f32) -> (f32, f32, f32) {
    let maxc = r.max(g).max(b);
    let minc = r.min(g).min(b);
    let eqc = maxc == minc;
    let range = maxc - minc;
    let s = range / if eqc { 1.0 } else { maxc };
    let divisor = if eqc { 1.0 } else { range };
    let (rc, gc, bc) = (
        (maxc - r) / divisor,
        (maxc - g) / divisor,
        (maxc - b) / divisor,
    );
    let max_is_r = maxc == r;
    let max_is_g = maxc == g;
    let hr = if max_is_r { bc - gc } else { 0.0 };
    let hg = if max_is_g && !max_is_r {
        rc + 2.0 - bc
    } else {
        0.0
    };
    let hb = if !max_is_r && !max_is_g {
        gc + 4.0 - rc
    } else {
        0.0
    };
    // `fmod(x, 1)` of a value within [0, 2).
    let h = (hr + hg + hb) * (1.0 / 6.0) + 1.0;
    let h = if h >= 1.0 { h - 1.0 } else { h };
    (h, s, maxc)
}

/// torchvision's `_hsv_to_rgb` for one pixel (`h` within [0, 1]).
#[inline(always)]
#[allow(clippy::cast_possible_truncation)]
fn hsv_to_rgb(h: f32, s: f32, v: f32) -> [f32; 3] {
    let h6 = h * 6.0;
    // floor of a non-negative value: truncation.
    let i = h6 as i32;
    let f = h6 - i as f32;
    let i = if i >= 6 { i - 6 } else { i };
    let sxf = s * f;
    let one_minus_s = 1.0 - s;
    let q = ((1.0 - sxf) * v).clamp(0.0, 1.0);
    let t = ((sxf + one_minus_s) * v).clamp(0.0, 1.0);
    let p = (one_minus_s * v).clamp(0.0, 1.0);
    let pick = |at: [f32; 6]| {
        let mut x = at[0];
        for (k, &y) in (0i32..).zip(&at).skip(1) {
            x = if i == k { y } else { x };
        }
        x
    };
    [
        pick([v, q, p, p, t, v]),
        pick([t, v, v, q, p, p]),
        pick([p, p, t, v, v, q]),
    ]
}

/// `gaussian_blur(image, kernel_size, sigma)`: a separable Gaussian of `kernel_size` =
/// `[width, height]` taps (torchvision's softmax of `-(x / sigma)^2` over `x` spaced evenly in
/// `±(k - 1) / (2 sqrt 2)`), reflect padding, rounded half to even.
///
/// torchvision convolves with the 2-D outer product; the separable passes give the same sums
/// up to f32 rounding. A kernel wider than the image reflects again at the far side, where
/// torch's reflect padding refuses.
///
/// Both passes are axpy loops over contiguous f32 (one row padded by reflection for the
/// horizontal pass, whole rows for the vertical), which the compiler vectorises.
pub(super) fn gaussian_blur(
    img: &mut RgbImage,
    kernel_size: [u32; 2],
    sigma: [f32; 2],
    scratch: &mut Vec<f32>,
) {
    let (w, h) = (img.width as usize, img.height as usize);
    if w == 0 || h == 0 {
        return;
    }
    let kx = gaussian_kernel(kernel_size[0] as usize, sigma[0]);
    let ky = gaussian_kernel(kernel_size[1] as usize, sigma[1]);
    let (rx, ry) = (kx.len() / 2, ky.len() / 2);
    let row = w * 3;
    // scratch: the horizontally blurred image (h rows), then one padded source row, then one
    // output row of accumulators.
    let padded_len = (w + 2 * rx) * 3;
    scratch.clear();
    scratch.resize(h * row + padded_len + row, 0.0);
    let (blurred, rest) = scratch.split_at_mut(h * row);
    let (padded, acc) = rest.split_at_mut(padded_len);
    for y in 0..h {
        let src = &img.data[y * row..][..row];
        for (p, dst) in padded.chunks_exact_mut(3).enumerate() {
            let sx = reflect(p, rx, w);
            for c in 0..3 {
                dst[c] = f32::from(src[sx * 3 + c]);
            }
        }
        let out = &mut blurred[y * row..][..row];
        out.fill(0.0);
        for (t, &k) in kx.iter().enumerate() {
            let shifted = &padded[t * 3..][..row];
            for (o, &v) in out.iter_mut().zip(shifted) {
                *o += v * k;
            }
        }
    }
    for y in 0..h {
        acc.fill(0.0);
        for (t, &k) in ky.iter().enumerate() {
            let sy = reflect(y + t, ry, h);
            let src = &blurred[sy * row..][..row];
            for (a, &v) in acc.iter_mut().zip(src) {
                *a += v * k;
            }
        }
        for (dst, &v) in img.data[y * row..][..row].iter_mut().zip(acc.iter()) {
            *dst = round_even(v);
        }
    }
}

/// Index `pos - radius` reflected into `0..n` without repeating the edge (`-1 -> 1`,
/// `n -> n - 2`), again and again for a kernel wider than the axis.
fn reflect(pos: usize, radius: usize, n: usize) -> usize {
    if n == 1 {
        return 0;
    }
    let period = 2 * (n - 1);
    // `pos - radius` taken modulo the period without going below zero.
    let i = (pos + period * radius.div_ceil(period) - radius) % period;
    if i >= n {
        period - i
    } else {
        i
    }
}

/// torchvision's `_get_gaussian_kernel1d` in f32.
#[allow(clippy::cast_precision_loss)]
pub(super) fn gaussian_kernel(size: usize, sigma: f32) -> Vec<f32> {
    let lim = (size as f32 - 1.0) / (2.0 * std::f32::consts::SQRT_2);
    let xs = super::linspace(-lim, lim, size);
    let logits: Vec<f32> = xs.iter().map(|x| -(x / sigma).powi(2)).collect();
    let top = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|l| (l - top).exp()).collect();
    let total: f32 = exps.iter().sum();
    exps.iter().map(|e| e / total).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn image(w: u32, h: u32, data: &[u8]) -> RgbImage {
        RgbImage {
            width: w,
            height: h,
            data: data.to_vec(),
        }
    }

    #[test]
    fn integer_operations_match_hand_values() {
        let mut img = image(2, 1, &[0, 100, 255, 129, 128, 127]);
        posterize(&mut img, 3);
        assert_eq!(img.data, [0, 96, 224, 128, 128, 96]);
        let mut img = image(2, 1, &[0, 100, 255, 129, 128, 127]);
        solarize(&mut img, 128.0);
        assert_eq!(img.data, [0, 100, 0, 126, 127, 127]);
        let mut img = image(2, 1, &[10, 20, 30, 40, 20, 30]);
        autocontrast(&mut img);
        // (40 - 10) / (30 * (1 / 255)) is 254.99998 in f32: truncated, as torchvision gives.
        assert_eq!(img.data, [0, 20, 30, 254, 20, 30]);
        let mut img = image(1, 1, &[255, 255, 255]);
        grayscale(&mut img);
        assert_eq!(
            img.data,
            [254, 254, 254],
            "0.2989 + 0.587 + 0.114 < 1, truncated"
        );
    }

    #[test]
    fn equalize_spreads_a_ramp_and_keeps_a_flat_channel() {
        let data: Vec<u8> = (0..=255u8).flat_map(|v| [v / 2, 7, v]).collect();
        let mut img = image(256, 1, &data);
        equalize(&mut img);
        assert!(img.data.iter().skip(1).step_by(3).all(|&v| v == 7));
        let blue: Vec<u8> = img.data.iter().skip(2).step_by(3).copied().collect();
        assert_eq!(blue[0], 0);
        assert!(blue.windows(2).all(|p| p[0] <= p[1]));
    }

    #[test]
    fn hue_turns_red_to_green_and_back() {
        let mut img = image(1, 1, &[255, 0, 0]);
        hue(&mut img, 1.0 / 3.0);
        assert_eq!(img.data, [0, 255, 0]);
        hue(&mut img, -1.0 / 3.0);
        assert_eq!(img.data, [255, 0, 0]);
        let mut grey = image(1, 1, &[90, 90, 90]);
        hue(&mut grey, 0.25);
        assert_eq!(grey.data, [90, 90, 90]);
    }

    #[test]
    fn blur_kernel_sums_to_one_and_keeps_a_flat_image() {
        let k = gaussian_kernel(7, 1.3);
        assert!((k.iter().sum::<f32>() - 1.0).abs() < 1e-6);
        assert!(k[3] > k[2] && (k[0] - k[6]).abs() < 1e-7);
        let mut img = image(3, 2, &[77; 18]);
        gaussian_blur(&mut img, [9, 5], [2.0, 0.5], &mut Vec::new());
        assert_eq!(img.data, [77; 18]);
        assert_eq!(
            (0..8).map(|i| reflect(i, 2, 3)).collect::<Vec<_>>(),
            [2, 1, 0, 1, 2, 1, 0, 1]
        );
    }

    #[test]
    fn sharpness_keeps_the_border_and_one_keeps_everything() {
        let data: Vec<u8> = (0..48u8).map(|v| v.wrapping_mul(37)).collect();
        let mut img = image(4, 4, &data);
        sharpness(&mut img, 1.0, &mut Vec::new());
        assert_eq!(img.data, data);
        sharpness(&mut img, 0.0, &mut Vec::new());
        assert_eq!(&img.data[..12], &data[..12]);
        assert_ne!(img.data, data);
    }
}
