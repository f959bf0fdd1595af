//! The batch mix on the GPU (docs/augment.md, "MixUp and CutMix"): once a whole batch is in
//! the slot, `stoker_mix` runs over each view's device images in place, with the draw the CPU
//! backend makes for the batch (`engine::mix`); the soft labels are the engine's, on the host.
//!
//! # Design
//! - Ordering: the engine hands the batch to [`Backend::mix`](crate::engine::Backend::mix) on
//!   the worker that filled it, after `fill` returned and every bad sample was settled (a
//!   replacement or a zeroed sample is uploaded and synchronised before its `fill_sample` or
//!   `clear_sample` returns). The batch's decode, kernels and CPU-route uploads are queued on
//!   this backend's stream, so the mix launches queued there after them run after them
//!   (stream order), and the event recorded after the last view's launch completes after
//!   all of it. The completion thread waits for that event, then for the fill's own
//!   completion (long done), and only then is the unit finished and the batch published,
//!   its soft labels written meanwhile on the host.
//! - One launch per view; the pixels never leave device memory. The event is the `done` of a
//!   set from the backend's pool, returned there once waited for (steady state creates none).
//!
//! # Limitations
//! - The mix is queued on the backend's stream: work a later version queues for the batch on
//!   another stream must be ordered before it (an event wait) for the mix to see it.

use crate::sync::lock;
use std::sync::Arc;

use super::super::pending::{EventPool, EventSet};
use super::super::{breaks_context, Gpu};
use super::CudaBackend;
use crate::engine::backend::{BackendFault, Completion, MixWork, PendingWork, SlotImages};
use crate::engine::mix::{view_images, Unmixed};
use crate::transform::mix::kernel_batch;

/// A mixed batch: complete once the event after its mix completed and its fill's completion
/// was waited for.
struct MixedBatch {
    gpu: Arc<Gpu>,
    filled: Completion,
    events: EventSet,
    pool: EventPool,
}

impl PendingWork for MixedBatch {
    fn wait(self: Box<Self>) -> Result<(), BackendFault> {
        let MixedBatch {
            gpu,
            filled,
            events,
            pool,
        } = *self;
        let mixed = events.done.synchronize();
        if let Completion::Pending(p) = filled {
            // The fill's fault, if any, is the cause of whatever the mix met.
            p.wait()?;
        }
        if let Err(e) = mixed {
            return Err(gpu.fault("the batch's mix failed", &e, breaks_context(&e)));
        }
        lock(&pool).push(events);
        Ok(())
    }
}

impl CudaBackend {
    /// Queues the mix of `work`'s batch on the stream after what `filled` stands for; the
    /// batch's completion is then the mix's event (see the module docs).
    pub(super) fn mix_on_stream(&mut self, work: &MixWork<'_>, filled: Completion) -> Completion {
        let SlotImages::Device(base) = work.images else {
            panic!(
                "the CUDA backend mixes device memory only, got {:?}",
                work.images
            );
        };
        let queued = match self.gpu.broken_fault() {
            // Never served unmixed: the batch fails with the GPU's fault.
            Some(fault) => Err(fault),
            None => self.queue_mix(work, base),
        };
        match queued {
            Ok(events) => Completion::Pending(Box::new(MixedBatch {
                gpu: self.gpu.clone(),
                filled,
                events,
                pool: self.events.clone(),
            })),
            Err(fault) => {
                // A view's launch may be queued: nothing is finished before the stream is.
                let _ = self.stream.synchronize();
                Completion::Pending(Box::new(Unmixed { filled, fault }))
            }
        }
    }

    /// One launch per view, then the event after them.
    fn queue_mix(&mut self, work: &MixWork<'_>, base: u64) -> Result<EventSet, BackendFault> {
        for view in 0..work.layout.views {
            let im = view_images(&work.layout, view, work.spec, work.n);
            let dst = base + work.layout.view(view).offset as u64;
            let batch = kernel_batch(&work.draw, &im, dst);
            // SAFETY: the view's `n` images lie in the slot's device memory (SlotMemory),
            // which no one else reads or writes before the batch is published, and the work
            // queued for them earlier on this stream runs before the launch.
            let r = unsafe { self.gpu.kernels.mix(&self.stream, &batch) };
            r.map_err(|e| self.launch_fault("mix launch", e))?;
        }
        let events = self.take_events()?;
        events
            .done
            .record(&self.stream)
            .map_err(|e| self.fault("event record", &e))?;
        Ok(events)
    }
}
