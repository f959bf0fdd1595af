//! Which decode backend serves: the choice (`--backend auto|cpu|cuda`, `pipeline.backend`)
//! against what this host has.
//!
//! # Design
//! - CUDA is usable when the driver loads with at least one visible device and NVRTC and
//!   libnvjpeg load too (the GPUs themselves are opened when a rank first attaches on one).
//! - `auto` serves from CUDA when it is usable and from the CPU otherwise, logging why;
//!   `cuda` refuses to start with the reason where it is not usable.
//! - Serving from CUDA still serves ranks that attach with `device: "cpu"` from the CPU
//!   engine (`serve/gpus.rs`).
//!
//! # Limitations
//! - Usable libraries do not prove a GPU works: a GPU that fails to open is refused at attach
//!   with the reason.

#![forbid(unsafe_code)]

use crate::engine::backend::BackendKind;
use crate::service::config::BackendChoice;

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("--backend cuda: no usable GPU here: {0}")]
    NoGpu(CudaUnusable),
}

/// Why the cuda backend cannot serve on this host.
#[derive(Debug, thiserror::Error)]
pub enum CudaUnusable {
    #[error("{0}")]
    Driver(stoker_nvidia::cuda::CudaError),
    #[error("the CUDA driver sees no device")]
    NoDevice,
    #[error("no GPU here is supported: {0}")]
    NoSupportedDevice(String),
    #[error("NVRTC: {0}")]
    Nvrtc(stoker_nvidia::nvrtc::NvrtcError),
    #[error("nvJPEG: {0}")]
    Nvjpeg(stoker_nvidia::nvjpeg::NvjpegError),
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

/// Whether CUDA can serve here: the driver with a device, NVRTC and libnvjpeg; else why not.
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
    stoker_nvidia::nvrtc::Nvrtc::global().map_err(CudaUnusable::Nvrtc)?;
    stoker_nvidia::nvjpeg::NvjpegLib::global().map_err(CudaUnusable::Nvjpeg)?;
    Ok(info.devices.len())
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
