//! nvJPEG's decoupled decoders, for the images the hardware engines do not take: the
//! GPU-hybrid one (`NVJPEG_BACKEND_GPU_HYBRID`, Huffman decoding helped by the GPU) for
//! sequential files, the hybrid one (`NVJPEG_BACKEND_HYBRID`, Huffman on the CPU) for
//! progressive files.
//!
//! # Design
//! - Which one takes a file is [`Decoupled::for_file`]: progressive files (the caller says
//!   which, from the header: the decode stage's routing) go to the hybrid decoder, as nvImageCodec (`extensions/nvjpeg/cuda_decoder.cpp`: "gpu hybrid is not
//!   supported for progressive") and DALI (`nvjpeg_decoder_decoupled_api.h`: `!is_progressive`
//!   before choosing `NVJPEG_BACKEND_GPU_HYBRID`) do; everything else to the GPU-hybrid one.
//!   Support is then asked of that decoder (`nvjpegDecoderJpegSupported`) and the decode runs
//!   on it, so the question and the answer are the same decoder's.
//! - Each decoder has its own state with its own pinned and device buffers, attached once,
//!   and an event recorded after each transfer: the transfer reads the pinned buffer on the
//!   stream, so the next host phase, which writes it, waits for that event first (emulator
//!   rule 79). The batched non-engine decode double-buffers instead (`lane.rs`).
//!
//! # Limitations
//! - DALI and nvImageCodec also send small sequential images to the hybrid decoder (a size
//!   threshold, for speed); stoker does not, having no measurement of its own.
//! - The hybrid and GPU-hybrid decoders are one path in the decode mix ("hybrid").

use std::sync::Arc;

use super::handles::{
    DecodeParams, DeviceStaging, JpegDecoder, JpegState, LibHandle, PinnedBuffer,
};
use super::{result, sys, NvjpegError};
use crate::cuda::{Device, Event, Stream};

/// One decoupled decoder with its state and buffers. Field order is drop order: the state
/// goes before the buffers attached to it and the decoder it was made for.
pub(super) struct DecoupledDecoder {
    pub params: DecodeParams,
    /// Recorded after the last transfer, which read the pinned buffer (never recorded:
    /// complete).
    pub read: Event,
    state: JpegState,
    _device_buf: DeviceStaging,
    _pinned: PinnedBuffer,
    decoder: JpegDecoder,
}

impl DecoupledDecoder {
    fn new(
        handle: &Arc<LibHandle>,
        device: &Device,
        backend: std::ffi::c_int,
    ) -> Result<Self, NvjpegError> {
        let decoder = JpegDecoder::create(handle, backend)?;
        let state = JpegState::for_decoder(handle, &decoder)?;
        let pinned = PinnedBuffer::create(handle)?;
        let device_buf = DeviceStaging::create(handle)?;
        let s = handle.sys();
        // SAFETY: the state and the buffers are live, and the buffers outlive the state
        // (field order above).
        unsafe {
            result::state_attach_pinned_buffer(s, state.raw(), pinned.raw())?;
            result::state_attach_device_buffer(s, state.raw(), device_buf.raw())?;
        }
        Ok(DecoupledDecoder {
            params: DecodeParams::create(handle, sys::OUTPUT_RGBI)?,
            read: device.event(false)?,
            state,
            _device_buf: device_buf,
            _pinned: pinned,
            decoder,
        })
    }

    pub(super) fn objects(&self, handle: &LibHandle) -> result::Decoupled {
        result::Decoupled {
            handle: handle.raw(),
            decoder: self.decoder.raw(),
            state: self.state.raw(),
        }
    }
}

/// The two decoupled decoders of one [`super::NvjpegDecoder`].
pub(super) struct Decoupled {
    gpu_hybrid: DecoupledDecoder,
    hybrid: DecoupledDecoder,
}

impl Decoupled {
    pub(super) fn new(handle: &Arc<LibHandle>, device: &Device) -> Result<Decoupled, NvjpegError> {
        Ok(Decoupled {
            gpu_hybrid: DecoupledDecoder::new(handle, device, sys::BACKEND_GPU_HYBRID)?,
            hybrid: DecoupledDecoder::new(handle, device, sys::BACKEND_HYBRID)?,
        })
    }

    /// The decoder that takes a file: the hybrid one for a progressive file, else the
    /// GPU-hybrid one (the caller reads the header: the decode stage's routing).
    pub(super) fn for_file(&mut self, progressive: bool) -> &mut DecoupledDecoder {
        if progressive {
            &mut self.hybrid
        } else {
            &mut self.gpu_hybrid
        }
    }
}

/// One image through a decoupled decoder, its pinned buffer free: the parse of `jpeg` into
/// `jpeg_stream`, the host phase, the transfer on `stream` with `read` recorded after it (
/// whatever its outcome: a failed transfer may have enqueued its copy), and the device phase
/// into `image`.
///
/// # Safety
/// Every object is live and used by this thread only; no pending transfer still reads the
/// pinned buffer attached to `objects.state`; `image` names writable device memory that stays
/// valid until `stream` has run the work. `jpeg` needs to outlive only this call (the parse
/// and the host phase copy what they need).
pub(super) unsafe fn decode_phases(
    s: &sys::Nvjpeg,
    (objects, params): (result::Decoupled, sys::DecodeParams),
    (jpeg, jpeg_stream): (&[u8], sys::JpegStream),
    (stream, read): (&Stream, &Event),
    image: &mut sys::NvjpegImage,
) -> Result<(), NvjpegError> {
    // SAFETY: the caller's promises.
    unsafe {
        result::jpeg_stream_parse(s, objects.handle, jpeg, jpeg_stream)?;
        result::decode_jpeg_host(s, objects, params, jpeg_stream)?;
        let transferred =
            result::decode_jpeg_transfer_to_device(s, objects, jpeg_stream, stream.raw());
        read.record(stream)?;
        transferred?;
        result::decode_jpeg_device(s, objects, image, stream.raw())
    }
}
