//! Receiving a batch, its header, its regions as DLPack tensors, and releasing it.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::Arc;

use super::*;
use crate::dlpack::*;
use crate::spec::{DType, Layout};

/// One batch's header. The pointers address the ring and stay valid while the batch handle
/// is held.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stoker_batch_header {
    /// Set by the caller to `sizeof(stoker_batch_header)`; only that many bytes are written.
    pub size: usize,
    /// The batch's epoch.
    pub epoch: u64,
    /// The batch's step within its epoch.
    pub step: u64,
    /// Samples in this batch (the batch size, or fewer in a short last batch).
    pub n: u32,
    /// Ring slot holding it.
    pub slot: u32,
    /// `n` labels.
    pub labels: *const i64,
    /// `n` global sample indices in the dataset.
    pub indices: *const u64,
    /// `n` per-sample statuses: 0 ok, 1 replaced, 2 failed, 3 empty.
    pub status: *const u8,
    /// Address of the first image: a host pointer, or a device address on the client's GPU
    /// when `images_device_type` is kDLCUDA (2).
    pub images: u64,
    /// Bytes of the `n` images.
    pub images_bytes: u64,
    /// DLPack device of the images: kDLCPU (1) or kDLCUDA (2), and its ordinal.
    pub images_device_type: i32,
    /// See `images_device_type`.
    pub images_device_id: i32,
    /// Classes of the soft labels: the spec's `batch_mix` `num_classes`, 0 without one.
    pub num_classes: u32,
    /// `n x num_classes` float soft labels, row-major (MixUp / CutMix, each row summing to
    /// 1); NULL without a batch mix.
    pub soft_labels: *const f32,
}

impl Default for stoker_batch_header {
    fn default() -> Self {
        stoker_batch_header {
            size: std::mem::size_of::<stoker_batch_header>(),
            epoch: 0,
            step: 0,
            n: 0,
            slot: 0,
            labels: std::ptr::null(),
            indices: std::ptr::null(),
            status: std::ptr::null(),
            images: 0,
            images_bytes: 0,
            images_device_type: 0,
            images_device_id: 0,
            num_classes: 0,
            soft_labels: std::ptr::null(),
        }
    }
}

/// Waits for the next batch. `STOKER_OK`: `*out` is a batch to pass to `stoker_batch_release`.
/// `STOKER_END_OF_DATA`: the job's epochs are done and `*out` is NULL.
///
/// Holding every slot of the ring (see `stoker_attach_info.slots`) stops the daemon from
/// filling more: release batches (and delete their tensors) as you go.
///
/// # Safety
/// `client` is a live client; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_next(
    client: *mut stoker_client,
    out: *mut *mut stoker_batch,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        let mut guard = lock(c)?;
        let Some(batch) = guard.next_batch()? else {
            return Ok(STOKER_END_OF_DATA);
        };
        let spec = guard.spec();
        let (height, width) = spec.crop.output_size();
        let lease = BatchLease {
            batch,
            dtype: spec.dtype,
            layout: spec.layout,
            height,
            width,
        };
        let handle = Box::new(stoker_batch {
            lease: Arc::new(lease),
        });
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(STOKER_OK)
    })
}

/// Fills `*info` (up to `info->size` bytes) with the batch's header.
///
/// # Safety
/// `batch` is a live batch; `info` points to a `stoker_batch_header` with `size` set.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_info(
    batch: *mut stoker_batch,
    info: *mut stoker_batch_header,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        check_out(info, "info")?;
        let batch = &b.lease.batch;
        let (images, device) = match batch.device_images() {
            Some(d) => (d.ptr, DLDevice::cuda(d.ordinal)),
            None => (batch.images().as_ptr() as u64, DLDevice::CPU),
        };
        // `n` and `slot` widen the wire's u32 fields (`BatchReady`), so they narrow back losslessly.
        #[allow(clippy::cast_possible_truncation)]
        let value = stoker_batch_header {
            size: 0,
            epoch: batch.epoch(),
            step: batch.step(),
            n: batch.n() as u32,
            slot: batch.slot() as u32,
            labels: batch.labels().as_ptr(),
            indices: batch.indices().as_ptr(),
            status: batch.status().as_ptr(),
            images,
            images_bytes: batch.images_len() as u64,
            images_device_type: device.device_type,
            images_device_id: device.device_id,
            // At most MAX_CLASSES (2^20).
            #[allow(clippy::cast_possible_truncation)]
            num_classes: batch.num_classes() as u32,
            soft_labels: batch
                .soft_labels()
                .map_or(std::ptr::null(), <[f32]>::as_ptr),
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_batch_header") }?;
        Ok(STOKER_OK)
    })
}

