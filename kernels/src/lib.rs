//! stoker's kernels: CUDA sources compiled at run time by NVRTC, their launch wrappers, and a
//! straightforward CPU reference for every kernel (the oracle for both the CPU backend's fast
//! code and the GPU kernels).
//!
//! This crate knows nothing of sockets. NVIDIA libraries are loaded at run time (`loader`);
//! nothing here needs CUDA to build (docs/cuda.md). The CUDA driver binding and the loader
//! live in `stoker-ipc` (the client needs them to import device rings); they are re-exported
//! here under their former paths, `stoker_kernels::cuda` and `stoker_kernels::loader`.

pub use stoker::{cuda, loader};

pub mod augment;
pub mod emulator;
pub mod nvjpeg;
pub mod nvrtc;
pub mod reference;
