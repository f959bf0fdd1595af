//! Rings in device memory shared across processes with CUDA VMM: one `cuMemCreate`
//! allocation per ring with the POSIX-fd handle type, exported by the daemon, imported and
//! mapped once by the client.
//!
//! # Design
//! How many bytes a ring takes is the client library's arithmetic (`stoker_wire::VmmPlan`: the
//! ring's images, slots 256-byte aligned, rounded up to [`ring_granularity`]); labels, indices
//! and status stay in the ring's host memfd beside the allocation. This module only allocates,
//! shares and maps. Mapping is the same on both sides: reserve a virtual range, map the
//! allocation into it, grant read-write access to the ring's device. The daemon keeps
//! the allocation handle; the exported fd travels with SCM_RIGHTS; the client imports it,
//! closes its copy of the fd, and maps.
//!
//! Teardown is the reverse: unmap, free the address range, release the handle. The physical
//! memory is freed when the last process has released it, so a client that dies holding a
//! mapping cannot make the daemon's pointers dangle, nor the reverse.
//!
//! # Limitations
//! Tested on the emulated GPU only (memfd-backed VMM, so the sharing across processes is
//! real); a real driver has not run it yet (docs/cuda.md, "Unverified until a GPU run").

use std::os::fd::{FromRawFd, OwnedFd};

use super::{log_drop_error, result, sys, CudaError, Device};

/// The recommended allocation granularity for rings on `device`.
pub fn ring_granularity(device: &Device) -> Result<usize, CudaError> {
    let prop = result::ring_allocation_prop(device.raw());
    result::mem_get_allocation_granularity(device.driver(), &prop, true)
}

/// A ring in device memory, mapped into this process. Made by the daemon with
/// [`DeviceRing::create`] or by a client with [`DeviceRing::import`].
#[derive(Debug)]
pub struct DeviceRing {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    handle: sys::CUmemGenericAllocationHandle,
    // Field order: the device (and its context) outlives the mapping.
    device: Device,
}

// SAFETY: the mapping is an address range usable from any thread that binds the context.
unsafe impl Send for DeviceRing {}
// SAFETY: `DeviceRing` only hands out the address; synchronising use of the memory is the
// pipeline's job (slot states and events).
unsafe impl Sync for DeviceRing {}

impl DeviceRing {
    /// Allocates `bytes` of exportable device memory on `device` and maps it here; `bytes` must
    /// be a multiple of [`ring_granularity`].
    pub fn create(device: &Device, bytes: usize) -> Result<DeviceRing, CudaError> {
        let d = device.driver();
        device.bind()?;
        let prop = result::ring_allocation_prop(device.raw());
        let handle = result::mem_create(d, bytes, &prop)?;
        DeviceRing::map(device, handle, bytes)
    }

    /// Imports a ring the daemon exported as `fd` (a VMM POSIX fd received with SCM_RIGHTS) and
    /// maps its `bytes` (the size both sides planned) on `device`. The fd may be closed
    /// afterwards; the import holds its own reference.
    pub fn import(device: &Device, fd: &OwnedFd, bytes: usize) -> Result<DeviceRing, CudaError> {
        use std::os::fd::AsRawFd;
        device.bind()?;
        let handle = result::mem_import_fd(device.driver(), fd.as_raw_fd())?;
        DeviceRing::map(device, handle, bytes)
    }

    /// Reserves, maps and grants access; releases what it took on any failure.
    fn map(
        device: &Device,
        handle: sys::CUmemGenericAllocationHandle,
        bytes: usize,
    ) -> Result<DeviceRing, CudaError> {
        let d = device.driver();
        let release = |e: CudaError| {
            // SAFETY: `handle` is ours and nothing maps it yet (or any more).
            log_drop_error("ring allocation", unsafe { result::mem_release(d, handle) });
            e
        };
        let ptr = result::mem_address_reserve(d, bytes, 0).map_err(release)?;
        let free = |e: CudaError| {
            // SAFETY: the reservation is ours and nothing is mapped in it.
            log_drop_error("ring address range", unsafe {
                result::mem_address_free(d, ptr, bytes)
            });
            release(e)
        };
        // SAFETY: `ptr..ptr+bytes` was just reserved; `handle` is an allocation of `bytes`.
        unsafe { result::mem_map(d, ptr, bytes, handle) }.map_err(free)?;
        // SAFETY: the range was just mapped.
        if let Err(e) = unsafe { result::mem_set_access_rw(d, ptr, bytes, device.raw()) } {
            // SAFETY: the range is mapped and nothing used it yet.
            log_drop_error("ring mapping", unsafe { result::mem_unmap(d, ptr, bytes) });
            return Err(free(e));
        }
        Ok(DeviceRing {
            ptr,
            bytes,
            handle,
            device: device.clone(),
        })
    }

    /// Exports the allocation as a new POSIX fd for one client (sent with SCM_RIGHTS).
    pub fn export_fd(&self) -> Result<OwnedFd, CudaError> {
        self.device.bind()?;
        // SAFETY: `handle` is a live allocation created with the POSIX-fd handle type.
        let fd = unsafe { result::mem_export_fd(self.device.driver(), self.handle) }?;
        if fd < 0 {
            return Err(CudaError::Invalid(format!("export returned fd {fd}")));
        }
        // SAFETY: the driver just created this descriptor and hands its ownership to us.
        Ok(unsafe { OwnedFd::from_raw_fd(fd) })
    }

    /// Copies `out.len()` bytes starting `offset` bytes into the ring to the host,
    /// synchronously, with the ring's context current (the caller restores its own).
    pub fn copy_to_host(&self, offset: usize, out: &mut [u8]) -> Result<(), CudaError> {
        if offset
            .checked_add(out.len())
            .filter(|&end| end <= self.bytes)
            .is_none()
        {
            return Err(CudaError::Invalid(format!(
                "a copy of {} bytes at {offset} from a ring of {} bytes",
                out.len(),
                self.bytes
            )));
        }
        self.device.bind()?;
        // SAFETY: the range lies inside the ring (checked above), which stays mapped, on the
        // context just made current, while `self` lives.
        unsafe { result::memcpy_dtoh(self.device.driver(), out, self.ptr + offset as u64) }
    }

    /// Device address of the ring's first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    /// Size of the mapping in bytes (a multiple of [`ring_granularity`]).
    pub fn len(&self) -> usize {
        self.bytes
    }

    /// Whether the mapping holds no bytes.
    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// The device the ring's memory lives on.
    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for DeviceRing {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        let d = self.device.driver();
        // SAFETY: `self` owns the mapping, the reservation and the handle; the pipeline has
        // fenced every use of the ring before dropping it.
        unsafe {
            log_drop_error("ring mapping", result::mem_unmap(d, self.ptr, self.bytes));
            log_drop_error(
                "ring address range",
                result::mem_address_free(d, self.ptr, self.bytes),
            );
            log_drop_error("ring allocation", result::mem_release(d, self.handle));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ring_allocations_ask_for_pinned_posix_fd_memory_on_the_device() {
        let prop = result::ring_allocation_prop(3);
        assert_eq!(prop.type_, sys::CU_MEM_ALLOCATION_TYPE_PINNED);
        assert_eq!(
            prop.requested_handle_types,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR
        );
        assert_eq!(prop.location.type_, sys::CU_MEM_LOCATION_TYPE_DEVICE);
        assert_eq!(prop.location.id, 3);
    }
}
