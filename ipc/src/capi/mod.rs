//! The C ABI of `libstoker.so`: attach to `stokerd`, receive batches as DLPack tensors that
//! point into the shared ring, release them. `ipc/include/stoker.h` is generated from this
//! file by cbindgen (see `ipc/cbindgen.toml`); `docs/c-abi.md` is the guide.
//!
//! # Design
//! - Opaque handles: `stoker_client` owns a [`Client`], `stoker_batch` one share of a batch's
//!   lease. Each DLPack tensor exported from a batch holds another share; the slot goes back
//!   to the daemon when the batch handle is released *and* every tensor is deleted.
//! - Every function returns a `stoker_result`; on an error the message is kept per thread
//!   and read with `stoker_last_error()`. No panic crosses the boundary: every entry point
//!   runs under `catch_unwind`, and a panic becomes `STOKER_ERR_INTERNAL`.
//! - Option and info structs start with `size_t size` (the caller's `sizeof`): fields past the
//!   caller's size take their defaults (options) or are not written (info), so a program built
//!   against an older header keeps working with a newer library. A caller that is newer than
//!   the library may pass a larger struct only if the extra bytes are zero.
//! - Tensors are `DLManagedTensorVersioned` (DLPack 1.0) on `kDLCPU` (the images of a device
//!   ring on `kDLCUDA`, see Limitations), not read-only: the ring is mapped read-write and a
//!   consumer may normalise in place; it only ever touches its own ring.
//!
//! # Limitations
//! - One thread at a time per client for `stoker_next` (calls are serialised by a lock);
//!   `stoker_detach` must not race with other calls on the same client. Batches and tensors
//!   may be released or deleted from any thread, and may outlive their client (the mapping
//!   stays; their releases go nowhere).
//! - Device rings (the CUDA backend): the images tensor is on kDLCUDA; the slot goes back only
//!   after an event on each consumer stream (`stoker_batch_record_stream`) completed, waited
//!   for by a library thread. `stoker_batch_copy_images_to_host` copies images out for
//!   inspection (`device.rs`).

use std::cell::RefCell;
use std::ffi::{c_char, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::AtomicU64;
use std::sync::{Arc, Mutex};

use crate::client::{Batch, Client, ClientError};
use crate::dlpack::{self};
use crate::protocol::ErrorCode;
use crate::spec::{DType, Layout};

mod device;
mod fields;
pub use device::{stoker_batch_copy_images_to_host, stoker_batch_record_stream};
pub use fields::stoker_batch_field;
mod views;
pub use views::{stoker_batch_view, stoker_batch_view_count};

/// What every function returns.
#[allow(non_camel_case_types)]
#[repr(i32)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum stoker_result {
    /// Success.
    STOKER_OK = 0,
    /// `stoker_next`: the job's epochs are all served; no batch was returned.
    STOKER_END_OF_DATA = 1,
    /// A NULL where a pointer is required, a bad struct size, text that is not UTF-8, a rank
    /// outside the world size.
    STOKER_ERR_INVALID_ARGUMENT = -1,
    /// No daemon listens at the socket, or connecting failed.
    STOKER_ERR_CONNECT = -2,
    /// The daemon sent something this library does not understand (or another version).
    STOKER_ERR_PROTOCOL = -3,
    /// The pipeline spec is not valid JSON, is invalid, or differs from the job's.
    STOKER_ERR_SPEC = -4,
    /// The daemon closed the connection or is stopping: reconnect and resume.
    STOKER_ERR_DAEMON_GONE = -5,
    /// The daemon does not know the dataset or cannot open it.
    STOKER_ERR_DATASET = -6,
    /// The daemon refused the attach (rank taken, quota, permission, unsupported device).
    STOKER_ERR_REFUSED = -7,
    /// A system call failed (socket, mapping the ring).
    STOKER_ERR_IO = -8,
    /// A bug: the daemon's internal error, or a panic caught inside libstoker.
    STOKER_ERR_INTERNAL = -9,
    /// The GPU asked for cannot be used: no CUDA driver, no such device, or the daemon's
    /// device ring cannot be imported or mapped on it (the message says which and why).
    STOKER_ERR_DEVICE = -10,
    /// `stoker_batch_field`: that sample's field is not served (the sample has no such member,
    /// it is over the spec's `field_max_bytes`, or it could not be read); the message names
    /// the sample and the reason. Other samples' fields are unaffected.
    STOKER_ERR_FIELD = -11,
}

use stoker_result::*;

/// An attached client (opaque).
#[allow(non_camel_case_types)]
pub struct stoker_client {
    client: Mutex<Client>,
}

