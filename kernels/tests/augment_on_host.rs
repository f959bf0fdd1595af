//! Runs `kernels/cu/augment.cu` on the CPU, compiled by the host C++ compiler with a small shim
//! for CUDA's built-ins, and checks it against the formula in its header comment, computed
//! here independently in f64. This checks the kernel's arithmetic, indexing, flip, layouts and
//! dtype conversions, and that the `#[repr(C)]` structs match the C++ layout, on a machine
//! without a GPU. It does not replace the GPU self-test (the device compiler's code is not
//! this code). Skips loudly where no C++ compiler is found (`$CXX`, else `c++`).

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::io::Write;
use std::path::PathBuf;
use std::process::{Command, Stdio};

use libloading::Library;
use stoker_kernels::augment::{
    AugmentBatch, AugmentSample, DTYPE_BF16, DTYPE_F16, DTYPE_F32, DTYPE_U8, LAYOUT_NCHW,
    LAYOUT_NHWC,
};
use stoker_kernels::reference::CropBox;

const SHIM: &str = r#"
#include <math.h>
#include <string.h>
struct dim3 { unsigned x, y, z; };
static dim3 threadIdx, blockIdx, blockDim, gridDim;
#define __global__
#define __device__
#define __forceinline__ inline
static inline unsigned __float_as_uint(float f) { unsigned u; memcpy(&u, &f, 4); return u; }
static inline float __uint_as_float(unsigned u) { float f; memcpy(&f, &u, 4); return f; }
static inline unsigned atomicAdd(unsigned* p, unsigned v) { unsigned o = *p; *p += v; return o; }
"#;

const DRIVER: &str = r#"
extern "C" void host_augment(AugmentBatch b, unsigned grid_z) {
    blockDim = dim3{32, 8, 1};
    gridDim = dim3{(b.out_w + 31) / 32, (b.out_h + 7) / 8, grid_z};
    for (unsigned z = 0; z < gridDim.z; ++z)
    for (unsigned by = 0; by < gridDim.y; ++by)
    for (unsigned bx = 0; bx < gridDim.x; ++bx)
    for (unsigned ty = 0; ty < blockDim.y; ++ty)
    for (unsigned tx = 0; tx < blockDim.x; ++tx) {
        blockIdx = dim3{bx, by, z};
        threadIdx = dim3{tx, ty, 0};
        stoker_augment(b);
    }
}
extern "C" unsigned short host_f16(float f) { return f32_to_f16(f); }
extern "C" unsigned short host_bf16(float f) { return f32_to_bf16(f); }
extern "C" unsigned char host_pattern(u64 i, u32 seed) { return pattern_byte(i, seed); }
"#;

/// The kernel built as a host shared library, or `None` (said loudly) without a compiler.
fn host_kernel() -> Option<Library> {
    let cxx = std::env::var("CXX").unwrap_or_else(|_| "c++".into());
    let dir = std::env::temp_dir().join(format!("stoker-augment-host-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let so: PathBuf =
        dir.join(format!("augment-{:?}.so", std::thread::current().id()).replace(['(', ')'], ""));
    let source = format!(
        "{SHIM}\n{}\n{DRIVER}",
        stoker_kernels::sources::AUGMENT_CU.source
    );
    let child = Command::new(&cxx)
        .args([
            "-std=c++17",
            "-O1",
            "-ffp-contract=off",
            "-shared",
            "-fPIC",
            "-x",
            "c++",
            "-",
            "-o",
        ])
        .arg(&so)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            let _ = writeln!(
                std::io::stderr(),
                "SKIPPED augment_on_host: no C++ compiler {cxx:?}: {e}"
            );
            return None;
        }
    };
    child
        .stdin
        .take()
        .unwrap()
        .write_all(source.as_bytes())
        .unwrap();
    let out = child.wait_with_output().unwrap();
    assert!(
        out.status.success(),
        "{cxx} failed on augment.cu + shim:\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // SAFETY: the library was just built from augment.cu and the shim above; it has no
    // initialisers of its own.
    Some(unsafe { Library::new(&so) }.unwrap())
}

type AugmentFn = unsafe extern "C" fn(AugmentBatch, u32);
type ConvertFn = unsafe extern "C" fn(f32) -> u16;
type PatternFn = unsafe extern "C" fn(u64, u32) -> u8;

fn sym<T: Copy>(lib: &Library, name: &str) -> T {
    // SAFETY: the types above are those of the extern "C" functions in DRIVER.
    unsafe { *lib.get::<T>(name.as_bytes()).unwrap() }
}

/// A small deterministic generator (xorshift64*), to keep the test free of extra crates.
struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }
}

