//! torchvision's automatic augmentation policies: the operation lists, magnitude tables and
//! AutoAugment's learnt sub-policies (torchvision.transforms.v2's `TrivialAugmentWide`,
//! `RandAugment`, `AutoAugment`), and how an operation at a magnitude becomes a [`Step`].

use stoker_wire::spec::{AutoAugmentPolicy, Interpolation};

use super::{linspace, Affine, Step};

/// One operation of the policies' augmentation spaces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Aug {
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
    Invert,
}

use Aug::*;

/// The augmentation space of TrivialAugmentWide and RandAugment, in torchvision's order (the
/// index drawn picks from it).
pub(super) const SPACE: [Aug; 14] = [
    Identity,
    ShearX,
    ShearY,
    TranslateX,
    TranslateY,
    Rotate,
    Brightness,
    Color,
    Contrast,
    Sharpness,
    Posterize,
    Solarize,
    AutoContrast,
    Equalize,
];

/// Which magnitude table a policy uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Table {
    /// TrivialAugmentWide's wide ranges.
    Wide,
    /// RandAugment's and AutoAugment's ranges.
    Standard,
}

/// Magnitude bin `bin` of `aug` in `table` with `bins` bins, for an image of `width` x
/// `height`, and whether its sign is drawn; `None` for an operation without magnitude.
#[allow(clippy::cast_precision_loss, clippy::cast_possible_truncation)]
pub(super) fn magnitude(
    aug: Aug,
    table: Table,
    bins: usize,
    bin: usize,
    width: u32,
    height: u32,
) -> Option<(f32, bool)> {
    let wide = table == Table::Wide;
    let ramp = |end: f32| linspace(0.0, end, bins)[bin];
    let m = match aug {
        Identity | AutoContrast | Equalize | Invert => return None,
        ShearX | ShearY => (ramp(if wide { 0.99 } else { 0.3 }), true),
        TranslateX if wide => (ramp(32.0), true),
        TranslateY if wide => (ramp(32.0), true),
        TranslateX => (ramp((150.0 / 331.0 * f64::from(width)) as f32), true),
        TranslateY => (ramp((150.0 / 331.0 * f64::from(height)) as f32), true),
        Rotate => (ramp(if wide { 135.0 } else { 30.0 }), true),
        Brightness | Color | Contrast | Sharpness => (ramp(if wide { 0.99 } else { 0.9 }), true),
        Posterize => {
            let per = ((bins - 1) as f64 / if wide { 6.0 } else { 4.0 }) as f32;
            ((8.0 - bin as f32 / per).round_ties_even(), false)
        }
        Solarize => (linspace(1.0, 0.0, bins)[bin], false),
    };
    Some(m)
}

/// The step torchvision's `_apply_image_or_video_transform` applies for `aug` at `magnitude`;
/// `None` for the identity.
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub(super) fn step(
    aug: Aug,
    magnitude: f32,
    interpolation: Interpolation,
    fill: [f32; 3],
) -> Option<Step> {
    let m = f64::from(magnitude);
    let affine = |translate: [f64; 2], shear: [f64; 2], center: Option<[f64; 2]>| {
        Step::Affine(Affine {
            angle: 0.0,
            translate,
            scale: 1.0,
            shear,
            interpolation,
            fill,
            center,
        })
    };
    let shear = m.atan().to_degrees();
    Some(match aug {
        Identity => return None,
        ShearX => affine([0.0, 0.0], [shear, 0.0], Some([0.0, 0.0])),
        ShearY => affine([0.0, 0.0], [0.0, shear], Some([0.0, 0.0])),
        TranslateX => affine([m.trunc(), 0.0], [0.0, 0.0], None),
        TranslateY => affine([0.0, m.trunc()], [0.0, 0.0], None),
        Rotate => Step::Rotate {
            angle: m,
            interpolation,
            fill,
            center: None,
        },
        Brightness => Step::Brightness {
            factor: (1.0 + m) as f32,
        },
        Color => Step::Saturation {
            factor: (1.0 + m) as f32,
        },
        Contrast => Step::Contrast {
            factor: (1.0 + m) as f32,
        },
        Sharpness => Step::Sharpness {
            factor: (1.0 + m) as f32,
        },
        Posterize => Step::Posterize {
            bits: m.clamp(0.0, 8.0) as u8,
        },
        Solarize => Step::Solarize {
            threshold: (255.0 * m) as f32,
        },
        AutoContrast => Step::Autocontrast,
        Equalize => Step::Equalize,
        Invert => Step::Invert,
    })
}

/// One half of an AutoAugment sub-policy: the operation, its probability, its magnitude bin
/// (of 10).
pub(super) type Half = (Aug, f32, usize);

