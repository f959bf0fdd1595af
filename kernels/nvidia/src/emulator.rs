//! Telling whether the CUDA driver this process loads is the emulated GPU of
//! `tests/gpu-emulator` (a libcuda stand-in for CI), so the daemon can say so loudly: nothing
//! measured on it says anything about a real GPU (docs/cuda.md, "The emulated GPU").
//!
//! # Design
//! The stand-in exports `stoker_emu_version`, which no NVIDIA library has. Only the library
//! named by `STOKER_LIBCUDA` is looked at (the emulator is never found by soname), and only
//! when it is already loaded or loads cleanly.
//!
//! # Limitations
//! A stand-in copied under another name and found by soname would not be recognised; the
//! emulator refuses to run without `STOKER_GPU_EMULATOR=1` anyway.

use std::path::{Path, PathBuf};

use crate::loader::symbol;

/// The emulated driver's path when `STOKER_LIBCUDA` names the emulator, else `None`.
pub fn emulated_driver() -> Option<PathBuf> {
    let path = PathBuf::from(std::env::var_os(crate::cuda::sys::LIBCUDA.env)?);
    is_emulator(&path).then_some(path)
}

/// Whether the library at `path` is the stoker GPU emulator (false where it does not load).
pub fn is_emulator(path: &Path) -> bool {
    // SAFETY: the same library the driver binding loads (see `loader`); loading it again
    // returns the same handle and runs no initialiser twice.
    let Ok(lib) = (unsafe { libloading::Library::new(path) }) else {
        return false;
    };
    // SAFETY: `stoker_emu_version` is `int (void)` in the emulator; it is only looked up.
    unsafe { symbol::<unsafe extern "C" fn() -> i32>(&lib, "stoker_emu_version") }.is_ok()
}
