//! What the emulator's contract tests share: the emulated libcuda opened with `dlopen` (as
//! stoker opens a real one), the few driver signatures the tests call, NVRTC from the PyPI
//! wheel for real cubins, and child processes for what must happen in another process (a
//! fault, another configuration, a second process mapping the same memory).
#![allow(dead_code)]

use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::path::PathBuf;
use std::process::Command;
use std::sync::OnceLock;

use libloading::Library;

pub(crate) type R = c_int;

/// Finds `lib<name>.so` beside this test binary (target/<profile>/deps or its parent).
pub(crate) fn built_library(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    let file = format!("lib{name}.so");
    for dir in [deps, deps.parent().unwrap()] {
        let p = dir.join(&file);
        if p.is_file() {
            return p;
        }
    }
    panic!(
        "{file} not found beside {} (cargo builds it with this test)",
        exe.display()
    );
}

macro_rules! table {
    ($( $field:ident = $sym:literal : fn($($arg:ty),*) -> $ret:ty; )*) => {
        pub(crate) struct Cuda {
            $( pub(crate) $field: unsafe extern "C" fn($($arg),*) -> $ret, )*
            pub(crate) path: PathBuf,
            _lib: Library,
        }
        impl Cuda {
            fn open(path: PathBuf) -> Cuda {
                // SAFETY: the emulator has no initialisers with preconditions.
                let lib = unsafe { Library::new(&path) }.unwrap();
                // SAFETY: each signature is the driver's (cuda.h) or the emulator's own.
                unsafe {
                    Cuda {
                        $( $field: *lib.get($sym.as_bytes()).unwrap(), )*
                        path,
                        _lib: lib,
                    }
                }
            }
        }
    };
}

