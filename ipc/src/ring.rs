//! Ring and slot layout: where a batch's images, labels, sample indices and per-sample status
//! live inside one slot, and where each slot lives inside a ring.
//!
//! The layout is a pure function of the pipeline spec, computed identically by the daemon and
//! by every client, so nothing but the spec and the slot count needs to cross the socket.
//!
//! # Layout of one slot
//! ```text
//! images   batch_size * image_bytes   (dtype, layout as the spec says)
//! labels   batch_size * i64
//! indices  batch_size * u64           (global sample index in the dataset)
//! status   batch_size * u8            (SampleStatus)
//! ```
//! Every region starts on a [`SLOT_ALIGN`]-byte boundary, and so does every slot.

use crate::spec::PipelineSpec;

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

/// Byte offsets of the regions of one slot, relative to the slot's start.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    pub batch_size: usize,
    pub image_bytes: usize,
    pub images: usize,
    pub labels: usize,
    pub indices: usize,
    pub status: usize,
    /// Size of one slot, a multiple of [`SLOT_ALIGN`].
    pub slot_bytes: usize,
}

impl SlotLayout {
    pub fn new(spec: &PipelineSpec) -> SlotLayout {
        let batch_size = spec.batch_size as usize;
        let image_bytes = spec.image_bytes();
        let images = 0;
        let labels = align_up(images + batch_size * image_bytes, SLOT_ALIGN);
        let indices = align_up(labels + batch_size * 8, SLOT_ALIGN);
        let status = align_up(indices + batch_size * 8, SLOT_ALIGN);
        let slot_bytes = align_up(status + batch_size, SLOT_ALIGN);
        SlotLayout {
            batch_size,
            image_bytes,
            images,
            labels,
            indices,
            status,
            slot_bytes,
        }
    }
}

/// Layout of a ring of `slots` slots, padded to `granularity` (page size for memfd, the
/// allocation granularity for CUDA VMM).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    pub slot: SlotLayout,
    pub slots: usize,
    pub ring_bytes: usize,
}

impl RingLayout {
    pub fn new(spec: &PipelineSpec, slots: usize, granularity: usize) -> RingLayout {
        let slot = SlotLayout::new(spec);
        let granularity = granularity.max(SLOT_ALIGN);
        let ring_bytes = (slot.slot_bytes * slots).div_ceil(granularity) * granularity;
        RingLayout {
            slot,
            slots,
            ring_bytes,
        }
    }

    /// Byte offset of slot `i` in the ring.
    pub fn slot_offset(&self, i: usize) -> usize {
        assert!(i < self.slots, "slot {i} out of {}", self.slots);
        i * self.slot.slot_bytes
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
        for off in [s.images, s.labels, s.indices, s.status, s.slot_bytes] {
            assert_eq!(off % SLOT_ALIGN, 0);
        }
        assert!(s.labels >= s.images + 3 * s.image_bytes);
        assert!(s.indices >= s.labels + 3 * 8);
        assert!(s.status >= s.indices + 3 * 8);
        assert!(s.slot_bytes >= s.status + 3);
        let r = RingLayout::new(&spec, 5, 2 << 20);
        assert_eq!(r.ring_bytes % (2 << 20), 0);
        assert!(r.ring_bytes >= 5 * s.slot_bytes);
        assert_eq!(r.slot_offset(4), 4 * s.slot_bytes);
    }
}
