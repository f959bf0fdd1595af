//! Batch mixes (issue 39: torchvision's MixUp and CutMix) on the CUDA backend, on the emulated
//! GPU. The mix kernel (`stoker_mix` in kernels/cu/augment.cu) against the CPU backend's
//! `transform::mix::mix_images` on the same images and draw: equal bit for bit, every float
//! dtype and layout, MixUp and CutMix, one image and an empty box. Then a real daemon and
//! client: a mix job on `--backend cuda` gives the CPU backend's soft labels exactly and its
//! images at >= 40 dB (4:4:4 JPEGs, so the decoders agree), for the same seed, with one view
//! and with two (the CPU route's views, mixed on the device alike), a short last batch
//! included; the same job unmixed differs; labels outside `num_classes` are refused by name.

// Test code: casts of small sizes, labels and bit patterns the test chooses.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::Path;
use std::time::Duration;

use stoker::spec::BatchMix;
use stoker::{AttachOptions, Client, DType, Layout, PipelineSpec};
use stoker_kernels::augment::AugmentKernels;
use stoker_nvidia::cuda::Device;
use stoker_pipeline::transform::mix::{
    cut_box, draw, kernel_batch, mix_images, MixDraw, MixImages, MixKind,
};
use stoker_testkit::{emulator, local_view, Daemon};

/// The least PSNR of a CUDA batch to the CPU backend's (tests/cuda_ops.rs's bound).
const MIN_DB: f64 = 40.0;
const SEED: u64 = 31;
const CLASSES: u32 = 2;

/// A small xorshift: the test's own bytes, the same on every run.
struct Bits(u64);

impl Bits {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A finite element of `dtype` (f16 subnormals included), as bytes.
    fn element(&mut self, dtype: DType) -> Vec<u8> {
        let r = self.next();
        let sign = (r & 1) as u32;
        match dtype {
            DType::F32 => {
                let v = (r >> 8) as f32 / (1u64 << 56) as f32 * 6.0 - 3.0;
                v.to_ne_bytes().to_vec()
            }
            // Exponents 0..=16: subnormals up to 4.
            DType::F16 => {
                let bits =
                    (sign << 15) | (((r >> 8) % 17) << 10) as u32 | ((r >> 16) & 0x3ff) as u32;
                (bits as u16).to_ne_bytes().to_vec()
            }
            DType::Bf16 => {
                let bits =
                    (sign << 15) | ((100 + (r >> 8) % 30) << 7) as u32 | ((r >> 16) & 0x7f) as u32;
                (bits as u16).to_ne_bytes().to_vec()
            }
            DType::U8 => unreachable!("a batch mix has a float dtype"),
        }
    }
}

fn draw_of(kind: MixKind, lam: f64, centre: (usize, usize), (h, w): (usize, usize)) -> MixDraw {
    let (cut, label_lam) = match kind {
        MixKind::MixUp => (None, lam),
        MixKind::CutMix => {
            let (c, l) = cut_box(lam, centre.0, centre.1, h, w);
            (Some(c), l)
        }
    };
    MixDraw {
        kind,
        pick: 0,
        lam,
        label_lam,
        cut,
    }
}