table! {
    init = "cuInit": fn(c_uint) -> R;
    driver_get_version = "cuDriverGetVersion": fn(*mut c_int) -> R;
    device_get_count = "cuDeviceGetCount": fn(*mut c_int) -> R;
    device_get = "cuDeviceGet": fn(*mut c_int, c_int) -> R;
    device_get_uuid = "cuDeviceGetUuid_v2": fn(*mut [u8; 16], c_int) -> R;
    device_get_name = "cuDeviceGetName": fn(*mut c_char, c_int, c_int) -> R;
    device_total_mem = "cuDeviceTotalMem_v2": fn(*mut usize, c_int) -> R;
    device_get_attribute = "cuDeviceGetAttribute": fn(*mut c_int, c_int, c_int) -> R;
    primary_ctx_retain = "cuDevicePrimaryCtxRetain": fn(*mut *mut c_void, c_int) -> R;
    primary_ctx_release = "cuDevicePrimaryCtxRelease_v2": fn(c_int) -> R;
    primary_ctx_reset = "cuDevicePrimaryCtxReset_v2": fn(c_int) -> R;
    primary_ctx_set_flags = "cuDevicePrimaryCtxSetFlags_v2": fn(c_int, c_uint) -> R;
    primary_ctx_get_state = "cuDevicePrimaryCtxGetState": fn(c_int, *mut c_uint, *mut c_int) -> R;
    ctx_set_current = "cuCtxSetCurrent": fn(*mut c_void) -> R;
    ctx_synchronize = "cuCtxSynchronize": fn() -> R;
    stream_create = "cuStreamCreate": fn(*mut *mut c_void, c_uint) -> R;
    stream_create_with_priority = "cuStreamCreateWithPriority":
        fn(*mut *mut c_void, c_uint, c_int) -> R;
    stream_get_priority = "cuStreamGetPriority": fn(*mut c_void, *mut c_int) -> R;
    ctx_get_stream_priority_range = "cuCtxGetStreamPriorityRange": fn(*mut c_int, *mut c_int) -> R;
    stream_destroy = "cuStreamDestroy_v2": fn(*mut c_void) -> R;
    stream_synchronize = "cuStreamSynchronize": fn(*mut c_void) -> R;
    stream_query = "cuStreamQuery": fn(*mut c_void) -> R;
    stream_wait_event = "cuStreamWaitEvent": fn(*mut c_void, *mut c_void, c_uint) -> R;
    launch_host_func = "cuLaunchHostFunc":
        fn(*mut c_void, unsafe extern "C" fn(*mut c_void), *mut c_void) -> R;
    event_create = "cuEventCreate": fn(*mut *mut c_void, c_uint) -> R;
    event_record = "cuEventRecord": fn(*mut c_void, *mut c_void) -> R;
    event_query = "cuEventQuery": fn(*mut c_void) -> R;
    event_synchronize = "cuEventSynchronize": fn(*mut c_void) -> R;
    event_destroy = "cuEventDestroy_v2": fn(*mut c_void) -> R;
    event_elapsed_time = "cuEventElapsedTime": fn(*mut f32, *mut c_void, *mut c_void) -> R;
    mem_alloc = "cuMemAlloc_v2": fn(*mut u64, usize) -> R;
    mem_free = "cuMemFree_v2": fn(u64) -> R;
    mem_alloc_host = "cuMemAllocHost_v2": fn(*mut *mut c_void, usize) -> R;
    mem_host_alloc = "cuMemHostAlloc": fn(*mut *mut c_void, usize, c_uint) -> R;
    mem_free_host = "cuMemFreeHost": fn(*mut c_void) -> R;
    mem_host_register = "cuMemHostRegister_v2": fn(*mut c_void, usize, c_uint) -> R;
    mem_host_unregister = "cuMemHostUnregister": fn(*mut c_void) -> R;
    memcpy_htod_async = "cuMemcpyHtoDAsync_v2": fn(u64, *const c_void, usize, *mut c_void) -> R;
    memcpy_dtoh = "cuMemcpyDtoH_v2": fn(*mut c_void, u64, usize) -> R;
    memcpy_dtoh_async = "cuMemcpyDtoHAsync_v2": fn(*mut c_void, u64, usize, *mut c_void) -> R;
    granularity = "cuMemGetAllocationGranularity": fn(*mut usize, *const Prop, c_uint) -> R;
    mem_create = "cuMemCreate": fn(*mut u64, usize, *const Prop, u64) -> R;
    mem_export = "cuMemExportToShareableHandle": fn(*mut c_void, u64, c_uint, u64) -> R;
    mem_import = "cuMemImportFromShareableHandle": fn(*mut u64, *mut c_void, c_uint) -> R;
    mem_address_reserve = "cuMemAddressReserve": fn(*mut u64, usize, usize, u64, u64) -> R;
    mem_map = "cuMemMap": fn(u64, usize, usize, u64, u64) -> R;
    mem_set_access = "cuMemSetAccess": fn(u64, usize, *const Access, usize) -> R;
    mem_unmap = "cuMemUnmap": fn(u64, usize) -> R;
    mem_release = "cuMemRelease": fn(u64) -> R;
    mem_address_free = "cuMemAddressFree": fn(u64, usize) -> R;
    module_load_data = "cuModuleLoadData": fn(*mut *mut c_void, *const c_void) -> R;
    module_get_function = "cuModuleGetFunction": fn(*mut *mut c_void, *mut c_void, *const c_char) -> R;
    module_unload = "cuModuleUnload": fn(*mut c_void) -> R;
    launch_kernel = "cuLaunchKernel": fn(*mut c_void, c_uint, c_uint, c_uint, c_uint, c_uint,
        c_uint, c_uint, *mut c_void, *mut *mut c_void, *mut *mut c_void) -> R;
    live = "stoker_emu_live": fn(*mut Live) -> R;
    inject_fault = "stoker_emu_inject_fault": fn(*const c_char, u64, c_int) -> R;
    device_jpeg = "stoker_emu_device_jpeg": fn(c_int, *mut c_uint, *mut c_uint) -> R;
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Prop {
    pub(crate) type_: c_uint,
    pub(crate) requested_handle_types: c_uint,
    pub(crate) location_type: c_uint,
    pub(crate) location_id: c_int,
    pub(crate) win32: *mut c_void,
    pub(crate) flags: [u8; 8],
}

impl Prop {
    /// Pinned device memory on `dev`, exportable as a POSIX fd when `posix_fd`.
    pub(crate) fn device(dev: c_int, posix_fd: bool) -> Prop {
        Prop {
            type_: 1,
            requested_handle_types: u32::from(posix_fd),
            location_type: 1,
            location_id: dev,
            win32: std::ptr::null_mut(),
            flags: [0; 8],
        }
    }
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(crate) struct Access {
    pub(crate) location_type: c_uint,
    pub(crate) location_id: c_int,
    pub(crate) flags: c_uint,
}

/// Read-write access for `dev`.
pub(crate) fn rw(dev: c_int) -> Access {
    Access {
        location_type: 1,
        location_id: dev,
        flags: 3,
    }
}

/// What is alive in the emulator (`stoker_emu_live`), in the library's own layout.
pub(crate) use stoker_emu_cuda::stats::EmuLive as Live;
/// The statuses the tests expect, as the library defines them (each test uses some).
#[allow(unused_imports)]
pub(crate) use stoker_emu_cuda::status::{
    CONTEXT_IS_DESTROYED, ECC_UNCORRECTABLE, ILLEGAL_ADDRESS, INVALID_CONTEXT, INVALID_IMAGE,
    INVALID_VALUE, NOT_FOUND, NOT_INITIALIZED, NOT_READY, NO_BINARY_FOR_GPU, OUT_OF_MEMORY,
    STUB_LIBRARY, UNSUPPORTED_PTX_VERSION,
};

pub(crate) const MIB: usize = 1 << 20;

/// The emulator, opened once per test process (its state is per process, as a driver's is).
pub(crate) fn cuda() -> &'static Cuda {
    static CUDA: OnceLock<Cuda> = OnceLock::new();
    CUDA.get_or_init(|| Cuda::open(built_library("stoker_emu_cuda")))
}

/// The test configuration: three devices, the last an older, smaller one without JPEG
/// engines, so nothing passes by relying on defaults.
pub(crate) const CONFIG: &str = r#"{"devices": [
  {"uuid": "GPU-11111111-2222-4333-8444-555555555550", "name": "Emu Alpha",
   "compute_capability": [9, 0], "memory_mib": 64, "jpeg_engines": 7, "jpeg_cores_per_engine": 2},
  {"uuid": "GPU-11111111-2222-4333-8444-555555555551", "name": "Emu Beta",
   "compute_capability": [9, 0], "memory_mib": 64},
  {"uuid": "GPU-11111111-2222-4333-8444-555555555552", "name": "Emu Gamma",
   "compute_capability": [8, 6], "memory_mib": 16, "jpeg_engines": 0}
]}"#;

