//! The C ABI of `libstoker.so`, declared in `stoker.h` (next to this file).
//!
//! # Design
//! - Opaque handles: `stoker_client` (one attached rank) and `stoker_batch` (one lease).
//! - One result enum, [`StokerResult`]; the message of the last failure on this thread is
//!   `stoker_last_error()`.
//! - Structs that may grow carry their own size first (`struct_size`), so an older caller's
//!   smaller struct is still read correctly.
//! - Tensors are DLPack `DLManagedTensorVersioned` (DLPack 1.0) views of the ring: no copy.
//!   Each tensor holds a reference on its batch; the slot is released when the batch handle
//!   and every tensor made from it have been freed (`stoker_batch_free`, the deleters), in any
//!   order. This is what lets Python hand a tensor to torch and forget the batch.
//! - No panic crosses the boundary: every entry point catches unwinding and reports
//!   `STOKER_ERR_INTERNAL`.
//!
//! # Limitations
//! - CPU rings only (`kDLCPU`); the CUDA ring will report `kDLCUDA` with the device ordinal.
//! - `stoker.h` is written by hand; `tests::header_declares_every_export` checks that it and
//!   this file name the same functions.

use std::cell::RefCell;
use std::ffi::{c_char, c_void, CStr, CString};
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Arc;

use crate::client::{AttachOptions, Batch, Client, ClientError};
use crate::protocol::StartPosition;
use crate::spec::{DType, Layout, PipelineSpec};

/// Result of every fallible call.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StokerResult {
    Ok = 0,
    /// `stoker_next`: the data has ended (the spec's epochs are done).
    End = 1,
    ErrInvalidArgument = -1,
    /// No daemon listens at the socket.
    ErrNoDaemon = -2,
    /// The daemon closed the connection or went away: attach again and resume.
    ErrDisconnected = -3,
    /// The daemon refused (spec mismatch, rank taken, unknown dataset, ...).
    ErrRefused = -4,
    /// The daemon broke the protocol or sent a bad ring.
    ErrProtocol = -5,
    ErrInternal = -6,
}

thread_local! {
    static LAST_ERROR: RefCell<CString> = RefCell::new(CString::default());
}

fn set_error(msg: impl Into<String>) {
    let msg = msg.into().replace('\0', " ");
    let c = CString::new(msg).unwrap_or_default();
    LAST_ERROR.with(|e| *e.borrow_mut() = c);
}

fn fail(r: StokerResult, msg: impl Into<String>) -> StokerResult {
    set_error(msg);
    r
}

fn client_error(e: ClientError) -> StokerResult {
    let r = match &e {
        ClientError::NoDaemon(_) => StokerResult::ErrNoDaemon,
        _ if e.is_disconnected() => StokerResult::ErrDisconnected,
        ClientError::Refused { .. } => StokerResult::ErrRefused,
        ClientError::Invalid(_) | ClientError::Spec(_) => StokerResult::ErrInvalidArgument,
        ClientError::Decode(_) | ClientError::Protocol(_) | ClientError::Ring(_) => {
            StokerResult::ErrProtocol
        }
        _ => StokerResult::ErrInternal,
    };
    fail(r, e.to_string())
}

/// Runs `f`, turning a panic into `STOKER_ERR_INTERNAL`.
fn guard(f: impl FnOnce() -> StokerResult) -> StokerResult {
    match catch_unwind(AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(_) => fail(StokerResult::ErrInternal, "internal panic in libstoker"),
    }
}

/// The message of the last failed call on this thread ("" if none). Valid until the next
/// call on this thread.
#[no_mangle]
pub extern "C" fn stoker_last_error() -> *const c_char {
    LAST_ERROR.with(|e| e.borrow().as_ptr())
}

/// The protocol version this library speaks.
#[no_mangle]
pub extern "C" fn stoker_protocol_version() -> u32 {
    u32::from(crate::protocol::PROTOCOL_VERSION)
}