#[test]
fn the_mix_kernel_is_the_cpu_mix_bit_for_bit() {
    emulator::use_emulator();
    let Some(nvrtc) = emulator::nvrtc("the_mix_kernel_is_the_cpu_mix_bit_for_bit") else {
        return;
    };
    let dev = Device::open(emulator::UUIDS[0].parse().unwrap()).unwrap();
    let kernels = AugmentKernels::load(&dev, &nvrtc, None).unwrap_or_else(|e| panic!("{e}"));
    let stream = dev.stream().unwrap();
    let (h, w) = (11, 37);
    let mut bits = Bits(0x9e37_79b9_7f4a_7c15);
    let draws = [
        (5, draw_of(MixKind::MixUp, 0.3271, (0, 0), (h, w))),
        (1, draw_of(MixKind::MixUp, 0.75, (0, 0), (h, w))),
        (5, draw_of(MixKind::CutMix, 0.41, (30, 2), (h, w))),
        (3, draw_of(MixKind::CutMix, 0.1, (3, 5), (h, w))),
        // lam 1: an empty box, nothing moves.
        (4, draw_of(MixKind::CutMix, 1.0, (10, 3), (h, w))),
    ];
    let mut launches = 0;
    for dtype in [DType::F32, DType::F16, DType::Bf16] {
        for layout in [Layout::Nchw, Layout::Nhwc] {
            for &(n, d) in &draws {
                let im = MixImages {
                    n,
                    height: h,
                    width: w,
                    dtype,
                    layout,
                };
                let bytes: Vec<u8> = (0..n * h * w * 3)
                    .flat_map(|_| bits.element(dtype))
                    .collect();
                // A sixth image past `n`: padding the mix must leave alone.
                let pad: Vec<u8> = (0..h * w * 3).flat_map(|_| bits.element(dtype)).collect();
                let buf = dev.alloc(bytes.len() + pad.len()).unwrap();
                stream.copy_to_device(&buf, 0, &bytes).unwrap();
                stream.copy_to_device(&buf, bytes.len(), &pad).unwrap();
                let batch = kernel_batch(&d, &im, buf.ptr());
                // SAFETY: `buf` holds the n images and outlives the launch (synchronised).
                unsafe { kernels.mix(&stream, &batch) }.unwrap();
                stream.synchronize().unwrap();
                let mut got = vec![0u8; bytes.len() + pad.len()];
                buf.read(&mut got).unwrap();
                let mut want = bytes.clone();
                mix_images(&d, &im, &mut want, &mut Vec::new());
                let what = format!("{dtype:?} {layout:?} {:?} n={n} {:?}", d.kind, d.cut);
                if d.cut.is_none_or(|c| c.area() > 0) && n > 1 {
                    assert_ne!(want, bytes, "{what}: the mix changed nothing");
                }
                assert!(got[..bytes.len()] == want[..], "{what}: the kernel differs");
                assert!(got[bytes.len()..] == pad[..], "{what}: the padding moved");
                launches += 1;
            }
        }
    }
    assert_eq!(launches, 30);
}

/// One served batch: labels, soft labels, each view's bytes.
type Served = (Vec<i64>, Option<Vec<f32>>, Vec<Vec<u8>>);

fn drain(socket: &Path, data: &Path, device: &str, spec: &PipelineSpec) -> Vec<Served> {
    let element = spec.dtype.size();
    let mut o = AttachOptions::new("mix", data.to_str().unwrap(), spec.clone());
    o.seed = SEED;
    o.device = device.parse().unwrap();
    o.connect_timeout = Duration::from_secs(10);
    let mut client = Client::attach(socket, o).unwrap();
    let mut out = Vec::new();
    while let Some(b) = client.next_batch().unwrap() {
        assert!(b.status().iter().all(|&s| s == 0), "a sample was not ok");
        let views = stoker_testkit::device_batches::views_to_host(&b, element);
        out.push((
            b.labels().to_vec(),
            b.soft_labels().map(<[f32]>::to_vec),
            views,
        ));
    }
    out
}

/// The emulated GPU's daemon and the CPU's (the kernels compiled once per build).
fn daemons(dir: &Path) -> (Daemon, Daemon) {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    emulator::gpu_and_cpu_daemons(dir, &cache)
}

