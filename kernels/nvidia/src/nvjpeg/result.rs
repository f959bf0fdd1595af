//! One function per nvJPEG call, each returning `Result<_, NvjpegError>` with the status
//! named ([`super::NvjpegStatus`]). They are as unsafe as the calls they wrap where a handle
//! or pointer must be valid; the owning types in [`super::handles`] uphold that.

use std::ffi::{c_int, c_uint};
use std::ptr;

use super::sys::{self, Nvjpeg};
use super::{NvjpegError, NvjpegStatus};

/// `Ok` for `NVJPEG_STATUS_SUCCESS`, else the call's name and its status.
pub(super) fn check(call: &'static str, status: c_int) -> Result<(), NvjpegError> {
    NvjpegStatus(status)
        .result()
        .map_err(|status| NvjpegError::Call { call, status })
}

/// `nvjpegGetProperty`: needs no GPU or handle.
pub(super) fn get_property(s: &Nvjpeg, property: c_int) -> Result<i32, NvjpegError> {
    let mut v: c_int = 0;
    // SAFETY: writes one int; needs no GPU or handle.
    check("nvjpegGetProperty", unsafe {
        (s.get_property)(property, &mut v)
    })?;
    Ok(v)
}

/// `nvjpegCreateEx` with nvJPEG's default allocators.
/// Handles are strict (`NVJPEG_FLAGS_BITSTREAM_STRICT`): without the flag nvJPEG decodes
/// corrupt and truncated streams to garbage pixels where the CPU decoder refuses them (as a
/// real H200 did, docs/results/gpu-check-2026-11-26).
pub(super) fn create_ex(s: &Nvjpeg, backend: c_int) -> Result<sys::Handle, NvjpegError> {
    let mut h: sys::Handle = ptr::null_mut();
    let flags = sys::FLAGS_BITSTREAM_STRICT;
    // SAFETY: null allocators select nvJPEG's defaults; the flag is a documented one; writes
    // one handle.
    check("nvjpegCreateEx", unsafe {
        (s.create_ex)(backend, ptr::null_mut(), ptr::null_mut(), flags, &mut h)
    })?;
    Ok(h)
}

/// `nvjpegDestroy`.
///
/// # Safety
/// `h` must be a live handle that nothing made from it still uses.
pub(super) unsafe fn destroy(s: &Nvjpeg, h: sys::Handle) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDestroy", unsafe { (s.destroy)(h) })
}

/// Engines and cores per engine of the hardware decoder (`nvjpegGetHardwareDecoderInfo`).
///
/// # Safety
/// `h` must be a live handle.
pub(super) unsafe fn get_hardware_decoder_info(
    s: &Nvjpeg,
    h: sys::Handle,
) -> Result<(u32, u32), NvjpegError> {
    let (mut engines, mut cores): (c_uint, c_uint) = (0, 0);
    // SAFETY: the caller's promise; writes two ints.
    check("nvjpegGetHardwareDecoderInfo", unsafe {
        (s.get_hardware_decoder_info)(h, &mut engines, &mut cores)
    })?;
    Ok((engines, cores))
}

/// What `nvjpegGetImageInfo` reports: components, subsampling, and each component's size.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(super) struct ImageInfo {
    pub components: c_int,
    pub subsampling: c_int,
    pub widths: [c_int; sys::MAX_COMPONENT],
    pub heights: [c_int; sys::MAX_COMPONENT],
}

/// `nvjpegGetImageInfo`.
///
/// # Safety
/// `h` must be a live handle.
pub(super) unsafe fn get_image_info(
    s: &Nvjpeg,
    h: sys::Handle,
    jpeg: &[u8],
) -> Result<ImageInfo, NvjpegError> {
    let mut i = ImageInfo::default();
    // SAFETY: the caller's promise; `jpeg` is read for its length; outputs are 4-int arrays.
    check("nvjpegGetImageInfo", unsafe {
        (s.get_image_info)(
            h,
            jpeg.as_ptr(),
            jpeg.len(),
            &mut i.components,
            &mut i.subsampling,
            i.widths.as_mut_ptr(),
            i.heights.as_mut_ptr(),
        )
    })?;
    Ok(i)
}

