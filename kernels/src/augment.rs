//! Host side of the fused augment kernel (`kernels/cu/augment.cu`): the parameter structs,
//! mirrored field for field, and the launch wrapper.
//!
//! # Design
//! One launch per output batch. The per-sample parameters (decoded image address, pitch, size,
//! crop box, flip) live in a device array the caller fills (one small upload per batch; the
//! CUDA backend uploads it from a pinned staging buffer per batch in flight, `cuMemHostAlloc`:
//! daemon/pipeline/src/engine/cuda/backend/staging.rs); the per-batch ones (slot address, output size, dtype,
//! layout, mean/std) are passed by value. Grid: 32x8 threads per block over the output image,
//! z over samples. The math is the CPU reference's; see the comment at the top of the `.cu`.
//!
//! # Limitations
//! The launch has run only on the emulated GPU, which runs the kernel's host build; no real
//! GPU has run it yet (docs/cuda.md, "Unverified until a GPU run").

use std::ffi::c_void;

use stoker_wire::spec::{DType, Layout, PipelineSpec};

use crate::image::CropBox;
use crate::sources::AUGMENT_CU;
use stoker_nvidia::cuda::{CudaError, Device, DeviceBuffer, Module, Stream};
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc, NvrtcError};

/// `AugmentBatch::dtype` for u8 output (`DTYPE_U8` in augment.cu).
pub const DTYPE_U8: u32 = 0;
/// `AugmentBatch::dtype` for IEEE half-precision output.
pub const DTYPE_F16: u32 = 1;
/// `AugmentBatch::dtype` for bfloat16 output.
pub const DTYPE_BF16: u32 = 2;
/// `AugmentBatch::dtype` for f32 output.
pub const DTYPE_F32: u32 = 3;
/// `AugmentBatch::layout` for channels-first images (C, H, W).
pub const LAYOUT_NCHW: u32 = 0;
/// `AugmentBatch::layout` for channels-last images (H, W, C).
pub const LAYOUT_NHWC: u32 = 1;

/// Threads per block (x over columns, y over rows).
pub(crate) const BLOCK: (u32, u32) = (32, 8);
/// The largest grid z the hardware takes; larger batches loop inside the kernel.
pub(crate) const MAX_GRID_Z: u32 = 65_535;

/// `AugmentSample` in augment.cu: one sample of a batch.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AugmentSample {
    /// Device address of the decoded image, packed RGB u8.
    pub src: u64,
    /// Bytes from one row of `src` to the next.
    pub pitch: u64,
    /// Decoded image width in pixels.
    pub width: u32,
    /// Decoded image height in pixels.
    pub height: u32,
    /// Nonzero: mirror horizontally.
    pub flip: u32,
    /// Nonzero: write zeros (failed sample or padding) and read nothing.
    pub zero: u32,
    /// Crop box left edge in source pixels ([`CropBox::x`]).
    pub crop_x: f64,
    /// Crop box top edge in source pixels.
    pub crop_y: f64,
    /// Crop box width in source pixels.
    pub crop_w: f64,
    /// Crop box height in source pixels.
    pub crop_h: f64,
}

impl AugmentSample {
    /// A sample decoded at `src` (`pitch` bytes per row) to be cropped at `crop` and maybe flipped.
    pub fn new(src: u64, pitch: u64, width: u32, height: u32, crop: CropBox, flip: bool) -> Self {
        AugmentSample {
            src,
            pitch,
            width,
            height,
            flip: flip as u32,
            zero: 0,
            crop_x: crop.x,
            crop_y: crop.y,
            crop_w: crop.w,
            crop_h: crop.h,
        }
    }

    /// A sample whose output is all zero bytes.
    pub fn zeroed() -> Self {
        AugmentSample {
            zero: 1,
            ..AugmentSample::default()
        }
    }

    /// The struct's bytes, as uploaded to the device.
    pub fn as_bytes(samples: &[AugmentSample]) -> &[u8] {
        // SAFETY: `AugmentSample` is `repr(C)` plain data of 64 bytes with no padding (checked
        // by a test), so every byte is initialised.
        unsafe {
            std::slice::from_raw_parts(samples.as_ptr().cast(), std::mem::size_of_val(samples))
        }
    }
}

