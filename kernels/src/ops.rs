//! Host side of the operations' kernels (the `stoker_op_*` entry points of
//! `kernels/cu/augment.cu`): the parameter structs, mirrored field for field, and the launch
//! wrappers. The per-sample steps are drawn and lowered to [`OpStep`]s by the pipeline
//! (daemon/pipeline/src/transform/ops/lower.rs); this crate only carries them.
//!
//! # Design
//! A view with operations is cropped to 8-bit packed RGB in a device buffer (`stoker_augment`
//! with the u8 NHWC pixel spec), then each step position is one [`AugmentKernels::op_step`]
//! launch from one buffer into the other (ping-pong; a sample with fewer steps copies), after
//! an [`AugmentKernels::op_stats`] launch where a step needs a per-image statistic; then
//! [`AugmentKernels::op_convert`] normalises into the slot and [`AugmentKernels::op_erase`]
//! writes RandomErasing's boxes. Everything is queued on one stream; the parameters are one
//! upload with the batch's sample array.

use std::ffi::c_void;

use crate::augment::{AugmentKernels, KernelError, BLOCK, MAX_GRID_Z};
use stoker_nvidia::cuda::Stream;

/// `OpStep::kind` of a sample with no step at this position (a copy).
pub const OP_NONE: u32 = 0;
/// `adjust_brightness`, factor in `f[0]`.
pub const OP_BRIGHTNESS: u32 = 1;
/// `adjust_contrast`, factor in `f[0]` (the mean from `op_stats`).
pub const OP_CONTRAST: u32 = 2;
/// `adjust_saturation`, factor in `f[0]`.
pub const OP_SATURATION: u32 = 3;
/// `adjust_hue`, factor in `f[0]`.
pub const OP_HUE: u32 = 4;
/// `adjust_sharpness`, factor in `f[0]`.
pub const OP_SHARPNESS: u32 = 5;
/// `rgb_to_grayscale`.
pub const OP_GRAYSCALE: u32 = 6;
/// `gaussian_blur`: taps across `i[0]`, down `i[1]`, their weights from `i[2]` in the pool.
pub const OP_BLUR: u32 = 7;
/// `solarize`, threshold in `f[0]`.
pub const OP_SOLARIZE: u32 = 8;
/// `posterize`, the kept bits' mask in `i[0]`.
pub const OP_POSTERIZE: u32 = 9;
/// `equalize` (its tables from `op_stats`).
pub const OP_EQUALIZE: u32 = 10;
/// `autocontrast` (its tables from `op_stats`).
pub const OP_AUTOCONTRAST: u32 = 11;
/// `invert`.
pub const OP_INVERT: u32 = 12;
/// `vertical_flip`.
pub const OP_VFLIP: u32 = 13;
/// An affine warp: `f[0..6]` the grid coefficients, `f[6..9]` the fill, `i[0]` 1 for bilinear.
pub const OP_WARP: u32 = 14;
/// `rot90` by `i[0]` quarter turns.
pub const OP_ROT90: u32 = 15;

/// `OpsHead::erase` of a box filled with one value per channel.
pub const ERASE_FILL: u32 = 1;
/// `OpsHead::erase` of a box of values drawn per element (`value="random"`).
pub const ERASE_RANDOM: u32 = 2;

/// Bytes of one image's `OpStats` in augment.cu (a mean and three 256-entry tables).
pub const OP_STATS_BYTES: usize = 784;

/// `OpStep` in augment.cu: one step of one sample, 64 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpStep {
    /// One of the `OP_*` codes.
    pub kind: u32,
    /// Integer parameters (see each code).
    pub i: [u32; 3],
    /// Float parameters (see each code).
    pub f: [f32; 12],
}

/// `OpsBatch` in augment.cu: one step position of a batch, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpsBatch {
    /// `n` images of `height * width * 3` bytes read.
    pub src: u64,
    /// As many written.
    pub dst: u64,
    /// `n * max_steps` [`OpStep`]s, sample after sample.
    pub steps: u64,
    /// The blur weights (f32) the steps index.
    pub weights: u64,
    /// `n * OP_STATS_BYTES` bytes of per-image statistics.
    pub stats: u64,
    /// Samples.
    pub n: u32,
    /// Pixels across.
    pub width: u32,
    /// Pixels down.
    pub height: u32,
    /// Steps per sample in `steps`.
    pub max_steps: u32,
    /// The position this launch applies.
    pub step: u32,
    /// Zero.
    pub pad: u32,
}

