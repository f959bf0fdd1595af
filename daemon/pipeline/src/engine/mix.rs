//! The batch mix in the engine: once every sample of a batch is in its slot (bad samples
//! settled), and before the batch is published, MixUp or CutMix runs over the batch's images
//! of every view and writes its soft labels (see [`crate::transform::mix`]).
//!
//! # Design
//! - The worker that finishes a batch's last unit mixes it (`slots.rs` counts the units
//!   filled; the batch is not published before that worker's unit is finished), so the mix
//!   runs once per batch, whoever filled its samples: local workers or remote ones
//!   (`crate::remote` on the daemon's side), on host images.
//! - The draw is keyed by the job's seed, the epoch and the batch's number among all ranks'
//!   batches of the epoch (`step * world_size + rank`): the same on every run, whatever the
//!   threads.
//!
//! # Limitations
//! - Host images only: the CUDA backend refuses a spec with `batch_mix` (`backend_serves`).
//! - One thread mixes a batch (a pass over each view's bytes, after the batch's decodes): for
//!   large batches that worker is busy a while before it takes its next unit.

use stoker_wire::spec::PipelineSpec;

use super::backend::{BackendFault, SlotImages};
use super::memory::SlotMemory;
use super::Position;
use crate::transform::mix::{draw, mix_images, soft_labels, MixImages};

/// What the mix of one batch needs to know of it.
pub(super) struct MixBatch<'a> {
    pub(super) spec: &'a PipelineSpec,
    pub(super) seed: u64,
    pub(super) world_size: u32,
    pub(super) rank: u32,
    pub(super) pos: Position,
    pub(super) slot: usize,
    /// Samples served in the batch (the padding of a short batch is not mixed).
    pub(super) n: usize,
}

/// Mixes the batch in `b.slot` of `ring` and writes its soft labels (nothing without a batch
/// mix); `scratch` is the caller's, reused.
///
/// # Safety
/// The caller must be the finisher of the batch's last unit: every unit of the batch is
/// filled, no one else reads or writes the slot, and it is not yet published.
pub(super) unsafe fn mix_batch(
    b: &MixBatch<'_>,
    ring: &dyn SlotMemory,
    scratch: &mut Vec<u8>,
) -> Result<(), BackendFault> {
    let Some(mix) = &b.spec.batch_mix else {
        return Ok(());
    };
    let layout = ring.layout().slot;
    let SlotImages::Host(base) = ring.images(b.slot) else {
        return Err(BackendFault {
            device: "the ring's device".to_string(),
            reason: "a batch mix runs on host images; this ring's are device memory".to_string(),
        });
    };
    let (h, w) = b.spec.crop.output_size();
    let batch = b.pos.step * u64::from(b.world_size) + u64::from(b.rank);
    let d = draw(mix, b.seed, b.pos.epoch, batch, h, w);
    for v in 0..layout.views {
        let r = layout.view(v);
        // SAFETY: the view's `n <= batch_size` images lie inside the slot's image part
        // (SlotLayout, SlotMemory's contract), and the caller holds the whole slot.
        let bytes =
            unsafe { std::slice::from_raw_parts_mut(base.add(r.offset), b.n * r.image_bytes) };
        let im = MixImages {
            n: b.n,
            height: r.height as usize,
            width: r.width as usize,
            dtype: b.spec.dtype,
            layout: b.spec.layout,
        };
        mix_images(&d, &im, bytes, scratch);
    }
    let host = ring.host_ptr(b.slot);
    // SAFETY: the labels (i64, 8-aligned: SLOT_ALIGN) and the soft labels (f32, likewise) are
    // disjoint regions of the slot's host part (SlotLayout), valid for these lengths
    // (SlotMemory), and the caller holds the whole slot.
    let (labels, soft) = unsafe {
        (
            std::slice::from_raw_parts(host.add(layout.labels) as *const i64, b.n),
            std::slice::from_raw_parts_mut(
                host.add(layout.soft_labels) as *mut f32,
                layout.batch_size * layout.num_classes,
            ),
        )
    };
    soft_labels(&d, labels, layout.num_classes, soft);
    Ok(())
}
