//! The C ABI's calls for device rings (the daemon's CUDA backend): naming the consumer's CUDA
//! streams that fence a batch's release, and copying images to the host for inspection.
//!
//! # Design
//! A batch whose images are in GPU memory goes back to the daemon only after the consumer's
//! work on it completed: at release (the batch handle released and every tensor deleted) the
//! library records an event on each stream named here, and a library thread sends RELEASE once
//! they completed. Without a named stream it fences the legacy default stream.
//!
//! # Limitations
//! - A stream must belong to the primary context of the client's GPU (what the CUDA runtime,
//!   PyTorch and JAX use); a stream of another context cannot be fenced.

use std::ffi::c_void;

use super::{entry, handle, stoker_batch, stoker_result, Failure};
use crate::client::ConsumerStream;
use stoker_result::*;

/// Declares that the batch's images are (or will be) used on the CUDA stream `stream`: a
/// `CUstream`/`cudaStream_t` of the client GPU's primary context as an integer, or `1`
/// (legacy default stream), `2` (per-thread default stream), `0` (the null stream), the
/// numbers DLPack's `stream` argument uses. When the batch is finally released, an event is
/// recorded on each stream named, and the slot goes back to the daemon only once they
/// completed; the thread that releases never waits for the GPU. Without any named stream the
/// release fences the legacy default stream. Has no effect on host images.
///
/// # Safety
/// `batch` is a live batch; `stream` stays a live stream until the batch is released.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_record_stream(
    batch: *mut stoker_batch,
    stream: usize,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        b.lease.batch.record_stream(ConsumerStream(stream));
        Ok(STOKER_OK)
    })
}

/// Copies the batch's `n` images (`stoker_batch_header.images_bytes` bytes, in the spec's dtype
/// and layout) into `dst`, from host or GPU memory. Synchronous and slow: for inspection and
/// tests, never the training path (use the DLPack tensor there). `bytes` must equal the
/// images' size.
///
/// # Safety
/// `batch` is a live batch; `dst` is writable for `bytes` bytes.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_copy_images_to_host(
    batch: *mut stoker_batch,
    dst: *mut c_void,
    bytes: usize,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        if dst.is_null() {
            return Err(Failure::invalid("dst is NULL"));
        }
        // SAFETY: the caller promises `bytes` writable bytes at `dst`.
        let out = unsafe { std::slice::from_raw_parts_mut(dst.cast::<u8>(), bytes) };
        b.lease.batch.copy_images_to_host(out)?;
        Ok(STOKER_OK)
    })
}
