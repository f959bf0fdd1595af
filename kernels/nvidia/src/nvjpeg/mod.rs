//! nvJPEG, loaded at run time: batched decode on the hardware JPEG engines, the GPU-hybrid
//! decoupled path for what the engines cannot take, ROI decode for random crops.
//!
//! # Design
//! - libnvjpeg is found as [`crate::loader`] says (`STOKER_NVJPEG`, then `libnvjpeg.so.13`,
//!   `.so.12`, `libnvjpeg.so`, then the PyPI wheel `nvidia-nvjpeg` under a wheel root): the
//!   first whose CUDA major the driver runs ([`crate::compat`]).
//!   [`NvjpegLib::version`] is `nvjpegGetProperty`'s (major, minor, patch): it needs no GPU.
//! - [`NvjpegDecoder`] holds one handle per device: the hardware backend when
//!   `nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)` succeeds (A100, H100/H200, ...) with engines
//!   and cores above 0 (`backend`: only `ARCH_MISMATCH` falls back to the default backend),
//!   sized to `nvjpegGetHardwareDecoderInfo` engines x cores, plus the decoupled decoders for
//!   images the engines refuse (`decoupled`: GPU-hybrid, and hybrid for progressive files). Whether the engines take an image is asked per image with
//!   `nvjpegDecodeBatchedSupportedEx`, which reports **0 for supported**.
//! - Output is interleaved RGB (`NVJPEG_OUTPUT_RGBI`) in device memory the caller owns, which
//!   is what `stoker_augment` reads.
//! - A batch's hardware images go in one `nvjpegDecodeBatchedEx` call, its ROIs in one
//!   decode-params object per image, on a [`HardwareBatchState`] (pre-allocated with
//!   `nvjpegDecodeBatchedPreAllocate`, as nvImageCodec does). The call is asynchronous to the
//!   host, so a state waits for an event recorded after its last decode before it is
//!   initialised or decodes again, is initialised again after a failed batch or when the
//!   batch size changes, and its batch's bitstreams stay untouched until that event (the
//!   caller's part: one state per batch in flight).
//! - Which decoder takes an image is the pipeline's decode routing; this module answers its
//!   questions ([`NvjpegDecoder::hardware_supports`], [`NvjpegDecoder::hybrid_supports`]).
//!
//! # Limitations
//! Without a GPU the decoder runs only against the emulated nvJPEG (libjpeg-turbo under
//! nvJPEG's documented rules); a real libnvjpeg has only been loaded and asked its version
//! (docs/cuda.md, "Unverified until a GPU run").

mod backend;
mod decoupled;
mod for_driver;
mod handles;
mod image;
mod lane;
mod result;
mod sys;

use std::ffi::c_int;
use std::fmt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, OnceLock};

use crate::cuda::{Device, Event, Stream};
use crate::loader::Loaded;

use decoupled::Decoupled;
use handles::{DecodeParams, JpegState, JpegStream, LibHandle};
pub use image::{DeviceImage, JpegInfo, Roi};
pub use lane::{DecoupledBackend, HybridLane, DEFAULT_HYBRID_HUFFMAN_THRESHOLD};

crate::status_type! {
    /// An nvJPEG status code.
    pub struct NvjpegStatus(c_int), unnamed "NVJPEG_STATUS_(unnamed)" {
        SUCCESS = 0 => "NVJPEG_STATUS_SUCCESS",
        NOT_INITIALIZED = 1 => "NVJPEG_STATUS_NOT_INITIALIZED",
        INVALID_PARAMETER = 2 => "NVJPEG_STATUS_INVALID_PARAMETER",
        BAD_JPEG = 3 => "NVJPEG_STATUS_BAD_JPEG",
        JPEG_NOT_SUPPORTED = 4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
        ALLOCATOR_FAILURE = 5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
        EXECUTION_FAILED = 6 => "NVJPEG_STATUS_EXECUTION_FAILED",
        ARCH_MISMATCH = 7 => "NVJPEG_STATUS_ARCH_MISMATCH",
        INTERNAL_ERROR = 8 => "NVJPEG_STATUS_INTERNAL_ERROR",
        IMPLEMENTATION_NOT_SUPPORTED = 9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
        INCOMPLETE_BITSTREAM = 10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
    }
}

impl NvjpegStatus {
    /// The image itself is at fault (count it as bad input, try the next decoder).
    pub fn is_bad_image(self) -> bool {
        matches!(self.0, 3 | 4 | 10)
    }
}

