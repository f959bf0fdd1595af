//! The operations' kernels (`stoker_op_*` in kernels/cu/augment.cu) on the emulated GPU
//! against the CPU backend's functions (`transform::ops::apply_step`, `convert_into`,
//! `erase_into`): the same drawn step, lowered by `transform::ops::lower`, on the same 8-bit
//! image. Integer operations and pixel moves must be equal; the others at least 40 dB and no
//! value more than 1 apart (an f32 rounding near a tie; on the emulator they are equal too: the
//! same f32 operations, no contraction). Each comparison is also made against the CPU result of
//! a slightly wrong parameter, which must be told apart.

// Test code: casts of small sizes and pixel values the test chooses.
#![allow(clippy::cast_possible_truncation, clippy::cast_precision_loss)]

use stoker_kernels::augment::{dtype_code, layout_code, AugmentKernels};
use stoker_kernels::image::RgbImage;
use stoker_kernels::ops::{
    FinishBatch, OpStep, OpsBatch, OpsHead, PlainBytes, ERASE_FILL, ERASE_RANDOM, OP_STATS_BYTES,
};
use stoker_kernels::reference::test_image;
use stoker_nvidia::cuda::{Device, DeviceBuffer, Stream};
use stoker_pipeline::transform::ops::{
    apply_step, convert_into, erase_into, lower, random_erasing_values, Affine, ErasingBox,
    OpScratch, Step,
};
use stoker_pipeline::transform::rng::{KeyedRng, Stream as RngStream};
use stoker_testkit::emulator;
use stoker_wire::spec::{DType, ErasingValue, Interpolation, Layout, PipelineSpec};

/// The least PSNR of a float operation's GPU result to the CPU's.
const MIN_DB: f64 = 40.0;

struct Gpu {
    dev: Device,
    stream: Stream,
    kernels: AugmentKernels,
}

fn gpu(test: &str) -> Option<Gpu> {
    emulator::use_emulator();
    let nvrtc = emulator::nvrtc(test)?;
    let dev = Device::open(emulator::UUIDS[0].parse().unwrap()).unwrap();
    let kernels = AugmentKernels::load(&dev, &nvrtc, None).unwrap_or_else(|e| panic!("{e}"));
    let stream = dev.stream().unwrap();
    Some(Gpu {
        dev,
        stream,
        kernels,
    })
}

impl Gpu {
    fn upload(&self, bytes: &[u8]) -> DeviceBuffer {
        let buf = self.dev.alloc(bytes.len().max(1)).unwrap();
        self.stream.copy_to_device(&buf, 0, bytes).unwrap();
        buf
    }

    /// Applies `steps[k]` (one list per sample) to `images[k]` on the GPU, position by
    /// position; returns each sample's pixels.
    fn apply(&self, images: &[RgbImage], steps: &[Vec<Step>]) -> Vec<Vec<u8>> {
        let (w, h) = (images[0].width, images[0].height);
        let n = images.len();
        let max_steps = steps.iter().map(Vec::len).max().unwrap();
        let mut table = Vec::new();
        let mut weights = Vec::new();
        for list in steps {
            table.extend(list.iter().map(|s| lower(s, w, h, &mut weights)));
            table.extend(std::iter::repeat_n(
                OpStep::default(),
                max_steps - list.len(),
            ));
        }
        let pixels: Vec<u8> = images.iter().flat_map(|i| i.data.clone()).collect();
        let bufs = [self.upload(&pixels), self.upload(&pixels)];
        let steps_dev = self.upload(OpStep::bytes(&table));
        let weights_dev = self.upload(f32::bytes(&weights));
        let stats = self.dev.alloc(n * OP_STATS_BYTES).unwrap();
        let mut at = 0;
        for pos in 0..max_steps {
            let b = OpsBatch {
                src: bufs[at].ptr(),
                dst: bufs[1 - at].ptr(),
                steps: steps_dev.ptr(),
                weights: weights_dev.ptr(),
                stats: stats.ptr(),
                n: n as u32,
                width: w,
                height: h,
                max_steps: max_steps as u32,
                step: pos as u32,
                pad: 0,
            };
            // SAFETY: every address is a live buffer of the size the kernels touch, kept until
            // the synchronise below.
            unsafe {
                self.kernels.op_stats(&self.stream, &b).unwrap();
                self.kernels.op_step(&self.stream, &b).unwrap();
            }
            at = 1 - at;
        }
        self.stream.synchronize().unwrap();
        let mut got = vec![0u8; pixels.len()];
        bufs[at].read(&mut got).unwrap();
        got.chunks_exact(pixels.len() / n)
            .map(<[u8]>::to_vec)
            .collect()
    }
}

fn cpu(image: &RgbImage, steps: &[Step]) -> Vec<u8> {
    let mut img = image.clone();
    let mut scratch = OpScratch::new();
    for s in steps {
        apply_step(s, &mut img, &mut scratch);
    }
    img.data
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    if mse == 0.0 {
        f64::INFINITY
    } else {
        10.0 * (255.0f64.powi(2) / mse).log10()
    }
}