/// Declares a `create` / `destroy` pair of calls taking the library handle.
/// `with ALLOCATOR` passes one more argument before the out-parameter (the buffers' allocator,
/// null for nvJPEG's default).
macro_rules! create_destroy {
    (
        $create:ident = $cname:literal $(with $alloc:expr)?,
        $destroy:ident = $dname:literal,
        $ty:ty
    ) => {
        #[doc = concat!("`", $cname, "`.\n\n# Safety\n`h` must be a live handle.")]
        pub(crate) unsafe fn $create(s: &Nvjpeg, h: sys::Handle) -> Result<$ty, NvjpegError> {
            let mut out: $ty = ptr::null_mut();
            // SAFETY: the caller's promise; a null allocator is nvJPEG's default; writes one
            // handle.
            check($cname, unsafe { (s.$create)(h, $($alloc,)? &mut out) })?;
            Ok(out)
        }

        #[doc = concat!("`", $dname, "`.\n\n# Safety\n`x` must be live and unused afterwards.")]
        pub(crate) unsafe fn $destroy(s: &Nvjpeg, x: $ty) -> Result<(), NvjpegError> {
            // SAFETY: the caller's promise.
            check($dname, unsafe { (s.$destroy)(x) })
        }
    };
}

create_destroy!(
    jpeg_state_create = "nvjpegJpegStateCreate",
    jpeg_state_destroy = "nvjpegJpegStateDestroy",
    sys::JpegState
);
create_destroy!(
    jpeg_stream_create = "nvjpegJpegStreamCreate",
    jpeg_stream_destroy = "nvjpegJpegStreamDestroy",
    sys::JpegStream
);
create_destroy!(
    decode_params_create = "nvjpegDecodeParamsCreate",
    decode_params_destroy = "nvjpegDecodeParamsDestroy",
    sys::DecodeParams
);

/// `nvjpegDecoderCreate`.
///
/// # Safety
/// `h` must be a live handle.
pub(super) unsafe fn decoder_create(
    s: &Nvjpeg,
    h: sys::Handle,
    backend: c_int,
) -> Result<sys::JpegDecoder, NvjpegError> {
    let mut out: sys::JpegDecoder = ptr::null_mut();
    // SAFETY: the caller's promise; writes one handle.
    check("nvjpegDecoderCreate", unsafe {
        (s.decoder_create)(h, backend, &mut out)
    })?;
    Ok(out)
}

/// `nvjpegDecoderDestroy`.
///
/// # Safety
/// `d` must be live and unused afterwards.
pub(super) unsafe fn decoder_destroy(s: &Nvjpeg, d: sys::JpegDecoder) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecoderDestroy", unsafe { (s.decoder_destroy)(d) })
}

/// `nvjpegDecoderStateCreate`.
///
/// # Safety
/// `h` and `d` must be live.
pub(super) unsafe fn decoder_state_create(
    s: &Nvjpeg,
    h: sys::Handle,
    d: sys::JpegDecoder,
) -> Result<sys::JpegState, NvjpegError> {
    let mut out: sys::JpegState = ptr::null_mut();
    // SAFETY: the caller's promise; writes one handle.
    check("nvjpegDecoderStateCreate", unsafe {
        (s.decoder_state_create)(h, d, &mut out)
    })?;
    Ok(out)
}

create_destroy!(
    buffer_pinned_create = "nvjpegBufferPinnedCreate" with ptr::null_mut(),
    buffer_pinned_destroy = "nvjpegBufferPinnedDestroy",
    sys::BufferPinned
);
create_destroy!(
    buffer_device_create = "nvjpegBufferDeviceCreate" with ptr::null_mut(),
    buffer_device_destroy = "nvjpegBufferDeviceDestroy",
    sys::BufferDevice
);

/// Declares a `nvjpegStateAttach*Buffer` call.
macro_rules! state_attach {
    ($attach:ident = $name:literal, $buffer:ty) => {
        #[doc = concat!("`", $name, "`.\n\n# Safety\nBoth must be live; the buffer must outlive the state's use of it.")]
        pub(crate) unsafe fn $attach(
            s: &Nvjpeg,
            state: sys::JpegState,
            b: $buffer,
        ) -> Result<(), NvjpegError> {
            // SAFETY: the caller's promise.
            check($name, unsafe { (s.$attach)(state, b) })
        }
    };
}