/// What can go wrong with nvJPEG.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvjpegError {
    /// libnvjpeg or one of its symbols is missing.
    #[error("{library} unavailable: {reason}")]
    Unavailable {
        /// The library's short name (`libnvjpeg`).
        library: String,
        /// What was tried and why it failed.
        reason: String,
    },
    /// A call returned an error status.
    #[error("{call} failed: {status}")]
    Call {
        /// The call as `nvjpeg.h` names it (`nvjpegDecodeBatchedEx`).
        call: &'static str,
        /// The status it returned.
        status: NvjpegStatus,
    },
    /// The device's context could not be bound.
    #[error(transparent)]
    Cuda(#[from] crate::cuda::CudaError),
    /// Arguments that do not fit the decoder.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl NvjpegError {
    /// True where libnvjpeg or a symbol is missing rather than a call failing.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, NvjpegError::Unavailable { .. })
    }

    /// The image is at fault, not the decoder.
    pub fn is_bad_image(&self) -> bool {
        matches!(self, NvjpegError::Call { status, .. } if status.is_bad_image())
    }

    /// The image goes to the CPU decoder, which decodes it or says why not: nvJPEG refused it
    /// or failed on it with any status (a real H200 returned EXECUTION_FAILED, INTERNAL_ERROR
    /// and INVALID_PARAMETER on legal but unusual files, docs/results/gpu-check-2026-11-26).
    /// Not for a CUDA error (the device's fault) or a missing library.
    pub fn sends_image_to_cpu(&self) -> bool {
        matches!(self, NvjpegError::Call { .. } | NvjpegError::Invalid(_))
    }
}

fn unavailable(reason: crate::loader::LoadError) -> NvjpegError {
    NvjpegError::Unavailable {
        library: "libnvjpeg".into(),
        reason: reason.to_string(),
    }
}

/// A loaded libnvjpeg.
#[derive(Debug)]
pub struct NvjpegLib {
    sys: sys::Nvjpeg,
    origin: PathBuf,
    version: (i32, i32, i32),
}

static GLOBAL: OnceLock<Result<Arc<NvjpegLib>, NvjpegError>> = OnceLock::new();

impl NvjpegLib {
    /// The process's libnvjpeg: the first in the search order whose CUDA major the driver
    /// runs (`for_driver.rs`), found on first use.
    pub fn global() -> Result<Arc<NvjpegLib>, NvjpegError> {
        GLOBAL
            .get_or_init(|| NvjpegLib::open_for_driver().map(Arc::new))
            .clone()
    }

    /// libnvjpeg from the PyPI wheel tree under `root` only (what CI tests).
    pub fn load_from_wheel(root: &Path) -> Result<NvjpegLib, NvjpegError> {
        NvjpegLib::open(sys::LIBNVJPEG.open_from_wheel(root).map_err(unavailable)?)
    }

    fn open(loaded: Loaded) -> Result<NvjpegLib, NvjpegError> {
        let origin = loaded.origin.clone();
        let sys = sys::Nvjpeg::load(loaded).map_err(unavailable)?;
        let prop = |p| result::get_property(&sys, p);
        let version = (
            prop(sys::MAJOR_VERSION)?,
            prop(sys::MINOR_VERSION)?,
            prop(sys::PATCH_LEVEL)?,
        );
        tracing::debug!(library = %origin.display(), ?version, "loaded nvJPEG");
        Ok(NvjpegLib {
            sys,
            origin,
            version,
        })
    }

    /// (major, minor, patch), e.g. (13, 0, 2).
    pub fn version(&self) -> (i32, i32, i32) {
        self.version
    }

    /// The file or soname it was loaded from.
    pub fn origin(&self) -> &Path {
        &self.origin
    }

    /// Tries to create a library handle for `backend`; on a machine without a GPU this is an
    /// error status (nvJPEG needs the CUDA runtime), which tests check is not a crash.
    pub fn try_create_handle(&self, hardware: bool) -> Result<(), NvjpegError> {
        let backend = if hardware {
            sys::BACKEND_HARDWARE
        } else {
            sys::BACKEND_DEFAULT
        };
        let h = result::create_ex(&self.sys, backend)?;
        // SAFETY: `h` was just created and is not used again.
        if let Err(e) = unsafe { result::destroy(&self.sys, h) } {
            tracing::warn!(error = %e, "releasing an nvJPEG handle failed");
        }
        Ok(())
    }
}

