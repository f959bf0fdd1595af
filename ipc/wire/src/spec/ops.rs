//! The operations a view may add after its crop, and the batch-level mixes: torchvision's
//! transforms by name, with torchvision's parameters, ranges and defaults (docs/augment.md
//! lists each one and any difference).
//!
//! # Design
//! - Each [`Op`] runs on the view's 8-bit pixels after the crop, resize and flip, in the
//!   order listed, as torchvision runs them on a `uint8` tensor; [`Erasing`] runs on the
//!   converted (normalised) output, as torchvision's `RandomErasing` does after `Normalize`;
//!   a [`BatchMix`] runs on the whole batch once every sample is in it.
//! - Ranges are stored as torchvision stores them after checking its arguments (ColorJitter's
//!   `brightness=0.4` is the range `[0.6, 1.4]`): the client translating a transform does the
//!   scalar-to-range step, so the spec has one spelling for each draw.
//! - Random parameters are drawn per sample from the job's keyed generator (never a thread's
//!   state), so a sample's pixels are the same whatever the threads, backend or worker.

#![forbid(unsafe_code)]

use serde::{Deserialize, Serialize};

mod check;
pub(crate) use check::check_ops;
pub use check::OpError;

/// Most operations one view may list, those inside a [`Op::RandomApply`] included.
pub const MAX_OPS: usize = 64;
/// Deepest nesting of [`Op::RandomApply`].
pub const MAX_OP_DEPTH: usize = 4;
/// Most classes a [`BatchMix`] may spread labels over.
pub const MAX_CLASSES: u32 = 1 << 20;

/// How a geometric operation samples its source: torchvision's `InterpolationMode`, the two
/// modes its tensor kernels have.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Interpolation {
    /// The nearest source pixel (torchvision's default for its affine transforms).
    #[default]
    Nearest,
    /// Bilinear between the four nearest source pixels.
    Bilinear,
}

/// The sub-policies AutoAugment picks from: torchvision's `AutoAugmentPolicy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum AutoAugmentPolicy {
    /// The policy learnt on ImageNet (torchvision's default).
    #[default]
    Imagenet,
    /// The policy learnt on CIFAR-10.
    Cifar10,
    /// The policy learnt on SVHN.
    Svhn,
}

