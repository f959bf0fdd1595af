//! A view's operations drawn into one sample's [`Step`]s: torchvision's `get_params` of each
//! transform, step for step, on the sample's keyed generator.
//!
//! Probabilities compare as torchvision does: a transform with `p` applies when `u < p`
//! (`torch.rand(1) >= p` skips it), an AutoAugment half when `u <= p`, a magnitude's sign
//! turns negative when `u <= 0.5`.

use stoker_wire::spec::{Interpolation, Op};

use super::policy::{self, Aug, Table, SPACE};
use super::{Affine, Step};
use crate::transform::rng::KeyedRng;

/// A uniform f32 in `[lo, hi)` (torch's `uniform_`), drawn in f64.
#[allow(clippy::cast_possible_truncation)]
fn uniform(rng: &mut KeyedRng, [lo, hi]: [f32; 2]) -> f32 {
    rng.uniform(f64::from(lo), f64::from(hi)) as f32
}

/// Whether a transform of probability `p` applies: `u < p`.
fn applies(rng: &mut KeyedRng, p: f32) -> bool {
    rng.next_f64() < f64::from(p)
}

/// Appends to `steps` what `ops` do to one sample of `width` x `height` pixels (geometric
/// operations keep the size), drawing every choice from `rng`.
pub fn draw_steps(ops: &[Op], rng: &mut KeyedRng, width: u32, height: u32, steps: &mut Vec<Step>) {
    for op in ops {
        draw_op(op, rng, width, height, steps);
    }
}

/// The step of an operation that applies with probability `p` and draws nothing else, or
/// `None` for the others.
fn gated(op: &Op) -> Option<(f32, Step)> {
    Some(match *op {
        Op::RandomGrayscale { p } => (p, Step::Grayscale),
        Op::RandomSolarize { threshold, p } => (p, Step::Solarize { threshold }),
        Op::RandomPosterize { bits, p } => (p, Step::Posterize { bits }),
        Op::RandomEqualize { p } => (p, Step::Equalize),
        Op::RandomAutocontrast { p } => (p, Step::Autocontrast),
        Op::RandomAdjustSharpness {
            sharpness_factor,
            p,
        } => (
            p,
            Step::Sharpness {
                factor: sharpness_factor,
            },
        ),
        Op::RandomInvert { p } => (p, Step::Invert),
        Op::RandomVerticalFlip { p } => (p, Step::VerticalFlip),
        _ => return None,
    })
}

#[allow(clippy::cast_possible_truncation)]
fn draw_op(op: &Op, rng: &mut KeyedRng, width: u32, height: u32, steps: &mut Vec<Step>) {
    if let Some((p, step)) = gated(op) {
        if applies(rng, p) {
            steps.push(step);
        }
        return;
    }
    match op {
        Op::ColorJitter {
            brightness,
            contrast,
            saturation,
            hue,
        } => {
            // torch.randperm(4), then each factor in its fixed order, then applied in the
            // permutation's order.
            let mut order = [0usize, 1, 2, 3];
            for i in (1..4).rev() {
                let j = rng.below(i as u64 + 1) as usize;
                order.swap(i, j);
            }
            let b = brightness.map(|r| Step::Brightness {
                factor: uniform(rng, r),
            });
            let c = contrast.map(|r| Step::Contrast {
                factor: uniform(rng, r),
            });
            let s = saturation.map(|r| Step::Saturation {
                factor: uniform(rng, r),
            });
            let h = hue.map(|r| Step::Hue {
                factor: uniform(rng, r),
            });
            let mut drawn = [b, c, s, h];
            for k in order {
                if let Some(step) = drawn[k].take() {
                    steps.push(step);
                }
            }
        }
        Op::GaussianBlur { kernel_size, sigma } => {
            let s = uniform(rng, *sigma);
            steps.push(Step::GaussianBlur {
                kernel_size: *kernel_size,
                sigma: [s, s],
            });
        }
        Op::RandomAffine { .. } => steps.push(draw_affine(op, rng, width, height)),
        Op::RandomRotation {
            degrees,
            interpolation,
            fill,
            center,
        } => {
            steps.push(Step::Rotate {
                angle: f64::from(uniform(rng, *degrees)),
                interpolation: *interpolation,
                fill: *fill,
                center: center.map(|[x, y]| [f64::from(x), f64::from(y)]),
            });
        }
        Op::RandomApply { ops, p } => {
            if applies(rng, *p) {
                draw_steps(ops, rng, width, height, steps);
            }
        }
        Op::TrivialAugmentWide { .. } | Op::RandAugment { .. } | Op::AutoAugment { .. } => {
            draw_policy(op, rng, width, height, steps);
        }
        gated => unreachable!("{} is drawn by `gated`", gated.name()),
    }
}