/// The hardware engines: their size, and the decode params used to ask whether they take an
/// image.
struct Hardware {
    probe: DecodeParams,
    engines: u32,
    cores_per_engine: u32,
}

impl Hardware {
    fn new(
        handle: &Arc<LibHandle>,
        (engines, cores_per_engine): (u32, u32),
    ) -> Result<Hardware, NvjpegError> {
        Ok(Hardware {
            probe: DecodeParams::create(handle, sys::OUTPUT_RGBI)?,
            engines,
            cores_per_engine,
        })
    }
}

/// One JPEG state of the hardware engines' batched decode, with the event recorded after its
/// last decode. nvJPEG's batched decode is asynchronous to the host: until that event has
/// completed, the state must not be re-initialised or decode again, and the bitstreams of
/// that decode must stay untouched. Use one per batch in flight
/// ([`NvjpegDecoder::hardware_batch_state`]); [`Self::wait_idle`] says when its inputs are
/// free.
pub struct HardwareBatchState {
    // Field order is drop order: the nvJPEG objects before the event (Drop waits on it first).
    state: JpegState,
    /// One decode-params object per batch position (ROI and output format), grown on demand.
    params: Vec<DecodeParams>,
    /// Images `nvjpegDecodeBatchedInitialize` was last called for; 0 when it must be called
    /// (never yet, or after a failed batch, as nvJPEG requires).
    initialized: usize,
    decoded: Event,
    handle: Arc<LibHandle>,
}

/// The handles say nothing to a reader: the batch size it was initialised for is shown.
impl fmt::Debug for HardwareBatchState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HardwareBatchState")
            .field("initialized", &self.initialized)
            .field("params", &self.params.len())
            .finish_non_exhaustive()
    }
}

impl HardwareBatchState {
    fn new(handle: &Arc<LibHandle>, device: &Device) -> Result<HardwareBatchState, NvjpegError> {
        let state = JpegState::create(handle)?;
        // nvImageCodec pre-allocates every hardware state even without a size hint: the
        // decoder's memory is then pooled rather than allocated per batch.
        // SAFETY: the handle (hardware backend) and the fresh state are live and idle.
        unsafe {
            result::decode_batched_pre_allocate(
                handle.sys(),
                handle.raw(),
                state.raw(),
                (1, 1, 1),
                sys::OUTPUT_RGBI,
            )?
        };
        Ok(HardwareBatchState {
            state,
            params: Vec::new(),
            initialized: 0,
            decoded: device.event(false)?,
            handle: handle.clone(),
        })
    }

    /// Waits until the last decode with this state has run on its stream: its bitstreams may
    /// then be reused and the state initialised again. At once when it never decoded.
    pub fn wait_idle(&self) -> Result<(), NvjpegError> {
        Ok(self.decoded.synchronize()?)
    }

    /// `nvjpegDecodeBatchedEx` of `jpegs` into `outs` on `stream`, once the last decode with
    /// this state has run; initialises the state when the batch size changed or the last
    /// batch failed.
    ///
    /// # Safety
    /// As [`NvjpegDecoder::decode_hardware_batch`].
    unsafe fn decode(
        &mut self,
        stream: &Stream,
        jpegs: &[&[u8]],
        rois: &[Option<Roi>],
        outs: &[DeviceImage],
    ) -> Result<(), NvjpegError> {
        let n = jpegs.len();
        while self.params.len() < n {
            self.params
                .push(DecodeParams::create(&self.handle, sys::OUTPUT_RGBI)?);
        }
        for (p, roi) in self.params.iter().zip(rois) {
            p.set_roi(*roi)?;
        }
        self.wait_idle()?;
        let (s, h) = (self.handle.sys(), self.handle.raw());
        if self.initialized != n {
            let count = c_int::try_from(n)
                .map_err(|_| NvjpegError::Invalid(format!("batch of {n} images")))?;
            // SAFETY: handle and state are live; the state's last decode has run.
            unsafe {
                result::decode_batched_initialize(s, h, self.state.raw(), count, sys::OUTPUT_RGBI)?
            };
            self.initialized = n;
        }
        let data: Vec<*const u8> = jpegs.iter().map(|j| j.as_ptr()).collect();
        let lengths: Vec<usize> = jpegs.iter().map(|j| j.len()).collect();
        let mut images: Vec<sys::NvjpegImage> = outs.iter().map(|o| o.as_nvjpeg()).collect();
        let mut params: Vec<sys::DecodeParams> = self.params[..n].iter().map(|p| p.raw()).collect();
        let args = result::BatchArgs {
            data: &data,
            lengths: &lengths,
            images: &mut images,
        };
        // SAFETY: the state is initialised for `n` and idle; the arrays hold `n` entries and
        // outlive the call, with one live params object per image; the caller promises the
        // bitstreams and the outputs until the work completes on `stream`.
        let decoded = unsafe {
            result::decode_batched_ex(s, h, self.state.raw(), args, &mut params, stream.raw())
        };
        // Recorded whatever the outcome: a failed call may have enqueued part of its work.
        let recorded = self.decoded.record(stream);
        if decoded.is_err() {
            // nvJPEG: "if the batch decoding fails, then call nvjpegDecodeBatchedInitialize()
            // again".
            self.initialized = 0;
        }
        decoded?;
        Ok(recorded?)
    }
}

