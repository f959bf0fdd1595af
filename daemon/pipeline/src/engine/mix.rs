//! The batch mix in the engine: once every sample of a batch is in its slot (bad samples
//! settled), and before the batch is published, MixUp or CutMix runs over the batch's images
//! of every view and its soft labels are written (see [`crate::transform::mix`]).
//!
//! # Design
//! - Host images (the CPU backend): the worker that finishes a batch's last unit mixes it
//!   (`slots.rs` counts the units filled; the batch is not published before that worker's
//!   unit is finished), so the mix runs once per batch, whoever filled its samples: local
//!   workers or remote ones (`crate::remote` on the daemon's side).
//! - Device images (the CUDA backend, whose unit is the whole batch): the worker that filled
//!   the batch hands it, every sample settled (replacements and cleared samples written),
//!   to its backend's [`Backend::mix`] ([`on_device`]), which queues the mix kernel after
//!   the batch's work and completes after it; the batch's completion is waited for before
//!   the unit is finished, so the soft labels, written on the host at the finish as for host
//!   images, and the mixed pixels are published together. The pixels never leave the GPU.
//! - The draw is keyed by the job's seed, the epoch and the batch's number among all ranks'
//!   batches of the epoch (`step * world_size + rank`): the same on every run, whatever the
//!   threads or the backend.
//!
//! # Limitations
//! - One thread mixes a batch of host images (a pass over each view's bytes, after the
//!   batch's decodes): for large batches that worker is busy a while before it takes its next
//!   unit.
//! - A backend writing device memory must mix whole batches: a device ring's unit that is
//!   not the whole batch fails the feed rather than be served unmixed.

use stoker_wire::ring::SlotLayout;
use stoker_wire::spec::PipelineSpec;

use super::backend::{Backend, BackendFault, Completion, MixWork, PendingWork, SlotImages};
use super::memory::SlotMemory;
use super::Position;
use crate::transform::mix::{draw, mix_images, soft_labels, MixDraw, MixImages};

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

impl MixBatch<'_> {
    /// The batch's draw (`None` without a batch mix).
    fn draw(&self) -> Option<MixDraw> {
        let mix = self.spec.batch_mix.as_ref()?;
        let (h, w) = self.spec.crop.output_size();
        let batch = self.pos.step * u64::from(self.world_size) + u64::from(self.rank);
        Some(draw(mix, self.seed, self.pos.epoch, batch, h, w))
    }
}

/// Has `backend` mix the batch `b` in device memory after the work `filled` stands for, when
/// the job has a batch mix and `ring`'s images are on a device; otherwise `filled` as it is
/// (host images are mixed at the finish, [`mix_batch`]). `whole`: the unit filled is the whole
/// batch (a device batch mixed otherwise would be served unmixed: it fails instead).
pub(super) fn on_device(
    b: &MixBatch<'_>,
    whole: bool,
    ring: &dyn SlotMemory,
    backend: &mut dyn Backend,
    filled: Completion,
) -> Completion {
    let images = ring.images(b.slot);
    let Some(draw) = b.draw().filter(|_| matches!(images, SlotImages::Device(_))) else {
        return filled;
    };
    if !whole {
        let fault = BackendFault {
            device: "the ring's device".to_string(),
            reason: "a batch mix in device memory needs the whole batch in one unit".to_string(),
        };
        return Completion::Pending(Box::new(Unmixed { filled, fault }));
    }
    let work = MixWork {
        spec: b.spec,
        draw,
        images,
        layout: ring.layout().slot,
        n: b.n,
    };
    backend.mix(&work, filled)
}

/// A batch that cannot be mixed: complete once its fill is, then failed with `fault`.
pub(crate) struct Unmixed {
    pub(crate) filled: Completion,
    pub(crate) fault: BackendFault,
}

impl PendingWork for Unmixed {
    fn wait(self: Box<Self>) -> Result<(), BackendFault> {
        if let Completion::Pending(p) = self.filled {
            p.wait()?;
        }
        Err(self.fault)
    }
}

/// View `v`'s `n` images in a slot of `layout` as the mix sees them.
pub(crate) fn view_images(
    layout: &SlotLayout,
    v: usize,
    spec: &PipelineSpec,
    n: usize,
) -> MixImages {
    let r = layout.view(v);
    MixImages {
        n,
        height: r.height as usize,
        width: r.width as usize,
        dtype: spec.dtype,
        layout: spec.layout,
    }
}

/// Mixes the batch in `b.slot` of `ring` if its images are host memory (device images were
/// mixed by their backend, [`on_device`]), and writes its soft labels (nothing without a
/// batch mix); `scratch` is the caller's, reused.
///
/// # Safety
/// The caller must be the finisher of the batch's last unit: every unit of the batch is
/// filled, no one else reads or writes the slot, and it is not yet published.
pub(super) unsafe fn mix_batch(b: &MixBatch<'_>, ring: &dyn SlotMemory, scratch: &mut Vec<u8>) {
    let Some(d) = b.draw() else {
        return;
    };
    let layout = ring.layout().slot;
    if let SlotImages::Host(base) = ring.images(b.slot) {
        for v in 0..layout.views {
            let r = layout.view(v);
            // SAFETY: the view's `n <= batch_size` images lie inside the slot's image part
            // (SlotLayout, SlotMemory's contract), and the caller holds the whole slot.
            let bytes =
                unsafe { std::slice::from_raw_parts_mut(base.add(r.offset), b.n * r.image_bytes) };
            mix_images(&d, &view_images(&layout, v, b.spec, b.n), bytes, scratch);
        }
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
}