impl std::fmt::Debug for stoker_client {
    /// Shows nothing of the client: reading it would take its lock.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("stoker_client").finish_non_exhaustive()
    }
}

/// A received batch (opaque): one share of the slot's lease.
#[allow(non_camel_case_types)]
pub struct stoker_batch {
    lease: Arc<BatchLease>,
}

impl std::fmt::Debug for stoker_batch {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let batch = &self.lease.batch;
        f.debug_struct("stoker_batch")
            .field("slot", &batch.slot())
            .field("epoch", &batch.epoch())
            .field("step", &batch.step())
            .finish_non_exhaustive()
    }
}

/// The slot lease and what is needed to describe its tensors. Dropping the last share drops
/// the [`Batch`], which sends RELEASE.
struct BatchLease {
    batch: Batch,
    dtype: DType,
    layout: Layout,
    height: u32,
    width: u32,
}

/// An error on its way to the caller.
struct Failure {
    code: stoker_result,
    message: String,
}

impl Failure {
    fn invalid(message: impl Into<String>) -> Failure {
        Failure {
            code: STOKER_ERR_INVALID_ARGUMENT,
            message: message.into(),
        }
    }
}

impl From<ClientError> for Failure {
    fn from(e: ClientError) -> Failure {
        let code = match &e {
            ClientError::NoDaemon(_) | ClientError::Connect { .. } => STOKER_ERR_CONNECT,
            ClientError::Closed | ClientError::StayedAway { .. } => STOKER_ERR_DAEMON_GONE,
            ClientError::Socket(_) if e.is_disconnected() => STOKER_ERR_DAEMON_GONE,
            ClientError::Socket(_) | ClientError::Ring(_) => STOKER_ERR_IO,
            ClientError::Invalid(_) | ClientError::Encode(_) => STOKER_ERR_INVALID_ARGUMENT,
            ClientError::Spec(_) => STOKER_ERR_SPEC,
            ClientError::Decode(_) | ClientError::Protocol(_) | ClientError::Version { .. } => {
                STOKER_ERR_PROTOCOL
            }
            ClientError::Device(_) => STOKER_ERR_DEVICE,
            ClientError::SocketRefused { .. } => STOKER_ERR_REFUSED,
            ClientError::Refused { code, .. } => match code {
                ErrorCode::SpecMismatch | ErrorCode::InvalidSpec => STOKER_ERR_SPEC,
                ErrorCode::UnknownDataset => STOKER_ERR_DATASET,
                ErrorCode::BadMessage | ErrorCode::VersionMismatch => STOKER_ERR_PROTOCOL,
                ErrorCode::Stopping => STOKER_ERR_DAEMON_GONE,
                ErrorCode::Internal => STOKER_ERR_INTERNAL,
                ErrorCode::RankTaken
                | ErrorCode::Quota
                | ErrorCode::UnsupportedDevice
                | ErrorCode::PermissionDenied => STOKER_ERR_REFUSED,
            },
        };
        Failure {
            code,
            message: e.to_string(),
        }
    }
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_last_error(message: &str) {
    let text = CString::new(message.replace('\0', "\\0")).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = text);
}

/// Runs one entry point: maps its failure or panic to a result and the thread's last error.
fn entry(f: impl FnOnce() -> Result<stoker_result, Failure>) -> stoker_result {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(Ok(r)) => r,
        Ok(Err(failure)) => {
            set_last_error(&failure.message);
            failure.code
        }
        Err(panic) => {
            let what = panic
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| panic.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "unknown panic".into());
            set_last_error(&format!("internal error in libstoker: {what}"));
            STOKER_ERR_INTERNAL
        }
    }
}

/// Reads an optional C string; `what` names the field for the error.
///
/// # Safety
/// `p` is NULL or a NUL-terminated string that stays valid during the call.
unsafe fn opt_str(p: *const c_char, what: &str) -> Result<Option<String>, Failure> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: non-NULL, and the caller promises a NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str()
        .map(|s| Some(s.to_owned()))
        .map_err(|_| Failure::invalid(format!("{what} is not UTF-8")))
}

