// Test code: its casts are of small counts chosen by the test.
#![allow(clippy::cast_possible_truncation)]

use super::*;

fn f32_bytes(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_ne_bytes()).collect()
}

fn f32s(b: &[u8]) -> Vec<f32> {
    b.chunks_exact(4).map(f32_of).collect()
}

fn mixup(lam: f64) -> MixDraw {
    MixDraw {
        kind: MixKind::MixUp,
        pick: 0,
        lam,
        label_lam: lam,
        cut: None,
    }
}

/// MixUp is the convex combination with the previous image (the last for the first),
/// computed by hand.
#[test]
fn mixup_blends_each_image_with_the_one_before() {
    let mut b = f32_bytes(&[1., 2., 3., 10., 20., 30., 100., 200., 300.]);
    let im = MixImages {
        n: 3,
        height: 1,
        width: 1,
        dtype: DType::F32,
        layout: Layout::Nchw,
    };
    mix_images(&mixup(0.25), &im, &mut b, &mut Vec::new());
    assert_eq!(
        f32s(&b),
        [75.25, 150.5, 225.75, 3.25, 6.5, 9.75, 32.5, 65., 97.5]
    );
}

/// Half precision rounds each product before the sum, as torch does on f16/bf16 tensors
/// (`roll.mul_(1 - lam).add_(x.mul(lam))` gives 2.798828125 and 2.796875 for these: checked
/// with torch 2 on the CPU), not the exact 2.8.
#[test]
fn half_precision_rounds_as_torch() {
    let d = mixup(0.1);
    let im = MixImages {
        n: 2,
        height: 1,
        width: 1,
        dtype: DType::F16,
        layout: Layout::Nhwc,
    };
    let h = |v: f32| half::f16::from_f32(v).to_ne_bytes();
    let mut b: Vec<u8> = [3.0, 3.0, 3.0, 1.0, 1.0, 1.0].map(h).concat();
    mix_images(&d, &im, &mut b, &mut Vec::new());
    let got = half::f16::from_ne_bytes([b[6], b[7]]).to_f32();
    assert_eq!(got, 2.798_828_1);
    let bf = |v: f32| half::bf16::from_f32(v).to_ne_bytes();
    let mut b: Vec<u8> = [3.0, 3.0, 3.0, 1.0, 1.0, 1.0].map(bf).concat();
    let im = MixImages {
        dtype: DType::Bf16,
        ..im
    };
    mix_images(&d, &im, &mut b, &mut Vec::new());
    assert_eq!(half::bf16::from_ne_bytes([b[6], b[7]]).to_f32(), 2.796_875);
}

/// CutMix's box by hand: lam 0.75 gives r = 0.25, half sizes 4 and 2 of a 16 x 8 image;
/// centred at (2, 7) it is clamped to columns 0..6 and rows 5..8, 18 of 128 pixels.
#[test]
fn cutmix_box_and_adjusted_lam_by_hand() {
    let (cut, lam) = cut_box(0.75, 2, 7, 8, 16);
    assert_eq!(
        cut,
        CutBox {
            x1: 0,
            y1: 5,
            x2: 6,
            y2: 8
        }
    );
    assert_eq!(lam, 1.0 - 18.0 / 128.0);
    // A lam of 1 is an empty box and leaves the labels alone.
    let (cut, lam) = cut_box(1.0, 3, 3, 8, 16);
    assert_eq!((cut.area(), lam), (0, 1.0));
}

