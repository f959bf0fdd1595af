//! The client's side of device rings (CUDA backend): which GPU a client attaches on, importing
//! and mapping the ring's VMM allocation once per attach, and releasing slots only after the
//! consumer's GPU work on them has completed.
//!
//! # Design
//! - **Which device.** A client names its GPU as `"cuda"`, `"cuda:N"` (ordinal `N` under its
//!   own `CUDA_VISIBLE_DEVICES`) or a `GPU-` UUID, parsed once into a [`Device`];
//!   [`Device::resolve`] turns an ordinal into the UUID, which is what ATTACH carries (the
//!   daemon sees other ordinals).
//! - **Import once.** ATTACHED with `image_memory: device` carries the host memfd (labels,
//!   indices, status) then the allocation's POSIX fd. The client opens its device by UUID,
//!   plans the ring with [`VmmPlan`] from its own spec and the device's granularity, refuses an
//!   announced size that differs, and imports and maps the fd ([`DeviceRing::import`]). Every
//!   batch is then an address in that one mapping.
//! - **Release after the consumer.** A batch remembers the streams its consumers used
//!   ([`ConsumerStream`], from `__dlpack__(stream=...)` or the C ABI); when the batch is
//!   released, an event is recorded on each (on the null stream if none was named). A client
//!   thread ("stoker-release") waits for the events and only then sends RELEASE: the training
//!   thread never blocks on the GPU, and the daemon never refills a slot that a kernel still
//!   reads. That thread holds the mapping, so the ring stays mapped until the last pending
//!   release's events completed, even when the client and its batches are gone.
//!
//! - Attaching, recording and copying may run on threads the client does not own (a
//!   framework's training thread, or one deleting a tensor): the thread's current CUDA context
//!   is restored afterwards, so a framework's idea of its current device never changes.
//!
//! # Limitations
//! - If no event can be recorded (a broken context: nothing of this process runs on the GPU
//!   any more), the slot is released at once, with a warning.
//! - Releases are sent in the order batches were released; one slow consumer stream holds up
//!   the releases queued behind it.

use std::os::fd::OwnedFd;
use std::sync::mpsc::{channel, Sender};
use std::sync::Arc;

use super::{DeviceError, RingMismatch};
use crate::protocol::{Attached, CudaDevice, Device, Message, Release};
use crate::ring::memfd::MemfdRing;
use crate::ring::RingLayout;
use crate::socket::SeqPacket;
use crate::spec::PipelineSpec;
use crate::VmmPlan;
use stoker_nvidia::cuda::vmm::{ring_granularity, DeviceRing};
use stoker_nvidia::cuda::{self, CudaError, Event, GpuUuid};

/// What ATTACH carries for `device`: `cpu`, or the GPU by its UUID as this process sees it
/// (an ordinal is looked up through the driver).
pub fn resolve_device(device: Device) -> Result<Device, DeviceError> {
    let ordinal = match device {
        Device::Cpu | Device::Cuda(CudaDevice::Uuid(_)) => return Ok(device),
        Device::Cuda(CudaDevice::Ordinal(n)) => n,
    };
    let info = cuda::probe().map_err(|source| DeviceError::Cuda { device, source })?;
    let dev = info.devices.get(ordinal).ok_or(DeviceError::NoOrdinal {
        ordinal,
        visible: info.devices.len(),
    })?;
    Ok(Device::Cuda(CudaDevice::Uuid(dev.uuid)))
}

/// A consumer's CUDA stream, as a raw `CUstream` value: `0` or [`ConsumerStream::LEGACY`]
/// (the legacy default stream), [`ConsumerStream::PER_THREAD`], or a stream handle of the
/// client device's primary context (what `torch.cuda.Stream.cuda_stream` gives; DLPack's
/// `stream` argument uses the same numbers).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct ConsumerStream(pub usize);

impl ConsumerStream {
    /// `CU_STREAM_LEGACY`: the legacy default stream.
    pub const LEGACY: ConsumerStream = ConsumerStream(1);
    /// `CU_STREAM_PER_THREAD`: the calling thread's default stream.
    pub const PER_THREAD: ConsumerStream = ConsumerStream(2);
}

/// A slot whose consumers' events must complete before its RELEASE is sent.
struct PendingRelease {
    slot: u32,
    generation: u64,
    events: Vec<Event>,
}