/// `OpsHead` in augment.cu: what the last kernels do to one sample, 40 bytes.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct OpsHead {
    /// Nonzero: zeros (a failed sample or one another route writes), nothing erased.
    pub zero: u32,
    /// The box below is erased: [`ERASE_FILL`] with `value`, [`ERASE_RANDOM`] with the
    /// values at `values`; 0: nothing erased.
    pub erase: u32,
    /// First row of the box.
    pub top: u32,
    /// First column.
    pub left: u32,
    /// Rows.
    pub height: u32,
    /// Columns.
    pub width: u32,
    /// The value per channel in output units ([`ERASE_FILL`]).
    pub value: [f32; 3],
    /// [`ERASE_RANDOM`]: the index in the float pool (`FinishBatch::src` of `op_erase`) of
    /// the box's `3 * height * width` values, channel by channel, row by row.
    pub values: u32,
}

/// `FinishBatch` in augment.cu: the conversion into the slot and the erasing, by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct FinishBatch {
    /// `op_convert`: the 8-bit crops; `op_erase`: the float pool of [`ERASE_RANDOM`]'s
    /// values (unread without one).
    pub src: u64,
    /// Image 0 of the slot.
    pub dst: u64,
    /// `n` [`OpsHead`]s.
    pub heads: u64,
    /// Bytes from one output image to the next.
    pub image_bytes: u64,
    /// Samples.
    pub n: u32,
    /// Output width.
    pub out_w: u32,
    /// Output height.
    pub out_h: u32,
    /// `DTYPE_*` code.
    pub dtype: u32,
    /// `LAYOUT_*` code.
    pub layout: u32,
    /// Zero.
    pub pad: u32,
    /// Per-channel mean (0..1 scale).
    pub mean: [f32; 3],
    /// Per-channel standard deviation.
    pub std: [f32; 3],
}

/// The bytes of a slice of plain parameter values, as uploaded.
///
/// # Safety
/// Implement only for types whose every byte is initialised: no padding, no pointers.
pub unsafe trait PlainBytes: Copy {
    /// The slice's bytes.
    fn bytes(items: &[Self]) -> &[u8] {
        // SAFETY: the implementing type has no padding (the trait's contract), so every byte
        // of the slice is initialised.
        unsafe { std::slice::from_raw_parts(items.as_ptr().cast(), std::mem::size_of_val(items)) }
    }
}

// SAFETY: `repr(C)` of u32 and f32 fields only, 64 bytes with no padding (tested).
unsafe impl PlainBytes for OpStep {}
// SAFETY: `repr(C)` of u32 and f32 fields only, 40 bytes with no padding (tested).
unsafe impl PlainBytes for OpsHead {}
// SAFETY: a float has no padding.
unsafe impl PlainBytes for f32 {}

pub(crate) fn grid(w: u32, h: u32, n: u32) -> ((u32, u32, u32), (u32, u32, u32)) {
    (
        (
            w.div_ceil(BLOCK.0),
            h.div_ceil(BLOCK.1),
            n.clamp(1, MAX_GRID_Z),
        ),
        (BLOCK.0, BLOCK.1, 1),
    )
}

impl AugmentKernels {
    /// Launches `name` with one struct parameter by value.
    ///
    /// # Safety
    /// `T` must be the `repr(C)` mirror of the kernel's parameter and the device memory it
    /// names valid until the launch completes on `stream`.
    pub(crate) unsafe fn launch_one<T: Copy>(
        &self,
        name: &str,
        stream: &Stream,
        dims: ((u32, u32, u32), (u32, u32, u32)),
        param: &T,
    ) -> Result<(), KernelError> {
        let f = self.module.function(name)?;
        let mut p = *param;
        let mut params = [(&mut p as *mut T).cast::<c_void>()];
        // SAFETY: the caller's promise.
        unsafe { f.launch(stream, dims.0, dims.1, &mut params) }?;
        Ok(())
    }

    /// Launches `stoker_op_step` for position `batch.step`.
    ///
    /// # Safety
    /// Every address of `batch` must name device memory of the sizes its fields give, valid
    /// until the launch completes on `stream`; `src` and `dst` must not overlap.
    pub unsafe fn op_step(&self, stream: &Stream, batch: &OpsBatch) -> Result<(), KernelError> {
        if batch.n == 0 || batch.width == 0 || batch.height == 0 {
            return Ok(());
        }
        let dims = grid(batch.width, batch.height, batch.n);
        // SAFETY: the caller's promise; OpsBatch mirrors the kernel's parameter.
        unsafe { self.launch_one("stoker_op_step", stream, dims, batch) }
    }

