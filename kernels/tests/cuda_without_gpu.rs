//! What of the CUDA backend a machine without a GPU can check, against the PyPI wheels
//! `nvidia-cuda-nvrtc` and `nvidia-nvjpeg` that `scripts/cuda-wheels` installs:
//! every kernel compiles through NVRTC for sm_80 and sm_90, libnvjpeg loads and reports its
//! version, and probing the driver is an error value, never a panic.
//!
//! The wheels are found in `$STOKER_NVIDIA_DIR` (default `~/.cache/stoker/nvidia`). Where they
//! are missing the tests fail when `CI` is set and skip loudly otherwise.

use std::io::Write;
use std::path::{Path, PathBuf};

use stoker_kernels::sources::ALL_SOURCES;
use stoker_nvidia::cuda::{self, CudaError};
use stoker_nvidia::loader;
use stoker_nvidia::nvjpeg::NvjpegLib;
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc, NvrtcError};

/// The wheel root, or `None` (after saying so) when the wheels are not installed here.
fn wheels(test: &str) -> Option<PathBuf> {
    let root = loader::wheel_dir();
    let found = root.as_ref().filter(|r| r.join("nvidia").is_dir()).cloned();
    if found.is_none() {
        let msg = format!(
            "{test}: NVIDIA wheels not found in {:?} (run scripts/cuda-wheels, or set {})",
            root,
            loader::NVIDIA_DIR_ENV
        );
        if std::env::var_os("CI").is_some() {
            panic!("{msg}");
        }
        // Straight to stderr, past the test harness's capture, so a skip is seen.
        let _ = writeln!(std::io::stderr(), "SKIPPED {msg}");
    }
    found
}

fn nvrtc(root: &Path) -> Nvrtc {
    Nvrtc::load_from_wheel(root).unwrap_or_else(|e| panic!("NVRTC from {}: {e}", root.display()))
}

/// NVRTC from the wheels, for `test`; `None` as [`wheels`] says.
fn wheel_nvrtc(test: &str) -> Option<Nvrtc> {
    wheels(test).map(|root| nvrtc(&root))
}

fn cu_files() -> Vec<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("cu");
    let mut files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "cu"))
        .collect();
    files.sort();
    assert!(!files.is_empty(), "no .cu files in {}", dir.display());
    files
}

fn is_cubin(b: &[u8]) -> bool {
    b.len() > 1024 && b.starts_with(b"\x7fELF")
}

#[test]
fn every_kernel_compiles_for_sm80_and_sm90() {
    let Some(nvrtc) = wheel_nvrtc("every_kernel_compiles_for_sm80_and_sm90") else {
        return;
    };
    eprintln!(
        "NVRTC {:?} from {}",
        nvrtc.version(),
        nvrtc.origin().display()
    );
    for file in cu_files() {
        let name = file.file_name().unwrap().to_string_lossy().into_owned();
        let source = std::fs::read_to_string(&file).unwrap();
        for arch in [80, 90] {
            let cubin = nvrtc
                .compile_str(&name, &source, arch)
                .unwrap_or_else(|e| panic!("{e}"));
            assert!(is_cubin(&cubin), "{name} sm_{arch}: not a cubin");
        }
        // What the binary embeds is what is on disk.
        assert!(
            ALL_SOURCES
                .iter()
                .any(|s| s.name == name && s.source == source),
            "{name} is not in sources::ALL_SOURCES"
        );
    }
}

#[test]
fn the_augment_kernel_exports_its_entry_points() {
    let Some(nvrtc) = wheel_nvrtc("the_augment_kernel_exports_its_entry_points") else {
        return;
    };
    let cubin = nvrtc
        .compile(&stoker_kernels::sources::AUGMENT_CU, 90)
        .unwrap();
    // extern "C" names appear verbatim in the ELF symbol table.
    for entry in [
        "stoker_augment",
        "stoker_fill_pattern",
        "stoker_check_pattern",
    ] {
        assert!(
            cubin
                .windows(entry.len() + 1)
                .any(|w| &w[..entry.len()] == entry.as_bytes() && w[entry.len()] == 0),
            "{entry} missing from the cubin"
        );
    }
}

#[test]
fn a_syntax_error_fails_with_the_nvrtc_log_and_options() {
    let Some(nvrtc) = wheel_nvrtc("a_syntax_error_fails_with_the_nvrtc_log_and_options") else {
        return;
    };
    let err = nvrtc
        .compile_str(
            "broken.cu",
            "extern \"C\" __global__ void k(int* p) { p[0] = }",
            90,
        )
        .unwrap_err();
    match &err {
        NvrtcError::Compile {
            name,
            arch,
            options,
            log,
        } => {
            assert_eq!(name, "broken.cu");
            assert_eq!(arch, "sm_90");
            assert!(options.contains(&"--gpu-architecture=sm_90".to_string()));
            assert!(log.contains("broken.cu") && log.contains("error"), "{log}");
        }
        e => panic!("expected a compile error, got {e}"),
    }
}