/// The steps of an automatic augmentation policy.
#[allow(clippy::cast_possible_truncation)]
fn draw_policy(op: &Op, rng: &mut KeyedRng, width: u32, height: u32, steps: &mut Vec<Step>) {
    match op {
        Op::TrivialAugmentWide {
            num_magnitude_bins,
            interpolation,
            fill,
        } => {
            let aug = SPACE[rng.below(SPACE.len() as u64) as usize];
            let bins = *num_magnitude_bins as usize;
            let picked = |rng: &mut KeyedRng| rng.below(bins as u64) as usize;
            let ctx = Ctx {
                table: Table::Wide,
                bins,
                width,
                height,
                interpolation: *interpolation,
                fill: *fill,
            };
            ctx.push(aug, rng, picked, steps);
        }
        Op::RandAugment {
            num_ops,
            magnitude,
            num_magnitude_bins,
            interpolation,
            fill,
        } => {
            let ctx = Ctx {
                table: Table::Standard,
                bins: *num_magnitude_bins as usize,
                width,
                height,
                interpolation: *interpolation,
                fill: *fill,
            };
            for _ in 0..*num_ops {
                let aug = SPACE[rng.below(SPACE.len() as u64) as usize];
                ctx.push(aug, rng, |_| *magnitude as usize, steps);
            }
        }
        Op::AutoAugment {
            policy,
            interpolation,
            fill,
        } => {
            let subs = policy::sub_policies(*policy);
            let (first, second) = subs[rng.below(subs.len() as u64) as usize];
            let ctx = Ctx {
                table: Table::Standard,
                bins: 10,
                width,
                height,
                interpolation: *interpolation,
                fill: *fill,
            };
            for (aug, p, bin) in [first, second] {
                if rng.next_f64() <= f64::from(p) {
                    ctx.push(aug, rng, |_| bin, steps);
                }
            }
        }
        other => unreachable!("{} is not a policy", other.name()),
    }
}

/// RandomAffine's step: torchvision's `RandomAffine.get_params` (angle, then the shift rounded
/// half to even, then scale, then the shears).
fn draw_affine(op: &Op, rng: &mut KeyedRng, width: u32, height: u32) -> Step {
    let Op::RandomAffine {
        degrees,
        translate,
        scale,
        shear,
        interpolation,
        fill,
        center,
    } = *op
    else {
        unreachable!("{} is not RandomAffine", op.name());
    };
    let angle = f64::from(uniform(rng, degrees));
    let translate = translate.map_or([0.0, 0.0], |[fx, fy]| {
        let max_dx = f64::from(fx) * f64::from(width);
        let max_dy = f64::from(fy) * f64::from(height);
        let tx = rng.uniform(-max_dx, max_dx).round_ties_even();
        let ty = rng.uniform(-max_dy, max_dy).round_ties_even();
        [tx, ty]
    });
    let scale = scale.map_or(1.0, |r| f64::from(uniform(rng, r)));
    let shear = shear.map_or([0.0, 0.0], |[a, b, c, d]| {
        let x = f64::from(uniform(rng, [a, b]));
        let y = f64::from(uniform(rng, [c, d]));
        [x, y]
    });
    Step::Affine(Affine {
        angle,
        translate,
        scale,
        shear,
        interpolation,
        fill,
        center: center.map(|[x, y]| [f64::from(x), f64::from(y)]),
    })
}

