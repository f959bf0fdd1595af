//! The batches one worker has in flight: each slot keeps what its batch needs until the batch's
//! work has run on the stream, so the worker reads, plans and decodes the next batch into
//! another slot meanwhile.
//!
//! # Design
//! - A slot holds the batch's read buffers (nvJPEG reads the bitstreams asynchronously), its
//!   nvJPEG hardware state, its pinned staging, its own scratch for decoded images, and with
//!   `cuda.pinned_inputs` a pinned copy of the hardware batch's bitstreams.
//! - The hardware engines write a batch's images without waiting for work queued before them
//!   on the stream (emulator rule 76, seen on an H200: docs/cuda.md, "Decoded images not
//!   overwritten by the next batch"), so a scratch may be decoded into again only once the
//!   kernel that read it last has run. Each slot records an event after its batch's kernels
//!   and waits for that event alone (`cuEventSynchronize`) before the engines or the pool
//!   (`pool`, on streams of its own) decode into its scratch: the other slot's batch stays in
//!   flight, its decode and kernel still queued.
//!
//! # Limitations
//! - One scratch per slot doubles the worker's bound for decoded images (at most
//!   `MAX_SCRATCH_BYTES` per slot); each grows to the largest batch it saw.

use stoker_nvidia::cuda::{CudaError, Device, DeviceBuffer, Event, PinnedHostBuffer};
use stoker_nvidia::nvjpeg::{HardwareBatchState, NvjpegError};

use super::staging::HostStaging;
use super::{CudaBackend, Planned};
use crate::engine::backend::{BackendFault, UnitWork};
use crate::engine::cuda::pending::PendingBatch;
use crate::transform::decode::routing::Route;

/// What a batch in flight holds until its work has run on the stream: the bitstreams it read,
/// the nvJPEG state it decoded with, the pinned memory its uploads read, and the scratch its
/// images were decoded into.
#[derive(Default)]
pub(super) struct InFlight {
    /// The read buffers, swapped with the reader's for the batch.
    pub(super) bufs: Vec<Vec<u8>>,
    pub(super) hardware: Option<HardwareBatchState>,
    /// Always set once made (`Option` only for `Default`, which `mem::take` needs).
    pub(super) staging: Option<HostStaging>,
    /// Where this slot's batches are decoded, swapped with the backend's for the batch.
    pub(super) scratch: Option<DeviceBuffer>,
    /// Recorded after the kernels that read `scratch` last (set once made, as `staging`).
    pub(super) read: Option<Event>,
    /// With `cuda.pinned_inputs`: the hardware batch's bitstreams, copied (last: freed after
    /// `hardware`, whose decode reads them, is gone).
    pub(super) inputs: Option<PinnedHostBuffer>,
}

impl InFlight {
    pub(super) fn new(
        device: &Device,
        hardware: Option<HardwareBatchState>,
    ) -> Result<InFlight, CudaError> {
        Ok(InFlight {
            bufs: Vec::new(),
            hardware,
            staging: Some(HostStaging::new(device)?),
            scratch: None,
            read: Some(device.event(false)?),
            inputs: None,
        })
    }

    /// Waits until the kernels of this slot's last batch have read its scratch (at once when
    /// it has had none: an event never recorded is complete).
    pub(super) fn wait_scratch_read(&self) -> Result<(), CudaError> {
        self.read.as_ref().map_or(Ok(()), Event::synchronize)
    }
}

/// Marks a slot's scratch read (its `read` event) once the kernels enqueued so far on `stream`
/// have run.
pub(super) fn record_read(
    read: &Option<Event>,
    stream: &stoker_nvidia::cuda::Stream,
) -> Result<(), CudaError> {
    read.as_ref().map_or(Ok(()), |e| e.record(stream))
}

/// `jpegs` copied into `inputs` (grown to fit), once `state`'s last decode, which may still
/// read the copies there, has run: the bitstreams nvJPEG reads from pinned memory.
pub(super) fn pin_inputs<'a>(
    device: &Device,
    state: &HardwareBatchState,
    inputs: &'a mut Option<PinnedHostBuffer>,
    jpegs: &[&[u8]],
) -> Result<Vec<&'a [u8]>, NvjpegError> {
    state.wait_idle()?;
    let total: usize = jpegs.iter().map(|j| j.len()).sum();
    if inputs.as_ref().is_none_or(|b| b.len() < total) {
        *inputs = None;
        // Room to grow a little without reallocating at the next larger batch.
        *inputs = Some(PinnedHostBuffer::new(device, total.max(1) + total / 4)?);
    }
    let mut ranges = Vec::with_capacity(jpegs.len());
    if let Some(buf) = inputs.as_mut() {
        let mut at = 0;
        for j in jpegs {
            buf.as_mut_slice()[at..at + j.len()].copy_from_slice(j);
            ranges.push(at..at + j.len());
            at += j.len();
        }
    }
    let inputs: &'a Option<PinnedHostBuffer> = inputs;
    let buf = inputs.as_ref().expect("made above").as_slice();
    Ok(ranges.into_iter().map(|r| &buf[r]).collect())
}

impl CudaBackend {
    /// Reads, routes and enqueues the unit with the next of `in_flight`: once the batch that
    /// used it last has been decoded, its buffers take this batch's bitstreams and stay with
    /// them until this batch's decode has run, while the other batches in flight keep theirs.
    pub(super) fn fill_in_flight(
        &mut self,
        unit: &UnitWork<'_>,
    ) -> Result<PendingBatch, BackendFault> {
        let at = self.next;
        self.next = (at + 1) % self.in_flight.len();
        let mut mine = std::mem::take(&mut self.in_flight[at]);
        let idle = mine.hardware.as_ref().map_or(Ok(()), |s| s.wait_idle());
        let pending = match idle {
            Err(e) => {
                // Nothing read: the batch's fault speaks for every sample.
                self.plan.clear();
                self.plan
                    .resize(unit.indices.len(), Planned::unread(Ok(Route::Cpu)));
                Err(self.nvjpeg_fault(e))
            }
            Ok(()) => {
                std::mem::swap(&mut self.cpu.bufs, &mut mine.bufs);
                std::mem::swap(&mut self.scratch, &mut mine.scratch);
                self.plan_unit(unit);
                let pending = self.enqueue(unit, &mut mine);
                std::mem::swap(&mut self.scratch, &mut mine.scratch);
                std::mem::swap(&mut self.cpu.bufs, &mut mine.bufs);
                pending
            }
        };
        self.in_flight[at] = mine;
        pending
    }

    /// Before the hardware engines or the pool (on streams of their own) decode into this
    /// batch's scratch: waits for the kernels that read it last (this slot's previous batch),
    /// not for the rest of the stream.
    pub(super) fn wait_for_scratch(&self, mine: &InFlight) -> Result<(), BackendFault> {
        let elsewhere = |p: &Planned| matches!(p.route, Ok(Route::Hardware | Route::Hybrid));
        if self.plan.iter().any(elsewhere) {
            mine.wait_scratch_read()
                .map_err(|e| self.fault("decode scratch", &e))?;
        }
        Ok(())
    }
}
