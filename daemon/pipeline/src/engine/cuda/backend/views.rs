//! Several views of one image on the CUDA backend: the CPU route, sample by sample.
//!
//! # Design
//! - A unit of a job with several views goes the way of a replacement: each sample is read,
//!   decoded once and augmented into every view on the host by the backend's own
//!   [`CpuBackend`](crate::engine::cpu::CpuBackend) (the CPU backend's code, so the views are
//!   the CPU backend's bit for bit), then each view is copied into its place in device memory.
//!   Replacements of such a job take the same way. A one-view job's operations and erasing
//!   (filled or random) run in the GPU's kernels instead (`ops`); a batch mix of either runs
//!   on the GPU (`mix`).
//!
//! # Limitations
//! - Nothing of it runs on the GPU: no nvJPEG, no batched kernel; one synchronous upload per
//!   view and sample. A GPU multi-view path is future work (docs/views.md, docs/cuda.md).

use std::sync::atomic::Ordering;

use super::super::pending::Failed;
use super::CudaBackend;
use crate::engine::backend::SlotImages;
use crate::engine::backend::{
    Backend, BackendFault, Completion, SampleOutcome, SampleWork, UnitWork,
};

impl CudaBackend {
    /// Fills a unit of a job with several views on the CPU route, sample by sample; complete
    /// when it returns.
    pub(super) fn fill_views(
        &mut self,
        unit: &UnitWork<'_>,
        outcomes: &mut Vec<SampleOutcome>,
    ) -> Completion {
        let first = outcomes.len();
        for (k, &index) in unit.indices.iter().enumerate() {
            let work = SampleWork {
                job: unit.job,
                pos: unit.pos,
                index,
                at: unit.start + k,
                images: unit.images,
                layout: unit.layout,
                config: unit.config,
                stats: unit.stats,
                due: unit.due,
            };
            match self.fill_sample_on_cpu(&work) {
                Ok(outcome) => outcomes.push(outcome),
                Err(fault) => {
                    // The GPU failed, not the files: the unit's completion says so for all.
                    outcomes.truncate(first);
                    outcomes.extend(unit.indices.iter().map(|_| Ok(())));
                    return Completion::Pending(Box::new(Failed(fault)));
                }
            }
        }
        Completion::Done
    }

    /// Reads, decodes and augments one sample (every view) on the host, then copies each
    /// view into its place in the slot's device images; an error is the GPU's.
    pub(super) fn fill_sample_on_cpu(
        &mut self,
        work: &SampleWork<'_>,
    ) -> Result<SampleOutcome, BackendFault> {
        let host_layout = work.layout.one_sample();
        self.host_images.resize(host_layout.image_slot_bytes, 0);
        let host = SampleWork {
            images: SlotImages::Host(self.host_images.as_mut_ptr()),
            layout: host_layout,
            at: 0,
            ..*work
        };
        if let Err(bad) = self.cpu.fill_sample(&host) {
            return Ok(Err(bad));
        }
        // Decoded on the CPU: it counts in the GPU's decode mix as such.
        self.gpu.stats.cpu.fetch_add(1, Ordering::Relaxed);
        for view in 0..host_layout.views {
            let r = host_layout.view(view);
            let src = &self.host_images[r.offset..r.offset + r.image_bytes];
            if !self.put_sample(work.images, &work.layout, (view, work.at), src) {
                return Err(BackendFault {
                    device: format!("GPU {}", self.gpu.label),
                    reason: format!("sample {} could not be uploaded", work.index),
                });
            }
        }
        Ok(Ok(()))
    }
}
