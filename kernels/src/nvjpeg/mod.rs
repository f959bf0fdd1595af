//! nvJPEG, loaded at run time: batched decode on the hardware JPEG engines, the GPU-hybrid
//! decoupled path for what the engines cannot take, ROI decode for random crops.
//!
//! # Design
//! - libnvjpeg is found as [`crate::loader`] says (`STOKER_NVJPEG`, then `libnvjpeg.so.13`,
//!   `.so.12`, `libnvjpeg.so`, then the PyPI wheel `nvidia-nvjpeg` under a wheel root).
//!   [`NvjpegLib::version`] is `nvjpegGetProperty`'s (major, minor, patch): it needs no GPU.
//! - [`NvjpegDecoder`] holds one handle per device: the hardware backend when
//!   `nvjpegCreateEx(NVJPEG_BACKEND_HARDWARE)` succeeds (A100, H100/H200, ...), sized to
//!   `nvjpegGetHardwareDecoderInfo` engines x cores, plus the decoupled GPU-hybrid decoder for
//!   images the engines refuse. Whether the engines take an image is asked per image with
//!   `nvjpegDecodeBatchedSupportedEx`, which reports **0 for supported**.
//! - Output is interleaved RGB (`NVJPEG_OUTPUT_RGBI`) in device memory the caller owns, which
//!   is what `stoker_augment` reads.
//! - `nvjpegDecodeBatched` decodes exactly the batch size it was initialised with; a batch of
//!   another size re-initialises (a partial last batch only).
//!
//! # Limitations
//! Nothing past loading the library and reading its version runs without a GPU: the decoder
//! is untested until a GPU run (docs/cuda.md lists what remains).

mod sys;

use std::ffi::{c_int, c_uint};
use std::path::{Path, PathBuf};
use std::ptr;
use std::sync::{Arc, OnceLock};

use crate::cuda::{Device, Stream};
use crate::loader::Loaded;

/// An nvJPEG status code.
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct NvjpegStatus(pub c_int);

impl NvjpegStatus {
    pub const SUCCESS: NvjpegStatus = NvjpegStatus(0);
    pub const BAD_JPEG: NvjpegStatus = NvjpegStatus(3);
    pub const JPEG_NOT_SUPPORTED: NvjpegStatus = NvjpegStatus(4);
    pub const EXECUTION_FAILED: NvjpegStatus = NvjpegStatus(6);
    pub const ARCH_MISMATCH: NvjpegStatus = NvjpegStatus(7);
    pub const IMPLEMENTATION_NOT_SUPPORTED: NvjpegStatus = NvjpegStatus(9);

    pub fn name(self) -> &'static str {
        match self.0 {
            0 => "NVJPEG_STATUS_SUCCESS",
            1 => "NVJPEG_STATUS_NOT_INITIALIZED",
            2 => "NVJPEG_STATUS_INVALID_PARAMETER",
            3 => "NVJPEG_STATUS_BAD_JPEG",
            4 => "NVJPEG_STATUS_JPEG_NOT_SUPPORTED",
            5 => "NVJPEG_STATUS_ALLOCATOR_FAILURE",
            6 => "NVJPEG_STATUS_EXECUTION_FAILED",
            7 => "NVJPEG_STATUS_ARCH_MISMATCH",
            8 => "NVJPEG_STATUS_INTERNAL_ERROR",
            9 => "NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED",
            10 => "NVJPEG_STATUS_INCOMPLETE_BITSTREAM",
            _ => "NVJPEG_STATUS_(unnamed)",
        }
    }

    /// The image itself is at fault (count it as bad input, try the next decoder).
    pub fn is_bad_image(self) -> bool {
        matches!(self.0, 3 | 4 | 10)
    }
}

impl std::fmt::Debug for NvjpegStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

impl std::fmt::Display for NvjpegStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        std::fmt::Debug::fmt(self, f)
    }
}