/// What `stoker_attach` needs. Mirrors `stoker_attach_options` in stoker.h.
#[repr(C)]
pub struct StokerAttachOptions {
    /// `sizeof(stoker_attach_options)` as the caller knows it.
    pub struct_size: u32,
    pub rank: u32,
    pub world_size: u32,
    /// Socket path; NULL for the default (`$STOKER_SOCKET`, ...).
    pub socket: *const c_char,
    pub job: *const c_char,
    /// "cpu" or a GPU UUID; NULL means "cpu".
    pub device: *const c_char,
    /// The pipeline spec as JSON.
    pub spec_json: *const c_char,
    /// A registered dataset name or a path.
    pub dataset: *const c_char,
    pub seed: u64,
    pub start_epoch: u64,
    pub start_step: u64,
}

/// One attached rank.
pub struct StokerClient {
    client: Client,
}

/// One lease; the slot is released once this and every tensor made from it are freed.
pub struct StokerBatch {
    batch: Arc<Batch>,
    spec: Arc<PipelineSpec>,
}

/// # Safety
/// `p` is NULL or a valid NUL-terminated string.
unsafe fn opt_str<'a>(p: *const c_char, what: &str) -> Result<Option<&'a str>, StokerResult> {
    if p.is_null() {
        return Ok(None);
    }
    // SAFETY: the caller guarantees a valid NUL-terminated string.
    let s = unsafe { CStr::from_ptr(p) };
    s.to_str().map(Some).map_err(|_| {
        fail(
            StokerResult::ErrInvalidArgument,
            format!("{what} is not UTF-8"),
        )
    })
}

/// # Safety
/// As [`opt_str`].
unsafe fn req_str<'a>(p: *const c_char, what: &str) -> Result<&'a str, StokerResult> {
    // SAFETY: forwarded contract.
    unsafe { opt_str(p, what) }?.ok_or_else(|| {
        fail(
            StokerResult::ErrInvalidArgument,
            format!("{what} must not be NULL"),
        )
    })
}

/// Connects and attaches. On success `*out` is a client to free with `stoker_detach`.
///
/// # Safety
/// `opts` points to a valid `stoker_attach_options` whose strings are NUL-terminated or NULL;
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn stoker_attach(
    opts: *const StokerAttachOptions,
    out: *mut *mut StokerClient,
) -> StokerResult {
    guard(|| {
        if opts.is_null() || out.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: non-null and valid per the contract.
        let o = unsafe { &*opts };
        if (o.struct_size as usize) < std::mem::size_of::<StokerAttachOptions>() {
            return fail(
                StokerResult::ErrInvalidArgument,
                format!(
                    "stoker_attach_options.struct_size is {}, this library needs {}",
                    o.struct_size,
                    std::mem::size_of::<StokerAttachOptions>()
                ),
            );
        }
        // SAFETY: strings are valid or NULL per the contract.
        let strings = unsafe {
            (|| {
                Ok::<_, StokerResult>((
                    opt_str(o.socket, "socket")?,
                    req_str(o.job, "job")?,
                    opt_str(o.device, "device")?,
                    req_str(o.spec_json, "spec_json")?,
                    req_str(o.dataset, "dataset")?,
                ))
            })()
        };
        let (socket, job, device, spec_json, dataset) = match strings {
            Ok(v) => v,
            Err(r) => return r,
        };
        let spec: PipelineSpec = match serde_json::from_str(spec_json) {
            Ok(s) => s,
            Err(e) => return fail(StokerResult::ErrInvalidArgument, format!("spec_json: {e}")),
        };
        let opts = AttachOptions {
            job: job.to_owned(),
            rank: o.rank,
            world_size: o.world_size,
            device: device.unwrap_or("cpu").to_owned(),
            spec,
            dataset: dataset.to_owned(),
            seed: o.seed,
            start: StartPosition {
                epoch: o.start_epoch,
                step: o.start_step,
            },
            connect_timeout: crate::client::default_connect_timeout(),
        };
        let attached = match socket {
            Some(path) => Client::attach(Path::new(path), opts),
            None => Client::attach_default(opts),
        };
        match attached {
            Ok(client) => {
                let handle = Box::new(StokerClient { client });
                // SAFETY: `out` is valid for a write per the contract.
                unsafe { out.write(Box::into_raw(handle)) };
                StokerResult::Ok
            }
            Err(e) => client_error(e),
        }
    })
}

