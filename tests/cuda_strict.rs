//! The CUDA engine on the edge files a real nvJPEG got wrong (NVIDIA H200, nvJPEG 13.0.1,
//! docs/results/gpu-check-2026-11-26/selftest.txt), on the emulated GPU, which now does what
//! that library did: each file is served as the CPU backend serves it (the same per-sample
//! status, pixels at PSNR >= 25 dB), never as nvJPEG's lenient decode of a corrupt stream,
//! never as a failed rank when nvJPEG fails while decoding, never in wrong colours.
//! The same harness holds the routing as the real library routes (issue 22 item 7): progressive
//! files on nvJPEG's hybrid decoder, not the CPU; a region the hardware refuses decoded whole
//! on the hardware, the kernel cropping it.
//! The edge files are read from `../shared/data/edge` at test time (skipped loudly without).

// Test code: small sizes and pixel values chosen by the test (the cast lints are for shipped
// code).
#![allow(clippy::cast_precision_loss)]

use std::path::Path;
use std::time::Duration;

use stoker::{AttachOptions, Client, DType, PipelineSpec};
use stoker_testkit::edge_manifest::edge_dir;
use stoker_testkit::{emulator, write_image_folder, Daemon};

/// The least PSNR of one served sample against the CPU backend's. Lower than the batch-wide
/// `emulator::MIN_BACKEND_PSNR_DB`: the emulated nvJPEG upsamples chroma by replication, as
/// nvJPEG does, the CPU backend with libjpeg's filter, and one small synthetic colour image
/// alone differs by 29-38 dB; what this file catches (garbage pixels of a corrupt stream,
/// wrong colours) was at 7-15 dB before the fix.
const MIN_SAMPLE_PSNR_DB: f64 = 25.0;

/// One sample as served: its index, per-sample status and u8 pixels.
type Sample = (u64, u8, Vec<u8>);

fn spec() -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs: Some(1),
        ..PipelineSpec::train(4, 32)
    }
}

/// Every sample of one epoch for the only rank, or the error that ended the feed.
fn serve(socket: &Path, data: &Path, device: &str) -> Result<Vec<Sample>, String> {
    let mut o = AttachOptions::new("strict", data.to_str().unwrap(), spec());
    o.seed = 11;
    o.device = device.parse().unwrap();
    o.connect_timeout = Duration::from_secs(10);
    let mut client = Client::attach(socket, o).map_err(|e| e.to_string())?;
    let bytes = spec().image_bytes();
    let mut out = Vec::new();
    while let Some(batch) = client.next_batch().map_err(|e| e.to_string())? {
        if batch.epoch() > 0 {
            break;
        }
        // Host or device images alike.
        let mut host = vec![0u8; batch.images_len()];
        batch.copy_images_to_host(&mut host).unwrap();
        for (k, (&i, &s)) in batch.indices().iter().zip(batch.status()).enumerate() {
            out.push((i, s, host[k * bytes..(k + 1) * bytes].to_vec()));
        }
    }
    Ok(out)
}

fn psnr(a: &[u8], b: &[u8]) -> f64 {
    let mse = a
        .iter()
        .zip(b)
        .map(|(&x, &y)| (f64::from(x) - f64::from(y)).powi(2))
        .sum::<f64>()
        / a.len() as f64;
    10.0 * (255.0f64.powi(2) / mse.max(1e-12)).log10()
}

/// What the GPU daemon said: its log, and its GPU's decode mix (hardware, hybrid, cpu).
struct Served {
    log: String,
    mix: (u64, u64, u64),
}

