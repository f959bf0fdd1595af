//! torchvision's `RandomErasing` on a view's converted output: the box drawn as
//! `RandomErasing.get_params` draws it, the value written in the output's dtype and layout.

use stoker_wire::spec::{Erasing, ErasingValue, PipelineSpec};

use super::convert::store;
use crate::transform::rng::KeyedRng;

/// The box one sample erases, in output pixels.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ErasingBox {
    /// First row.
    pub top: usize,
    /// First column.
    pub left: usize,
    /// Rows.
    pub height: usize,
    /// Columns.
    pub width: usize,
}

/// The box `erasing` draws for an output of `height` x `width`, or `None` when it does not
/// apply (`u >= p`) or ten tries found no box smaller than the image (torchvision then leaves
/// the image as it is).
#[allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_precision_loss
)]
pub fn draw_erasing(
    erasing: &Erasing,
    rng: &mut KeyedRng,
    height: u32,
    width: u32,
) -> Option<ErasingBox> {
    if rng.next_f64() >= f64::from(erasing.p) {
        return None;
    }
    let area = f64::from(height) * f64::from(width);
    let log_ratio = [
        f64::from(erasing.ratio[0]).ln(),
        f64::from(erasing.ratio[1]).ln(),
    ];
    for _ in 0..10 {
        let erase_area =
            area * rng.uniform(f64::from(erasing.scale[0]), f64::from(erasing.scale[1]));
        let aspect = rng.uniform(log_ratio[0], log_ratio[1]).exp();
        let h = (erase_area * aspect).sqrt().round_ties_even();
        let w = (erase_area / aspect).sqrt().round_ties_even();
        if !(h < f64::from(height) && w < f64::from(width)) {
            continue;
        }
        let (h, w) = (h as u64, w as u64);
        let top = rng.below(u64::from(height) - h + 1);
        let left = rng.below(u64::from(width) - w + 1);
        return Some(ErasingBox {
            top: top as usize,
            left: left as usize,
            height: h as usize,
            width: w as usize,
        });
    }
    None
}

/// Writes `value` over `area` of one output image (`out`, the spec's dtype and layout);
/// `"random"` draws each element from the standard normal distribution (Box-Muller on `rng`).
pub fn erase_into(
    area: ErasingBox,
    value: &ErasingValue,
    spec: &PipelineSpec,
    rng: &mut KeyedRng,
    out: &mut [u8],
) {
    for c in 0..3 {
        for y in area.top..area.top + area.height {
            for x in area.left..area.left + area.width {
                let v = match value {
                    ErasingValue::Fill(fill) => fill[c],
                    ErasingValue::Random(_) => normal(rng),
                };
                store(spec, out, c, y, x, v);
            }
        }
    }
}

/// Pushes the values `"random"` erasing writes over `area` onto `out`, drawn from `rng` as
/// [`erase_into`] draws them: channel by channel, row by row, one standard normal draw per
/// element (the GPU's erasing kernel reads them from its table).
pub fn random_erasing_values(area: ErasingBox, rng: &mut KeyedRng, out: &mut Vec<f32>) {
    let elements = 3 * area.height * area.width;
    out.extend((0..elements).map(|_| normal(rng)));
}

/// One standard normal draw (Box-Muller).
#[allow(clippy::cast_possible_truncation)]
fn normal(rng: &mut KeyedRng) -> f32 {
    let u1 = 1.0 - rng.next_f64(); // (0, 1]: the logarithm stays finite
    let u2 = rng.next_f64();
    ((-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()) as f32
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::rng::Stream;
    use stoker_wire::spec::RandomWord;

    fn erasing(p: f32) -> Erasing {
        Erasing {
            p,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Fill([0.0; 3]),
        }
    }

    #[test]
    fn boxes_fit_and_cover_torchvisions_area_range() {
        let mut applied = 0;
        for i in 0..2000 {
            let mut rng = KeyedRng::new(1, 0, i, Stream::Erasing);
            if let Some(b) = draw_erasing(&erasing(0.5), &mut rng, 32, 48) {
                applied += 1;
                assert!(b.top + b.height <= 32 && b.left + b.width <= 48, "{b:?}");
                let frac = (b.height * b.width) as f64 / (32.0 * 48.0);
                assert!(frac <= 0.36, "{frac}");
            }
        }
        assert!((900..1100).contains(&applied), "{applied}");
    }

    #[test]
    fn erasing_writes_the_value_in_the_box_only() {
        let spec = PipelineSpec::train(1, 4);
        let mut out = vec![0u8; spec.image_bytes()];
        let area = ErasingBox {
            top: 1,
            left: 2,
            height: 2,
            width: 1,
        };
        let mut rng = KeyedRng::new(1, 0, 0, Stream::Erasing);
        erase_into(
            area,
            &ErasingValue::Fill([1.0, 2.0, 3.0]),
            &spec,
            &mut rng,
            &mut out,
        );
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        assert_eq!(f[4 + 2], 1.0);
        assert_eq!(f[2 * 16 + 2 * 4 + 2], 3.0);
        assert_eq!(f.iter().filter(|v| **v != 0.0).count(), 6);
        let random = ErasingValue::Random(RandomWord::Random);
        let mut out = vec![0u8; spec.image_bytes()];
        let whole = ErasingBox {
            top: 0,
            left: 0,
            height: 4,
            width: 4,
        };
        erase_into(whole, &random, &spec, &mut rng, &mut out);
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        let mean = f.iter().sum::<f32>() / 48.0;
        assert!(
            mean.abs() < 0.6 && f.iter().all(|v| v.abs() < 6.0),
            "{mean}"
        );
    }

    /// The values `random_erasing_values` draws are those `erase_into` writes (NCHW f32 is
    /// channel by channel, row by row: the pool's order).
    #[test]
    fn random_values_are_the_ones_erase_into_writes() {
        let spec = PipelineSpec::train(1, 8);
        let area = ErasingBox {
            top: 1,
            left: 2,
            height: 3,
            width: 5,
        };
        let random = ErasingValue::Random(RandomWord::Random);
        let mut out = vec![0u8; spec.image_bytes()];
        erase_into(
            area,
            &random,
            &spec,
            &mut KeyedRng::new(4, 1, 9, Stream::Erasing),
            &mut out,
        );
        let mut pool = Vec::new();
        random_erasing_values(
            area,
            &mut KeyedRng::new(4, 1, 9, Stream::Erasing),
            &mut pool,
        );
        assert_eq!(pool.len(), 45);
        let f: Vec<f32> = out
            .chunks_exact(4)
            .map(|b| f32::from_ne_bytes(b.try_into().unwrap()))
            .collect();
        let mut at = 0;
        for c in 0..3 {
            for y in 1..4 {
                for x in 2..7 {
                    assert_eq!(f[(c * 8 + y) * 8 + x], pool[at], "c {c} y {y} x {x}");
                    at += 1;
                }
            }
        }
    }
}
