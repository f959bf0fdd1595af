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
//! - Tensors are `DLManagedTensorVersioned` (DLPack 1.0) on `kDLCPU`, not read-only: the ring
//!   is mapped read-write and a consumer may normalise in place; it only ever touches its own
//!   ring.
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
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use crate::client::{AttachOptions, Batch, Client, ClientError};
use crate::dlpack::{
    self, DLDataType, DLDevice, DLManagedTensor, DLManagedTensorVersioned, TensorDesc,
};
use crate::protocol::{EpochOffset, ErrorCode, StartPosition};
use crate::ring::ImageMemory;
use crate::spec::{DType, Layout, PipelineSpec};

mod device;
pub use device::{stoker_batch_copy_images_to_host, stoker_batch_record_stream};

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
}

use stoker_result::*;

/// Attach parameters. Initialise with `stoker_attach_options_init`, then set fields.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stoker_attach_options {
    /// `sizeof(stoker_attach_options)` as the caller was compiled.
    pub size: usize,
    /// Daemon socket path; NULL: `$STOKER_SOCKET`; else `/run/stoker/stoker.sock` if a daemon
    /// answers there; else this user's own, `$XDG_RUNTIME_DIR/stoker/stoker.sock` or
    /// `/tmp/stoker-<uid>/stoker.sock`.
    pub socket: *const c_char,
    /// Job key shared by every rank of the job; NULL (world_size 1 only): a key unique to this
    /// process and attach.
    pub job: *const c_char,
    pub rank: u32,
    /// 0 is taken as 1.
    pub world_size: u32,
    /// Registered dataset name or path. Required.
    pub dataset: *const c_char,
    /// The pipeline spec as JSON (see docs/c-abi.md). Required.
    pub spec_json: *const c_char,
    pub seed: u64,
    /// First batch to receive: `start_step` of `start_epoch`.
    pub start_epoch: u64,
    pub start_step: u64,
    /// `"cpu"` or a GPU UUID; NULL: `"cpu"`.
    pub device: *const c_char,
    /// Elastic resume (docs/multi-host.md): epoch `offset_epoch` serves only what follows the
    /// first `offset_consumed` samples of its permutation, over this attach's world size.
    /// `offset_consumed` 0: no offset. Every rank of a job passes the same pair.
    pub offset_epoch: u64,
    pub offset_consumed: u64,
}

impl Default for stoker_attach_options {
    fn default() -> Self {
        stoker_attach_options {
            size: std::mem::size_of::<stoker_attach_options>(),
            socket: std::ptr::null(),
            job: std::ptr::null(),
            rank: 0,
            world_size: 1,
            dataset: std::ptr::null(),
            spec_json: std::ptr::null(),
            seed: 0,
            start_epoch: 0,
            start_step: 0,
            device: std::ptr::null(),
            offset_epoch: 0,
            offset_consumed: 0,
        }
    }
}

/// What the daemon said when the client attached.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct stoker_attach_info {
    /// Set by the caller to `sizeof(stoker_attach_info)`; only that many bytes are written.
    pub size: usize,
    /// Slots in this rank's ring (how many batches it may hold at once).
    pub slots: u32,
    /// Samples per batch (the spec's batch size).
    pub batch_size: u32,
    /// Batches per epoch for this rank.
    pub steps_per_epoch: u64,
    /// Samples in the dataset.
    pub dataset_len: u64,
    /// Classes in the dataset; labels are `0..classes`.
    pub classes: u64,
    /// Output image `(height, width)`; 3 channels.
    pub height: u32,
    pub width: u32,
    /// Where a client would resume: the (epoch, step) after the last batch received.
    pub next_epoch: u64,
    pub next_step: u64,
    /// The same place as an elastic resume point: samples of epoch `next_epoch`'s
    /// permutation every rank together consumed before it (pass it as `offset_consumed`, with
    /// `offset_epoch = next_epoch` and start (next_epoch, 0), to resume at any world size).
    pub next_consumed: u64,
    /// Batches per rank of the attach's offset epoch (`steps_per_epoch` without an offset).
    pub offset_epoch_steps: u64,
    /// Where the images are: 0 host memory (the ring's memfd), 1 the client GPU's memory (the
    /// daemon's CUDA backend: the images tensor is on kDLCUDA).
    pub image_memory: u32,
    /// For device images, the CUDA device ordinal as this process numbers devices (under its
    /// `CUDA_VISIBLE_DEVICES`); -1 for host images.
    pub device_id: i32,
}