    /// Launches `stoker_op_stats` for position `batch.step` (reads `src`, writes `stats`).
    ///
    /// # Safety
    /// As [`AugmentKernels::op_step`].
    pub unsafe fn op_stats(&self, stream: &Stream, batch: &OpsBatch) -> Result<(), KernelError> {
        if batch.n == 0 {
            return Ok(());
        }
        let threads = batch.n * 3;
        let dims = ((threads.div_ceil(64), 1, 1), (64, 1, 1));
        // SAFETY: the caller's promise; OpsBatch mirrors the kernel's parameter.
        unsafe { self.launch_one("stoker_op_stats", stream, dims, batch) }
    }

    /// Launches `stoker_op_convert`: the crops at `src` into the slot.
    ///
    /// # Safety
    /// `src` must hold `n` crops of the output size, `dst` `n * image_bytes` writable bytes,
    /// `heads` `n` [`OpsHead`]s, all valid until the launch completes on `stream`.
    pub unsafe fn op_convert(
        &self,
        stream: &Stream,
        batch: &FinishBatch,
    ) -> Result<(), KernelError> {
        if batch.n == 0 || batch.out_w == 0 || batch.out_h == 0 {
            return Ok(());
        }
        let dims = grid(batch.out_w, batch.out_h, batch.n);
        // SAFETY: the caller's promise; FinishBatch mirrors the kernel's parameter.
        unsafe { self.launch_one("stoker_op_convert", stream, dims, batch) }
    }

    /// Launches `stoker_op_erase`: each head's box into the slot.
    ///
    /// # Safety
    /// As [`AugmentKernels::op_convert`], but `src` is the float pool every
    /// [`ERASE_RANDOM`] head's values lie in (unread without one).
    pub unsafe fn op_erase(&self, stream: &Stream, batch: &FinishBatch) -> Result<(), KernelError> {
        if batch.n == 0 || batch.out_w == 0 || batch.out_h == 0 {
            return Ok(());
        }
        let dims = grid(batch.out_w, batch.out_h, batch.n);
        // SAFETY: the caller's promise; FinishBatch mirrors the kernel's parameter.
        unsafe { self.launch_one("stoker_op_erase", stream, dims, batch) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn layouts_match_augment_cu() {
        assert_eq!(size_of::<OpStep>(), 64);
        assert_eq!(offset_of!(OpStep, f), 16);
        assert_eq!(size_of::<OpsBatch>(), 64);
        assert_eq!(offset_of!(OpsBatch, n), 40);
        assert_eq!(offset_of!(OpsBatch, step), 56);
        assert_eq!(size_of::<OpsHead>(), 40);
        assert_eq!(offset_of!(OpsHead, value), 24);
        assert_eq!(size_of::<FinishBatch>(), 80);
        assert_eq!(offset_of!(FinishBatch, n), 32);
        assert_eq!(offset_of!(FinishBatch, mean), 56);
    }

    #[test]
    fn codes_match_the_defines_in_augment_cu() {
        let src = crate::sources::AUGMENT_CU.source;
        for (name, v) in [
            ("OP_NONE", OP_NONE),
            ("OP_BRIGHTNESS", OP_BRIGHTNESS),
            ("OP_CONTRAST", OP_CONTRAST),
            ("OP_SATURATION", OP_SATURATION),
            ("OP_HUE", OP_HUE),
            ("OP_SHARPNESS", OP_SHARPNESS),
            ("OP_GRAYSCALE", OP_GRAYSCALE),
            ("OP_BLUR", OP_BLUR),
            ("OP_SOLARIZE", OP_SOLARIZE),
            ("OP_POSTERIZE", OP_POSTERIZE),
            ("OP_EQUALIZE", OP_EQUALIZE),
            ("OP_AUTOCONTRAST", OP_AUTOCONTRAST),
            ("OP_INVERT", OP_INVERT),
            ("OP_VFLIP", OP_VFLIP),
            ("OP_WARP", OP_WARP),
            ("OP_ROT90", OP_ROT90),
            ("ERASE_FILL", ERASE_FILL),
            ("ERASE_RANDOM", ERASE_RANDOM),
        ] {
            assert!(src.contains(&format!("#define {name} {v}u")), "{name}");
        }
        assert!(src.contains(&format!(
            "static_assert(sizeof(OpStats) == {OP_STATS_BYTES}"
        )));
    }
}
