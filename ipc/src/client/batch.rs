//! A received batch: a lease on one filled slot, its images, labels (and a batch mix's soft
//! labels), indices, statuses and per-sample fields.

use std::sync::{Arc, Mutex};

use super::{ClientError, Connection, ConsumerStream, DeviceError};
use crate::protocol::{CudaDevice, Device, Ready};
use crate::ring::{FieldStatus, ImageMemory, SampleStatus};

/// Why a field of a sample is not served: the sample (its global index), the field and the
/// reason, as the slot records them (see [`FieldStatus`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct FieldError {
    /// The sample's global index in the dataset.
    pub sample: u64,
    /// The field's name (its extension, as the spec asks for it).
    pub field: String,
    /// What the slot says of it (never `Ok`).
    pub status: FieldStatus,
    /// The field's length: its true length when [`FieldStatus::TooLarge`], else 0.
    pub len: u32,
    message: String,
}

/// A lease on one filled slot of the ring: one batch's images, labels, indices, statuses
/// and fields. Dropping it gives the slot back to the daemon.
#[derive(Debug)]
pub struct Batch {
    pub(super) conn: Arc<Connection>,
    pub(super) ready: Ready,
    pub(super) released: bool,
    /// The consumer streams to fence the release on (device images only).
    pub(super) streams: Mutex<Vec<ConsumerStream>>,
}

/// Where a device batch's images are: `bytes` at device address `ptr` on the client's GPU
/// `ordinal`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceSlice {
    /// Device address of the first byte (a `CUdeviceptr`).
    pub ptr: u64,
    /// Bytes from `ptr`.
    pub bytes: usize,
    /// The GPU's CUDA ordinal as this process numbers its visible devices.
    pub ordinal: i32,
}

impl Batch {
    /// The batch's epoch.
    pub fn epoch(&self) -> u64 {
        self.ready.epoch
    }

    /// The batch's step within its epoch.
    pub fn step(&self) -> u64 {
        self.ready.step
    }

    /// Samples in this batch (the spec's batch size, or fewer for a short last batch).
    pub fn n(&self) -> usize {
        self.ready.n as usize
    }

    /// The ring slot holding it.
    pub fn slot(&self) -> usize {
        self.ready.slot as usize
    }

    /// Which filling of the slot this is (RELEASE names it).
    pub fn generation(&self) -> u64 {
        self.ready.generation
    }

    /// `len` bytes at `offset` in the slot's host part (labels, indices, status).
    fn region(&self, offset: usize, len: usize) -> &[u8] {
        // SAFETY: this batch holds the slot's lease, so the daemon does not write the slot
        // until the RELEASE that `drop` sends, after every borrow of `self` has ended.
        let slot = unsafe { self.conn.ring.host_bytes(self.slot()) };
        &slot[offset..offset + len]
    }

    /// The `n` images, packed in the spec's dtype and layout.
    ///
    /// # Panics
    /// When the images are in device memory ([`Batch::image_memory`]): use
    /// [`Batch::device_images`] or [`Batch::copy_images_to_host`].
    pub fn images(&self) -> &[u8] {
        let s = &self.conn.ring.layout().slot;
        // SAFETY: as in `region`: the lease keeps the daemon from writing the slot.
        let slot = unsafe { self.conn.ring.image_bytes(self.slot()) }.expect(
            "the images are in device memory: use device_images() or copy_images_to_host()",
        );
        &slot[s.images..s.images + self.n() * s.image_bytes]
    }

    /// How many views (tensors) each batch has: 1, or 1 plus the spec's `extra_views`.
    pub fn views(&self) -> usize {
        self.conn.ring.layout().slot.views
    }

    /// View `view`'s output `(height, width)`; view 0 is the spec's `crop`.
    ///
    /// # Panics
    /// If `view >= views()`.
    pub fn view_size(&self, view: usize) -> (u32, u32) {
        let r = self.conn.ring.layout().slot.view(view);
        (r.height, r.width)
    }

