//! Tests of the augment stage against the f64 reference.

#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use super::*;
use stoker_kernels::reference::{augment_reference, OutputParams};
use stoker_wire::spec::{IMAGENET_MEAN, IMAGENET_STD};

const DTYPES: [DType; 4] = [DType::U8, DType::F16, DType::Bf16, DType::F32];
const LAYOUTS: [Layout; 2] = [Layout::Nchw, Layout::Nhwc];

fn random_image(rng: &mut KeyedRng, width: u32, height: u32) -> RgbImage {
    let mut img = RgbImage::default();
    img.reset(width, height);
    // Mix smooth areas and noise so both rounding and large steps are exercised.
    let noisy = rng.below(2) == 0;
    for y in 0..height {
        for x in 0..width {
            let i = ((y * width + x) * 3) as usize;
            for c in 0..3 {
                img.data[i + c] = if noisy {
                    rng.below(256) as u8
                } else {
                    ((x * 7 + y * 3 + c as u32 * 50) % 256) as u8
                };
            }
        }
    }
    img
}

#[test]
fn to_byte_rounds_half_away_from_zero_and_clamps_everything_else() {
    let cases = [
        (f32::NAN, 0),
        (f32::NEG_INFINITY, 0),
        (-3.0, 0),
        (0.0, 0),
        (0.49, 0),
        (0.5, 1),
        (127.5, 128),
        (254.49, 254),
        (254.5, 255),
        (255.0, 255),
        (1e9, 255),
        (f32::INFINITY, 255),
    ];
    for (v, want) in cases {
        assert_eq!(to_byte(v), want, "{v}");
    }
}

fn spec_for(dtype: DType, layout: Layout, out_h: u32, out_w: u32) -> PipelineSpec {
    PipelineSpec {
        crop: Crop::RandomResized {
            size: [out_h, out_w],
            scale: [0.08, 1.0],
            ratio: [0.75, 4.0 / 3.0],
        },
        dtype,
        layout,
        mean: IMAGENET_MEAN,
        std: IMAGENET_STD,
        ..PipelineSpec::train(1, 224)
    }
}

