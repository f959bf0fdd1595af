//! Ring and slot layout: where a batch's images, labels, sample indices and per-sample status
//! live, in which memory, and where each slot lives inside a ring.
//!
//! The layout is a pure function of the pipeline spec, the slot count and where the images
//! live, computed identically by the daemon and by every client, so nothing but those needs to
//! cross the socket.
//!
//! # Two memories per ring
//! A ring is two memories:
//! - the **host part** (always host memory, the sealed memfd): per slot the labels, the global
//!   sample indices and the per-sample status. The C ABI hands out host pointers to them.
//! - the **image part**: per slot the `batch_size` images. It is either host memory (the CPU
//!   backend: it then lies in the same memfd, before the host part) or device memory (the
//!   CUDA backend: one VMM allocation of its own, see [`ImageMemory::Device`]).
//!
//! ```text
//! image part, slot i at i * image_slot_bytes:
//!   images   batch_size * image_bytes   (dtype, layout as the spec says)
//! host part, slot i at host_offset + i * host_slot_bytes:
//!   labels   batch_size * i64
//!   indices  batch_size * u64           (global sample index in the dataset)
//!   status   batch_size * u8            (SampleStatus)
//! ```
//! Every region starts on a [`SLOT_ALIGN`]-byte boundary, and so does every slot of each part.
//!
//! [`memfd`] holds a ring in shared host memory (the host part, and the images of the CPU
//! backend); [`vmm_plan`] sizes the image part of a ring in device memory.
//!
//! # Limitations
//! - One image memory per ring: all its slots live in host memory, or all on one device.

use crate::spec::PipelineSpec;

pub mod memfd;
/// cbindgen:ignore
pub mod vmm_plan;

/// Alignment of every slot and of every region inside one (CUDA wants 256 for vector loads).
pub const SLOT_ALIGN: usize = 256;

/// What became of one sample of a batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum SampleStatus {
    /// Decoded and augmented as asked.
    Ok = 0,
    /// The sample was bad; policy `skip` put a deterministic replacement in its place.
    Replaced = 1,
    /// The sample was bad; policy `fail` left its pixels zeroed and reports it here.
    Failed = 2,
    /// Padding beyond `n` in a partial final batch.
    Empty = 3,
}

impl SampleStatus {
    pub fn from_u8(v: u8) -> Option<SampleStatus> {
        match v {
            0 => Some(SampleStatus::Ok),
            1 => Some(SampleStatus::Replaced),
            2 => Some(SampleStatus::Failed),
            3 => Some(SampleStatus::Empty),
            _ => None,
        }
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub const fn align_up(n: usize, align: usize) -> usize {
    (n + align - 1) & !(align - 1)
}

/// Where a ring's images live.
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, Hash, Default, serde::Serialize, serde::Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum ImageMemory {
    /// Host memory: the images lie in the ring's memfd, before the host part.
    #[default]
    Host,
    /// Device memory: a CUDA VMM allocation of [`RingLayout::image_ring_bytes`], exported as
    /// a POSIX fd beside the memfd.
    Device,
}

impl ImageMemory {
    pub fn is_host(&self) -> bool {
        *self == ImageMemory::Host
    }
}

/// Byte offsets of the regions of one slot: the images relative to the slot's start in the
/// image part, the rest relative to the slot's start in the host part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    pub batch_size: usize,
    pub image_bytes: usize,
    /// Offset of the first image in the slot's image part.
    pub images: usize,
    /// Bytes of one slot's image part, a multiple of [`SLOT_ALIGN`].
    pub image_slot_bytes: usize,
    /// Offsets in the slot's host part.
    pub labels: usize,
    pub indices: usize,
    pub status: usize,
    /// Bytes of one slot's host part, a multiple of [`SLOT_ALIGN`].
    pub host_slot_bytes: usize,
    /// Both parts: what one slot costs in all.
    pub slot_bytes: usize,
}

impl SlotLayout {
    pub fn new(spec: &PipelineSpec) -> SlotLayout {
        let batch_size = spec.batch_size as usize;
        let image_bytes = spec.image_bytes();
        let images = 0;
        let image_slot_bytes = align_up(images + batch_size * image_bytes, SLOT_ALIGN);
        let labels = 0;
        let indices = align_up(labels + batch_size * 8, SLOT_ALIGN);
        let status = align_up(indices + batch_size * 8, SLOT_ALIGN);
        let host_slot_bytes = align_up(status + batch_size, SLOT_ALIGN);
        SlotLayout {
            batch_size,
            image_bytes,
            images,
            image_slot_bytes,
            labels,
            indices,
            status,
            host_slot_bytes,
            slot_bytes: image_slot_bytes + host_slot_bytes,
        }
    }
}

/// Layout of a ring of `slots` slots in its two memories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    pub slot: SlotLayout,
    pub slots: usize,
    pub image_memory: ImageMemory,
    /// Bytes of the image part: in the memfd for host images, else the device allocation's
    /// size (a multiple of the allocation granularity).
    pub image_ring_bytes: usize,
    /// Offset of the host part in the memfd (after the images when they are host memory).
    pub host_offset: usize,
    /// Bytes of the memfd, padded to the page granularity.
    pub ring_bytes: usize,
}