    /// The `n` images of view `view` (view 0 is [`Batch::images`]), packed in the spec's dtype
    /// and layout at that view's size.
    ///
    /// # Panics
    /// If `view >= views()`, or the images are in device memory (use
    /// [`Batch::device_view`]).
    pub fn view_images(&self, view: usize) -> &[u8] {
        let r = self.conn.ring.layout().slot.view(view);
        // SAFETY: as in `region`: the lease keeps the daemon from writing the slot.
        let slot = unsafe { self.conn.ring.image_bytes(self.slot()) }
            .expect("the images are in device memory: use device_view()");
        &slot[r.offset..r.offset + self.n() * r.image_bytes]
    }

    /// View `view`'s images in device memory, as [`Batch::device_images`] gives view 0.
    ///
    /// # Panics
    /// If `view >= views()`.
    pub fn device_view(&self, view: usize) -> Option<DeviceSlice> {
        let d = self.conn.device.as_ref()?;
        let s = &self.conn.ring.layout().slot;
        let r = s.view(view);
        Some(DeviceSlice {
            ptr: d.slot_ptr(self.slot()) - s.images as u64 + r.offset as u64,
            bytes: self.n() * r.image_bytes,
            ordinal: d.ordinal(),
        })
    }

    /// Where the images live: host memory or the client's GPU.
    pub fn image_memory(&self) -> ImageMemory {
        self.conn.ring.layout().image_memory
    }

    /// Bytes of the `n` images.
    pub fn images_len(&self) -> usize {
        self.n() * self.conn.ring.layout().slot.image_bytes
    }

    /// The images' device address, when they are in device memory. Valid while the batch
    /// (its lease) lives; work a consumer enqueues on it must be fenced with
    /// [`Batch::record_stream`] unless it runs on the legacy default stream.
    pub fn device_images(&self) -> Option<DeviceSlice> {
        let d = self.conn.device.as_ref()?;
        Some(DeviceSlice {
            ptr: d.slot_ptr(self.slot()),
            bytes: self.images_len(),
            ordinal: d.ordinal(),
        })
    }

    /// Copies the `n` images to `out` (exactly [`Batch::images_len`] bytes), from host or
    /// device memory; synchronous, for inspection and tests, not for the training path.
    pub fn copy_images_to_host(&self, out: &mut [u8]) -> Result<(), ClientError> {
        self.copy_view_to_host(0, out)
    }

    /// Copies the `n` images of view `view` to `out` (exactly their bytes), as
    /// [`Batch::copy_images_to_host`] copies view 0.
    ///
    /// # Panics
    /// If `view >= views()`.
    pub fn copy_view_to_host(&self, view: usize, out: &mut [u8]) -> Result<(), ClientError> {
        let len = self.n() * self.conn.ring.layout().slot.view(view).image_bytes;
        if out.len() != len {
            return Err(ClientError::Invalid(format!(
                "copy of view {view}'s images into {} bytes; they are {len} bytes",
                out.len(),
            )));
        }
        match &self.conn.device {
            None => out.copy_from_slice(self.view_images(view)),
            Some(d) => d.copy_to_host(self.slot(), view, out).map_err(|source| {
                ClientError::Device(DeviceError::Cuda {
                    device: Device::Cuda(CudaDevice::Uuid(d.uuid())),
                    source,
                })
            })?,
        }
        Ok(())
    }

    /// Declares that a consumer used the images on `stream` (a stream of the client GPU's
    /// primary context, or a null-stream handle): the release then waits for the work
    /// enqueued there before the slot goes back. Without any, the release fences the legacy
    /// default stream. Ignored for host images.
    pub fn record_stream(&self, stream: ConsumerStream) {
        if self.conn.device.is_none() {
            return;
        }
        let mut streams = self.streams.lock().unwrap_or_else(|p| p.into_inner());
        if !streams.contains(&stream) {
            streams.push(stream);
        }
    }

    /// Pointer to the first image (for zero-copy tensor views).
    pub fn images_ptr(&self) -> *const u8 {
        self.images().as_ptr()
    }

    /// The samples' labels, `n()` of them (`0..classes`).
    pub fn labels(&self) -> &[i64] {
        let s = &self.conn.ring.layout().slot;
        cast_slice(self.region(s.labels, self.n() * 8))
    }

    /// Classes of the soft labels: the spec's batch mix's `num_classes`, 0 without one.
    pub fn num_classes(&self) -> usize {
        self.conn.ring.layout().slot.num_classes
    }

