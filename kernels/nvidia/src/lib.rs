//! NVIDIA's libraries, loaded at run time: the CUDA driver (`cuda`: devices by UUID, primary
//! contexts, streams, events, modules and launches, device buffers, VMM rings shared across
//! processes), NVRTC (`nvrtc`: kernels compiled for the device, cached on disk) and nvJPEG
//! (`nvjpeg`: batched, hardware and ROI decoding), found as `loader` says; NVML (`nvml`) only
//! for the hardware JPEG decoders' utilisation in the bench.
//!
//! # Design
//! Each library is three layers, as in cudarc: `sys` (the raw symbols, one
//! [`symbol_table!`] per library), `result` (one function per call, returning a typed error
//! with named statuses) and safe types (`Device`, `Stream`, `NvjpegDecoder`, ...). The unsafe
//! code is `sys` and `result`, opening a library (`loader`, `cuda::driver`, `emulator`), the
//! places where a raw handle becomes an owning type, and the calls whose device memory only
//! the caller can vouch for, which stay `unsafe fn` (a kernel launch, nvJPEG's decodes into
//! caller buffers); docs/cuda.md lists them. Each library's statuses are one
//! [`status_type!`] newtype. Nothing here links an NVIDIA library at build
//! time: one binary serves every host, and a missing library or symbol is an error value,
//! never a panic.
//!
//! This crate knows nothing of sockets, rings' layouts or pixels: the client library
//! (`stoker-client`) imports device rings with it, the kernels crate (`stoker-kernels`) compiles
//! and launches its `.cu` sources with it, and the daemon decodes with it.
//!
//! # Limitations
//! `emulator` recognises the CI's libcuda stand-in only when `STOKER_LIBCUDA` names it.

pub mod compat;
pub mod cuda;
pub mod emulator;
pub mod loader;
pub mod nvjpeg;
pub mod nvml;
pub mod nvrtc;
mod status;
pub mod usability;