/// Where the training loop's time went since the attach (the data stall), as the client
/// measured it: time blocked in `stoker_next` and time between its calls.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub struct stoker_stall_info {
    /// Set by the caller to `sizeof(stoker_stall_info)`; only that many bytes are written.
    pub size: usize,
    /// Seconds spent inside `stoker_next` waiting for a batch.
    pub wait_s: f64,
    /// Seconds spent between a `stoker_next` returning and the following call.
    pub compute_s: f64,
    /// `wait_s / (wait_s + compute_s)`, 0 before anything was measured.
    pub wait_fraction: f64,
    /// Batches received.
    pub batches: u64,
}

/// One batch's header. The pointers address the ring and stay valid while the batch handle
/// is held.
#[allow(non_camel_case_types)]
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct stoker_batch_header {
    /// Set by the caller to `sizeof(stoker_batch_header)`; only that many bytes are written.
    pub size: usize,
    pub epoch: u64,
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
    pub images_device_id: i32,
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
        }
    }
}

/// An attached client (opaque).
#[allow(non_camel_case_types)]
pub struct stoker_client {
    client: Mutex<Client>,
}

/// A received batch (opaque): one share of the slot's lease.
#[allow(non_camel_case_types)]
pub struct stoker_batch {
    lease: Arc<BatchLease>,
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
            ClientError::Closed => STOKER_ERR_DAEMON_GONE,
            ClientError::Socket(_) if e.is_disconnected() => STOKER_ERR_DAEMON_GONE,
            ClientError::Socket(_) | ClientError::Ring(_) => STOKER_ERR_IO,
            ClientError::Invalid(_) => STOKER_ERR_INVALID_ARGUMENT,
            ClientError::Spec(_) => STOKER_ERR_SPEC,
            ClientError::Decode(_) | ClientError::Protocol(_) => STOKER_ERR_PROTOCOL,
            ClientError::Device(_) => STOKER_ERR_DEVICE,
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

/// The library's version, e.g. `"0.1.0"` (static storage).
#[no_mangle]
pub extern "C" fn stoker_version() -> *const c_char {
    concat!(env!("CARGO_PKG_VERSION"), "\0").as_ptr().cast()
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
        _ => c"STOKER_UNKNOWN_RESULT",
    };
    name.as_ptr()
}

/// Fills `*options` with the defaults (rank 0 of 1, seed 0, from the start, cpu) and sets its
/// `size`.
///
/// # Safety
/// `options` is NULL or points to a writable `stoker_attach_options`.
#[no_mangle]
pub unsafe extern "C" fn stoker_attach_options_init(
    options: *mut stoker_attach_options,
) -> stoker_result {
    entry(|| {
        check_out(options, "options")?;
        // SAFETY: non-NULL and, by the caller's promise, a writable options struct.
        unsafe { options.write(stoker_attach_options::default()) };
        Ok(STOKER_OK)
    })
}

/// Connects to the daemon and attaches; on success `*out` is a client to pass to
/// `stoker_detach` eventually.
///
/// # Safety
/// `options` points to a `stoker_attach_options` of at least its `size` bytes, whose strings
/// are NULL or NUL-terminated; `out` is writable.
#[no_mangle]
pub unsafe extern "C" fn stoker_attach(
    options: *const stoker_attach_options,
    out: *mut *mut stoker_client,
) -> stoker_result {
    entry(|| {
        check_out(out, "out")?;
        // SAFETY: `out` is non-NULL and writable by the caller's promise.
        unsafe { out.write(std::ptr::null_mut()) };
        if options.is_null() {
            return Err(Failure::invalid("options is NULL"));
        }
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        let o = unsafe { read_versioned(options, "stoker_attach_options") }?;
        // SAFETY: each string is NULL or NUL-terminated by the caller's promise.
        let (socket, job, dataset, spec_json, device) = unsafe {
            (
                opt_str(o.socket, "socket")?,
                opt_str(o.job, "job")?,
                opt_str(o.dataset, "dataset")?,
                opt_str(o.spec_json, "spec_json")?,
                opt_str(o.device, "device")?,
            )
        };
        let dataset = dataset.ok_or_else(|| Failure::invalid("dataset is NULL"))?;
        let spec_json = spec_json.ok_or_else(|| Failure::invalid("spec_json is NULL"))?;
        let spec: PipelineSpec = serde_json::from_str(&spec_json).map_err(|e| Failure {
            code: STOKER_ERR_SPEC,
            message: format!("spec_json is not a pipeline spec: {e}"),
        })?;
        let world_size = o.world_size.max(1);
        let job = match job {
            Some(job) => job,
            None if world_size == 1 => format!(
                "anonymous-{}-{}",
                std::process::id(),
                ANONYMOUS_JOBS.fetch_add(1, Ordering::Relaxed)
            ),
            None => {
                return Err(Failure::invalid(
                    "job is NULL: ranks of a job of world_size > 1 must share a job key",
                ))
            }
        };
        let mut opts = AttachOptions::new(job, dataset, spec);
        opts.rank = o.rank;
        opts.world_size = world_size;
        opts.device = device.unwrap_or_else(|| "cpu".into());
        opts.seed = o.seed;
        opts.start = StartPosition {
            epoch: o.start_epoch,
            step: o.start_step,
            offset: (o.offset_consumed > 0).then_some(EpochOffset {
                epoch: o.offset_epoch,
                consumed: o.offset_consumed,
            }),
        };
        let client = match socket {
            Some(socket) => Client::attach(Path::new(&socket), opts)?,
            None => Client::attach_default(opts)?,
        };
        let handle = Box::new(stoker_client {
            client: Mutex::new(client),
        });
        // SAFETY: `out` is non-NULL and writable (checked above).
        unsafe { out.write(Box::into_raw(handle)) };
        Ok(STOKER_OK)
    })
}

