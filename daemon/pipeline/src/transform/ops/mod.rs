//! The operations a view adds after its crop (the spec's `ops`): torchvision's transforms on
//! 8-bit RGB, drawn per sample and applied in order; and `RandomErasing` on the converted
//! output (`erase`). docs/augment.md lists each with its torchvision equivalent.
//!
//! # Design
//! - Two layers. [`draw_steps`] turns a view's operations into the [`Step`]s of one sample:
//!   every random choice made (which operations apply, their factors, the policies' picks),
//!   drawn from the sample's keyed generator (`Stream::Ops`, keyed by the view's seed, the
//!   epoch and the sample index), so the steps are a pure function of those and of the image
//!   size. [`apply_step`] applies one step with its explicit parameters: the arithmetic of
//!   torchvision.transforms.v2.functional's `uint8` kernel (`colour`, `geometry`).
//! - The policies (`policy`) carry torchvision's operation lists and magnitude tables, computed
//!   in f32 as `torch.linspace` computes them.
//! - [`OpScratch`] is one per thread: the buffers the operations need, reused between images.
//! - A view with operations is first cropped, resized and flipped to 8-bit pixels (rounded, as
//!   torchvision's uint8 resize gives them), then operated on, then normalised and converted
//!   into its slot ([`convert_into`]); a view without keeps the fused path unchanged.

use serde::{Deserialize, Serialize};
use stoker_kernels::image::RgbImage;
use stoker_wire::spec::Interpolation;

mod colour;
mod convert;
mod draw;
mod erase;
mod geometry;
mod lower;
mod policy;
#[cfg(test)]
mod timing;

pub use convert::convert_into;
pub use draw::draw_steps;
pub use erase::{draw_erasing, erase_into, random_erasing_values, ErasingBox};
pub use geometry::Affine;
pub use lower::lower;

/// One operation with explicit parameters, as torchvision.transforms.v2.functional takes them
/// (see each function's torchvision namesake).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum Step {
    /// `adjust_brightness(factor)`.
    Brightness {
        /// Non-negative factor.
        factor: f32,
    },
    /// `adjust_contrast(factor)`.
    Contrast {
        /// Non-negative factor.
        factor: f32,
    },
    /// `adjust_saturation(factor)`.
    Saturation {
        /// Non-negative factor.
        factor: f32,
    },
    /// `adjust_hue(factor)`.
    Hue {
        /// Fraction of a turn, -0.5..=0.5.
        factor: f32,
    },
    /// `adjust_sharpness(factor)`.
    Sharpness {
        /// Non-negative factor.
        factor: f32,
    },
    /// `rgb_to_grayscale(num_output_channels=3)`.
    Grayscale,
    /// `gaussian_blur(kernel_size, sigma)`.
    GaussianBlur {
        /// `[width, height]` taps, odd.
        kernel_size: [u32; 2],
        /// `[x, y]` sigma, positive.
        sigma: [f32; 2],
    },
    /// `solarize(threshold)`.
    Solarize {
        /// 0..=255.
        threshold: f32,
    },
    /// `posterize(bits)`.
    Posterize {
        /// 0..=8.
        bits: u8,
    },
    /// `equalize`.
    Equalize,
    /// `autocontrast`.
    Autocontrast,
    /// `invert`.
    Invert,
    /// `vertical_flip`.
    VerticalFlip,
    /// `affine(angle, translate, scale, shear, interpolation, fill, center)`.
    Affine(Affine),
    /// `rotate(angle, interpolation, expand=False, center, fill)`.
    Rotate {
        /// Degrees, counter-clockwise.
        angle: f64,
        /// Sampling.
        #[serde(default)]
        interpolation: Interpolation,
        /// RGB 0..=255 of pixels from outside.
        #[serde(default)]
        fill: [f32; 3],
        /// Centre in pixels; the image's centre when `None`.
        #[serde(default)]
        center: Option<[f64; 2]>,
    },
}

/// Why a step cannot be applied (from `stoker ops apply`; drawn steps are always valid).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("{step}: {reason}")]
pub struct StepError {
    /// The step's kind.
    pub step: &'static str,
    /// What is wrong, with the value.
    pub reason: String,
}

