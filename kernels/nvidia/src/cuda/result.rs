//! One function per driver call, each returning `Result<_, CudaError>` with the status named.
//! These are as unsafe as the calls they wrap where a pointer or handle must be valid; the safe
//! types in the parent module uphold that.

use std::ffi::{c_int, c_void, CStr};
use std::ptr;

use super::sys::{self, CUresult, Driver};
use super::CudaError;

crate::status_type! {
    /// A libcuda status code, with a name for the ones stoker can meet.
    pub struct CuStatus(CUresult), unnamed "CUDA_ERROR_(unnamed)" {
        SUCCESS = 0 => "CUDA_SUCCESS",
        INVALID_VALUE = 1 => "CUDA_ERROR_INVALID_VALUE",
        OUT_OF_MEMORY = 2 => "CUDA_ERROR_OUT_OF_MEMORY",
        NOT_INITIALIZED = 3 => "CUDA_ERROR_NOT_INITIALIZED",
        DEINITIALIZED = 4 => "CUDA_ERROR_DEINITIALIZED",
        STUB_LIBRARY = 34 => "CUDA_ERROR_STUB_LIBRARY",
        DEVICE_UNAVAILABLE = 46 => "CUDA_ERROR_DEVICE_UNAVAILABLE",
        NO_DEVICE = 100 => "CUDA_ERROR_NO_DEVICE",
        INVALID_DEVICE = 101 => "CUDA_ERROR_INVALID_DEVICE",
        INVALID_IMAGE = 200 => "CUDA_ERROR_INVALID_IMAGE",
        INVALID_CONTEXT = 201 => "CUDA_ERROR_INVALID_CONTEXT",
        NO_BINARY_FOR_GPU = 209 => "CUDA_ERROR_NO_BINARY_FOR_GPU",
        ECC_UNCORRECTABLE = 214 => "CUDA_ERROR_ECC_UNCORRECTABLE",
        INVALID_PTX = 218 => "CUDA_ERROR_INVALID_PTX",
        UNSUPPORTED_PTX_VERSION = 222 => "CUDA_ERROR_UNSUPPORTED_PTX_VERSION",
        INVALID_HANDLE = 400 => "CUDA_ERROR_INVALID_HANDLE",
        NOT_FOUND = 500 => "CUDA_ERROR_NOT_FOUND",
        NOT_READY = 600 => "CUDA_ERROR_NOT_READY",
        ILLEGAL_ADDRESS = 700 => "CUDA_ERROR_ILLEGAL_ADDRESS",
        LAUNCH_OUT_OF_RESOURCES = 701 => "CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES",
        LAUNCH_TIMEOUT = 702 => "CUDA_ERROR_LAUNCH_TIMEOUT",
        LAUNCH_FAILED = 719 => "CUDA_ERROR_LAUNCH_FAILED",
        NOT_PERMITTED = 800 => "CUDA_ERROR_NOT_PERMITTED",
        NOT_SUPPORTED = 801 => "CUDA_ERROR_NOT_SUPPORTED",
        SYSTEM_DRIVER_MISMATCH = 803 => "CUDA_ERROR_SYSTEM_DRIVER_MISMATCH",
        COMPAT_NOT_SUPPORTED_ON_DEVICE = 804 => "CUDA_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE",
        UNKNOWN = 999 => "CUDA_ERROR_UNKNOWN",
    }
}

/// Turns a status into a result, naming the call.
pub(crate) fn check(call: &'static str, status: CUresult) -> Result<(), CudaError> {
    CuStatus(status)
        .result()
        .map_err(|status| CudaError::Driver { call, status })
}

/// libcuda's own name for a status, where it knows one the table above does not.
pub(crate) fn error_name(d: &Driver, status: CuStatus) -> Option<String> {
    let mut p: *const std::ffi::c_char = ptr::null();
    // SAFETY: cuGetErrorName writes a pointer to a static string or fails.
    let rc = unsafe { (d.get_error_name)(status.0, &mut p) };
    if rc != 0 || p.is_null() {
        return None;
    }
    // SAFETY: on success `p` points at a NUL-terminated static string.
    Some(unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned())
}

pub(crate) fn init(d: &Driver) -> Result<(), CudaError> {
    // SAFETY: cuInit takes flags only.
    check("cuInit", unsafe { (d.init)(0) })
}

