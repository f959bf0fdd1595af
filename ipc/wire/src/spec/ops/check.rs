//! What valid operations, erasings and batch mixes are ([`OpError`] says why one is not).

#![forbid(unsafe_code)]

use super::{BatchMix, Erasing, ErasingValue, Op, MAX_CLASSES, MAX_OPS, MAX_OP_DEPTH};

/// Why an operation, an erasing or a batch mix cannot be served: `at` names it
/// (`ops[2].ops[0]`, `erasing`, `batch_mix`), `what` is the operation, `reason` the field.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{at} ({what}): {reason}")]
pub struct OpError {
    /// Where in the spec (or view): `ops[2]`, `ops[2].ops[0]`, `erasing`, `batch_mix`.
    pub at: String,
    /// torchvision's name of the operation.
    pub what: &'static str,
    /// What is wrong, with the value given.
    pub reason: String,
}

/// A probability in 0..=1.
fn check_p(p: f32) -> Result<(), String> {
    match (0.0..=1.0).contains(&p) {
        true => Ok(()),
        false => Err(format!("p must be within 0..=1, got {p}")),
    }
}

/// A finite range `[lo, hi]` with `lo <= hi`, inside `min..=max`.
fn check_range(field: &str, r: [f32; 2], min: f32, max: f32) -> Result<(), String> {
    let [lo, hi] = r;
    if lo.is_finite() && hi.is_finite() && lo <= hi && lo >= min && hi <= max {
        Ok(())
    } else {
        Err(format!(
            "{field} must be a range [lo, hi] with {min} <= lo <= hi <= {max}, got [{lo}, {hi}]"
        ))
    }
}

fn check_fill(fill: [f32; 3]) -> Result<(), String> {
    match fill.iter().all(|v| (0.0..=255.0).contains(v)) {
        true => Ok(()),
        false => Err(format!(
            "fill must be RGB values within 0..=255, got {fill:?}"
        )),
    }
}

fn check_bins(bins: u32) -> Result<(), String> {
    match (2..=1024).contains(&bins) {
        true => Ok(()),
        false => Err(format!("num_magnitude_bins must be 2..=1024, got {bins}")),
    }
}

impl Op {
    /// Checks this operation and those inside it, `at` naming it in the error; `count` is the
    /// operations seen so far in the view (at most [`MAX_OPS`]), `depth` its nesting.
    pub(crate) fn check(&self, at: &str, depth: usize, count: &mut usize) -> Result<(), OpError> {
        *count += 1;
        let refuse = |reason: String| OpError {
            at: at.to_string(),
            what: self.name(),
            reason,
        };
        if *count > MAX_OPS {
            return Err(refuse(format!(
                "a view may list at most {MAX_OPS} operations, RandomApply's included"
            )));
        }
        self.check_fields().map_err(refuse)?;
        if let Op::RandomApply { ops, .. } = self {
            if depth >= MAX_OP_DEPTH {
                return Err(refuse(format!(
                    "RandomApply may nest at most {MAX_OP_DEPTH} deep"
                )));
            }
            for (i, op) in ops.iter().enumerate() {
                op.check(&format!("{at}.ops[{i}]"), depth + 1, count)?;
            }
        }
        Ok(())
    }

    /// This operation's own fields (not those of the operations inside it).
    fn check_fields(&self) -> Result<(), String> {
        const BIG: f32 = 1e6;
        match self {
            Op::ColorJitter {
                brightness,
                contrast,
                saturation,
                hue,
            } => {
                for (field, range) in [
                    ("brightness", brightness),
                    ("contrast", contrast),
                    ("saturation", saturation),
                ] {
                    if let Some(r) = range {
                        check_range(field, *r, 0.0, BIG)?;
                    }
                }
                match hue {
                    Some(r) => check_range("hue", *r, -0.5, 0.5),
                    None => Ok(()),
                }
            }
            Op::RandomGrayscale { p }
            | Op::RandomEqualize { p }
            | Op::RandomAutocontrast { p }
            | Op::RandomInvert { p }
            | Op::RandomVerticalFlip { p }
            | Op::RandomApply { p, .. } => check_p(*p),
            Op::GaussianBlur { kernel_size, sigma } => {
                if kernel_size.iter().any(|&k| k % 2 == 0 || k > 255) {
                    return Err(format!(
                        "kernel_size must be odd and positive (at most 255), got {kernel_size:?}"
                    ));
                }
                check_range("sigma", *sigma, f32::MIN_POSITIVE, BIG)
            }
            Op::RandomSolarize { threshold, p } => {
                if !(0.0..=255.0).contains(threshold) {
                    return Err(format!("threshold must be within 0..=255, got {threshold}"));
                }
                check_p(*p)
            }
            Op::RandomPosterize { bits, p } => {
                if *bits > 8 {
                    return Err(format!("bits must be 0..=8, got {bits}"));
                }
                check_p(*p)
            }
            Op::RandomAdjustSharpness {
                sharpness_factor,
                p,
            } => {
                if !(sharpness_factor.is_finite() && *sharpness_factor >= 0.0) {
                    return Err(format!(
                        "sharpness_factor must be finite and non-negative, got {sharpness_factor}"
                    ));
                }
                check_p(*p)
            }
            Op::RandomAffine { .. } | Op::RandomRotation { .. } => self.check_geometry(),
            Op::TrivialAugmentWide { .. } | Op::RandAugment { .. } | Op::AutoAugment { .. } => {
                self.check_policy()
            }
        }
    }