/// AutoAugment's 25 sub-policies of `policy`, torchvision's lists.
pub(super) fn sub_policies(policy: AutoAugmentPolicy) -> &'static [(Half, Half); 25] {
    match policy {
        AutoAugmentPolicy::Imagenet => &IMAGENET,
        AutoAugmentPolicy::Cifar10 => &CIFAR10,
        AutoAugmentPolicy::Svhn => &SVHN,
    }
}

/// A bin for operations without magnitude (never read).
const NONE: usize = 0;

#[rustfmt::skip]
static IMAGENET: [(Half, Half); 25] = [
    ((Posterize, 0.4, 8), (Rotate, 0.6, 9)),
    ((Solarize, 0.6, 5), (AutoContrast, 0.6, NONE)),
    ((Equalize, 0.8, NONE), (Equalize, 0.6, NONE)),
    ((Posterize, 0.6, 7), (Posterize, 0.6, 6)),
    ((Equalize, 0.4, NONE), (Solarize, 0.2, 4)),
    ((Equalize, 0.4, NONE), (Rotate, 0.8, 8)),
    ((Solarize, 0.6, 3), (Equalize, 0.6, NONE)),
    ((Posterize, 0.8, 5), (Equalize, 1.0, NONE)),
    ((Rotate, 0.2, 3), (Solarize, 0.6, 8)),
    ((Equalize, 0.6, NONE), (Posterize, 0.4, 6)),
    ((Rotate, 0.8, 8), (Color, 0.4, 0)),
    ((Rotate, 0.4, 9), (Equalize, 0.6, NONE)),
    ((Equalize, 0.0, NONE), (Equalize, 0.8, NONE)),
    ((Invert, 0.6, NONE), (Equalize, 1.0, NONE)),
    ((Color, 0.6, 4), (Contrast, 1.0, 8)),
    ((Rotate, 0.8, 8), (Color, 1.0, 2)),
    ((Color, 0.8, 8), (Solarize, 0.8, 7)),
    ((Sharpness, 0.4, 7), (Invert, 0.6, NONE)),
    ((ShearX, 0.6, 5), (Equalize, 1.0, NONE)),
    ((Color, 0.4, 0), (Equalize, 0.6, NONE)),
    ((Equalize, 0.4, NONE), (Solarize, 0.2, 4)),
    ((Solarize, 0.6, 5), (AutoContrast, 0.6, NONE)),
    ((Invert, 0.6, NONE), (Equalize, 1.0, NONE)),
    ((Color, 0.6, 4), (Contrast, 1.0, 8)),
    ((Equalize, 0.8, NONE), (Equalize, 0.6, NONE)),
];

#[rustfmt::skip]
static CIFAR10: [(Half, Half); 25] = [
    ((Invert, 0.1, NONE), (Contrast, 0.2, 6)),
    ((Rotate, 0.7, 2), (TranslateX, 0.3, 9)),
    ((Sharpness, 0.8, 1), (Sharpness, 0.9, 3)),
    ((ShearY, 0.5, 8), (TranslateY, 0.7, 9)),
    ((AutoContrast, 0.5, NONE), (Equalize, 0.9, NONE)),
    ((ShearY, 0.2, 7), (Posterize, 0.3, 7)),
    ((Color, 0.4, 3), (Brightness, 0.6, 7)),
    ((Sharpness, 0.3, 9), (Brightness, 0.7, 9)),
    ((Equalize, 0.6, NONE), (Equalize, 0.5, NONE)),
    ((Contrast, 0.6, 7), (Sharpness, 0.6, 5)),
    ((Color, 0.7, 7), (TranslateX, 0.5, 8)),
    ((Equalize, 0.3, NONE), (AutoContrast, 0.4, NONE)),
    ((TranslateY, 0.4, 3), (Sharpness, 0.2, 6)),
    ((Brightness, 0.9, 6), (Color, 0.2, 8)),
    ((Solarize, 0.5, 2), (Invert, 0.0, NONE)),
    ((Equalize, 0.2, NONE), (AutoContrast, 0.6, NONE)),
    ((Equalize, 0.2, NONE), (Equalize, 0.6, NONE)),
    ((Color, 0.9, 9), (Equalize, 0.6, NONE)),
    ((AutoContrast, 0.8, NONE), (Solarize, 0.2, 8)),
    ((Brightness, 0.1, 3), (Color, 0.7, 0)),
    ((Solarize, 0.4, 5), (AutoContrast, 0.9, NONE)),
    ((TranslateY, 0.9, 9), (TranslateY, 0.7, 9)),
    ((AutoContrast, 0.9, NONE), (Solarize, 0.8, 3)),
    ((Equalize, 0.8, NONE), (Invert, 0.1, NONE)),
    ((TranslateY, 0.7, 9), (AutoContrast, 0.9, NONE)),
];

