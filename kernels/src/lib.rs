//! stoker's kernels: CUDA sources compiled at run time by NVRTC, their launch wrappers, and a
//! straightforward CPU reference for every kernel (the oracle for both the CPU backend's fast
//! code and the GPU kernels).
//!
//! This crate knows nothing of sockets.

pub mod reference;