impl Step {
    /// The step's kind as spelled in its JSON.
    pub fn kind(&self) -> &'static str {
        match self {
            Step::Brightness { .. } => "brightness",
            Step::Contrast { .. } => "contrast",
            Step::Saturation { .. } => "saturation",
            Step::Hue { .. } => "hue",
            Step::Sharpness { .. } => "sharpness",
            Step::Grayscale => "grayscale",
            Step::GaussianBlur { .. } => "gaussian_blur",
            Step::Solarize { .. } => "solarize",
            Step::Posterize { .. } => "posterize",
            Step::Equalize => "equalize",
            Step::Autocontrast => "autocontrast",
            Step::Invert => "invert",
            Step::VerticalFlip => "vertical_flip",
            Step::Affine { .. } => "affine",
            Step::Rotate { .. } => "rotate",
        }
    }

    /// Checks the parameters torchvision's functional would refuse.
    pub fn check(&self) -> Result<(), StepError> {
        let refuse = |reason: String| {
            Err(StepError {
                step: self.kind(),
                reason,
            })
        };
        match *self {
            Step::Brightness { factor }
            | Step::Contrast { factor }
            | Step::Saturation { factor }
            | Step::Sharpness { factor }
                if !(factor.is_finite() && factor >= 0.0) =>
            {
                refuse(format!("factor must be finite and non-negative, got {factor}"))
            }
            Step::Hue { factor } if !(-0.5..=0.5).contains(&factor) => {
                refuse(format!("factor must be within -0.5..=0.5, got {factor}"))
            }
            Step::GaussianBlur { kernel_size, sigma }
                if kernel_size.iter().any(|&k| k % 2 == 0 || k > 255)
                    || !sigma.iter().all(|s| s.is_finite() && *s > 0.0) =>
            {
                refuse(format!("kernel_size must be odd (at most 255) and sigma positive, got {kernel_size:?} and {sigma:?}"))
            }
            Step::Solarize { threshold } if !(0.0..=255.0).contains(&threshold) => {
                refuse(format!("threshold must be within 0..=255, got {threshold}"))
            }
            Step::Posterize { bits } if bits > 8 => {
                refuse(format!("bits must be 0..=8, got {bits}"))
            }
            Step::Affine(Affine {
                angle,
                translate,
                scale,
                shear,
                ..
            }) if !(angle.is_finite()
                && translate.iter().chain(&shear).all(|v| v.is_finite())
                && scale.is_finite()
                && scale > 0.0) =>
            {
                refuse("angle, translate and shear must be finite and scale positive".to_string())
            }
            Step::Rotate { angle, .. } if !angle.is_finite() => {
                refuse(format!("angle must be finite, got {angle}"))
            }
            _ => Ok(()),
        }
    }
}

/// One thread's buffers for the operations, reused between images.
#[derive(Debug, Default)]
pub struct OpScratch {
    bytes: Vec<u8>,
    floats: Vec<f32>,
    /// The steps of the sample at hand.
    pub(crate) steps: Vec<Step>,
}

impl OpScratch {
    /// Empty buffers (they grow on first use).
    pub fn new() -> OpScratch {
        OpScratch::default()
    }
}

/// Applies one step to `img` (see [`Step`]); `scratch` lends the buffers.
pub fn apply_step(step: &Step, img: &mut RgbImage, scratch: &mut OpScratch) {
    match *step {
        Step::Brightness { factor } => colour::brightness(img, factor),
        Step::Contrast { factor } => colour::contrast(img, factor),
        Step::Saturation { factor } => colour::saturation(img, factor),
        Step::Hue { factor } => colour::hue(img, factor),
        Step::Sharpness { factor } => colour::sharpness(img, factor, &mut scratch.bytes),
        Step::Grayscale => colour::grayscale(img),
        Step::GaussianBlur { kernel_size, sigma } => {
            colour::gaussian_blur(img, kernel_size, sigma, &mut scratch.floats);
        }
        Step::Solarize { threshold } => colour::solarize(img, threshold),
        Step::Posterize { bits } => colour::posterize(img, bits),
        Step::Equalize => colour::equalize(img),
        Step::Autocontrast => colour::autocontrast(img),
        Step::Invert => colour::invert(img),
        Step::VerticalFlip => geometry::vertical_flip(img),
        Step::Affine(a) => geometry::affine(img, &a, &mut scratch.bytes),
        Step::Rotate {
            angle,
            interpolation,
            fill,
            center,
        } => geometry::rotate(img, angle, interpolation, fill, center, &mut scratch.bytes),
    }
}

/// `torch.linspace(start, end, steps)` in f32, as torch computes it on the CPU: the first half
/// stepped up from `start`, the second half stepped down from `end`.
#[allow(clippy::cast_precision_loss)]
pub(crate) fn linspace(start: f32, end: f32, steps: usize) -> Vec<f32> {
    if steps == 1 {
        return vec![start];
    }
    let step = (end - start) / (steps - 1) as f32;
    let half = steps / 2;
    (0..steps)
        .map(|i| {
            if i < half {
                start + step * i as f32
            } else {
                end - step * (steps - 1 - i) as f32
            }
        })
        .collect()
}