/// Pasting, in both layouts: every pixel inside the box is the previous image's, every pixel
/// outside is the image's own (a reference written index by index).
#[test]
fn cutmix_pastes_the_rolled_batchs_box() {
    let (h, w, n) = (4usize, 5usize, 3usize);
    let cut = CutBox {
        x1: 1,
        y1: 2,
        x2: 4,
        y2: 4,
    };
    let d = MixDraw {
        kind: MixKind::CutMix,
        pick: 0,
        lam: 0.5,
        label_lam: 1.0 - 6.0 / 20.0,
        cut: Some(cut),
    };
    for layout in [Layout::Nchw, Layout::Nhwc] {
        let value =
            |i: usize, c: usize, y: usize, x: usize| (i * 1000 + c * 100 + y * 10 + x) as f32;
        let at = |c: usize, y: usize, x: usize| match layout {
            Layout::Nchw => (c * h + y) * w + x,
            Layout::Nhwc => (y * w + x) * 3 + c,
        };
        let mut v = vec![0f32; n * h * w * 3];
        for i in 0..n {
            for c in 0..3 {
                for y in 0..h {
                    for x in 0..w {
                        v[i * h * w * 3 + at(c, y, x)] = value(i, c, y, x);
                    }
                }
            }
        }
        let mut b = f32_bytes(&v);
        let im = MixImages {
            n,
            height: h,
            width: w,
            dtype: DType::F32,
            layout,
        };
        mix_images(&d, &im, &mut b, &mut Vec::new());
        let out = f32s(&b);
        for i in 0..n {
            for c in 0..3 {
                for y in 0..h {
                    for x in 0..w {
                        let inside = (1..4).contains(&x) && (2..4).contains(&y);
                        let from = if inside { (i + n - 1) % n } else { i };
                        let got = out[i * h * w * 3 + at(c, y, x)];
                        assert_eq!(got, value(from, c, y, x), "{layout:?} {i} {c} {y} {x}");
                    }
                }
            }
        }
    }
}

/// Soft labels by hand: the own label weighs lam, the previous one 1 - lam, and a pair of
/// equal labels sums both; rows past the batch are zero.
#[test]
fn soft_labels_mix_the_one_hot_rows() {
    let mut out = vec![9.0; 4 * 3];
    soft_labels(&mixup(0.25), &[0, 2, 2], 3, &mut out);
    assert_eq!(
        out,
        [0.25, 0., 0.75, 0.75, 0., 0.25, 0., 0., 1., 0., 0., 0.]
    );
}

fn mean_var(v: &[f64]) -> (f64, f64) {
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    (
        mean,
        v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n,
    )
}

/// With a fixed seed, lam over many batches has Beta(alpha, alpha)'s mean 1/2 and variance
/// 1 / (4 (2 alpha + 1)); alpha 1 is uniform.
#[test]
fn lam_follows_beta_alpha_alpha() {
    for alpha in [0.2f32, 1.0, 2.0] {
        let mix = BatchMix::MixUp {
            alpha,
            num_classes: 10,
        };
        let lams: Vec<f64> = (0..20_000).map(|b| draw(&mix, 5, 1, b, 8, 8).lam).collect();
        assert!(lams.iter().all(|l| (0.0..=1.0).contains(l)));
        let (mean, var) = mean_var(&lams);
        let want = 1.0 / (4.0 * (2.0 * f64::from(alpha) + 1.0));
        assert!((mean - 0.5).abs() < 0.01, "alpha {alpha}: mean {mean}");
        assert!(
            (var / want - 1.0).abs() < 0.05,
            "alpha {alpha}: var {var}, want {want}"
        );
        if alpha == 1.0 {
            let below = lams.iter().filter(|&&l| l < 0.25).count() as f64 / 20_000.0;
            assert!((below - 0.25).abs() < 0.015, "uniform: {below} below 0.25");
        }
    }
}

/// A choice picks each mix with its normalised weight, and its draws are those of the pick.
#[test]
fn choice_picks_with_p() {
    let mix = BatchMix::Choice {
        mixes: vec![
            BatchMix::MixUp {
                alpha: 0.8,
                num_classes: 10,
            },
            BatchMix::CutMix {
                alpha: 1.0,
                num_classes: 10,
            },
        ],
        p: Some(vec![1.0, 3.0]),
    };
    let draws: Vec<MixDraw> = (0..20_000).map(|b| draw(&mix, 9, 0, b, 8, 16)).collect();
    let mixups = draws.iter().filter(|d| d.kind == MixKind::MixUp).count() as f64;
    assert!((mixups / 20_000.0 - 0.25).abs() < 0.015, "{mixups} MixUps");
    for d in &draws {
        assert_eq!(d.pick, usize::from(d.kind == MixKind::CutMix));
        assert_eq!(d.cut.is_some(), d.kind == MixKind::CutMix);
        if d.kind == MixKind::MixUp {
            assert_eq!(d.label_lam, d.lam);
        }
    }
    // The same key draws the same; another batch draws another.
    assert_eq!(draw(&mix, 9, 0, 7, 8, 16), draws[7]);
    assert_ne!(draw(&mix, 9, 0, 8, 8, 16).lam, draws[7].lam);
}
