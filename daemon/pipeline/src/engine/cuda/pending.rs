//! A batch's completion: the events recorded around its decode and kernel on its stream.
//!
//! # Design
//! - Events come from a small pool per backend and go back to it once waited for, so steady
//!   state creates none.
//! - Waiting synchronises the last event; its failure is the batch's fault (a sticky one
//!   breaks the GPU). The device time from the end of decode to the end of the kernel is
//!   recorded per batch.
//!
//! # Limitations
//! - The decode time is host time (the nvJPEG calls and the CPU path), the kernel time device
//!   time between two events.

#![forbid(unsafe_code)]

use crate::sync::lock;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use stoker_nvidia::cuda::{CudaError, Device, Event};

use super::{breaks_context, Gpu};
use crate::engine::backend::{BackendFault, PendingWork};

/// The events of one batch: after its decode, after its kernel and uploads.
pub(crate) struct EventSet {
    pub decoded: Event,
    pub done: Event,
}

impl EventSet {
    pub(crate) fn new(device: &Device) -> Result<EventSet, CudaError> {
        Ok(EventSet {
            decoded: device.event(true)?,
            done: device.event(true)?,
        })
    }
}

/// Event sets not in use, shared by a backend and its pending batches.
pub(crate) type EventPool = Arc<Mutex<Vec<EventSet>>>;

/// A batch enqueued on a stream.
pub(crate) struct PendingBatch {
    pub gpu: Arc<Gpu>,
    pub events: EventSet,
    pub pool: EventPool,
}

impl PendingWork for PendingBatch {
    fn wait(self: Box<Self>) -> Result<(), BackendFault> {
        let PendingBatch { gpu, events, pool } = *self;
        let done = events.done.synchronize();
        gpu.stats.in_flight.fetch_sub(1, Ordering::Relaxed);
        if let Err(e) = done {
            return Err(gpu.fault(
                "the batch's decode or kernel failed",
                &e,
                breaks_context(&e),
            ));
        }
        if let Ok(ms) = events.done.elapsed_ms_since(&events.decoded) {
            // Elapsed time: `as` saturates (a negative reads 0).
            #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
            let ns = (f64::from(ms) * 1e6) as u64;
            gpu.stats.kernel.record_ns(ns);
        }
        lock(&pool).push(events);
        Ok(())
    }
}

/// A batch that failed before anything was enqueued (a broken GPU, a failed call).
pub(crate) struct Failed(pub(crate) BackendFault);

impl PendingWork for Failed {
    fn wait(self: Box<Self>) -> Result<(), BackendFault> {
        Err(self.0)
    }
}