/// One per-sample operation on a view's 8-bit pixels (see the module docs). Every `p` is the
/// probability the operation is applied, 0..=1.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Op {
    /// `ColorJitter(brightness, contrast, saturation, hue)`: each factor drawn uniformly from
    /// its range, the four applied in a random order per sample; a factor left out is not
    /// drawn or applied.
    ColorJitter {
        /// Brightness factor range, non-negative.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        brightness: Option<[f32; 2]>,
        /// Contrast factor range, non-negative.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        contrast: Option<[f32; 2]>,
        /// Saturation factor range, non-negative.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        saturation: Option<[f32; 2]>,
        /// Hue shift range, within -0.5..=0.5.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        hue: Option<[f32; 2]>,
    },
    /// `RandomGrayscale(p)`; `Grayscale(3)` is `p = 1`. The output keeps three channels.
    RandomGrayscale {
        /// Probability.
        p: f32,
    },
    /// `GaussianBlur(kernel_size, sigma)`: sigma drawn uniformly from its range per sample.
    GaussianBlur {
        /// Kernel `(width, height)`, odd and positive, as torchvision orders it.
        kernel_size: [u32; 2],
        /// Range sigma is drawn from, positive; torchvision's default is `[0.1, 2.0]`.
        #[serde(default = "default_blur_sigma")]
        sigma: [f32; 2],
    },
    /// `RandomSolarize(threshold, p)`: pixels at or above `threshold` are inverted.
    RandomSolarize {
        /// Threshold in 0..=255.
        threshold: f32,
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomPosterize(bits, p)`: keep the `bits` high bits of each channel.
    RandomPosterize {
        /// Bits kept, 0..=8.
        bits: u8,
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomEqualize(p)`: per-channel histogram equalisation, Pillow's lookup table.
    RandomEqualize {
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomAutocontrast(p)`: per-channel stretch of min..max to 0..255.
    RandomAutocontrast {
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomAdjustSharpness(sharpness_factor, p)`.
    RandomAdjustSharpness {
        /// Sharpness factor, non-negative (0 blurs, 1 keeps, 2 sharpens).
        sharpness_factor: f32,
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomInvert(p)`.
    RandomInvert {
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomVerticalFlip(p)`.
    RandomVerticalFlip {
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `RandomAffine(degrees, translate, scale, shear, interpolation, fill, center)`.
    RandomAffine {
        /// Rotation range in degrees (`degrees=d` is `[-d, d]`).
        degrees: [f32; 2],
        /// Largest horizontal and vertical shift as fractions of the width and height.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        translate: Option<[f32; 2]>,
        /// Scale factor range, positive.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        scale: Option<[f32; 2]>,
        /// Shear ranges in degrees: x in `[0]..[1]`, y in `[2]..[3]` (torchvision's four-number
        /// form; a shear with only an x range has `[0, 0]` for y).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        shear: Option<[f32; 4]>,
        /// Sampling of the source.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB value (0..=255) of pixels from outside the image.
        #[serde(default)]
        fill: [f32; 3],
        /// Centre of the rotation in pixels; the image's centre when left out.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        center: Option<[f32; 2]>,
    },
    /// `RandomRotation(degrees, interpolation, expand=False, center, fill)`.
    RandomRotation {
        /// Angle range in degrees (`degrees=d` is `[-d, d]`).
        degrees: [f32; 2],
        /// Sampling of the source.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB value (0..=255) of pixels from outside the image.
        #[serde(default)]
        fill: [f32; 3],
        /// Centre of the rotation in pixels; the image's centre when left out.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        center: Option<[f32; 2]>,
    },
    /// `RandomApply(transforms, p)`: all of `ops` in order, or none of them.
    RandomApply {
        /// The operations.
        ops: Vec<Op>,
        /// Probability (torchvision's default 0.5).
        #[serde(default = "half")]
        p: f32,
    },
    /// `TrivialAugmentWide(num_magnitude_bins, interpolation, fill)`.
    TrivialAugmentWide {
        /// Magnitude bins (torchvision's default 31).
        #[serde(default = "default_bins")]
        num_magnitude_bins: u32,
        /// Sampling of the geometric operations.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB value (0..=255) of pixels from outside the image.
        #[serde(default)]
        fill: [f32; 3],
    },
    /// `RandAugment(num_ops, magnitude, num_magnitude_bins, interpolation, fill)`.
    RandAugment {
        /// Operations applied one after the other (torchvision's default 2).
        #[serde(default = "default_num_ops")]
        num_ops: u32,
        /// Magnitude bin, below `num_magnitude_bins` (torchvision's default 9).
        #[serde(default = "default_magnitude")]
        magnitude: u32,
        /// Magnitude bins (torchvision's default 31).
        #[serde(default = "default_bins")]
        num_magnitude_bins: u32,
        /// Sampling of the geometric operations.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB value (0..=255) of pixels from outside the image.
        #[serde(default)]
        fill: [f32; 3],
    },
    /// `AutoAugment(policy, interpolation, fill)`.
    AutoAugment {
        /// The learnt policy.
        #[serde(default)]
        policy: AutoAugmentPolicy,
        /// Sampling of the geometric operations.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB value (0..=255) of pixels from outside the image.
        #[serde(default)]
        fill: [f32; 3],
    },
}

impl Op {
    /// The operation's name in messages: torchvision's class name.
    pub fn name(&self) -> &'static str {
        match self {
            Op::ColorJitter { .. } => "ColorJitter",
            Op::RandomGrayscale { .. } => "RandomGrayscale",
            Op::GaussianBlur { .. } => "GaussianBlur",
            Op::RandomSolarize { .. } => "RandomSolarize",
            Op::RandomPosterize { .. } => "RandomPosterize",
            Op::RandomEqualize { .. } => "RandomEqualize",
            Op::RandomAutocontrast { .. } => "RandomAutocontrast",
            Op::RandomAdjustSharpness { .. } => "RandomAdjustSharpness",
            Op::RandomInvert { .. } => "RandomInvert",
            Op::RandomVerticalFlip { .. } => "RandomVerticalFlip",
            Op::RandomAffine { .. } => "RandomAffine",
            Op::RandomRotation { .. } => "RandomRotation",
            Op::RandomApply { .. } => "RandomApply",
            Op::TrivialAugmentWide { .. } => "TrivialAugmentWide",
            Op::RandAugment { .. } => "RandAugment",
            Op::AutoAugment { .. } => "AutoAugment",
        }
    }
}

/// What [`Erasing`] writes into its box.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ErasingValue {
    /// One value per channel, in the output's units (after normalisation for float outputs).
    Fill([f32; 3]),
    /// `value="random"`: each element drawn from the standard normal distribution.
    Random(RandomWord),
}

/// The word `"random"`, the only string [`ErasingValue`] takes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RandomWord {
    /// `"random"`.
    Random,
}

