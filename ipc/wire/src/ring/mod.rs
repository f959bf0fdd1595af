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
//!   view 1   batch_size * its image bytes   (only when the spec has extra views)
//!   ...      one region per view, each [batch, C, H, W] (or NHWC) at its own size
//! host part, slot i at host_offset + i * host_slot_bytes:
//!   labels   batch_size * i64
//!   indices  batch_size * u64           (global sample index in the dataset)
//!   status   batch_size * u8            (SampleStatus)
//!   field_lens    batch_size * fields * u32   (bytes of field f of sample i at [i * fields + f])
//!   field_status  batch_size * fields * u8    (FieldStatus, same order)
//!   field_data    batch_size * fields * field_max_bytes
//!                 (field f of sample i at (i * fields + f) * field_max_bytes)
//!   soft_labels   batch_size * num_classes * f32  (row-major [batch, num_classes]; only
//!                 with a batch mix, PipelineSpec::soft_labels)
//! ```
//! The field regions are empty when the spec asks for no fields (the host part is then what
//! it was before fields existed), and so is the soft-label region without a batch mix. Each (sample, field) has its own fixed room: workers fill a
//! batch's samples in parallel without sharing an allocator, and one sample's long field can
//! never crowd out another's.
//! Every region starts on a [`SLOT_ALIGN`]-byte boundary, and so does every slot of each part.
//!
//! [`memfd`] holds a ring in shared host memory (the host part, and the images of the CPU
//! backend); [`VmmPlan`] sizes the image part of a ring in device memory.
//!
//! # Limitations
//! - One image memory per ring: all its slots live in host memory, or all on one device.

use crate::spec::{PipelineSpec, MAX_VIEWS};

pub mod memfd;
mod vmm_plan;
pub use vmm_plan::VmmPlan;

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
    /// The status whose byte in a slot's status region is `v`; `None` for any other byte.
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

/// What became of one field of one sample (see [`SlotLayout`]'s field regions).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum FieldStatus {
    /// The field's bytes are in the slot, exactly as stored; its length is the field's length.
    Ok = 0,
    /// The sample has no shard member or sidecar file with this extension (a file list has
    /// no fields); its length is 0.
    Missing = 1,
    /// The field is longer than the spec's `field_max_bytes`; its length is the field's
    /// length, its bytes are not in the slot.
    TooLarge = 2,
    /// The field could not be read (the daemon's log says why); its length is 0.
    Unreadable = 3,
}

impl FieldStatus {
    /// The status whose byte in a slot's field status region is `v`; `None` for any other byte.
    pub fn from_u8(v: u8) -> Option<FieldStatus> {
        match v {
            0 => Some(FieldStatus::Ok),
            1 => Some(FieldStatus::Missing),
            2 => Some(FieldStatus::TooLarge),
            3 => Some(FieldStatus::Unreadable),
            _ => None,
        }
    }

    /// Why field `field` of `sample` (its global index) is not served, for a person:
    /// `None` when it is.
    pub fn reason(self, field: &str, sample: u64, len: u32, max: usize) -> Option<String> {
        let what = format!("field {field:?} of sample {sample}");
        match self {
            FieldStatus::Ok => None,
            FieldStatus::Missing => Some(format!(
                "{what}: the sample has none (no shard member or sidecar file with that extension)"
            )),
            FieldStatus::TooLarge => Some(format!(
                "{what}: {len} bytes, over the spec's field_max_bytes of {max}"
            )),
            FieldStatus::Unreadable => Some(format!(
                "{what}: cannot be read (the daemon's log says why)"
            )),
        }
    }
}

/// Rounds `n` up to a multiple of `align` (a power of two).
pub(crate) const fn align_up(n: usize, align: usize) -> usize {
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
    /// Whether the images are in host memory (the memfd).
    pub(crate) fn is_host(&self) -> bool {
        *self == ImageMemory::Host
    }
}

