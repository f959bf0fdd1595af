//! The library's own rules for callers that track a job's place or find the daemon themselves
//! (the Python package): position arithmetic ([`Position`]) and which socket to use
//! ([`crate::socket::path`]), so no caller re-implements them.

use std::cell::RefCell;
use std::ffi::{c_char, CString};
use std::os::unix::ffi::OsStrExt as _;

use super::{entry, handle, lock, stoker_client, stoker_result, Failure};
use crate::protocol::{EpochOffset, Position};
use crate::socket::path::resolve_client_socket;
use stoker_result::*;

/// Where the client would resume now: the (epoch, step) of its next batch (at attach: where
/// it starts, past an elastic resume's epoch when nothing of that epoch is left).
///
/// # Safety
/// `client` is a live client; `epoch` and `step` are writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_position(
    client: *mut stoker_client,
    epoch: *mut u64,
    step: *mut u64,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        let position = lock(c)?.position();
        // SAFETY: writable by the caller's promise; NULL is refused by `put`.
        unsafe { put(epoch, position.epoch, "epoch") }?;
        // SAFETY: as above.
        unsafe { put(step, position.step, "step") }
    })
}

/// Batches of `epoch` for this rank: `steps_per_epoch`, or fewer in the epoch an elastic
/// offset resumed (`offset_epoch_steps`).
///
/// # Safety
/// `client` is a live client; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_steps_in(
    client: *mut stoker_client,
    epoch: u64,
    out: *mut u64,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        let steps = lock(c)?.steps_in(epoch);
        // SAFETY: `out` is writable by the caller's promise; NULL is refused by `put`.
        unsafe { put(out, steps, "out") }
    })
}

/// The elastic checkpoint of position (`epoch`, `step`) (docs/multi-host.md): `*consumed`
/// samples of the epoch's permutation every rank together consumed before it, for a job of
/// `world_size` ranks and batches of `batch_size` resumed after the elastic offset
/// (`offset_epoch`, `offset_consumed`) (`offset_consumed` 0: none).
///
/// # Safety
/// `consumed` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_position_consumed(
    epoch: u64,
    step: u64,
    offset_epoch: u64,
    offset_consumed: u64,
    world_size: u32,
    batch_size: u32,
    consumed: *mut u64,
) -> stoker_result {
    entry(|| {
        let offset = (offset_consumed > 0).then_some(EpochOffset {
            epoch: offset_epoch,
            consumed: offset_consumed,
        });
        let point = Position::at(epoch, step).consumed(offset, world_size, batch_size);
        // SAFETY: writable by the caller's promise; NULL is refused by `put`.
        unsafe { put(consumed, point.consumed, "consumed") }
    })
}

/// Where a client connects when given no socket (docs/operations.md, "Which socket"):
/// `$STOKER_SOCKET`, else the system daemon's socket when a daemon answers there or when it
/// exists but refuses this user (unless `$STOKER_PRIVATE_DAEMON=1`), else this user's own.
/// `*path` is valid until the next call of this function on this thread; `*source` says
/// which it is: 0 `$STOKER_SOCKET`, 1 the system daemon's, 2 this user's own (the only one
/// where a caller may start a daemon when none answers), 3 the system daemon's, refusing
/// this user (attaching there fails with the reason).
///
/// # Safety
/// `path` and `source` are writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_socket_path_resolve(
    path: *mut *const c_char,
    source: *mut i32,
) -> stoker_result {
    thread_local! {
        static RESOLVED: RefCell<CString> = RefCell::new(CString::default());
    }
    entry(|| {
        let (socket, from) = resolve_client_socket();
        let text = CString::new(socket.as_os_str().as_bytes()).map_err(|_| {
            Failure::invalid(format!("socket path {} holds a NUL byte", socket.display()))
        })?;
        let ptr = RESOLVED.with(|r| {
            *r.borrow_mut() = text;
            r.borrow().as_ptr()
        });
        // SAFETY: both are writable by the caller's promise; NULL is refused by `put`.
        unsafe { put(path, ptr, "path") }?;
        // SAFETY: as above.
        unsafe { put(source, from as i32, "source") }
    })
}

/// Writes `value` to the caller's `out`.
///
/// # Safety
/// `out` is NULL (refused) or writable.
unsafe fn put<T>(out: *mut T, value: T, what: &str) -> Result<stoker_result, Failure> {
    if out.is_null() {
        return Err(Failure::invalid(format!("{what} is NULL")));
    }
    // SAFETY: non-NULL and writable by the caller's promise.
    unsafe { out.write(value) };
    Ok(STOKER_OK)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn position_arithmetic_is_the_librarys() {
        let mut out = 0;
        // SAFETY: a valid pointer to a local.
        let r = unsafe { stoker_position_consumed(2, 3, 2, 100, 4, 8, &mut out) };
        assert_eq!((r, out), (STOKER_OK, 100 + 3 * 4 * 8));
        // SAFETY: as above; the offset is of another epoch.
        let r = unsafe { stoker_position_consumed(3, 3, 2, 100, 4, 8, &mut out) };
        assert_eq!((r, out), (STOKER_OK, 3 * 4 * 8));
        // SAFETY: NULL is refused, not written.
        let r = unsafe { stoker_position_consumed(0, 0, 0, 0, 1, 1, std::ptr::null_mut()) };
        assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
    }

    #[test]
    fn the_socket_is_resolved_by_the_librarys_rule() {
        let (mut path, mut source) = (std::ptr::null(), -1);
        // SAFETY: valid pointers to locals.
        let r = unsafe { stoker_socket_path_resolve(&mut path, &mut source) };
        assert_eq!(r, STOKER_OK);
        // SAFETY: set by the call, valid until the next one on this thread.
        let got = unsafe { std::ffi::CStr::from_ptr(path) }.to_str().unwrap();
        let (want, from) = resolve_client_socket();
        assert_eq!((got, source), (want.to_str().unwrap(), from as i32));
    }
}