pub(crate) fn driver_version(d: &Driver) -> Result<i32, CudaError> {
    let mut v: c_int = 0;
    // SAFETY: writes one int.
    check("cuDriverGetVersion", unsafe {
        (d.driver_get_version)(&mut v)
    })?;
    Ok(v)
}

pub(crate) fn device_count(d: &Driver) -> Result<i32, CudaError> {
    let mut n: c_int = 0;
    // SAFETY: writes one int.
    check("cuDeviceGetCount", unsafe { (d.device_get_count)(&mut n) })?;
    Ok(n)
}

pub(crate) fn device_get(d: &Driver, ordinal: i32) -> Result<sys::CUdevice, CudaError> {
    let mut dev: sys::CUdevice = 0;
    // SAFETY: writes one CUdevice; a bad ordinal is an error status.
    check("cuDeviceGet", unsafe { (d.device_get)(&mut dev, ordinal) })?;
    Ok(dev)
}

pub(crate) fn device_uuid(d: &Driver, dev: sys::CUdevice) -> Result<[u8; 16], CudaError> {
    let mut u = sys::CUuuid::default();
    // SAFETY: writes 16 bytes.
    check("cuDeviceGetUuid_v2", unsafe {
        (d.device_get_uuid)(&mut u, dev)
    })?;
    Ok(u.bytes)
}

pub(crate) fn device_name(d: &Driver, dev: sys::CUdevice) -> Result<String, CudaError> {
    const LEN: c_int = 256;
    let mut buf = [0u8; LEN as usize];
    // SAFETY: writes at most `len` bytes including the NUL.
    check("cuDeviceGetName", unsafe {
        (d.device_get_name)(buf.as_mut_ptr().cast(), LEN, dev)
    })?;
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    Ok(String::from_utf8_lossy(&buf[..end]).into_owned())
}

pub(crate) fn device_total_mem(d: &Driver, dev: sys::CUdevice) -> Result<usize, CudaError> {
    let mut n = 0usize;
    // SAFETY: writes one size_t.
    check("cuDeviceTotalMem_v2", unsafe {
        (d.device_total_mem)(&mut n, dev)
    })?;
    Ok(n)
}

pub(crate) fn device_attribute(
    d: &Driver,
    dev: sys::CUdevice,
    attr: c_int,
) -> Result<i32, CudaError> {
    let mut v: c_int = 0;
    // SAFETY: writes one int; an unknown attribute is an error status.
    check("cuDeviceGetAttribute", unsafe {
        (d.device_get_attribute)(&mut v, attr, dev)
    })?;
    Ok(v)
}

pub(crate) fn primary_ctx_retain(
    d: &Driver,
    dev: sys::CUdevice,
) -> Result<sys::CUcontext, CudaError> {
    let mut c: sys::CUcontext = ptr::null_mut();
    // SAFETY: writes one context handle.
    check("cuDevicePrimaryCtxRetain", unsafe {
        (d.primary_ctx_retain)(&mut c, dev)
    })?;
    Ok(c)
}

/// `cuDevicePrimaryCtxSetFlags_v2`: the primary context's scheduling flags.
pub(crate) fn primary_ctx_set_flags(
    d: &Driver,
    dev: sys::CUdevice,
    flags: u32,
) -> Result<(), CudaError> {
    // SAFETY: plain values.
    check("cuDevicePrimaryCtxSetFlags_v2", unsafe {
        (d.primary_ctx_set_flags)(dev, flags)
    })
}

/// `cuDevicePrimaryCtxGetState`: the primary context's flags, and whether it is active.
pub(crate) fn primary_ctx_get_state(
    d: &Driver,
    dev: sys::CUdevice,
) -> Result<(u32, bool), CudaError> {
    let (mut flags, mut active): (u32, c_int) = (0, 0);
    // SAFETY: writes one unsigned and one int.
    check("cuDevicePrimaryCtxGetState", unsafe {
        (d.primary_ctx_get_state)(dev, &mut flags, &mut active)
    })?;
    Ok((flags, active != 0))
}

/// # Safety
/// Must balance one successful [`primary_ctx_retain`] of `dev`.
pub(crate) unsafe fn primary_ctx_release(d: &Driver, dev: sys::CUdevice) -> Result<(), CudaError> {
    // SAFETY: the caller balances a retain.
    check("cuDevicePrimaryCtxRelease_v2", unsafe {
        (d.primary_ctx_release)(dev)
    })
}