/// What can go wrong with nvJPEG.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum NvjpegError {
    /// libnvjpeg or one of its symbols is missing.
    #[error("{library} unavailable: {reason}")]
    Unavailable { library: String, reason: String },
    /// A call returned an error status.
    #[error("{call} failed: {status}")]
    Call {
        call: &'static str,
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
    pub fn is_unavailable(&self) -> bool {
        matches!(self, NvjpegError::Unavailable { .. })
    }

    /// The image is at fault, not the decoder.
    pub fn is_bad_image(&self) -> bool {
        matches!(self, NvjpegError::Call { status, .. } if status.is_bad_image())
    }
}

fn check(call: &'static str, status: c_int) -> Result<(), NvjpegError> {
    if status == 0 {
        Ok(())
    } else {
        Err(NvjpegError::Call {
            call,
            status: NvjpegStatus(status),
        })
    }
}

fn log_drop(call: &'static str, status: c_int) {
    if let Err(e) = check(call, status) {
        tracing::warn!(error = %e, "releasing an nvJPEG object failed");
    }
}

fn unavailable(reason: String) -> NvjpegError {
    NvjpegError::Unavailable {
        library: "libnvjpeg".into(),
        reason,
    }
}

/// A loaded libnvjpeg.
pub struct NvjpegLib {
    sys: sys::Nvjpeg,
    origin: PathBuf,
    version: (i32, i32, i32),
}

impl std::fmt::Debug for NvjpegLib {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NvjpegLib")
            .field("origin", &self.origin)
            .field("version", &self.version)
            .finish()
    }
}

static GLOBAL: OnceLock<Result<Arc<NvjpegLib>, NvjpegError>> = OnceLock::new();

impl NvjpegLib {
    /// The process's libnvjpeg, found by the search order on first use.
    pub fn global() -> Result<Arc<NvjpegLib>, NvjpegError> {
        GLOBAL
            .get_or_init(|| {
                NvjpegLib::open(sys::LIBNVJPEG.open().map_err(unavailable)?).map(Arc::new)
            })
            .clone()
    }

    /// libnvjpeg from the PyPI wheel tree under `root` only (what CI tests).
    pub fn load_from_wheel(root: &Path) -> Result<NvjpegLib, NvjpegError> {
        NvjpegLib::open(sys::LIBNVJPEG.open_from_wheel(root).map_err(unavailable)?)
    }

    fn open(loaded: Loaded) -> Result<NvjpegLib, NvjpegError> {
        let origin = loaded.origin.clone();
        let sys = sys::Nvjpeg::load(loaded)
            .map_err(|r| unavailable(format!("{}: {r}", origin.display())))?;
        let prop = |p| {
            let mut v: c_int = 0;
            // SAFETY: writes one int; needs no GPU or handle.
            check("nvjpegGetProperty", unsafe {
                (sys.get_property)(p, &mut v)
            })
            .map(|_| v)
        };
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
        let h = create_handle(&self.sys, backend)?;
        // SAFETY: `h` was just created and is not used again.
        log_drop("nvjpegDestroy", unsafe { (self.sys.destroy)(h) });
        Ok(())
    }
}

fn create_handle(s: &sys::Nvjpeg, backend: c_int) -> Result<sys::Handle, NvjpegError> {
    let mut h: sys::Handle = ptr::null_mut();
    // SAFETY: null allocators select nvJPEG's defaults; flags must be 0; writes one handle.
    check("nvjpegCreateEx", unsafe {
        (s.create_ex)(backend, ptr::null_mut(), ptr::null_mut(), 0, &mut h)
    })?;
    Ok(h)
}

/// A region of interest in the image's pixels (nvjpegDecodeParamsSetROI).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roi {
    pub x: u32,
    pub y: u32,
    pub width: u32,
    pub height: u32,
}

/// Where one decoded image goes: interleaved RGB u8 at a device address, `pitch` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceImage {
    pub ptr: u64,
    pub pitch: usize,
}

impl DeviceImage {
    fn as_nvjpeg(self) -> sys::NvjpegImage {
        let mut img = sys::NvjpegImage::default();
        img.channel[0] = self.ptr as usize as *mut u8;
        img.pitch[0] = self.pitch;
        img
    }
}