    /// The fields of RandomAffine and RandomRotation.
    fn check_geometry(&self) -> Result<(), String> {
        const BIG: f32 = 1e6;
        match self {
            Op::RandomAffine {
                degrees,
                translate,
                scale,
                shear,
                fill,
                center,
                ..
            } => {
                check_range("degrees", *degrees, -BIG, BIG)?;
                if let Some([tx, ty]) = translate {
                    if !((0.0..=1.0).contains(tx) && (0.0..=1.0).contains(ty)) {
                        return Err(format!(
                            "translate must be fractions within 0..=1, got [{tx}, {ty}]"
                        ));
                    }
                }
                if let Some(s) = scale {
                    check_range("scale", *s, f32::MIN_POSITIVE, BIG)?;
                }
                if let Some([a, b, c, d]) = shear {
                    check_range("shear (x)", [*a, *b], -BIG, BIG)?;
                    check_range("shear (y)", [*c, *d], -BIG, BIG)?;
                }
                check_center(*center)?;
                check_fill(*fill)
            }
            Op::RandomRotation {
                degrees,
                fill,
                center,
                ..
            } => {
                check_range("degrees", *degrees, -BIG, BIG)?;
                check_center(*center)?;
                check_fill(*fill)
            }
            _ => Ok(()),
        }
    }

    /// The fields of the automatic augmentation policies.
    fn check_policy(&self) -> Result<(), String> {
        match self {
            Op::TrivialAugmentWide {
                num_magnitude_bins,
                fill,
                ..
            } => {
                check_bins(*num_magnitude_bins)?;
                check_fill(*fill)
            }
            Op::RandAugment {
                num_ops,
                magnitude,
                num_magnitude_bins,
                fill,
                ..
            } => {
                check_bins(*num_magnitude_bins)?;
                if *num_ops > 16 {
                    return Err(format!("num_ops must be 0..=16, got {num_ops}"));
                }
                if magnitude >= num_magnitude_bins {
                    return Err(format!(
                        "magnitude must be below num_magnitude_bins ({num_magnitude_bins}), got {magnitude}"
                    ));
                }
                check_fill(*fill)
            }
            Op::AutoAugment { fill, .. } => check_fill(*fill),
            _ => Ok(()),
        }
    }
}

fn check_center(center: Option<[f32; 2]>) -> Result<(), String> {
    match center {
        Some(c) if !c.iter().all(|v| v.is_finite()) => Err(format!(
            "center must be finite pixel coordinates, got {c:?}"
        )),
        _ => Ok(()),
    }
}

/// Checks a view's list of operations (`ops[i]` in errors).
pub(crate) fn check_ops(ops: &[Op]) -> Result<(), OpError> {
    let mut count = 0;
    for (i, op) in ops.iter().enumerate() {
        op.check(&format!("ops[{i}]"), 0, &mut count)?;
    }
    Ok(())
}

impl Erasing {
    /// Checks the probability, the ranges and the value.
    pub(crate) fn check(&self) -> Result<(), OpError> {
        let refuse = |reason: String| OpError {
            at: "erasing".to_string(),
            what: "RandomErasing",
            reason,
        };
        check_p(self.p).map_err(refuse)?;
        check_range("scale", self.scale, 0.0, 1.0).map_err(refuse)?;
        check_range("ratio", self.ratio, f32::MIN_POSITIVE, 1e6).map_err(refuse)?;
        if let ErasingValue::Fill(v) = &self.value {
            if !v.iter().all(|x| x.is_finite()) {
                return Err(refuse(format!("value must be finite, got {v:?}")));
            }
        }
        Ok(())
    }
}

impl BatchMix {
    /// Checks alpha, the classes, and a choice's list and probabilities.
    pub(crate) fn check(&self) -> Result<(), OpError> {
        let what = match self {
            BatchMix::MixUp { .. } => "MixUp",
            BatchMix::CutMix { .. } => "CutMix",
            BatchMix::Choice { .. } => "RandomChoice",
        };
        let refuse = |reason: String| OpError {
            at: "batch_mix".to_string(),
            what,
            reason,
        };
        match self {
            BatchMix::MixUp { alpha, num_classes } | BatchMix::CutMix { alpha, num_classes } => {
                if !(alpha.is_finite() && *alpha > 0.0) {
                    return Err(refuse(format!("alpha must be positive, got {alpha}")));
                }
                if *num_classes == 0 || *num_classes > MAX_CLASSES {
                    return Err(refuse(format!(
                        "num_classes must be 1..={MAX_CLASSES}, got {num_classes}"
                    )));
                }
                Ok(())
            }
            BatchMix::Choice { mixes, p } => {
                if mixes.is_empty() || mixes.len() > 8 {
                    return Err(refuse(format!(
                        "a choice lists 1 to 8 mixes, got {}",
                        mixes.len()
                    )));
                }
                let classes = self.num_classes();
                for mix in mixes {
                    if matches!(mix, BatchMix::Choice { .. }) {
                        return Err(refuse("a choice lists MixUp and CutMix only".to_string()));
                    }
                    mix.check()?;
                    if mix.num_classes() != classes {
                        return Err(refuse(format!(
                            "every mix of a choice has the same num_classes, got {classes} and {}",
                            mix.num_classes()
                        )));
                    }
                }
                if let Some(p) = p {
                    let ok = p.len() == mixes.len()
                        && p.iter().all(|v| v.is_finite() && *v >= 0.0)
                        && p.iter().sum::<f32>() > 0.0;
                    if !ok {
                        return Err(refuse(format!(
                            "p must give one non-negative weight per mix, not all zero, got {p:?}"
                        )));
                    }
                }
                Ok(())
            }
        }
    }
}
