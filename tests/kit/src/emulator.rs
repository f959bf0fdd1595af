//! Running `stoker_kernels`' real CUDA code on the emulated GPU (tests/gpu-emulator): the
//! emulated libcuda and libnvjpeg are loaded through the same run-time loading path a GPU host
//! uses (`STOKER_LIBCUDA`, `STOKER_NVJPEG`), with `STOKER_GPU_EMULATOR=1`.

#![forbid(unsafe_code)]

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Once;

use crate::Daemon;
use stoker_nvidia::loader;
use stoker_nvidia::nvrtc::Nvrtc;

/// The default emulated machine: two sm_90 devices with these UUIDs.
pub const UUIDS: [&str; 2] = [
    "GPU-57e0e3c0-0000-4000-8000-000000000000",
    "GPU-57e0e3c0-0000-4000-8000-000000000001",
];

/// The least PSNR between a batch served from the (emulated) GPU and the CPU backend's batch for
/// the same (seed, epoch, step). nvJPEG upsamples chroma by replication and the CPU decoder with
/// libjpeg's triangle filter (docs/cuda.md, "First GPU run": 35-63 dB on whole photos, and the
/// emulator does as the GPU did); a wrong image, a race or a stale slot is far below.
pub const MIN_BACKEND_PSNR_DB: f64 = 30.0;

/// `lib<name>.so` as cargo built it beside this test (a dev-dependency of `stoker-kernels`).
pub fn built_library(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let file = format!("lib{name}.so");
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join(&file))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("{file} not found beside {}", exe.display()))
}

/// Points the loaders at the emulator (before anything loads a driver in this process).
pub fn use_emulator() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        std::env::set_var("STOKER_GPU_EMULATOR", "1");
        std::env::set_var("STOKER_LIBCUDA", built_library("stoker_emu_cuda"));
        std::env::set_var("STOKER_NVJPEG", built_library("stoker_emu_nvjpeg"));
        std::env::remove_var("STOKER_EMU_CONFIG");
        std::env::remove_var("STOKER_EMU_FAULTS");
        std::env::remove_var("CUDA_VISIBLE_DEVICES");
    });
}

/// NVRTC from the PyPI wheel, or `None` said loudly (a failure when `CI` is set).
pub fn nvrtc(test: &str) -> Option<Nvrtc> {
    let root = loader::wheel_dir().filter(|r| r.join("nvidia").is_dir());
    let Some(root) = root else {
        let msg = format!("{test}: NVIDIA wheels not found (run scripts/cuda-wheels)");
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        let _ = writeln!(std::io::stderr(), "SKIPPED {msg}");
        return None;
    };
    Some(Nvrtc::load_from_wheel(&root).unwrap_or_else(|e| panic!("{e}")))
}

/// The folder `scripts/test` installs the CUDA 12 wheels into (`scripts/cuda-wheels --cuda 12`
/// with `STOKER_NVIDIA_DIR` set to it): `$STOKER_NVIDIA_DIR_CU12`, else `nvidia-cu12` beside
/// the default wheel folder; `None` said loudly (a failure when `CI` is set) when its NVRTC 12
/// is missing.
pub fn cuda12_wheels(test: &str) -> Option<PathBuf> {
    let dir = std::env::var_os("STOKER_NVIDIA_DIR_CU12")
        .map(PathBuf::from)
        .or_else(|| loader::default_wheel_dir().map(|d| d.with_file_name("nvidia-cu12")));
    let found = dir.filter(|d| d.join("nvidia/cuda_nvrtc/lib/libnvrtc.so.12").is_file());
    if found.is_none() {
        let msg = format!(
            "{test}: the CUDA 12 wheels are not installed (STOKER_NVIDIA_DIR=~/.cache/stoker/nvidia-cu12 scripts/cuda-wheels --cuda 12)"
        );
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        let _ = writeln!(std::io::stderr(), "SKIPPED {msg}");
    }
    found
}

/// The role this process was started in by [`run_child`], if it was.
pub fn child_role() -> Option<String> {
    crate::child::role()
}

/// Runs test `test` of this binary again in a child process with `role` and `env`.
pub fn run_child(test: &str, role: &str, env: &[(&str, String)]) -> std::process::Output {
    crate::child::rerun_test(test, role, |cmd| {
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
    })
}

/// A `stokerd --backend cuda` on the emulated GPU (its log in `dir/stokerd.log`, its kernels
/// compiled once into `kernel_cache`) and a `stokerd --backend cpu`, each in its own folder
/// under `dir`: the pair the CUDA tests compare.
pub fn gpu_and_cpu_daemons(dir: &Path, kernel_cache: &Path) -> (Daemon, Daemon) {
    gpu_and_cpu_daemons_with(dir, kernel_cache, &[], &[])
}

/// As [`gpu_and_cpu_daemons`], the CUDA daemon given `flags` more and `env` (emulator
/// settings, its log level).
pub fn gpu_and_cpu_daemons_with(
    dir: &Path,
    kernel_cache: &Path,
    flags: &[&str],
    env: &[(&str, &str)],
) -> (Daemon, Daemon) {
    let (gpu_dir, cpu_dir) = (dir.join("gpu"), dir.join("cpu"));
    std::fs::create_dir_all(&gpu_dir).unwrap();
    std::fs::create_dir_all(&cpu_dir).unwrap();
    let wheels = loader::wheel_dir().expect("wheel dir");
    let log = dir.join("stokerd.log");
    let flags: Vec<&str> = ["--backend", "cuda"].iter().chain(flags).copied().collect();
    let gpu = Daemon::start_logged_with(&gpu_dir, &flags, &log, |cmd| {
        cmd.env("STOKER_NVIDIA_DIR", wheels)
            .env("STOKER_CACHE_DIR", kernel_cache);
        for (k, v) in env {
            cmd.env(k, v);
        }
    });
    (gpu, Daemon::start(&cpu_dir, &["--backend", "cpu"]))
}
