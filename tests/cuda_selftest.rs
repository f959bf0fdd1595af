//! `stoker selftest --gpu` (the real binary) on the emulated GPU of tests/gpu-emulator, with
//! small JPEGs and an edge folder this test makes: every check of both emulated GPUs passes
//! (nvJPEG vs the CPU decoder, the kernel for every dtype and layout, a ring read by a second
//! process) and the output says the GPU is emulated; an edge file the manifest wrongly says
//! must decode fails the run, naming the file; without a GPU it fails with the reason.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use stoker_testkit::emulator;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use stoker_pipeline::transform::decode::{EncodeOptions, JpegEncoder, Subsampling};
use stoker_testkit::synthetic_rgb;

fn stoker() -> Command {
    let mut cmd = Command::new(stoker_testkit::stokerd_path().with_file_name("stoker"));
    cmd.env("NO_COLOR", "1");
    cmd
}

fn encode(w: u32, h: u32, seed: u32, subsampling: Subsampling, progressive: bool) -> Vec<u8> {
    let opts = EncodeOptions {
        quality: 92,
        subsampling,
        progressive,
        restart_rows: 0,
        arithmetic: false,
    };
    JpegEncoder::new()
        .and_then(|mut e| e.encode_rgb(&synthetic_rgb(w, h, seed), w, h, &opts))
        .unwrap()
}

/// Six photos of a few sizes and samplings, one progressive.
fn write_photos(dir: &Path) {
    std::fs::create_dir_all(dir).unwrap();
    let kinds = [
        (Subsampling::S420, false),
        (Subsampling::S444, false),
        (Subsampling::S422, false),
        (Subsampling::Gray, false),
        (Subsampling::S420, true),
        (Subsampling::S444, false),
    ];
    for (i, (sub, prog)) in kinds.into_iter().enumerate() {
        let (w, h) = (40 + 13 * i as u32, 30 + 7 * i as u32);
        std::fs::write(
            dir.join(format!("p{i}.jpg")),
            encode(w, h, i as u32, sub, prog),
        )
        .unwrap();
    }
}

/// An edge folder: `(file, bytes, expected)` rows and their MANIFEST.tsv.
fn write_edge(dir: &Path, rows: &[(&str, Vec<u8>, &str)]) {
    std::fs::create_dir_all(dir).unwrap();
    let mut manifest = String::from("file\texercises\texpected\n");
    for (name, bytes, expected) in rows {
        std::fs::write(dir.join(name), bytes).unwrap();
        manifest += &format!("{name}\ttest\t{expected}\n");
    }
    std::fs::write(dir.join("MANIFEST.tsv"), manifest).unwrap();
}

fn edge_rows() -> Vec<(&'static str, Vec<u8>, &'static str)> {
    let baseline = encode(64, 48, 7, Subsampling::S420, false);
    let truncated = baseline[..baseline.len() / 2].to_vec();
    vec![
        ("baseline.jpg", baseline, "decode OK"),
        (
            "progressive.jpg",
            encode(50, 40, 8, Subsampling::S420, true),
            "decode OK",
        ),
        (
            "truncated.jpg",
            truncated,
            "must be rejected with a clear error",
        ),
        (
            "notjpeg.jpg",
            b"GIF89a: not a jpeg at all".to_vec(),
            "must be rejected with a clear error",
        ),
    ]
}

fn run(dir: &Path, photos: &Path, edge: &Path, json: &Path) -> Output {
    stoker()
        .args(["selftest", "--gpu", "--kernel-size", "32"])
        .arg("--photos")
        .arg(photos)
        .arg("--edge")
        .arg(edge)
        .arg("--json")
        .arg(json)
        .env("STOKER_CACHE_DIR", dir.join("cache"))
        .output()
        .unwrap()
}

/// A temp dir holding the self-test's inputs: the photos and the edge corpus.
struct Inputs {
    dir: tempfile::TempDir,
    photos: PathBuf,
    edge: PathBuf,
}