/// Fills `*info` (up to `info->size` bytes) with what the daemon said at attach and where the
/// client would resume now.
///
/// # Safety
/// `client` is a live client; `info` points to a `stoker_attach_info` with `size` set.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_info(
    client: *mut stoker_client,
    info: *mut stoker_attach_info,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(info, "info")?;
        let guard = lock(c)?;
        let a = guard.attached();
        let spec = guard.spec();
        let (height, width) = spec.crop.output_size();
        let position = guard.position();
        let value = stoker_attach_info {
            size: 0,
            slots: a.slots,
            batch_size: spec.batch_size,
            steps_per_epoch: a.steps_per_epoch,
            dataset_len: a.dataset_len,
            classes: a.classes,
            height,
            width,
            next_epoch: position.epoch,
            next_step: position.step,
            next_consumed: position
                .consumed(guard.world_size(), spec.batch_size)
                .consumed,
            offset_epoch_steps: position
                .offset
                .map_or(a.steps_per_epoch, |o| guard.steps_in(o.epoch)),
            image_memory: match guard.image_memory() {
                ImageMemory::Host => 0,
                ImageMemory::Device => 1,
            },
            device_id: guard.device_ordinal().unwrap_or(-1),
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_attach_info") }?;
        Ok(STOKER_OK)
    })
}

/// Fills `*info` (up to `info->size` bytes) with the data stall measured since the attach.
/// The client also reports it to the daemon, which shows it per rank (`stoker status`).
///
/// # Safety
/// `client` is a live client; `info` points to a `stoker_stall_info` with `size` set.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_stall(
    client: *mut stoker_client,
    info: *mut stoker_stall_info,
) -> stoker_result {
    entry(|| {
        // SAFETY: live handle or NULL, by the caller's promise.
        let c = unsafe { handle(client, "client") }?;
        check_out(info, "info")?;
        let stall = lock(c)?.stall();
        let value = stoker_stall_info {
            size: 0,
            wait_s: stall.wait.as_secs_f64(),
            compute_s: stall.compute.as_secs_f64(),
            wait_fraction: stall.wait_fraction(),
            batches: stall.batches,
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_stall_info") }?;
        Ok(STOKER_OK)
    })
}

fn lock(c: &stoker_client) -> Result<std::sync::MutexGuard<'_, Client>, Failure> {
    c.client.lock().map_err(|_| Failure {
        code: STOKER_ERR_INTERNAL,
        message: "client is unusable: an earlier call panicked while holding it".into(),
    })
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
        };
        // SAFETY: non-NULL, valid for its size by the caller's promise.
        unsafe { write_versioned(info, value, "stoker_batch_header") }?;
        Ok(STOKER_OK)
    })
}

/// Which region of a batch a tensor views.
#[derive(Clone, Copy)]
enum Region {
    Images,
    Labels,
    Indices,
    Status,
}

