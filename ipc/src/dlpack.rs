//! DLPack 1.0 tensors: the ABI structs, and export of a region of memory kept alive by an
//! owner value until the consumer calls the tensor's deleter.
//!
//! The structs mirror `dlpack.h` (v1.0) field for field; `stoker.h` declares them under the
//! same names (guarded by `DLPACK_MAJOR_VERSION`, so including the real `dlpack.h` first works).
//!
//! # Design
//! - [`export`] allocates one block holding the `DLManagedTensorVersioned`, its shape and
//!   strides, and the owner. `manager_ctx` points at the block; the deleter frees it, dropping
//!   the owner (for a batch: its share of the slot lease).
//! - Strides are always given (compact, row-major, in elements): some consumers reject NULL.
//! - [`to_legacy`] wraps a versioned tensor as a pre-1.0 `DLManagedTensor` for consumers that
//!   ask for the `"dltensor"` capsule (NumPy 1.x); deleting the wrapper deletes the inner one.
//!
//! # Limitations
//! - Up to [`MAX_NDIM`] dimensions.

use std::ffi::c_void;
use std::panic::{catch_unwind, AssertUnwindSafe};

/// The DLPack major version of the tensors made here.
pub(crate) const DLPACK_MAJOR_VERSION: u32 = 1;
/// The DLPack minor version of the tensors made here.
pub(crate) const DLPACK_MINOR_VERSION: u32 = 0;
/// `flags` bit: the consumer must not write through the tensor.
pub const DLPACK_FLAG_BITMASK_READ_ONLY: u64 = 1 << 0;
/// `flags` bit: the producer copied the data for this export.
pub const DLPACK_FLAG_BITMASK_IS_COPIED: u64 = 1 << 1;

/// `DLDeviceType::kDLCPU`.
pub const KDL_CPU: i32 = 1;
/// `DLDeviceType::kDLCUDA`.
pub const KDL_CUDA: i32 = 2;

/// `DLDataTypeCode::kDLInt`: signed integer.
pub const KDL_INT: u8 = 0;
/// `DLDataTypeCode::kDLUInt`: unsigned integer.
pub const KDL_UINT: u8 = 1;
/// `DLDataTypeCode::kDLFloat`: IEEE float.
pub const KDL_FLOAT: u8 = 2;
/// `DLDataTypeCode::kDLBfloat`: bfloat16.
pub const KDL_BFLOAT: u8 = 4;

/// Most dimensions [`export`] handles.
pub(crate) const MAX_NDIM: usize = 4;

/// `DLPackVersion`: the DLPack version a managed tensor follows.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLPackVersion {
    /// Major version; a consumer refuses another major.
    pub major: u32,
    /// Minor version.
    pub minor: u32,
}

/// `DLDevice`: where a tensor's memory is.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDevice {
    /// A `DLDeviceType` (kept as `i32`: a C enum of unknown value must not become a Rust enum).
    pub device_type: i32,
    /// The device's ordinal in the consuming process (0 for host memory).
    pub device_id: i32,
}

impl DLDevice {
    /// Host memory.
    pub(crate) const CPU: DLDevice = DLDevice {
        device_type: KDL_CPU,
        device_id: 0,
    };

    /// Memory of CUDA device `ordinal`, numbered as the consuming process sees devices (its
    /// own `CUDA_VISIBLE_DEVICES`): what frameworks match against their `cuda:N`.
    pub(crate) const fn cuda(ordinal: i32) -> DLDevice {
        DLDevice {
            device_type: KDL_CUDA,
            device_id: ordinal,
        }
    }
}

/// `DLDataType`: a tensor's element type.
#[repr(C)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DLDataType {
    /// A `DLDataTypeCode` (`KDL_INT`, `KDL_UINT`, `KDL_FLOAT`, `KDL_BFLOAT`).
    pub code: u8,
    /// Bits of one lane.
    pub bits: u8,
    /// Lanes per element (1 here).
    pub lanes: u16,
}

impl DLDataType {
    /// One lane of `bits` bits of type `code`.
    pub(crate) const fn new(code: u8, bits: u8) -> DLDataType {
        DLDataType {
            code,
            bits,
            lanes: 1,
        }
    }
}

/// `DLTensor`: where a tensor's elements are and how they are laid out.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct DLTensor {
    /// The first element's address (host, or device on `device`).
    pub data: *mut c_void,
    /// Where `data` is.
    pub device: DLDevice,
    /// Dimensions, at most 4 here.
    pub ndim: i32,
    /// The element type.
    pub dtype: DLDataType,
    /// `ndim` sizes, outermost first.
    pub shape: *mut i64,
    /// `ndim` strides in elements (compact, row-major; never NULL here).
    pub strides: *mut i64,
    /// Bytes from `data` to the first element (0 here).
    pub byte_offset: u64,
}

