//! Several views of one image on the CUDA backend (the emulated GPU): a job of 1 + 3 views
//! goes the CPU route (docs/views.md) and its device batches are the CPU backend's bit for bit,
//! every view, a corrupt file replaced alike (all of its views from the replacement). A job
//! whose view has torchvision's operations and RandomErasing runs them in the GPU's kernels
//! (`stoker_op_*`): a torchvision-reference recipe (TrivialAugmentWide + erasing), a DINO-like
//! colour recipe, erasing alone, and operations with `value="random"` erasing (its values
//! drawn per element on the host as the CPU backend draws them) match the CPU backend at 40 dB
//! or more per sample, every image decoded by nvJPEG (none by the CPU route), and a CPU job
//! with one parameter changed does not.

use std::path::Path;
use std::time::Duration;

use stoker::{AttachOptions, Client, DType, ImageMemory, PipelineSpec};
use stoker_testkit::{emulator, local_view, write_image_folder, Daemon};

fn spec() -> PipelineSpec {
    let local = local_view(16);
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        extra_views: vec![local.clone(); 3],
        ..PipelineSpec::train(4, 32)
    }
}

/// Per batch: indices, statuses, and each view's bytes.
type Seen = Vec<(Vec<u64>, Vec<u8>, Vec<Vec<u8>>)>;

fn drain(socket: &Path, data: &Path, device: &str, spec: PipelineSpec) -> Seen {
    let element = spec.dtype.size();
    let mut o = AttachOptions::new("views", data.to_str().unwrap(), spec);
    o.seed = 5;
    o.device = device.parse().unwrap();
    o.connect_timeout = Duration::from_secs(10);
    let mut client = Client::attach(socket, o).unwrap();
    let memory = if device == "cpu" {
        ImageMemory::Host
    } else {
        ImageMemory::Device
    };
    assert_eq!(client.image_memory(), memory);
    let mut out = Vec::new();
    while let Some(b) = client.next_batch().unwrap() {
        let views = stoker_testkit::device_batches::views_to_host(&b, element);
        out.push((b.indices().to_vec(), b.status().to_vec(), views));
    }
    out
}

/// The emulated GPU's daemon and the CPU's (the kernels compiled once per build).
fn daemons(dir: &Path) -> (Daemon, Daemon) {
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    emulator::gpu_and_cpu_daemons(dir, &cache)
}

#[test]
fn views_on_the_emulated_gpu_are_the_cpu_backends() {
    emulator::use_emulator();
    if emulator::nvrtc("views_on_the_emulated_gpu_are_the_cpu_backends").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 5, 48);
    std::fs::write(
        data.join("c0/zz_corrupt.jpg"),
        b"\xff\xd8\xff\xe0 not really",
    )
    .unwrap();
    let (gpu, cpu) = daemons(dir.path());
    let got = drain(gpu.socket(), &data, emulator::UUIDS[0], spec());
    let want = drain(cpu.socket(), &data, "cpu", spec());
    assert_eq!(got.len(), 3);
    assert!(got.iter().all(|b| b.2.len() == 4));
    // One sample was replaced, on both backends alike.
    let replaced = |s: &Seen| s.iter().flat_map(|b| &b.1).filter(|&&s| s == 1).count();
    assert_eq!((replaced(&got), replaced(&want)), (1, 1));
    for (step, (g, w)) in got.iter().zip(&want).enumerate() {
        assert_eq!((&g.0, &g.1), (&w.0, &w.1), "batch {step}");
        for v in 0..4 {
            assert!(g.2[v] == w.2[v], "batch {step} view {v} differs");
        }
    }
}

