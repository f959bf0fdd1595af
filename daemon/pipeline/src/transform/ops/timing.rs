//! Per-step cost on one thread: `cargo test --release -p stoker-pipeline --lib
//! transform::ops::timing -- --ignored --nocapture` (docs/augment.md, section 6).

use std::time::Instant;

use stoker_kernels::image::RgbImage;
use stoker_wire::spec::Interpolation;

use super::{apply_step, convert_into, Affine, OpScratch, Step};

#[test]
#[ignore = "a measurement, run by hand in release"]
fn timing() {
    let (w, h) = (224u32, 224u32);
    let data: Vec<u8> = (0..w * h * 3)
        .map(|i| ((i * 2_654_435_761u32) >> 24) as u8)
        .collect();
    let steps = [
        Step::Brightness { factor: 1.3 },
        Step::Contrast { factor: 0.7 },
        Step::Saturation { factor: 1.4 },
        Step::Hue { factor: 0.1 },
        Step::Sharpness { factor: 1.5 },
        Step::Grayscale,
        Step::GaussianBlur {
            kernel_size: [23, 23],
            sigma: [1.5, 1.5],
        },
        Step::GaussianBlur {
            kernel_size: [9, 9],
            sigma: [1.0, 1.0],
        },
        Step::Solarize { threshold: 128.0 },
        Step::Posterize { bits: 4 },
        Step::Equalize,
        Step::Autocontrast,
        Step::Affine(Affine {
            angle: 12.0,
            translate: [3.0, -2.0],
            scale: 1.0,
            shear: [5.0, 0.0],
            interpolation: Interpolation::Nearest,
            fill: [0.0; 3],
            center: None,
        }),
        Step::Affine(Affine {
            angle: 12.0,
            translate: [3.0, -2.0],
            scale: 1.0,
            shear: [5.0, 0.0],
            interpolation: Interpolation::Bilinear,
            fill: [0.0; 3],
            center: None,
        }),
    ];
    let mut scratch = OpScratch::new();
    for step in &steps {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let mut img = RgbImage {
                width: w,
                height: h,
                data: data.clone(),
            };
            let t0 = Instant::now();
            for _ in 0..20 {
                apply_step(step, &mut img, &mut scratch);
            }
            best = best.min(t0.elapsed().as_secs_f64() / 20.0);
        }
        println!("{:>14} {:8.1} us", step.kind(), best * 1e6);
    }
}

#[test]
#[ignore = "a measurement, run by hand in release"]
fn convert_timing() {
    let (w, h) = (176u32, 176u32);
    let img = RgbImage {
        width: w,
        height: h,
        data: (0..w * h * 3)
            .map(|i| ((i * 2_654_435_761u32) >> 24) as u8)
            .collect(),
    };
    let spec = stoker_wire::spec::PipelineSpec::train(1, 176);
    let mut out = vec![0u8; spec.image_bytes()];
    let mut best = f64::MAX;
    for _ in 0..5 {
        let t0 = Instant::now();
        for _ in 0..20 {
            convert_into(&img, &spec, &mut out);
        }
        best = best.min(t0.elapsed().as_secs_f64() / 20.0);
    }
    println!("convert 176x176 f32 nchw {:8.1} us", best * 1e6);
}
