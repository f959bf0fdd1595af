//! One owning type per nvJPEG object: the library handle, JPEG states, parsed streams,
//! decode parameters, decoupled decoders and their pinned / device buffers.
//!
//! # Design
//! - Each type is created by one [`super::result`] call and destroyed by its `Drop` (a failed
//!   destroy is logged, never a panic). Every object made from the library handle holds an
//!   `Arc` of it, so the handle is destroyed last whatever order the owners drop in.
//! - Objects attached to one another (a state and its buffers) are kept in one struct whose
//!   field order destroys the user before what it uses.
//!
//! # Limitations
//! - The device's context must be current when these drop (the decoder binds it first).

use std::ffi::c_int;
use std::sync::Arc;

use super::{result, sys, NvjpegError, NvjpegLib};

/// The library handle (`nvjpegHandle_t`), shared by every object made from it.
pub(super) struct LibHandle {
    raw: sys::Handle,
    lib: Arc<NvjpegLib>,
}

// SAFETY: nvJPEG's library handle is documented as thread safe; only the objects made from it
// (states, streams) are per-thread, and those are not `Sync`.
unsafe impl Send for LibHandle {}
// SAFETY: as above.
unsafe impl Sync for LibHandle {}

impl LibHandle {
    /// `nvjpegCreateEx(backend)`.
    pub(super) fn create(
        lib: Arc<NvjpegLib>,
        backend: c_int,
    ) -> Result<Arc<LibHandle>, NvjpegError> {
        let raw = result::create_ex(&lib.sys, backend)?;
        Ok(Arc::new(LibHandle { raw, lib }))
    }

    pub(super) fn raw(&self) -> sys::Handle {
        self.raw
    }

    pub(super) fn sys(&self) -> &sys::Nvjpeg {
        &self.lib.sys
    }
}

impl Drop for LibHandle {
    fn drop(&mut self) {
        // SAFETY: every object made from the handle holds an Arc of it, so none is left.
        log_drop(unsafe { result::destroy(&self.lib.sys, self.raw) });
    }
}

fn log_drop(r: Result<(), NvjpegError>) {
    if let Err(e) = r {
        tracing::warn!(error = %e, "releasing an nvJPEG object failed");
    }
}

/// Declares an owning type for one kind of object made from the library handle.
macro_rules! owned {
    ($( $(#[$meta:meta])* $name:ident($raw:ty) = $destroy:path; )*) => {$(
        $(#[$meta])*
        pub(crate) struct $name {
            raw: $raw,
            handle: Arc<LibHandle>,
        }

        // SAFETY: nvJPEG objects may move between threads; each is used by one at a time (the
        // type is not `Sync`).
        unsafe impl Send for $name {}

        impl $name {
            pub(crate) fn raw(&self) -> $raw {
                self.raw
            }
        }

        impl Drop for $name {
            fn drop(&mut self) {
                // SAFETY: `raw` is live and owned here alone; the handle it was made from
                // is kept alive by `handle`.
                log_drop(unsafe { $destroy(self.handle.sys(), self.raw) });
            }
        }
    )*};
}

owned! {
    /// A decoder state (`nvjpegJpegState_t`), batched or decoupled.
    JpegState(sys::JpegState) = result::jpeg_state_destroy;
    /// A parsed bitstream (`nvjpegJpegStream_t`).
    JpegStream(sys::JpegStream) = result::jpeg_stream_destroy;
    /// Per-image decode parameters (`nvjpegDecodeParams_t`): output format, ROI.
    DecodeParams(sys::DecodeParams) = result::decode_params_destroy;
    /// A decoupled decoder (`nvjpegJpegDecoder_t`).
    JpegDecoder(sys::JpegDecoder) = result::decoder_destroy;
    /// A pinned staging buffer (`nvjpegBufferPinned_t`).
    PinnedBuffer(sys::BufferPinned) = result::buffer_pinned_destroy;
    /// A device staging buffer (`nvjpegBufferDevice_t`).
    DeviceStaging(sys::BufferDevice) = result::buffer_device_destroy;
}

impl JpegState {
    /// `nvjpegJpegStateCreate`: the batched decoder's state.
    pub(super) fn create(handle: &Arc<LibHandle>) -> Result<JpegState, NvjpegError> {
        // SAFETY: the handle is live (held by the Arc).
        let raw = unsafe { result::jpeg_state_create(handle.sys(), handle.raw())? };
        Ok(JpegState {
            raw,
            handle: handle.clone(),
        })
    }

    /// `nvjpegDecoderStateCreate`: a decoupled decoder's state.
    pub(super) fn for_decoder(
        handle: &Arc<LibHandle>,
        decoder: &JpegDecoder,
    ) -> Result<JpegState, NvjpegError> {
        // SAFETY: the handle and the decoder are live.
        let raw =
            unsafe { result::decoder_state_create(handle.sys(), handle.raw(), decoder.raw())? };
        Ok(JpegState {
            raw,
            handle: handle.clone(),
        })
    }
}

impl JpegStream {
    pub(super) fn create(handle: &Arc<LibHandle>) -> Result<JpegStream, NvjpegError> {
        // SAFETY: the handle is live.
        let raw = unsafe { result::jpeg_stream_create(handle.sys(), handle.raw())? };
        Ok(JpegStream {
            raw,
            handle: handle.clone(),
        })
    }
}

impl DecodeParams {
    /// Decode parameters with output format `format`.
    pub(super) fn create(
        handle: &Arc<LibHandle>,
        format: c_int,
    ) -> Result<DecodeParams, NvjpegError> {
        // SAFETY: the handle is live.
        let raw = unsafe { result::decode_params_create(handle.sys(), handle.raw())? };
        let p = DecodeParams {
            raw,
            handle: handle.clone(),
        };
        // SAFETY: `p` is live.
        unsafe { result::decode_params_set_output_format(handle.sys(), p.raw, format)? };
        Ok(p)
    }

    /// Sets the region of interest (`None`: the whole image).
    pub(super) fn set_roi(&self, roi: Option<super::Roi>) -> Result<(), NvjpegError> {
        let r = roi.map_or([0, 0, -1, -1], |r| {
            [r.x, r.y, r.width, r.height].map(|v| c_int::try_from(v).unwrap_or(c_int::MAX))
        });
        // SAFETY: `self` is live.
        unsafe { result::decode_params_set_roi(self.handle.sys(), self.raw, r) }
    }
}

impl JpegDecoder {
    pub(super) fn create(
        handle: &Arc<LibHandle>,
        backend: c_int,
    ) -> Result<JpegDecoder, NvjpegError> {
        // SAFETY: the handle is live.
        let raw = unsafe { result::decoder_create(handle.sys(), handle.raw(), backend)? };
        Ok(JpegDecoder {
            raw,
            handle: handle.clone(),
        })
    }
}

impl PinnedBuffer {
    pub(super) fn create(handle: &Arc<LibHandle>) -> Result<PinnedBuffer, NvjpegError> {
        // SAFETY: the handle is live.
        let raw = unsafe { result::buffer_pinned_create(handle.sys(), handle.raw())? };
        Ok(PinnedBuffer {
            raw,
            handle: handle.clone(),
        })
    }
}

impl DeviceStaging {
    pub(super) fn create(handle: &Arc<LibHandle>) -> Result<DeviceStaging, NvjpegError> {
        // SAFETY: the handle is live.
        let raw = unsafe { result::buffer_device_create(handle.sys(), handle.raw())? };
        Ok(DeviceStaging {
            raw,
            handle: handle.clone(),
        })
    }
}
