//! The augmenter's two inner loops: one source row resampled across (horizontal), and the
//! ring rows one output row needs summed down (vertical).
//!
//! # Design
//! - Every lane does the same f32 operations in the same order as a plain loop over taps
//!   (`acc = 0; acc += w[k] * p[k]` for k ascending), however many pixels or lanes share one
//!   SIMD instruction: the portable and AVX2 copies, and any later rearrangement of the lanes,
//!   give the same bytes.
//! - Horizontal: two output pixels per iteration, their taps' weights laid out as
//!   [`AxisTable::paired`] (`[w; 4]` of the first pixel beside `[w; 4]` of the second), so each
//!   tap is one 8-lane multiply and add over two RGB(+spare) pixels instead of two 4-lane
//!   ones with a broadcast each. An odd last column goes alone.
//! - Vertical: each output value summed over its taps in a register and stored once, instead
//!   of a row-long accumulator read and written once per tap.
//!
//! # Limitations
//! - Only 1..=8 taps per output sample are specialised; more (downscales beyond about 3.5x,
//!   rare after the DCT-scaled decode) take a generic loop, one pixel at a time.
//! - The two-pixel step is x86_64 AVX2 only; no AVX-512 copy (not measured), and other
//!   architectures take the portable loop.
//! - A pixel's 4th lane is a by-product (the next pixel's R): a quarter of every multiply.

use super::AxisTable;

/// Fills `paired` from `weights` (`stride` per output sample): for each pair of output
/// samples and each tap, the first sample's weight four times, then the second's.
pub(super) fn pair_weights(stride: usize, weights: &[f32], paired: &mut Vec<[f32; 8]>) {
    paired.clear();
    for two in weights.chunks_exact(2 * stride) {
        let (a, b) = two.split_at(stride);
        paired.extend(a.iter().zip(b).map(|(&x, &y)| [x, x, x, x, y, y, y, y]));
    }
}