/// Header facts of one JPEG, as nvJPEG reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    pub components: u32,
    /// `nvjpegChromaSubsampling_t` (0 = 4:4:4, 2 = 4:2:0, 6 = gray, -1 = unknown).
    pub subsampling: i32,
    pub width: u32,
    pub height: u32,
}

/// The hardware engines' batched decoder state.
struct HardwareBatch {
    state: sys::JpegState,
    /// One decode-params object per batch position (ROI and output format).
    params: Vec<sys::DecodeParams>,
    /// The batch size `nvjpegDecodeBatchedInitialize` was last called with (0: never).
    initialized: usize,
}

/// The decoupled GPU-hybrid decoder, for images the engines refuse (progressive, 4:1:1, ...).
struct HybridDecoder {
    decoder: sys::JpegDecoder,
    state: sys::JpegState,
    pinned: sys::BufferPinned,
    device_buf: sys::BufferDevice,
    params: sys::DecodeParams,
}

/// nvJPEG decoding for one device. Not `Sync`: one per decode thread.
pub struct NvjpegDecoder {
    handle: sys::Handle,
    hardware: Option<HardwareBatch>,
    hybrid: HybridDecoder,
    /// Parsed-stream object reused for support checks and the hybrid path.
    stream: sys::JpegStream,
    engines: u32,
    cores_per_engine: u32,
    max_batch: usize,
    // Field order: the handles above are destroyed in Drop before the library and the
    // device's context are let go.
    lib: Arc<NvjpegLib>,
    device: Device,
}