/// Where one view's images lie in a slot's image part: `batch_size` images of `image_bytes`
/// from `offset`, each `height` x `width`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct ViewRegion {
    /// Offset of the view's first image in the slot's image part, a multiple of [`SLOT_ALIGN`].
    pub offset: usize,
    /// Bytes of one image of the view.
    pub image_bytes: usize,
    /// Height of the view's images, in pixels.
    pub height: u32,
    /// Width of the view's images, in pixels.
    pub width: u32,
}

/// Byte offsets of the regions of one slot: the images relative to the slot's start in the
/// image part, the rest relative to the slot's start in the host part.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SlotLayout {
    /// Samples in a slot (the spec's `batch_size`).
    pub batch_size: usize,
    /// Bytes of one image of view 0 (the spec's [`PipelineSpec::image_bytes`]).
    pub image_bytes: usize,
    /// Offset of the first image in the slot's image part.
    pub images: usize,
    /// Bytes of one slot's image part, a multiple of [`SLOT_ALIGN`].
    pub image_slot_bytes: usize,
    /// How many views (tensors) the slot holds; view 0 is `images` of `image_bytes`.
    pub views: usize,
    /// Each view's region, the first `views` of them (see [`SlotLayout::view`]).
    pub view_regions: [ViewRegion; MAX_VIEWS],
    /// Offset in the slot's host part of the labels (`batch_size` i64).
    pub labels: usize,
    /// Offset in the slot's host part of the samples' dataset indices (`batch_size` u64).
    pub indices: usize,
    /// Offset in the slot's host part of the samples' [`SampleStatus`] bytes.
    pub status: usize,
    /// Fields asked for per sample (the spec's `fields`).
    pub fields: usize,
    /// Room each field has in the slot, in bytes (0 when no fields are asked for).
    pub field_max_bytes: usize,
    /// Offset in the slot's host part of the fields' lengths (u32, sample-major); see the
    /// module docs.
    pub field_lens: usize,
    /// Offset in the slot's host part of the fields' [`FieldStatus`] bytes.
    pub field_status: usize,
    /// Offset in the slot's host part of the fields' bytes, `field_max_bytes` each.
    pub field_data: usize,
    /// Classes of the soft labels (the spec's [`PipelineSpec::soft_labels`]; 0 without a
    /// batch mix, when the region is empty).
    pub num_classes: usize,
    /// Offset in the slot's host part of the soft labels: `batch_size x num_classes` f32,
    /// row-major, written by the batch mix.
    pub soft_labels: usize,
    /// Bytes of one slot's host part, a multiple of [`SLOT_ALIGN`].
    pub host_slot_bytes: usize,
    /// Both parts: what one slot costs in all.
    pub slot_bytes: usize,
}

impl SlotLayout {
    /// The layout of one slot for batches of `spec`.
    pub fn new(spec: &PipelineSpec) -> SlotLayout {
        let batch_size = spec.batch_size as usize;
        let image_bytes = spec.image_bytes();
        let images = 0;
        let views = spec.view_count().min(MAX_VIEWS);
        let mut view_regions = [ViewRegion::default(); MAX_VIEWS];
        let mut end = images;
        for (v, region) in view_regions.iter_mut().enumerate().take(views) {
            let view = spec.view_spec(v);
            let (height, width) = view.crop.output_size();
            *region = ViewRegion {
                offset: end,
                image_bytes: view.image_bytes(),
                height,
                width,
            };
            end = align_up(end + batch_size * region.image_bytes, SLOT_ALIGN);
        }
        let image_slot_bytes = end;
        let labels = 0;
        let indices = align_up(labels + batch_size * 8, SLOT_ALIGN);
        let status = align_up(indices + batch_size * 8, SLOT_ALIGN);
        let fields = spec.fields.len();
        let field_max_bytes = if fields == 0 {
            0
        } else {
            spec.field_max_bytes as usize
        };
        let entries = batch_size * fields;
        let field_lens = align_up(status + batch_size, SLOT_ALIGN);
        let field_status = align_up(field_lens + entries * 4, SLOT_ALIGN);
        let field_data = align_up(field_status + entries, SLOT_ALIGN);
        let num_classes = spec.soft_labels().unwrap_or(0) as usize;
        let soft_labels = align_up(field_data + entries * field_max_bytes, SLOT_ALIGN);
        let host_slot_bytes = align_up(soft_labels + batch_size * num_classes * 4, SLOT_ALIGN);
        SlotLayout {
            batch_size,
            image_bytes,
            images,
            image_slot_bytes,
            views,
            view_regions,
            labels,
            indices,
            status,
            fields,
            field_max_bytes,
            field_lens,
            field_status,
            field_data,
            num_classes,
            soft_labels,
            host_slot_bytes,
            slot_bytes: image_slot_bytes + host_slot_bytes,
        }
    }
}