/// Detaches and frees the client. Batches still held stay readable until freed.
///
/// # Safety
/// `client` is NULL or a handle from `stoker_attach` not yet detached.
#[no_mangle]
pub unsafe extern "C" fn stoker_detach(client: *mut StokerClient) {
    if !client.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: per the contract the handle came from Box::into_raw and is freed once.
            drop(unsafe { Box::from_raw(client) })
        }));
    }
}

/// What the daemon said about the rank's ring and data. Mirrors `stoker_client_info`.
#[repr(C)]
pub struct StokerClientInfo {
    pub struct_size: u32,
    pub slots: u32,
    pub steps_per_epoch: u64,
    pub dataset_len: u64,
    pub classes: u64,
    pub slot_bytes: u64,
    pub ring_bytes: u64,
}

/// Fills `info` (up to `info->struct_size` bytes).
///
/// # Safety
/// `client` is a live handle; `info` points to a struct whose `struct_size` is set.
#[no_mangle]
pub unsafe extern "C" fn stoker_client_get_info(
    client: *const StokerClient,
    info: *mut StokerClientInfo,
) -> StokerResult {
    guard(|| {
        if client.is_null() || info.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: live handle per the contract.
        let c = unsafe { &(*client).client };
        let a = c.attached();
        let full = StokerClientInfo {
            struct_size: std::mem::size_of::<StokerClientInfo>() as u32,
            slots: a.slots,
            steps_per_epoch: a.steps_per_epoch,
            dataset_len: a.dataset_len,
            classes: a.classes,
            slot_bytes: a.slot_bytes,
            ring_bytes: a.ring_bytes,
        };
        // SAFETY: `info` is valid for at least `struct_size` bytes (the caller's struct).
        unsafe { write_sized(info, &full) };
        StokerResult::Ok
    })
}

/// Copies `min(caller's struct_size, ours)` bytes of `full` into `dst`, keeping the caller's
/// `struct_size` (the first field of every sized struct).
///
/// # Safety
/// `dst` points to a struct starting with a `u32` size, valid for that many bytes.
unsafe fn write_sized<T>(dst: *mut T, full: &T) {
    // SAFETY: every sized struct starts with its u32 size; the caller guarantees `dst` is
    // valid for that many bytes, and we copy no more than ours.
    unsafe {
        let theirs = dst.cast::<u32>().read() as usize;
        let n = theirs.min(std::mem::size_of::<T>());
        if n > 4 {
            std::ptr::copy_nonoverlapping(
                (full as *const T).cast::<u8>().add(4),
                dst.cast::<u8>().add(4),
                n - 4,
            );
        }
    }
}

/// Where to resume: the batch after the last one received.
///
/// # Safety
/// `client` is a live handle; `epoch` and `step` are valid for writes.
#[no_mangle]
pub unsafe extern "C" fn stoker_position(
    client: *const StokerClient,
    epoch: *mut u64,
    step: *mut u64,
) -> StokerResult {
    guard(|| {
        if client.is_null() || epoch.is_null() || step.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: live handle and writable outputs per the contract.
        unsafe {
            let p = (*client).client.position();
            epoch.write(p.epoch);
            step.write(p.step);
        }
        StokerResult::Ok
    })
}

