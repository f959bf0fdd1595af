//! Ring memory as the engine sees it: a slot's images (host or device memory) and its host
//! part (labels, indices, status; always host memory).
//!
//! # Design
//! - [`SlotMemory`] is the only way the engine reaches a ring; [`HeapRing`] is the in-process
//!   kind (benchmarks, tests), the server's memfd rings another, and a CUDA backend's rings
//!   (device images, host memfd beside them) a third.
//! - The engine itself writes only the host part, through a [`HostWriter`] per unit (bounds
//!   checked, one position range per worker); a backend writes the images, through
//!   [`SlotImages`]: a host pointer it may write with the CPU, or a device address.
//!
//! # Limitations
//! - Raw pointers underneath: which slot may be written when is the feed's business
//!   (`feed.rs`); making a [`HostWriter`] is the one unsafe step on the host part.

use stoker_wire::ring::{FieldStatus, RingLayout, SampleStatus, SlotLayout};
use stoker_wire::spec::PipelineSpec;

use super::backend::{SlotImages, UnitWork};

impl UnitWork<'_> {
    /// The unit's images, `indices.len()` of them one after another, as host bytes (a
    /// remote worker's pixels are read straight into them, `crate::remote::home`).
    ///
    /// # Panics
    /// If the slot's images are device memory, or the unit lies outside the slot.
    ///
    /// # Safety
    /// The caller must be filling this unit (the worker holding it), and no other reference
    /// to these images may live while the slice does.
    #[allow(
        clippy::mut_from_ref,
        reason = "the unit's images are the holder's alone"
    )]
    pub unsafe fn host_images(&self) -> &mut [u8] {
        let SlotImages::Host(base) = self.images else {
            panic!("host images expected, got {:?}", self.images);
        };
        let (layout, end) = (&self.layout, self.start + self.indices.len());
        assert!(
            end <= layout.batch_size,
            "unit ends at {end} of {}",
            layout.batch_size
        );
        // SAFETY: the images of positions start..end lie inside the slot's image part
        // (SlotLayout, SlotMemory's contract), and the caller holds them alone.
        unsafe {
            std::slice::from_raw_parts_mut(
                base.add(layout.images + self.start * layout.image_bytes),
                self.indices.len() * layout.image_bytes,
            )
        }
    }
}

/// Memory a feed writes slots into: host memory for the in-process pipeline, a memfd mapping
/// for served rings, device memory plus a host memfd for the CUDA backend.
///
/// # Safety
/// For every `i < layout().slots`, for as long as the value lives: `host_ptr(i)` must be valid
/// host memory for reads and writes of `layout().slot.host_slot_bytes` bytes, and
/// `images(i)` must be valid for `layout().slot.image_slot_bytes` bytes in the memory it
/// names (host, or device for [`SlotImages::Device`], matching `layout().image_memory`). No
/// two of these ranges overlap.
pub unsafe trait SlotMemory: Send + Sync {
    /// The ring's layout: slot count, slot sizes and where images live.
    fn layout(&self) -> &RingLayout;
    /// Slot `slot`'s images.
    fn images(&self, slot: usize) -> SlotImages;
    /// Start of slot `slot`'s host part (labels, indices, status).
    fn host_ptr(&self, slot: usize) -> *mut u8;
}

/// A ring in ordinary heap memory (benchmarks, tests, in-process use).
pub struct HeapRing {
    layout: RingLayout,
    // Boxed [u128] keeps 16-byte alignment; slots are SLOT_ALIGN multiples from its start.
    mem: Box<[std::cell::UnsafeCell<u128>]>,
}

// SAFETY: the memory is only ever accessed through raw pointers handed out by `images` and
// `host_ptr`, and the pipeline's slot protocol keeps writers and readers of one slot apart.
unsafe impl Sync for HeapRing {}

impl std::fmt::Debug for HeapRing {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HeapRing")
            .field("slots", &self.layout.slots)
            .field("ring_bytes", &self.layout.ring_bytes)
            .finish_non_exhaustive()
    }
}

impl HeapRing {
    /// A zeroed ring of `slots` slots laid out for `spec` (slots aligned to 4096 bytes).
    pub fn new(spec: &PipelineSpec, slots: usize) -> HeapRing {
        let layout = RingLayout::new(spec, slots, 4096);
        let words = layout.ring_bytes.div_ceil(16);
        let mem = (0..words).map(|_| std::cell::UnsafeCell::new(0)).collect();
        HeapRing { layout, mem }
    }

    fn at(&self, offset: usize) -> *mut u8 {
        // SAFETY: callers pass offsets of RingLayout, all < ring_bytes <= mem.len() * 16.
        unsafe { (self.mem.as_ptr() as *mut u8).add(offset) }
    }

    /// The bytes of one slot's images. The caller must hold the slot's lease (it is READY and
    /// not yet released), so no worker writes into it meanwhile.
    pub fn images_of(&self, slot: usize) -> &[u8] {
        let ptr = self.at(self.layout.image_offset(slot));
        // SAFETY: valid for image_slot_bytes (RingLayout); the lease keeps writers away.
        unsafe { std::slice::from_raw_parts(ptr, self.layout.slot.image_slot_bytes) }
    }