/// The largest difference of two images' values.
fn max_diff(a: &[u8], b: &[u8]) -> u8 {
    a.iter()
        .zip(b)
        .map(|(x, y)| x.abs_diff(*y))
        .max()
        .unwrap_or(0)
}

fn affine(angle: f64, translate: [f64; 2], shear: [f64; 2], mode: Interpolation) -> Step {
    Step::Affine(Affine {
        angle,
        translate,
        scale: 1.1,
        shear,
        interpolation: mode,
        fill: [10.0, 200.0, 30.0],
        center: None,
    })
}

/// Each case: the step, a wrong version of it, and whether it must be exact.
fn cases() -> Vec<(Step, Step, bool)> {
    use Step::*;
    let nearest = Interpolation::Nearest;
    let bilinear = Interpolation::Bilinear;
    vec![
        (
            Brightness { factor: 1.3 },
            Brightness { factor: 1.2 },
            false,
        ),
        (Contrast { factor: 0.6 }, Contrast { factor: 0.7 }, false),
        (
            Saturation { factor: 1.7 },
            Saturation { factor: 1.5 },
            false,
        ),
        (Hue { factor: 0.21 }, Hue { factor: 0.19 }, false),
        (Hue { factor: -0.4 }, Hue { factor: -0.38 }, false),
        (Sharpness { factor: 2.0 }, Sharpness { factor: 1.5 }, false),
        (Grayscale, Saturation { factor: 0.2 }, true),
        (
            GaussianBlur {
                kernel_size: [9, 5],
                sigma: [1.4, 0.8],
            },
            GaussianBlur {
                kernel_size: [9, 5],
                sigma: [1.0, 0.8],
            },
            false,
        ),
        (
            Solarize { threshold: 100.0 },
            Solarize { threshold: 140.0 },
            true,
        ),
        (Posterize { bits: 3 }, Posterize { bits: 4 }, true),
        (Equalize, Autocontrast, true),
        (Autocontrast, Equalize, true),
        (Invert, Solarize { threshold: 10.0 }, true),
        (VerticalFlip, Invert, true),
        (
            affine(0.0, [3.0, -2.0], [0.0, 0.0], nearest),
            affine(0.0, [2.0, -2.0], [0.0, 0.0], nearest),
            true,
        ),
        (
            affine(17.0, [1.5, 2.0], [8.0, -5.0], bilinear),
            affine(18.0, [1.5, 2.0], [8.0, -5.0], bilinear),
            false,
        ),
        (
            affine(-30.0, [0.0, 0.0], [12.0, 0.0], nearest),
            affine(-30.0, [0.0, 0.0], [14.0, 0.0], nearest),
            false,
        ),
        (
            Rotate {
                angle: 33.0,
                interpolation: bilinear,
                fill: [0.0; 3],
                center: None,
            },
            Rotate {
                angle: 35.0,
                interpolation: bilinear,
                fill: [0.0; 3],
                center: None,
            },
            false,
        ),
        (
            Rotate {
                angle: 180.0,
                interpolation: nearest,
                fill: [0.0; 3],
                center: None,
            },
            VerticalFlip,
            true,
        ),
    ]
}

#[test]
fn every_operation_kernel_matches_the_cpu_backend() {
    let Some(g) = gpu("every_operation_kernel_matches_the_cpu_backend") else {
        return;
    };
    let cases = cases();
    let images: Vec<RgbImage> = (0..cases.len())
        .map(|k| test_image(37, 29, 11 + k as u64))
        .collect();
    let steps: Vec<Vec<Step>> = cases.iter().map(|c| vec![c.0.clone()]).collect();
    let got = g.apply(&images, &steps);
    for (k, (step, wrong, exact)) in cases.iter().enumerate() {
        let want = cpu(&images[k], std::slice::from_ref(step));
        let db = psnr(&got[k], &want);
        eprintln!("{}: {db:.1} dB", step.kind());
        let worst = max_diff(&got[k], &want);
        if *exact {
            assert!(got[k] == want, "{step:?}: not equal ({db:.1} dB)");
        } else {
            assert!(
                db >= MIN_DB && worst <= 1,
                "{step:?}: {db:.1} dB, {worst} apart"
            );
        }
        let off = cpu(&images[k], std::slice::from_ref(wrong));
        let off_db = psnr(&got[k], &off);
        assert!(
            off_db < MIN_DB,
            "{step:?} is not told apart from {wrong:?}: {off_db:.1} dB"
        );
    }
}