impl SlotLayout {
    /// Where view `view`'s images lie in the slot's image part.
    ///
    /// # Panics
    /// If `view` is not below `views`.
    pub fn view(&self, view: usize) -> ViewRegion {
        assert!(
            view < self.views,
            "view {view} of a slot of {} views",
            self.views
        );
        self.view_regions[view]
    }

    /// The image part of one sample of this slot: the same views, each holding one image,
    /// packed as a slot of batch size 1 packs them (a backend's host staging of one sample).
    pub fn one_sample(&self) -> SlotLayout {
        let mut one = SlotLayout {
            batch_size: 1,
            ..*self
        };
        let mut end = self.images;
        for region in one.view_regions.iter_mut().take(self.views) {
            region.offset = end;
            end = align_up(end + region.image_bytes, SLOT_ALIGN);
        }
        one.image_slot_bytes = end;
        one
    }

    /// Byte offset in the slot's image part of view `view` of the sample at position `at`.
    ///
    /// # Panics
    /// If `view` or `at` is out of the slot's range.
    pub fn view_image(&self, view: usize, at: usize) -> usize {
        assert!(at < self.batch_size, "position {at} of {}", self.batch_size);
        let r = self.view(view);
        r.offset + at * r.image_bytes
    }

    /// Where field `field` of the sample at position `at` lies in the slot's host part:
    /// (offset of its length, of its status, of its room of `field_max_bytes`).
    ///
    /// # Panics
    /// If `at` or `field` is out of the slot's range.
    pub fn field_at(&self, at: usize, field: usize) -> (usize, usize, usize) {
        assert!(
            at < self.batch_size && field < self.fields,
            "field {field} of position {at}: the slot has {} fields of {} samples",
            self.fields,
            self.batch_size
        );
        let e = at * self.fields + field;
        (
            self.field_lens + e * 4,
            self.field_status + e,
            self.field_data + e * self.field_max_bytes,
        )
    }
}

impl SlotLayout {
    /// Bytes of one slot's soft labels (0 without a batch mix).
    pub fn soft_label_bytes(&self) -> usize {
        self.batch_size * self.num_classes * 4
    }
}