    /// The bytes of one slot's host part (labels, indices, status); the lease rule of
    /// [`HeapRing::images_of`] applies.
    pub fn host_of(&self, slot: usize) -> &[u8] {
        // SAFETY: valid for host_slot_bytes (RingLayout); the lease keeps writers away.
        unsafe { std::slice::from_raw_parts(self.host_ptr(slot), self.layout.slot.host_slot_bytes) }
    }
}

// SAFETY: both parts of every slot are disjoint ranges of `mem` (RingLayout), which lives as
// long as the ring and covers ring_bytes; the images are host memory.
unsafe impl SlotMemory for HeapRing {
    fn layout(&self) -> &RingLayout {
        &self.layout
    }
    fn images(&self, slot: usize) -> SlotImages {
        SlotImages::Host(self.at(self.layout.image_offset(slot)))
    }
    fn host_ptr(&self, slot: usize) -> *mut u8 {
        self.at(self.layout.host_offset(slot))
    }
}

/// Writes the host part (label, index, status) of positions `start..end` of one slot: the one
/// way the engine writes a slot's host part. Several workers fill one batch at once, each its
/// own positions, so a writer covers its positions only (never a `&mut` over the whole part).
pub(crate) struct HostWriter<'a> {
    host: *mut u8,
    layout: SlotLayout,
    start: usize,
    end: usize,
    _ring: std::marker::PhantomData<&'a dyn SlotMemory>,
}

impl<'a> HostWriter<'a> {
    /// A writer of positions `start..end` of slot `slot` of `ring`.
    ///
    /// # Safety
    /// No one else may read or write positions `start..end` of the slot's host part while the
    /// writer lives (the worker holds the unit those positions belong to).
    ///
    /// # Panics
    /// If `start..end` is not inside the batch or `slot` not inside the ring.
    pub(crate) unsafe fn new(
        ring: &'a dyn SlotMemory,
        slot: usize,
        start: usize,
        end: usize,
    ) -> Self {
        let layout = ring.layout().slot;
        assert!(
            slot < ring.layout().slots,
            "slot {slot} of {}",
            ring.layout().slots
        );
        assert!(
            start <= end && end <= layout.batch_size,
            "positions {start}..{end}"
        );
        HostWriter {
            host: ring.host_ptr(slot),
            layout,
            start,
            end,
            _ring: std::marker::PhantomData,
        }
    }

    /// Writes position `at`'s label, sample index and status.
    ///
    /// # Panics
    /// If `at` is not one of the writer's positions.
    pub(crate) fn write(&mut self, at: usize, label: i64, index: u64, status: SampleStatus) {
        assert!(
            (self.start..self.end).contains(&at),
            "position {at} of {}..{}",
            self.start,
            self.end
        );
        let l = &self.layout;
        // SAFETY: `at < batch_size` (checked here and in `new`), so each entry lies in its
        // 8-byte-aligned array (SLOT_ALIGN) inside the slot's host part, which the ring keeps
        // valid (SlotMemory); `new`'s caller gave this writer position `at` alone.
        unsafe {
            (self.host.add(l.labels) as *mut i64).add(at).write(label);
            (self.host.add(l.indices) as *mut u64).add(at).write(index);
            self.host.add(l.status + at).write(status as u8);
        }
    }

    /// Writes field `field` of position `at`: its status, its length, and (when `Ok`) its
    /// bytes, which must fit the field's room.
    ///
    /// # Panics
    /// If `at` is not one of the writer's positions, `field` not one of the spec's, or
    /// `bytes` longer than `field_max_bytes`.
    pub(crate) fn write_field(
        &mut self,
        at: usize,
        field: usize,
        status: FieldStatus,
        len: u32,
        bytes: &[u8],
    ) {
        assert!(
            (self.start..self.end).contains(&at),
            "position {at} of {}..{}",
            self.start,
            self.end
        );
        assert!(
            bytes.len() <= self.layout.field_max_bytes,
            "field of {} bytes",
            bytes.len()
        );
        let (len_at, status_at, data_at) = self.layout.field_at(at, field);
        // SAFETY: `field_at` checked `at` and `field` against the slot's layout, so the length
        // (4-byte aligned: SLOT_ALIGN region, 4-byte entries), the status and the room of
        // `field_max_bytes` >= bytes.len() lie inside the slot's host part, which the ring
        // keeps valid (SlotMemory); `new`'s caller gave this writer position `at` alone.
        unsafe {
            (self.host.add(len_at) as *mut u32).write(len);
            self.host.add(status_at).write(status as u8);
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), self.host.add(data_at), bytes.len());
        }
    }

    /// Marks position `at` empty (the unused tail of a short final batch).
    ///
    /// # Panics
    /// If `at` is not one of the writer's positions.
    pub(crate) fn mark_empty(&mut self, at: usize) {
        assert!(
            (self.start..self.end).contains(&at),
            "position {at} of {}..{}",
            self.start,
            self.end
        );
        // SAFETY: as in `write`.
        unsafe {
            self.host
                .add(self.layout.status + at)
                .write(SampleStatus::Empty as u8)
        };
    }
}
