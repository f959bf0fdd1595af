//! Streams and events: the order of work on a device and the fences between it.

use super::sys;
use super::{log_drop_error, result, CudaError, Device, DeviceBuffer};

/// A CUDA stream. Dropping it does not wait for its work (the driver finishes it).
#[derive(Debug)]
pub struct Stream {
    pub(super) raw: sys::CUstream,
    // Field order: the device (and its context) outlives the stream handle.
    pub(super) device: Device,
}

// SAFETY: stream handles may be used from any thread that binds the context.
unsafe impl Send for Stream {}

impl Stream {
    /// Waits for the work queued so far, sleeping: through a blocking-sync event, since
    /// `cuStreamSynchronize` spins under the primary context's default scheduling
    /// (`CU_CTX_SCHED_AUTO` busy-waits while contexts <= processors), and this crate never
    /// changes the scheduling of a context a framework shares with it. Errors of earlier
    /// asynchronous work surface here as they would from `cuStreamSynchronize`.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        let done = self.device.event(false)?;
        done.record(self)?;
        done.synchronize()
    }

    /// Makes the work queued on this stream from now on wait until the work recorded before
    /// `event` (its last record, as of this call) has completed, without the host waiting
    /// (`cuStreamWaitEvent`); the event may have been recorded on another stream.
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both handles are live while `self` and `event` are.
        unsafe { result::stream_wait_event(self.device.driver(), self.raw, event.raw) }
    }

    /// The driver's handle, for calls this crate does not wrap (nvJPEG's decodes, raw copies).
    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// The stream's scheduling priority (lower numbers are higher priorities): stoker's
    /// streams sit at their device's least priority ([`super::Device::stream_priority_range`]).
    pub fn priority(&self) -> Result<i32, CudaError> {
        self.device.bind()?;
        // SAFETY: the stream is live while `self` is.
        unsafe { result::stream_priority(self.device.driver(), self.raw) }
    }

    /// Copies `src` into device memory at `dst + offset`; returns once `src` is staged
    /// (pageable host memory is copied before the call returns).
    pub fn copy_to_device(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let fits = matches!(offset.checked_add(src.len()), Some(end) if end <= dst.len());
        if !fits {
            return Err(CudaError::Invalid(format!(
                "copy of {} bytes at {offset} into a buffer of {}",
                src.len(),
                dst.len()
            )));
        }
        self.device.bind()?;
        // SAFETY: the range is inside `dst` (checked above); `src` is pageable memory, which
        // the driver stages before returning.
        unsafe {
            result::memcpy_htod_async(
                self.device.driver(),
                dst.ptr() + offset as u64,
                src,
                self.raw,
            )
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the stream.
            log_drop_error("stream", unsafe {
                result::stream_destroy(self.device.driver(), self.raw)
            });
        }
    }
}

/// A CUDA event: fences slots (a slot is reused only once its consumer's event completed).
#[derive(Debug)]
pub struct Event {
    pub(super) raw: sys::CUevent,
    pub(super) device: Device,
}

// SAFETY: event handles may be used from any thread that binds the context.
unsafe impl Send for Event {}

impl Event {
    /// Records the event after the work queued so far on `stream`.
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both handles are live and of this device's context.
        unsafe { result::event_record(self.device.driver(), self.raw, stream.raw) }
    }

    /// Records the event on a stream this crate did not create: a consumer's (a framework's
    /// stream handed over as a raw `CUstream`), or the null stream (`0`, `CU_STREAM_LEGACY` = 1,
    /// `CU_STREAM_PER_THREAD` = 2).
    ///
    /// # Safety
    /// `stream` must be one of the null-stream handles or a live stream of this device's
    /// primary context.
    pub unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live; the caller vouches for the stream.
        unsafe { result::event_record(self.device.driver(), self.raw, stream) }
    }

    /// Waits, sleeping (the event is blocking-sync), until the work recorded before it completed.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live.
        unsafe { result::event_synchronize(self.device.driver(), self.raw) }
    }

    /// Whether the work recorded before the event has completed.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live.
        unsafe { result::event_query(self.device.driver(), self.raw) }
    }

    /// Milliseconds from `start` to `self`, both timing events already completed.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32, CudaError> {
        self.device.bind()?;
        // SAFETY: both events are live; the driver reports non-timing or unrecorded events as
        // an error status.
        unsafe { result::event_elapsed_ms(self.device.driver(), start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the event.
            log_drop_error("event", unsafe {
                result::event_destroy(self.device.driver(), self.raw)
            });
        }
    }
}

impl Device {
    /// A new non-blocking stream at this device's least priority.
    pub fn stream(&self) -> Result<Stream, CudaError> {
        self.bind()?;
        let raw = result::stream_create(self.driver_api())?;
        Ok(Stream {
            raw,
            device: self.clone(),
        })
    }

    /// A new event; `timing` events can measure elapsed time, others are cheaper.
    pub fn event(&self, timing: bool) -> Result<Event, CudaError> {
        self.bind()?;
        let raw = result::event_create(self.driver_api(), timing)?;
        Ok(Event {
            raw,
            device: self.clone(),
        })
    }
}
