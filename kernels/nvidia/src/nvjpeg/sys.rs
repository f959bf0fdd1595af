//! Raw libnvjpeg symbols, resolved at run time (the `nvjpeg-sys` crate links at build time,
//! which would break CPU-only builds).

use std::ffi::{c_int, c_uchar, c_uint, c_void};

use crate::loader::LibrarySpec;

pub(super) type NvjpegStatus = c_int;
pub(super) type Handle = *mut c_void;
pub(super) type JpegState = *mut c_void;
pub(super) type JpegStream = *mut c_void;
pub(super) type DecodeParams = *mut c_void;
pub(super) type JpegDecoder = *mut c_void;
pub(super) type BufferPinned = *mut c_void;
pub(super) type BufferDevice = *mut c_void;
pub(super) type CudaStream = *mut c_void;

pub(super) const MAX_COMPONENT: usize = 4;

pub(super) const BACKEND_DEFAULT: c_int = 0;
pub(super) const BACKEND_HYBRID: c_int = 1;
pub(super) const BACKEND_GPU_HYBRID: c_int = 2;
pub(super) const BACKEND_HARDWARE: c_int = 3;
/// `NVJPEG_FLAGS_BITSTREAM_STRICT`: refuse a stream that does not strictly follow the JPEG
/// specification instead of decoding what can be made of it.
pub(super) const FLAGS_BITSTREAM_STRICT: c_uint = 4;

/// Interleaved RGB into channel 0 (what stoker's kernels read).
pub(super) const OUTPUT_RGBI: c_int = 5;

/// `NVJPEG_CSS_444`.
pub(super) const CSS_444: c_int = 0;

/// `libraryPropertyType`.
pub(super) const MAJOR_VERSION: c_int = 0;
pub(super) const MINOR_VERSION: c_int = 1;
pub(super) const PATCH_LEVEL: c_int = 2;

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(super) struct NvjpegImage {
    pub channel: [*mut c_uchar; MAX_COMPONENT],
    pub pitch: [usize; MAX_COMPONENT],
}

impl Default for NvjpegImage {
    fn default() -> Self {
        NvjpegImage {
            channel: [std::ptr::null_mut(); MAX_COMPONENT],
            pitch: [0; MAX_COMPONENT],
        }
    }
}

/// Where libnvjpeg is looked for (see [`crate::loader`] for the order).
pub(super) const LIBNVJPEG: LibrarySpec = LibrarySpec {
    name: "libnvjpeg",
    env: "STOKER_NVJPEG",
    sonames: &["libnvjpeg.so.13", "libnvjpeg.so.12", "libnvjpeg.so"],
    // `nvidia-nvjpeg` 13.x wheels use `nvidia/cu13/lib`; `nvidia-nvjpeg-cu12` `nvidia/nvjpeg/lib`.
    wheel_dirs: &["nvidia/cu13/lib", "nvidia/nvjpeg/lib"],
};

crate::symbol_table! {
    /// Every libnvjpeg entry point stoker calls, resolved once.
    pub(crate) struct Nvjpeg, status NvjpegStatus, from "nvjpeg.h" {
    get_property = "nvjpegGetProperty": fn(c_int, *mut c_int);
    create_ex = "nvjpegCreateEx": fn(c_int, *mut c_void, *mut c_void, c_uint, *mut Handle);
    destroy = "nvjpegDestroy": fn(Handle);
    get_hardware_decoder_info = "nvjpegGetHardwareDecoderInfo":
        fn(Handle, *mut c_uint, *mut c_uint);
    get_image_info = "nvjpegGetImageInfo":
        fn(Handle, *const c_uchar, usize, *mut c_int, *mut c_int, *mut c_int, *mut c_int);
    jpeg_state_create = "nvjpegJpegStateCreate": fn(Handle, *mut JpegState);
    jpeg_state_destroy = "nvjpegJpegStateDestroy": fn(JpegState);
    decode_batched_initialize = "nvjpegDecodeBatchedInitialize":
        fn(Handle, JpegState, c_int, c_int, c_int);
    decode_batched_pre_allocate = "nvjpegDecodeBatchedPreAllocate":
        fn(Handle, JpegState, c_int, c_int, c_int, c_int, c_int);
    decode_batched_ex = "nvjpegDecodeBatchedEx":
        fn(Handle, JpegState, *const *const c_uchar, *const usize, *mut NvjpegImage,
           *mut DecodeParams, CudaStream);
    decode_batched_supported_ex = "nvjpegDecodeBatchedSupportedEx":
        fn(Handle, JpegStream, DecodeParams, *mut c_int);
    jpeg_stream_create = "nvjpegJpegStreamCreate": fn(Handle, *mut JpegStream);
    jpeg_stream_destroy = "nvjpegJpegStreamDestroy": fn(JpegStream);
    jpeg_stream_parse = "nvjpegJpegStreamParse":
        fn(Handle, *const c_uchar, usize, c_int, c_int, JpegStream);
    jpeg_stream_parse_header = "nvjpegJpegStreamParseHeader":
        fn(Handle, *const c_uchar, usize, JpegStream);
    decode_params_create = "nvjpegDecodeParamsCreate": fn(Handle, *mut DecodeParams);
    decode_params_destroy = "nvjpegDecodeParamsDestroy": fn(DecodeParams);
    decode_params_set_output_format = "nvjpegDecodeParamsSetOutputFormat":
        fn(DecodeParams, c_int);
    decode_params_set_roi = "nvjpegDecodeParamsSetROI": fn(DecodeParams, c_int, c_int, c_int, c_int);
    decoder_create = "nvjpegDecoderCreate": fn(Handle, c_int, *mut JpegDecoder);
    decoder_destroy = "nvjpegDecoderDestroy": fn(JpegDecoder);
    decoder_jpeg_supported = "nvjpegDecoderJpegSupported":
        fn(JpegDecoder, JpegStream, DecodeParams, *mut c_int);
    decoder_state_create = "nvjpegDecoderStateCreate": fn(Handle, JpegDecoder, *mut JpegState);
    buffer_pinned_create = "nvjpegBufferPinnedCreate": fn(Handle, *mut c_void, *mut BufferPinned);
    buffer_pinned_destroy = "nvjpegBufferPinnedDestroy": fn(BufferPinned);
    buffer_device_create = "nvjpegBufferDeviceCreate": fn(Handle, *mut c_void, *mut BufferDevice);
    buffer_device_destroy = "nvjpegBufferDeviceDestroy": fn(BufferDevice);
    state_attach_pinned_buffer = "nvjpegStateAttachPinnedBuffer": fn(JpegState, BufferPinned);
    state_attach_device_buffer = "nvjpegStateAttachDeviceBuffer": fn(JpegState, BufferDevice);
    decode_jpeg_host = "nvjpegDecodeJpegHost":
        fn(Handle, JpegDecoder, JpegState, DecodeParams, JpegStream);
    decode_jpeg_transfer_to_device = "nvjpegDecodeJpegTransferToDevice":
        fn(Handle, JpegDecoder, JpegState, JpegStream, CudaStream);
    decode_jpeg_device = "nvjpegDecodeJpegDevice":
        fn(Handle, JpegDecoder, JpegState, *mut NvjpegImage, CudaStream);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_struct_matches_nvjpeg_h() {
        assert_eq!(std::mem::size_of::<NvjpegImage>(), 64);
        assert_eq!(std::mem::offset_of!(NvjpegImage, pitch), 32);
    }
}