/// What a policy's operation needs besides the operation and its bin.
struct Ctx {
    table: Table,
    bins: usize,
    width: u32,
    height: u32,
    interpolation: Interpolation,
    fill: [f32; 3],
}

impl Ctx {
    /// Pushes `aug`'s step: its magnitude at the bin `bin` draws (drawn only for an
    /// operation with magnitudes, as torchvision draws it), its sign drawn if signed.
    fn push(
        &self,
        aug: Aug,
        rng: &mut KeyedRng,
        bin: impl FnOnce(&mut KeyedRng) -> usize,
        steps: &mut Vec<Step>,
    ) {
        let has_magnitude =
            policy::magnitude(aug, self.table, self.bins, 0, self.width, self.height).is_some();
        let value = if has_magnitude {
            let b = bin(rng);
            let (mut m, signed) =
                policy::magnitude(aug, self.table, self.bins, b, self.width, self.height)
                    .unwrap_or((0.0, false));
            if signed && rng.next_f64() <= 0.5 {
                m = -m;
            }
            m
        } else {
            0.0
        };
        if let Some(step) = policy::step(aug, value, self.interpolation, self.fill) {
            steps.push(step);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::rng::Stream;

    fn draw(ops: &[Op], index: u64) -> Vec<Step> {
        let mut rng = KeyedRng::new(7, 0, index, Stream::Ops);
        let mut steps = Vec::new();
        draw_steps(ops, &mut rng, 64, 48, &mut steps);
        steps
    }

    #[test]
    fn draws_are_a_function_of_the_key() {
        let ops = [
            Op::TrivialAugmentWide {
                num_magnitude_bins: 31,
                interpolation: Interpolation::Nearest,
                fill: [0.0; 3],
            },
            Op::ColorJitter {
                brightness: Some([0.6, 1.4]),
                contrast: None,
                saturation: Some([0.6, 1.4]),
                hue: Some([-0.1, 0.1]),
            },
        ];
        assert_eq!(draw(&ops, 3), draw(&ops, 3));
        let differ = (0..20)
            .filter(|&i| draw(&ops, i) != draw(&ops, i + 1))
            .count();
        assert!(differ >= 19);
    }

    #[test]
    fn probabilities_choose_as_torchvision_compares() {
        let never = [Op::RandomInvert { p: 0.0 }];
        let always = [Op::RandomInvert { p: 1.0 }];
        assert!((0..100).all(|i| draw(&never, i).is_empty()));
        assert!((0..100).all(|i| draw(&always, i) == [Step::Invert]));
        let half = [Op::RandomApply {
            ops: vec![Op::RandomGrayscale { p: 1.0 }, Op::RandomInvert { p: 1.0 }],
            p: 0.5,
        }];
        let applied = (0..2000).filter(|&i| !draw(&half, i).is_empty()).count();
        assert!((900..1100).contains(&applied), "{applied}");
        assert!((0..50).all(|i| [0, 2].contains(&draw(&half, i).len())));
    }

    #[test]
    fn color_jitter_draws_each_factor_in_its_range_in_a_random_order() {
        let op = [Op::ColorJitter {
            brightness: Some([0.5, 1.5]),
            contrast: Some([0.9, 1.1]),
            saturation: None,
            hue: Some([-0.2, 0.2]),
        }];
        let mut firsts = std::collections::BTreeSet::new();
        for i in 0..200 {
            let steps = draw(&op, i);
            assert_eq!(steps.len(), 3);
            firsts.insert(steps[0].kind());
            for s in steps {
                match s {
                    Step::Brightness { factor } => assert!((0.5..1.5).contains(&factor)),
                    Step::Contrast { factor } => assert!((0.9..1.1).contains(&factor)),
                    Step::Hue { factor } => assert!((-0.2..0.2).contains(&factor)),
                    other => panic!("{other:?}"),
                }
            }
        }
        assert_eq!(firsts.len(), 3, "each factor comes first sometimes");
    }
}