/// The formula of augment.cu's header, in f64: (first tap, normalised weights). With `clamp`
/// the taps stay within the box widened to whole pixels (when that is not empty).
fn taps(x0: f64, crop: f64, out: u32, o: u32, size: u32, clamp: bool) -> (usize, Vec<f64>) {
    let (mut lo, mut hi) = (0.0, size as f64);
    if clamp {
        let (a, b) = (x0.floor().max(0.0), (x0 + crop).ceil().min(size as f64));
        if a < b {
            (lo, hi) = (a, b);
        }
    }
    let scale = crop / out as f64;
    let fs = scale.max(1.0);
    let center = x0 + (o as f64 + 0.5) * scale;
    let xmin = ((center - fs + 0.5).floor()).max(lo) as usize;
    let xmax = ((center + fs + 0.5).floor()).min(hi) as usize;
    let w: Vec<f64> = (xmin..xmax)
        .map(|x| (1.0 - ((x as f64 - center + 0.5) / fs).abs()).max(0.0))
        .collect();
    let sum: f64 = w.iter().sum();
    if sum <= 0.0 {
        // A box outside the image: the nearest edge sample.
        return (
            (center.floor().max(lo) as usize).min(hi as usize - 1),
            vec![1.0],
        );
    }
    (xmin, w.iter().map(|v| v / sum).collect())
}

struct Image {
    w: u32,
    h: u32,
    pitch: usize,
    data: Vec<u8>,
}

/// Resized value (0..255) of channel `c` at output (ox, oy), flip applied.
#[allow(clippy::too_many_arguments)]
fn oracle(
    img: &Image,
    crop: CropBox,
    flip: bool,
    out: (u32, u32),
    ox: u32,
    oy: u32,
    c: usize,
    clamp: bool,
) -> f64 {
    let (out_w, out_h) = out;
    let sx = if flip { out_w - 1 - ox } else { ox };
    let (x0, wx) = taps(crop.x, crop.w, out_w, sx, img.w, clamp);
    let (y0, wy) = taps(crop.y, crop.h, out_h, oy, img.h, clamp);
    let mut v = 0.0;
    for (j, wyj) in wy.iter().enumerate() {
        let mut row = 0.0;
        for (i, wxi) in wx.iter().enumerate() {
            row += wxi * img.data[(y0 + j) * img.pitch + (x0 + i) * 3 + c] as f64;
        }
        v += wyj * row;
    }
    v
}

#[test]
fn f16_and_bf16_conversions_round_to_nearest_even() {
    let Some(lib) = host_kernel() else { return };
    let f16: ConvertFn = sym(&lib, "host_f16");
    let bf16: ConvertFn = sym(&lib, "host_bf16");
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut values: Vec<f32> = vec![
        0.0,
        -0.0,
        1.0,
        -1.0,
        65504.0,
        65519.99,
        65520.0,
        -65520.0,
        1e-8,
        2.0f32.powi(-25),
        2.0f32.powi(-24),
        2.0f32.powi(-24) * 1.5,
        2.0f32.powi(-14),
        6.1e-5,
        f32::INFINITY,
        f32::NEG_INFINITY,
        f32::MAX,
        f32::MIN_POSITIVE,
        1.0 + 2.0f32.powi(-11),
        1.0 + 3.0 * 2.0f32.powi(-11),
        1.0 + 2.0f32.powi(-8),
        1.0 + 3.0 * 2.0f32.powi(-8),
    ];
    values.extend((0..200_000).map(|_| f32::from_bits(rng.next() as u32)));
    // Concentrate on the range normalised pixels live in, subnormal halves included.
    values.extend(
        (0..200_000).map(|_| f32::from_bits(0x3300_0000 + (rng.next() % 0x1000_0000) as u32)),
    );
    for v in values {
        // SAFETY: plain functions of a float.
        let (h, b) = unsafe { (f16(v), bf16(v)) };
        if v.is_nan() {
            assert!(half::f16::from_bits(h).is_nan(), "{v}");
            assert!(half::bf16::from_bits(b).is_nan(), "{v}");
            continue;
        }
        assert_eq!(
            h,
            half::f16::from_f32(v).to_bits(),
            "f16 of {v:e} ({:#x})",
            v.to_bits()
        );
        assert_eq!(
            b,
            half::bf16::from_f32(v).to_bits(),
            "bf16 of {v:e} ({:#x})",
            v.to_bits()
        );
    }
}