/// DLPack 1.0's managed tensor (the `"dltensor_versioned"` capsule's pointer).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensorVersioned {
    /// The DLPack version (1.0).
    pub version: DLPackVersion,
    /// The producer's context: the block that owns the tensor and what keeps its memory.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; frees the tensor and drops its owner.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    /// `DLPACK_FLAG_BITMASK_*` bits.
    pub flags: u64,
    /// The tensor.
    pub dl_tensor: DLTensor,
}

/// The pre-1.0 managed tensor (the `"dltensor"` capsule's pointer).
#[repr(C)]
#[derive(Debug)]
pub struct DLManagedTensor {
    /// The tensor.
    pub dl_tensor: DLTensor,
    /// The producer's context: the wrapper block holding the versioned tensor.
    pub manager_ctx: *mut c_void,
    /// Called once by the consumer when done; deletes the versioned tensor inside.
    pub deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

/// What a tensor describes: where, what type, what shape.
#[derive(Debug, Clone, Copy)]
pub(crate) struct TensorDesc<'a> {
    /// The first element's address.
    pub(crate) data: *mut u8,
    /// Where `data` is.
    pub(crate) device: DLDevice,
    /// The element type.
    pub(crate) dtype: DLDataType,
    /// Sizes, outermost first; at most [`MAX_NDIM`].
    pub(crate) shape: &'a [i64],
    /// Sets `DLPACK_FLAG_BITMASK_READ_ONLY`.
    pub(crate) read_only: bool,
}

/// One exported tensor's allocation. `managed` is first so the block's address is the
/// tensor's (`#[repr(C)]`).
#[repr(C)]
struct Exported<O> {
    managed: DLManagedTensorVersioned,
    shape: [i64; MAX_NDIM],
    strides: [i64; MAX_NDIM],
    owner: O,
}

/// Exports `desc` as a DLPack tensor that keeps `owner` alive until its deleter runs.
///
/// # Panics
/// If `desc.shape` has more than [`MAX_NDIM`] dimensions.
pub(crate) fn export<O: Send + 'static>(
    desc: TensorDesc<'_>,
    owner: O,
) -> *mut DLManagedTensorVersioned {
    let ndim = desc.shape.len();
    assert!(ndim <= MAX_NDIM, "{ndim} dimensions (at most {MAX_NDIM})");
    let mut shape = [0i64; MAX_NDIM];
    let mut strides = [0i64; MAX_NDIM];
    shape[..ndim].copy_from_slice(desc.shape);
    let mut stride = 1i64;
    for d in (0..ndim).rev() {
        strides[d] = stride;
        stride *= shape[d].max(1);
    }
    let block = Box::new(Exported {
        managed: DLManagedTensorVersioned {
            version: DLPackVersion {
                major: DLPACK_MAJOR_VERSION,
                minor: DLPACK_MINOR_VERSION,
            },
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_exported::<O>),
            flags: if desc.read_only {
                DLPACK_FLAG_BITMASK_READ_ONLY
            } else {
                0
            },
            dl_tensor: DLTensor {
                data: desc.data.cast(),
                device: desc.device,
                // At most MAX_NDIM (asserted above).
                #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
                ndim: ndim as i32,
                dtype: desc.dtype,
                shape: std::ptr::null_mut(),
                strides: std::ptr::null_mut(),
                byte_offset: 0,
            },
        },
        shape,
        strides,
        owner,
    });
    let raw = Box::into_raw(block);
    // SAFETY: `raw` is a live, exclusively owned allocation from `Box::into_raw`; the shape and
    // strides arrays live in it, so the pointers stay valid until the deleter frees the block.
    unsafe {
        (*raw).managed.manager_ctx = raw.cast();
        (*raw).managed.dl_tensor.shape = (*raw).shape.as_mut_ptr();
        (*raw).managed.dl_tensor.strides = (*raw).strides.as_mut_ptr();
    }
    raw.cast()
}

/// The deleter of tensors made by [`export`].
///
/// # Safety
/// `t` must be a tensor returned by `export::<O>` (same `O`) and not yet deleted.
unsafe extern "C" fn delete_exported<O>(t: *mut DLManagedTensorVersioned) {
    if t.is_null() {
        return;
    }
    // SAFETY: the caller passes a tensor from `export::<O>`, whose manager_ctx is the block
    // `Box::into_raw` gave out, deleted at most once; no unwinding leaves this extern fn.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        drop(Box::from_raw((*t).manager_ctx.cast::<Exported<O>>()));
    }));
}

