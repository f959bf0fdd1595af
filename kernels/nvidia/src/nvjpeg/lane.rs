//! One thread's share of the batched non-engine decode: nvJPEG's decoupled decoders with their
//! own states, two pinned buffers used in turn, its own CUDA stream (as nvImageCodec's
//! per-thread resources of its nvJPEG CUDA decoder).
//!
//! # Design
//! - Each lane owns every object nvJPEG says to make per thread ("the following decoder types
//!   should be instantiated separately for each thread: nvjpegJpegStream_t,
//!   nvjpegJpegState_t, nvjpegBufferDevice_t, nvjpegBufferPinned_t", `NVJPEG#thread-safety`):
//!   a state per decoder (hybrid and GPU-hybrid), a device buffer per state, and per pinned
//!   buffer a parsed-stream object. It is made on one thread and then used by one thread only.
//! - Which decoder takes an image is [`DecoupledBackend::for_image`]: a progressive file the
//!   hybrid one (GPU-hybrid does not take progressive files: `decoupled.rs`); else the
//!   GPU-hybrid one (GPU Huffman) above a pixel count, the hybrid one (host Huffman) at or below
//!   it, as DALI's `hybrid_huffman_threshold` ("Images with a total number of pixels (height *
//!   width) that is higher than this threshold will use the nvJPEG hybrid Huffman decoder",
//!   default 1000000, `nvidia.dali.fn.decoders.image`) and nvImageCodec's option of that name.
//! - Double buffering: image `i` uses pinned buffer `i % 2`, attached to its decoder's state
//!   before the host phase (`nvjpegStateAttachPinnedBuffer`). The host phase
//!   (`nvjpegDecodeJpegHost`) writes the pinned buffer; the transfer
//!   (`nvjpegDecodeJpegTransferToDevice`) reads it asynchronously on the lane's stream, so an
//!   event is recorded after each transfer and the buffer is written again only once that
//!   event completed. The next image's host phase thus runs while the last one's transfer and
//!   device phase are in flight.
//! - [`HybridLane::finish`] records `done` on the lane's stream after its images: whoever
//!   reads the pixels makes its stream wait for it (`cuStreamWaitEvent`), never the host.
//!
//! # Limitations
//! - One image at a time per lane on the host; parallelism is the number of lanes.

use std::sync::Arc;

use super::handles::{DecodeParams, DeviceStaging, JpegDecoder, JpegState, JpegStream};
use super::handles::{LibHandle, PinnedBuffer};
use super::{decoupled, result, sys, DeviceImage, NvjpegError, Roi};
use crate::cuda::{Device, Event, Stream};

/// `hybrid_huffman_threshold`'s default in DALI and nvImageCodec: images of more pixels than
/// this get GPU Huffman decoding.
pub const DEFAULT_HYBRID_HUFFMAN_THRESHOLD: u64 = 1_000_000;

/// nvJPEG's decoupled decoders.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DecoupledBackend {
    /// `NVJPEG_BACKEND_HYBRID`: Huffman decoding on the host.
    Hybrid,
    /// `NVJPEG_BACKEND_GPU_HYBRID`: Huffman decoding on the GPU.
    GpuHybrid,
}

impl DecoupledBackend {
    /// The decoder for an image of `pixels` (width x height): a progressive file always the
    /// hybrid one; else the GPU-hybrid one above `threshold` pixels (see the module's Design).
    pub fn for_image(progressive: bool, pixels: u64, threshold: u64) -> DecoupledBackend {
        if !progressive && pixels > threshold {
            DecoupledBackend::GpuHybrid
        } else {
            DecoupledBackend::Hybrid
        }
    }
}

/// One decoder with its state and device buffer. Field order is drop order.
struct LaneDecoder {
    state: JpegState,
    _device_buf: DeviceStaging,
    decoder: JpegDecoder,
}

impl LaneDecoder {
    fn new(handle: &Arc<LibHandle>, backend: std::ffi::c_int) -> Result<Self, NvjpegError> {
        let decoder = JpegDecoder::create(handle, backend)?;
        let state = JpegState::for_decoder(handle, &decoder)?;
        let device_buf = DeviceStaging::create(handle)?;
        // SAFETY: the state and the buffer are live; the buffer outlives the state.
        unsafe { result::state_attach_device_buffer(handle.sys(), state.raw(), device_buf.raw())? };
        Ok(LaneDecoder {
            state,
            _device_buf: device_buf,
            decoder,
        })
    }
}

/// A pinned buffer, the parsed stream the host phase reads with it, and the event recorded
/// after the transfer that read it last (never recorded: complete).
struct Buffered {
    stream: JpegStream,
    read: Event,
    pinned: PinnedBuffer,
}