/// Layout of a ring of `slots` slots in its two memories.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RingLayout {
    /// The layout of each slot.
    pub slot: SlotLayout,
    /// Slots in the ring.
    pub slots: usize,
    /// Where the images live.
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
    fn field_regions_are_empty_without_fields_and_disjoint_with_them() {
        let plain = PipelineSpec::train(3, 17);
        let without = SlotLayout::new(&plain);
        assert_eq!(without.field_data, without.host_slot_bytes);
        assert_eq!(
            without.host_slot_bytes,
            align_up(without.status + 3, SLOT_ALIGN)
        );
        let spec = PipelineSpec {
            fields: vec!["txt".into(), "json".into()],
            field_max_bytes: 100,
            ..plain
        };
        let s = SlotLayout::new(&spec);
        assert_eq!(
            (s.labels, s.indices, s.status),
            (without.labels, without.indices, without.status)
        );
        for off in [s.field_lens, s.field_status, s.field_data] {
            assert_eq!(off % SLOT_ALIGN, 0);
        }
        assert!(s.field_lens >= s.status + 3);
        assert!(s.field_status >= s.field_lens + 6 * 4);
        assert!(s.field_data >= s.field_status + 6);
        assert_eq!(
            s.field_at(0, 0),
            (s.field_lens, s.field_status, s.field_data)
        );
        assert_eq!(
            s.field_at(2, 1),
            (s.field_lens + 20, s.field_status + 5, s.field_data + 500)
        );
        assert!(s.field_at(2, 1).2 + 100 <= s.host_slot_bytes);
    }

    #[test]
    fn views_lie_one_after_another_and_one_view_is_as_before() {
        let one = PipelineSpec::train(3, 17);
        let plain = SlotLayout::new(&one);
        assert_eq!(plain.views, 1);
        assert_eq!(plain.view_image(0, 2), 2 * plain.image_bytes);
        assert_eq!(
            plain.image_slot_bytes,
            align_up(3 * plain.image_bytes, SLOT_ALIGN)
        );
        let local = crate::spec::View {
            crop: crate::spec::Crop::random_resized(5),
            flip_prob: 0.5,
            ops: Vec::new(),
            erasing: None,
        };
        let spec = PipelineSpec {
            extra_views: vec![local; 2],
            ..one
        };
        let s = SlotLayout::new(&spec);
        assert_eq!(s.views, 3);
        assert_eq!(s.view(0).offset, 0);
        assert_eq!(s.view(0).image_bytes, plain.image_bytes);
        assert_eq!(s.view(1).offset, plain.image_slot_bytes);
        assert_eq!((s.view(1).height, s.view(1).width), (5, 5));
        assert_eq!(s.view(1).image_bytes, 5 * 5 * 3 * 4);
        assert_eq!(
            s.view(2).offset,
            align_up(s.view(1).offset + 3 * 300, SLOT_ALIGN)
        );
        assert_eq!(s.view_image(2, 1), s.view(2).offset + 300);
        let one = s.one_sample();
        assert_eq!((one.batch_size, one.views), (1, 3));
        let sizes = [plain.image_bytes, 300, 300];
        let mut end = 0;
        for (v, bytes) in sizes.into_iter().enumerate() {
            assert_eq!((one.view(v).offset, one.view(v).image_bytes), (end, bytes));
            end = align_up(end + bytes, SLOT_ALIGN);
        }
        assert_eq!(one.image_slot_bytes, end);
        assert!(s.image_slot_bytes >= s.view(2).offset + 3 * 300);
        assert_eq!(s.image_slot_bytes % SLOT_ALIGN, 0);
        assert_eq!(
            (s.labels, s.host_slot_bytes),
            (plain.labels, plain.host_slot_bytes)
        );
    }

    #[test]
    fn soft_labels_are_empty_without_a_mix_and_last_with_one() {
        let plain = PipelineSpec {
            fields: vec!["txt".into()],
            field_max_bytes: 10,
            ..PipelineSpec::train(3, 17)
        };
        let without = SlotLayout::new(&plain);
        assert_eq!((without.num_classes, without.soft_label_bytes()), (0, 0));
        assert_eq!(without.soft_labels, without.host_slot_bytes);
        let spec = PipelineSpec {
            batch_mix: Some(crate::spec::BatchMix::MixUp {
                alpha: 1.0,
                num_classes: 10,
            }),
            ..plain
        };
        let s = SlotLayout::new(&spec);
        assert_eq!(
            (
                s.labels,
                s.indices,
                s.status,
                s.field_data,
                s.image_slot_bytes
            ),
            (
                without.labels,
                without.indices,
                without.status,
                without.field_data,
                without.image_slot_bytes
            )
        );
        assert_eq!(s.num_classes, 10);
        assert_eq!(s.soft_labels % SLOT_ALIGN, 0);
        assert!(s.soft_labels >= s.field_data + 3 * 10);
        assert_eq!(
            s.host_slot_bytes,
            align_up(s.soft_labels + 3 * 10 * 4, SLOT_ALIGN)
        );
        assert_eq!(s.slot_bytes, s.image_slot_bytes + s.host_slot_bytes);
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