// SAFETY: nvJPEG handles and states may move between threads; a decoder is used by one thread
// at a time (it is not Sync).
unsafe impl Send for NvjpegDecoder {}

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
        let s = &lib.sys;
        let (handle, hw) = match create_handle(s, sys::BACKEND_HARDWARE) {
            Ok(h) => (h, true),
            Err(e) => {
                tracing::info!(error = %e, "no hardware JPEG decoder; decoding on the GPU cores");
                (create_handle(s, sys::BACKEND_DEFAULT)?, false)
            }
        };
        // From here on `d` owns every object made, so an early return releases them.
        let mut d = NvjpegDecoder {
            handle,
            hardware: None,
            hybrid: HybridDecoder {
                decoder: ptr::null_mut(),
                state: ptr::null_mut(),
                pinned: ptr::null_mut(),
                device_buf: ptr::null_mut(),
                params: ptr::null_mut(),
            },
            stream: ptr::null_mut(),
            engines: 0,
            cores_per_engine: 0,
            max_batch,
            lib: lib.clone(),
            device: device.clone(),
        };
        // SAFETY: (whole block) every handle passed is live (just created, owned by `d`), and
        // every out-pointer is a field of `d` or a local.
        unsafe {
            check(
                "nvjpegJpegStreamCreate",
                (s.jpeg_stream_create)(handle, &mut d.stream),
            )?;
            let h = &mut d.hybrid;
            check(
                "nvjpegDecoderCreate",
                (s.decoder_create)(handle, sys::BACKEND_GPU_HYBRID, &mut h.decoder),
            )?;
            check(
                "nvjpegDecoderStateCreate",
                (s.decoder_state_create)(handle, h.decoder, &mut h.state),
            )?;
            check(
                "nvjpegBufferPinnedCreate",
                (s.buffer_pinned_create)(handle, ptr::null_mut(), &mut h.pinned),
            )?;
            check(
                "nvjpegBufferDeviceCreate",
                (s.buffer_device_create)(handle, ptr::null_mut(), &mut h.device_buf),
            )?;
            check(
                "nvjpegStateAttachPinnedBuffer",
                (s.state_attach_pinned_buffer)(h.state, h.pinned),
            )?;
            check(
                "nvjpegStateAttachDeviceBuffer",
                (s.state_attach_device_buffer)(h.state, h.device_buf),
            )?;
            check(
                "nvjpegDecodeParamsCreate",
                (s.decode_params_create)(handle, &mut h.params),
            )?;
            check(
                "nvjpegDecodeParamsSetOutputFormat",
                (s.decode_params_set_output_format)(h.params, sys::OUTPUT_RGBI),
            )?;
        }
        if hw {
            // SAFETY: `d.handle` is live and owned by `d`.
            unsafe { d.init_hardware(max_batch)? };
        }
        Ok(d)
    }

    /// Asks the hardware engines' size and creates the batched decoder's state and
    /// per-image parameters, owned by `self` from creation on (so an error releases them).
    ///
    /// # Safety
    /// `self.handle` must be a live nvJPEG handle with the hardware backend.
    unsafe fn init_hardware(&mut self, max_batch: usize) -> Result<(), NvjpegError> {
        let lib = Arc::clone(&self.lib);
        let s = &lib.sys;
        let handle = self.handle;
        let d = self;
        // SAFETY: (whole block) the handle is live (the caller's promise), and every
        // out-pointer is a field of `d` or a local.
        unsafe {
            let (mut engines, mut cores): (c_uint, c_uint) = (0, 0);
            check(
                "nvjpegGetHardwareDecoderInfo",
                (s.get_hardware_decoder_info)(handle, &mut engines, &mut cores),
            )?;
            d.engines = engines;
            d.cores_per_engine = cores;
            let mut batch = HardwareBatch {
                state: ptr::null_mut(),
                params: Vec::with_capacity(max_batch),
                initialized: 0,
            };
            let created = check(
                "nvjpegJpegStateCreate",
                (s.jpeg_state_create)(handle, &mut batch.state),
            );
            d.hardware = Some(batch);
            created?;
            let batch = d.hardware.as_mut().expect("just set");
            for _ in 0..max_batch {
                let mut p: sys::DecodeParams = ptr::null_mut();
                check(
                    "nvjpegDecodeParamsCreate",
                    (s.decode_params_create)(handle, &mut p),
                )?;
                batch.params.push(p);
                check(
                    "nvjpegDecodeParamsSetOutputFormat",
                    (s.decode_params_set_output_format)(p, sys::OUTPUT_RGBI),
                )?;
            }
        }
        Ok(())
    }

    /// Whether the hardware engines are in use.
    pub fn has_hardware(&self) -> bool {
        self.hardware.is_some()
    }

    /// (engines, cores per engine); (0, 0) without hardware.
    pub fn hardware_info(&self) -> (u32, u32) {
        (self.engines, self.cores_per_engine)
    }

    /// The batch size that keeps every hardware core busy (engines x cores), at least 1.
    pub fn hardware_batch(&self) -> usize {
        ((self.engines * self.cores_per_engine) as usize).max(1)
    }

    /// Header facts of `jpeg`.
    pub fn info(&self, jpeg: &[u8]) -> Result<JpegInfo, NvjpegError> {
        let (mut comps, mut sub) = (0 as c_int, 0 as c_int);
        let mut w = [0 as c_int; sys::MAX_COMPONENT];
        let mut h = [0 as c_int; sys::MAX_COMPONENT];
        // SAFETY: the handle is live; `jpeg` is read for its length; outputs are 4-int arrays.
        check("nvjpegGetImageInfo", unsafe {
            (self.lib.sys.get_image_info)(
                self.handle,
                jpeg.as_ptr(),
                jpeg.len(),
                &mut comps,
                &mut sub,
                w.as_mut_ptr(),
                h.as_mut_ptr(),
            )
        })?;
        Ok(JpegInfo {
            components: comps.max(0) as u32,
            subsampling: sub,
            width: w[0].max(0) as u32,
            height: h[0].max(0) as u32,
        })
    }

    fn set_roi(&self, params: sys::DecodeParams, roi: Option<Roi>) -> Result<(), NvjpegError> {
        // nvJPEG: a ROI of (0, 0, -1, -1) means the whole image.
        let (x, y, w, h) = match roi {
            Some(r) => (
                r.x as c_int,
                r.y as c_int,
                r.width as c_int,
                r.height as c_int,
            ),
            None => (0, 0, -1, -1),
        };
        // SAFETY: `params` is a live decode-params object owned by `self`.
        check("nvjpegDecodeParamsSetROI", unsafe {
            (self.lib.sys.decode_params_set_roi)(params, x, y, w, h)
        })
    }

    /// Whether the hardware engines can decode `jpeg` (with `roi`). `false` without hardware.
    pub fn hardware_supports(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
    ) -> Result<bool, NvjpegError> {
        let Some(hw) = self.hardware.as_ref() else {
            return Ok(false);
        };
        let params = hw.params[0];
        self.set_roi(params, roi)?;
        let s = &self.lib.sys;
        // SAFETY: handle and stream are live; `jpeg` is read during the call only.
        check("nvjpegJpegStreamParseHeader", unsafe {
            (s.jpeg_stream_parse_header)(self.handle, jpeg.as_ptr(), jpeg.len(), self.stream)
        })?;
        let mut flag: c_int = -1;
        // SAFETY: all handles are live; writes one int.
        check("nvjpegDecodeBatchedSupportedEx", unsafe {
            (s.decode_batched_supported_ex)(self.handle, self.stream, params, &mut flag)
        })?;
        // nvJPEG reports 0 for SUPPORTED.
        Ok(flag == 0)
    }

    /// Whether the GPU-hybrid decoder can decode `jpeg` (with `roi`); `false` sends the image
    /// to the CPU decoder.
    pub fn hybrid_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError> {
        self.set_roi(self.hybrid.params, roi)?;
        let s = &self.lib.sys;
        // SAFETY: handle and stream are live; `jpeg` is read during the call only.
        check("nvjpegJpegStreamParseHeader", unsafe {
            (s.jpeg_stream_parse_header)(self.handle, jpeg.as_ptr(), jpeg.len(), self.stream)
        })?;
        let mut flag: c_int = -1;
        // SAFETY: all handles are live; writes one int.
        check("nvjpegDecoderJpegSupported", unsafe {
            (s.decoder_jpeg_supported)(
                self.hybrid.decoder,
                self.stream,
                self.hybrid.params,
                &mut flag,
            )
        })?;
        // Like the batched check, 0 means supported.
        Ok(flag == 0)
    }

    /// Decodes a batch on the hardware engines into `outs`, enqueued on `stream`.
    ///
    /// # Safety
    /// Each `outs[i]` must name `height * pitch` writable device bytes (height of image `i`, or
    /// of its ROI) that stay valid until the work completes on `stream`; every image must be one
    /// [`Self::hardware_supports`] accepted with the same ROI.
    pub unsafe fn decode_hardware_batch(
        &mut self,
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
        let Some(hw) = self.hardware.as_ref() else {
            return Err(NvjpegError::Invalid("no hardware decoder".into()));
        };
        let (state, initialized) = (hw.state, hw.initialized);
        let mut params: Vec<sys::DecodeParams> = hw.params[..n].to_vec();
        for (p, roi) in params.iter().zip(rois) {
            self.set_roi(*p, *roi)?;
        }
        self.device.bind()?;
        let s = &self.lib.sys;
        if initialized != n {
            // SAFETY: handle and state are live.
            check("nvjpegDecodeBatchedInitialize", unsafe {
                (s.decode_batched_initialize)(self.handle, state, n as c_int, 1, sys::OUTPUT_RGBI)
            })?;
            self.hardware.as_mut().expect("checked above").initialized = n;
        }
        let data: Vec<*const u8> = jpegs.iter().map(|j| j.as_ptr()).collect();
        let lengths: Vec<usize> = jpegs.iter().map(|j| j.len()).collect();
        let mut images: Vec<sys::NvjpegImage> = outs.iter().map(|o| o.as_nvjpeg()).collect();
        if rois.iter().all(Option::is_none) {
            // SAFETY: as below, without per-image parameters.
            return check("nvjpegDecodeBatched", unsafe {
                (s.decode_batched)(
                    self.handle,
                    state,
                    data.as_ptr(),
                    lengths.as_ptr(),
                    images.as_mut_ptr(),
                    stream.raw(),
                )
            });
        }
        // SAFETY: the arrays hold `n` entries each and outlive the call (nvJPEG copies the
        // bitstreams to its pinned staging before returning); the caller promises the outputs.
        check("nvjpegDecodeBatchedEx", unsafe {
            (s.decode_batched_ex)(
                self.handle,
                state,
                data.as_ptr(),
                lengths.as_ptr(),
                images.as_mut_ptr(),
                params.as_mut_ptr(),
                stream.raw(),
            )
        })
    }

    /// Decodes one image with the GPU-hybrid decoupled path (host Huffman, then device), for
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
        out: DeviceImage,
    ) -> Result<(), NvjpegError> {
        self.set_roi(self.hybrid.params, roi)?;
        self.device.bind()?;
        let s = &self.lib.sys;
        let h = &self.hybrid;
        let mut image = out.as_nvjpeg();
        // SAFETY: (whole block) every handle is live and owned by `self`; `jpeg` outlives the
        // parse and host phases, which copy what they need; the caller promises `out`.
        unsafe {
            check(
                "nvjpegJpegStreamParse",
                (s.jpeg_stream_parse)(self.handle, jpeg.as_ptr(), jpeg.len(), 0, 0, self.stream),
            )?;
            check(
                "nvjpegDecodeJpegHost",
                (s.decode_jpeg_host)(self.handle, h.decoder, h.state, h.params, self.stream),
            )?;
            check(
                "nvjpegDecodeJpegTransferToDevice",
                (s.decode_jpeg_transfer_to_device)(
                    self.handle,
                    h.decoder,
                    h.state,
                    self.stream,
                    stream.raw(),
                ),
            )?;
            check(
                "nvjpegDecodeJpegDevice",
                (s.decode_jpeg_device)(self.handle, h.decoder, h.state, &mut image, stream.raw()),
            )
        }
    }
}