/// The image part of an attached device ring: the mapping and the release thread's queue.
pub(crate) struct DeviceImages {
    ring: Arc<DeviceRing>,
    ordinal: i32,
    uuid: GpuUuid,
    layout: RingLayout,
    releases: Sender<PendingRelease>,
}

impl std::fmt::Debug for DeviceImages {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DeviceImages")
            .field("uuid", &self.uuid)
            .field("ordinal", &self.ordinal)
            .field("ptr", &format_args!("{:#x}", self.ring.ptr()))
            .field("bytes", &self.ring.len())
            .finish()
    }
}

/// Maps both parts of a device ring from ATTACHED's two fds (memfd, then the VMM fd) for a
/// client that attached on `device` (resolved, as sent).
pub(crate) fn map_device_ring(
    spec: &PipelineSpec,
    attached: &Attached,
    fds: [OwnedFd; 2],
    device: &Device,
    sock: &SeqPacket,
) -> Result<(MemfdRing, DeviceImages), crate::client::ClientError> {
    let [host_fd, vmm_fd] = fds;
    let cuda_err = |source| DeviceError::Cuda {
        device: *device,
        source,
    };
    let ring_err = |reason: RingMismatch| DeviceError::Ring {
        device: *device,
        reason,
    };
    let uuid = device
        .gpu_uuid()
        .ok_or_else(|| ring_err(RingMismatch::NoGpu))?;
    // Attaching may run on a framework's thread: leave its current context as found.
    let _restore = cuda::ContextRestore::save().map_err(cuda_err)?;
    let dev = cuda::Device::open(uuid).map_err(cuda_err)?;
    // The position indexes the devices the driver counted in a c_int.
    #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
    let ordinal = cuda::probe()
        .map_err(cuda_err)?
        .devices
        .iter()
        .position(|d| d.uuid == uuid)
        .unwrap_or(0) as i32;
    let granularity = ring_granularity(&dev).map_err(cuda_err)?;
    let plan = VmmPlan::new(spec, attached.slots.max(1) as usize, granularity).map_err(cuda_err)?;
    let layout = plan.layout;
    if attached.slots == 0
        || layout.slot.slot_bytes as u64 != attached.slot_bytes
        || layout.ring_bytes as u64 != attached.ring_bytes
    {
        return Err(ring_err(RingMismatch::Layout {
            slots: attached.slots,
            slot_bytes: attached.slot_bytes,
            ring_bytes: attached.ring_bytes,
            want_slot_bytes: layout.slot.slot_bytes,
            want_ring_bytes: layout.ring_bytes,
        })
        .into());
    }
    let image_ring_bytes = usize::try_from(attached.image_ring_bytes)
        .map_err(|_| ring_err(RingMismatch::TooLarge(attached.image_ring_bytes)))?;
    plan.check_size(image_ring_bytes)
        .map_err(|e| ring_err(RingMismatch::Size(e)))?;
    let host = MemfdRing::from_fd(host_fd, layout)?;
    let ring = DeviceRing::import(&dev, &vmm_fd, plan.bytes).map_err(cuda_err)?;
    drop(vmm_fd);
    let images = DeviceImages::start(Arc::new(ring), ordinal, uuid, layout, sock)?;
    Ok((host, images))
}

impl DeviceImages {
    /// Starts the release thread, which sends on its own handle of the socket.
    fn start(
        ring: Arc<DeviceRing>,
        ordinal: i32,
        uuid: GpuUuid,
        layout: RingLayout,
        sock: &SeqPacket,
    ) -> Result<DeviceImages, crate::client::ClientError> {
        let sock = sock.try_clone()?;
        let (tx, rx) = channel::<PendingRelease>();
        let mapping = Arc::clone(&ring);
        std::thread::Builder::new()
            .name("stoker-release".into())
            .spawn(move || {
                // Holding `mapping` keeps the ring mapped while consumers may still read it.
                let _mapping = mapping;
                for p in rx {
                    for e in &p.events {
                        if let Err(err) = e.synchronize() {
                            tracing::warn!(slot = p.slot, error = %err,
                                "waiting for a consumer's release event failed");
                        }
                    }
                    drop(p.events);
                    // A failed send means the daemon is gone; it reclaims the slot itself.
                    let _ = send_release(&sock, p.slot, p.generation);
                }
            })
            .map_err(|e| {
                crate::client::ClientError::Protocol(format!(
                    "cannot start the release thread: {e}"
                ))
            })?;
        Ok(DeviceImages {
            ring,
            ordinal,
            uuid,
            layout,
            releases: tx,
        })
    }