/// # Safety
/// `ctx` must be a live context (or null to unbind).
pub(crate) unsafe fn ctx_set_current(d: &Driver, ctx: sys::CUcontext) -> Result<(), CudaError> {
    // SAFETY: the caller promises `ctx` is live.
    check("cuCtxSetCurrent", unsafe { (d.ctx_set_current)(ctx) })
}

/// The calling thread's current context (null when none).
pub fn ctx_get_current(d: &Driver) -> Result<sys::CUcontext, CudaError> {
    let mut c: sys::CUcontext = ptr::null_mut();
    // SAFETY: `c` is a valid out-parameter.
    check("cuCtxGetCurrent", unsafe { (d.ctx_get_current)(&mut c) })?;
    Ok(c)
}

/// A non-blocking stream at the least priority of the current context's device, so that its
/// kernels yield to a training job's at any higher priority. On every GPU NVIDIA documents the
/// least priority is the default ("'0' represents default priority"); asking for it by name
/// keeps that true where a device's range says otherwise.
pub(crate) fn stream_create(d: &Driver) -> Result<sys::CUstream, CudaError> {
    let (least, _) = stream_priority_range(d)?;
    let mut s: sys::CUstream = ptr::null_mut();
    // SAFETY: writes one stream handle in the current context.
    check("cuStreamCreateWithPriority", unsafe {
        (d.stream_create_with_priority)(&mut s, sys::CU_STREAM_NON_BLOCKING, least)
    })?;
    Ok(s)
}

/// The scheduling priority of `s` (lower numbers are higher priorities).
///
/// # Safety
/// `s` must be a live stream of the current context.
pub(crate) unsafe fn stream_priority(d: &Driver, s: sys::CUstream) -> Result<c_int, CudaError> {
    let mut p: c_int = 0;
    // SAFETY: the caller promises `s` is live; writes one int.
    check("cuStreamGetPriority", unsafe {
        (d.stream_get_priority)(s, &mut p)
    })?;
    Ok(p)
}

/// The current context's device's stream priorities: (least, greatest).
pub(crate) fn stream_priority_range(d: &Driver) -> Result<(c_int, c_int), CudaError> {
    let (mut least, mut greatest): (c_int, c_int) = (0, 0);
    // SAFETY: writes two ints.
    check("cuCtxGetStreamPriorityRange", unsafe {
        (d.ctx_get_stream_priority_range)(&mut least, &mut greatest)
    })?;
    Ok((least, greatest))
}

/// # Safety
/// `s` must be a live stream, not used afterwards.
pub(crate) unsafe fn stream_destroy(d: &Driver, s: sys::CUstream) -> Result<(), CudaError> {
    // SAFETY: the caller owns `s`.
    check("cuStreamDestroy_v2", unsafe { (d.stream_destroy)(s) })
}

/// A new event. Every event blocks the thread that waits on it (`CU_EVENT_BLOCKING_SYNC`):
/// without the flag "the CPU thread will busy-wait until the event has been completed by the
/// device" (`cuEventSynchronize`), a core per waiting thread in the daemon and in every
/// training process's release thread.
pub(crate) fn event_create(d: &Driver, timing: bool) -> Result<sys::CUevent, CudaError> {
    let mut e: sys::CUevent = ptr::null_mut();
    let flags = if timing {
        sys::CU_EVENT_BLOCKING_SYNC
    } else {
        sys::CU_EVENT_BLOCKING_SYNC | sys::CU_EVENT_DISABLE_TIMING
    };
    // SAFETY: writes one event handle in the current context.
    check("cuEventCreate", unsafe { (d.event_create)(&mut e, flags) })?;
    Ok(e)
}

/// # Safety
/// `e` and `s` must be live and of the same context.
pub(crate) unsafe fn event_record(
    d: &Driver,
    e: sys::CUevent,
    s: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller promises both handles are live.
    check("cuEventRecord", unsafe { (d.event_record)(e, s) })
}

/// `cuStreamWaitEvent(s, e, 0)`: later work on `s` waits for `e`'s last record.
///
/// # Safety
/// Both handles must be live.
pub(crate) unsafe fn stream_wait_event(
    d: &Driver,
    s: sys::CUstream,
    e: sys::CUevent,
) -> Result<(), CudaError> {
    // SAFETY: the caller promises both handles are live.
    check("cuStreamWaitEvent", unsafe {
        (d.stream_wait_event)(s, e, 0)
    })
}

