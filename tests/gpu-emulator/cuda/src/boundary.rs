//! What crosses the C boundary, below the state: handle values (one range of numbers per kind
//! of object), out-parameters, and the statuses that a null pointer and a panic become there.
//! The wrapper every exported call goes through ([`crate::api::api`]) adds the state's checks
//! on top.

use stoker_emu_ffi::Boundary;

use crate::status::{self, CUresult};

/// Handles of different kinds come from different ranges, so one passed as another is
/// `CUDA_ERROR_INVALID_HANDLE`, not a silent success.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HandleKind {
    Context = 1,
    Stream = 2,
    Event = 3,
    Module = 4,
    Function = 5,
    Vmm = 6,
}

const HANDLE_BASE: u64 = 0x57e0_0000_0000;

pub(crate) fn handle(kind: HandleKind, n: u64) -> u64 {
    HANDLE_BASE + ((kind as u64) << 36) + n * 16
}

/// The primary context of device `dev`.
pub(crate) fn ctx_handle(dev: usize) -> u64 {
    handle(HandleKind::Context, dev as u64 + 1)
}

/// The driver's statuses at the C boundary (a panic is `CUDA_ERROR_UNKNOWN`).
pub(crate) const BOUNDARY: Boundary<CUresult> = Boundary {
    library: "stoker GPU emulator",
    success: status::SUCCESS,
    null_pointer: status::INVALID_VALUE,
    panicked: status::UNKNOWN,
};

/// Writes `v` through an out-parameter, `CUDA_ERROR_INVALID_VALUE` for a null pointer.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), CUresult> {
    // SAFETY: the caller's promise.
    unsafe { BOUNDARY.write_out(p, v) }
}
