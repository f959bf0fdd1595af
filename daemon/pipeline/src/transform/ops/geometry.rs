//! The geometric operations on 8-bit RGB: torchvision.transforms.v2.functional's `affine`,
//! `rotate` (without `expand`) and `vertical_flip` for `uint8` tensors.
//!
//! # Design
//! - The matrix is torchvision's `_get_inverse_affine_matrix` (output pixel to source pixel,
//!   about the centre), in f64. torchvision then builds a normalised grid and `grid_sample`
//!   (align_corners=False) undoes the normalisation; composed, the source position of output
//!   pixel `(x, y)` is `M · (x - (w-1)/2, y - (h-1)/2, 1) + (w-1)/2` (and likewise for y),
//!   which is what is computed here, directly.
//! - Sampling as `grid_sample` with zeros padding, with torchvision's fill: a ones channel is
//!   sampled beside the image; nearest puts the fill where it is below 0.5, bilinear computes
//!   `(value - fill) * mask + fill`. Then rounded half to even.
//! - `rotate` takes torchvision's exact paths: 0 and 180 degrees (any shape) and 90 and 270
//!   (square images) move pixels without sampling, when no centre is given.
//!
//! # Limitations
//! - torch computes the grid in f32; a source position within an f32 rounding of a pixel
//!   boundary (nearest) can then pick the neighbour pixel.

use serde::{Deserialize, Serialize};
use stoker_kernels::image::RgbImage;
use stoker_wire::spec::Interpolation;

use super::colour::round_even;

/// The parameters of one affine warp, as torchvision.transforms.v2.functional.affine takes
/// them: degrees, pixels, a factor, degrees ([`super::Step::Affine`]).
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Affine {
    /// Rotation, degrees (clockwise on screen, torchvision's `affine` sign).
    pub angle: f64,
    /// Shift in pixels.
    pub translate: [f64; 2],
    /// Scale factor.
    pub scale: f64,
    /// Shear, degrees, x then y.
    pub shear: [f64; 2],
    /// Sampling.
    #[serde(default)]
    pub interpolation: Interpolation,
    /// RGB 0..=255 of pixels from outside the image.
    #[serde(default)]
    pub fill: [f32; 3],
    /// Centre in pixels; the image's centre when `None`.
    #[serde(default)]
    pub center: Option<[f64; 2]>,
}

/// torchvision's `_get_inverse_affine_matrix(center, angle, translate, scale, shear)`, the
/// centre relative to the image's centre.
fn inverse_matrix(center: [f64; 2], a: &Affine) -> [f64; 6] {
    let rot = a.angle.to_radians();
    let sx = a.shear[0].to_radians();
    let sy = a.shear[1].to_radians();
    let [cx, cy] = center;
    let [tx, ty] = a.translate;
    let cos_sy = sy.cos();
    let tan_sx = sx.tan();
    let rot_minus_sy = rot - sy;
    let a0 = rot_minus_sy.cos() / cos_sy;
    let b0 = -(a0 * tan_sx + rot.sin());
    let c0 = rot_minus_sy.sin() / cos_sy;
    let d0 = rot.cos() - c0 * tan_sx;
    let s = a.scale;
    let mut m = [d0 / s, -b0 / s, 0.0, -c0 / s, a0 / s, 0.0];
    m[2] += cx - m[0] * (cx + tx) - m[1] * (cy + ty);
    m[5] += cy - m[3] * (cx + tx) - m[4] * (cy + ty);
    m
}

/// `affine(image, angle, translate, scale, shear, interpolation, fill, center)`; `out` is
/// scratch that ends up holding the source pixels (swapped).
pub(super) fn affine(img: &mut RgbImage, a: &Affine, out: &mut Vec<u8>) {
    let t = warp_coefficients(img.width, img.height, a);
    warp(img, t, a.interpolation, a.fill, out);
}

/// The grid coefficients `(ax, bx, cx, ay, by, cy)` of an affine warp of a `width` x `height`
/// image, in f32 as torch computes them: the inverse matrix over half the input size (the
/// GPU kernel takes them as they are).
#[allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]
pub(super) fn warp_coefficients(width: u32, height: u32, a: &Affine) -> [f32; 6] {
    let (w, h) = (f64::from(width), f64::from(height));
    let center = a
        .center
        .map_or([0.0, 0.0], |[cx, cy]| [cx - w * 0.5, cy - h * 0.5]);
    let m = inverse_matrix(center, a);
    // theta (f32), transposed and divided by half the input size.
    let t = m.map(|v| v as f32);
    let (half_w, half_h) = (0.5 * width as f32, 0.5 * height as f32);
    [
        t[0] / half_w,
        t[1] / half_w,
        t[2] / half_w,
        t[3] / half_h,
        t[4] / half_h,
        t[5] / half_h,
    ]
}