/// # Safety
/// `e` must be live.
pub(crate) unsafe fn event_synchronize(d: &Driver, e: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller promises `e` is live.
    check("cuEventSynchronize", unsafe { (d.event_synchronize)(e) })
}

/// `Ok(true)` when the work before the event has completed, `Ok(false)` while it has not.
///
/// # Safety
/// `e` must be live.
pub(crate) unsafe fn event_query(d: &Driver, e: sys::CUevent) -> Result<bool, CudaError> {
    // SAFETY: the caller promises `e` is live.
    let rc = unsafe { (d.event_query)(e) };
    if rc == CuStatus::NOT_READY.0 {
        return Ok(false);
    }
    check("cuEventQuery", rc).map(|_| true)
}

/// Milliseconds between two completed timing events.
///
/// # Safety
/// Both events must be live, created with timing, and recorded.
pub(crate) unsafe fn event_elapsed_ms(
    d: &Driver,
    start: sys::CUevent,
    end: sys::CUevent,
) -> Result<f32, CudaError> {
    let mut ms = 0f32;
    // SAFETY: the caller promises both events are live timing events.
    check("cuEventElapsedTime", unsafe {
        (d.event_elapsed_time)(&mut ms, start, end)
    })?;
    Ok(ms)
}

/// # Safety
/// `e` must be live, not used afterwards.
pub(crate) unsafe fn event_destroy(d: &Driver, e: sys::CUevent) -> Result<(), CudaError> {
    // SAFETY: the caller owns `e`.
    check("cuEventDestroy_v2", unsafe { (d.event_destroy)(e) })
}

/// Loads a cubin. The image is copied by the driver; it need not outlive the call.
pub(crate) fn module_load_data(d: &Driver, image: &[u8]) -> Result<sys::CUmodule, CudaError> {
    let mut m: sys::CUmodule = ptr::null_mut();
    // SAFETY: `image` is a complete ELF cubin (the driver checks it and reports
    // CUDA_ERROR_INVALID_IMAGE otherwise) and stays alive for the call.
    check("cuModuleLoadData", unsafe {
        (d.module_load_data)(&mut m, image.as_ptr().cast())
    })?;
    Ok(m)
}

/// # Safety
/// `m` must be live, not used afterwards, and no function of it in use.
pub(crate) unsafe fn module_unload(d: &Driver, m: sys::CUmodule) -> Result<(), CudaError> {
    // SAFETY: the caller owns `m`.
    check("cuModuleUnload", unsafe { (d.module_unload)(m) })
}

/// # Safety
/// `m` must be live.
pub(crate) unsafe fn module_get_function(
    d: &Driver,
    m: sys::CUmodule,
    name: &CStr,
) -> Result<sys::CUfunction, CudaError> {
    let mut f: sys::CUfunction = ptr::null_mut();
    // SAFETY: the caller promises `m` is live; `name` is NUL-terminated.
    check("cuModuleGetFunction", unsafe {
        (d.module_get_function)(&mut f, m, name.as_ptr())
    })?;
    Ok(f)
}

/// # Safety
/// `f` and `s` must be live; `params` must hold one pointer per kernel parameter, each to a
/// value of exactly that parameter's type, and every device pointer inside must be valid for
/// what the kernel does with it until the launch completes.
pub(crate) unsafe fn launch_kernel(
    d: &Driver,
    f: sys::CUfunction,
    grid: (u32, u32, u32),
    block: (u32, u32, u32),
    shared_bytes: u32,
    s: sys::CUstream,
    params: &mut [*mut c_void],
) -> Result<(), CudaError> {
    // SAFETY: the caller upholds the kernel's contract (see above).
    check("cuLaunchKernel", unsafe {
        (d.launch_kernel)(
            f,
            grid.0,
            grid.1,
            grid.2,
            block.0,
            block.1,
            block.2,
            shared_bytes,
            s,
            params.as_mut_ptr(),
            ptr::null_mut(),
        )
    })
}