fn export_region(b: &stoker_batch, region: Region) -> *mut DLManagedTensorVersioned {
    let l = &b.lease;
    let n = l.batch.n() as i64;
    let (h, w) = (i64::from(l.height), i64::from(l.width));
    let images_shape = match l.layout {
        Layout::Nchw => [n, 3, h, w],
        Layout::Nhwc => [n, h, w, 3],
    };
    let n_shape = [n];
    let mut device = DLDevice::CPU;
    let (data, dtype, shape): (*const u8, DLDataType, &[i64]) = match region {
        Region::Images => (
            match l.batch.device_images() {
                Some(d) => {
                    device = DLDevice::cuda(d.ordinal);
                    d.ptr as usize as *const u8
                }
                None => l.batch.images().as_ptr(),
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
    unsafe { batch_tensor(batch, Region::Images, out) }
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

/// Detaches and frees the client. Batches and tensors still held stay readable; their
/// releases go nowhere. NULL is ignored.
///
/// # Safety
/// `client` is NULL or a live client that no other thread is using, not used afterwards.
#[no_mangle]
pub unsafe extern "C" fn stoker_detach(client: *mut stoker_client) {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        if !client.is_null() {
            // SAFETY: a live handle from `stoker_attach`, detached once.
            drop(unsafe { Box::from_raw(client) });
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    fn last_error() -> String {
        // SAFETY: stoker_last_error returns a valid NUL-terminated string.
        unsafe { CStr::from_ptr(stoker_last_error()) }
            .to_string_lossy()
            .into_owned()
    }

    #[test]
    fn null_arguments_are_errors_not_crashes() {
        let mut client: *mut stoker_client = std::ptr::null_mut();
        // SAFETY: NULL options are allowed and refused; `client` is writable.
        let r = unsafe { stoker_attach(std::ptr::null(), &mut client) };
        assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
        assert_eq!(last_error(), "options is NULL");
        let mut batch: *mut stoker_batch = std::ptr::null_mut();
        // SAFETY: NULL client is refused.
        let r = unsafe { stoker_next(std::ptr::null_mut(), &mut batch) };
        assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
        assert_eq!(last_error(), "client is NULL");
        // SAFETY: NULL is ignored.
        unsafe {
            stoker_batch_release(std::ptr::null_mut());
            stoker_detach(std::ptr::null_mut());
        }
    }

    #[test]
    fn attach_reports_bad_spec_and_missing_daemon() {
        let mut o = stoker_attach_options::default();
        // SAFETY: `o` is writable.
        assert_eq!(unsafe { stoker_attach_options_init(&mut o) }, STOKER_OK);
        let dir = tempfile::tempdir().unwrap();
        let sock = CString::new(dir.path().join("none.sock").to_str().unwrap()).unwrap();
        o.socket = sock.as_ptr();
        o.dataset = c"/data".as_ptr();
        o.spec_json = c"{\"batch_size\": 2}".as_ptr();
        let mut client: *mut stoker_client = std::ptr::null_mut();
        // SAFETY: valid options with live strings; `client` is writable.
        let r = unsafe { stoker_attach(&o, &mut client) };
        assert_eq!(r, STOKER_ERR_SPEC);
        assert!(last_error().contains("crop"), "{}", last_error());

        o.spec_json =
            c"{\"batch_size\": 2, \"crop\": {\"kind\": \"center_crop\", \"resize\": 8, \"size\": [8, 8]}}"
                .as_ptr();
        // SAFETY: as above.
        let r = unsafe { stoker_attach(&o, &mut client) };
        assert_eq!(r, STOKER_ERR_CONNECT, "{}", last_error());
        assert!(
            last_error().contains("no stoker daemon"),
            "{}",
            last_error()
        );
        assert!(client.is_null());

        o.world_size = 2;
        o.rank = 0;
        // SAFETY: as above.
        let r = unsafe { stoker_attach(&o, &mut client) };
        assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("job"), "{}", last_error());
    }

    #[test]
    fn a_struct_from_a_newer_header_with_unknown_fields_is_refused() {
        #[repr(C)]
        #[derive(Clone, Copy)]
        struct Newer {
            base: stoker_attach_options,
            extra: u64,
        }
        let mut n = Newer {
            base: stoker_attach_options::default(),
            extra: 7,
        };
        n.base.size = std::mem::size_of::<Newer>();
        let mut client: *mut stoker_client = std::ptr::null_mut();
        // SAFETY: `n` is valid for its declared size.
        let r = unsafe { stoker_attach(&n.base, &mut client) };
        assert_eq!(r, STOKER_ERR_INVALID_ARGUMENT);
        assert!(last_error().contains("does not know"), "{}", last_error());
    }

    #[test]
    fn result_names_match_the_enum() {
        for r in [
            STOKER_OK,
            STOKER_END_OF_DATA,
            STOKER_ERR_SPEC,
            STOKER_ERR_INTERNAL,
        ] {
            // SAFETY: static strings.
            let name = unsafe { CStr::from_ptr(stoker_result_name(r as i32)) };
            assert_eq!(name.to_str().unwrap(), format!("{r:?}"));
        }
    }
}