/// The emulator for this process and the self-test's inputs, once NVRTC is found in the
/// wheels (`None`, said loudly, without them).
fn inputs(test: &str) -> Option<Inputs> {
    emulator::nvrtc(test)?;
    emulator::use_emulator();
    let dir = tempfile::tempdir().unwrap();
    let (photos, edge) = (dir.path().join("photos"), dir.path().join("edge"));
    write_photos(&photos);
    write_edge(&edge, &edge_rows());
    Some(Inputs { dir, photos, edge })
}

#[test]
fn selftest_passes_on_both_emulated_gpus_and_fails_a_wrong_manifest() {
    let Some(Inputs { dir, photos, edge }) = inputs("selftest_passes_on_both_emulated_gpus") else {
        return;
    };
    let json = dir.path().join("selftest.json");
    let out = run(dir.path(), &photos, &edge, &json);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(stdout.starts_with("THE GPU IS EMULATED"), "{stdout}");
    assert!(
        stdout.contains("selftest: PASS (24 checks) on the EMULATED GPU"),
        "{stdout}"
    );
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(report["result"], "pass");
    assert!(report["emulated"]
        .as_str()
        .unwrap()
        .ends_with("libstoker_emu_cuda.so"));
    let gpus: Vec<&str> = report["gpus"]
        .as_array()
        .unwrap()
        .iter()
        .map(|g| g["uuid"].as_str().unwrap())
        .collect();
    assert_eq!(gpus, emulator::UUIDS);
    let checks = report["checks"].as_array().unwrap();
    for uuid in emulator::UUIDS {
        let names: Vec<&str> = checks
            .iter()
            .filter(|c| c["gpu"] == uuid)
            .map(|c| c["name"].as_str().unwrap())
            .collect();
        for want in [
            "nvJPEG vs CPU decoder: 6 photos",
            "nvJPEG vs CPU decoder: edge files",
            "kernel: stoker_augment u8 nchw vs reference",
            "kernel: stoker_augment bf16 nhwc vs reference",
            "kernel: stoker_augment f32 nhwc vs reference",
            "ring: VMM fd read by a second process",
        ] {
            assert!(names.contains(&want), "{uuid}: {want} in {names:?}");
        }
    }
    // The photos went down both nvJPEG paths; the edge files down all three (the truncated
    // file to the engines, which find it bad).
    assert!(stdout.contains("hardware 5 / hybrid 1 / cpu 0"), "{stdout}");
    assert!(stdout.contains("hardware 2 / hybrid 1 / cpu 1"), "{stdout}");

    // A manifest claiming the PNG must decode makes the self-test fail, naming the file.
    let mut rows = edge_rows();
    rows[3].2 = "decode OK";
    let wrong = dir.path().join("wrong-edge");
    write_edge(&wrong, &rows);
    let out = run(dir.path(), &photos, &wrong, &json);
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}");
    assert!(
        stdout.contains("selftest: FAIL (2 of 24 checks failed)"),
        "{stdout}"
    );
    assert!(
        stdout.contains("notjpeg.jpg: must decode, refused by nvJPEG and the CPU (unknown_format)"),
        "{stdout}"
    );
}

#[test]
fn selftest_without_a_gpu_fails_with_the_reason() {
    let dir = tempfile::tempdir().unwrap();
    let out = stoker()
        .args(["selftest", "--gpu"])
        .env("STOKER_LIBCUDA", dir.path().join("no-libcuda.so.1"))
        .env_remove("STOKER_GPU_EMULATOR")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stdout}\n{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    assert!(stdout.contains("CUDA driver"), "{stdout}");
    assert!(stdout.contains("no-libcuda.so.1"), "{stdout}");
    assert!(stdout.contains("selftest: FAIL"), "{stdout}");
}