/// `AugmentBatch` in augment.cu: one batch, passed by value.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct AugmentBatch {
    /// Device address of the slot's first image.
    pub dst: u64,
    /// Device address of `n` [`AugmentSample`]s.
    pub samples: u64,
    /// Bytes from one output image to the next.
    pub image_bytes: u64,
    /// Samples in the batch (grid z; 0 launches nothing).
    pub n: u32,
    /// Output width in pixels.
    pub out_w: u32,
    /// Output height in pixels.
    pub out_h: u32,
    /// Output element type, one of the `DTYPE_*` codes.
    pub dtype: u32,
    /// Output layout, one of the `LAYOUT_*` codes.
    pub layout: u32,
    /// Nonzero: filter taps stay inside the crop box (`reference::tap_window`).
    pub clamp_to_crop: u32,
    /// Per-channel (R, G, B) mean, 0..1 scale, subtracted from float outputs (u8 ignores it).
    pub mean: [f32; 3],
    /// Per-channel (R, G, B) standard deviation the float outputs are divided by.
    pub std: [f32; 3],
}

/// The kernel's `DTYPE_*` code for a spec's dtype.
pub fn dtype_code(d: DType) -> u32 {
    match d {
        DType::U8 => DTYPE_U8,
        DType::F16 => DTYPE_F16,
        DType::Bf16 => DTYPE_BF16,
        DType::F32 => DTYPE_F32,
    }
}

/// The kernel's `LAYOUT_*` code for a spec's layout.
pub fn layout_code(l: Layout) -> u32 {
    match l {
        Layout::Nchw => LAYOUT_NCHW,
        Layout::Nhwc => LAYOUT_NHWC,
    }
}

impl AugmentBatch {
    /// The batch parameters for `spec`, writing `n` images from `dst`, reading samples at
    /// `samples`.
    pub fn new(spec: &PipelineSpec, dst: u64, samples: u64, n: u32) -> AugmentBatch {
        let (out_h, out_w) = spec.crop.output_size();
        AugmentBatch {
            dst,
            samples,
            image_bytes: spec.image_bytes() as u64,
            n,
            out_w,
            out_h,
            dtype: dtype_code(spec.dtype),
            layout: layout_code(spec.layout),
            clamp_to_crop: u32::from(matches!(
                spec.crop,
                stoker_wire::spec::Crop::RandomResized { .. }
            )),
            mean: spec.mean,
            std: spec.std,
        }
    }

    /// (grid, block) of the launch for this batch.
    pub(crate) fn launch_dims(&self) -> ((u32, u32, u32), (u32, u32, u32)) {
        let grid = (
            self.out_w.div_ceil(BLOCK.0),
            self.out_h.div_ceil(BLOCK.1),
            self.n.clamp(1, MAX_GRID_Z),
        );
        (grid, (BLOCK.0, BLOCK.1, 1))
    }
}