/// Which region of a batch a tensor views.
#[derive(Clone, Copy)]
pub(super) enum Region {
    /// The images of one view (view 0: the spec's `crop`, what `stoker_batch_images` gives).
    View(usize),
    Labels,
    /// A batch mix's soft labels (the caller checked there are some).
    SoftLabels,
    Indices,
    Status,
}

pub(super) fn export_region(b: &stoker_batch, region: Region) -> *mut DLManagedTensorVersioned {
    let l = &b.lease;
    // `n` widens the wire's u32 (`BatchReady::n`), so it fits an i64.
    #[allow(clippy::cast_possible_wrap)]
    let n = l.batch.n() as i64;
    let (h, w) = match region {
        Region::View(v) => {
            let (h, w) = l.batch.view_size(v);
            (i64::from(h), i64::from(w))
        }
        _ => (i64::from(l.height), i64::from(l.width)),
    };
    let images_shape = match l.layout {
        Layout::Nchw => [n, 3, h, w],
        Layout::Nhwc => [n, h, w, 3],
    };
    let n_shape = [n];
    // At most MAX_CLASSES (2^20).
    #[allow(clippy::cast_possible_wrap)]
    let soft_shape = [n, l.batch.num_classes() as i64];
    let mut device = DLDevice::CPU;
    let (data, dtype, shape): (*const u8, DLDataType, &[i64]) = match region {
        Region::View(v) => (
            match l.batch.device_view(v) {
                Some(d) => {
                    device = DLDevice::cuda(d.ordinal);
                    // CUDA runs only on 64-bit hosts, where a device address fits a pointer.
                    #[allow(clippy::cast_possible_truncation)]
                    let ptr = d.ptr as usize;
                    ptr as *const u8
                }
                None => l.batch.view_images(v).as_ptr(),
            },
            match l.dtype {
                DType::U8 => DLDataType::new(dlpack::KDL_UINT, 8),
                DType::F16 => DLDataType::new(dlpack::KDL_FLOAT, 16),
                DType::Bf16 => DLDataType::new(dlpack::KDL_BFLOAT, 16),
                DType::F32 => DLDataType::new(dlpack::KDL_FLOAT, 32),
            },
            &images_shape,
        ),
        Region::Labels => (
            l.batch.labels().as_ptr().cast(),
            DLDataType::new(dlpack::KDL_INT, 64),
            &n_shape,
        ),
        Region::SoftLabels => (
            l.batch
                .soft_labels()
                .map_or(std::ptr::null(), <[f32]>::as_ptr)
                .cast(),
            DLDataType::new(dlpack::KDL_FLOAT, 32),
            &soft_shape,
        ),
        Region::Indices => (
            l.batch.indices().as_ptr().cast(),
            DLDataType::new(dlpack::KDL_UINT, 64),
            &n_shape,
        ),
        Region::Status => (
            l.batch.status().as_ptr(),
            DLDataType::new(dlpack::KDL_UINT, 8),
            &n_shape,
        ),
    };
    dlpack::export(
        TensorDesc {
            // The ring is mapped read-write and leased to this client (see the module docs).
            data: data.cast_mut(),
            device,
            dtype,
            shape,
            read_only: false,
        },
        Arc::clone(l),
    )
}