impl Drop for NvjpegDecoder {
    fn drop(&mut self) {
        if self.device.bind().is_err() {
            return;
        }
        let s = &self.lib.sys;
        // SAFETY: every non-null handle below is owned by `self` and used by nothing else;
        // dependents are destroyed before what they depend on, the library handle last.
        unsafe {
            if let Some(hw) = self.hardware.take() {
                for p in hw.params {
                    log_drop("nvjpegDecodeParamsDestroy", (s.decode_params_destroy)(p));
                }
                if !hw.state.is_null() {
                    log_drop("nvjpegJpegStateDestroy", (s.jpeg_state_destroy)(hw.state));
                }
            }
            let h = &self.hybrid;
            if !h.params.is_null() {
                log_drop(
                    "nvjpegDecodeParamsDestroy",
                    (s.decode_params_destroy)(h.params),
                );
            }
            if !h.state.is_null() {
                log_drop("nvjpegJpegStateDestroy", (s.jpeg_state_destroy)(h.state));
            }
            if !h.device_buf.is_null() {
                log_drop(
                    "nvjpegBufferDeviceDestroy",
                    (s.buffer_device_destroy)(h.device_buf),
                );
            }
            if !h.pinned.is_null() {
                log_drop(
                    "nvjpegBufferPinnedDestroy",
                    (s.buffer_pinned_destroy)(h.pinned),
                );
            }
            if !h.decoder.is_null() {
                log_drop("nvjpegDecoderDestroy", (s.decoder_destroy)(h.decoder));
            }
            if !self.stream.is_null() {
                log_drop(
                    "nvjpegJpegStreamDestroy",
                    (s.jpeg_stream_destroy)(self.stream),
                );
            }
            log_drop("nvjpegDestroy", (s.destroy)(self.handle));
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
        assert!(e.is_bad_image());
        assert_eq!(
            e.to_string(),
            "nvjpegDecodeBatchedEx failed: NVJPEG_STATUS_JPEG_NOT_SUPPORTED (4)"
        );
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