#[test]
fn the_fill_pattern_matches_its_rust_mirror() {
    let Some(lib) = host_kernel() else { return };
    let pattern: PatternFn = sym(&lib, "host_pattern");
    for seed in [0, 1, 0xdead_beef] {
        for i in (0..5000u64).chain([u64::MAX - 3, 1 << 40]) {
            // SAFETY: a plain function of two integers.
            let got = unsafe { pattern(i, seed) };
            assert_eq!(
                got,
                stoker_kernels::augment::pattern_byte(i, seed),
                "i={i} seed={seed}"
            );
        }
    }
}

#[test]
fn augment_matches_the_formula_for_every_dtype_and_layout() {
    let Some(lib) = host_kernel() else { return };
    let augment: AugmentFn = sym(&lib, "host_augment");
    let mut rng = Rng(42);
    // Two images with padded rows, as nvJPEG may write them.
    let mut images: Vec<Image> = [(53u32, 41u32), (19, 30)]
        .iter()
        .map(|&(w, h)| {
            let pitch = w as usize * 3 + 7;
            let data = (0..pitch * h as usize).map(|_| rng.next() as u8).collect();
            Image { w, h, pitch, data }
        })
        .collect();
    // Make one region smooth so rounding near .5 is exercised as well as noise.
    for (i, px) in images[0].data.iter_mut().enumerate().take(400) {
        *px = (i % 256) as u8;
    }
    let (out_w, out_h) = (24u32, 17u32);
    // (image, crop, flip): downscale, upscale (crop smaller than the output), fractional
    // boxes, a box touching the far edges, and a zeroed sample.
    let cases: Vec<(usize, CropBox, bool)> = vec![
        (0, CropBox::new(0.0, 0.0, 53.0, 41.0), false),
        (0, CropBox::new(3.25, 5.5, 40.5, 30.75), true),
        (1, CropBox::new(2.0, 3.0, 9.0, 7.0), false),
        (1, CropBox::new(0.7, 1.3, 18.3, 28.7), true),
        (0, CropBox::new(29.0, 17.0, 24.0, 24.0), false),
        // Outside the image (never produced by the crop sampler, but must not divide by 0).
        (1, CropBox::new(40.0, -20.0, 4.0, 4.0), true),
        (usize::MAX, CropBox::new(0.0, 0.0, 1.0, 1.0), false),
    ];
    let samples: Vec<AugmentSample> = cases
        .iter()
        .map(|&(i, crop, flip)| match images.get(i) {
            Some(img) => AugmentSample::new(
                img.data.as_ptr() as u64,
                img.pitch as u64,
                img.w,
                img.h,
                crop,
                flip,
            ),
            None => AugmentSample::zeroed(),
        })
        .collect();
    let mean = [0.485f32, 0.456, 0.406];
    let std = [0.229f32, 0.224, 0.225];
    let n = samples.len();
    let plane = (out_w * out_h) as usize;
    for (dtype, clamp) in [DTYPE_U8, DTYPE_F16, DTYPE_BF16, DTYPE_F32]
        .into_iter()
        .flat_map(|d| [(d, false), (d, true)])
    {
        for layout in [LAYOUT_NCHW, LAYOUT_NHWC] {
            let esize = [1usize, 2, 2, 4][dtype as usize];
            let image_bytes = plane * 3 * esize + 64; // gaps between images stay untouched
            let mut out = vec![0xa5u8; n * image_bytes];
            let batch = AugmentBatch {
                dst: out.as_mut_ptr() as u64,
                samples: samples.as_ptr() as u64,
                image_bytes: image_bytes as u64,
                n: n as u32,
                out_w,
                out_h,
                dtype,
                layout,
                clamp_to_crop: u32::from(clamp),
                mean,
                std,
            };
            // Grid z of 4 < n: the kernel's loop over samples is exercised.
            // SAFETY: every address in `batch` points into live host memory of the right size.
            unsafe { augment(batch, 4) };
            let mut worst = 0f64;
            let mut off_by_one = 0usize;
            for (s, &(img, crop, flip)) in cases.iter().enumerate() {
                let base = s * image_bytes;
                assert!(out[base + plane * 3 * esize..base + image_bytes]
                    .iter()
                    .all(|&b| b == 0xa5));
                for oy in 0..out_h {
                    for ox in 0..out_w {
                        for c in 0..3 {
                            let pix = (oy * out_w + ox) as usize;
                            let e = if layout == LAYOUT_NHWC {
                                pix * 3 + c
                            } else {
                                c * plane + pix
                            };
                            let at = base + e * esize;
                            let got = &out[at..at + esize];
                            let Some(image) = images.get(img) else {
                                assert!(got.iter().all(|&b| b == 0), "zeroed sample");
                                continue;
                            };
                            let v = oracle(image, crop, flip, (out_w, out_h), ox, oy, c, clamp);
                            let norm = (v / 255.0 - mean[c] as f64) / std[c] as f64;
                            let ctx = || {
                                format!("dtype {dtype} layout {layout} sample {s} ({ox},{oy}) c{c} v={v}")
                            };
                            match dtype {
                                DTYPE_U8 => {
                                    let want = v.round().clamp(0.0, 255.0);
                                    let d = (got[0] as f64 - want).abs();
                                    assert!(d <= 1.0, "{} got {}", ctx(), got[0]);
                                    if d > 0.0 {
                                        // Only where the exact value is within f32 noise of .5.
                                        let frac = (v - v.floor() - 0.5).abs();
                                        assert!(frac < 1e-3, "{} got {}", ctx(), got[0]);
                                        off_by_one += 1;
                                    }
                                    worst = worst.max(d);
                                }
                                DTYPE_F32 => {
                                    let g = f32::from_ne_bytes(got.try_into().unwrap()) as f64;
                                    assert!(
                                        (g - norm).abs() <= 1e-4,
                                        "{} got {g} want {norm}",
                                        ctx()
                                    );
                                    worst = worst.max((g - norm).abs());
                                }
                                _ => {
                                    let bits = u16::from_ne_bytes(got.try_into().unwrap());
                                    // At most one unit in the last place of the exact
                                    // value's rounding, plus f32 noise near zero.
                                    let (g, ulp) = if dtype == DTYPE_F16 {
                                        let want = half::f16::from_f64(norm);
                                        let next = half::f16::from_bits(want.to_bits() + 1);
                                        (
                                            half::f16::from_bits(bits).to_f64(),
                                            (next.to_f64() - want.to_f64()).abs(),
                                        )
                                    } else {
                                        let want = half::bf16::from_f64(norm);
                                        let next = half::bf16::from_bits(want.to_bits() + 1);
                                        (
                                            half::bf16::from_bits(bits).to_f64(),
                                            (next.to_f64() - want.to_f64()).abs(),
                                        )
                                    };
                                    assert!(
                                        (g - norm).abs() <= ulp + 1e-5,
                                        "{} got {g} want {norm}",
                                        ctx()
                                    );
                                }
                            }
                        }
                    }
                }
            }
            let _ = writeln!(
                std::io::stderr(),
                "dtype {dtype} clamp {clamp} layout {layout}: worst difference {worst:e}, u8 off by one {off_by_one}"
            );
        }
    }
    drop(images.drain(..));
}
