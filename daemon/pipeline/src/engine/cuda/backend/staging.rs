//! Uploads from pinned host memory: each batch in flight stages its per-sample parameters and
//! its CPU-path images in a [`HostStaging`] of its own, and replacements have one too.
//!
//! # Design
//! - Asynchronous copies from pageable memory may be synchronous: "If pageable memory must
//!   first be staged to pinned memory, the driver may synchronize with the stream and stage the
//!   copy into pinned memory" (CUDA driver API, "API synchronization behavior"). The engine
//!   queues its uploads behind the batch's decode and kernel, so a pageable upload would hold
//!   the worker until the GPU had run them. From pinned memory (`cuMemHostAlloc`) the copy is
//!   asynchronous and reads the bytes when it runs.
//! - So the bytes must stay unchanged until then: an event is recorded after a batch's last
//!   upload, and the staging waits for it before it is written again or freed. One staging per
//!   batch in flight, so a worker fills the next batch's while the last one's copies run.
//! - The buffer grows (after the wait) to the largest batch seen and never shrinks.

use stoker_nvidia::cuda::{result as cu, CudaError, Device, Event, PinnedHostBuffer};
use stoker_wire::ring::SlotLayout;

use super::CudaBackend;
use crate::engine::backend::BackendFault;
use crate::engine::backend::SlotImages;
use crate::transform::decode::routing::Route;

/// Pinned host memory for one batch's uploads, and the event after the last of them.
pub(crate) struct HostStaging {
    // Field order: Drop waits on the event before the buffer is freed.
    uploaded: Event,
    buf: Option<PinnedHostBuffer>,
    /// Bytes put since [`Self::begin`].
    used: usize,
}

impl HostStaging {
    pub(crate) fn new(device: &Device) -> Result<HostStaging, CudaError> {
        Ok(HostStaging {
            uploaded: device.event(false)?,
            buf: None,
            used: 0,
        })
    }

    /// Starts a batch of at most `bytes`: waits until the last batch's uploads from here
    /// have run, then makes room.
    pub(crate) fn begin(&mut self, device: &Device, bytes: usize) -> Result<(), CudaError> {
        self.uploaded.synchronize()?;
        self.used = 0;
        if self.buf.as_ref().is_none_or(|b| b.len() < bytes) {
            self.buf = None;
            self.buf = Some(PinnedHostBuffer::new(device, bytes.max(1))?);
        }
        Ok(())
    }

    /// Copies `src` into the staging; returns where it is (offset, length).
    fn put(&mut self, src: &[u8]) -> Result<(usize, usize), CudaError> {
        let at = self.used;
        let buf = self.buf.as_mut().filter(|b| at + src.len() <= b.len());
        let buf = buf.ok_or_else(|| {
            CudaError::Invalid(format!(
                "{} bytes staged past the batch's room",
                at + src.len()
            ))
        })?;
        buf.as_mut_slice()[at..at + src.len()].copy_from_slice(src);
        self.used += src.len();
        Ok((at, src.len()))
    }

    /// Stages `src` and enqueues its copy to device address `dst` on `stream`.
    pub(crate) fn upload(
        &mut self,
        device: &Device,
        stream: &stoker_nvidia::cuda::Stream,
        dst: u64,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let (at, n) = self.put(src)?;
        device.bind()?;
        let d = stoker_nvidia::cuda::driver()?;
        let staged = &self.buf.as_ref().expect("put made room").as_slice()[at..at + n];
        // SAFETY: `dst` is `n` bytes of device memory the caller names (a sample's place or the
        // sample array); `staged` is pinned memory this staging keeps unchanged until the
        // event recorded after the batch's uploads (`finish`) has completed (`begin`, Drop).
        unsafe { cu::memcpy_htod_async(d, dst, staged, stream.raw()) }
    }

    /// Records the event after this batch's uploads on `stream`.
    pub(crate) fn finish(&self, stream: &stoker_nvidia::cuda::Stream) -> Result<(), CudaError> {
        self.uploaded.record(stream)
    }
}

impl Drop for HostStaging {
    fn drop(&mut self) {
        // The copies from the buffer must have run before it is freed.
        if let Err(e) = self.uploaded.synchronize() {
            tracing::warn!(error = %e, "waiting for uploads before freeing their staging");
        }
    }
}

impl CudaBackend {
    /// Uploads the CPU path's images into their places from `staging`, after the launch on
    /// the stream.
    pub(super) fn upload_cpu(
        &self,
        staging: &mut HostStaging,
        first: u64,
        image_bytes: usize,
    ) -> Result<(), BackendFault> {
        // Each image's own place: a CPU-path image that failed before it kept its place.
        for (k, p) in self.plan.iter().enumerate() {
            if p.route != Ok(Route::Cpu) {
                continue;
            }
            let src = &self.host_images[p.host * image_bytes..(p.host + 1) * image_bytes];
            let dst = first + (k * image_bytes) as u64;
            staging
                .upload(self.gpu.device(), &self.stream, dst, src)
                .map_err(|e| self.fault("upload", &e))?;
        }
        Ok(())
    }

    /// Copies one host image into view `view` of place `at` and waits for it (after the
    /// batch's kernel, which runs before it on the stream).
    pub(super) fn put_sample(
        &self,
        images: SlotImages,
        layout: &SlotLayout,
        (view, at): (usize, usize),
        src: &[u8],
    ) -> bool {
        let SlotImages::Device(base) = images else {
            panic!("the CUDA backend writes device memory only, got {images:?}");
        };
        let dst = base + layout.view_image(view, at) as u64;
        let mut staging = self.sample_staging.borrow_mut();
        let done = staging
            .begin(self.gpu.device(), src.len())
            .and_then(|()| staging.upload(self.gpu.device(), &self.stream, dst, src))
            .and_then(|()| staging.finish(&self.stream))
            .and_then(|()| self.stream.synchronize())
            .map_err(|e| self.fault("upload", &e));
        match done {
            Ok(()) => true,
            Err(fault) => {
                tracing::error!(error = %fault, "cannot upload a sample");
                false
            }
        }
    }
}