/// Waits for the next batch. `STOKER_OK` with `*out` set, or `STOKER_END` with `*out` NULL.
///
/// # Safety
/// `client` is a live handle used by one thread at a time; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn stoker_next(
    client: *mut StokerClient,
    out: *mut *mut StokerBatch,
) -> StokerResult {
    guard(|| {
        if client.is_null() || out.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: `out` is valid for a write.
        unsafe { out.write(std::ptr::null_mut()) };
        // SAFETY: live handle, one thread at a time, per the contract.
        let c = unsafe { &mut (*client).client };
        match c.next_batch() {
            Ok(Some(batch)) => {
                let handle = Box::new(StokerBatch {
                    batch: Arc::new(batch),
                    spec: Arc::new(c.spec().clone()),
                });
                // SAFETY: as above.
                unsafe { out.write(Box::into_raw(handle)) };
                StokerResult::Ok
            }
            Ok(None) => StokerResult::End,
            Err(e) => client_error(e),
        }
    })
}

/// dtype codes of `stoker_batch_info.dtype`.
const DTYPE_U8: u32 = 0;
const DTYPE_F16: u32 = 1;
const DTYPE_BF16: u32 = 2;
const DTYPE_F32: u32 = 3;

/// A batch's metadata and raw pointers into the ring. Mirrors `stoker_batch_info`.
#[repr(C)]
pub struct StokerBatchInfo {
    pub struct_size: u32,
    pub n: u32,
    pub epoch: u64,
    pub step: u64,
    pub images: *const c_void,
    pub image_bytes: u64,
    pub labels: *const i64,
    pub indices: *const u64,
    pub status: *const u8,
    pub height: u32,
    pub width: u32,
    pub channels: u32,
    /// 0 u8, 1 f16, 2 bf16, 3 f32.
    pub dtype: u32,
    /// 0 NCHW, 1 NHWC.
    pub layout: u32,
}

/// Fills `info` (up to `info->struct_size` bytes). Pointers stay valid while the batch (or a
/// tensor made from it) lives.
///
/// # Safety
/// `batch` is a live handle; `info` points to a struct whose `struct_size` is set.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_get_info(
    batch: *const StokerBatch,
    info: *mut StokerBatchInfo,
) -> StokerResult {
    guard(|| {
        if batch.is_null() || info.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: live handle per the contract.
        let b = unsafe { &*batch };
        let (h, w) = b.spec.crop.output_size();
        let full = StokerBatchInfo {
            struct_size: std::mem::size_of::<StokerBatchInfo>() as u32,
            n: b.batch.n() as u32,
            epoch: b.batch.epoch(),
            step: b.batch.step(),
            images: b.batch.images().as_ptr().cast(),
            image_bytes: b.spec.image_bytes() as u64,
            labels: b.batch.labels().as_ptr(),
            indices: b.batch.indices().as_ptr(),
            status: b.batch.status().as_ptr(),
            height: h,
            width: w,
            channels: 3,
            dtype: match b.spec.dtype {
                DType::U8 => DTYPE_U8,
                DType::F16 => DTYPE_F16,
                DType::Bf16 => DTYPE_BF16,
                DType::F32 => DTYPE_F32,
            },
            layout: match b.spec.layout {
                Layout::Nchw => 0,
                Layout::Nhwc => 1,
            },
        };
        // SAFETY: `info` is valid for its `struct_size` bytes.
        unsafe { write_sized(info, &full) };
        StokerResult::Ok
    })
}

/// Frees the batch handle. The slot is released once every tensor made from it is freed too.
///
/// # Safety
/// `batch` is NULL or a live handle from `stoker_next`, freed once.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_free(batch: *mut StokerBatch) {
    if !batch.is_null() {
        let _ = catch_unwind(AssertUnwindSafe(|| {
            // SAFETY: per the contract the handle came from Box::into_raw and is freed once.
            drop(unsafe { Box::from_raw(batch) })
        }));
    }
}

// ---- DLPack 1.0 ----------------------------------------------------------------------------

/// `DLDevice`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLDevice {
    pub device_type: i32,
    pub device_id: i32,
}

/// `DLDataType`.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    pub code: u8,
    pub bits: u8,
    pub lanes: u16,
}