state_attach!(
    state_attach_pinned_buffer = "nvjpegStateAttachPinnedBuffer",
    sys::BufferPinned
);
state_attach!(
    state_attach_device_buffer = "nvjpegStateAttachDeviceBuffer",
    sys::BufferDevice
);

/// `nvjpegDecodeParamsSetOutputFormat`.
///
/// # Safety
/// `p` must be live.
pub(super) unsafe fn decode_params_set_output_format(
    s: &Nvjpeg,
    p: sys::DecodeParams,
    format: c_int,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeParamsSetOutputFormat", unsafe {
        (s.decode_params_set_output_format)(p, format)
    })
}

/// `nvjpegDecodeParamsSetROI` (`(0, 0, -1, -1)` is the whole image).
///
/// # Safety
/// `p` must be live.
pub(super) unsafe fn decode_params_set_roi(
    s: &Nvjpeg,
    p: sys::DecodeParams,
    roi: [c_int; 4],
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeParamsSetROI", unsafe {
        (s.decode_params_set_roi)(p, roi[0], roi[1], roi[2], roi[3])
    })
}

/// `nvjpegJpegStreamParseHeader`.
///
/// # Safety
/// `h` and `stream` must be live.
pub(super) unsafe fn jpeg_stream_parse_header(
    s: &Nvjpeg,
    h: sys::Handle,
    jpeg: &[u8],
    stream: sys::JpegStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise; `jpeg` is read during the call only.
    check("nvjpegJpegStreamParseHeader", unsafe {
        (s.jpeg_stream_parse_header)(h, jpeg.as_ptr(), jpeg.len(), stream)
    })
}

/// `nvjpegJpegStreamParse` (whole stream, no metadata-only, no copy of the bytes kept).
///
/// # Safety
/// `h` and `stream` must be live; `jpeg` must outlive the stream's use by the host phase.
pub(super) unsafe fn jpeg_stream_parse(
    s: &Nvjpeg,
    h: sys::Handle,
    jpeg: &[u8],
    stream: sys::JpegStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegJpegStreamParse", unsafe {
        (s.jpeg_stream_parse)(h, jpeg.as_ptr(), jpeg.len(), 0, 0, stream)
    })
}

/// Runs a `*Supported` query, which writes its answer through `flag`: `true` when it is 0
/// (nvJPEG reports **0 for supported**).
fn supported(
    call: &'static str,
    query: impl FnOnce(&mut c_int) -> c_int,
) -> Result<bool, NvjpegError> {
    let mut flag: c_int = -1;
    check(call, query(&mut flag))?;
    Ok(flag == 0)
}

/// `nvjpegDecodeBatchedSupportedEx`: `true` when the engines take the parsed stream
/// (nvJPEG reports **0 for supported**).
///
/// # Safety
/// Every handle must be live, `stream` parsed.
pub(super) unsafe fn decode_batched_supported_ex(
    s: &Nvjpeg,
    h: sys::Handle,
    stream: sys::JpegStream,
    p: sys::DecodeParams,
) -> Result<bool, NvjpegError> {
    supported("nvjpegDecodeBatchedSupportedEx", |flag| {
        // SAFETY: the caller's promise; writes one int.
        unsafe { (s.decode_batched_supported_ex)(h, stream, p, flag) }
    })
}

/// `nvjpegDecoderJpegSupported`: `true` when the decoder takes the parsed stream (0 means
/// supported, as for the batched check).
///
/// # Safety
/// Every handle must be live, `stream` parsed.
pub(super) unsafe fn decoder_jpeg_supported(
    s: &Nvjpeg,
    d: sys::JpegDecoder,
    stream: sys::JpegStream,
    p: sys::DecodeParams,
) -> Result<bool, NvjpegError> {
    supported("nvjpegDecoderJpegSupported", |flag| {
        // SAFETY: the caller's promise; writes one int.
        unsafe { (s.decoder_jpeg_supported)(d, stream, p, flag) }
    })
}

