//! NVML, loaded at run time, for one figure: how busy a GPU's hardware JPEG decoders (NVJPG)
//! are (`nvmlDeviceGetJpgUtilization`: "the current utilization and sampling size in
//! microseconds for the JPG"), which `stoker bench --backend cuda --decode-only` reports beside
//! the engines' rate.
//!
//! # Design
//! - One [`crate::symbol_table!`] (`nvmlInit_v2`, `nvmlDeviceGetHandleByUUID`,
//!   `nvmlDeviceGetJpgUtilization`, `nvmlShutdown`), the library found as `loader` finds the
//!   others (`STOKER_NVML`, then `libnvidia-ml.so.1`, which the driver installs).
//! - [`Nvml::jpg_utilization`] is `None` where the library, the device or the call is
//!   missing (older drivers lack the call; the emulated GPU has no NVML): the caller then
//!   falls back to `nvidia-smi dmon -s u` or reports "n/a".
//!
//! # Limitations
//! A percentage over NVML's own sampling period, for the whole device (every process's
//! decodes).

use std::ffi::{c_char, c_int, c_uint, c_void, CString};

use crate::loader::LibrarySpec;

type NvmlReturn = c_int;
type NvmlDevice = *mut c_void;

/// Where libnvidia-ml is looked for (see [`crate::loader`] for the order).
const LIBNVML: LibrarySpec = LibrarySpec {
    name: "libnvidia-ml",
    env: "STOKER_NVML",
    sonames: &["libnvidia-ml.so.1"],
    wheel_dirs: &[],
};

crate::symbol_table! {
    /// The NVML entry points stoker calls, resolved once.
    struct NvmlSys, status NvmlReturn, from "nvml.h" {
    init = "nvmlInit_v2": fn();
    shutdown = "nvmlShutdown": fn();
    handle_by_uuid = "nvmlDeviceGetHandleByUUID": fn(*const c_char, *mut NvmlDevice);
    jpg_utilization = "nvmlDeviceGetJpgUtilization": fn(NvmlDevice, *mut c_uint, *mut c_uint);
    }
}

/// NVML initialised, for one device.
#[derive(Debug)]
pub struct Nvml {
    sys: NvmlSys,
    device: NvmlDevice,
}

// SAFETY: NVML is thread-safe ("all NVML functions are thread-safe", NVML API reference); the
// device handle is an opaque value NVML owns for the life of the initialisation.
unsafe impl Send for Nvml {}

impl Nvml {
    /// NVML for the GPU with this UUID (`GPU-...`, as NVML and the driver print it); an error
    /// names the library, the symbol or the status.
    pub fn open(uuid: &str) -> Result<Nvml, String> {
        let loaded = LIBNVML.open().map_err(|e| e.to_string())?;
        let sys = NvmlSys::load(loaded).map_err(|e| e.to_string())?;
        // SAFETY: no arguments; NVML counts initialisations (shut down in Drop).
        let status = unsafe { (sys.init)() };
        if status != 0 {
            return Err(format!("nvmlInit_v2 returned {status}"));
        }
        // From here on Drop shuts NVML down again, whatever happens.
        let mut nvml = Nvml {
            sys,
            device: std::ptr::null_mut(),
        };
        let name = CString::new(uuid).map_err(|e| e.to_string())?;
        let mut device: NvmlDevice = std::ptr::null_mut();
        // SAFETY: a NUL-terminated string and an out-parameter local.
        let status = unsafe { (nvml.sys.handle_by_uuid)(name.as_ptr(), &mut device) };
        if status != 0 {
            return Err(format!(
                "nvmlDeviceGetHandleByUUID({uuid}) returned {status}"
            ));
        }
        nvml.device = device;
        Ok(nvml)
    }

    /// The NVJPG engines' utilisation in percent over NVML's last sampling period, or `None`
    /// where the driver does not answer it.
    pub fn jpg_utilization(&self) -> Option<u32> {
        let (mut util, mut period): (c_uint, c_uint) = (0, 0);
        // SAFETY: the handle came from this initialisation; two out-parameter locals.
        let status = unsafe { (self.sys.jpg_utilization)(self.device, &mut util, &mut period) };
        (status == 0).then_some(util)
    }
}

impl Drop for Nvml {
    fn drop(&mut self) {
        // SAFETY: balances the successful nvmlInit_v2 of `open`.
        let _ = unsafe { (self.sys.shutdown)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_nvml_is_an_error_naming_the_file() {
        // A variable no other test of this crate reads.
        std::env::set_var("STOKER_NVML", "/nonexistent/libnvidia-ml.so.1");
        let err = Nvml::open("GPU-00000000-0000-0000-0000-000000000000").unwrap_err();
        assert!(err.contains("/nonexistent/libnvidia-ml.so.1"), "{err}");
    }
}
