//! The real `stokerd` serving from CUDA on the emulated GPU (two devices): it says loudly that
//! the GPU is emulated; a job of 2 ranks, one per GPU, read by the Rust client from device
//! rings, gets the CPU backend's batches (indices, labels, statuses equal, pixels at PSNR >= 30
//! dB), corrupt files replaced alike, images nvJPEG refuses (arithmetic coding) and images
//! over the pixel limit decided on the CPU path as on the CPU backend; injected faults (out of memory at attach, a launch
//! failure) fail only what they hit, with the GPU and the cause named, and the broken GPU is
//! rebuilt once its ranks have left.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use stoker_testkit::emulator;

use std::path::{Path, PathBuf};
use std::time::Duration;

use stoker::{AttachOptions, Client, DType, ImageMemory, Layout, PipelineSpec};
use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder};
use stoker_testkit::batches::write_config;
use stoker_testkit::{synthetic_rgb, write_image_folder, Daemon};

/// A dataset of small synthetic JPEGs and one corrupt file.
fn dataset(dir: &Path) -> PathBuf {
    let root = dir.join("data");
    write_image_folder(&root, 2, 7, 64);
    std::fs::write(
        root.join("c0/zz_corrupt.jpg"),
        b"\xff\xd8\xff\xe0 not really",
    )
    .unwrap();
    root
}

/// The pixel limit of `two_ranks_on_two_gpus_get_the_cpu_backends_batches`' daemons: above
/// every image of [`dataset`], below the big ones of [`add_cpu_path_images`].
const MAX_PIXELS: u64 = 10_000;

/// Images the CPU path decides, several to a batch: arithmetic-coded ones (nvJPEG refuses them,
/// the CPU decodes them) and ones over [`MAX_PIXELS`] (the CPU refuses them, `too_large`).
fn add_cpu_path_images(root: &Path) {
    let mut enc = JpegEncoder::new().unwrap();
    for i in 0..6u32 {
        let (side, arithmetic) = if i % 2 == 0 { (56, true) } else { (120, false) };
        let opts = EncodeOptions {
            arithmetic,
            ..EncodeOptions::default()
        };
        let rgb = synthetic_rgb(side, side, 500 + i);
        let jpeg = enc.encode_rgb(&rgb, side, side, &opts).unwrap();
        std::fs::write(root.join(format!("c1/zz_cpu{i}.jpg")), jpeg).unwrap();
    }
}

fn options(data: &Path, job: &str, spec: &PipelineSpec, rank: u32, device: &str) -> AttachOptions {
    let mut o = AttachOptions::new(job, data.to_str().unwrap(), spec.clone());
    o.rank = rank;
    o.world_size = 2;
    o.seed = 7;
    o.device = device.parse().unwrap();
    o.connect_timeout = Duration::from_secs(10);
    o
}

/// One batch as the test compares it: pixels as f64 on the 0..255 scale.
struct Seen {
    indices: Vec<u64>,
    labels: Vec<i64>,
    status: Vec<u8>,
    pixels: Vec<f64>,
}

fn pixels(spec: &PipelineSpec, bytes: &[u8]) -> Vec<f64> {
    let n = spec.image_bytes() / 3 / spec.dtype.size();
    let channel = |i: usize| match spec.layout {
        Layout::Nchw => (i / n) % 3,
        Layout::Nhwc => i % 3,
    };
    match spec.dtype {
        DType::U8 => bytes.iter().map(|&b| f64::from(b)).collect(),
        DType::F32 => bytes
            .chunks_exact(4)
            .enumerate()
            .map(|(i, c)| {
                let v = f64::from(f32::from_ne_bytes(c.try_into().unwrap()));
                let c = channel(i);
                (v * f64::from(spec.std[c]) + f64::from(spec.mean[c])) * 255.0
            })
            .collect(),
        other => panic!("dtype {other:?} not compared here"),
    }
}

/// Every batch of the epoch for one rank.
fn drain(client: &mut Client, spec: &PipelineSpec) -> Vec<Seen> {
    let mut out = Vec::new();
    while let Some(batch) = client.next_batch().unwrap() {
        if batch.epoch() > 0 {
            break;
        }
        // Host or device images alike.
        let mut host = vec![0u8; batch.images_len()];
        batch.copy_images_to_host(&mut host).unwrap();
        out.push(Seen {
            indices: batch.indices().to_vec(),
            labels: batch.labels().to_vec(),
            status: batch.status().to_vec(),
            pixels: pixels(spec, &host),
        });
    }
    out
}