#[test]
fn a_square_image_takes_the_quarter_turns_and_step_lists_of_any_length() {
    let Some(g) = gpu("a_square_image_takes_the_quarter_turns_and_step_lists_of_any_length") else {
        return;
    };
    let rot = |angle: f64| Step::Rotate {
        angle,
        interpolation: Interpolation::Nearest,
        fill: [1.0, 2.0, 3.0],
        center: None,
    };
    let lists = vec![
        vec![rot(90.0), Step::Contrast { factor: 1.4 }, Step::Equalize],
        vec![rot(270.0)],
        vec![],
        vec![
            Step::Hue { factor: 0.1 },
            Step::Autocontrast,
            Step::GaussianBlur {
                kernel_size: [23, 23],
                sigma: [1.9, 1.9],
            },
            Step::Solarize { threshold: 128.0 },
        ],
    ];
    let images: Vec<RgbImage> = (0..lists.len())
        .map(|k| test_image(24, 24, 3 + k as u64))
        .collect();
    let got = g.apply(&images, &lists);
    for (k, list) in lists.iter().enumerate() {
        let want = cpu(&images[k], list);
        let (db, worst) = (psnr(&got[k], &want), max_diff(&got[k], &want));
        eprintln!("sample {k} ({} steps): {db:.1} dB", list.len());
        assert!(
            db >= MIN_DB && worst <= 1,
            "sample {k}: {list:?}: {db:.1} dB, {worst} apart"
        );
    }
    assert!(got[2] == images[2].data, "no steps: the crop as it was");
}

#[test]
fn convert_and_erasing_kernels_match_the_cpu_backend() {
    let Some(g) = gpu("convert_and_erasing_kernels_match_the_cpu_backend") else {
        return;
    };
    let (w, h) = (19u32, 13u32);
    let images: Vec<RgbImage> = (0..3).map(|k| test_image(w, h, 40 + k)).collect();
    let boxes = [
        Some(ErasingBox {
            top: 2,
            left: 3,
            height: 5,
            width: 7,
        }),
        None,
        Some(ErasingBox {
            top: 0,
            left: 0,
            height: 13,
            width: 1,
        }),
    ];
    let value = [0.5f32, -1.25, 300.0];
    // Sample 2 erases with `value="random"`: its values drawn as the CPU draws them, after a
    // few unused ones (its index in the pool is not 0).
    let random = ErasingValue::Random(stoker_wire::spec::RandomWord::Random);
    let rng = || KeyedRng::new(1, 0, 2, RngStream::Erasing);
    let mut pool = vec![7.0f32; 5];
    random_erasing_values(boxes[2].unwrap(), &mut rng(), &mut pool);
    for dtype in [DType::U8, DType::F16, DType::Bf16, DType::F32] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            let mut spec = PipelineSpec::eval(w, h);
            spec.crop = stoker_wire::spec::Crop::CenterCrop {
                resize: h,
                size: [h, w],
            };
            spec.dtype = dtype;
            spec.layout = layout;
            let bytes = spec.image_bytes();
            let heads: Vec<OpsHead> = boxes
                .iter()
                .enumerate()
                .map(|(k, b)| {
                    let b = b.unwrap_or(ErasingBox {
                        top: 0,
                        left: 0,
                        height: 0,
                        width: 0,
                    });
                    OpsHead {
                        zero: u32::from(k == 1 && dtype == DType::F32),
                        erase: if k == 2 { ERASE_RANDOM } else { ERASE_FILL },
                        top: b.top as u32,
                        left: b.left as u32,
                        height: b.height as u32,
                        width: b.width as u32,
                        value,
                        values: if k == 2 { 5 } else { 0 },
                    }
                })
                .collect();
            let src: Vec<u8> = images.iter().flat_map(|i| i.data.clone()).collect();
            let src = g.upload(&src);
            let heads_dev = g.upload(OpsHead::bytes(&heads));
            let pool_dev = g.upload(f32::bytes(&pool));
            let out = g.dev.alloc(bytes * images.len()).unwrap();
            let mut b = FinishBatch {
                src: src.ptr(),
                dst: out.ptr(),
                heads: heads_dev.ptr(),
                image_bytes: bytes as u64,
                n: images.len() as u32,
                out_w: w,
                out_h: h,
                dtype: dtype_code(dtype),
                layout: layout_code(layout),
                pad: 0,
                mean: spec.mean,
                std: spec.std,
            };
            // SAFETY: live buffers of the sizes the kernels touch, kept until the synchronise.
            unsafe {
                g.kernels.op_convert(&g.stream, &b).unwrap();
                b.src = pool_dev.ptr();
                g.kernels.op_erase(&g.stream, &b).unwrap();
            }
            g.stream.synchronize().unwrap();
            let mut got = vec![0u8; bytes * images.len()];
            out.read(&mut got).unwrap();
            for (k, img) in images.iter().enumerate() {
                let mut want = vec![0u8; bytes];
                if heads[k].zero == 0 {
                    convert_into(img, &spec, &mut want);
                    if let Some(area) = boxes[k] {
                        let v = if k == 2 {
                            random.clone()
                        } else {
                            ErasingValue::Fill(value)
                        };
                        erase_into(area, &v, &spec, &mut rng(), &mut want);
                    }
                }
                let part = &got[k * bytes..(k + 1) * bytes];
                assert!(part == want, "{dtype:?} {layout:?} sample {k} differs");
            }
        }
    }
}
