//! Raw libnvrtc symbols, resolved at run time.

use std::ffi::{c_char, c_int, c_void};

use libloading::Library;

use crate::loader::{symbol, LibrarySpec, Loaded};

pub type NvrtcResult = c_int;
pub type NvrtcProgram = *mut c_void;

/// Where libnvrtc is looked for (see [`crate::loader`] for the order).
pub const LIBNVRTC: LibrarySpec = LibrarySpec {
    name: "libnvrtc",
    env: "STOKER_NVRTC",
    sonames: &["libnvrtc.so.13", "libnvrtc.so.12", "libnvrtc.so"],
    // `nvidia-cuda-nvrtc` 13.x wheels use `nvidia/cu13/lib`; 12.x wheels `nvidia/cuda_nvrtc/lib`.
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/cuda_nvrtc/lib"],
};

pub struct Nvrtc {
    pub get_error_string: unsafe extern "C" fn(NvrtcResult) -> *const c_char,
    pub version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> NvrtcResult,
    pub get_num_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    pub get_supported_archs: unsafe extern "C" fn(*mut c_int) -> NvrtcResult,
    pub create_program: unsafe extern "C" fn(
        *mut NvrtcProgram,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> NvrtcResult,
    pub destroy_program: unsafe extern "C" fn(*mut NvrtcProgram) -> NvrtcResult,
    pub compile_program:
        unsafe extern "C" fn(NvrtcProgram, c_int, *const *const c_char) -> NvrtcResult,
    pub get_program_log_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub get_program_log: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    pub get_cubin_size: unsafe extern "C" fn(NvrtcProgram, *mut usize) -> NvrtcResult,
    pub get_cubin: unsafe extern "C" fn(NvrtcProgram, *mut c_char) -> NvrtcResult,
    /// Kept last so the pointers above never outlive it.
    _library: Library,
}

impl Nvrtc {
    pub fn load(loaded: Loaded) -> Result<Nvrtc, String> {
        let l = loaded.library;
        // SAFETY: each type is copied from nvrtc.h for that symbol.
        unsafe {
            Ok(Nvrtc {
                get_error_string: symbol(&l, "nvrtcGetErrorString")?,
                version: symbol(&l, "nvrtcVersion")?,
                get_num_supported_archs: symbol(&l, "nvrtcGetNumSupportedArchs")?,
                get_supported_archs: symbol(&l, "nvrtcGetSupportedArchs")?,
                create_program: symbol(&l, "nvrtcCreateProgram")?,
                destroy_program: symbol(&l, "nvrtcDestroyProgram")?,
                compile_program: symbol(&l, "nvrtcCompileProgram")?,
                get_program_log_size: symbol(&l, "nvrtcGetProgramLogSize")?,
                get_program_log: symbol(&l, "nvrtcGetProgramLog")?,
                get_cubin_size: symbol(&l, "nvrtcGetCUBINSize")?,
                get_cubin: symbol(&l, "nvrtcGetCUBIN")?,
                _library: l,
            })
        }
    }
}