/// `stoker status` while rank `rank`'s GPU serves: marked emulated, its decode mix (the
/// synthetic JPEGs are baseline: hardware) and its ring's device memory shown.
fn check_status(socket: &Path, rank: usize) {
    let status = stoker_tool::cli::status::query(socket).unwrap();
    assert_eq!(status.backend, "cuda");
    let g = status
        .gpus
        .iter()
        .find(|g| g.uuid == emulator::UUIDS[rank])
        .unwrap();
    assert!(g.emulated && g.broken.is_none(), "{g:?}");
    assert!(
        g.decoded_hardware >= 7 && g.ring_device_bytes >= 2 << 20,
        "{g:?}"
    );
    assert!(g.batches >= 2 && g.decode_ms_per_batch > 0.0, "{g:?}");
    let text = stoker_tool::cli::status::render(&status);
    assert!(
        text.contains(&format!(
            "GPU {} (Stoker Emulated GPU {rank}) EMULATED",
            g.uuid
        )),
        "{text}"
    );
    assert!(text.contains("decode mix hardware/hybrid/cpu"), "{text}");
}

/// The per-GPU series on `/metrics`: both GPUs, marked emulated, their decode mix.
fn check_metrics(addr: &str) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap();
    write!(s, "GET /metrics HTTP/1.1\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut text = String::new();
    s.read_to_string(&mut text).unwrap();
    for uuid in emulator::UUIDS {
        for series in [
            format!(r#"stoker_gpu_decode_total{{gpu="{uuid}",path="hardware"}}"#),
            format!(r#"stoker_gpu_batches_in_flight{{gpu="{uuid}"}}"#),
            format!(r#"stoker_ring_bytes{{memory="device",gpu="{uuid}"}}"#),
            format!(r#"stoker_gpu_kernel_seconds_count{{gpu="{uuid}"}}"#),
        ] {
            assert!(text.contains(&series), "{series} missing:\n{text}");
        }
        let info = text
            .lines()
            .find(|l| l.starts_with("stoker_gpu_info") && l.contains(uuid));
        let info = info.unwrap_or_else(|| panic!("no stoker_gpu_info for {uuid}:\n{text}"));
        assert!(info.contains(r#"emulated="true""#), "{info}");
    }
}

fn psnr(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let mse = a.iter().zip(b).map(|(x, y)| (x - y).powi(2)).sum::<f64>() / a.len() as f64;
    10.0 * (255.0f64.powi(2) / mse).log10()
}

/// The emulator for this process and its daemons, NVRTC from the wheels, and the test's temp
/// dir; `None` (said loudly, a failure in CI) without the wheels.
fn setup(test: &str) -> Option<tempfile::TempDir> {
    emulator::use_emulator();
    emulator::nvrtc(test)?;
    Some(tempfile::tempdir().unwrap())
}

/// `stokerd --backend <backend>` on the emulated GPU, finding NVRTC and nvJPEG in the wheels
/// and keeping compiled kernels between runs; `env` adds to its environment (the emulator's
/// faults or configuration).
fn gpu_daemon(dir: &Path, args: &[&str], log: &Path, env: &[(&str, &str)]) -> Daemon {
    let wheels = stoker_nvidia::loader::wheel_dir().expect("wheel dir");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    Daemon::start_logged_with(dir, args, log, |cmd| {
        // Every stream operation waits first: a slot published before its kernel finished
        // would be read stale.
        cmd.env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("STOKER_EMU_OP_DELAY_US", "1000")
            .env("STOKER_NVIDIA_DIR", wheels)
            .env("STOKER_CACHE_DIR", cache)
            .envs(env.iter().copied());
    })
}

#[test]
fn two_ranks_on_two_gpus_get_the_cpu_backends_batches() {
    let Some(dir) = setup("two_ranks_on_two_gpus_get_the_cpu_backends_batches") else {
        return;
    };
    let data = dataset(dir.path());
    add_cpu_path_images(&data);
    let log = dir.path().join("stokerd.log");
    let (gpu_dir, cpu_dir) = (dir.path().join("gpu"), dir.path().join("cpu"));
    std::fs::create_dir_all(&gpu_dir).unwrap();
    std::fs::create_dir_all(&cpu_dir).unwrap();
    let config = write_config(
        dir.path(),
        &format!("[limits]\nmax_pixels = {MAX_PIXELS}\n"),
    );
    let config = config.to_str().unwrap();
    let addr = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().to_string()
    };
    let gpu = gpu_daemon(
        &gpu_dir,
        &[
            "--backend",
            "cuda",
            "--metrics-listen",
            &addr,
            "--config",
            config,
        ],
        &log,
        &[],
    );
    let cpu = Daemon::start(&cpu_dir, &["--backend", "cpu", "--config", config]);
    let u8_nhwc = PipelineSpec {
        dtype: DType::U8,
        layout: Layout::Nhwc,
        ..PipelineSpec::train(4, 32)
    };
    for (job, spec) in [("f32", PipelineSpec::train(4, 32)), ("u8", u8_nhwc)] {
        let mut ranks = Vec::new();
        for rank in 0..2u32 {
            let opts = options(&data, job, &spec, rank, emulator::UUIDS[rank as usize]);
            let client = Client::attach(gpu.socket(), opts).unwrap();
            assert_eq!(client.image_memory(), ImageMemory::Device);
            assert_eq!(client.device_ordinal(), Some(rank as i32));
            ranks.push(client);
        }
        for (rank, client) in ranks.iter_mut().enumerate() {
            let got = drain(client, &spec);
            check_status(gpu.socket(), rank);
            let opts = options(&data, job, &spec, rank as u32, "cpu");
            let want = drain(&mut Client::attach(cpu.socket(), opts).unwrap(), &spec);
            assert_eq!(got.len(), want.len(), "{job} rank {rank}: batches");
            assert!(got.len() >= 2, "{job} rank {rank}: {} batches", got.len());
            for (step, (g, w)) in got.iter().zip(&want).enumerate() {
                let at = format!("{job} rank {rank} batch {step}");
                assert_eq!(g.indices, w.indices, "{at}: indices");
                assert_eq!(g.labels, w.labels, "{at}: labels");
                assert_eq!(g.status, w.status, "{at}: statuses");
                let p = psnr(&g.pixels, &w.pixels);
                assert!(p >= emulator::MIN_BACKEND_PSNR_DB, "{at}: PSNR {p:.1} dB");
            }
        }
    }
    check_metrics(&addr);
    drop(gpu);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("THE GPU IS EMULATED"), "{text}");
    assert!(text.contains("libstoker_emu_cuda.so"), "{text}");
    assert!(text.contains("GPU opened for serving"), "{text}");
}

#[test]
fn faults_fail_only_what_they_hit_and_name_the_gpu() {
    let Some(dir) = setup("faults_fail_only_what_they_hit_and_name_the_gpu") else {
        return;
    };
    let data = dataset(dir.path());
    let log = dir.path().join("stokerd.log");
    let faults = "cuMemCreate:1:CUDA_ERROR_OUT_OF_MEMORY";
    let daemon = gpu_daemon(
        dir.path(),
        &["--backend", "cuda"],
        &log,
        &[("STOKER_EMU_FAULTS", faults)],
    );
    let spec = PipelineSpec::train(4, 16);
    let gpu0 = emulator::UUIDS[0];

    // Out of memory at attach: refused with the sizes.
    let err = Client::attach(daemon.socket(), options(&data, "a", &spec, 0, gpu0)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains(gpu0), "{text}");
    assert!(text.contains("bytes of device memory"), "{text}");
    assert!(text.contains("CUDA_ERROR_OUT_OF_MEMORY"), "{text}");

    // The other GPU serves another job meanwhile.
    let gpu1 = emulator::UUIDS[1];
    let mut b = Client::attach(daemon.socket(), options(&data, "b", &spec, 0, gpu1)).unwrap();
    assert_eq!(drain(&mut b, &spec).len(), 2);

    // The GPU whose attach ran out of memory serves the next attach.
    let mut a = Client::attach(daemon.socket(), options(&data, "a", &spec, 0, gpu0)).unwrap();
    assert_eq!(drain(&mut a, &spec).len(), 2);
}

/// A GPU without virtual memory management is refused at attach for that reason, as an
/// unsupported device (not as out of quota), while the other GPU serves.
#[test]
fn a_gpu_without_vmm_is_refused_for_that_reason() {
    let Some(dir) = setup("a_gpu_without_vmm_is_refused_for_that_reason") else {
        return;
    };
    let data = dataset(dir.path());
    let log = dir.path().join("stokerd.log");
    let [gpu0, gpu1] = emulator::UUIDS;
    let config =
        format!(r#"{{"devices": [{{"uuid": "{gpu0}", "vmm": false}}, {{"uuid": "{gpu1}"}}]}}"#);
    let env = [("STOKER_EMU_CONFIG", config.as_str())];
    let daemon = gpu_daemon(dir.path(), &["--backend", "cuda"], &log, &env);
    let spec = PipelineSpec::train(4, 16);
    let err = Client::attach(daemon.socket(), options(&data, "a", &spec, 0, gpu0)).unwrap_err();
    let text = format!("{err:?}");
    for want in ["UnsupportedDevice", gpu0, "virtual memory management"] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
    let mut b = Client::attach(daemon.socket(), options(&data, "b", &spec, 0, gpu1)).unwrap();
    assert_eq!(drain(&mut b, &spec).len(), 2);
}

/// A sticky fault (`status`) on GPU 0's first launch. NVIDIA: "To continue using CUDA, the
/// process must be terminated and relaunched", and the emulated driver keeps the context
/// broken. The rank on GPU 0 is told the cause naming the GPU; a rank served from the CPU
/// (re-attaching, as the Loader does) is drained; the daemon exits with 75; started again as
/// systemd would, it serves that rank on from its position: the batches of an uninterrupted
/// run.
fn sticky_fault_case(status: &str) {
    let dir = tempfile::tempdir().unwrap();
    let data = dataset(dir.path());
    let log = dir.path().join("stokerd.log");
    let fault = format!("cuLaunchKernel:1:{status}");
    let mut daemon = gpu_daemon(
        dir.path(),
        &["--backend", "cuda"],
        &log,
        &[("STOKER_EMU_FAULTS", &fault)],
    );
    let spec = PipelineSpec::train(4, 16);
    let gpu0 = emulator::UUIDS[0];
    let mut b_opts = options(&data, "b", &spec, 0, "cpu");
    b_opts.reattach = Some(Duration::from_secs(60));
    let mut b = Client::attach(daemon.socket(), b_opts).unwrap();
    let first = b.next_batch().unwrap().expect("a first batch");
    let mut seen = vec![(first.step(), first.indices().to_vec())];
    drop(first);
    let mut a = Client::attach(daemon.socket(), options(&data, "a", &spec, 0, gpu0)).unwrap();
    let text = (0..4)
        .find_map(|_| match a.next_batch() {
            Ok(Some(_)) => None,
            Ok(None) => Some(String::from("the epoch ended without the fault")),
            Err(e) => Some(e.to_string()),
        })
        .unwrap_or_default();
    assert!(
        text.contains(gpu0) && text.contains(status),
        "{status}: {text}"
    );
    let exit = daemon.wait_exit(Duration::from_secs(30));
    assert_eq!(
        exit.code(),
        Some(75),
        "{status}: {}",
        std::fs::read_to_string(&log).unwrap()
    );
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("must be terminated and relaunched"), "{text}");
    // Restarted as systemd would (Restart=on-failure), without the fault.
    let log2 = dir.path().join("stokerd2.log");
    let again = gpu_daemon(dir.path(), &["--backend", "cuda"], &log2, &[]);
    while let Some(batch) = b.next_batch().unwrap() {
        if batch.epoch() > 0 {
            break;
        }
        seen.push((batch.step(), batch.indices().to_vec()));
    }
    let mut reference =
        Client::attach(again.socket(), options(&data, "r", &spec, 0, "cpu")).unwrap();
    let mut want = Vec::new();
    while let Some(batch) = reference.next_batch().unwrap() {
        if batch.epoch() > 0 {
            break;
        }
        want.push((batch.step(), batch.indices().to_vec()));
    }
    assert_eq!(
        seen, want,
        "{status}: the drained rank resumes where it was"
    );
}

#[test]
fn an_illegal_address_restarts_the_daemon_and_the_other_ranks_resume() {
    if setup("an_illegal_address_restarts_the_daemon_and_the_other_ranks_resume").is_some() {
        sticky_fault_case("CUDA_ERROR_ILLEGAL_ADDRESS");
    }
}

#[test]
fn an_uncorrectable_ecc_error_restarts_the_daemon_and_the_other_ranks_resume() {
    if setup("an_uncorrectable_ecc_error_restarts_the_daemon_and_the_other_ranks_resume").is_some()
    {
        sticky_fault_case("CUDA_ERROR_ECC_UNCORRECTABLE");
    }
}

/// `CUDA_ERROR_DEVICE_UNAVAILABLE` is a device "unavailable at the current time", "often …
/// due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or CU_COMPUTEMODE_PROHIBITED", not a lost
/// one: a GPU whose compute mode prohibits contexts is refused at attach with that status,
/// and the status from a launch fails that batch's rank without restarting the daemon.
#[test]
fn a_busy_device_fails_only_what_it_hit_and_never_restarts_the_daemon() {
    let Some(dir) = setup("a_busy_device_fails_only_what_it_hit_and_never_restarts_the_daemon")
    else {
        return;
    };
    let data = dataset(dir.path());
    let log = dir.path().join("stokerd.log");
    let [gpu0, gpu1] = emulator::UUIDS;
    let config = format!(
        r#"{{"devices": [{{"uuid": "{gpu0}"}}, {{"uuid": "{gpu1}", "compute_mode": "prohibited"}}]}}"#
    );
    let fault = "cuLaunchKernel:1:CUDA_ERROR_DEVICE_UNAVAILABLE";
    let env = [
        ("STOKER_EMU_CONFIG", config.as_str()),
        ("STOKER_EMU_FAULTS", fault),
    ];
    let daemon = gpu_daemon(dir.path(), &["--backend", "cuda"], &log, &env);
    let spec = PipelineSpec::train(4, 16);
    let err = Client::attach(daemon.socket(), options(&data, "b", &spec, 0, gpu1)).unwrap_err();
    let text = format!("{err:?}");
    for want in [gpu1, "CUDA_ERROR_DEVICE_UNAVAILABLE"] {
        assert!(text.contains(want), "{want:?} missing: {text}");
    }
    let mut a = Client::attach(daemon.socket(), options(&data, "a", &spec, 0, gpu0)).unwrap();
    let text = (0..4)
        .find_map(|_| match a.next_batch() {
            Ok(Some(_)) => None,
            Ok(None) => Some(String::from("the epoch ended without the fault")),
            Err(e) => Some(e.to_string()),
        })
        .unwrap_or_default();
    assert!(text.contains("CUDA_ERROR_DEVICE_UNAVAILABLE"), "{text}");
    drop(a);
    let mut c = Client::attach(daemon.socket(), options(&data, "c", &spec, 0, gpu0))
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap()));
    assert_eq!(drain(&mut c, &spec).len(), 2);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(!text.contains("must be terminated"), "{text}");
}

#[test]
fn backend_auto_serves_from_cuda_on_the_emulated_host() {
    let Some(dir) = setup("backend_auto_serves_from_cuda_on_the_emulated_host") else {
        return;
    };
    let log = dir.path().join("stokerd.log");
    drop(gpu_daemon(dir.path(), &["--backend", "auto"], &log, &[]));
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(text.contains("backend auto: serving from CUDA"), "{text}");
    assert!(text.contains("THE GPU IS EMULATED"), "{text}");
}

use stoker_testkit::edge_manifest;

/// Images of the edge corpus the emulated nvJPEG decodes on the (hardware, hybrid) path, by
/// its rules (`nvjpegDecodeBatchedSupportedEx`, `nvjpegDecoderJpegSupported`, then the decode
/// itself), among those whose header the daemon's probe reads.
fn expected_mix(dir: &Path, names: &[String]) -> (u64, u64) {
    use stoker_nvidia::cuda::Device;
    use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegLib};
    use stoker_pipeline::transform::decode::routing::{self, is_progressive, Route};
    let dev = Device::open(emulator::UUIDS[0].parse().unwrap()).unwrap();
    let mut d = NvjpegDecoder::new(&dev, NvjpegLib::global().unwrap(), 1).unwrap();
    let stream = dev.stream().unwrap();
    let (mut hardware, mut hybrid) = (0, 0);
    for name in names {
        let jpeg = std::fs::read(dir.join(name)).unwrap();
        let (Ok(_), Ok(info)) = (
            stoker_pipeline::transform::decode::probe(&jpeg),
            d.info(&jpeg),
        ) else {
            continue;
        };
        let out = dev
            .alloc((info.width as usize * info.height as usize * 3).max(1))
            .unwrap();
        let img = DeviceImage {
            ptr: out.ptr(),
            pitch: info.width as usize * 3,
        };
        // SAFETY: `out` holds height * pitch bytes until the stream is synchronised below.
        unsafe {
            match routing::route(&mut d, &jpeg, None, true).route {
                Route::Hardware => {
                    hardware += u64::from(
                        d.decode_hardware_batch(&stream, &[&jpeg], &[None], &[img])
                            .is_ok(),
                    )
                }
                Route::Hybrid => {
                    hybrid += u64::from(
                        d.decode_hybrid(&stream, &jpeg, None, is_progressive(&jpeg), img)
                            .is_ok(),
                    )
                }
                Route::Cpu => {}
            }
        }
        stream.synchronize().unwrap();
    }
    (hardware, hybrid)
}

#[test]
fn the_decode_mix_counts_the_edge_files_on_the_paths_the_rules_say() {
    let test = "the_decode_mix_counts_the_edge_files_on_the_paths_the_rules_say";
    let edge = Path::new(env!("CARGO_MANIFEST_DIR")).join("../shared/data/edge");
    if !edge.join("MANIFEST.tsv").is_file() {
        eprintln!("SKIPPED {test}: no {}", edge.display());
        return;
    }
    let Some(dir) = setup(test) else { return };
    let data = dir.path().join("edge");
    std::fs::create_dir_all(data.join("c0")).unwrap();
    let names: Vec<String> = edge_manifest::read(&edge)
        .into_iter()
        .map(|(n, _)| n)
        .collect();
    for n in &names {
        std::fs::copy(edge.join(n), data.join("c0").join(n)).unwrap();
    }
    let (hardware, hybrid) = expected_mix(&edge, &names);
    let log = dir.path().join("stokerd.log");
    let daemon = gpu_daemon(dir.path(), &["--backend", "cuda"], &log, &[]);
    // One epoch, so nothing of a next one is decoded ahead.
    let spec = PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        ..PipelineSpec::train(8, 16)
    };
    let mut opts = options(&data, "edge", &spec, 0, emulator::UUIDS[0]);
    opts.world_size = 1;
    let mut client = Client::attach(daemon.socket(), opts).unwrap();
    let batches = drain(&mut client, &spec);
    let delivered = batches
        .iter()
        .flat_map(|b| &b.status)
        .filter(|&&s| s == 0 || s == 1)
        .count() as u64;
    let status = stoker_tool::cli::status::query(daemon.socket()).unwrap();
    let g = &status.gpus[0];
    eprintln!("edge mix: {g:?}; expected hardware {hardware}, hybrid {hybrid}");
    assert_eq!(g.decoded_hardware, hardware, "{g:?}");
    assert_eq!(g.decoded_hybrid, hybrid, "{g:?}");
    assert!(hardware > 0 && hybrid > 0 && g.decoded_cpu > 0, "{g:?}");
    // Every delivered sample was decoded once, on one path (replacements on the CPU).
    let decoded = g.decoded_hardware + g.decoded_hybrid + g.decoded_cpu;
    assert_eq!(decoded, delivered, "{g:?}");
}

#[test]
fn device_memory_counts_against_the_ring_quota() {
    let Some(dir) = setup("device_memory_counts_against_the_ring_quota") else {
        return;
    };
    let data = dataset(dir.path());
    let config = dir.path().join("stoker.toml");
    // Room for a host ring of this spec (about 50 KiB), not for a 2 MiB device allocation.
    std::fs::write(&config, "[limits]\nmax_client_ring_bytes = 1048576\n").unwrap();
    let log = dir.path().join("stokerd.log");
    let args = ["--backend", "cuda", "--config", config.to_str().unwrap()];
    let daemon = gpu_daemon(dir.path(), &args, &log, &[]);
    let spec = PipelineSpec::train(4, 16);
    let gpu0 = emulator::UUIDS[0];
    let err = Client::attach(daemon.socket(), options(&data, "q", &spec, 0, gpu0)).unwrap_err();
    let text = err.to_string();
    assert!(text.contains("limits.max_client_ring_bytes"), "{text}");
    let cpu = Client::attach(daemon.socket(), options(&data, "q", &spec, 0, "cpu")).unwrap();
    assert_eq!(cpu.image_memory(), ImageMemory::Host);
}
