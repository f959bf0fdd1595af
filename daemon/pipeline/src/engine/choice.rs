//! Which decode backend serves: the choice (`--backend auto|cpu|cuda`, `pipeline.backend` in
//! stokerd's config) against what this host has.
//!
//! # Design
//! - CUDA is usable when the driver loads with at least one visible, supported device, NVRTC
//!   and libnvjpeg of a CUDA major the driver runs load (`stoker_nvidia::compat`), and on
//!   each such GPU a trivial cubin built by that NVRTC loads and an nvJPEG handle can be
//!   made (`stoker_nvidia::usability`). A GPU failing it is logged with the reason; CUDA
//!   serves when at least one passes.
//! - `auto` serves from CUDA when it is usable and from the CPU otherwise, logging why;
//!   `cuda` refuses to start with the reason where it is not usable.
//! - Serving from CUDA still serves ranks that attach with `device: "cpu"` from the CPU
//!   engine (the daemon's `serve/gpus.rs`).
//!
//! # Limitations
//! - The check proves that the libraries and the driver agree, not that decoding is right
//!   (`stoker selftest --gpu`).

#![forbid(unsafe_code)]

use stoker_nvidia::compat::CudaVersion;
use stoker_nvidia::nvjpeg::NvjpegLib;
use stoker_nvidia::nvrtc::Nvrtc;

use serde::{Deserialize, Serialize};

use super::backend::BackendKind;

/// Which decode backend serves: `pipeline.backend` in the config, `--backend` on the command
/// line of `stokerd` and `stoker bench` (the one type for all three).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize, clap::ValueEnum)]
#[serde(rename_all = "lowercase")]
pub enum BackendChoice {
    /// CUDA where a GPU and its libraries are present, else the CPU (and the log says why).
    #[default]
    Auto,
    /// The CPU backend, even where a GPU is present.
    Cpu,
    /// The CUDA backend, or an error where no GPU here can serve.
    Cuda,
}

/// Why the chosen backend cannot serve.
#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    /// `--backend cuda` on a host where no GPU can serve.
    #[error("--backend cuda: no usable GPU here: {0}")]
    NoGpu(CudaUnusable),
}

/// Why the cuda backend cannot serve on this host.
#[derive(Debug, thiserror::Error)]
pub enum CudaUnusable {
    /// The CUDA driver could not be loaded or initialised.
    #[error("{0}")]
    Driver(stoker_nvidia::cuda::CudaError),
    /// The driver loaded but counts no device.
    #[error("the CUDA driver sees no device")]
    NoDevice,
    /// Every device is unsupported: `UUID: reason` for each, joined by `; `.
    #[error("no GPU here is supported: {0}")]
    NoSupportedDevice(String),
    /// NVRTC (the kernels' run-time compiler) could not be loaded.
    #[error("NVRTC: {0}")]
    Nvrtc(stoker_nvidia::nvrtc::NvrtcError),
    /// nvJPEG could not be loaded.
    #[error("nvJPEG: {0}")]
    Nvjpeg(stoker_nvidia::nvjpeg::NvjpegError),
    /// Every supported device failed the CUDA check: each one's error, joined by `; `.
    #[error("no GPU passed the check: {0}")]
    Check(String),
}

/// Says loudly when the GPU found is the emulated one of tests/gpu-emulator.
fn warn_if_emulated() {
    if let Some(path) = stoker_nvidia::emulator::emulated_driver() {
        tracing::warn!(
            driver = %path.display(),
            "THE GPU IS EMULATED (STOKER_LIBCUDA is the stoker GPU emulator): for tests only; \
             nothing measured on it says anything about a real GPU"
        );
    }
}

/// Whether CUDA can serve here (how many GPUs passed the check); else why not.
fn cuda_usable() -> Result<usize, CudaUnusable> {
    let info = stoker_nvidia::cuda::probe().map_err(CudaUnusable::Driver)?;
    if info.devices.is_empty() {
        return Err(CudaUnusable::NoDevice);
    }
    let unsupported: Vec<String> = info
        .devices
        .iter()
        .filter_map(|d| {
            d.unsupported_reason()
                .map(|why| format!("{}: {why}", d.uuid))
        })
        .collect();
    if unsupported.len() == info.devices.len() {
        return Err(CudaUnusable::NoSupportedDevice(unsupported.join("; ")));
    }
    for why in &unsupported {
        tracing::warn!(gpu = %why, "this GPU is refused to every rank that names it");
    }
    warn_if_emulated();
    let driver = CudaVersion(info.driver_version);
    let nvrtc = Nvrtc::global().map_err(CudaUnusable::Nvrtc)?;
    let nvjpeg = NvjpegLib::global().map_err(CudaUnusable::Nvjpeg)?;
    let mut failed = Vec::new();
    let mut usable = 0;
    for device in info
        .devices
        .iter()
        .filter(|d| d.unsupported_reason().is_none())
    {
        match stoker_nvidia::usability::check_device(device, driver) {
            Ok(()) => usable += 1,
            Err(e) => {
                tracing::warn!(error = %e, "this GPU failed the CUDA check");
                failed.push(e.to_string());
            }
        }
    }
    if usable == 0 {
        return Err(CudaUnusable::Check(failed.join("; ")));
    }
    tracing::info!(
        driver = %driver,
        nvrtc = %nvrtc.origin().display(),
        nvrtc_version = ?nvrtc.version(),
        nvjpeg = %nvjpeg.origin().display(),
        nvjpeg_version = ?nvjpeg.version(),
        "CUDA libraries chosen for the driver"
    );
    Ok(usable)
}

/// Resolves `choice` on this host, logging the reason when `auto` falls back to the CPU.
pub fn choose(choice: BackendChoice) -> Result<BackendKind, BackendError> {
    match choice {
        BackendChoice::Cpu => Ok(BackendKind::Cpu),
        BackendChoice::Auto => match cuda_usable() {
            Ok(gpus) => {
                tracing::info!(gpus, "backend auto: serving from CUDA");
                Ok(BackendKind::Cuda)
            }
            Err(reason) => {
                tracing::info!(
                    %reason,
                    "backend auto: the cuda backend is unavailable; serving from the CPU backend"
                );
                Ok(BackendKind::Cpu)
            }
        },
        BackendChoice::Cuda => match cuda_usable() {
            Ok(gpus) => {
                tracing::info!(gpus, "backend cuda: serving from CUDA");
                Ok(BackendKind::Cuda)
            }
            Err(reason) => Err(BackendError::NoGpu(reason)),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_auto_serve_from_the_cpu_and_cuda_says_why_not() {
        assert_eq!(choose(BackendChoice::Cpu).unwrap(), BackendKind::Cpu);
        assert_eq!(choose(BackendChoice::Auto).unwrap(), BackendKind::Cpu);
        let err = choose(BackendChoice::Cuda).unwrap_err().to_string();
        assert!(err.starts_with("--backend cuda:"), "{err}");
    }
}
