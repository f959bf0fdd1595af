//! Host side of the batch mix's kernel (`stoker_mix` in `kernels/cu/augment.cu`): its
//! parameter struct, mirrored field for field, and the launch wrapper. What a batch draws
//! (MixUp or CutMix, lam, the box) is the pipeline's (daemon/pipeline/src/transform/mix.rs,
//! whose `mix_images` is the kernel's reference); this crate only carries it.
//!
//! # Design
//! One launch per view of a batch, in place in the slot, once every image of the batch is
//! there: each thread owns one element position of the region mixed (the whole image for
//! MixUp, CutMix's box) and walks the batch from the last image down, reading and writing
//! each element once; neighbouring threads take neighbouring elements in either layout (see
//! the `.cu`).
//!
//! # Limitations
//! Float dtypes only (a spec with a batch mix has one: validation refuses u8).

use crate::augment::{AugmentKernels, KernelError, LAYOUT_NHWC};
use crate::ops::grid;
use stoker_nvidia::cuda::Stream;

/// `MixBatch::kind` of MixUp: a blend with the previous image.
pub const MIX_UP: u32 = 0;
/// `MixBatch::kind` of CutMix: the previous image's box pasted.
pub const MIX_CUT: u32 = 1;

/// `MixBatch` in augment.cu: one view of a batch, 64 bytes, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct MixBatch {
    /// Device address of the view's image 0 in the slot.
    pub dst: u64,
    /// Bytes from one image to the next.
    pub image_bytes: u64,
    /// Images mixed (the served ones; a short batch's padding is left alone).
    pub n: u32,
    /// Image width in pixels.
    pub width: u32,
    /// Image height in pixels.
    pub height: u32,
    /// One of the float `DTYPE_*` codes (`crate::augment`).
    pub dtype: u32,
    /// One of the `LAYOUT_*` codes.
    pub layout: u32,
    /// [`MIX_UP`] or [`MIX_CUT`].
    pub kind: u32,
    /// MixUp: the weight of an image's own pixels (lam, as f32).
    pub own: f32,
    /// MixUp: the weight of the previous image's (1 - lam, as f32).
    pub other: f32,
    /// The region mixed: first column.
    pub x1: u32,
    /// First row.
    pub y1: u32,
    /// One past the last column.
    pub x2: u32,
    /// One past the last row.
    pub y2: u32,
}

impl AugmentKernels {
    /// Launches `stoker_mix` over one view of a batch (nothing for an empty region or batch).
    ///
    /// # Safety
    /// `batch.dst` must point at `n * image_bytes` device bytes holding the view's images,
    /// which no other work reads or writes until the launch completes on `stream`.
    pub unsafe fn mix(&self, stream: &Stream, batch: &MixBatch) -> Result<(), KernelError> {
        if batch.n == 0 || batch.x1 >= batch.x2 || batch.y1 >= batch.y2 {
            return Ok(());
        }
        // x over a row's run of elements, z over the channel planes (see the `.cu`).
        let (run, planes) = if batch.layout == LAYOUT_NHWC {
            ((batch.x2 - batch.x1) * 3, 1)
        } else {
            (batch.x2 - batch.x1, 3)
        };
        let ((gx, gy, _), block) = grid(run, batch.y2 - batch.y1, 1);
        // SAFETY: the caller's promise; MixBatch mirrors the kernel's parameter.
        unsafe { self.launch_one("stoker_mix", stream, ((gx, gy, planes), block), batch) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layout_matches_augment_cu() {
        assert_eq!(size_of::<MixBatch>(), 64);
        assert_eq!(offset_of!(MixBatch, n), 16);
        assert_eq!(offset_of!(MixBatch, kind), 36);
        assert_eq!(offset_of!(MixBatch, own), 40);
        assert_eq!(offset_of!(MixBatch, x1), 48);
        assert_eq!(offset_of!(MixBatch, y2), 60);
    }

    #[test]
    fn codes_match_the_defines_in_augment_cu() {
        let src = crate::sources::AUGMENT_CU.source;
        assert!(src.contains(&format!("#define MIX_UP {MIX_UP}u")));
        assert!(src.contains(&format!("#define MIX_CUT {MIX_CUT}u")));
        assert!(src.contains("extern \"C\" __global__ void stoker_mix(MixBatch b)"));
    }
}