pub(crate) fn mem_alloc(d: &Driver, bytes: usize) -> Result<sys::CUdeviceptr, CudaError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: writes one device pointer in the current context.
    check("cuMemAlloc_v2", unsafe { (d.mem_alloc)(&mut p, bytes) })?;
    Ok(p)
}

/// # Safety
/// `p` must come from [`mem_alloc`], with no work in flight on it, not used afterwards.
pub(crate) unsafe fn mem_free(d: &Driver, p: sys::CUdeviceptr) -> Result<(), CudaError> {
    // SAFETY: the caller owns `p`.
    check("cuMemFree_v2", unsafe { (d.mem_free)(p) })
}

/// `cuMemHostAlloc(bytes, 0)`: page-locked host memory, which asynchronous copies read when
/// they run (pageable memory the driver may have to stage synchronously).
pub(crate) fn mem_host_alloc(d: &Driver, bytes: usize) -> Result<*mut u8, CudaError> {
    let mut p: *mut std::ffi::c_void = std::ptr::null_mut();
    // SAFETY: writes one host pointer; the current context owns the allocation.
    check("cuMemHostAlloc", unsafe {
        (d.mem_host_alloc)(&mut p, bytes, 0)
    })?;
    Ok(p.cast())
}

/// # Safety
/// `p` must come from [`mem_host_alloc`], with no copy in flight from it, not used afterwards.
pub(crate) unsafe fn mem_free_host(d: &Driver, p: *mut u8) -> Result<(), CudaError> {
    // SAFETY: the caller owns `p`.
    check("cuMemFreeHost", unsafe { (d.mem_free_host)(p.cast()) })
}

/// # Safety
/// `dst..dst+src.len()` must be device memory; `src` must stay alive and unchanged until the
/// copy completes on `s` (pageable memory is staged before return, pinned memory is not).
pub unsafe fn memcpy_htod_async(
    d: &Driver,
    dst: sys::CUdeviceptr,
    src: &[u8],
    s: sys::CUstream,
) -> Result<(), CudaError> {
    // SAFETY: the caller upholds the lifetimes above.
    check("cuMemcpyHtoDAsync_v2", unsafe {
        (d.memcpy_htod_async)(dst, src.as_ptr().cast(), src.len(), s)
    })
}

/// # Safety
/// `src..src+dst.len()` must be device memory readable from the current context.
pub unsafe fn memcpy_dtoh(
    d: &Driver,
    dst: &mut [u8],
    src: sys::CUdeviceptr,
) -> Result<(), CudaError> {
    // SAFETY: the caller promises the device range is valid; `dst` is a live host buffer.
    check("cuMemcpyDtoH_v2", unsafe {
        (d.memcpy_dtoh)(dst.as_mut_ptr().cast(), src, dst.len())
    })
}

/// The allocation property stoker uses for rings: pinned device memory on `device`,
/// exportable as a POSIX file descriptor.
pub(crate) fn ring_allocation_prop(device: sys::CUdevice) -> sys::CUmemAllocationProp {
    sys::CUmemAllocationProp {
        type_: sys::CU_MEM_ALLOCATION_TYPE_PINNED,
        requested_handle_types: sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        win32_handle_meta_data: ptr::null_mut(),
        alloc_flags: sys::CUmemAllocFlags::default(),
    }
}

pub(crate) fn mem_get_allocation_granularity(
    d: &Driver,
    prop: &sys::CUmemAllocationProp,
    recommended: bool,
) -> Result<usize, CudaError> {
    let mut g = 0usize;
    let opt = if recommended {
        sys::CU_MEM_ALLOC_GRANULARITY_RECOMMENDED
    } else {
        sys::CU_MEM_ALLOC_GRANULARITY_MINIMUM
    };
    // SAFETY: `prop` is a valid struct; writes one size_t.
    check("cuMemGetAllocationGranularity", unsafe {
        (d.mem_get_allocation_granularity)(&mut g, prop, opt)
    })?;
    Ok(g)
}

pub(crate) fn mem_create(
    d: &Driver,
    bytes: usize,
    prop: &sys::CUmemAllocationProp,
) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: `prop` is a valid struct; writes one handle.
    check("cuMemCreate", unsafe {
        (d.mem_create)(&mut h, bytes, prop, 0)
    })?;
    Ok(h)
}