/// `RandomErasing(p, scale, ratio, value)` on a view's converted output.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Erasing {
    /// Probability (torchvision's default 0.5).
    #[serde(default = "half")]
    pub p: f32,
    /// Range of the erased area as a fraction of the image's (default `[0.02, 0.33]`).
    #[serde(default = "default_erasing_scale")]
    pub scale: [f32; 2],
    /// Range of the erased box's aspect ratio (default `[0.3, 3.3]`).
    #[serde(default = "default_erasing_ratio")]
    pub ratio: [f32; 2],
    /// What is written (default 0).
    #[serde(default = "default_erasing_value")]
    pub value: ErasingValue,
}

/// A batch-level mix: torchvision.transforms.v2's `MixUp` and `CutMix`, or a random choice
/// between them. With one, the batch's labels come as soft labels (`batch x num_classes`
/// floats) beside the images.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum BatchMix {
    /// `MixUp(alpha, num_classes)`.
    MixUp {
        /// Beta distribution parameter (torchvision's default 1.0).
        #[serde(default = "one")]
        alpha: f32,
        /// Classes of the soft labels.
        num_classes: u32,
    },
    /// `CutMix(alpha, num_classes)`.
    CutMix {
        /// Beta distribution parameter (torchvision's default 1.0).
        #[serde(default = "one")]
        alpha: f32,
        /// Classes of the soft labels.
        num_classes: u32,
    },
    /// `RandomChoice([...], p)`: one of `mixes` per batch.
    Choice {
        /// The mixes to pick from: MixUp and CutMix only, each with the same `num_classes`.
        mixes: Vec<BatchMix>,
        /// Their probabilities (equal when left out); they need not sum to 1.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        p: Option<Vec<f32>>,
    },
}

impl BatchMix {
    /// The classes of the soft labels (the first mix's for a choice).
    pub fn num_classes(&self) -> u32 {
        match self {
            BatchMix::MixUp { num_classes, .. } | BatchMix::CutMix { num_classes, .. } => {
                *num_classes
            }
            BatchMix::Choice { mixes, .. } => mixes.first().map_or(0, BatchMix::num_classes),
        }
    }
}

fn half() -> f32 {
    0.5
}
fn one() -> f32 {
    1.0
}
fn default_blur_sigma() -> [f32; 2] {
    [0.1, 2.0]
}
fn default_bins() -> u32 {
    31
}
fn default_num_ops() -> u32 {
    2
}
fn default_magnitude() -> u32 {
    9
}
fn default_erasing_scale() -> [f32; 2] {
    [0.02, 0.33]
}
fn default_erasing_ratio() -> [f32; 2] {
    [0.3, 3.3]
}
fn default_erasing_value() -> ErasingValue {
    ErasingValue::Fill([0.0; 3])
}

#[cfg(test)]
mod tests {
    use crate::spec::{PipelineSpec, SpecError, View};

    fn with(json: &str) -> Result<PipelineSpec, String> {
        let text = format!(
            r#"{{"batch_size": 4, "crop": {{"kind": "random_resized", "size": [32, 32], "scale": [0.08, 1], "ratio": [0.75, 1.33]}}, {json}}}"#
        );
        let spec: PipelineSpec = serde_json::from_str(&text).map_err(|e| e.to_string())?;
        spec.validate().map_err(|e| e.to_string())?;
        Ok(spec)
    }

