//! An emulated CUDA driver: a stand-in for libcuda that stoker's real run-time loading code
//! opens through `STOKER_LIBCUDA`, so CI without a GPU runs the CUDA paths end to end.
//!
//! It refuses to initialise (`cuInit` returns `CUDA_ERROR_STUB_LIBRARY`) unless
//! `STOKER_GPU_EMULATOR=1`: it never loads by accident. The driver's documented contract is
//! kept strictly, so code that works here has followed the rules a GPU enforces.
//!
//! # Design
//! - [`config`]: devices (UUIDs, names, compute capability, memory, JPEG engines), the delay of
//!   each stream operation and the faults to inject, from the environment.
//! - [`boundary`]: handle values by kind, out-parameters, the statuses a null pointer and a
//!   panic become at the C boundary.
//! - [`state`]: `cuInit` first; primary contexts reference-counted; the current context per
//!   thread; [`state::Emu`], which holds every subsystem's state under one mutex.
//! - [`api`]: every exported function, one file per subsystem (`api/device.rs`: `cuInit`,
//!   devices, primary contexts), each run through one wrapper (`cuInit` checked, fault
//!   injection, panics caught).
//! - [`stream`]: a worker thread per stream, in order and asynchronous; events.
//! - [`memory`]: device memory is host memory at the same address (so the host build of a
//!   kernel can dereference device pointers); pinned host memory; copies.
//! - [`vmm`]: `cuMemCreate` on memfds, POSIX-fd export/import across processes, reserve / map
//!   / set access with real page protections.
//! - [`module`] + [`elf`]: cubins checked and read; launches run the host build of the
//!   kernel source (`build.rs`) with the parameter buffer the cubin describes.
//! - [`faults`], [`stats`]: faults on demand; live allocations for leak checks.
//!
//! Layers, each using only those below it: [`status`], [`config`], [`elf`]; [`boundary`];
//! each subsystem's state ([`faults`], [`vmm`] then [`memory`], [`module`], [`stream`]), none
//! of which knows the process-wide state; [`state`]; [`stats`]; [`api`], whose file of each
//! subsystem's name holds that subsystem's `extern "C"` calls.
//!
//! Public as Rust items: [`api`] (the exported calls and the C structs they take), [`status`]
//! and [`stats`] (the contract tests name the statuses and [`stats::EmuLive`]); the rest is
//! the crate's own.
//!
//! What this proves and what only a GPU proves: docs/cuda.md, "The emulated GPU".
//!
//! # Limitations
//! Only what stoker calls is exported (a program needing more fails to resolve a symbol).
//! Kernels run one thread after another on the CPU: correct, never fast.

// The emulated GPU mirrors the C types of the NVIDIA APIs (int sizes, u64 handles, signed
// strides) in test-only code; its tests check its arithmetic, not a conversion per cast (the
// workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]
// Every exported function is a C ABI entry point taking the driver's raw pointers: C callers
// cannot see a Rust `unsafe` marker, and the pointer contract is the one cuda.h documents.
// Each dereference still carries its own `// SAFETY:` comment.
#![allow(clippy::not_unsafe_ptr_arg_deref)]

pub mod api;
mod boundary;
mod config;
mod elf;
mod faults;
mod memory;
mod module;
mod state;
pub mod stats;
pub mod status;
mod stream;
mod vmm;
