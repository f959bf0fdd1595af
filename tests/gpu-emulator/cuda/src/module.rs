//! A loaded module and how its kernels run: the kernels of a cubin ([`ModuleEntry`]), the
//! host build of the same `.cu` source that a launch runs, and the parameter buffer the cubin
//! lays out ([`pack`]). The calls (`cuModuleLoadData`, `cuLaunchKernel`, ...) are in
//! [`crate::api::module`].
//!
//! # Design
//! The cubin's own parameter table decides the parameter buffer: each argument is copied from
//! `kernelParams[i]` to its offset with its size, exactly the bytes a GPU's constant bank
//! receives; the host entry point then reads its arguments out of that buffer at the offsets
//! the C++ ABI gives them, so a mismatch between the Rust launch code, the cubin and the C++
//! struct shows up as wrong results. The host kernels (built by `build.rs` from
//! `kernels/cu/*.cu` behind a CUDA shim) run every block and thread of the grid in turn on
//! the stream's worker thread.
//!
//! # Limitations
//! - Threads of a block run one after another: `__syncthreads` would not work (no kernel uses
//!   it) and nothing about speed can be learned.

use std::collections::HashMap;
use std::ffi::{c_char, c_int, c_uint, c_void};

use crate::elf::KernelInfo;
use crate::status::{self, CUresult};

pub(crate) struct ModuleEntry {
    pub(crate) dev: usize,
    pub(crate) kernels: HashMap<String, KernelInfo>,
}

extern "C" {
    /// Bytes of the parameter buffer the host build of `name` expects; -1: no such kernel.
    pub(crate) fn stoker_emu_host_kernel_params(name: *const c_char) -> i64;
    /// Runs the host build of `name` over the grid; 0 on success.
    pub(crate) fn stoker_emu_run_host_kernel(
        name: *const c_char,
        params: *const u8,
        grid: *const c_uint,
        block: *const c_uint,
    ) -> c_int;
}

/// Packs the arguments into the parameter buffer the way the cubin lays it out.
///
/// # Safety
/// `args` must hold one pointer per parameter, each to `size` readable bytes.
pub(crate) unsafe fn pack(info: &KernelInfo, args: *mut *mut c_void) -> Result<Vec<u8>, CUresult> {
    let mut buf = vec![0u8; info.param_bytes];
    if info.params.is_empty() {
        return Ok(buf);
    }
    if args.is_null() {
        return Err(status::INVALID_VALUE);
    }
    for p in &info.params {
        // SAFETY: one pointer per parameter (the caller's promise).
        let src = unsafe { *args.add(usize::from(p.ordinal)) };
        let (at, n) = (usize::from(p.offset), usize::from(p.size));
        if src.is_null() || at + n > buf.len() {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: `src` points at the argument's `n` bytes; `buf` has room (checked).
        unsafe { std::ptr::copy_nonoverlapping(src.cast::<u8>(), buf.as_mut_ptr().add(at), n) };
    }
    Ok(buf)
}