/// `nvjpegDecodeBatchedInitialize` (one CPU thread, `format` output).
///
/// # Safety
/// `h` and `state` must be live.
pub(super) unsafe fn decode_batched_initialize(
    s: &Nvjpeg,
    h: sys::Handle,
    state: sys::JpegState,
    batch: c_int,
    format: c_int,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeBatchedInitialize", unsafe {
        (s.decode_batched_initialize)(h, state, batch, 1, format)
    })
}

/// The arrays of one batched decode, `n` entries each.
pub(super) struct BatchArgs<'a> {
    pub data: &'a [*const u8],
    pub lengths: &'a [usize],
    pub images: &'a mut [sys::NvjpegImage],
}

/// `nvjpegDecodeBatchedPreAllocate` for batches of `batch` images of `width` x `height`
/// (4:4:4) in `format`: the hardware decoder's memory is then pooled instead of allocated per
/// batch.
///
/// # Safety
/// `h` (a hardware-backend handle) and `state` must be live, no batched decode with `state`
/// pending.
pub(super) unsafe fn decode_batched_pre_allocate(
    s: &Nvjpeg,
    h: sys::Handle,
    state: sys::JpegState,
    (batch, width, height): (c_int, c_int, c_int),
    format: c_int,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeBatchedPreAllocate", unsafe {
        (s.decode_batched_pre_allocate)(h, state, batch, width, height, sys::CSS_444, format)
    })
}

/// `nvjpegDecodeBatchedEx` with one decode-params object per image.
///
/// # Safety
/// `h`, `state` live and initialised for `data.len()` images, no batched decode with `state`
/// still pending; `params` holds one live object per image; every bitstream stays unchanged
/// and every output names device memory valid until the work completes on `cuda_stream`.
pub(super) unsafe fn decode_batched_ex(
    s: &Nvjpeg,
    h: sys::Handle,
    state: sys::JpegState,
    args: BatchArgs<'_>,
    params: &mut [sys::DecodeParams],
    cuda_stream: sys::CudaStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise; the arrays hold the batch's entries for the call.
    check("nvjpegDecodeBatchedEx", unsafe {
        (s.decode_batched_ex)(
            h,
            state,
            args.data.as_ptr(),
            args.lengths.as_ptr(),
            args.images.as_mut_ptr(),
            params.as_mut_ptr(),
            cuda_stream,
        )
    })
}

/// The objects the decoupled decode phases take.
#[derive(Clone, Copy)]
pub(super) struct Decoupled {
    pub handle: sys::Handle,
    pub decoder: sys::JpegDecoder,
    pub state: sys::JpegState,
}

/// `nvjpegDecodeJpegHost`.
///
/// # Safety
/// Every handle live; `stream` parsed from bytes that are still alive.
pub(super) unsafe fn decode_jpeg_host(
    s: &Nvjpeg,
    d: Decoupled,
    p: sys::DecodeParams,
    stream: sys::JpegStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeJpegHost", unsafe {
        (s.decode_jpeg_host)(d.handle, d.decoder, d.state, p, stream)
    })
}

/// `nvjpegDecodeJpegTransferToDevice`.
///
/// # Safety
/// Every handle live, after [`decode_jpeg_host`].
pub(super) unsafe fn decode_jpeg_transfer_to_device(
    s: &Nvjpeg,
    d: Decoupled,
    stream: sys::JpegStream,
    cuda_stream: sys::CudaStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeJpegTransferToDevice", unsafe {
        (s.decode_jpeg_transfer_to_device)(d.handle, d.decoder, d.state, stream, cuda_stream)
    })
}

/// `nvjpegDecodeJpegDevice`.
///
/// # Safety
/// Every handle live, after the transfer; `image` names device memory valid until the work
/// completes on `cuda_stream`.
pub(super) unsafe fn decode_jpeg_device(
    s: &Nvjpeg,
    d: Decoupled,
    image: &mut sys::NvjpegImage,
    cuda_stream: sys::CudaStream,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promise.
    check("nvjpegDecodeJpegDevice", unsafe {
        (s.decode_jpeg_device)(d.handle, d.decoder, d.state, image, cuda_stream)
    })
}
