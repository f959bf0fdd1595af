//! `stokerd --backend auto|cuda` against what the host has (the real binary): without a GPU,
//! `cuda` exits with status 78 and the reason (no panic) and `auto` serves from the CPU,
//! saying why (the reason in its log, `stoker status` showing cpu). The host is made GPU-less
//! whatever it has (no libcuda, or a stub one). `auto` serving from CUDA on the emulated host
//! is tests/cuda_daemon.rs's.

use stoker_testkit::emulator;

use std::path::Path;
use std::process::Command;

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