/// `DLTensor`.
#[repr(C)]
pub struct DLTensor {
    pub data: *mut c_void,
    pub device: DLDevice,
    pub ndim: i32,
    pub dtype: DLDataType,
    pub shape: *mut i64,
    pub strides: *mut i64,
    pub byte_offset: u64,
}

/// `DLPackVersion`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLPackVersion {
    pub major: u32,
    pub minor: u32,
}

/// `DLManagedTensorVersioned`.
#[repr(C)]
pub struct DLManagedTensorVersioned {
    pub version: DLPackVersion,
    pub manager_ctx: *mut c_void,
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    pub flags: u64,
    pub dl_tensor: DLTensor,
}

const KDL_CPU: i32 = 1;
const KDL_INT: u8 = 0;
const KDL_UINT: u8 = 1;
const KDL_FLOAT: u8 = 2;
const KDL_BFLOAT: u8 = 4;

/// Which tensor of a batch `stoker_batch_dlpack` makes.
pub const STOKER_TENSOR_IMAGES: u32 = 0;
pub const STOKER_TENSOR_LABELS: u32 = 1;
pub const STOKER_TENSOR_INDICES: u32 = 2;
pub const STOKER_TENSOR_STATUS: u32 = 3;

/// What a DLPack tensor owns: its shape and strides, and a reference on the batch.
/// `repr(C)` with the tensor first, so a pointer to the tensor is a pointer to the owner.
#[repr(C)]
struct TensorOwner {
    tensor: DLManagedTensorVersioned,
    shape: [i64; 4],
    strides: [i64; 4],
    _batch: Arc<Batch>,
}

unsafe extern "C" fn delete_tensor(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        // SAFETY: `t` is the first field of a boxed TensorOwner (repr(C)), created by
        // `stoker_batch_dlpack` and deleted once, by its consumer, through this deleter.
        drop(unsafe { Box::from_raw(t.cast::<TensorOwner>()) })
    }));
}

