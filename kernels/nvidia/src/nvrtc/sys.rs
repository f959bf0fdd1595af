//! Raw libnvrtc symbols, resolved at run time.

use std::ffi::{c_char, c_int, c_void};

use crate::loader::LibrarySpec;

pub(super) type NvrtcResult = c_int;
pub(super) type NvrtcProgram = *mut c_void;

/// Where libnvrtc is looked for (see [`crate::loader`] for the order).
pub(super) const LIBNVRTC: LibrarySpec = LibrarySpec {
    name: "libnvrtc",
    env: "STOKER_NVRTC",
    sonames: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    // `nvidia-cuda-nvrtc` 13.x wheels use `nvidia/cu13/lib`; 12.x wheels `nvidia/cuda_nvrtc/lib`.
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"],
};

crate::symbol_table! {
    /// Every libnvrtc entry point stoker calls, resolved once.
    pub(crate) struct Nvrtc, status NvrtcResult, from "nvrtc.h" {
    get_error_string = "nvrtcGetErrorString": fn(NvrtcResult) -> *const c_char;
    version = "nvrtcVersion": fn(*mut c_int, *mut c_int);
    get_num_supported_archs = "nvrtcGetNumSupportedArchs": fn(*mut c_int);
    get_supported_archs = "nvrtcGetSupportedArchs": fn(*mut c_int);
    create_program = "nvrtcCreateProgram": fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    );
    destroy_program = "nvrtcDestroyProgram": fn(*mut NvrtcProgram);
    compile_program = "nvrtcCompileProgram": fn(NvrtcProgram, c_int, *const *const c_char);
    get_program_log_size = "nvrtcGetProgramLogSize": fn(NvrtcProgram, *mut usize);
    get_program_log = "nvrtcGetProgramLog": fn(NvrtcProgram, *mut c_char);
    get_cubin_size = "nvrtcGetCUBINSize": fn(NvrtcProgram, *mut usize);
    get_cubin = "nvrtcGetCUBIN": fn(NvrtcProgram, *mut c_char);
    }
}