/// The jobs compared: a choice of MixUp and CutMix over one f32 NCHW view, and MixUp over
/// two views of different sizes in f16 NHWC (the CUDA backend's CPU route fills those).
fn jobs() -> [(&'static str, PipelineSpec); 2] {
    let mixup = BatchMix::MixUp {
        alpha: 0.8,
        num_classes: CLASSES,
    };
    let choice = BatchMix::Choice {
        mixes: vec![
            mixup.clone(),
            BatchMix::CutMix {
                alpha: 1.0,
                num_classes: CLASSES,
            },
        ],
        p: None,
    };
    let base = PipelineSpec {
        epochs: Some(2),
        ..PipelineSpec::train(4, 32)
    };
    let local = local_view(16);
    [
        (
            "MixUp or CutMix, f32 NCHW",
            PipelineSpec {
                batch_mix: Some(choice),
                ..base.clone()
            },
        ),
        (
            "MixUp, two views, f16 NHWC",
            PipelineSpec {
                batch_mix: Some(mixup),
                dtype: DType::F16,
                layout: Layout::Nhwc,
                extra_views: vec![local],
                ..base
            },
        ),
    ]
}

/// The lowest PSNR over every sample of every view, `a` against `b`.
fn lowest_db(spec: &PipelineSpec, a: &[Served], b: &[Served]) -> f64 {
    let mut worst = f64::INFINITY;
    for (x, y) in a.iter().zip(b) {
        let n = x.0.len();
        for (v, (p, q)) in x.2.iter().zip(&y.2).enumerate() {
            let view = if v == 0 {
                spec.clone()
            } else {
                spec.view_spec(v)
            };
            let size = p.len() / n;
            for (s, t) in p.chunks_exact(size).zip(q.chunks_exact(size)) {
                worst = worst.min(stoker_testkit::device_batches::psnr(&view, s, t));
            }
        }
    }
    worst
}

#[test]
fn mix_jobs_on_the_emulated_gpu_are_the_cpu_backends() {
    emulator::use_emulator();
    if emulator::nvrtc("mix_jobs_on_the_emulated_gpu_are_the_cpu_backends").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    // 5 a class: batches of 4, 4 and 2.
    stoker_testkit::images::write_444_folder(&data, CLASSES, 5);
    let (gpu, cpu) = daemons(dir.path());
    // The choice's six batches draw both mixes (so both kernels' paths run).
    let choice = jobs()[0].1.batch_mix.clone().unwrap();
    let kinds: Vec<MixKind> = (0..2)
        .flat_map(|epoch| (0..3).map(move |step| (epoch, step)))
        .map(|(epoch, step)| draw(&choice, SEED, epoch, step, 32, 32).kind)
        .collect();
    assert!(
        kinds.contains(&MixKind::MixUp) && kinds.contains(&MixKind::CutMix),
        "{kinds:?}"
    );
    for (name, spec) in jobs() {
        let got = drain(gpu.socket(), &data, emulator::UUIDS[0], &spec);
        let want = drain(cpu.socket(), &data, "cpu", &spec);
        assert_eq!(got.len(), 6, "{name}: 3 batches an epoch, 2 epochs");
        assert_eq!(got[2].0.len(), 2, "{name}: a short last batch");
        for (k, (g, w)) in got.iter().zip(&want).enumerate() {
            assert_eq!(g.0, w.0, "{name}: batch {k}'s labels");
            assert!(g.1.is_some(), "{name}: batch {k} has no soft labels");
            assert_eq!(g.1, w.1, "{name}: batch {k}'s soft labels");
        }
        let db = lowest_db(&spec, &got, &want);
        assert!(db >= MIN_DB, "{name}: a sample at {db:.1} dB to the CPU's");
        eprintln!("{name}: lowest PSNR {db:.1} dB to the CPU backend");
        // The mix ran on the device: the same job unmixed is told apart.
        let plain = PipelineSpec {
            batch_mix: None,
            ..spec.clone()
        };
        let unmixed = drain(gpu.socket(), &data, emulator::UUIDS[0], &plain);
        assert!(unmixed.iter().all(|b| b.1.is_none()));
        let db = lowest_db(&spec, &got, &unmixed);
        assert!(
            db < MIN_DB,
            "{name}: the mixed batches are the unmixed ones ({db:.1} dB)"
        );
    }
}

#[test]
fn labels_past_num_classes_are_refused_on_the_gpu_by_name() {
    emulator::use_emulator();
    if emulator::nvrtc("labels_past_num_classes_are_refused_on_the_gpu_by_name").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stoker_testkit::write_image_folder(&data, 3, 2, 32);
    let (gpu, _cpu) = daemons(dir.path());
    let spec = PipelineSpec {
        epochs: Some(1),
        batch_mix: Some(BatchMix::CutMix {
            alpha: 1.0,
            num_classes: 2,
        }),
        ..PipelineSpec::train(2, 16)
    };
    let mut o = AttachOptions::new("narrow", data.to_str().unwrap(), spec);
    o.device = emulator::UUIDS[0].parse().unwrap();
    o.connect_timeout = Duration::from_secs(10);
    let e = Client::attach(gpu.socket(), o).unwrap_err().to_string();
    assert!(
        e.contains("batch_mix spreads labels over 2 classes") && e.contains("has label 2"),
        "{e}"
    );
}
