//! Loaded cubins ([`Module`]) and their kernels ([`Function`]), launched on a stream.

use std::ffi::c_void;

use super::result::CuStatus;
use super::sys;
use super::{log_drop_error, result, CudaError, Device, Stream};

/// A loaded cubin, unloaded on drop.
#[derive(Debug)]
pub struct Module {
    pub(super) raw: sys::CUmodule,
    pub(super) device: Device,
}

// SAFETY: module handles may be used from any thread that binds the context.
unsafe impl Send for Module {}
// SAFETY: looking up functions is thread-safe in the driver.
unsafe impl Sync for Module {}

impl Module {
    /// The `extern "C"` kernel called `name`.
    pub fn function(&self, name: &str) -> Result<Function<'_>, CudaError> {
        let cname =
            std::ffi::CString::new(name).map_err(|_| CudaError::NoSuchKernel(name.to_string()))?;
        self.device.bind()?;
        // SAFETY: the module is live while `self` is.
        let raw = unsafe { result::module_get_function(self.device.driver(), self.raw, &cname) }
            .map_err(|e| match e {
                CudaError::Driver { status, .. } if status == CuStatus::NOT_FOUND => {
                    CudaError::NoSuchKernel(name.to_string())
                }
                e => e,
            })?;
        Ok(Function { raw, module: self })
    }

    /// The device whose context the cubin is loaded into.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the module and every `Function` borrowed it, so none is left.
            log_drop_error("module", unsafe {
                result::module_unload(self.device.driver(), self.raw)
            });
        }
    }
}

/// A kernel of a [`Module`].
#[derive(Debug)]
pub struct Function<'m> {
    raw: sys::CUfunction,
    module: &'m Module,
}

impl Function<'_> {
    /// Launches the kernel.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of exactly that
    /// parameter's type (see the `#[repr(C)]` mirrors in `stoker_kernels::augment`), and every device
    /// pointer the kernel dereferences must stay valid until the launch completes on `stream`.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let device = &self.module.device;
        device.bind()?;
        // SAFETY: the caller upholds the kernel's contract; handles are live.
        unsafe {
            result::launch_kernel(
                device.driver(),
                self.raw,
                grid,
                block,
                0,
                stream.raw(),
                params,
            )
        }
    }
}

impl Device {
    /// Loads a cubin (from `stoker_nvidia::nvrtc`) into this device's context.
    pub fn load_module(&self, cubin: &[u8]) -> Result<Module, CudaError> {
        self.bind()?;
        let raw = result::module_load_data(self.driver_api(), cubin)?;
        Ok(Module {
            raw,
            device: self.clone(),
        })
    }
}
