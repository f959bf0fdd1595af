//! Page-locked host memory from `cuMemHostAlloc` ([`PinnedHostBuffer`]): what asynchronous
//! host-to-device copies should read from. From pageable memory NVIDIA documents that "the
//! driver may synchronize with the stream and stage the copy into pinned memory" (driver API,
//! "API synchronization behavior"): the copy then costs the caller the stream's queued work.

use super::{log_drop_error, result, CudaError, Device};

/// Pinned host memory, freed on drop. Drop does not wait for copies from it: the owner must
/// have synchronised (the CUDA engine waits on the event recorded after its uploads).
#[derive(Debug)]
pub struct PinnedHostBuffer {
    ptr: *mut u8,
    bytes: usize,
    device: Device,
}

// SAFETY: plain host memory owned by this value; the driver handle is shared by the device.
unsafe impl Send for PinnedHostBuffer {}

impl PinnedHostBuffer {
    /// `bytes` of pinned host memory in `device`'s context.
    pub fn new(device: &Device, bytes: usize) -> Result<PinnedHostBuffer, CudaError> {
        if bytes == 0 {
            return Err(CudaError::Invalid("pinned host memory of 0 bytes".into()));
        }
        device.bind()?;
        let ptr = result::mem_host_alloc(device.driver(), bytes)?;
        Ok(PinnedHostBuffer {
            ptr,
            bytes,
            device: device.clone(),
        })
    }

    /// Size of the buffer in bytes.
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the buffer holds no bytes (never true: [`PinnedHostBuffer::new`] refuses 0).
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The memory, to read.
    pub fn as_slice(&self) -> &[u8] {
        // SAFETY: `bytes` bytes owned by `self` from cuMemHostAlloc, live while `self` is.
        unsafe { std::slice::from_raw_parts(self.ptr, self.bytes) }
    }

    /// The memory, to write. The caller must not write while a copy from it is in flight.
    pub fn as_mut_slice(&mut self) -> &mut [u8] {
        // SAFETY: as above, borrowed mutably through `self`.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.bytes) }
    }
}

impl Drop for PinnedHostBuffer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the allocation; the owner synchronised (the type's docs).
            log_drop_error("pinned host buffer", unsafe {
                result::mem_free_host(self.device.driver(), self.ptr)
            });
        }
    }
}