/// One row of the horizontal pass: `src` holds source columns `table.lo..` as interleaved
/// RGB f32, then at least `table.stride` zero pixels and one float of padding; `dst` gets one
/// RGB(+spare) pixel per output column. `AVX2` is true only in the AVX2 copy of the augmenter.
///
/// # Safety
/// With `AVX2`, the CPU must have AVX2.
#[inline(always)]
pub(super) unsafe fn horizontal<const AVX2: bool>(
    table: &AxisTable,
    src: &[f32],
    dst: &mut [[f32; 4]],
) {
    // A loop of exactly `stride` taps (zero weights past each column's count) unrolls into
    // straight-line SIMD; adding 0 * pixel changes no bit of the sum.
    match table.stride {
        // SAFETY: this function's precondition.
        1 => unsafe { fixed_taps::<1, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        2 => unsafe { fixed_taps::<2, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        3 => unsafe { fixed_taps::<3, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        4 => unsafe { fixed_taps::<4, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        5 => unsafe { fixed_taps::<5, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        6 => unsafe { fixed_taps::<6, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        7 => unsafe { fixed_taps::<7, AVX2>(table, src, dst) },
        // SAFETY: this function's precondition.
        8 => unsafe { fixed_taps::<8, AVX2>(table, src, dst) },
        _ => {
            for (ox, d) in dst.iter_mut().enumerate() {
                let (first, wx) = table.taps(ox);
                let px = &src[(first - table.lo) * 3..];
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

/// # Safety
/// With `AVX2`, the CPU must have AVX2.
#[inline(always)]
unsafe fn fixed_taps<const K: usize, const AVX2: bool>(
    table: &AxisTable,
    src: &[f32],
    dst: &mut [[f32; 4]],
) {
    #[cfg(target_arch = "x86_64")]
    if AVX2 {
        // SAFETY: with `AVX2`, the CPU has AVX2 (this function's precondition).
        unsafe { pairs_avx2::<K>(table, src, dst) };
        return;
    }
    one_at_a_time::<K>(table, src, 0, dst);
}

/// Output columns `from..from + dst.len()`, one pixel at a time: per tap, one 4-lane
/// multiply by the broadcast weight and one add.
#[inline(always)]
fn one_at_a_time<const K: usize>(
    table: &AxisTable,
    src: &[f32],
    from: usize,
    dst: &mut [[f32; 4]],
) {
    let columns = dst
        .iter_mut()
        .zip(&table.first[from..])
        .zip(table.weights[from * K..].chunks_exact(K));
    for ((d, &first), w) in columns {
        let px = &src[(first as usize - table.lo) * 3..][..3 * K + 1];
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

/// Two output columns at a time: per tap, the two pixels' 4 lanes loaded into one 8-lane
/// register, one multiply by [`AxisTable::paired`]'s weights and one add. An odd last
/// column goes [`one_at_a_time`].
///
/// # Safety
/// The CPU must have AVX2.
#[cfg(target_arch = "x86_64")]
#[target_feature(enable = "avx2")]
#[inline]
unsafe fn pairs_avx2<const K: usize>(table: &AxisTable, src: &[f32], dst: &mut [[f32; 4]]) {
    use std::arch::x86_64::{
        _mm256_add_ps, _mm256_loadu2_m128, _mm256_loadu_ps, _mm256_mul_ps, _mm256_setzero_ps,
        _mm256_storeu_ps,
    };
    let even = dst.len() / 2 * 2;
    let (pairs, last) = dst.split_at_mut(even);
    let columns = pairs
        .chunks_exact_mut(2)
        .zip(table.first.chunks_exact(2))
        .zip(table.paired.chunks_exact(K));
    // Every column's taps start within `src` with 3K + 1 floats to spare: one check per
    // pair (the larger start) instead of two slices per pixel.
    assert!(
        src.len() > 3 * K,
        "source row shorter than one column's taps"
    );
    let last_start = src.len() - (3 * K + 1);
    let p = src.as_ptr();
    for ((d, first), w) in columns {
        let x0 = (first[0] as usize - table.lo) * 3;
        let x1 = (first[1] as usize - table.lo) * 3;
        assert!(x0.max(x1) <= last_start, "tap start past the source row");
        let mut a = _mm256_setzero_ps();
        for (k, wk) in w.iter().enumerate() {
            // SAFETY: `w` holds K weights (`chunks_exact(K)`), so k < K, and floats
            // x + 3k .. x + 3k + 4 lie inside `src` for x = x0 and x1 (checked above); `wk`
            // is 8 floats; `d` is two [f32; 4], 8 contiguous floats. Unaligned loads and
            // stores are allowed.
            unsafe {
                let px = _mm256_loadu2_m128(p.add(x1 + 3 * k), p.add(x0 + 3 * k));
                a = _mm256_add_ps(a, _mm256_mul_ps(_mm256_loadu_ps(wk.as_ptr()), px));
            }
        }
        // SAFETY: see above.
        unsafe { _mm256_storeu_ps(d.as_mut_ptr().cast::<f32>(), a) };
    }
    one_at_a_time::<K>(table, src, even, last);
}

/// `acc[i] = sum over k of weights[k] * row(k)[i]`, every `row(k)` at least `acc.len()` long.
#[inline(always)]
pub(super) fn vertical_row<'a>(weights: &[f32], row: impl Fn(usize) -> &'a [f32], acc: &mut [f32]) {
    match weights.len() {
        1 => vertical_taps::<1>(weights, row, acc),
        2 => vertical_taps::<2>(weights, row, acc),
        3 => vertical_taps::<3>(weights, row, acc),
        4 => vertical_taps::<4>(weights, row, acc),
        5 => vertical_taps::<5>(weights, row, acc),
        6 => vertical_taps::<6>(weights, row, acc),
        7 => vertical_taps::<7>(weights, row, acc),
        8 => vertical_taps::<8>(weights, row, acc),
        _ => {
            acc.fill(0.0);
            for (k, &wk) in weights.iter().enumerate() {
                for (a, p) in acc.iter_mut().zip(row(k)) {
                    *a += wk * p;
                }
            }
        }
    }
}

#[inline(always)]
fn vertical_taps<'a, const K: usize>(
    weights: &[f32],
    row: impl Fn(usize) -> &'a [f32],
    acc: &mut [f32],
) {
    let n = acc.len();
    let w: [f32; K] = weights.try_into().unwrap();
    let rows: [&[f32]; K] = std::array::from_fn(|k| &row(k)[..n]);
    for (i, a) in acc.iter_mut().enumerate() {
        let mut s = 0.0f32;
        for k in 0..K {
            s += w[k] * rows[k][i];
        }
        *a = s;
    }
}
