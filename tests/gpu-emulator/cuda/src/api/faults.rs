//! `stoker_emu_inject_fault`: a fault planned from inside the process, on the counts of
//! [`crate::faults::Faults`].

use std::ffi::{c_char, CStr};

use super::api;
use crate::status::{self, CUresult};

/// Makes the `nth` call of `name` from now on (1: the next) fail with `code`.
///
/// # Safety
/// `name` must be a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn stoker_emu_inject_fault(
    name: *const c_char,
    nth: u64,
    code: CUresult,
) -> CUresult {
    api("stoker_emu_inject_fault", |a| {
        if name.is_null() || nth == 0 || code == 0 || status::name(code).is_none() {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: the caller passes a C string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_str()
            .map_err(|_| status::INVALID_VALUE)?;
        a.lock().faults.plan(name, nth, code);
        Ok(())
    })
}
