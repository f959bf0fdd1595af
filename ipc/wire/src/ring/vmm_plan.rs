//! How big a ring in device memory is: the VMM side of a [`RingLayout`], pure arithmetic so it
//! is tested without a GPU. The daemon allocates and exports a ring of this size
//! (`stoker_nvidia::cuda::vmm::DeviceRing::create`); the client checks the size the daemon
//! announced against its own plan before importing and mapping the fd.
//!
//! # Design
//! The ring's images' bytes come from [`RingLayout::with_device_images`] (slots 256-byte
//! aligned) rounded up to the device's allocation granularity
//! (`stoker_nvidia::cuda::vmm::ring_granularity`); labels, indices and status stay in the
//! ring's host memfd beside the allocation.
//!
//! # Limitations
//! Errors are the driver binding's (`CudaError::Invalid`), so the daemon and the client report
//! a bad plan the way they report a failed mapping.

#![forbid(unsafe_code)]

use stoker_nvidia::cuda::CudaError;

use crate::ring::RingLayout;
use crate::spec::PipelineSpec;

/// How big a ring's allocation is and how it is mapped: the VMM side of a [`RingLayout`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct VmmPlan {
    /// The ring's layout, its images in device memory.
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
            RingLayout::with_device_images(spec, slots, super::memfd::page_size(), granularity);
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
}