/// Serves `files` of the edge corpus (and six synthetic photos) from the emulated GPU (its
/// daemon given `env`: injected faults, emulator settings) and from the CPU backend, asserts
/// every sample alike, and returns what the GPU daemon said.
fn served_as_the_cpu_serves(test: &str, files: &[&str], env: &[(&str, &str)]) -> Option<Served> {
    let edge = edge_dir(test)?;
    emulator::use_emulator();
    emulator::nvrtc(test)?;
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 3, 48);
    for f in files {
        std::fs::copy(edge.join(f), data.join("c0").join(f)).unwrap();
    }
    let (gpu_dir, cpu_dir) = (dir.path().join("gpu"), dir.path().join("cpu"));
    std::fs::create_dir_all(&gpu_dir).unwrap();
    std::fs::create_dir_all(&cpu_dir).unwrap();
    let log = dir.path().join("stokerd.log");
    let wheels = stoker_nvidia::loader::wheel_dir().expect("wheel dir");
    let cache = Path::new(env!("CARGO_TARGET_TMPDIR")).join("kernel-cache");
    let gpu = Daemon::start_logged_with(&gpu_dir, &["--backend", "cuda"], &log, |cmd| {
        cmd.env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env("STOKER_NVIDIA_DIR", &wheels)
            .env("STOKER_CACHE_DIR", &cache);
        for (k, v) in env {
            cmd.env(k, v);
        }
    });
    let cpu = Daemon::start(&cpu_dir, &["--backend", "cpu"]);
    let got = serve(gpu.socket(), &data, emulator::UUIDS[0]);
    let want = serve(cpu.socket(), &data, "cpu").unwrap();
    let mix = stoker_tool::cli::status::query(gpu.socket())
        .ok()
        .and_then(|s| s.gpus.first().cloned())
        .map_or((0, 0, 0), |g| {
            (g.decoded_hardware, g.decoded_hybrid, g.decoded_cpu)
        });
    drop(gpu);
    let text = std::fs::read_to_string(&log).unwrap_or_default();
    let got = got.unwrap_or_else(|e| panic!("{test}: the GPU's feed failed: {e}\n{text}"));
    assert_eq!(got.len(), want.len(), "{test}: samples");
    let mut names: Vec<String> = ["c0", "c1"]
        .iter()
        .flat_map(|c| std::fs::read_dir(data.join(c)).unwrap())
        .map(|e| {
            e.unwrap()
                .path()
                .strip_prefix(&data)
                .unwrap()
                .display()
                .to_string()
        })
        .collect();
    names.sort();
    let mut wrong = Vec::new();
    let name = |i: u64| {
        let i = usize::try_from(i).unwrap_or(usize::MAX);
        names.get(i).map_or("?", String::as_str)
    };
    for ((i, gs, gp), (wi, ws, wp)) in got.iter().zip(&want) {
        // A sample replaced (policy skip) carries its replacement's index.
        let db = psnr(gp, wp);
        if (i, gs) != (wi, ws) || db < MIN_SAMPLE_PSNR_DB {
            wrong.push(format!(
                "GPU: sample {i} ({}) status {gs}; CPU: sample {wi} ({}) status {ws}; \
                 PSNR {db:.1} dB",
                name(*i),
                name(*wi)
            ));
        }
    }
    assert!(wrong.is_empty(), "{test}:\n{}\n{text}", wrong.join("\n"));
    Some(Served { log: text, mix })
}

#[test]
fn corrupt_and_truncated_edge_files_are_rejected_not_served_as_garbage() {
    served_as_the_cpu_serves(
        "corrupt_and_truncated_edge_files_are_rejected_not_served_as_garbage",
        &[
            "corrupt__broken_entropy_658x97.jpg",
            "corrupt__broken_rst_1280x960.jpg",
            "trunc__progressive_1024B.jpeg",
        ],
        &[],
    );
}

#[test]
fn samplings_nvjpeg_fails_on_are_decoded_by_the_cpu_not_a_failed_rank() {
    served_as_the_cpu_serves(
        "samplings_nvjpeg_fails_on_are_decoded_by_the_cpu_not_a_failed_rank",
        &[
            "subsamp__1x3_peacock.jpeg",
            "subsamp__2x2-2x1-1x1_peacock.jpeg",
            "subsamp__4x1-2x1-2x2_peacock.jpeg",
        ],
        &[],
    );
}

#[test]
fn an_nvjpeg_execution_failure_sends_its_images_to_the_cpu() {
    // The emulated nvJPEG writes through cuLaunchHostFunc: its first call failing makes the
    // first hardware batch's decode return NVJPEG_STATUS_EXECUTION_FAILED.
    served_as_the_cpu_serves(
        "an_nvjpeg_execution_failure_sends_its_images_to_the_cpu",
        &["baseline__ljt_testorig.jpg"],
        &[(
            "STOKER_EMU_FAULTS",
            "cuLaunchHostFunc:1:CUDA_ERROR_INVALID_VALUE",
        )],
    );
}

#[test]
fn repeated_nvjpeg_failures_switch_the_hardware_decoder_off_with_a_log_line() {
    let faults: Vec<String> = (1..=12)
        .map(|n| format!("cuLaunchHostFunc:{n}:CUDA_ERROR_INVALID_VALUE"))
        .collect();
    let test = "repeated_nvjpeg_failures_switch_the_hardware_decoder_off_with_a_log_line";
    let faults = faults.join(",");
    let Some(served) = served_as_the_cpu_serves(test, &[], &[("STOKER_EMU_FAULTS", &faults)])
    else {
        return;
    };
    let log = served.log;
    assert!(
        log.contains("switching nvJPEG's hardware decoder off"),
        "{log}"
    );
}