/// Sets the test environment (unless this is a child given its own) and runs `cuInit`.
pub(crate) fn init() -> &'static Cuda {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        if std::env::var_os(CHILD_ENV).is_none() {
            std::env::set_var("STOKER_GPU_EMULATOR", "1");
            std::env::set_var("STOKER_EMU_CONFIG", CONFIG);
            std::env::remove_var("CUDA_VISIBLE_DEVICES");
            std::env::remove_var("STOKER_EMU_FAULTS");
            std::env::remove_var("STOKER_EMU_OP_DELAY_US");
        }
    });
    let c = cuda();
    // SAFETY: cuInit takes flags only.
    ok(unsafe { (c.init)(0) });
    c
}

#[track_caller]
pub(crate) fn ok(rc: R) {
    assert_eq!(rc, 0, "driver call failed with {rc}");
}

/// Retains `dev`'s primary context and makes it current on this thread.
pub(crate) fn bind(dev: c_int) -> *mut c_void {
    let c = init();
    let mut ctx = std::ptr::null_mut();
    // SAFETY: out-parameters are locals.
    unsafe {
        ok((c.primary_ctx_retain)(&mut ctx, dev));
        ok((c.ctx_set_current)(ctx));
    }
    ctx
}

pub(crate) fn live() -> Live {
    let mut l = Live {
        size: std::mem::size_of::<Live>() as u64,
        ..Live::default()
    };
    // SAFETY: a local of the emulator's struct.
    ok(unsafe { (cuda().live)(&mut l) });
    l
}

/// Environment variable marking a child process and naming its role.
pub(crate) const CHILD_ENV: &str = "STOKER_EMU_TEST_CHILD";

/// This process's role when it is a child started by [`child`].
pub(crate) fn child_role() -> Option<String> {
    std::env::var(CHILD_ENV).ok()
}

/// Runs the test `test` of this binary in a child process with role `role` and `env`.
pub(crate) fn child(test: &str, role: &str, env: &[(&str, &str)]) -> std::process::Output {
    let mut cmd = Command::new(std::env::current_exe().unwrap());
    cmd.args(["--exact", test, "--nocapture", "--test-threads=1"])
        .env(CHILD_ENV, role)
        .env("STOKER_GPU_EMULATOR", "1")
        .env("STOKER_EMU_CONFIG", CONFIG)
        .env_remove("STOKER_EMU_FAULTS")
        .env_remove("STOKER_EMU_OP_DELAY_US")
        .env_remove("CUDA_VISIBLE_DEVICES");
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output().unwrap()
}