    #[test]
    fn operations_take_torchvision_defaults_and_round_trip() {
        let spec = with(
            r#""ops": [{"kind": "color_jitter", "brightness": [0.6, 1.4], "hue": [-0.1, 0.1]},
                       {"kind": "random_apply", "p": 0.8, "ops": [{"kind": "random_grayscale", "p": 1}]},
                       {"kind": "trivial_augment_wide"}, {"kind": "rand_augment"},
                       {"kind": "auto_augment"}, {"kind": "random_solarize", "threshold": 128}],
               "erasing": {"p": 0.25, "value": "random"},
               "batch_mix": {"kind": "choice", "mixes": [{"kind": "mix_up", "num_classes": 10},
                                                        {"kind": "cut_mix", "num_classes": 10}]}"#,
        )
        .unwrap();
        assert_eq!(spec.ops.len(), 6);
        assert_eq!(
            spec.ops[2],
            super::Op::TrivialAugmentWide {
                num_magnitude_bins: 31,
                interpolation: super::Interpolation::Nearest,
                fill: [0.0; 3]
            }
        );
        assert_eq!(spec.soft_labels(), Some(10));
        let text = serde_json::to_string(&spec).unwrap();
        assert_eq!(serde_json::from_str::<PipelineSpec>(&text).unwrap(), spec);
        let plain = PipelineSpec {
            ops: Vec::new(),
            ..spec.clone()
        };
        assert_eq!(plain.first_difference(&spec), Some("ops"));
        let text = serde_json::to_string(&PipelineSpec::train(4, 32)).unwrap();
        assert!(!text.contains("ops") && !text.contains("erasing") && !text.contains("mix"));
    }

    #[test]
    fn a_bad_operation_is_named_with_its_place_and_field() {
        let err = with(r#""ops": [{"kind": "random_invert"}, {"kind": "random_apply", "ops": [{"kind": "gaussian_blur", "kernel_size": [4, 3]}]}]"#).unwrap_err();
        assert!(
            err.contains("ops[1].ops[0] (GaussianBlur): kernel_size"),
            "{err}"
        );
        let err = with(r#""ops": [{"kind": "color_jitter", "hue": [-0.6, 0.1]}]"#).unwrap_err();
        assert!(err.contains("ops[0] (ColorJitter): hue"), "{err}");
        let err = with(r#""ops": [{"kind": "rand_augment", "magnitude": 31}]"#).unwrap_err();
        assert!(err.contains("magnitude must be below"), "{err}");
        let err = with(r#""ops": [{"kind": "elastic_transform"}]"#).unwrap_err();
        assert!(err.contains("elastic_transform"), "{err}");
        let err = with(r#""erasing": {"scale": [0.5, 0.2]}"#).unwrap_err();
        assert!(err.contains("erasing (RandomErasing): scale"), "{err}");
        let err = with(r#""dtype": "u8", "batch_mix": {"kind": "mix_up", "num_classes": 3}"#)
            .unwrap_err();
        assert!(err.contains("batch_mix needs a float dtype"), "{err}");
        let err = with(r#""batch_mix": {"kind": "choice", "mixes": [{"kind": "mix_up", "num_classes": 3}, {"kind": "cut_mix", "num_classes": 4}]}"#).unwrap_err();
        assert!(err.contains("same num_classes"), "{err}");
        let deep = (0..5).fold(r#"{"kind": "random_invert"}"#.to_string(), |inner, _| {
            format!(r#"{{"kind": "random_apply", "ops": [{inner}]}}"#)
        });
        let err = with(&format!(r#""ops": [{deep}]"#)).unwrap_err();
        assert!(err.contains("nest at most"), "{err}");
        let mut spec = PipelineSpec::train(4, 32);
        let mut view = View::new(spec.crop, 0.5);
        view.ops = vec![super::Op::RandomPosterize { bits: 9, p: 0.5 }];
        spec.extra_views.push(view);
        let err = spec.validate().unwrap_err();
        assert!(matches!(err, SpecError::View { index: 0, .. }), "{err}");
        assert!(
            err.to_string()
                .contains("extra_views[0]: ops[0] (RandomPosterize): bits"),
            "{err}"
        );
    }
}