impl Drop for HardwareBatchState {
    fn drop(&mut self) {
        // The state must not be destroyed under its own decode.
        if let Err(e) = self.wait_idle() {
            tracing::warn!(error = %e, "waiting for a batched decode before releasing its state");
        }
    }
}

/// nvJPEG decoding for one device. Not `Sync`: one per decode thread.
pub struct NvjpegDecoder {
    // Field order is drop order: every nvJPEG object before the library handle (each also
    // holds the handle), all of them while `device`'s context is bound (Drop binds it).
    hardware: Option<Hardware>,
    /// The state [`Self::decode_hardware_batch`] decodes with (with `hardware`).
    own_batch: Option<HardwareBatchState>,
    /// Set by [`Self::switch_hardware_off`]: the engines take nothing more (their objects stay
    /// until drop, as work on a stream may still use them).
    hardware_off: bool,
    /// The decoupled decoders (GPU-hybrid for sequential files, hybrid for progressive ones).
    decoupled: Decoupled,
    /// Parsed-stream object reused for support checks and the hybrid path.
    stream: JpegStream,
    handle: Arc<LibHandle>,
    max_batch: usize,
    device: Device,
}

/// Shows the device, the largest batch and whether the hardware engines are in use.
impl fmt::Debug for NvjpegDecoder {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvjpegDecoder")
            .field("device", &self.device)
            .field("max_batch", &self.max_batch)
            .field("hardware", &(self.hardware.is_some() && !self.hardware_off))
            .finish_non_exhaustive()
    }
}

impl NvjpegDecoder {
    /// A decoder on `device` for batches of up to `max_batch` images.
    pub fn new(
        device: &Device,
        lib: Arc<NvjpegLib>,
        max_batch: usize,
    ) -> Result<NvjpegDecoder, NvjpegError> {
        if max_batch == 0 || max_batch > i32::MAX as usize {
            return Err(NvjpegError::Invalid(format!("batch size {max_batch}")));
        }
        device.bind()?;
        let (handle, engines) = backend::open_handle(&lib)?;
        Ok(NvjpegDecoder {
            hardware: engines.map(|e| Hardware::new(&handle, e)).transpose()?,
            own_batch: engines
                .map(|_| HardwareBatchState::new(&handle, device))
                .transpose()?,
            hardware_off: false,
            decoupled: Decoupled::new(&handle, device)?,
            stream: JpegStream::create(&handle)?,
            handle,
            max_batch,
            device: device.clone(),
        })
    }

    /// Whether the hardware engines are in use.
    pub fn has_hardware(&self) -> bool {
        self.hardware.is_some() && !self.hardware_off
    }

    /// Stops sending images to the hardware engines (after repeated failures there): from now
    /// on [`Self::hardware_supports`] says no, so the routing asks the GPU-hybrid decoder.
    pub fn switch_hardware_off(&mut self) {
        self.hardware_off = true;
    }

    /// (engines, cores per engine); (0, 0) without hardware.
    pub fn hardware_info(&self) -> (u32, u32) {
        self.hardware
            .as_ref()
            .map_or((0, 0), |h| (h.engines, h.cores_per_engine))
    }

    /// The batch size that keeps every hardware core busy (engines x cores), at least 1.
    pub fn hardware_batch(&self) -> usize {
        let (engines, cores) = self.hardware_info();
        ((engines * cores) as usize).max(1)
    }