/// The byte `stoker_fill_pattern` writes at index `i` (the IPC self-test checks it).
pub fn pattern_byte(i: u64, seed: u32) -> u8 {
    ((i ^ ((seed as u64) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// What can go wrong preparing or launching a kernel.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum KernelError {
    /// The driver failed loading the module or launching.
    #[error(transparent)]
    Cuda(#[from] CudaError),
    /// augment.cu did not compile, or no NVRTC loads.
    #[error(transparent)]
    Nvrtc(#[from] NvrtcError),
    /// A batch with samples but an output of 0 pixels across or down.
    #[error("invalid launch: empty output size")]
    EmptyOutput,
}

/// augment.cu loaded on one device.
#[derive(Debug)]
pub struct AugmentKernels {
    pub(crate) module: Module,
}

impl AugmentKernels {
    /// Compiles (or takes from `cache`) augment.cu for `device`'s compute capability and loads it.
    pub fn load(
        device: &Device,
        nvrtc: &Nvrtc,
        cache: Option<&KernelCache>,
    ) -> Result<AugmentKernels, KernelError> {
        let (major, minor) = device.info().compute_capability;
        let arch = major * 10 + minor;
        let cubin = match cache {
            Some(c) => c.get_or_compile(nvrtc, &AUGMENT_CU, arch)?,
            None => nvrtc.compile(&AUGMENT_CU, arch)?,
        };
        let module = device.load_module(&cubin)?;
        // Fail now, not at the first batch, if an entry point is missing.
        for name in [
            "stoker_augment",
            "stoker_op_step",
            "stoker_op_stats",
            "stoker_op_convert",
            "stoker_op_erase",
            "stoker_mix",
            "stoker_fill_pattern",
            "stoker_check_pattern",
        ] {
            module.function(name)?;
        }
        Ok(AugmentKernels { module })
    }

    /// Launches `stoker_augment` for one batch on `stream`.
    ///
    /// # Safety
    /// `batch.dst` must point at `n * image_bytes` writable device bytes and `batch.samples` at
    /// `n` [`AugmentSample`]s whose `src` images (`height * pitch` bytes each) and the samples
    /// array itself stay valid and unchanged until the launch completes on `stream`.
    pub unsafe fn augment(&self, stream: &Stream, batch: &AugmentBatch) -> Result<(), KernelError> {
        if batch.n == 0 {
            return Ok(());
        }
        if batch.out_w == 0 || batch.out_h == 0 {
            return Err(KernelError::EmptyOutput);
        }
        let f = self.module.function("stoker_augment")?;
        let (grid, block) = batch.launch_dims();
        let mut b = *batch;
        let mut params = [(&mut b as *mut AugmentBatch).cast::<c_void>()];
        // SAFETY: the one parameter is an `AugmentBatch` by value, mirrored by `repr(C)`; the
        // caller guarantees the device memory it names.
        unsafe { f.launch(stream, grid, block, &mut params) }?;
        Ok(())
    }

    /// Fills `buf` with [`pattern_byte`]s (self-test).
    pub fn fill_pattern(
        &self,
        stream: &Stream,
        buf: &DeviceBuffer,
        seed: u32,
    ) -> Result<(), KernelError> {
        // SAFETY: the buffer is `buf.len()` device bytes owned by `buf`, alive for the call;
        // the caller synchronises `stream` before dropping it.
        unsafe { self.fill_pattern_raw(stream, buf.ptr(), buf.len() as u64, seed) }
    }

    /// Fills `n` bytes at `dst` with [`pattern_byte`]s (self-test of rings).
    ///
    /// # Safety
    /// `dst..dst+n` must be writable device memory until the launch completes on `stream`.
    pub unsafe fn fill_pattern_raw(
        &self,
        stream: &Stream,
        dst: u64,
        n: u64,
        seed: u32,
    ) -> Result<(), KernelError> {
        let f = self.module.function("stoker_fill_pattern")?;
        let (mut dst, mut n, mut seed) = (dst, n, seed);
        let mut params = [
            (&mut dst as *mut u64).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
            (&mut seed as *mut u32).cast::<c_void>(),
        ];
        // SAFETY: parameters match `stoker_fill_pattern(u8*, u64, u32)`; the caller promises
        // the range.
        unsafe { f.launch(stream, (1024, 1, 1), (256, 1, 1), &mut params) }?;
        Ok(())
    }

    /// Counts bytes at `src..src+n` that differ from the pattern, adding to the u32 at
    /// `mismatches` (self-test of an imported ring).
    ///
    /// # Safety
    /// Both ranges must be valid device memory until the launch completes on `stream`.
    pub unsafe fn check_pattern_raw(
        &self,
        stream: &Stream,
        src: u64,
        n: u64,
        seed: u32,
        mismatches: u64,
    ) -> Result<(), KernelError> {
        let f = self.module.function("stoker_check_pattern")?;
        let (mut src, mut n, mut seed, mut out) = (src, n, seed, mismatches);
        let mut params = [
            (&mut src as *mut u64).cast::<c_void>(),
            (&mut n as *mut u64).cast::<c_void>(),
            (&mut seed as *mut u32).cast::<c_void>(),
            (&mut out as *mut u64).cast::<c_void>(),
        ];
        // SAFETY: parameters match `stoker_check_pattern(const u8*, u64, u32, u32*)`; the
        // caller promises the ranges.
        unsafe { f.launch(stream, (1024, 1, 1), (256, 1, 1), &mut params) }?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn sample_layout_matches_augment_cu() {
        assert_eq!(size_of::<AugmentSample>(), 64);
        assert_eq!(offset_of!(AugmentSample, src), 0);
        assert_eq!(offset_of!(AugmentSample, pitch), 8);
        assert_eq!(offset_of!(AugmentSample, width), 16);
        assert_eq!(offset_of!(AugmentSample, height), 20);
        assert_eq!(offset_of!(AugmentSample, flip), 24);
        assert_eq!(offset_of!(AugmentSample, zero), 28);
        assert_eq!(offset_of!(AugmentSample, crop_x), 32);
        assert_eq!(offset_of!(AugmentSample, crop_h), 56);
    }

    #[test]
    fn batch_layout_matches_augment_cu() {
        assert_eq!(size_of::<AugmentBatch>(), 72);
        assert_eq!(offset_of!(AugmentBatch, dst), 0);
        assert_eq!(offset_of!(AugmentBatch, samples), 8);
        assert_eq!(offset_of!(AugmentBatch, image_bytes), 16);
        assert_eq!(offset_of!(AugmentBatch, n), 24);
        assert_eq!(offset_of!(AugmentBatch, out_w), 28);
        assert_eq!(offset_of!(AugmentBatch, out_h), 32);
        assert_eq!(offset_of!(AugmentBatch, dtype), 36);
        assert_eq!(offset_of!(AugmentBatch, layout), 40);
        assert_eq!(offset_of!(AugmentBatch, mean), 48);
        assert_eq!(offset_of!(AugmentBatch, std), 60);
    }

    #[test]
    fn codes_match_the_defines_in_augment_cu() {
        let src = crate::sources::AUGMENT_CU.source;
        for (name, v) in [
            ("DTYPE_U8", DTYPE_U8),
            ("DTYPE_F16", DTYPE_F16),
            ("DTYPE_BF16", DTYPE_BF16),
            ("DTYPE_F32", DTYPE_F32),
            ("LAYOUT_NCHW", LAYOUT_NCHW),
            ("LAYOUT_NHWC", LAYOUT_NHWC),
        ] {
            assert!(src.contains(&format!("#define {name} {v}u")), "{name}");
        }
    }

    #[test]
    fn batches_carry_the_spec() {
        let mut spec = PipelineSpec::train(300, 224);
        spec.layout = Layout::Nhwc;
        spec.dtype = DType::Bf16;
        let b = AugmentBatch::new(&spec, 0x1000, 0x2000, 300);
        assert_eq!((b.out_w, b.out_h), (224, 224));
        assert_eq!(b.image_bytes, 224 * 224 * 3 * 2);
        assert_eq!((b.dtype, b.layout), (DTYPE_BF16, LAYOUT_NHWC));
        assert_eq!(b.mean, spec.mean);
        let (grid, block) = b.launch_dims();
        assert_eq!(grid, (7, 28, 300));
        assert_eq!(block, (32, 8, 1));
        let big = AugmentBatch { n: 70_000, ..b };
        assert_eq!(big.launch_dims().0 .2, MAX_GRID_Z);
    }

    #[test]
    fn sample_bytes_are_the_struct() {
        let s = [AugmentSample::new(
            7,
            9,
            3,
            4,
            CropBox::new(0.5, 1.0, 2.0, 3.0),
            true,
        )];
        let b = AugmentSample::as_bytes(&s);
        assert_eq!(b.len(), 64);
        assert_eq!(b[0], 7);
        assert_eq!(b[8], 9);
        assert_eq!(b[24], 1);
        assert_eq!(&b[32..40], &0.5f64.to_ne_bytes());
    }

    #[test]
    fn the_pattern_varies_with_index_and_seed() {
        let a: Vec<u8> = (0..256).map(|i| pattern_byte(i, 1)).collect();
        let b: Vec<u8> = (0..256).map(|i| pattern_byte(i, 2)).collect();
        assert_ne!(a, b);
        let distinct: std::collections::HashSet<u8> = a.iter().copied().collect();
        assert!(distinct.len() > 100, "{}", distinct.len());
    }
}