/// Decodes output bytes into f64 values.
fn decode(bytes: &[u8], dtype: DType) -> Vec<f64> {
    match dtype {
        DType::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .map(|b| f64::from(f32::from_ne_bytes(b.try_into().unwrap())))
            .collect(),
        DType::F16 => bytes
            .chunks_exact(2)
            .map(|b| half::f16::from_ne_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
        DType::Bf16 => bytes
            .chunks_exact(2)
            .map(|b| half::bf16::from_ne_bytes(b.try_into().unwrap()).to_f64())
            .collect(),
    }
}

/// Largest allowed |fast - reference| for a reference value `r`.
fn tolerance(dtype: DType, r: f64) -> f64 {
    match dtype {
        DType::U8 => 1.0,
        DType::F32 => 1e-3,
        // 1e-3 of arithmetic plus one unit in the last place of the format.
        DType::F16 => 1e-3 + r.abs() * 2f64.powi(-10),
        DType::Bf16 => 1e-3 + r.abs() * 2f64.powi(-7),
    }
}

fn check_against_reference(
    aug: &mut Augmenter,
    img: &RgbImage,
    crop: CropBox,
    flip: bool,
    spec: &PipelineSpec,
) {
    let (out_h, out_w) = spec.crop.output_size();
    let mut out = vec![0xA5u8; spec.image_bytes()];
    aug.augment_into(img, crop, flip, spec, &mut out);
    let want = augment_reference(img, crop, flip, out_h, out_w, &OutputParams::from(spec));
    assert_eq!(want.len(), out.len());
    let (got, want) = (decode(&out, spec.dtype), decode(&want, spec.dtype));
    for (i, (g, r)) in got.iter().zip(&want).enumerate() {
        assert!(
            (g - r).abs() <= tolerance(spec.dtype, *r),
            "element {i}: fast {g} vs reference {r}; image {}x{}, {crop:?}, flip {flip}, \
             out {out_h}x{out_w}, {:?} {:?}",
            img.width,
            img.height,
            spec.dtype,
            spec.layout,
        );
    }
}

/// A crop box of one of several kinds: inside, at the edges, fractional, tiny (upscaling),
/// the whole image.
fn random_box(rng: &mut KeyedRng, width: u32, height: u32) -> CropBox {
    let (fw, fh) = (f64::from(width), f64::from(height));
    match rng.below(5) {
        0 => CropBox::full(width, height),
        1 => {
            let w = rng.uniform(0.05, 1.0) * fw;
            let h = rng.uniform(0.05, 1.0) * fh;
            CropBox::new(rng.uniform(0.0, fw - w), rng.uniform(0.0, fh - h), w, h)
        }
        2 => {
            // Flush with the right / bottom edge.
            let w = rng.uniform(0.1, 1.0) * fw;
            let h = rng.uniform(0.1, 1.0) * fh;
            CropBox::new(fw - w, fh - h, w, h)
        }
        3 => {
            // Smaller than a pixel or a few pixels: strong upscaling.
            let w = rng.uniform(0.2, 3.0).min(fw);
            let h = rng.uniform(0.2, 3.0).min(fh);
            CropBox::new(rng.uniform(0.0, fw - w), rng.uniform(0.0, fh - h), w, h)
        }
        _ => {
            // Integer boxes, as RandomResizedCrop makes.
            let w = 1 + rng.below(u64::from(width)) as u32;
            let h = 1 + rng.below(u64::from(height)) as u32;
            let x = rng.below(u64::from(width - w) + 1);
            let y = rng.below(u64::from(height - h) + 1);
            CropBox::new(x as f64, y as f64, f64::from(w), f64::from(h))
        }
    }
}

#[test]
fn fast_matches_reference_on_random_images_boxes_dtypes_layouts() {
    let mut rng = KeyedRng::new(1, 0, 0, Stream::Augment);
    // One augmenter for every case, so stale tables or scratch would show.
    let mut aug = Augmenter::new();
    for case in 0..120 {
        let width = 1 + rng.below(if case % 10 == 0 { 3 } else { 60 }) as u32;
        let height = 1 + rng.below(if case % 10 == 0 { 3 } else { 60 }) as u32;
        let img = random_image(&mut rng, width, height);
        let crop = random_box(&mut rng, width, height);
        let out_h = 1 + rng.below(40) as u32;
        let out_w = 1 + rng.below(40) as u32;
        let flip = rng.below(2) == 1;
        for dtype in DTYPES {
            for layout in LAYOUTS {
                let spec = spec_for(dtype, layout, out_h, out_w);
                check_against_reference(&mut aug, &img, crop, flip, &spec);
            }
        }
    }
}

#[test]
fn fast_matches_reference_at_training_size() {
    let mut rng = KeyedRng::new(2, 0, 0, Stream::Augment);
    let img = random_image(&mut rng, 333, 250);
    let mut aug = Augmenter::new();
    for (crop, flip) in [
        (CropBox::new(20.0, 5.0, 300.0, 240.0), true),
        (CropBox::new(100.0, 100.0, 80.0, 60.0), false),
        (center_crop_box(333, 250, 256, (224, 224)), false),
    ] {
        for dtype in DTYPES {
            let spec = spec_for(dtype, Layout::Nchw, 224, 224);
            check_against_reference(&mut aug, &img, crop, flip, &spec);
        }
    }
}

#[test]
fn one_pixel_image_fills_the_output_with_its_pixel() {
    let mut img = RgbImage::default();
    img.reset(1, 1);
    img.data.copy_from_slice(&[10, 128, 250]);
    let mut aug = Augmenter::new();
    for crop in [CropBox::full(1, 1), CropBox::new(0.25, 0.5, 0.5, 0.25)] {
        for layout in LAYOUTS {
            let spec = spec_for(DType::U8, layout, 5, 7);
            let mut out = vec![0u8; spec.image_bytes()];
            aug.augment_into(&img, crop, true, &spec, &mut out);
            for (i, &v) in out.iter().enumerate() {
                let c = match layout {
                    Layout::Nhwc => i % 3,
                    Layout::Nchw => i / 35,
                };
                assert_eq!(v, img.data[c], "element {i}, {layout:?}");
            }
            for dtype in DTYPES {
                let spec = spec_for(dtype, layout, 5, 7);
                check_against_reference(&mut aug, &img, crop, false, &spec);
            }
        }
    }
}

#[test]
fn flip_mirrors_the_output_exactly() {
    let mut rng = KeyedRng::new(3, 0, 0, Stream::Augment);
    let img = random_image(&mut rng, 41, 29);
    let crop = CropBox::new(3.5, 2.25, 30.0, 20.5);
    let spec = spec_for(DType::F32, Layout::Nhwc, 11, 13);
    let mut aug = Augmenter::new();
    let mut plain = vec![0u8; spec.image_bytes()];
    let mut flipped = vec![0u8; spec.image_bytes()];
    aug.augment_into(&img, crop, false, &spec, &mut plain);
    aug.augment_into(&img, crop, true, &spec, &mut flipped);
    let px = 3 * 4;
    for y in 0..11 {
        for x in 0..13 {
            let a = (y * 13 + x) * px;
            let b = (y * 13 + 12 - x) * px;
            assert_eq!(plain[a..a + px], flipped[b..b + px], "pixel ({x}, {y})");
        }
    }
}

#[test]
fn output_is_bit_identical_across_threads_and_reused_augmenters() {
    let mut rng = KeyedRng::new(4, 0, 0, Stream::Augment);
    let images: Vec<RgbImage> = (0..6)
        .map(|i| random_image(&mut rng, 90 + i * 13, 70 + i * 7))
        .collect();
    let spec = PipelineSpec::train(1, 56);
    let run = |order: Vec<usize>| -> Vec<Vec<u8>> {
        let mut aug = Augmenter::new();
        let mut outs = vec![Vec::new(); images.len()];
        for i in order {
            let img = &images[i];
            let (crop, flip) = sample_params(&spec, img.width, img.height, 9, 1, i as u64);
            let mut out = vec![0u8; spec.image_bytes()];
            aug.augment_into(img, crop, flip, &spec, &mut out);
            outs[i] = out;
        }
        outs
    };
    let serial = run((0..images.len()).collect());
    let threaded: Vec<Vec<Vec<u8>>> = std::thread::scope(|s| {
        let handles: Vec<_> = [vec![5, 4, 3, 2, 1, 0], vec![2, 0, 4, 1, 5, 3]]
            .into_iter()
            .map(|order| s.spawn(|| run(order)))
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    for other in threaded {
        assert!(serial == other, "output depends on thread or order");
    }
}

#[test]
fn a_cached_table_never_carries_pixels_from_the_previous_image() {
    let mut rng = KeyedRng::new(7, 0, 0, Stream::Augment);
    // 4 source rows to 2 output rows: the ring can hold most rows the image has, so a
    // stale ring would be read instead of resampled.
    let (a, b) = (random_image(&mut rng, 50, 4), random_image(&mut rng, 50, 4));
    let spec = spec_for(DType::U8, Layout::Nhwc, 2, 8);
    let crop = CropBox::full(50, 4);
    let mut reused = Augmenter::new();
    let mut first = vec![0u8; spec.image_bytes()];
    reused.augment_into(&a, crop, false, &spec, &mut first);
    let mut second = vec![0u8; spec.image_bytes()];
    reused.augment_into(&b, crop, false, &spec, &mut second);
    let mut fresh = vec![0u8; spec.image_bytes()];
    Augmenter::new().augment_into(&b, crop, false, &spec, &mut fresh);
    assert_ne!(first, second);
    assert!(
        second == fresh,
        "the reused augmenter kept rows of the first image"
    );
}

#[test]
fn steady_state_reuses_every_buffer() {
    let mut rng = KeyedRng::new(6, 0, 0, Stream::Augment);
    let img = random_image(&mut rng, 320, 240);
    let mut aug = Augmenter::new();
    let mut spec = spec_for(DType::F16, Layout::Nhwc, 32, 32);
    let mut out = vec![0u8; spec.image_bytes()];
    // Warm up with the widest and tallest boxes this output size can meet.
    aug.augment_into(&img, CropBox::full(320, 240), false, &spec, &mut out);
    let warm = aug.buffers();
    for index in 0..50 {
        let (crop, flip) = sample_params(&spec, 320, 240, 3, 0, index);
        spec.dtype = DTYPES[index as usize % 4];
        spec.layout = LAYOUTS[index as usize % 2];
        let mut out = vec![0u8; spec.image_bytes()];
        aug.augment_into(&img, crop, flip, &spec, &mut out);
        assert_eq!(
            aug.buffers(),
            warm,
            "a buffer was reallocated at image {index}"
        );
    }
}

#[test]
fn random_resized_crop_stays_in_bounds_and_in_range() {
    let (scale, ratio) = ([0.08f32, 1.0f32], [0.75f32, 4.0 / 3.0]);
    let mut flips = 0;
    let spec = PipelineSpec::train(1, 224);
    let mut area_fractions = Vec::new();
    let mut log_ratios = Vec::new();
    for index in 0..4000u64 {
        let (width, height) = (500, 500);
        let (crop, flip) = sample_params(&spec, width, height, 11, 0, index);
        flips += u32::from(flip);
        assert_eq!(
            crop.x.fract() + crop.y.fract() + crop.w.fract() + crop.h.fract(),
            0.0
        );
        assert!(crop.x >= 0.0 && crop.y >= 0.0 && crop.w >= 1.0 && crop.h >= 1.0);
        assert!(
            crop.x + crop.w <= 500.0 && crop.y + crop.h <= 500.0,
            "{crop:?}"
        );
        let frac = crop.w * crop.h / 250_000.0;
        let r = crop.w / crop.h;
        // Rounding w and h to integers moves area and ratio a little past the range.
        assert!((0.08 * 0.99..=1.0).contains(&frac), "{crop:?}");
        assert!((0.75 * 0.99..=4.0 / 3.0 * 1.01).contains(&r), "{crop:?}");
        area_fractions.push(frac);
        log_ratios.push(r.ln());
        // Same key, same box.
        let mut again = KeyedRng::new(11, 0, index, Stream::Augment);
        assert_eq!(
            random_resized_crop(width, height, scale, ratio, &mut again),
            crop
        );
    }
    assert!((1850..2150).contains(&flips), "{flips} flips of 4000");
    let n = area_fractions.len() as f64;
    let mean_frac = area_fractions.iter().sum::<f64>() / n;
    let mean_log_ratio = log_ratios.iter().sum::<f64>() / n;
    // Uniform(0.08, 1) has mean 0.54; large areas are rejected more often when the ratio
    // pushes a side past the image, so the accepted mean is a little lower.
    assert!(
        (0.45..0.56).contains(&mean_frac),
        "mean area fraction {mean_frac}"
    );
    assert!(
        mean_log_ratio.abs() < 0.02,
        "mean log ratio {mean_log_ratio}"
    );
    let small = area_fractions.iter().filter(|&&f| f < 0.2).count();
    let large = area_fractions.iter().filter(|&&f| f > 0.8).count();
    assert!(small > 300 && large > 100, "small {small}, large {large}");
}

#[test]
fn random_resized_crop_falls_back_to_a_ratio_clamped_centre_crop() {
    // A 1000x10 strip: no box of ratio 3/4..4/3 with area >= 8% fits, so all 10 tries fail.
    let mut rng = KeyedRng::new(0, 0, 0, Stream::Augment);
    let crop = random_resized_crop(1000, 10, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
    // in_ratio 100 > 4/3: h = 10, w = round(10 * 4/3) = 13, centred: j = (1000 - 13) / 2.
    assert_eq!(crop, CropBox::new(493.0, 0.0, 13.0, 10.0));
    let crop = random_resized_crop(10, 1000, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
    // in_ratio 0.01 < 3/4: w = 10, h = round(10 / 0.75) = 13.
    assert_eq!(crop, CropBox::new(0.0, 493.0, 10.0, 13.0));
    // A 1x1 image: the only box is the whole image.
    let crop = random_resized_crop(1, 1, [0.08, 1.0], [0.75, 4.0 / 3.0], &mut rng);
    assert_eq!(crop, CropBox::full(1, 1));
}

fn assert_box(got: CropBox, want: [f64; 4]) {
    let g = [got.x, got.y, got.w, got.h];
    for (a, b) in g.iter().zip(want) {
        assert!((a - b).abs() < 1e-9, "{got:?} vs {want:?}");
    }
}

#[test]
fn center_crop_box_matches_torchvision() {
    // 500x375 -> Resize(256): 341x256 (int(256 * 500 / 375) = 341); CenterCrop(224):
    // left = round(117 / 2 = 58.5) = 58 (half to even), top = round(32 / 2) = 16.
    // Back to source pixels: x = 58 * 500/341, w = 224 * 500/341, y = 16 * 375/256,
    // h = 224 * 375/256.
    assert_box(
        center_crop_box(500, 375, 256, (224, 224)),
        [
            85.043_988_269_794_72,
            23.4375,
            328.445_747_800_586_5,
            328.125,
        ],
    );
    // Portrait: the same numbers transposed.
    assert_box(
        center_crop_box(375, 500, 256, (224, 224)),
        [
            23.4375,
            85.043_988_269_794_72,
            328.125,
            328.445_747_800_586_5,
        ],
    );
    // 343x256: resize is the identity; left = round(119 / 2 = 59.5) = 60 (half to even).
    assert_box(
        center_crop_box(343, 256, 256, (224, 224)),
        [60.0, 16.0, 224.0, 224.0],
    );
    // 640x480 -> 341x256, the same crop offsets as 500x375 at scale 640/341.
    assert_box(
        center_crop_box(640, 480, 256, (224, 224)),
        [
            58.0 * 640.0 / 341.0,
            16.0 * 1.875,
            224.0 * 640.0 / 341.0,
            224.0 * 1.875,
        ],
    );
    // Eval spec: flip_prob 0 never flips; the box ignores the seed.
    let spec = PipelineSpec::eval(1, 224);
    let a = sample_params(&spec, 500, 375, 1, 0, 0);
    let b = sample_params(&spec, 500, 375, 2, 3, 4);
    assert_eq!(a, b);
    assert!(!a.1);
}

/// CPU time of this thread: unlike wall time, not inflated by other processes on a shared
/// machine.
fn thread_cpu_seconds() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: `ts` is a valid, writable timespec for the duration of the call.
    let rc = unsafe { libc::clock_gettime(libc::CLOCK_THREAD_CPUTIME_ID, &mut ts) };
    assert_eq!(rc, 0, "clock_gettime");
    ts.tv_sec as f64 + ts.tv_nsec as f64 * 1e-9
}

#[test]
#[ignore = "timing; run with --release -- --ignored --nocapture"]
fn timing_224_from_300_crop() {
    let mut rng = KeyedRng::new(5, 0, 0, Stream::Augment);
    let img = random_image(&mut rng, 400, 350);
    let crop = CropBox::new(40.0, 20.0, 300.0, 300.0);
    let mut aug = Augmenter::new();
    for dtype in DTYPES {
        for layout in LAYOUTS {
            let spec = spec_for(dtype, layout, 224, 224);
            let mut out = vec![0u8; spec.image_bytes()];
            let iters = 200;
            let mut best = f64::MAX;
            for _ in 0..10 {
                let t = thread_cpu_seconds();
                for i in 0..iters {
                    // Alternate flip so the tables are rebuilt every image, as in training.
                    aug.augment_into(&img, crop, i % 2 == 0, &spec, &mut out);
                }
                best = best.min((thread_cpu_seconds() - t) / f64::from(iters));
            }
            println!(
                "augment 300x300 -> 224x224 {} {:?}: {:.1} us/image (thread CPU time)",
                dtype.name(),
                layout,
                best * 1e6
            );
        }
    }
}

#[test]
fn the_avx2_and_portable_copies_give_the_same_bytes() {
    // Where the CPU lacks AVX2 both runs take the portable copy, and this shows nothing.
    let mut rng = KeyedRng::new(6, 0, 0, Stream::Augment);
    let (mut fast, mut portable) = (Augmenter::new(), Augmenter::new());
    portable.use_portable_code(true);
    for case in 0..60 {
        let width = 1 + rng.below(if case % 10 == 0 { 3 } else { 400 }) as u32;
        let height = 1 + rng.below(if case % 10 == 0 { 3 } else { 300 }) as u32;
        let img = random_image(&mut rng, width, height);
        let crop = random_box(&mut rng, width, height);
        let side = 1 + rng.below(230) as u32;
        let flip = rng.below(2) == 1;
        for dtype in DTYPES {
            for layout in LAYOUTS {
                let spec = spec_for(dtype, layout, side, 1 + rng.below(230) as u32);
                let mut a = vec![0u8; spec.image_bytes()];
                let mut b = vec![1u8; spec.image_bytes()];
                fast.augment_into(&img, crop, flip, &spec, &mut a);
                portable.augment_into(&img, crop, flip, &spec, &mut b);
                assert!(a == b, "case {case}: {dtype:?} {layout:?} differs");
            }
        }
    }
}

#[test]
fn unaligned_outputs_get_the_same_bytes_as_aligned_ones() {
    // Streaming stores need 16-byte alignment; elsewhere the plain stores run.
    let mut rng = KeyedRng::new(7, 0, 0, Stream::Augment);
    let img = random_image(&mut rng, 120, 90);
    let mut aug = Augmenter::new();
    for layout in LAYOUTS {
        let spec = spec_for(DType::F32, layout, 37, 41);
        let n = spec.image_bytes();
        let mut backing = vec![0u8; n + 64];
        let start = 16 - backing.as_ptr() as usize % 16;
        aug.augment_into(
            &img,
            CropBox::full(120, 90),
            true,
            &spec,
            &mut backing[start..start + n],
        );
        let aligned = backing[start..start + n].to_vec();
        for shift in [1, 4, 8] {
            let out = &mut backing[start + shift..start + shift + n];
            out.fill(0);
            aug.augment_into(&img, CropBox::full(120, 90), true, &spec, out);
            assert!(*out == aligned[..], "{layout:?}, {shift} bytes off");
        }
    }
}

/// FNV-1a, 64-bit: a digest that, unlike `DefaultHasher`, no Rust release changes.
fn fnv1a(bytes: &[u8], mut h: u64) -> u64 {
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
    }
    h
}

#[test]
fn outputs_keep_their_bytes_across_rewrites_of_the_loops() {
    // The bytes of 40 random images, boxes and output sizes in every dtype and layout, as the
    // augmenter has given them since the AVX2 copy (2026-11-26): a rewrite of the loops that
    // changes the order of the f32 operations shows here, not only against the tolerance of
    // the f64 reference. Change the digest only with a change of the math, said in the log.
    let mut rng = KeyedRng::new(9, 0, 0, Stream::Augment);
    let mut aug = Augmenter::new();
    let mut h = 0xcbf2_9ce4_8422_2325;
    for case in 0..40 {
        let width = 1 + rng.below(if case % 10 == 0 { 3 } else { 500 }) as u32;
        let height = 1 + rng.below(if case % 10 == 0 { 3 } else { 400 }) as u32;
        let img = random_image(&mut rng, width, height);
        let crop = random_box(&mut rng, width, height);
        let flip = rng.below(2) == 1;
        for dtype in DTYPES {
            for layout in LAYOUTS {
                let side = 1 + rng.below(240) as u32;
                let spec = spec_for(dtype, layout, side, 1 + rng.below(240) as u32);
                let mut out = vec![0u8; spec.image_bytes()];
                aug.augment_into(&img, crop, flip, &spec, &mut out);
                h = fnv1a(&out, h);
            }
        }
    }
    assert_eq!(h, 0xcb73_de1c_1ed7_274c, "augment output digest {h:#018x}");
}
