//! Which nvJPEG this stand-in is, and whether the driver can run it.
//!
//! # Design
//! - A real libnvjpeg carries its CUDA major in its soname (`libnvjpeg.so.13`, `.so.12`), so
//!   this one takes its major from the name it was loaded by when that name is
//!   `libnvjpeg.so.<major>[...]` (tests copy it under such names to stand for two toolkits in
//!   one process), else 13; minor and patch are 0.
//! - nvJPEG runs on the CUDA runtime, which needs a driver of at least its major ("the
//!   installed NVIDIA CUDA driver is older than the CUDA runtime library. This is not a
//!   supported configuration.", `cudaErrorInsufficientDriver`). Handle creation refuses when
//!   the emulated driver's `cuDriverGetVersion` is of an older major: with
//!   `NVJPEG_STATUS_EXECUTION_FAILED`, the status a real nvJPEG 13 gave at handle creation on
//!   a machine with no driver at all (docs/cuda.md, "CI without a GPU").
//!
//! # Limitations
//! The status for a too-old driver (as opposed to none) is unsourced: first-GPU checklist.

use std::ffi::{c_int, CStr};
use std::sync::OnceLock;

use crate::status::{self, Status};

/// The major a stand-in loaded under no versioned name reports.
const DEFAULT_MAJOR: c_int = 13;

/// The major in a file name `libnvjpeg.so.<major>[.<more>]`, if it is one.
fn major_from_name(file_name: &str) -> Option<c_int> {
    let rest = file_name.strip_prefix("libnvjpeg.so.")?;
    rest.split('.').next()?.parse().ok()
}

/// The path this library was loaded from, as the dynamic loader has it.
fn own_path() -> Option<String> {
    let mut info = libc::Dl_info {
        dli_fname: std::ptr::null(),
        dli_fbase: std::ptr::null_mut(),
        dli_sname: std::ptr::null(),
        dli_saddr: std::ptr::null_mut(),
    };
    let here = own_path as *const fn() -> Option<String>;
    // SAFETY: `here` is an address inside this library; `info` is a local out-parameter.
    if unsafe { libc::dladdr(here.cast(), &mut info) } == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr gives a C string owned by the loader, alive while the library is loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) };
    Some(path.to_string_lossy().into_owned())
}

/// (major, minor, patch) of this stand-in.
pub(crate) fn version() -> (c_int, c_int, c_int) {
    static V: OnceLock<c_int> = OnceLock::new();
    let major = *V.get_or_init(|| {
        own_path()
            .as_deref()
            .and_then(|p| p.rsplit('/').next())
            .and_then(major_from_name)
            .unwrap_or(DEFAULT_MAJOR)
    });
    (major, 0, 0)
}

/// Refuses when the driver runs an older CUDA major than this nvJPEG's.
pub(crate) fn check_driver() -> Result<(), Status> {
    let driver = crate::cuda::driver_version()?;
    let (major, minor, _) = version();
    if major > driver / 1000 {
        eprintln!(
            "stoker nvJPEG emulator: nvJPEG {major}.{minor} needs a driver that runs CUDA {major}; \
             this one runs CUDA {}.{} (cudaErrorInsufficientDriver)",
            driver / 1000,
            driver % 1000 / 10
        );
        return Err(status::EXECUTION_FAILED);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_major_comes_from_a_versioned_soname_only() {
        assert_eq!(major_from_name("libnvjpeg.so.12"), Some(12));
        assert_eq!(major_from_name("libnvjpeg.so.13.0.1"), Some(13));
        assert_eq!(major_from_name("libstoker_emu_nvjpeg.so"), None);
        assert_eq!(major_from_name("libnvjpeg.so"), None);
    }
}