    /// Header facts of `jpeg`; the size is the largest component's (the image's), not the
    /// first component's, which is smaller when chroma is sampled finer than luma.
    pub fn info(&self, jpeg: &[u8]) -> Result<JpegInfo, NvjpegError> {
        // SAFETY: the handle is live.
        let i = unsafe { result::get_image_info(self.handle.sys(), self.handle.raw(), jpeg)? };
        Ok(JpegInfo::from_image_info(&i))
    }

    /// Whether the hardware engines can decode `jpeg` (with `roi`). `false` without hardware.
    pub fn hardware_supports(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
    ) -> Result<bool, NvjpegError> {
        let Some(hw) = self.hardware.as_ref().filter(|_| !self.hardware_off) else {
            return Ok(false);
        };
        let params = &hw.probe;
        params.set_roi(roi)?;
        let (s, h) = (self.handle.sys(), self.handle.raw());
        // SAFETY: handle, stream and params are live; the stream is parsed before the check.
        unsafe {
            result::jpeg_stream_parse_header(s, h, jpeg, self.stream.raw())?;
            result::decode_batched_supported_ex(s, h, self.stream.raw(), params.raw())
        }
    }

    /// Whether nvJPEG's decoupled decoder for `jpeg` (hybrid for a `progressive` file,
    /// GPU-hybrid otherwise) can decode it (with `roi`); `false` sends the image to the CPU
    /// decoder.
    pub fn hybrid_supports(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
        progressive: bool,
    ) -> Result<bool, NvjpegError> {
        let d = self.decoupled.for_file(progressive);
        d.params.set_roi(roi)?;
        let (s, h) = (self.handle.sys(), self.handle.raw());
        let (decoder, params) = (d.objects(&self.handle).decoder, d.params.raw());
        // SAFETY: every object is live; the stream is parsed before the check.
        unsafe {
            result::jpeg_stream_parse_header(s, h, jpeg, self.stream.raw())?;
            result::decoder_jpeg_supported(s, decoder, self.stream.raw(), params)
        }
    }

    /// A batched-decode state of the hardware engines for one batch in flight (the decoder's
    /// own serves [`Self::decode_hardware_batch`]); `None` without hardware.
    pub fn hardware_batch_state(&self) -> Result<Option<HardwareBatchState>, NvjpegError> {
        if self.hardware.is_none() {
            return Ok(None);
        }
        self.device.bind()?;
        HardwareBatchState::new(&self.handle, &self.device).map(Some)
    }

    /// Decodes a batch on the hardware engines into `outs` with one `nvjpegDecodeBatchedEx`,
    /// enqueued on `stream` once the decoder's own state's last decode has run.
    ///
    /// # Safety
    /// Each `outs[i]` must name `height * pitch` writable device bytes (height of image `i`, or
    /// of its ROI) that stay valid until the work completes on `stream`; every `jpegs[i]` must
    /// stay unchanged until then (nvJPEG reads the bitstreams asynchronously); every image must
    /// be one [`Self::hardware_supports`] accepted with the same ROI.
    pub unsafe fn decode_hardware_batch(
        &mut self,
        stream: &Stream,
        jpegs: &[&[u8]],
        rois: &[Option<Roi>],
        outs: &[DeviceImage],
    ) -> Result<(), NvjpegError> {
        let Some(mut own) = self.own_batch.take() else {
            return Err(NvjpegError::Invalid("no hardware decoder".into()));
        };
        // SAFETY: the caller's promises.
        let r = unsafe { self.decode_hardware_batch_in(&mut own, stream, jpegs, rois, outs) };
        self.own_batch = Some(own);
        r
    }

    /// [`Self::decode_hardware_batch`] with `state`, one of [`Self::hardware_batch_state`]'s:
    /// the caller keeps the bitstreams of each state's batch until [`HardwareBatchState::wait_idle`].
    ///
    /// # Safety
    /// As [`Self::decode_hardware_batch`].
    pub unsafe fn decode_hardware_batch_in(
        &mut self,
        state: &mut HardwareBatchState,
        stream: &Stream,
        jpegs: &[&[u8]],
        rois: &[Option<Roi>],
        outs: &[DeviceImage],
    ) -> Result<(), NvjpegError> {
        let n = jpegs.len();
        if n == 0 || n > self.max_batch || rois.len() != n || outs.len() != n {
            return Err(NvjpegError::Invalid(format!(
                "batch of {n} images, {} ROIs, {} outputs (max {})",
                rois.len(),
                outs.len(),
                self.max_batch
            )));
        }
        if !self.has_hardware() || !Arc::ptr_eq(&state.handle, &self.handle) {
            return Err(NvjpegError::Invalid(
                "no hardware decoder, or a hardware batch state of another decoder".into(),
            ));
        }
        self.device.bind()?;
        // SAFETY: the caller's promises.
        unsafe { state.decode(stream, jpegs, rois, outs) }
    }

