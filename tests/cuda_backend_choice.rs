//! `stokerd --backend auto|cuda` against what the host has (the real binary): without a GPU,
//! `cuda` exits with status 78 and the reason (no panic) and `auto` serves from the CPU,
//! saying why (the reason in its log, `stoker status` showing cpu). The host is made GPU-less
//! whatever it has (no libcuda, or a stub one). `auto` serving from CUDA on the emulated host
//! is tests/cuda_daemon.rs's.

use stoker_testkit::emulator;

use std::path::Path;
use std::process::{Command, Output};

use stoker_testkit::Daemon;

/// A host without a GPU, two ways: no libcuda at all, and the emulator's libcuda without its
/// gate (a stub library, as a container without the driver mounted has).
fn without_gpu(cmd: &mut Command, dir: &Path, stub: bool) {
    let lib = if stub {
        emulator::built_library("stoker_emu_cuda")
    } else {
        dir.join("no-libcuda.so.1")
    };
    cmd.env("STOKER_LIBCUDA", lib)
        .env_remove("STOKER_GPU_EMULATOR")
        .env_remove("CUDA_VISIBLE_DEVICES");
}

#[test]
fn cuda_without_a_gpu_exits_with_the_reason() {
    for stub in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let mut cmd = Command::new(stoker_testkit::stokerd_path());
        cmd.arg("--socket")
            .arg(dir.path().join("s.sock"))
            .args(["--backend", "cuda"])
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1");
        without_gpu(&mut cmd, dir.path(), stub);
        let out = cmd.output().unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(78), "stub {stub}: {stderr}");
        assert!(!stderr.contains("panicked"), "{stderr}");
        let last = stderr.lines().last().unwrap_or_default();
        assert!(
            last.contains("--backend cuda: no usable GPU here"),
            "stub {stub}: the reason is the last line: {stderr}"
        );
        let why = if stub {
            "CUDA_ERROR_STUB_LIBRARY"
        } else {
            "no-libcuda.so.1"
        };
        assert!(last.contains(why), "stub {stub}: {last}");
        assert!(!dir.path().join("s.sock").exists(), "it never listened");
    }
}

#[test]
fn auto_without_a_gpu_serves_from_the_cpu_and_says_why() {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged_with(dir.path(), &["--backend", "auto"], &log, |cmd| {
        without_gpu(cmd, dir.path(), false)
    });
    let status = Command::new(stoker_testkit::stokerd_path().with_file_name("stoker"))
        .args(["status", "--json", "--socket"])
        .arg(daemon.socket())
        .output()
        .unwrap();
    drop(daemon);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("backend auto: the cuda backend is unavailable; serving from the CPU"),
        "{text}"
    );
    assert!(
        text.contains("no-libcuda.so.1"),
        "the reason is logged: {text}"
    );
    let json: serde_json::Value = serde_json::from_slice(&status.stdout)
        .unwrap_or_else(|e| panic!("{e}: {}", String::from_utf8_lossy(&status.stdout)));
    assert_eq!(json["backend"], "cpu", "{json}");
}