/// Copies a caller's versioned struct (first field `size_t size`) over `T`'s defaults.
///
/// # Safety
/// `p` is non-NULL and valid for reads of its own `size` field's bytes.
unsafe fn read_versioned<T: Copy + Default>(p: *const T, what: &str) -> Result<T, Failure> {
    // SAFETY: the caller promises `p` is valid; every versioned struct starts with size_t.
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    let ours = std::mem::size_of::<T>();
    if size < std::mem::size_of::<usize>() {
        return Err(Failure::invalid(format!(
            "{what}.size is {size}: set it to sizeof({what})"
        )));
    }
    if size > ours {
        // SAFETY: the caller promises `size` readable bytes at `p`.
        let extra = unsafe { std::slice::from_raw_parts(p.cast::<u8>().add(ours), size - ours) };
        if extra.iter().any(|&b| b != 0) {
            return Err(Failure::invalid(format!(
                "{what} is {size} bytes with fields this libstoker ({ours} bytes) does not know"
            )));
        }
    }
    let mut out = T::default();
    // SAFETY: `min(size, ours)` bytes are readable at `p` and writable in `out`; T is a
    // repr(C) plain struct of integers and pointers, for which any bytes are a valid value.
    unsafe {
        std::ptr::copy_nonoverlapping(
            p.cast::<u8>(),
            (&mut out as *mut T).cast::<u8>(),
            size.min(ours),
        )
    };
    Ok(out)
}

/// Writes `value` into the caller's versioned struct, at most its `size` bytes.
///
/// # Safety
/// `p` is non-NULL and valid for reads and writes of its own `size` field's bytes.
unsafe fn write_versioned<T: Copy>(p: *mut T, value: T, what: &str) -> Result<(), Failure> {
    // SAFETY: the caller promises `p` is valid; every versioned struct starts with size_t.
    let size = unsafe { p.cast::<usize>().read_unaligned() };
    if size < std::mem::size_of::<usize>() {
        return Err(Failure::invalid(format!(
            "{what}.size is {size}: set it to sizeof({what})"
        )));
    }
    let n = size.min(std::mem::size_of::<T>());
    // SAFETY: `n` bytes are readable in `value` and writable at `p`; the size field is
    // restored to the caller's own value below.
    unsafe {
        std::ptr::copy_nonoverlapping((&value as *const T).cast::<u8>(), p.cast::<u8>(), n);
        p.cast::<usize>().write_unaligned(size);
    }
    Ok(())
}

/// # Safety
/// `p` is NULL or a live handle from this library.
unsafe fn handle<'a, T>(p: *mut T, what: &str) -> Result<&'a T, Failure> {
    // SAFETY: the caller promises a live handle or NULL; `as_ref` maps NULL to None.
    unsafe { p.as_ref() }.ok_or_else(|| Failure::invalid(format!("{what} is NULL")))
}

fn check_out<T>(out: *mut T, what: &str) -> Result<(), Failure> {
    if out.is_null() {
        Err(Failure::invalid(format!("{what} is NULL")))
    } else {
        Ok(())
    }
}

static ANONYMOUS_JOBS: AtomicU64 = AtomicU64::new(0);

/// The library's version (static storage): `git describe` of its source at build time, e.g.
/// `"0.1.0+g1a2b3c4d5e"`, or the crate version where it was built without git.
#[no_mangle]
pub extern "C" fn stoker_version() -> *const c_char {
    crate::protocol::version::VERSION_NUL.as_ptr().cast()
}

/// The protocol version the library speaks to `stokerd` (a daemon of another one refuses it,
/// saying which side to upgrade).
#[no_mangle]
pub extern "C" fn stoker_protocol_version() -> u16 {
    crate::protocol::PROTOCOL_VERSION
}

/// The message of the last error returned on this thread; `""` if none. Valid until the next
/// failing call on this thread. Successful calls leave it as it was.
#[no_mangle]
pub extern "C" fn stoker_last_error() -> *const c_char {
    catch_unwind(|| LAST_ERROR.with(|e| e.borrow().as_ptr()))
        .unwrap_or(c"internal error in libstoker".as_ptr())
}

/// A constant name for a result, e.g. `"STOKER_ERR_SPEC"` (static storage).
#[no_mangle]
pub extern "C" fn stoker_result_name(result: i32) -> *const c_char {
    let name: &CStr = match result {
        0 => c"STOKER_OK",
        1 => c"STOKER_END_OF_DATA",
        -1 => c"STOKER_ERR_INVALID_ARGUMENT",
        -2 => c"STOKER_ERR_CONNECT",
        -3 => c"STOKER_ERR_PROTOCOL",
        -4 => c"STOKER_ERR_SPEC",
        -5 => c"STOKER_ERR_DAEMON_GONE",
        -6 => c"STOKER_ERR_DATASET",
        -7 => c"STOKER_ERR_REFUSED",
        -8 => c"STOKER_ERR_IO",
        -9 => c"STOKER_ERR_INTERNAL",
        -10 => c"STOKER_ERR_DEVICE",
        -11 => c"STOKER_ERR_FIELD",
        _ => c"STOKER_UNKNOWN_RESULT",
    };
    name.as_ptr()
}

mod attach;
mod batch;
mod rules;
pub use attach::*;
pub use batch::*;
pub use rules::*;

#[cfg(test)]
mod tests;
