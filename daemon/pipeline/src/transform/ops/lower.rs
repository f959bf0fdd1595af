//! A drawn [`Step`] lowered to the GPU kernels' parameters ([`OpStep`]): the same values the
//! CPU functions compute with (the blur's weights, the warp's grid coefficients, the
//! posterize mask, the exact rotations), computed once here by the CPU code's own functions,
//! so the GPU applies the CPU backend's draws with the CPU backend's constants.

use stoker_kernels::ops::{self as k, OpStep};
use stoker_wire::spec::Interpolation;

use super::{colour, geometry, Step};

/// The kernel parameters of `step` on a `width` x `height` image; a blur appends its weights
/// (across, then down) to `weights`.
pub fn lower(step: &Step, width: u32, height: u32, weights: &mut Vec<f32>) -> OpStep {
    let with = |kind: u32, f0: f32| {
        let mut s = OpStep {
            kind,
            ..OpStep::default()
        };
        s.f[0] = f0;
        s
    };
    match *step {
        Step::Brightness { factor } => with(k::OP_BRIGHTNESS, factor),
        Step::Contrast { factor } => with(k::OP_CONTRAST, factor),
        Step::Saturation { factor } => with(k::OP_SATURATION, factor),
        Step::Hue { factor } => with(k::OP_HUE, factor),
        Step::Sharpness { factor } => with(k::OP_SHARPNESS, factor),
        Step::Grayscale => with(k::OP_GRAYSCALE, 0.0),
        Step::Solarize { threshold } => with(k::OP_SOLARIZE, threshold),
        Step::Posterize { bits } => {
            let mut s = with(k::OP_POSTERIZE, 0.0);
            s.i[0] = if bits >= 8 {
                0xff
            } else {
                u32::from(!(0xffu8 >> bits))
            };
            s
        }
        Step::Equalize => with(k::OP_EQUALIZE, 0.0),
        Step::Autocontrast => with(k::OP_AUTOCONTRAST, 0.0),
        Step::Invert => with(k::OP_INVERT, 0.0),
        Step::VerticalFlip => with(k::OP_VFLIP, 0.0),
        Step::GaussianBlur { kernel_size, sigma } => {
            let mut s = with(k::OP_BLUR, 0.0);
            // The pool of one batch holds a few thousand weights at most (255 taps a side).
            #[allow(clippy::cast_possible_truncation)]
            let at = weights.len() as u32;
            weights.extend(colour::gaussian_kernel(kernel_size[0] as usize, sigma[0]));
            weights.extend(colour::gaussian_kernel(kernel_size[1] as usize, sigma[1]));
            s.i = [kernel_size[0], kernel_size[1], at];
            s
        }
        Step::Affine(a) => warp(width, height, &a),
        Step::Rotate {
            angle,
            interpolation,
            fill,
            center,
        } => match geometry::quarter_turns(width, height, angle, center) {
            Some(turns) => {
                let mut s = with(k::OP_ROT90, 0.0);
                s.i[0] = turns;
                s
            }
            None => warp(
                width,
                height,
                &geometry::rotation(angle, interpolation, fill, center),
            ),
        },
    }
}

fn warp(width: u32, height: u32, a: &geometry::Affine) -> OpStep {
    let mut s = OpStep {
        kind: k::OP_WARP,
        ..OpStep::default()
    };
    s.f[..6].copy_from_slice(&geometry::warp_coefficients(width, height, a));
    s.f[6..9].copy_from_slice(&a.fill);
    s.i[0] = u32::from(a.interpolation == Interpolation::Bilinear);
    s
}