impl RingLayout {
    /// A ring whose images are host memory (the CPU backend): one memfd of `ring_bytes`,
    /// padded to `granularity` (the page size).
    pub fn new(spec: &PipelineSpec, slots: usize, granularity: usize) -> RingLayout {
        let slot = SlotLayout::new(spec);
        let granularity = granularity.max(SLOT_ALIGN);
        let image_ring_bytes = slot.image_slot_bytes * slots;
        let host_bytes = slot.host_slot_bytes * slots;
        RingLayout {
            slot,
            slots,
            image_memory: ImageMemory::Host,
            image_ring_bytes,
            host_offset: image_ring_bytes,
            ring_bytes: (image_ring_bytes + host_bytes).div_ceil(granularity) * granularity,
        }
    }

    /// A ring whose images are device memory (the CUDA backend): the image part padded to the
    /// VMM `device_granularity`, the memfd holding the host part only, padded to `page`.
    pub fn with_device_images(
        spec: &PipelineSpec,
        slots: usize,
        page: usize,
        device_granularity: usize,
    ) -> RingLayout {
        let slot = SlotLayout::new(spec);
        let (page, device_granularity) = (page.max(SLOT_ALIGN), device_granularity.max(SLOT_ALIGN));
        let images = slot.image_slot_bytes * slots;
        RingLayout {
            slot,
            slots,
            image_memory: ImageMemory::Device,
            image_ring_bytes: images.div_ceil(device_granularity) * device_granularity,
            host_offset: 0,
            ring_bytes: (slot.host_slot_bytes * slots).div_ceil(page) * page,
        }
    }

    /// Byte offset of slot `i`'s images in the image part (for host images, this is also the
    /// offset in the memfd).
    pub fn image_offset(&self, i: usize) -> usize {
        assert!(i < self.slots, "slot {i} out of {}", self.slots);
        i * self.slot.image_slot_bytes
    }

    /// Byte offset of slot `i`'s host part (labels, indices, status) in the memfd.
    pub fn host_offset(&self, i: usize) -> usize {
        assert!(i < self.slots, "slot {i} out of {}", self.slots);
        self.host_offset + i * self.slot.host_slot_bytes
    }

    /// Bytes of memory the ring takes in all (memfd, plus device memory for device images),
    /// what quotas count.
    pub fn total_bytes(&self) -> usize {
        match self.image_memory {
            ImageMemory::Host => self.ring_bytes,
            ImageMemory::Device => self.ring_bytes + self.image_ring_bytes,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn regions_are_aligned_and_disjoint() {
        let spec = PipelineSpec::train(3, 17);
        let s = SlotLayout::new(&spec);
        assert_eq!(s.image_bytes, 17 * 17 * 3 * 4);
        for off in [
            s.images,
            s.image_slot_bytes,
            s.labels,
            s.indices,
            s.status,
            s.host_slot_bytes,
        ] {
            assert_eq!(off % SLOT_ALIGN, 0);
        }
        assert!(s.image_slot_bytes >= s.images + 3 * s.image_bytes);
        assert!(s.indices >= s.labels + 3 * 8);
        assert!(s.status >= s.indices + 3 * 8);
        assert!(s.host_slot_bytes >= s.status + 3);
        assert_eq!(s.slot_bytes, s.image_slot_bytes + s.host_slot_bytes);
        let r = RingLayout::new(&spec, 5, 2 << 20);
        assert_eq!(r.ring_bytes % (2 << 20), 0);
        assert!(r.ring_bytes >= 5 * s.slot_bytes);
        assert_eq!(r.image_offset(4), 4 * s.image_slot_bytes);
        // Host images come first in the memfd; the host part follows them without overlap.
        assert_eq!(r.host_offset(0), 5 * s.image_slot_bytes);
        assert!(r.host_offset(4) + s.host_slot_bytes <= r.ring_bytes);
        assert_eq!(r.total_bytes(), r.ring_bytes);
    }

    #[test]
    fn device_images_leave_the_memfd_to_the_host_part() {
        let spec = PipelineSpec::train(3, 17);
        let s = SlotLayout::new(&spec);
        let r = RingLayout::with_device_images(&spec, 5, 4096, 2 << 20);
        assert_eq!(r.image_memory, ImageMemory::Device);
        assert_eq!(r.image_ring_bytes % (2 << 20), 0);
        assert!(r.image_ring_bytes >= 5 * s.image_slot_bytes);
        assert_eq!(r.host_offset(0), 0);
        assert_eq!(r.ring_bytes % 4096, 0);
        assert!(r.ring_bytes >= 5 * s.host_slot_bytes && r.ring_bytes < 5 * s.slot_bytes);
        assert_eq!(r.total_bytes(), r.ring_bytes + r.image_ring_bytes);
    }
}
