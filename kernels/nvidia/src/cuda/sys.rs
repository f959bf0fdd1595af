//! Raw libcuda driver API: the types stoker uses and a table of function pointers resolved at
//! run time. Nothing here is safe to call; `result` wraps each call.

use std::ffi::{c_char, c_int, c_uint, c_ulonglong, c_void};

use crate::loader::LibrarySpec;

/// `CUresult`: a driver call's status, 0 for success (see [`super::result::CuStatus`]).
pub type CUresult = c_int;
/// `CUdevice`: a device ordinal as the driver numbers the visible devices.
pub type CUdevice = c_int;
/// `CUdeviceptr`: an address in device memory.
pub type CUdeviceptr = c_ulonglong;
/// `CUcontext`: a context handle (stoker uses each device's primary context).
pub type CUcontext = *mut c_void;
/// `CUstream`: a stream handle; null and 1, 2 are the null streams.
pub type CUstream = *mut c_void;
/// `CUevent`: an event handle.
pub type CUevent = *mut c_void;
/// `CUmodule`: a loaded cubin's handle.
pub type CUmodule = *mut c_void;
/// `CUfunction`: a kernel's handle within a module.
pub type CUfunction = *mut c_void;
/// `CUmemGenericAllocationHandle`: a VMM physical allocation.
pub type CUmemGenericAllocationHandle = c_ulonglong;

pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR: c_int = 75;
pub(crate) const CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR: c_int = 76;
pub(crate) const CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED: c_int = 102;
pub(crate) const CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED: c_int = 103;

pub(crate) const CU_STREAM_NON_BLOCKING: c_uint = 0x1;
pub(crate) const CU_EVENT_DISABLE_TIMING: c_uint = 0x2;
pub(crate) const CU_EVENT_BLOCKING_SYNC: c_uint = 0x1;

pub(crate) const CU_MEM_ALLOCATION_TYPE_PINNED: c_uint = 0x1;
pub(crate) const CU_MEM_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR: c_uint = 0x1;
pub(crate) const CU_MEM_LOCATION_TYPE_DEVICE: c_uint = 0x1;
pub(crate) const CU_MEM_ACCESS_FLAGS_PROT_READWRITE: c_uint = 0x3;
pub(crate) const CU_MEM_ALLOC_GRANULARITY_MINIMUM: c_uint = 0x0;
pub(crate) const CU_MEM_ALLOC_GRANULARITY_RECOMMENDED: c_uint = 0x1;

/// `CUuuid`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CUuuid {
    pub(crate) bytes: [u8; 16],
}

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CUmemLocation {
    pub(crate) type_: c_uint,
    pub(crate) id: c_int,
}

/// The `allocFlags` member of `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CUmemAllocFlags {
    pub(crate) compression_type: u8,
    pub(crate) gpu_direct_rdma_capable: u8,
    pub(crate) usage: u16,
    pub(crate) reserved: [u8; 4],
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub(crate) struct CUmemAllocationProp {
    pub(crate) type_: c_uint,
    pub(crate) requested_handle_types: c_uint,
    pub(crate) location: CUmemLocation,
    pub(crate) win32_handle_meta_data: *mut c_void,
    pub(crate) alloc_flags: CUmemAllocFlags,
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy, Default)]
pub(crate) struct CUmemAccessDesc {
    pub(crate) location: CUmemLocation,
    pub(crate) flags: c_uint,
}