/// `scripts/gpu-check --emulated`: the self-test, the data step, the GPU benchmark and the
/// peers (nvImageCodec and DALI in dry run) in one run, every output in the folder it is
/// given, and the summary table last, saying EMULATED, with the peers' ratio rows.
#[test]
fn gpu_check_runs_everything_on_the_emulator_and_writes_its_folder() {
    let Some(Inputs { dir, photos, edge }) = inputs("gpu_check_runs_everything_on_the_emulator")
    else {
        return;
    };
    let out = dir.path().join("results");
    let stoker = stoker_testkit::stokerd_path().with_file_name("stoker");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("scripts/gpu-check");
    let run = Command::new(script)
        .arg("--emulated")
        .arg("--stoker")
        .arg(&stoker)
        .arg("--photos")
        .arg(&photos)
        .arg("--edge")
        .arg(&edge)
        .arg("--peers")
        .arg(Path::new(env!("CARGO_MANIFEST_DIR")).join("python/stoker/peers"))
        .args([
            "--batch",
            "4",
            "--min-seconds",
            "0",
            "--imagenet-count",
            "8",
        ])
        .arg("--out")
        .arg(&out)
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&run.stdout);
    let stderr = String::from_utf8_lossy(&run.stderr);
    assert_eq!(run.status.code(), Some(0), "{stdout}\n{stderr}");
    for file in [
        "environment.txt",
        "selftest.txt",
        "selftest.json",
        "bench.txt",
        "bench.json",
        "peer.txt",
        "data.txt",
        "bench-prog10.txt",
        "engines.txt",
        "engines.json",
        "engines-blocking-sync.json",
        "engines-pinned-inputs.json",
        "bench-blocking-sync.json",
        "bench-pinned-inputs.json",
        "split.txt",
        "split.json",
        "peer-nvimagecodec.txt",
        "peer-nvimagecodec.json",
        "peer-dali.txt",
        "peer-dali.json",
        "train.txt",
        "sanitizer.txt",
        "checklist.txt",
        "summary.txt",
    ] {
        assert!(out.join(file).is_file(), "{file} missing: {stdout}");
    }
    // The first-GPU-run checklist: an answer per item, the emulator's and said to be.
    let checklist = std::fs::read_to_string(out.join("checklist.txt")).unwrap();
    assert!(checklist.contains("EMULATED GPU"), "{checklist}");
    let answer = |item: &str| {
        checklist
            .lines()
            .find(|l| l.starts_with(item))
            .unwrap_or_else(|| panic!("no item {item:?} in {checklist}"))[72..]
            .trim()
            .to_string()
    };
    assert_eq!(answer("1. hardware decoder engines x cores"), "7 x 1");
    assert!(
        answer("3. hardware ROI support").contains("asked"),
        "{checklist}"
    );
    assert!(
        answer("4. which decoder").starts_with("hardware "),
        "{checklist}"
    );
    assert_eq!(
        answer("7. compute-sanitizer"),
        "not run: the GPU is emulated"
    );
    for n in 1..=10 {
        assert!(
            checklist.contains(&format!("\n{n}. ")),
            "item {n}: {checklist}"
        );
    }
    let summary = std::fs::read_to_string(out.join("summary.txt")).unwrap();
    assert!(stdout.ends_with(&format!("{summary}outputs in {}\n", out.display())));
    let row = |name: &str| {
        summary
            .lines()
            .find(|l| l.starts_with(name))
            .unwrap_or_else(|| panic!("no row {name:?} in {summary}"))[50..]
            .trim()
            .to_string()
    };
    assert!(
        summary.starts_with("stoker gpu-check summary (EMULATED GPU"),
        "{summary}"
    );
    assert_eq!(row("self-test"), "PASSED (24 checks)");
    assert_eq!(
        row("decode mix of the files (hardware / hybrid / cpu)"),
        "5 / 1 / 0"
    );
    assert!(
        row("hardware decoder ceiling, images/s")
            .parse::<f64>()
            .unwrap()
            > 0.0
    );
    // The engines with batches in flight, whole and regions; no NVML on the emulated GPU.
    let engines = row("engines whole: TxS images/s (NVJPG)");
    assert!(
        engines.starts_with("1x1 ") && engines.contains(" / 2x2 "),
        "{summary}"
    );
    assert!(engines.contains("(n/a)"), "{summary}");
    assert!(row("engines regions: TxS images/s (NVJPG)").starts_with("1x1 "));
    // The host-CPU A/B ran both switches on the engines and end to end.
    for ab in ["blocking-sync", "pinned-inputs"] {
        let engines = row(&format!("A/B {ab}: engines 2x2 CPU-s/1000"));
        assert!(
            engines.starts_with("whole ") && engines.contains(" -> "),
            "{summary}"
        );
        let e2e = row(&format!("A/B {ab}: end to end CPU-s/1000"));
        assert!(!e2e.contains("n/a"), "{summary}");
    }
    // The split decode ran end to end at shares 1, 0.65 and 0: a ratio and a suggested share.
    let split = row("split: best share / engines only (pays > 1)");
    assert!(
        split.contains("x at share ") && split.contains("suggested share 0."),
        "{summary}"
    );
    let report: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(out.join("bench-blocking-sync.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(report["context_flags"], 4, "CU_CTX_SCHED_BLOCKING_SYNC");
    // No torchvision with CUDA on the emulated host: the peer row says why.
    assert!(row("torchvision GPU decode (peer)").starts_with("not available: "));
    assert_eq!(row("stoker / torchvision (goal >= 2x)"), "n/a");
    // nvImageCodec and DALI ran in dry run: their configurations checked, nothing timed.
    assert_eq!(
        row("DALI GPU (peer, best run), images/s"),
        "dry run (4 configurations checked, not timed): the GPU is emulated"
    );
    assert_eq!(
        row("nvImageCodec (peer, best run), images/s"),
        "dry run (3 configurations checked, not timed): the GPU is emulated"
    );
    assert_eq!(row("stoker / DALI GPU (goal >= 1.2x)"), "n/a");
    assert_eq!(row("stoker / nvImageCodec"), "n/a");
    assert_eq!(row("CPU-seconds per 1000 images, DALI GPU"), "n/a");
    assert_eq!(
        row("ResNet-50 training loop"),
        "not run: the GPU is emulated"
    );
    let dali = std::fs::read_to_string(out.join("peer-dali.txt")).unwrap();
    assert!(
        dali.contains("would run: DALI gpu hw_decoder_load=0.65 threads=8 batch=4"),
        "{dali}"
    );
    let peer: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("peer-dali.json")).unwrap())
            .unwrap();
    assert_eq!(peer["dry_run"].as_bool(), Some(true));
    // stokerd --backend cuda served a separate client process from the emulated GPU.
    let e2e = row("stoker end to end, images/s");
    assert!(e2e.parse::<f64>().is_ok_and(|r| r > 0.0), "{e2e}\n{stdout}");
    let fraction = row("fraction of the hardware decoder ceiling");
    assert!(fraction.parse::<f64>().is_ok_and(|f| f > 0.0), "{fraction}");
    assert!(row("CPU-seconds per 1000 images, end to end")
        .parse::<f64>()
        .is_ok());
    let bench: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(out.join("bench.json")).unwrap()).unwrap();
    let mix = &bench["end_to_end"]["mix"];
    let decoded = ["hardware", "hybrid", "cpu"].map(|k| mix[k].as_u64().unwrap());
    // Every image the client received was decoded on a path the daemon counted: 5 baseline
    // photos on the engines and the progressive one on the hybrid decoder, each epoch.
    assert!(
        decoded[0] > 0 && decoded[0] == 5 * decoded[1] && decoded[2] == 0,
        "{mix}"
    );
    let served = row("decode mix served (hardware / hybrid / cpu)");
    assert_eq!(served, format!("{} / {} / 0", decoded[0], decoded[1]));
}