/// Runs `test` as a child in `role` with `env`, checks that it passed, and returns what it
/// wrote on stderr.
#[track_caller]
pub(crate) fn passed_child_stderr(test: &str, role: &str, env: &[(&str, &str)]) -> String {
    let out = child(test, role, env);
    child_ok(&out);
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Runs `f` on a thread of its own, which starts with no current context (the driver's
/// current context is per thread), and waits for it.
#[track_caller]
pub(crate) fn on_own_thread(f: impl FnOnce() + Send + 'static) {
    std::thread::spawn(f).join().unwrap();
}

/// In the test process: runs `test` again as a child in `role` (with `env`), checks that it
/// passed, and says `true` (the test is done). In the child: `false` (go on with the test).
#[track_caller]
pub(crate) fn ran_as_child(test: &str, role: &str, env: &[(&str, &str)]) -> bool {
    if child_role().is_some() {
        return false;
    }
    child_ok(&child(test, role, env));
    true
}

#[track_caller]
pub(crate) fn child_ok(out: &std::process::Output) {
    // A name that matched no test would run nothing and succeed.
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(
        out.status.success() && ran,
        "child failed: {:?}\nstdout:\n{}\nstderr:\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The byte `stoker_fill_pattern` writes at `i` (augment.cu's formula).
pub(crate) fn pattern_byte(i: u64, seed: u32) -> u8 {
    ((i ^ (u64::from(seed) << 32)).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 56) as u8
}

/// NVRTC from the PyPI wheel (`scripts/cuda-wheels`), or `None` said loudly; with `CI` set a
/// missing wheel fails the test.
pub(crate) fn nvrtc_compile(source: &str, arch: u32) -> Option<Vec<u8>> {
    let root = std::env::var_os("STOKER_NVIDIA_DIR")
        .map(PathBuf::from)
        .or_else(|| {
            std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/stoker/nvidia"))
        })?;
    let path = root.join("nvidia/cu13/lib/libnvrtc.so.13");
    if !path.is_file() {
        let msg = format!(
            "NVRTC wheel not found at {} (run scripts/cuda-wheels)",
            path.display()
        );
        assert!(std::env::var_os("CI").is_none(), "{msg}");
        eprintln!("SKIPPED: {msg}");
        return None;
    }
    type Create = unsafe extern "C" fn(
        *mut *mut c_void,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int;
    type Compile = unsafe extern "C" fn(*mut c_void, c_int, *const *const c_char) -> c_int;
    type Size = unsafe extern "C" fn(*mut c_void, *mut usize) -> c_int;
    type Get = unsafe extern "C" fn(*mut c_void, *mut c_char) -> c_int;
    // SAFETY: NVRTC from NVIDIA's wheel; the signatures are nvrtc.h's.
    unsafe {
        let lib = Library::new(&path).unwrap();
        let create: Create = *lib.get(b"nvrtcCreateProgram").unwrap();
        let compile: Compile = *lib.get(b"nvrtcCompileProgram").unwrap();
        let size: Size = *lib.get(b"nvrtcGetCUBINSize").unwrap();
        let get: Get = *lib.get(b"nvrtcGetCUBIN").unwrap();
        let src = CString::new(source).unwrap();
        let mut prog = std::ptr::null_mut();
        assert_eq!(
            create(
                &mut prog,
                src.as_ptr(),
                c"k.cu".as_ptr(),
                0,
                std::ptr::null(),
                std::ptr::null()
            ),
            0
        );
        let opts = [
            CString::new(format!("--gpu-architecture=sm_{arch}")).unwrap(),
            CString::new("--fmad=false").unwrap(),
        ];
        let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
        assert_eq!(compile(prog, 2, ptrs.as_ptr()), 0, "NVRTC failed");
        let mut n = 0usize;
        assert_eq!(size(prog, &mut n), 0);
        let mut out = vec![0u8; n];
        assert_eq!(get(prog, out.as_mut_ptr().cast()), 0);
        std::mem::forget(lib);
        Some(out)
    }
}

/// augment.cu, as the daemon embeds it.
pub(crate) fn augment_cu() -> String {
    let p = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../../kernels/cu/augment.cu");
    std::fs::read_to_string(p).unwrap()
}