    /// The device ordinal of the ring under this process's `CUDA_VISIBLE_DEVICES`.
    pub(crate) fn ordinal(&self) -> i32 {
        self.ordinal
    }

    pub(crate) fn uuid(&self) -> GpuUuid {
        self.uuid
    }

    /// Device address of slot `slot`'s first image.
    pub(crate) fn slot_ptr(&self, slot: usize) -> u64 {
        self.ring.ptr() + (self.layout.image_offset(slot) + self.layout.slot.images) as u64
    }

    /// Copies `out.len()` bytes from view `view` of slot `slot`'s images to the host,
    /// synchronously (view 0 is the spec's `crop`).
    pub(crate) fn copy_to_host(
        &self,
        slot: usize,
        view: usize,
        out: &mut [u8],
    ) -> Result<(), CudaError> {
        let r = self.layout.slot.view(view);
        let room = self.layout.slot.batch_size * r.image_bytes;
        if out.len() > room {
            return Err(CudaError::Invalid(format!(
                "a copy of {} bytes from view {view} of a slot, of {room} image bytes",
                out.len(),
            )));
        }
        let _restore = cuda::ContextRestore::save()?;
        self.ring
            .copy_to_host(self.layout.image_offset(slot) + r.offset, out)
    }

    /// Records an event on each consumer stream (the null stream when there is none) and
    /// queues the slot's RELEASE behind them. Never blocks on the GPU.
    pub(crate) fn release(
        &self,
        slot: u32,
        generation: u64,
        streams: &[ConsumerStream],
        sock: &SeqPacket,
    ) {
        // This may run on a framework's thread (a tensor's deleter): leave its context as found.
        let _restore = cuda::ContextRestore::save();
        let streams = if streams.is_empty() {
            &[ConsumerStream::LEGACY][..]
        } else {
            streams
        };
        let mut events = Vec::with_capacity(streams.len());
        for s in streams {
            match self.record(*s) {
                Ok(e) => events.push(e),
                Err(err) => {
                    tracing::warn!(slot, stream = s.0, error = %err,
                        "cannot record the release event; releasing without it");
                }
            }
        }
        let pending = PendingRelease {
            slot,
            generation,
            events,
        };
        if let Err(unsent) = self.releases.send(pending) {
            // The release thread is gone (it never panics; only if it could not start):
            // release from here, after the events.
            let p = unsent.0;
            for e in &p.events {
                let _ = e.synchronize();
            }
            let _ = send_release(sock, p.slot, p.generation);
        }
    }

    fn record(&self, stream: ConsumerStream) -> Result<Event, CudaError> {
        // The release may run on another thread than the one that named its per-thread
        // default stream (a garbage collector, a deleter): recording there would fence the
        // wrong stream. The legacy default stream waits for every blocking stream of the
        // context, per-thread default streams included, so it fences them from any thread.
        let stream = if stream == ConsumerStream::PER_THREAD {
            ConsumerStream::LEGACY
        } else {
            stream
        };
        let e = self.ring.device().event(false)?;
        // SAFETY: the stream is a null-stream handle or the consumer's stream of this
        // device's primary context (the caller's promise through `Batch::record_stream`).
        unsafe { e.record_raw(stream.0 as cuda::sys::CUstream) }?;
        Ok(e)
    }
}

/// Sends RELEASE.
pub(crate) fn send_release(
    sock: &SeqPacket,
    slot: u32,
    generation: u64,
) -> Result<(), crate::socket::SockError> {
    let msg = Message::Release(Release { slot, generation })
        .encode()
        .expect("a RELEASE always encodes");
    sock.send(&msg, &[])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_and_uuids_resolve_to_themselves_without_the_driver() {
        assert_eq!(resolve_device(Device::Cpu).unwrap(), Device::Cpu);
        let u: Device = "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6".parse().unwrap();
        assert_eq!(resolve_device(u).unwrap(), u);
        let e = DeviceError::from("tpu".parse::<Device>().unwrap_err());
        assert!(e.to_string().contains("\"tpu\""), "{e}");
    }
}
