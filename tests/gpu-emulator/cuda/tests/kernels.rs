//! Contract 4: `cuModuleLoadData` takes only a real NVRTC cubin for the device's
//! architecture; `cuModuleGetFunction` knows the cubin's kernels; `cuLaunchKernel` runs the
//! host build of the same source on the stream, with the cubin's parameter layout.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod support;

use std::ffi::{c_void, CString};
use std::ptr::null_mut;

use support::*;

fn load(cubin: &[u8]) -> Result<*mut c_void, R> {
    let mut m = null_mut();
    // SAFETY: `cubin` is a whole image (or a test of a bad one of at least 64 bytes).
    match unsafe { (cuda().module_load_data)(&mut m, cubin.as_ptr().cast()) } {
        0 => Ok(m),
        e => Err(e),
    }
}

/// The driver with device 0's context current and augment.cu's sm_90 module loaded; `None`
/// (said by [`nvrtc_compile`]) without NVRTC.
fn augment_module() -> Option<(&'static Cuda, *mut c_void)> {
    let c = init();
    let cubin = nvrtc_compile(&augment_cu(), 90)?;
    bind(0);
    Some((c, load(&cubin).unwrap()))
}

fn function(m: *mut c_void, name: &str) -> Result<*mut c_void, R> {
    let mut f = null_mut();
    let n = CString::new(name).unwrap();
    // SAFETY: a live module and a C string.
    match unsafe { (cuda().module_get_function)(&mut f, m, n.as_ptr()) } {
        0 => Ok(f),
        e => Err(e),
    }
}

/// `CONFIG` with the driver version set to `version`.
fn config_with_driver(version: i32) -> String {
    let body = CONFIG.trim_end().trim_end_matches('}');
    format!("{body}, \"driver_version\": {version}}}")
}

#[test]
fn a_driver_refuses_code_of_a_newer_cuda_major_than_its_own() {
    let config = config_with_driver(12080);
    if ran_as_child(
        "a_driver_refuses_code_of_a_newer_cuda_major_than_its_own",
        "driver-12",
        &[("STOKER_EMU_CONFIG", &config)],
    ) {
        return;
    }
    let c = init();
    let mut v = 0;
    // SAFETY: a local out-parameter.
    ok(unsafe { (c.driver_get_version)(&mut v) });
    assert_eq!(v, 12080, "cuDriverGetVersion reports the configured driver");
    // NVRTC 13 (the wheel CI installs) builds a cubin whose tkinfo note says CUDA 13.
    let Some(sm90) = nvrtc_compile(&augment_cu(), 90) else {
        return;
    };
    on_own_thread(move || {
        bind(0);
        assert_eq!(
            load(&sm90).unwrap_err(),
            UNSUPPORTED_PTX_VERSION,
            "a CUDA 13 cubin on a CUDA 12.8 driver"
        );
        let ptx = |isa: &str| format!("{:<256}\0", format!("//\n.version {isa}\n.target sm_90\n"));
        assert_eq!(
            load(ptx("9.0").as_bytes()).unwrap_err(),
            UNSUPPORTED_PTX_VERSION
        );
        // PTX of the driver's own major is still refused as PTX (not emulated).
        assert_eq!(load(ptx("8.7").as_bytes()).unwrap_err(), INVALID_IMAGE);
    });
}

#[test]
fn the_default_driver_reports_cuda_13() {
    let c = init();
    let mut v = 0;
    // SAFETY: a local out-parameter.
    ok(unsafe { (c.driver_get_version)(&mut v) });
    assert_eq!(v, 13000);
}

#[test]
fn only_a_cubin_for_the_devices_architecture_loads() {
    init();
    let Some(sm90) = nvrtc_compile(&augment_cu(), 90) else {
        return;
    };
    let Some(sm80) = nvrtc_compile(&augment_cu(), 80) else {
        return;
    };
    on_own_thread(move || {
        bind(0); // sm_90
        assert_eq!(load(&[0u8; 256]).unwrap_err(), INVALID_IMAGE);
        let ptx = format!("{:<256}", "//\n.version 8.0\n.target sm_90\n");
        assert_eq!(load(ptx.as_bytes()).unwrap_err(), INVALID_IMAGE);
        let host_elf = std::fs::read("/proc/self/exe").unwrap();
        assert_eq!(load(&host_elf).unwrap_err(), INVALID_IMAGE, "an x86 ELF");
        assert_eq!(load(&sm80).unwrap_err(), NO_BINARY_FOR_GPU);
        let m = load(&sm90).unwrap();
        for k in [
            "stoker_augment",
            "stoker_fill_pattern",
            "stoker_check_pattern",
        ] {
            function(m, k).unwrap();
        }
        assert_eq!(function(m, "stoker_missing").unwrap_err(), NOT_FOUND);
        assert_eq!(function(m, "stoker_augmen").unwrap_err(), NOT_FOUND);
        // SAFETY: a live module.
        ok(unsafe { (cuda().module_unload)(m) });
        bind(2); // sm_86: runs sm_80 code (same major, lower minor), not sm_90's
        load(&sm80).unwrap();
        assert_eq!(load(&sm90).unwrap_err(), NO_BINARY_FOR_GPU);
    });
}