#[rustfmt::skip]
static SVHN: [(Half, Half); 25] = [
    ((ShearX, 0.9, 4), (Invert, 0.2, NONE)),
    ((ShearY, 0.9, 8), (Invert, 0.7, NONE)),
    ((Equalize, 0.6, NONE), (Solarize, 0.6, 6)),
    ((Invert, 0.9, NONE), (Equalize, 0.6, NONE)),
    ((Equalize, 0.6, NONE), (Rotate, 0.9, 3)),
    ((ShearX, 0.9, 4), (AutoContrast, 0.8, NONE)),
    ((ShearY, 0.9, 8), (Invert, 0.4, NONE)),
    ((ShearY, 0.9, 5), (Solarize, 0.2, 6)),
    ((Invert, 0.9, NONE), (AutoContrast, 0.8, NONE)),
    ((Equalize, 0.6, NONE), (Rotate, 0.9, 3)),
    ((ShearX, 0.9, 4), (Solarize, 0.3, 3)),
    ((ShearY, 0.8, 8), (Invert, 0.7, NONE)),
    ((Equalize, 0.9, NONE), (TranslateY, 0.6, 6)),
    ((Invert, 0.9, NONE), (Equalize, 0.6, NONE)),
    ((Contrast, 0.3, 3), (Rotate, 0.8, 4)),
    ((Invert, 0.8, NONE), (TranslateY, 0.0, 2)),
    ((ShearY, 0.7, 6), (Solarize, 0.4, 8)),
    ((Invert, 0.6, NONE), (Rotate, 0.8, 4)),
    ((ShearY, 0.3, 7), (TranslateX, 0.9, 3)),
    ((ShearX, 0.1, 6), (Invert, 0.6, NONE)),
    ((Solarize, 0.7, 2), (TranslateY, 0.6, 7)),
    ((ShearY, 0.8, 4), (Invert, 0.8, NONE)),
    ((ShearX, 0.7, 9), (TranslateY, 0.8, 3)),
    ((ShearY, 0.8, 5), (AutoContrast, 0.7, NONE)),
    ((ShearX, 0.7, 2), (Invert, 0.1, NONE)),
];

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn magnitude_tables_are_torchvisions() {
        // TrivialAugmentWide, 31 bins: posterize 8 - bin / 5 rounded, rotate up to 135.
        assert_eq!(
            magnitude(Posterize, Table::Wide, 31, 0, 9, 9),
            Some((8.0, false))
        );
        assert_eq!(
            magnitude(Posterize, Table::Wide, 31, 30, 9, 9),
            Some((2.0, false))
        );
        assert_eq!(
            magnitude(Posterize, Table::Wide, 31, 12, 9, 9),
            Some((6.0, false))
        );
        assert_eq!(
            magnitude(Rotate, Table::Wide, 31, 30, 9, 9),
            Some((135.0, true))
        );
        assert_eq!(
            magnitude(Solarize, Table::Wide, 31, 0, 9, 9),
            Some((1.0, false))
        );
        // RandAugment's default magnitude 9 of 31: rotate 9.0 degrees, posterize 7.
        assert_eq!(
            magnitude(Rotate, Table::Standard, 31, 9, 9, 9),
            Some((9.0, true))
        );
        assert_eq!(
            magnitude(Posterize, Table::Standard, 31, 9, 9, 9),
            Some((7.0, false))
        );
        let (tx, signed) = magnitude(TranslateX, Table::Standard, 10, 9, 331, 9).unwrap();
        assert!((tx - 150.0).abs() < 1e-4 && signed);
        assert_eq!(magnitude(Equalize, Table::Standard, 10, 3, 9, 9), None);
    }

    #[test]
    fn operations_become_torchvisions_calls() {
        let fill = [1.0, 2.0, 3.0];
        let near = Interpolation::Nearest;
        assert_eq!(step(Identity, 0.5, near, fill), None);
        assert_eq!(
            step(Color, -0.5, near, fill),
            Some(Step::Saturation { factor: 0.5 })
        );
        assert_eq!(
            step(TranslateX, -3.7, near, fill),
            Some(Step::Affine(Affine {
                angle: 0.0,
                translate: [-3.0, 0.0],
                scale: 1.0,
                shear: [0.0, 0.0],
                interpolation: near,
                fill,
                center: None
            }))
        );
        let Some(Step::Affine(Affine { shear, center, .. })) = step(ShearY, 1.0, near, fill) else {
            panic!("a shear is an affine");
        };
        assert!((shear[1] - 45.0).abs() < 1e-9 && center == Some([0.0, 0.0]));
        assert_eq!(
            step(Solarize, 0.5, near, fill),
            Some(Step::Solarize { threshold: 127.5 })
        );
    }
}