    /// The soft labels a batch mix (MixUp / CutMix) made: `n() x num_classes()` floats,
    /// row-major, each row summing to 1; `None` when the spec has no batch mix (the labels are
    /// then [`Batch::labels`] alone).
    pub fn soft_labels(&self) -> Option<&[f32]> {
        let s = &self.conn.ring.layout().slot;
        (s.num_classes > 0)
            .then(|| cast_slice(self.region(s.soft_labels, self.n() * s.num_classes * 4)))
    }

    /// Global sample indices in the dataset.
    pub fn indices(&self) -> &[u64] {
        let s = &self.conn.ring.layout().slot;
        cast_slice(self.region(s.indices, self.n() * 8))
    }

    /// Per-sample [`SampleStatus`] bytes.
    pub fn status(&self) -> &[u8] {
        let s = &self.conn.ring.layout().slot;
        self.region(s.status, self.n())
    }

    /// The spec's fields, in the order of [`Batch::field`]'s `field`.
    pub fn field_names(&self) -> &[String] {
        &self.conn.field_names
    }

    /// Field `field` (its position in the spec's `fields`) of sample `i` of the batch: its bytes
    /// exactly as stored (valid while the batch lives), or why it is not served (the sample
    /// lacks it, it is over the spec's `field_max_bytes`, it could not be read), for that
    /// sample only.
    ///
    /// # Panics
    /// If `i >= n()` or `field` is not one of the spec's fields.
    pub fn field(&self, field: usize, i: usize) -> Result<&[u8], FieldError> {
        let s = &self.conn.ring.layout().slot;
        assert!(i < self.n(), "sample {i} of a batch of {}", self.n());
        let (len_at, status_at, data_at) = s.field_at(i, field);
        let len = u32::from_le_bytes(self.region(len_at, 4).try_into().expect("4 bytes"));
        let status = FieldStatus::from_u8(self.region(status_at, 1)[0]);
        if status == Some(FieldStatus::Ok) && len as usize <= s.field_max_bytes {
            return Ok(self.region(data_at, len as usize));
        }
        let status = status.unwrap_or(FieldStatus::Unreadable);
        let name = self.conn.field_names[field].clone();
        let sample = self.indices()[i];
        let message = status
            .reason(&name, sample, len, s.field_max_bytes)
            .unwrap_or_else(|| {
                format!("field {name:?} of sample {sample}: length {len} is over its room")
            });
        Err(FieldError {
            sample,
            field: name,
            status,
            len,
            message,
        })
    }

    /// Per-sample status, decoded; unknown values read as `Failed`.
    pub fn sample_status(&self, i: usize) -> SampleStatus {
        SampleStatus::from_u8(self.status()[i]).unwrap_or(SampleStatus::Failed)
    }

    /// Releases now and reports a failure to send (drop releases too, silently): host slots
    /// at once, device slots once the consumers' recorded work completed (the send then
    /// happens on the release thread, where a failure means the daemon is gone).
    pub fn release(mut self) -> Result<(), ClientError> {
        self.release_now()
    }

    fn release_now(&mut self) -> Result<(), ClientError> {
        if self.released {
            return Ok(());
        }
        self.released = true;
        self.conn.held.give_back(self.ready.epoch, self.ready.step);
        let streams = std::mem::take(self.streams.get_mut().unwrap_or_else(|p| p.into_inner()));
        self.conn.release(&self.ready, &streams)
    }
}

impl Drop for Batch {
    fn drop(&mut self) {
        // A failed release means the daemon is gone; it reclaims the slot itself.
        let _ = self.release_now();
    }
}

/// Number types every bit pattern of which is a valid value.
trait Plain: Copy {}
impl Plain for i64 {}
impl Plain for u64 {}
impl Plain for f32 {}

/// Views aligned bytes as `T` (i64, u64 or f32).
fn cast_slice<T: Plain>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert_eq!(bytes.as_ptr().align_offset(std::mem::align_of::<T>()), 0);
    assert_eq!(bytes.len() % size, 0);
    // SAFETY: alignment and length are checked above; T is i64/u64/f32 here, for which every bit
    // pattern is valid (the `Plain` bound); the slice borrows `bytes` so it cannot outlive the memory.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}
