//! A batch's per-sample fields (the spec's `fields`: captions, JSON records, any member of a
//! WebDataset key) as (pointer, length) per sample, viewing the ring.

use super::*;
use crate::ring::FieldStatus;

/// Field `field` (its position in the spec's `fields`) of sample `sample` of the batch:
/// `STOKER_OK` with `*data` pointing at its `*len` bytes, exactly as stored (not
/// NUL-terminated; valid while the batch handle is held, like its labels). A field the sample
/// does not serve is `STOKER_ERR_FIELD` for that sample only: `*data` is NULL, `*len` its true
/// length when it is over the spec's `field_max_bytes` (else 0), `*status` (when not NULL)
/// says why (1 missing, 2 over `field_max_bytes`, 3 unreadable; 0 on success), and
/// `stoker_last_error()` names the sample (its global index), the field and the reason.
///
/// # Safety
/// `batch` is a live batch; `data` and `len` are writable; `status` is NULL or writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_field(
    batch: *mut stoker_batch,
    field: u32,
    sample: u32,
    data: *mut *const u8,
    len: *mut usize,
    status: *mut u8,
) -> stoker_result {
    entry(|| {
        check_out(data, "data")?;
        check_out(len, "len")?;
        // SAFETY: both are non-NULL and writable by the caller's promise.
        unsafe {
            data.write(std::ptr::null());
            len.write(0);
        }
        // SAFETY: live handle or NULL, by the caller's promise.
        let b = unsafe { handle(batch, "batch") }?;
        let batch = &b.lease.batch;
        let (f, i) = (field as usize, sample as usize);
        if f >= batch.field_names().len() {
            let asked = batch.field_names().len();
            return Err(Failure::invalid(format!(
                "field {f}: the spec asks for {asked} fields"
            )));
        }
        if i >= batch.n() {
            return Err(Failure::invalid(format!(
                "sample {i}: the batch has {} samples",
                batch.n()
            )));
        }
        let (result, code, bytes) = match batch.field(f, i) {
            Ok(bytes) => (Ok(STOKER_OK), FieldStatus::Ok, Some(bytes)),
            Err(e) => {
                let failure = Failure {
                    code: STOKER_ERR_FIELD,
                    message: e.to_string(),
                };
                // SAFETY: `len` is non-NULL and writable (checked above).
                unsafe { len.write(e.len as usize) };
                (Err(failure), e.status, None)
            }
        };
        if let Some(bytes) = bytes {
            // SAFETY: both are non-NULL and writable (checked above); the bytes lie in the
            // ring, mapped while the batch's lease lives.
            unsafe {
                data.write(bytes.as_ptr());
                len.write(bytes.len());
            }
        }
        if !status.is_null() {
            // SAFETY: non-NULL, and writable by the caller's promise.
            unsafe { status.write(code as u8) };
        }
        result
    })
}