/// Exports `h` as a new POSIX file descriptor, owned by the caller.
///
/// # Safety
/// `h` must be a live allocation created with the POSIX-fd handle type.
pub(crate) unsafe fn mem_export_fd(
    d: &Driver,
    h: sys::CUmemGenericAllocationHandle,
) -> Result<c_int, CudaError> {
    let mut fd: c_int = -1;
    // SAFETY: for CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR the out-parameter is an int.
    check("cuMemExportToShareableHandle", unsafe {
        (d.mem_export_to_shareable_handle)(
            (&mut fd as *mut c_int).cast(),
            h,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
            0,
        )
    })?;
    Ok(fd)
}

/// Imports an allocation from a POSIX file descriptor (which stays owned by the caller).
pub(crate) fn mem_import_fd(
    d: &Driver,
    fd: c_int,
) -> Result<sys::CUmemGenericAllocationHandle, CudaError> {
    let mut h: sys::CUmemGenericAllocationHandle = 0;
    // SAFETY: for the POSIX-fd handle type the fd itself is passed in the pointer argument
    // (cuda.h: "the osHandle is the fd cast to void*"); a bad fd is an error status.
    check("cuMemImportFromShareableHandle", unsafe {
        (d.mem_import_from_shareable_handle)(
            &mut h,
            fd as isize as *mut c_void,
            sys::CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR,
        )
    })?;
    Ok(h)
}

pub(crate) fn mem_address_reserve(
    d: &Driver,
    bytes: usize,
    alignment: usize,
) -> Result<sys::CUdeviceptr, CudaError> {
    let mut p: sys::CUdeviceptr = 0;
    // SAFETY: reserves virtual address space only; writes one pointer.
    check("cuMemAddressReserve", unsafe {
        (d.mem_address_reserve)(&mut p, bytes, alignment, 0, 0)
    })?;
    Ok(p)
}

/// # Safety
/// `p..p+bytes` must be a reserved, unmapped range; `h` a live allocation of at least `bytes`.
pub(crate) unsafe fn mem_map(
    d: &Driver,
    p: sys::CUdeviceptr,
    bytes: usize,
    h: sys::CUmemGenericAllocationHandle,
) -> Result<(), CudaError> {
    // SAFETY: the caller promises the range and the handle.
    check("cuMemMap", unsafe { (d.mem_map)(p, bytes, 0, h, 0) })
}

/// Grants read-write access to `p..p+bytes` from `device`.
///
/// # Safety
/// `p..p+bytes` must be mapped.
pub(crate) unsafe fn mem_set_access_rw(
    d: &Driver,
    p: sys::CUdeviceptr,
    bytes: usize,
    device: sys::CUdevice,
) -> Result<(), CudaError> {
    let desc = sys::CUmemAccessDesc {
        location: sys::CUmemLocation {
            type_: sys::CU_MEM_LOCATION_TYPE_DEVICE,
            id: device,
        },
        flags: sys::CU_MEM_ACCESS_FLAGS_PROT_READWRITE,
    };
    // SAFETY: the caller promises the range is mapped; `desc` is one valid descriptor.
    check("cuMemSetAccess", unsafe {
        (d.mem_set_access)(p, bytes, &desc, 1)
    })
}

/// # Safety
/// `p..p+bytes` must be mapped and no work may be in flight on it.
pub(crate) unsafe fn mem_unmap(
    d: &Driver,
    p: sys::CUdeviceptr,
    bytes: usize,
) -> Result<(), CudaError> {
    // SAFETY: the caller promises the range is mapped and idle.
    check("cuMemUnmap", unsafe { (d.mem_unmap)(p, bytes) })
}

/// # Safety
/// `h` must be live and not used afterwards (mappings keep the memory alive until unmapped).
pub(crate) unsafe fn mem_release(
    d: &Driver,
    h: sys::CUmemGenericAllocationHandle,
) -> Result<(), CudaError> {
    // SAFETY: the caller owns `h`.
    check("cuMemRelease", unsafe { (d.mem_release)(h) })
}

/// # Safety
/// `p..p+bytes` must be a reservation with nothing mapped in it.
pub(crate) unsafe fn mem_address_free(
    d: &Driver,
    p: sys::CUdeviceptr,
    bytes: usize,
) -> Result<(), CudaError> {
    // SAFETY: the caller owns the reservation.
    check("cuMemAddressFree", unsafe {
        (d.mem_address_free)(p, bytes)
    })
}
