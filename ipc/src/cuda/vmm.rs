//! Rings in device memory shared across processes with CUDA VMM: one `cuMemCreate`
//! allocation per ring with the POSIX-fd handle type, exported by the daemon, imported and
//! mapped once by the client.
//!
//! # Design
//! The size plan is pure arithmetic ([`VmmPlan`]) so it is tested without a GPU: the ring's
//! images' bytes come from [`crate::ring::RingLayout::with_device_images`] (slots 256-byte
//! aligned) rounded up to the device's allocation granularity; labels, indices and status stay
//! in the ring's host memfd beside the allocation. Mapping is the same on both sides: reserve a virtual range,
//! map the allocation into it, grant read-write access to the ring's device. The daemon keeps
//! the allocation handle; the exported fd travels with SCM_RIGHTS; the client imports it,
//! closes its copy of the fd, and maps.
//!
//! Teardown is the reverse: unmap, free the address range, release the handle. The physical
//! memory is freed when the last process has released it, so a client that dies holding a
//! mapping cannot make the daemon's pointers dangle, nor the reverse.
//!
//! # Limitations
//! Untested until a GPU run (docs/cuda.md): everything below that calls the driver.

use std::os::fd::{FromRawFd, OwnedFd};

use crate::ring::RingLayout;
use crate::spec::PipelineSpec;

use super::{log_drop_error, result, sys, CudaError, Device};

/// How big a ring's allocation is and how it is mapped: the VMM side of a [`RingLayout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmPlan {
    pub layout: RingLayout,
    /// The device's allocation granularity (`cuMemGetAllocationGranularity`, recommended).
    pub granularity: usize,
    /// Bytes allocated, reserved and mapped: `layout.image_ring_bytes`, a multiple of
    /// `granularity`.
    pub bytes: usize,
}

impl VmmPlan {
    /// Plans a ring of `slots` slots for `spec` on a device of this granularity.
    pub fn new(
        spec: &PipelineSpec,
        slots: usize,
        granularity: usize,
    ) -> Result<VmmPlan, CudaError> {
        if granularity == 0 || !granularity.is_power_of_two() {
            return Err(CudaError::Invalid(format!(
                "allocation granularity {granularity} is not a power of two"
            )));
        }
        if slots == 0 {
            return Err(CudaError::Invalid("a ring of 0 slots".into()));
        }
        let layout =
            RingLayout::with_device_images(spec, slots, crate::memfd::page_size(), granularity);
        Ok(VmmPlan {
            layout,
            granularity: granularity.max(crate::ring::SLOT_ALIGN),
            bytes: layout.image_ring_bytes,
        })
    }

    /// The same plan checked against what a peer announced (the client checks the daemon's
    /// ring size before mapping an fd of that size).
    pub fn check_size(&self, announced: usize) -> Result<(), CudaError> {
        if announced != self.bytes {
            return Err(CudaError::Invalid(format!(
                "ring size {announced} differs from the {} this spec and granularity need",
                self.bytes
            )));
        }
        Ok(())
    }
}

/// The recommended allocation granularity for rings on `device`.
pub fn ring_granularity(device: &Device) -> Result<usize, CudaError> {
    let prop = result::ring_allocation_prop(device.raw());
    result::mem_get_allocation_granularity(device.driver(), &prop, true)
}

/// A ring in device memory, mapped into this process. Made by the daemon with
/// [`DeviceRing::create`] or by a client with [`DeviceRing::import`].
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
    /// Allocates `plan.bytes` of exportable device memory on `device` and maps it here.
    pub fn create(device: &Device, plan: &VmmPlan) -> Result<DeviceRing, CudaError> {
        let d = device.driver();
        device.bind()?;
        let prop = result::ring_allocation_prop(device.raw());
        let handle = result::mem_create(d, plan.bytes, &prop)?;
        DeviceRing::map(device, handle, plan.bytes)
    }

    /// Imports a ring the daemon exported as `fd` (a VMM POSIX fd received with SCM_RIGHTS) and
    /// maps it on `device`. The fd may be closed afterwards; the import holds its own reference.
    pub fn import(device: &Device, fd: &OwnedFd, plan: &VmmPlan) -> Result<DeviceRing, CudaError> {
        use std::os::fd::AsRawFd;
        device.bind()?;
        let handle = result::mem_import_fd(device.driver(), fd.as_raw_fd())?;
        DeviceRing::map(device, handle, plan.bytes)
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

    /// Device address of the ring's first byte.
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

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
    use crate::ring::SLOT_ALIGN;

    #[test]
    fn plans_round_to_granularity_and_align_slots() {
        let spec = PipelineSpec::train(256, 224);
        let g = 2 << 20;
        let plan = VmmPlan::new(&spec, 4, g).unwrap();
        assert_eq!(plan.bytes % g, 0);
        assert!(plan.bytes >= 4 * plan.layout.slot.image_slot_bytes);
        assert!(plan.bytes < 4 * plan.layout.slot.image_slot_bytes + g);
        for i in 0..4 {
            assert_eq!(plan.layout.image_offset(i) % SLOT_ALIGN, 0);
        }
        plan.check_size(plan.bytes).unwrap();
        assert!(plan.check_size(plan.bytes + g).is_err());
    }

    #[test]
    fn bad_granularity_or_empty_ring_is_an_error() {
        let spec = PipelineSpec::train(2, 8);
        assert!(VmmPlan::new(&spec, 2, 3 << 20).is_err());
        assert!(VmmPlan::new(&spec, 2, 0).is_err());
        assert!(VmmPlan::new(&spec, 0, 2 << 20).is_err());
    }

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