#[test]
fn rgb_and_odd_gray_files_are_served_in_the_cpu_decoders_colours() {
    served_as_the_cpu_serves(
        "rgb_and_odd_gray_files_are_served_in_the_cpu_decoders_colours",
        &[
            "rgb__adobe0_500x333.jpg",
            "rgb__adobe0_subsampled_go.jpeg",
            "gray__blank_800x280.jpg",
            "gray__sampling_2x2_factor.jpeg",
        ],
        &[],
    );
}

#[test]
fn progressive_files_go_to_nvjpegs_hybrid_decoder_not_the_cpu() {
    // Progressive files to NVJPEG_BACKEND_HYBRID (a GPU_HYBRID decoder refuses them, as
    // nvImageCodec and DALI read it); a baseline file in one scan per component to a decoupled
    // decoder, the hardware taking single-scan baseline only (nvjpeg.h).
    let files = [
        "prog__peacock.jpeg",
        "subsamp__440_progressive_go.jpeg",
        "prog__restarts_jpegsuite.jpg",
        "subsamp__440_noninterleaved.jpg",
    ];
    let test = "progressive_files_go_to_nvjpegs_hybrid_decoder_not_the_cpu";
    let Some(served) = served_as_the_cpu_serves(test, &files, &[]) else {
        return;
    };
    let (hardware, hybrid, cpu) = served.mix;
    // The six synthetic photos are single-scan baseline files.
    assert_eq!((hardware, hybrid, cpu), (6, 4, 0), "{}", served.log);
}

#[test]
fn a_region_the_hardware_refuses_is_decoded_whole_on_the_hardware() {
    // The emulated engines refuse every region of interest; random-resized crops then decode
    // the whole image on the hardware and the kernel crops it (before: the GPU-hybrid decoder
    // took every image).
    let test = "a_region_the_hardware_refuses_is_decoded_whole_on_the_hardware";
    let roi_refused = [("STOKER_EMU_NVJPEG_HARDWARE_ROI", "0")];
    let Some(served) =
        served_as_the_cpu_serves(test, &["baseline__ljt_testorig.jpg"], &roi_refused)
    else {
        return;
    };
    assert_eq!(served.mix, (7, 0, 0), "{}", served.log);
}

#[test]
fn every_upload_of_a_served_batch_comes_from_pinned_memory() {
    // The per-sample parameters and the CPU path's images (the RGB file's, by its header) are
    // uploaded with cuMemcpyHtoDAsync; from pageable memory the driver may make that copy wait
    // for the stream (driver API, "API synchronization behavior"), so the engine stages them in
    // pinned memory. The emulated driver counts asynchronous uploads by their source's memory.
    let test = "every_upload_of_a_served_batch_comes_from_pinned_memory";
    let stats = tempfile::tempdir().unwrap();
    let dir = stats.path().to_str().unwrap();
    let files = ["rgb__adobe0_500x333.jpg", "baseline__ljt_testorig.jpg"];
    let Some(served) = served_as_the_cpu_serves(test, &files, &[("STOKER_EMU_STATS_DIR", dir)])
    else {
        return;
    };
    let (_, _, cpu) = served.mix;
    assert!(cpu >= 1, "a CPU-path image was served: {:?}", served.mix);
    let files: Vec<_> = std::fs::read_dir(stats.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "json"))
        // The emulated nvJPEG's record beside it (`<pid>.nvjpeg.json`) is not the driver's.
        .filter(|p| !p.to_string_lossy().ends_with(".nvjpeg.json"))
        .collect();
    assert_eq!(files.len(), 1, "the GPU daemon's stats only: {files:?}");
    let text = std::fs::read_to_string(&files[0]).unwrap();
    let count = |key: &str| -> u64 {
        let at = text.find(&format!("\"{key}\": ")).unwrap() + key.len() + 4;
        let digits: String = text[at..]
            .chars()
            .take_while(char::is_ascii_digit)
            .collect();
        digits.parse().unwrap()
    };
    assert_eq!(count("async_uploads_pageable"), 0, "{text}");
    // Two batches of parameters at least, and the CPU-path image.
    assert!(count("async_uploads_pinned") >= 3, "{text}");
}