/// The torchvision classification reference's per-view part, and DINO's colour operations.
fn recipes() -> [(&'static str, PipelineSpec); 4] {
    use stoker::spec::{Erasing, ErasingValue, Interpolation, Op, RandomWord};
    let base = PipelineSpec {
        epochs: Some(1),
        ..PipelineSpec::train(4, 32)
    };
    let reference = PipelineSpec {
        ops: vec![Op::TrivialAugmentWide {
            num_magnitude_bins: 31,
            interpolation: Interpolation::Bilinear,
            fill: [0.0; 3],
        }],
        erasing: Some(Erasing {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Fill([0.0; 3]),
        }),
        ..base.clone()
    };
    let dino = PipelineSpec {
        ops: vec![
            Op::RandomApply {
                ops: vec![Op::ColorJitter {
                    brightness: Some([0.6, 1.4]),
                    contrast: Some([0.6, 1.4]),
                    saturation: Some([0.8, 1.2]),
                    hue: Some([-0.1, 0.1]),
                }],
                p: 0.8,
            },
            Op::RandomGrayscale { p: 0.2 },
            Op::GaussianBlur {
                kernel_size: [5, 5],
                sigma: [0.1, 2.0],
            },
            Op::RandomSolarize {
                threshold: 128.0,
                p: 0.2,
            },
        ],
        ..base.clone()
    };
    // Erasing without operations: the fused kernel into the slot, then the erasing kernel.
    let erasing = PipelineSpec {
        erasing: Some(Erasing {
            p: 0.9,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Fill([0.5, -1.0, 1.5]),
        }),
        dtype: DType::F16,
        layout: stoker::Layout::Nhwc,
        ..base.clone()
    };
    // timm's `--remode pixel`: a normal draw per erased element.
    let random = PipelineSpec {
        ops: vec![
            Op::TrivialAugmentWide {
                num_magnitude_bins: 31,
                interpolation: Interpolation::Nearest,
                fill: [0.0; 3],
            },
            Op::RandomGrayscale { p: 0.3 },
        ],
        erasing: Some(Erasing {
            p: 0.9,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Random(RandomWord::Random),
        }),
        ..base
    };
    [
        ("torchvision reference", reference),
        ("dino", dino),
        ("erasing only, f16 NHWC", erasing),
        ("random erasing after operations", random),
    ]
}

/// Each sample's image of a drained job, in order.
fn samples(seen: &Seen) -> Vec<&[u8]> {
    let mut out = Vec::new();
    for (indices, _, views) in seen {
        let size = views[0].len() / indices.len();
        out.extend(views[0].chunks_exact(size));
    }
    out
}

#[test]
fn operations_run_in_the_gpus_kernels_at_40_db_to_the_cpu_backend() {
    use stoker::spec::Op;
    emulator::use_emulator();
    let test = "operations_run_in_the_gpus_kernels_at_40_db_to_the_cpu_backend";
    if emulator::nvrtc(test).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    stoker_testkit::images::write_444_folder(&data, 2, 4);
    let (gpu, cpu) = daemons(dir.path());
    for (name, spec) in recipes() {
        let got = drain(gpu.socket(), &data, emulator::UUIDS[0], spec.clone());
        let want = drain(cpu.socket(), &data, "cpu", spec.clone());
        assert_eq!(got.len(), 2, "{name}");
        let mut worst = f64::INFINITY;
        for (g, w) in got.iter().zip(&want) {
            assert_eq!((&g.0, &g.1), (&w.0, &w.1), "{name}");
        }
        let (g, w) = (samples(&got), samples(&want));
        for (k, (a, b)) in g.iter().zip(&w).enumerate() {
            let db = stoker_testkit::device_batches::psnr(&spec, a, b);
            assert!(db >= 40.0, "{name}: sample {k} at {db:.1} dB");
            worst = worst.min(db);
        }
        eprintln!("{name}: lowest PSNR {worst:.1} dB over {} samples", g.len());
        // A wrong parameter is told apart: the same job with the solarize threshold or the
        // erasing's value changed, on the CPU.
        let mut wrong = spec.clone();
        match &mut wrong.erasing {
            Some(e) => e.value = stoker::spec::ErasingValue::Fill([2.0, -2.0, 2.0]),
            None => {
                let Some(Op::RandomApply { ops, .. }) = wrong.ops.first_mut() else {
                    unreachable!("the DINO recipe starts with RandomApply")
                };
                let Some(Op::ColorJitter { brightness, .. }) = ops.first_mut() else {
                    unreachable!("of ColorJitter")
                };
                *brightness = Some([0.2, 0.4]);
            }
        }
        let off = drain(cpu.socket(), &data, "cpu", wrong);
        let low = samples(&off)
            .iter()
            .zip(&g)
            .map(|(a, b)| stoker_testkit::device_batches::psnr(&spec, a, b))
            .filter(|&db| db < 40.0)
            .count();
        assert!(
            low >= 2,
            "{name}: a wrong parameter matched the GPU's batches"
        );
    }
    // The kernels ran: every image was decoded by nvJPEG, none by the CPU route.
    let status = stoker_tool::cli::status::query(gpu.socket()).unwrap();
    let g = &status.gpus[0];
    assert!(g.decoded_hardware >= 16 && g.decoded_cpu == 0, "{g:?}");
}
