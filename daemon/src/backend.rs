//! Which decode backend serves: the choice (`--backend auto|cpu|cuda`, `pipeline.backend`)
//! against what this host has.
//!
//! # Limitations
//! The CUDA serving pipeline (nvJPEG decode, the fused kernel, CUDA IPC rings) is built in
//! `kernels` but not yet wired into the engine, so every choice serves from the CPU today:
//! `auto` says why in the log, and `cuda` is refused with the reason rather than silently
//! served from the CPU (see docs/cuda.md).

use crate::config::BackendChoice;

/// The backend that serves (the engine's backends say which they are with it; see
/// [`crate::engine::Backend`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BackendKind {
    Cpu,
    Cuda,
}

impl BackendKind {
    /// The name in metrics labels, logs and status.
    pub fn name(self) -> &'static str {
        match self {
            BackendKind::Cpu => "cpu",
            BackendKind::Cuda => "cuda",
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum BackendError {
    #[error("--backend cuda: no usable GPU here: {0}")]
    NoGpu(String),
    #[error(
        "--backend cuda: a GPU is present ({0}) but this build serves from the CPU only; the \
         CUDA serving pipeline is not wired yet (docs/cuda.md): use --backend auto or cpu"
    )]
    NotWired(String),
}

/// Says loudly when the GPU found is the emulated one of tests/gpu-emulator.
fn warn_if_emulated() {
    if let Some(path) = stoker_kernels::emulator::emulated_driver() {
        tracing::warn!(
            driver = %path.display(),
            "THE GPU IS EMULATED (STOKER_LIBCUDA is the stoker GPU emulator): for tests only; \
             nothing measured on it says anything about a real GPU"
        );
    }
}

/// Resolves `choice` on this host, logging the reason when `auto` falls back to the CPU.
pub fn choose(choice: BackendChoice) -> Result<BackendKind, BackendError> {
    let probe = || {
        let info = stoker_kernels::cuda::probe();
        if info.is_ok() {
            warn_if_emulated();
        }
        info
    };
    match choice {
        BackendChoice::Cpu => Ok(BackendKind::Cpu),
        BackendChoice::Auto => {
            match probe() {
                Ok(info) => tracing::warn!(
                    gpus = info.devices.len(),
                    "backend auto: a GPU is present but the CUDA serving pipeline is not wired \
                     yet; serving from the CPU backend"
                ),
                Err(e) => tracing::info!(
                    reason = %e,
                    "backend auto: the cuda backend is unavailable; serving from the CPU backend"
                ),
            }
            Ok(BackendKind::Cpu)
        }
        BackendChoice::Cuda => match probe() {
            Ok(info) => Err(BackendError::NotWired(format!(
                "{} device(s)",
                info.devices.len()
            ))),
            Err(e) => Err(BackendError::NoGpu(e.to_string())),
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