/// A legacy tensor wrapping a versioned one; `managed` first (`#[repr(C)]`).
#[repr(C)]
struct Legacy {
    managed: DLManagedTensor,
    inner: *mut DLManagedTensorVersioned,
}

/// Wraps `inner` as a pre-1.0 `DLManagedTensor`; its deleter deletes `inner`.
///
/// # Safety
/// `inner` must be a live versioned tensor whose ownership passes to the result.
pub(crate) unsafe fn to_legacy(inner: *mut DLManagedTensorVersioned) -> *mut DLManagedTensor {
    // SAFETY: the caller hands over a live tensor; its DLTensor (and the shape/strides it
    // points to) stays valid until `inner` is deleted, which only the wrapper's deleter does.
    let dl_tensor = unsafe { (*inner).dl_tensor };
    let raw = Box::into_raw(Box::new(Legacy {
        managed: DLManagedTensor {
            dl_tensor,
            manager_ctx: std::ptr::null_mut(),
            deleter: Some(delete_legacy),
        },
        inner,
    }));
    // SAFETY: `raw` is a fresh allocation we own exclusively.
    unsafe { (*raw).managed.manager_ctx = raw.cast() };
    raw.cast()
}

/// # Safety
/// `t` must come from [`to_legacy`] and not be deleted yet.
unsafe extern "C" fn delete_legacy(t: *mut DLManagedTensor) {
    if t.is_null() {
        return;
    }
    // SAFETY: manager_ctx is the `Legacy` block from `to_legacy`, freed only here, once; the
    // inner tensor is live and owned by it. No unwinding leaves this extern fn.
    let _ = catch_unwind(AssertUnwindSafe(|| unsafe {
        let block = Box::from_raw((*t).manager_ctx.cast::<Legacy>());
        if let Some(deleter) = (*block.inner).deleter {
            deleter(block.inner);
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};
    use std::sync::Arc;

    #[test]
    fn layout_matches_dlpack_h_on_64_bit() {
        assert_eq!(size_of::<DLDevice>(), 8);
        assert_eq!(size_of::<DLDataType>(), 4);
        assert_eq!(size_of::<DLTensor>(), 48);
        assert_eq!(offset_of!(DLTensor, ndim), 16);
        assert_eq!(offset_of!(DLTensor, dtype), 20);
        assert_eq!(offset_of!(DLTensor, shape), 24);
        assert_eq!(offset_of!(DLTensor, byte_offset), 40);
        assert_eq!(size_of::<DLManagedTensorVersioned>(), 80);
        assert_eq!(offset_of!(DLManagedTensorVersioned, manager_ctx), 8);
        assert_eq!(offset_of!(DLManagedTensorVersioned, deleter), 16);
        assert_eq!(offset_of!(DLManagedTensorVersioned, flags), 24);
        assert_eq!(offset_of!(DLManagedTensorVersioned, dl_tensor), 32);
        assert_eq!(size_of::<DLManagedTensor>(), 64);
    }

    #[test]
    fn export_describes_the_memory_and_the_deleter_drops_the_owner() {
        let mut memory = vec![0f32; 2 * 3 * 4 * 5];
        let owner = Arc::new(());
        let t = export(
            TensorDesc {
                data: memory.as_mut_ptr().cast(),
                device: DLDevice {
                    device_type: KDL_CPU,
                    device_id: 0,
                },
                dtype: DLDataType::new(KDL_FLOAT, 32),
                shape: &[2, 3, 4, 5],
                read_only: false,
            },
            Arc::clone(&owner),
        );
        assert_eq!(Arc::strong_count(&owner), 2);
        // SAFETY: `t` is a live tensor from `export`; it is read, then deleted once.
        unsafe {
            let m = &*t;
            assert_eq!(m.version, DLPackVersion { major: 1, minor: 0 });
            assert_eq!(m.flags, 0);
            assert_eq!(m.dl_tensor.ndim, 4);
            assert_eq!(m.dl_tensor.data, memory.as_mut_ptr().cast());
            let shape = std::slice::from_raw_parts(m.dl_tensor.shape, 4);
            let strides = std::slice::from_raw_parts(m.dl_tensor.strides, 4);
            assert_eq!(shape, &[2, 3, 4, 5]);
            assert_eq!(strides, &[60, 20, 5, 1]);
            let legacy = to_legacy(t);
            assert_eq!((*legacy).dl_tensor.data, memory.as_mut_ptr().cast());
            assert_eq!(Arc::strong_count(&owner), 2);
            ((*legacy).deleter.unwrap())(legacy);
        }
        assert_eq!(Arc::strong_count(&owner), 1);
    }
}