/// A host whose every GPU lacks what stoker's rings need (here POSIX-fd handles, on the
/// emulated GPU) is a host without a usable GPU: `--backend cuda` exits 78 naming each GPU and
/// the missing capability, instead of serving and refusing every attach.
#[test]
fn cuda_with_only_unsupported_gpus_exits_with_the_reason() {
    emulator::use_emulator();
    if emulator::nvrtc("cuda_with_only_unsupported_gpus_exits_with_the_reason").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let [gpu0, gpu1] = emulator::UUIDS;
    let config = format!(
        r#"{{"devices": [{{"uuid": "{gpu0}", "posix_fd": false}}, {{"uuid": "{gpu1}", "posix_fd": false}}]}}"#
    );
    let out = stoker_testkit::child::output_within(
        Command::new(stoker_testkit::stokerd_path())
            .arg("--socket")
            .arg(dir.path().join("s.sock"))
            .args(["--backend", "cuda"])
            .env("NO_COLOR", "1")
            .env("STOKER_EMU_CONFIG", config)
            .env(
                "STOKER_NVIDIA_DIR",
                stoker_nvidia::loader::wheel_dir().unwrap(),
            ),
        std::time::Duration::from_secs(60),
        "stokerd serving from GPUs it cannot share rings on",
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    for want in [
        "no GPU here is supported",
        gpu0,
        gpu1,
        "POSIX file descriptor",
    ] {
        assert!(
            last.contains(want),
            "{want:?} missing from the last line: {stderr}"
        );
    }
}

/// The emulated host with a driver that runs CUDA 12.8 (an R570 driver): `--backend cuda`
/// with `env` added, its output within 30 s (a daemon that serves instead is killed then).
fn cuda_on_driver_12(dir: &Path, backend: &str, env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut cmd = Command::new(stoker_testkit::stokerd_path());
    cmd.arg("--socket")
        .arg(dir.join("s.sock"))
        .args(["--backend", backend])
        .env("NO_COLOR", "1")
        .env("RUST_LOG", "info")
        .env("STOKER_CACHE_DIR", dir.join("cache"))
        .env("STOKER_EMU_CONFIG", r#"{"driver_version": 12080}"#)
        .env(
            "STOKER_NVIDIA_DIR",
            stoker_nvidia::loader::wheel_dir().unwrap(),
        )
        .envs(env.iter().copied());
    stoker_testkit::child::output_within(
        &mut cmd,
        std::time::Duration::from_secs(30),
        "stokerd --backend cuda on a driver older than its libraries",
    )
}

/// NVRTC 13 and nvJPEG 13 (the wheels CI installs, and the emulated nvJPEG's default) on a
/// driver that runs CUDA 12.8: NVIDIA's compatibility table says CUDA 13 needs driver 580, and
/// the emulated driver refuses their cubins and handles as a real one does. `--backend cuda`
/// exits 78 naming the versions and what to install; `auto` serves from the CPU saying so.
#[test]
fn a_driver_older_than_the_libraries_is_no_cuda_host_and_the_versions_are_named() {
    emulator::use_emulator();
    let test = "a_driver_older_than_the_libraries_is_no_cuda_host_and_the_versions_are_named";
    if emulator::nvrtc(test).is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let out = cuda_on_driver_12(dir.path(), "cuda", &[]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    for want in [
        "--backend cuda: no usable GPU here",
        "NVRTC 13.",
        "is CUDA 13, which needs a driver that runs CUDA 13 (driver 580 or newer)",
        "this driver runs CUDA 12.8",
        "scripts/cuda-wheels",
    ] {
        assert!(
            last.contains(want),
            "{want:?} missing from the last line: {stderr}"
        );
    }
    let log = dir.path().join("auto.log");
    let wheels = stoker_nvidia::loader::wheel_dir().unwrap();
    let daemon = Daemon::start_logged_with(dir.path(), &["--backend", "auto"], &log, |cmd| {
        cmd.env("STOKER_EMU_CONFIG", r#"{"driver_version": 12080}"#)
            .env("STOKER_NVIDIA_DIR", wheels);
    });
    drop(daemon);
    let text = std::fs::read_to_string(&log).unwrap();
    assert!(
        text.contains("backend auto: the cuda backend is unavailable; serving from the CPU"),
        "{text}"
    );
    assert!(text.contains("this driver runs CUDA 12.8"), "{text}");
}

/// The check behind `auto` and `cuda` loads a cubin on the GPU, not only the libraries: a
/// driver that refuses the cubin (here an injected `CUDA_ERROR_INVALID_IMAGE` on both GPUs)
/// makes `--backend cuda` exit 78 naming the NVRTC and the driver.
#[test]
fn a_gpu_that_refuses_the_cubin_fails_the_check() {
    emulator::use_emulator();
    if emulator::nvrtc("a_gpu_that_refuses_the_cubin_fails_the_check").is_none() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let faults =
        "cuModuleLoadData:1:CUDA_ERROR_INVALID_IMAGE,cuModuleLoadData:2:CUDA_ERROR_INVALID_IMAGE";
    let out = cuda_on_driver_12(
        dir.path(),
        "cuda",
        &[
            ("STOKER_EMU_CONFIG", "{}".as_ref()),
            ("STOKER_EMU_FAULTS", faults.as_ref()),
        ],
    );
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(78), "{stderr}");
    let last = stderr.lines().last().unwrap_or_default();
    for want in [
        "no GPU passed the check",
        "the driver (CUDA 13.0) does not load a cubin built by NVRTC 13.",
        "CUDA_ERROR_INVALID_IMAGE",
        emulator::UUIDS[0],
        emulator::UUIDS[1],
    ] {
        assert!(
            last.contains(want),
            "{want:?} missing from the last line: {stderr}"
        );
    }
}

/// A wheel tree holding both majors of each library, CUDA 13 first in the search order: NVRTC
/// 13 (the CUDA 13 wheel's file) and 12 (the CUDA 12 wheel's folder), and the emulated nvJPEG
/// as `libnvjpeg.so.13` and `libnvjpeg.so.12` (it reports the major of its soname).
fn two_majors_tree(root: &Path, cu12: &Path) {
    let cu13 = root.join("nvidia/cu13/lib");
    let nvjpeg12 = root.join("nvidia/nvjpeg/lib");
    std::fs::create_dir_all(&cu13).unwrap();
    std::fs::create_dir_all(&nvjpeg12).unwrap();
    // NVRTC 13 and its builtins (which it finds beside the name it was loaded by).
    let wheel13 = stoker_nvidia::loader::wheel_dir()
        .unwrap()
        .join("nvidia/cu13/lib");
    for entry in std::fs::read_dir(&wheel13).unwrap() {
        let name = entry.unwrap().file_name();
        if name.to_string_lossy().starts_with("libnvrtc") {
            std::os::unix::fs::symlink(wheel13.join(&name), cu13.join(&name)).unwrap();
        }
    }
    std::os::unix::fs::symlink(
        cu12.join("nvidia/cuda_nvrtc"),
        root.join("nvidia/cuda_nvrtc"),
    )
    .unwrap();
    // Copies, not links: the loader opens one file once, whatever the name.
    let emu = emulator::built_library("stoker_emu_nvjpeg");
    std::fs::copy(&emu, cu13.join("libnvjpeg.so.13")).unwrap();
    std::fs::copy(&emu, nvjpeg12.join("libnvjpeg.so.12")).unwrap();
}

/// On a driver that runs CUDA 12.8 with both majors installed, the daemon takes NVRTC 12 and
/// nvJPEG 12 (CUDA 13's are first in the search order and would be taken before), says which,
/// and serves a rank from the GPU.
#[test]
fn on_a_cuda_12_driver_the_cuda_12_libraries_serve() {
    emulator::use_emulator();
    let test = "on_a_cuda_12_driver_the_cuda_12_libraries_serve";
    if emulator::nvrtc(test).is_none() {
        return;
    }
    let Some(cu12) = emulator::cuda12_wheels(test) else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let tree = dir.path().join("wheels");
    two_majors_tree(&tree, &cu12);
    let data = dir.path().join("data");
    stoker_testkit::write_image_folder(&data, 2, 4, 48);
    let log = dir.path().join("stokerd.log");
    let daemon = Daemon::start_logged_with(dir.path(), &["--backend", "cuda"], &log, |cmd| {
        cmd.env("STOKER_EMU_CONFIG", r#"{"driver_version": 12080}"#)
            .env("STOKER_NVIDIA_DIR", &tree)
            .env("STOKER_CACHE_DIR", dir.path().join("cache"))
            .env("RUST_LOG", "info")
            .env("NO_COLOR", "1")
            .env_remove("STOKER_NVJPEG")
            .env_remove("STOKER_NVRTC");
    });
    let spec = stoker::PipelineSpec::train(4, 16);
    let mut opts = stoker::AttachOptions::new("j", data.to_str().unwrap(), spec);
    opts.device = emulator::UUIDS[0].parse().unwrap();
    opts.connect_timeout = std::time::Duration::from_secs(10);
    let mut client = stoker::Client::attach(daemon.socket(), opts)
        .unwrap_or_else(|e| panic!("{e}: {}", std::fs::read_to_string(&log).unwrap()));
    let batch = client.next_batch().unwrap().expect("a batch");
    assert_eq!(batch.status(), [0u8; 4], "every image decoded");
    drop((batch, client, daemon));
    let text = std::fs::read_to_string(&log).unwrap();
    let chosen = text
        .lines()
        .find(|l| l.contains("CUDA libraries chosen for the driver"))
        .unwrap_or_else(|| panic!("no line naming the libraries: {text}"));
    for want in ["libnvrtc.so.12", "libnvjpeg.so.12", "driver=12.8"] {
        assert!(chosen.contains(want), "{want:?} missing: {chosen}");
    }
}