/// The quarter turns `rotate` takes without sampling (torchvision's exact paths), if any.
pub(super) fn quarter_turns(
    width: u32,
    height: u32,
    angle: f64,
    center: Option<[f64; 2]>,
) -> Option<u32> {
    let angle = angle.rem_euclid(360.0);
    if center.is_some() {
        return None;
    }
    let square = width == height;
    if angle == 0.0 {
        Some(0)
    } else if angle == 180.0 {
        Some(2)
    } else if angle == 90.0 && square {
        Some(1)
    } else if angle == 270.0 && square {
        Some(3)
    } else {
        None
    }
}

/// The affine `rotate` warps with when it takes no exact path: the angle negated
/// (counter-clockwise).
pub(super) fn rotation(
    angle: f64,
    interpolation: Interpolation,
    fill: [f32; 3],
    center: Option<[f64; 2]>,
) -> Affine {
    Affine {
        angle: -angle.rem_euclid(360.0),
        translate: [0.0, 0.0],
        scale: 1.0,
        shear: [0.0, 0.0],
        interpolation,
        fill,
        center,
    }
}

/// `rotate(image, angle, interpolation, expand=False, center, fill)`.
pub(super) fn rotate(
    img: &mut RgbImage,
    angle: f64,
    interpolation: Interpolation,
    fill: [f32; 3],
    center: Option<[f64; 2]>,
    out: &mut Vec<u8>,
) {
    if let Some(k) = quarter_turns(img.width, img.height, angle, center) {
        rot90(img, k, out);
        return;
    }
    affine(img, &rotation(angle, interpolation, fill, center), out);
}

/// `torch.rot90(image, k, dims=(-2, -1))` for `k` in 0..4 (k = 1, 3 on square images only).
fn rot90(img: &mut RgbImage, k: u32, out: &mut Vec<u8>) {
    let (w, h) = (img.width as usize, img.height as usize);
    if k == 0 {
        return;
    }
    out.clear();
    out.resize(img.data.len(), 0);
    for y in 0..h {
        for x in 0..w {
            let (sy, sx) = match k {
                1 => (x, w - 1 - y),
                2 => (h - 1 - y, w - 1 - x),
                _ => (h - 1 - x, y),
            };
            let s = (sy * w + sx) * 3;
            out[(y * w + x) * 3..][..3].copy_from_slice(&img.data[s..s + 3]);
        }
    }
    std::mem::swap(&mut img.data, out);
}

/// `vertical_flip(image)`.
pub(super) fn vertical_flip(img: &mut RgbImage) {
    let row = img.width as usize * 3;
    let h = img.height as usize;
    for y in 0..h / 2 {
        let (top, bottom) = img.data.split_at_mut((h - 1 - y) * row);
        top[y * row..][..row].swap_with_slice(&mut bottom[..row]);
    }
}