fn launch(f: *mut c_void, grid: u32, block: u32, s: *mut c_void, args: &mut [*mut c_void]) -> R {
    // SAFETY: the caller passes arguments of the kernel's types.
    unsafe {
        (cuda().launch_kernel)(
            f,
            grid,
            1,
            1,
            block,
            1,
            1,
            0,
            s,
            args.as_mut_ptr(),
            null_mut(),
        )
    }
}

#[test]
fn launches_run_the_kernel_on_the_stream() {
    if ran_as_child(
        "launches_run_the_kernel_on_the_stream",
        "delay",
        &[("STOKER_EMU_OP_DELAY_US", "200000")],
    ) {
        return;
    }
    let Some((c, m)) = augment_module() else {
        return;
    };
    let fill = function(m, "stoker_fill_pattern").unwrap();
    let check = function(m, "stoker_check_pattern").unwrap();
    let n: u64 = 100_003;
    let (mut d, mut counter, mut s) = (0u64, 0u64, null_mut());
    // SAFETY: every device pointer passed is an allocation of the size the kernel touches,
    // alive until the stream is synchronised.
    unsafe {
        ok((c.stream_create)(&mut s, 1));
        ok((c.mem_alloc)(&mut d, n as usize));
        ok((c.mem_alloc)(&mut counter, 4));
        let zero = [0u8; 4];
        ok((c.memcpy_htod_async)(counter, zero.as_ptr().cast(), 4, s));
        let (mut dst, mut len, mut seed) = (d, n, 0xdead_beef_u32);
        let mut args = [
            (&mut dst as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut seed as *mut u32).cast(),
        ];
        assert_eq!(
            launch(fill, 4096, 2048, s, &mut args),
            INVALID_VALUE,
            "2048 threads per block"
        );
        ok(launch(fill, 64, 256, s, &mut args));
        assert_eq!(
            (c.stream_query)(s),
            NOT_READY,
            "the launch waited for its kernel"
        );
        ok((c.stream_synchronize)(s));
        let mut got = vec![0u8; n as usize];
        ok((c.memcpy_dtoh)(got.as_mut_ptr().cast(), d, n as usize));
        for (i, &b) in got.iter().enumerate() {
            assert_eq!(b, pattern_byte(i as u64, seed), "byte {i}");
        }
        // Corrupt two bytes; the checker (4 parameters, the last a pointer at offset 24)
        // counts them.
        let bad = [0u8; 1];
        ok((c.memcpy_htod_async)(d + 17, bad.as_ptr().cast(), 1, s));
        ok((c.memcpy_htod_async)(d + n - 1, bad.as_ptr().cast(), 1, s));
        let (mut src, mut out) = (d, counter);
        let mut args = [
            (&mut src as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut seed as *mut u32).cast(),
            (&mut out as *mut u64).cast(),
        ];
        ok(launch(check, 16, 128, s, &mut args));
        ok((c.stream_synchronize)(s));
        let mut mismatches = [0u8; 4];
        ok((c.memcpy_dtoh)(mismatches.as_mut_ptr().cast(), counter, 4));
        let expect =
            u32::from(pattern_byte(17, seed) != 0) + u32::from(pattern_byte(n - 1, seed) != 0);
        assert_eq!(u32::from_ne_bytes(mismatches), expect);
    }
}

#[test]
fn a_kernel_without_a_host_build_is_not_supported() {
    init();
    let src = "extern \"C\" __global__ void other(int* p) { *p = 1; }";
    let Some(cubin) = nvrtc_compile(src, 90) else {
        return;
    };
    on_own_thread(move || {
        bind(0);
        let m = load(&cubin).unwrap();
        let f = function(m, "other").unwrap();
        let mut p = 0u64;
        let mut args = [(&mut p as *mut u64).cast()];
        assert_eq!(launch(f, 1, 1, null_mut(), &mut args), 801);
    });
}

#[test]
fn a_launch_failure_surfaces_at_synchronisation_and_breaks_the_context() {
    if ran_as_child(
        "a_launch_failure_surfaces_at_synchronisation_and_breaks_the_context",
        "launch-fault",
        &[],
    ) {
        return;
    }
    let Some((c, m)) = augment_module() else {
        return;
    };
    let fill = function(m, "stoker_fill_pattern").unwrap();
    let (mut d, mut s) = (0u64, null_mut());
    // SAFETY: a live 4 KiB allocation for a kernel writing 4 KiB; synchronised below.
    unsafe {
        ok((c.stream_create)(&mut s, 1));
        ok((c.mem_alloc)(&mut d, 4096));
        ok((c.inject_fault)(c"cuLaunchKernel".as_ptr(), 1, 719));
        let (mut dst, mut len, mut seed) = (d, 4096u64, 1u32);
        let mut args = [
            (&mut dst as *mut u64).cast(),
            (&mut len as *mut u64).cast(),
            (&mut seed as *mut u32).cast(),
        ];
        ok(launch(fill, 4, 256, s, &mut args));
        assert_eq!(
            (c.stream_synchronize)(s),
            719,
            "CUDA_ERROR_LAUNCH_FAILED at sync"
        );
        assert_eq!(
            launch(fill, 4, 256, s, &mut args),
            719,
            "the context stays broken"
        );
    }
}