/// # Safety
/// `batch` is a live batch or NULL; `out` is writable or NULL.
unsafe fn batch_tensor(
    batch: *mut stoker_batch,
    region: Region,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        let t = export_region(b, region);
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(t) };
        Ok(STOKER_OK)
    })
}

/// The batch's images as a DLPack tensor viewing the ring (no copy): `uint8`/`float16`/
/// `bfloat16`/`float32` per the spec, shape `[n, 3, h, w]` (NCHW) or `[n, h, w, 3]` (NHWC),
/// on kDLCPU, or on kDLCUDA with the client's device ordinal when the daemon serves the images
/// in GPU memory (`data` is then the slot's device address). The tensor holds the batch's lease
/// until its deleter is called (exactly once); for device images, see
/// `stoker_batch_record_stream` for when the slot goes back.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_images(
    batch: *mut stoker_batch,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    // SAFETY: same contract as this function's.
    unsafe { batch_tensor(batch, Region::View(0), out) }
}

/// The batch's labels as a DLPack `int64` tensor of shape `[n]` viewing the ring.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_labels(
    batch: *mut stoker_batch,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    // SAFETY: same contract as this function's.
    unsafe { batch_tensor(batch, Region::Labels, out) }
}

/// The batch's soft labels (the spec's `batch_mix`: MixUp / CutMix) as a DLPack `float32`
/// tensor of shape `[n, num_classes]` viewing the ring, each row summing to 1. A job without a
/// batch mix has none: `STOKER_ERR_INVALID_ARGUMENT`.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_soft_labels(
    batch: *mut stoker_batch,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        if b.lease.batch.soft_labels().is_none() {
            return Err(Failure::invalid(
                "soft labels: the job's spec has no batch_mix (MixUp / CutMix)",
            ));
        }
        let t = export_region(b, Region::SoftLabels);
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(t) };
        Ok(STOKER_OK)
    })
}

/// The batch's global sample indices as a DLPack `uint64` tensor of shape `[n]`.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_indices(
    batch: *mut stoker_batch,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    // SAFETY: same contract as this function's.
    unsafe { batch_tensor(batch, Region::Indices, out) }
}

/// The batch's per-sample statuses as a DLPack `uint8` tensor of shape `[n]`.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_status(
    batch: *mut stoker_batch,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    // SAFETY: same contract as this function's.
    unsafe { batch_tensor(batch, Region::Status, out) }
}

/// Wraps a versioned tensor as a pre-1.0 `DLManagedTensor` (for consumers that only take
/// DLPack 0.x). Ownership of `tensor` passes to `*out`; delete only `*out`.
///
/// # Safety
/// `tensor` is a live tensor from this library; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_dlpack_to_legacy(
    tensor: *mut DLManagedTensorVersioned,
    out: *mut *mut DLManagedTensor,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        if tensor.is_null() {
            return Err(Failure::invalid("tensor is NULL"));
        }
        // SAFETY: a live tensor whose ownership the caller hands over; `out` is writable.
        unsafe { out.write(dlpack::to_legacy(tensor)) };
        Ok(STOKER_OK)
    })
}

/// Calls a versioned tensor's deleter (a convenience; NULL is ignored).
///
/// # Safety
/// `tensor` is NULL or a live tensor, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn stoker_dlpack_delete(tensor: *mut DLManagedTensorVersioned) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: NULL or a live tensor, by the caller's promise; deleted once.
        if let Some(t) = unsafe { tensor.as_ref() } {
            if let Some(deleter) = t.deleter {
                // SAFETY: the tensor's own deleter, called once on it.
                unsafe { deleter(tensor) };
            }
        }
    }));
}

/// Gives up this handle's share of the batch. The slot returns to the daemon once every
/// tensor of the batch is deleted too. NULL is ignored.
///
/// # Safety
/// `batch` is NULL or a live batch, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_release(batch: *mut stoker_batch) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !batch.is_null() {
            // SAFETY: a live handle from `stoker_next`, released once.
            drop(unsafe { Box::from_raw(batch) });
        }
    }));
}
