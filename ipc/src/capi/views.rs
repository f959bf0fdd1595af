//! A batch's views (the spec's `crop` and `extra_views`, docs/views.md): how many, and each as
//! a DLPack tensor viewing the ring.

use super::batch::{export_region, Region};
use super::*;
use crate::dlpack::DLManagedTensorVersioned;

/// How many views (image tensors) each batch of this batch's job has: 1, or 1 plus the spec's
/// `extra_views`, in `*count`.
///
/// # Safety
/// `batch` is a live batch; `count` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_view_count(
    batch: *mut stoker_batch,
    count: *mut u32,
) -> stoker_result {
    entry(|| {
        check_out(count, "count")?;
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        // At most MAX_VIEWS (16).
        #[allow(clippy::cast_possible_truncation)]
        let views = b.lease.batch.views() as u32;
        // SAFETY: non-NULL and writable by the caller's promise.
        unsafe { count.write(views) };
        Ok(STOKER_OK)
    })
}

/// View `view`'s images as a DLPack tensor, as `stoker_batch_images` gives view 0: the spec's
/// dtype and layout at that view's size (`[n, 3, h, w]` or `[n, h, w, 3]`), on kDLCPU or
/// kDLCUDA, holding the batch's lease until its deleter is called. A view at or past
/// `stoker_batch_view_count` is `STOKER_ERR_INVALID`.
///
/// # Safety
/// `batch` is a live batch; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_view(
    batch: *mut stoker_batch,
    view: u32,
    out: *mut *mut DLManagedTensorVersioned,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        let views = b.lease.batch.views();
        if view as usize >= views {
            return Err(Failure::invalid(format!(
                "view {view}: the batch has {views} views"
            )));
        }
        let t = export_region(b, Region::View(view as usize));
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(t) };
        Ok(STOKER_OK)
    })
}
