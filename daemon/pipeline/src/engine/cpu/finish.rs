//! The last stage of one view on the CPU: the fused crop → resize → flip → normalise →
//! convert for a view without operations, or, for a view with them, the crop to 8-bit
//! pixels, the view's drawn operations, the conversion, and its RandomErasing.
//!
//! # Design
//! - The operations' draws and the erasing's come from their own keyed streams (`Stream::Ops`,
//!   `Stream::Erasing`) of the view's seed, epoch and sample index: a view that adds
//!   operations keeps the crop box and flip it had without them.

use stoker_kernels::image::{CropBox, RgbImage};
use stoker_wire::spec::PipelineSpec;

use crate::transform::augment::Augmenter;
use crate::transform::ops::{
    apply_step, convert_into, draw_erasing, draw_steps, erase_into, OpScratch,
};
use crate::transform::rng::{KeyedRng, Stream};

/// What one view of one sample is: its specs and the key of its draws.
#[derive(Debug, Clone, Copy)]
pub(super) struct ViewKey<'a> {
    /// The view's spec (`Job::view_specs`).
    pub(super) spec: &'a PipelineSpec,
    /// The spec of its 8-bit pixels when it has operations (`Job::pixel_specs`).
    pub(super) pixels: Option<&'a PipelineSpec>,
    /// The view's seed (`view_seed`).
    pub(super) seed: u64,
    /// The epoch.
    pub(super) epoch: u64,
    /// The sample's global index.
    pub(super) index: u64,
}

/// One thread's last stage: the augmenter, and the pixels and buffers of the operations.
#[derive(Debug, Default)]
pub(super) struct Finisher {
    augmenter: Augmenter,
    /// A view's 8-bit pixels between its crop and its operations.
    pixels: RgbImage,
    ops: OpScratch,
}

impl Finisher {
    /// Writes one view of `image` (its crop `within`, flipped if `flip`) into `out`.
    pub(super) fn finish_view(
        &mut self,
        image: &RgbImage,
        within: CropBox,
        flip: bool,
        key: ViewKey<'_>,
        out: &mut [u8],
    ) {
        let spec = key.spec;
        match key.pixels {
            None => self.augmenter.augment_into(image, within, flip, spec, out),
            Some(pixel_spec) => {
                let (h, w) = spec.crop.output_size();
                self.pixels.reset(w, h);
                self.augmenter
                    .augment_into(image, within, flip, pixel_spec, &mut self.pixels.data);
                let mut rng = KeyedRng::new(key.seed, key.epoch, key.index, Stream::Ops);
                let steps = &mut self.ops.steps;
                steps.clear();
                draw_steps(&spec.ops, &mut rng, w, h, steps);
                let steps = std::mem::take(steps);
                for step in &steps {
                    apply_step(step, &mut self.pixels, &mut self.ops);
                }
                self.ops.steps = steps;
                convert_into(&self.pixels, spec, out);
            }
        }
        if let Some(erasing) = &spec.erasing {
            let (h, w) = spec.crop.output_size();
            let mut rng = KeyedRng::new(key.seed, key.epoch, key.index, Stream::Erasing);
            if let Some(area) = draw_erasing(erasing, &mut rng, h, w) {
                erase_into(area, &erasing.value, spec, &mut rng, out);
            }
        }
    }
}