/// Makes a DLPack tensor viewing one part of the batch, without copying. `which` is
/// `STOKER_TENSOR_IMAGES` (`[n,3,H,W]` or `[n,H,W,3]`, the spec's dtype), `_LABELS` (`[n]`
/// int64), `_INDICES` (`[n]` uint64) or `_STATUS` (`[n]` uint8). The consumer calls the
/// tensor's deleter; the slot stays leased until then.
///
/// # Safety
/// `batch` is a live handle; `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn stoker_batch_dlpack(
    batch: *const StokerBatch,
    which: u32,
    out: *mut *mut DLManagedTensorVersioned,
) -> StokerResult {
    guard(|| {
        if batch.is_null() || out.is_null() {
            return fail(StokerResult::ErrInvalidArgument, "NULL argument");
        }
        // SAFETY: live handle per the contract.
        let b = unsafe { &*batch };
        let n = b.batch.n() as i64;
        let (data, ndim, dtype, shape): (*const u8, i32, DLDataType, [i64; 4]) = match which {
            STOKER_TENSOR_IMAGES => {
                let (h, w) = b.spec.crop.output_size();
                let (h, w) = (i64::from(h), i64::from(w));
                let dtype = match b.spec.dtype {
                    DType::U8 => DLDataType {
                        code: KDL_UINT,
                        bits: 8,
                        lanes: 1,
                    },
                    DType::F16 => DLDataType {
                        code: KDL_FLOAT,
                        bits: 16,
                        lanes: 1,
                    },
                    DType::Bf16 => DLDataType {
                        code: KDL_BFLOAT,
                        bits: 16,
                        lanes: 1,
                    },
                    DType::F32 => DLDataType {
                        code: KDL_FLOAT,
                        bits: 32,
                        lanes: 1,
                    },
                };
                let shape = match b.spec.layout {
                    Layout::Nchw => [n, 3, h, w],
                    Layout::Nhwc => [n, h, w, 3],
                };
                (b.batch.images().as_ptr(), 4, dtype, shape)
            }
            STOKER_TENSOR_LABELS => (
                b.batch.labels().as_ptr().cast(),
                1,
                DLDataType {
                    code: KDL_INT,
                    bits: 64,
                    lanes: 1,
                },
                [n, 0, 0, 0],
            ),
            STOKER_TENSOR_INDICES => (
                b.batch.indices().as_ptr().cast(),
                1,
                DLDataType {
                    code: KDL_UINT,
                    bits: 64,
                    lanes: 1,
                },
                [n, 0, 0, 0],
            ),
            STOKER_TENSOR_STATUS => (
                b.batch.status().as_ptr(),
                1,
                DLDataType {
                    code: KDL_UINT,
                    bits: 8,
                    lanes: 1,
                },
                [n, 0, 0, 0],
            ),
            other => {
                return fail(
                    StokerResult::ErrInvalidArgument,
                    format!("unknown tensor kind {other}"),
                )
            }
        };
        // Compact row-major strides, in elements.
        let mut strides = [0i64; 4];
        let mut acc = 1i64;
        for d in (0..ndim as usize).rev() {
            strides[d] = acc;
            acc *= shape[d];
        }
        let mut owner = Box::new(TensorOwner {
            tensor: DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: std::ptr::null_mut(),
                deleter: Some(delete_tensor),
                flags: 0,
                dl_tensor: DLTensor {
                    data: data as *mut c_void,
                    device: DLDevice {
                        device_type: KDL_CPU,
                        device_id: 0,
                    },
                    ndim,
                    dtype,
                    shape: std::ptr::null_mut(),
                    strides: std::ptr::null_mut(),
                    byte_offset: 0,
                },
            },
            shape,
            strides,
            _batch: Arc::clone(&b.batch),
        });
        // The box's heap address is stable, so these pointers stay valid until the deleter.
        owner.tensor.dl_tensor.shape = owner.shape.as_mut_ptr();
        owner.tensor.dl_tensor.strides = owner.strides.as_mut_ptr();
        let raw = Box::into_raw(owner);
        // SAFETY: `raw` came from Box::into_raw just above and is not shared yet; `out` is
        // valid for a write per the contract; the tensor is the owner's first field.
        unsafe {
            (*raw).tensor.manager_ctx = raw.cast();
            out.write(raw.cast::<DLManagedTensorVersioned>());
        }
        StokerResult::Ok
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn header_declares_every_export() {
        let header = include_str!("stoker.h");
        let src = include_str!("capi.rs");
        let exported: Vec<&str> = src
            .lines()
            .filter_map(|l| {
                let l = l.trim();
                let rest = l
                    .strip_prefix("pub unsafe extern \"C\" fn ")
                    .or_else(|| l.strip_prefix("pub extern \"C\" fn "))?;
                rest.split('(').next()
            })
            .collect();
        assert!(exported.len() >= 9, "{exported:?}");
        for name in &exported {
            assert!(
                header.contains(&format!(" {name}(")) || header.contains(&format!("*{name}(")),
                "stoker.h does not declare {name}"
            );
        }
        for line in header.lines() {
            if let Some(i) = line.find("stoker_") {
                let name: String = line[i..]
                    .chars()
                    .take_while(|c| c.is_alphanumeric() || *c == '_')
                    .collect();
                if line[i + name.len()..].starts_with('(') {
                    assert!(exported.contains(&name.as_str()), "{name} is not exported");
                }
            }
        }
    }

    /// The header compiles on its own as strict C11 (skipped, loudly, without a C compiler).
    #[test]
    fn header_compiles_as_c11() {
        let dir = tempfile::tempdir().unwrap();
        let c = dir.path().join("only_header.c");
        std::fs::write(
            &c,
            "#include \"stoker.h\"\n\
             _Static_assert(sizeof(DLTensor) == 48, \"DLTensor\");\n\
             _Static_assert(sizeof(DLManagedTensorVersioned) == 80, \"DLManagedTensorVersioned\");\n\
             _Static_assert(sizeof(stoker_attach_options) == 80, \"stoker_attach_options\");\n\
             _Static_assert(sizeof(stoker_batch_info) == 88, \"stoker_batch_info\");\n\
             _Static_assert(sizeof(stoker_client_info) == 48, \"stoker_client_info\");\n\
             int main(void) { stoker_client *c = 0; stoker_detach(c); return STOKER_OK; }\n",
        )
        .unwrap();
        let out = match std::process::Command::new("cc")
            .args([
                "-std=c11",
                "-Wall",
                "-Wextra",
                "-Werror",
                "-pedantic",
                "-fsyntax-only",
            ])
            .arg("-I")
            .arg(concat!(env!("CARGO_MANIFEST_DIR"), "/src"))
            .arg(&c)
            .output()
        {
            Ok(o) => o,
            Err(e) => {
                eprintln!("SKIPPED header_compiles_as_c11: no C compiler (cc): {e}");
                return;
            }
        };
        assert!(
            out.status.success(),
            "stoker.h does not compile as C11:\n{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }

    #[test]
    fn layouts_match_the_header() {
        assert_eq!(std::mem::size_of::<StokerAttachOptions>(), 80);
        assert_eq!(std::mem::size_of::<StokerBatchInfo>(), 88);
        assert_eq!(std::mem::size_of::<StokerClientInfo>(), 48);
        assert_eq!(std::mem::size_of::<DLDataType>(), 4);
        assert_eq!(std::mem::size_of::<DLTensor>(), 48);
        assert_eq!(std::mem::size_of::<DLManagedTensorVersioned>(), 80);
        assert_eq!(std::mem::offset_of!(StokerAttachOptions, socket), 16);
    }

    #[test]
    fn failures_set_the_thread_error() {
        let mut out = std::ptr::null_mut();
        // SAFETY: NULL options are refused without being read.
        let r = unsafe { stoker_attach(std::ptr::null(), &mut out) };
        assert_eq!(r, StokerResult::ErrInvalidArgument);
        // SAFETY: the library returns a valid NUL-terminated string.
        let msg = unsafe { CStr::from_ptr(stoker_last_error()) };
        assert_eq!(msg.to_str().unwrap(), "NULL argument");
    }

    #[test]
    fn attach_without_a_daemon_says_so() {
        let dir = tempfile::tempdir().unwrap();
        let socket = CString::new(dir.path().join("s.sock").to_str().unwrap()).unwrap();
        let job = CString::new("j").unwrap();
        let spec =
            CString::new(serde_json::to_string(&PipelineSpec::train(2, 8)).unwrap()).unwrap();
        let data = CString::new("/data").unwrap();
        let opts = StokerAttachOptions {
            struct_size: std::mem::size_of::<StokerAttachOptions>() as u32,
            rank: 0,
            world_size: 1,
            socket: socket.as_ptr(),
            job: job.as_ptr(),
            device: std::ptr::null(),
            spec_json: spec.as_ptr(),
            dataset: data.as_ptr(),
            seed: 0,
            start_epoch: 0,
            start_step: 0,
        };
        let mut out = std::ptr::null_mut();
        // SAFETY: valid options and output.
        let r = unsafe { stoker_attach(&opts, &mut out) };
        assert_eq!(r, StokerResult::ErrNoDaemon);
        assert!(out.is_null());
        // SAFETY: as above.
        let msg = unsafe { CStr::from_ptr(stoker_last_error()) }
            .to_str()
            .unwrap();
        assert!(msg.starts_with("no stoker daemon at "), "{msg}");
    }

    /// The whole C ABI against the fake daemon: attach, next, info, a DLPack tensor that
    /// outlives its batch handle, release only after the tensor's deleter, end of data.
    #[test]
    fn batches_and_tensors_release_after_their_last_owner() {
        use crate::protocol::{Message, Release};
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("stoker.sock");
        let spec = PipelineSpec {
            dtype: DType::U8,
            ..PipelineSpec::train(4, 8)
        };
        let daemon = crate::client::tests::fake_daemon(&path, spec.clone());
        let socket = CString::new(path.to_str().unwrap()).unwrap();
        let job = CString::new("job-a").unwrap();
        let spec_json = CString::new(serde_json::to_string(&spec).unwrap()).unwrap();
        let data = CString::new("/data").unwrap();
        let opts = StokerAttachOptions {
            struct_size: std::mem::size_of::<StokerAttachOptions>() as u32,
            rank: 1,
            world_size: 2,
            socket: socket.as_ptr(),
            job: job.as_ptr(),
            device: std::ptr::null(),
            spec_json: spec_json.as_ptr(),
            dataset: data.as_ptr(),
            seed: 0,
            start_epoch: 3,
            start_step: 4,
        };
        let mut client = std::ptr::null_mut();
        // SAFETY: valid options and outputs throughout; handles are used as documented.
        unsafe {
            assert_eq!(stoker_attach(&opts, &mut client), StokerResult::Ok);
            let mut ci: StokerClientInfo = std::mem::zeroed();
            ci.struct_size = std::mem::size_of::<StokerClientInfo>() as u32;
            assert_eq!(stoker_client_get_info(client, &mut ci), StokerResult::Ok);
            assert_eq!((ci.slots, ci.steps_per_epoch, ci.classes), (2, 5, 3));

            let mut batch = std::ptr::null_mut();
            assert_eq!(stoker_next(client, &mut batch), StokerResult::Ok);
            let mut info: StokerBatchInfo = std::mem::zeroed();
            info.struct_size = std::mem::size_of::<StokerBatchInfo>() as u32;
            assert_eq!(stoker_batch_get_info(batch, &mut info), StokerResult::Ok);
            assert_eq!((info.n, info.epoch, info.step), (3, 3, 4));
            assert_eq!((info.height, info.width, info.dtype), (8, 8, DTYPE_U8));
            assert_eq!(std::slice::from_raw_parts(info.labels, 3), &[10, 11, 12]);

            let mut images = std::ptr::null_mut();
            assert_eq!(
                stoker_batch_dlpack(batch, STOKER_TENSOR_IMAGES, &mut images),
                StokerResult::Ok
            );
            let t = &(*images).dl_tensor;
            assert_eq!(t.ndim, 4);
            assert_eq!(std::slice::from_raw_parts(t.shape, 4), &[3, 3, 8, 8]);
            assert_eq!(std::slice::from_raw_parts(t.strides, 4), &[192, 64, 8, 1]);
            assert_eq!(
                t.dtype,
                DLDataType {
                    code: KDL_UINT,
                    bits: 8,
                    lanes: 1
                }
            );
            assert_eq!(t.data as *const c_void, info.images, "a view, not a copy");
            assert_eq!(*(t.data as *const u8), 9);
            let mut labels = std::ptr::null_mut();
            assert_eq!(
                stoker_batch_dlpack(batch, STOKER_TENSOR_LABELS, &mut labels),
                StokerResult::Ok
            );
            assert_eq!(*(*labels).dl_tensor.shape, 3);

            // The batch handle goes first; the tensors still hold the lease.
            stoker_batch_free(batch);
            ((*labels).deleter.unwrap())(labels);
            let mut next = std::ptr::null_mut();
            assert_eq!(stoker_next(client, &mut next), StokerResult::End);
            assert!(next.is_null());
            let (mut e, mut s) = (0, 0);
            assert_eq!(stoker_position(client, &mut e, &mut s), StokerResult::Ok);
            assert_eq!((e, s), (4, 0));
            // Still readable: the images tensor holds the slot.
            assert_eq!(*((*images).dl_tensor.data as *const u8), 9);
            ((*images).deleter.unwrap())(images);
            stoker_detach(client);
        }
        let got = daemon.join().unwrap();
        assert_eq!(
            got,
            vec![
                Message::Release(Release {
                    slot: 1,
                    generation: 7
                }),
                Message::Detach
            ]
        );
    }
}