/// One pool thread's decoupled decoders, pinned buffers and stream (see the module's Design).
pub struct HybridLane {
    // Field order: the nvJPEG objects before the stream their work is on, all before the
    // device (Drop waits for the stream and binds the context first).
    hybrid: LaneDecoder,
    gpu_hybrid: LaneDecoder,
    buffers: [Buffered; 2],
    params: DecodeParams,
    next: usize,
    stream: Stream,
    handle: Arc<LibHandle>,
    device: Device,
}

impl std::fmt::Debug for HybridLane {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HybridLane")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

impl HybridLane {
    pub(super) fn new(handle: &Arc<LibHandle>, device: &Device) -> Result<Self, NvjpegError> {
        device.bind()?;
        let buffered = || -> Result<Buffered, NvjpegError> {
            Ok(Buffered {
                stream: JpegStream::create(handle)?,
                read: device.event(false)?,
                pinned: PinnedBuffer::create(handle)?,
            })
        };
        Ok(HybridLane {
            hybrid: LaneDecoder::new(handle, sys::BACKEND_HYBRID)?,
            gpu_hybrid: LaneDecoder::new(handle, sys::BACKEND_GPU_HYBRID)?,
            buffers: [buffered()?, buffered()?],
            params: DecodeParams::create(handle, sys::OUTPUT_RGBI)?,
            next: 0,
            stream: device.stream()?,
            handle: handle.clone(),
            device: device.clone(),
        })
    }

    /// The stream the lane's transfers and device phases run on.
    pub fn stream(&self) -> &Stream {
        &self.stream
    }

    /// Binds the lane's device's context to the calling thread (once per thread).
    pub fn bind(&self) -> Result<(), NvjpegError> {
        Ok(self.device.bind()?)
    }

    /// Decodes `jpeg` (its region `roi`) with `backend` into `out`: the host phase during the
    /// call, the transfer and the device phase enqueued on the lane's stream.
    ///
    /// # Safety
    /// `out` must name `height * pitch` writable device bytes valid until the work completes
    /// on the lane's stream (after [`Self::finish`]'s event).
    pub unsafe fn decode(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
        backend: DecoupledBackend,
        out: DeviceImage,
    ) -> Result<(), NvjpegError> {
        let b = &self.buffers[self.next];
        self.next = 1 - self.next;
        // The transfer that read this pinned buffer last must be done before it is written.
        b.read.synchronize()?;
        let d = match backend {
            DecoupledBackend::Hybrid => &self.hybrid,
            DecoupledBackend::GpuHybrid => &self.gpu_hybrid,
        };
        self.params.set_roi(roi)?;
        let h = &self.handle;
        let s = h.sys();
        let objects = result::Decoupled {
            handle: h.raw(),
            decoder: d.decoder.raw(),
            state: d.state.raw(),
        };
        let mut image = out.as_nvjpeg();
        // SAFETY: every object is live and used by this lane's thread only; `jpeg` outlives
        // the parse and the host phase, which copy what they need (into the pinned buffer,
        // which no transfer still reads: waited above); the caller promises `out`.
        unsafe {
            result::state_attach_pinned_buffer(s, objects.state, b.pinned.raw())?;
            decoupled::decode_phases(
                s,
                (objects, self.params.raw()),
                (jpeg, b.stream.raw()),
                (&self.stream, &b.read),
                &mut image,
            )
        }
    }

    /// Records `done` on the lane's stream after every image decoded so far.
    pub fn finish(&self, done: &Event) -> Result<(), NvjpegError> {
        Ok(done.record(&self.stream)?)
    }
}

impl Drop for HybridLane {
    fn drop(&mut self) {
        // Nothing is released under its own work: the stream's work first.
        if let Err(e) = self.stream.synchronize() {
            tracing::warn!(error = %e, "waiting for a hybrid lane's stream before releasing it");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn progressive_files_take_host_huffman_and_large_ones_gpu_huffman() {
        let t = DEFAULT_HYBRID_HUFFMAN_THRESHOLD;
        assert_eq!(
            DecoupledBackend::for_image(true, 4000 * 3000, t),
            DecoupledBackend::Hybrid
        );
        assert_eq!(
            DecoupledBackend::for_image(false, 1_000_001, t),
            DecoupledBackend::GpuHybrid
        );
        // At the threshold and below: the host's Huffman decoder.
        assert_eq!(
            DecoupledBackend::for_image(false, 1_000_000, t),
            DecoupledBackend::Hybrid
        );
        assert_eq!(
            DecoupledBackend::for_image(false, 500 * 375, t),
            DecoupledBackend::Hybrid
        );
        // Threshold 0: every sequential image on the GPU's Huffman decoder.
        assert_eq!(
            DecoupledBackend::for_image(false, 1, 0),
            DecoupledBackend::GpuHybrid
        );
    }
}