crate::symbol_table! {
    /// Every libcuda entry point stoker calls, resolved once.
    pub struct Driver, status CUresult, from "cuda.h" {
    init = "cuInit": fn(c_uint);
    driver_get_version = "cuDriverGetVersion": fn(*mut c_int);
    get_error_name = "cuGetErrorName": fn(CUresult, *mut *const c_char);
    device_get_count = "cuDeviceGetCount": fn(*mut c_int);
    device_get = "cuDeviceGet": fn(*mut CUdevice, c_int);
    device_get_uuid = "cuDeviceGetUuid_v2": fn(*mut CUuuid, CUdevice);
    device_get_name = "cuDeviceGetName": fn(*mut c_char, c_int, CUdevice);
    device_total_mem = "cuDeviceTotalMem_v2": fn(*mut usize, CUdevice);
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, CUdevice);
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut CUcontext, CUdevice);
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(CUdevice);
    primary_ctx_set_flags = "cuDevicePrimaryCtxSetFlags_v2": fn(CUdevice, c_uint);
    primary_ctx_get_state = "cuDevicePrimaryCtxGetState": fn(CUdevice, *mut c_uint, *mut c_int);
    ctx_set_current = "cuCtxSetCurrent": fn(CUcontext);
    ctx_get_current = "cuCtxGetCurrent": fn(*mut CUcontext);
    stream_create_with_priority = "cuStreamCreateWithPriority": fn(*mut CUstream, c_uint, c_int);
    stream_get_priority = "cuStreamGetPriority": fn(CUstream, *mut c_int);
    ctx_get_stream_priority_range = "cuCtxGetStreamPriorityRange": fn(*mut c_int, *mut c_int);
    stream_destroy = "cuStreamDestroy_v2": fn(CUstream);
    stream_wait_event = "cuStreamWaitEvent": fn(CUstream, CUevent, c_uint);
    event_create = "cuEventCreate": fn(*mut CUevent, c_uint);
    event_record = "cuEventRecord": fn(CUevent, CUstream);
    event_synchronize = "cuEventSynchronize": fn(CUevent);
    event_query = "cuEventQuery": fn(CUevent);
    event_elapsed_time = "cuEventElapsedTime": fn(*mut f32, CUevent, CUevent);
    event_destroy = "cuEventDestroy_v2": fn(CUevent);
    module_load_data = "cuModuleLoadData": fn(*mut CUmodule, *const c_void);
    module_unload = "cuModuleUnload": fn(CUmodule);
    module_get_function = "cuModuleGetFunction": fn(*mut CUfunction, CUmodule, *const c_char);
    launch_kernel = "cuLaunchKernel": fn(
        CUfunction, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, c_uint, CUstream,
        *mut *mut c_void, *mut *mut c_void);
    mem_alloc = "cuMemAlloc_v2": fn(*mut CUdeviceptr, usize);
    mem_free = "cuMemFree_v2": fn(CUdeviceptr);
    mem_host_alloc = "cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint);
    mem_free_host = "cuMemFreeHost": fn(*mut c_void);
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(CUdeviceptr, *const c_void, usize, CUstream);
    memcpy_dtoh = "cuMemcpyDtoH_v2": fn(*mut c_void, CUdeviceptr, usize);
    mem_get_allocation_granularity = "cuMemGetAllocationGranularity":
        fn(*mut usize, *const CUmemAllocationProp, c_uint);
    mem_create = "cuMemCreate":
        fn(*mut CUmemGenericAllocationHandle, usize, *const CUmemAllocationProp, c_ulonglong);
    mem_export_to_shareable_handle = "cuMemExportToShareableHandle":
        fn(*mut c_void, CUmemGenericAllocationHandle, c_uint, c_ulonglong);
    mem_import_from_shareable_handle = "cuMemImportFromShareableHandle":
        fn(*mut CUmemGenericAllocationHandle, *mut c_void, c_uint);
    mem_address_reserve = "cuMemAddressReserve":
        fn(*mut CUdeviceptr, usize, usize, CUdeviceptr, c_ulonglong);
    mem_map = "cuMemMap":
        fn(CUdeviceptr, usize, usize, CUmemGenericAllocationHandle, c_ulonglong);
    mem_set_access = "cuMemSetAccess": fn(CUdeviceptr, usize, *const CUmemAccessDesc, usize);
    mem_unmap = "cuMemUnmap": fn(CUdeviceptr, usize);
    mem_release = "cuMemRelease": fn(CUmemGenericAllocationHandle);
    mem_address_free = "cuMemAddressFree": fn(CUdeviceptr, usize);
    }
}

/// Where libcuda is looked for. The driver comes with the kernel module, never from a wheel.
pub(crate) const LIBCUDA: LibrarySpec = LibrarySpec {
    name: "libcuda",
    env: "STOKER_LIBCUDA",
    sonames: &["libcuda.so.1"],
    wheel_dirs: &[],
};

#[cfg(test)]
mod tests {
    use super::*;
    use std::mem::{offset_of, size_of};

    #[test]
    fn vmm_structs_match_cuda_h() {
        assert_eq!(size_of::<CUuuid>(), 16);
        assert_eq!(size_of::<CUmemLocation>(), 8);
        assert_eq!(size_of::<CUmemAccessDesc>(), 12);
        assert_eq!(size_of::<CUmemAllocationProp>(), 32);
        assert_eq!(offset_of!(CUmemAllocationProp, location), 8);
        assert_eq!(offset_of!(CUmemAllocationProp, win32_handle_meta_data), 16);
        assert_eq!(offset_of!(CUmemAllocationProp, alloc_flags), 24);
    }
}