/// Samples every output pixel where torchvision's grid puts it: the base grid
/// (`torch.linspace(-(n-1)/2, (n-1)/2, n)` on each axis), times the matrix over half the size
/// ([`warp_coefficients`]),
/// `(x·a + y·b) + c`, then `grid_sample`'s `((g + 1)·size - 1) / 2`, all in f32 as torch
/// computes them (a source position exactly half way between two pixels, as a 30 degree
/// rotation makes, then goes the way torch's rounding sends it).
// Sides are at most 16384 pixels: the signed positions cannot wrap, and a position is only
// used as an index once checked to be inside the image.
#[allow(
    clippy::cast_possible_wrap,
    clippy::cast_sign_loss,
    clippy::cast_possible_truncation,
    clippy::cast_precision_loss
)]
fn warp(img: &mut RgbImage, t: [f32; 6], mode: Interpolation, fill: [f32; 3], out: &mut Vec<u8>) {
    let (w, h) = (img.width as usize, img.height as usize);
    out.clear();
    out.resize(img.data.len(), 0);
    let (wf, hf) = (w as f32, h as f32);
    let [ax, bx, cx, ay, by, cy] = t;
    let xs = super::linspace((1.0 - wf) * 0.5, (wf - 1.0) * 0.5, w);
    let ys = super::linspace((1.0 - hf) * 0.5, (hf - 1.0) * 0.5, h);
    let src = &img.data;
    let pixel = |x: i64, y: i64| -> Option<[f32; 3]> {
        if x < 0 || y < 0 || x >= w as i64 || y >= h as i64 {
            return None;
        }
        let i = (y as usize * w + x as usize) * 3;
        Some([src[i], src[i + 1], src[i + 2]].map(f32::from))
    };
    for (y, &yc) in ys.iter().enumerate() {
        for (x, &xc) in xs.iter().enumerate() {
            let gx = (xc * ax + yc * bx) + cx;
            let gy = (xc * ay + yc * by) + cy;
            let sx = ((gx + 1.0) * wf - 1.0) / 2.0;
            let sy = ((gy + 1.0) * hf - 1.0) / 2.0;
            let value = match mode {
                Interpolation::Nearest => {
                    let (nx, ny) = (sx.round_ties_even() as i64, sy.round_ties_even() as i64);
                    pixel(nx, ny).unwrap_or(fill)
                }
                Interpolation::Bilinear => {
                    let (x0, y0) = (sx.floor(), sy.floor());
                    let (fx, fy) = (sx - x0, sy - y0);
                    let (x0, y0) = (x0 as i64, y0 as i64);
                    let mut acc = [0.0f32; 3];
                    let mut mask = 0.0f32;
                    for (dx, dy, wgt) in [
                        (0, 0, (1.0 - fx) * (1.0 - fy)),
                        (1, 0, fx * (1.0 - fy)),
                        (0, 1, (1.0 - fx) * fy),
                        (1, 1, fx * fy),
                    ] {
                        if let Some(p) = pixel(x0 + dx, y0 + dy) {
                            mask += wgt;
                            for c in 0..3 {
                                acc[c] += p[c] * wgt;
                            }
                        }
                    }
                    [0, 1, 2].map(|c| (acc[c] - fill[c]) * mask + fill[c])
                }
            };
            for c in 0..3 {
                out[(y * w + x) * 3 + c] = round_even(value[c]);
            }
        }
    }
    std::mem::swap(&mut img.data, out);
}

#[cfg(test)]
mod tests {
    use super::*;

    fn numbered(w: u32, h: u32) -> RgbImage {
        RgbImage {
            width: w,
            height: h,
            data: (0..w * h * 3).map(|v| (v % 251) as u8).collect(),
        }
    }

    fn plain(angle: f64, translate: [f64; 2], interpolation: Interpolation) -> Affine {
        Affine {
            angle,
            translate,
            scale: 1.0,
            shear: [0.0, 0.0],
            interpolation,
            fill: [9.0, 8.0, 7.0],
            center: None,
        }
    }

    #[test]
    fn identity_and_whole_pixel_shifts_move_pixels_exactly() {
        let src = numbered(5, 4);
        for mode in [Interpolation::Nearest, Interpolation::Bilinear] {
            let mut img = src.clone();
            affine(&mut img, &plain(0.0, [0.0, 0.0], mode), &mut Vec::new());
            assert_eq!(img, src);
            let mut img = src.clone();
            affine(&mut img, &plain(0.0, [2.0, -1.0], mode), &mut Vec::new());
            assert_eq!(img.pixel(2, 0), src.pixel(0, 1));
            assert_eq!(img.pixel(4, 2), src.pixel(2, 3));
            assert_eq!(
                img.pixel(0, 0),
                [9, 8, 7],
                "shifted in from outside: the fill"
            );
            assert_eq!(img.pixel(3, 3), [9, 8, 7]);
        }
    }

    #[test]
    fn a_quarter_turn_by_warp_equals_the_exact_path() {
        let src = numbered(6, 6);
        let mut exact = src.clone();
        rotate(
            &mut exact,
            90.0,
            Interpolation::Nearest,
            [0.0; 3],
            None,
            &mut Vec::new(),
        );
        let mut warped = src.clone();
        affine(
            &mut warped,
            &plain(-90.0, [0.0, 0.0], Interpolation::Nearest),
            &mut Vec::new(),
        );
        assert_eq!(exact, warped);
        // Counter-clockwise: the top row's last pixel comes to the top-left corner.
        assert_eq!(exact.pixel(0, 0), src.pixel(5, 0));
        let mut half = src.clone();
        rotate(
            &mut half,
            -180.0,
            Interpolation::Bilinear,
            [0.0; 3],
            None,
            &mut Vec::new(),
        );
        assert_eq!(half.pixel(0, 0), src.pixel(5, 5));
    }

    #[test]
    fn vertical_flip_reverses_rows() {
        let src = numbered(3, 5);
        let mut img = src.clone();
        vertical_flip(&mut img);
        assert_eq!(img.pixel(1, 0), src.pixel(1, 4));
        assert_eq!(img.pixel(2, 2), src.pixel(2, 2));
        vertical_flip(&mut img);
        assert_eq!(img, src);
    }
}
