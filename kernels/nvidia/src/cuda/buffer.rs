//! Device memory from `cuMemAlloc` ([`DeviceBuffer`]).

use super::sys;
use super::{log_drop_error, result, CudaError, Device};

/// Device memory from `cuMemAlloc`, freed on drop. Drop does not wait for work on it: the
/// owner must have synchronised (the pipeline fences every use with an event).
#[derive(Debug)]
pub struct DeviceBuffer {
    pub(super) ptr: sys::CUdeviceptr,
    pub(super) bytes: usize,
    pub(super) device: Device,
}

// SAFETY: a device pointer is an address usable from any thread that binds the context.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    /// Device address of the buffer's first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size of the buffer in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer holds no bytes (never true: `Device::alloc` refuses 0 bytes).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies the whole buffer to the host, synchronously (self-test and debugging only).
    pub fn read(&self, out: &mut [u8]) -> Result<(), CudaError> {
        if out.len() > self.bytes {
            return Err(CudaError::Invalid(format!(
                "read of {} bytes from a buffer of {}",
                out.len(),
                self.bytes
            )));
        }
        self.device.bind()?;
        // SAFETY: the range is inside this buffer (checked above).
        unsafe { result::memcpy_dtoh(self.device.driver(), out, self.ptr) }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the allocation; the owner synchronised (see the type's docs).
            log_drop_error("device buffer", unsafe {
                result::mem_free(self.device.driver(), self.ptr)
            });
        }
    }
}

impl Device {
    /// `bytes` of uninitialised device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        if bytes == 0 {
            return Err(CudaError::Invalid("a device buffer of 0 bytes".into()));
        }
        self.bind()?;
        let ptr = result::mem_alloc(self.driver_api(), bytes)?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            device: self.clone(),
        })
    }
}
