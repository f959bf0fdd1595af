//! stoker's kernels: CUDA sources compiled at run time by NVRTC, their launch wrappers, and a
//! straightforward CPU reference for every kernel (the oracle for both the CPU backend's fast
//! code and the GPU kernels).
//!
//! This crate knows nothing of sockets. NVIDIA libraries (the CUDA driver, NVRTC) are bound
//! in `stoker-nvidia` and loaded at run time; nothing here needs CUDA to build
//! (docs/cuda.md).

pub mod augment;
pub mod image;
pub mod mix;
pub mod ops;
pub mod reference;
pub mod sources;