#[test]
fn an_arch_nvrtc_does_not_know_is_a_clear_error() {
    let Some(nvrtc) = wheel_nvrtc("an_arch_nvrtc_does_not_know_is_a_clear_error") else {
        return;
    };
    let err = nvrtc
        .compile(&stoker_kernels::sources::AUGMENT_CU, 11)
        .unwrap_err();
    assert!(
        matches!(err, NvrtcError::UnsupportedArch { arch: 11, .. }),
        "{err}"
    );
}

#[test]
fn the_kernel_cache_stores_reuses_and_repairs_cubins() {
    let Some(nvrtc) = wheel_nvrtc("the_kernel_cache_stores_reuses_and_repairs_cubins") else {
        return;
    };
    let dir = std::env::temp_dir().join(format!("stoker-kcache-{}", std::process::id()));
    let cache = KernelCache::new(&dir);
    let src = stoker_kernels::sources::AUGMENT_CU;
    let first = cache.get_or_compile(&nvrtc, &src, 80).unwrap();
    let files: Vec<PathBuf> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    assert_eq!(files.len(), 1, "{files:?}");
    assert!(files[0]
        .file_name()
        .unwrap()
        .to_string_lossy()
        .starts_with("augment-sm_80-"));
    // A second get reads the file: prove it by planting a different valid-looking cubin.
    let mut planted = first.clone();
    let last = planted.len() - 1;
    planted[last] ^= 0xff;
    std::fs::write(&files[0], &planted).unwrap();
    assert_eq!(cache.get_or_compile(&nvrtc, &src, 80).unwrap(), planted);
    // A corrupt file is rebuilt.
    std::fs::write(&files[0], b"garbage").unwrap();
    assert_eq!(cache.get_or_compile(&nvrtc, &src, 80).unwrap(), first);
    assert_eq!(std::fs::read(&files[0]).unwrap(), first);
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn nvjpeg_loads_from_the_wheel_and_reports_its_version() {
    let Some(root) = wheels("nvjpeg_loads_from_the_wheel_and_reports_its_version") else {
        return;
    };
    let lib = NvjpegLib::load_from_wheel(&root).unwrap_or_else(|e| panic!("{e}"));
    let (major, minor, patch) = lib.version();
    eprintln!(
        "nvJPEG {major}.{minor}.{patch} from {}",
        lib.origin().display()
    );
    assert!(major >= 12, "nvJPEG {major}.{minor}.{patch}");
    assert!(lib.origin().starts_with(&root));
    if cuda::probe().is_err() {
        // Without a GPU, making a handle is an error status, not a crash.
        let err = lib.try_create_handle(true).unwrap_err();
        assert!(err.to_string().contains("nvjpegCreateEx"), "{err}");
    }
}

#[test]
fn an_nvidia_library_or_a_missing_one_is_not_taken_for_the_emulator() {
    use stoker_nvidia::emulator::is_emulator;
    assert!(!is_emulator(Path::new("/nonexistent/libcuda.so.1")));
    let Some(root) = wheels("an_nvidia_library_or_a_missing_one_is_not_taken_for_the_emulator")
    else {
        return;
    };
    let nvrtc = root.join("nvidia/cu13/lib/libnvrtc.so.13");
    assert!(nvrtc.is_file(), "{}", nvrtc.display());
    assert!(!is_emulator(&nvrtc));
}

#[test]
fn probe_never_panics_and_says_why_cuda_is_unavailable() {
    match cuda::probe() {
        Ok(info) => {
            assert!(!info.devices.is_empty());
            for d in &info.devices {
                eprintln!(
                    "{} {} sm_{}{} {} MiB",
                    d.uuid,
                    d.name,
                    d.compute_capability.0,
                    d.compute_capability.1,
                    d.total_memory >> 20
                );
            }
        }
        Err(e) => {
            eprintln!("probe: {e}");
            assert!(e.is_unavailable(), "{e}");
            let CudaError::Unavailable { library, reason } = &e else {
                unreachable!()
            };
            assert_eq!(library, "libcuda");
            assert!(!reason.is_empty());
            // The outcome is kept: a second probe says the same and does not reload.
            assert_eq!(cuda::probe().unwrap_err(), e);
        }
    }
}

#[test]
fn a_library_without_the_driver_symbols_is_unavailable() {
    let Some(root) = wheels("a_library_without_the_driver_symbols_is_unavailable") else {
        return;
    };
    let not_libcuda = root.join("nvidia/cu13/lib/libnvrtc.so.13");
    if !not_libcuda.is_file() {
        let _ = writeln!(std::io::stderr(), "SKIPPED: no {}", not_libcuda.display());
        return;
    }
    let err = cuda::try_driver_at(&not_libcuda).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
    assert!(err.to_string().contains("symbol cuInit"), "{err}");
    let err = cuda::try_driver_at(Path::new("/nonexistent/libcuda.so.1")).unwrap_err();
    assert!(err.is_unavailable(), "{err}");
}