    /// A lane of the batched non-engine decode ([`HybridLane`]): its own decoupled decoders,
    /// states, pinned buffers and stream, made from this decoder's library handle, for one
    /// pool thread.
    pub fn hybrid_lane(&self) -> Result<HybridLane, NvjpegError> {
        HybridLane::new(&self.handle, &self.device)
    }

    /// Decodes one image with nvJPEG's decoupled decoder for it (host phase, transfer, device
    /// phase: the hybrid decoder for a `progressive` file, the GPU-hybrid one otherwise), for
    /// images the engines refuse.
    ///
    /// # Safety
    /// `out` must name `height * pitch` writable device bytes valid until the work completes
    /// on `stream`.
    pub unsafe fn decode_hybrid(
        &mut self,
        stream: &Stream,
        jpeg: &[u8],
        roi: Option<Roi>,
        progressive: bool,
        out: DeviceImage,
    ) -> Result<(), NvjpegError> {
        self.device.bind()?;
        let js = self.stream.raw();
        let handle = self.handle.clone();
        let s = handle.sys();
        let dd = self.decoupled.for_file(progressive);
        dd.params.set_roi(roi)?;
        // The last transfer from the pinned buffer the host phase writes must have run.
        dd.read.synchronize()?;
        let d = dd.objects(&handle);
        let mut image = out.as_nvjpeg();
        // SAFETY: every object is live and owned by `self`; the pinned buffer's last transfer
        // has run (waited above); the caller promises `out`.
        unsafe {
            decoupled::decode_phases(
                s,
                (d, dd.params.raw()),
                (jpeg, js),
                (stream, &dd.read),
                &mut image,
            )
        }
    }
}

impl Drop for NvjpegDecoder {
    fn drop(&mut self) {
        // The fields drop after this, with the device's context bound (nvJPEG frees device
        // memory in it). Without a context they are still released: nvJPEG returns an error
        // status, which each owner logs.
        if let Err(e) = self.device.bind() {
            tracing::warn!(error = %e, "releasing nvJPEG objects without the device's context");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_names_and_say_whose_fault() {
        assert_eq!(NvjpegStatus::BAD_JPEG.name(), "NVJPEG_STATUS_BAD_JPEG");
        assert!(NvjpegStatus::BAD_JPEG.is_bad_image());
        assert!(!NvjpegStatus::EXECUTION_FAILED.is_bad_image());
        let e = NvjpegError::Call {
            call: "nvjpegDecodeBatchedEx",
            status: NvjpegStatus(4),
        };
        assert!(e.is_bad_image() && e.sends_image_to_cpu());
        let failed = NvjpegError::Call {
            call: "nvjpegDecodeJpegTransferToDevice",
            status: NvjpegStatus::INTERNAL_ERROR,
        };
        assert!(!failed.is_bad_image() && failed.sends_image_to_cpu());
        assert_eq!(
            e.to_string(),
            "nvjpegDecodeBatchedEx failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED (4)"
        );
    }

    #[test]
    fn image_size_is_the_largest_components() {
        // Y 1x1, Cb 2x2, Cr 1x1 in a 100x60 image: Cb is full size, Y half.
        let i = result::ImageInfo {
            components: 3,
            subsampling: -1,
            widths: [50, 100, 50, 0],
            heights: [30, 60, 30, 0],
        };
        let info = JpegInfo::from_image_info(&i);
        assert_eq!((info.width, info.height, info.components), (100, 60, 3));
        // Unused entries beyond the component count are ignored.
        let gray = result::ImageInfo {
            components: 1,
            subsampling: 6,
            widths: [7, 99, 0, 0],
            heights: [5, 99, 0, 0],
        };
        assert_eq!(JpegInfo::from_image_info(&gray).width, 7);
    }

    #[test]
    fn device_images_fill_channel_zero() {
        let img = DeviceImage {
            ptr: 0x1234,
            pitch: 672,
        }
        .as_nvjpeg();
        assert_eq!(img.channel[0] as usize, 0x1234);
        assert_eq!(img.pitch[0], 672);
        assert!(img.channel[1].is_null());
    }
}
