//! Contract 5: the Nth call of a named function fails with a named status; sticky statuses
//! break the context (or the whole device) for every later call, and a sticky fault in stream
//! work surfaces at synchronisation, as on a GPU.

mod support;

use std::ffi::c_void;
use std::ptr::null_mut;

use support::*;

#[test]
fn the_nth_call_named_in_the_environment_fails() {
    if ran_as_child(
        "the_nth_call_named_in_the_environment_fails",
        "env-fault",
        &[(
            "STOKER_EMU_FAULTS",
            "cuMemAlloc_v2:2:CUDA_ERROR_OUT_OF_MEMORY,cuStreamCreate:1:LAUNCH_FAILED",
        )],
    ) {
        return;
    }
    let c = init();
    bind(0);
    let mut p = [0u64; 3];
    let mut s = null_mut();
    // SAFETY: local out-parameters.
    unsafe {
        ok((c.mem_alloc)(&mut p[0], 4096));
        assert_eq!((c.mem_alloc)(&mut p[1], 4096), OUT_OF_MEMORY);
        ok((c.mem_alloc)(&mut p[2], 4096));
        // A sticky status on a synchronous call breaks the context at once.
        assert_eq!((c.stream_create)(&mut s, 1), 719);
        assert_eq!((c.mem_alloc)(&mut p[1], 4096), 719);
    }
}

#[test]
fn a_bad_fault_is_refused_by_name() {
    if child_role().as_deref() == Some("bad-fault") {
        // SAFETY: cuInit takes flags only.
        assert_eq!(unsafe { (cuda().init)(0) }, INVALID_VALUE);
        return;
    }
    let err = passed_child_stderr(
        "a_bad_fault_is_refused_by_name",
        "bad-fault",
        &[("STOKER_EMU_FAULTS", "cuMemAlloc_v2:1:CUDA_ERROR_BANANA")],
    );
    assert!(
        err.contains("STOKER_EMU_FAULTS") && err.contains("CUDA_ERROR_BANANA"),
        "{err}"
    );
}

fn inject(name: &std::ffi::CStr, nth: u64, code: R) {
    // SAFETY: a C string.
    ok(unsafe { (cuda().inject_fault)(name.as_ptr(), nth, code) });
}

#[test]
fn an_illegal_address_in_stream_work_breaks_the_context_at_synchronisation() {
    if ran_as_child(
        "an_illegal_address_in_stream_work_breaks_the_context_at_synchronisation",
        "sticky",
        &[],
    ) {
        return;
    }
    let c = init();
    bind(0);
    let (mut d, mut s) = (0u64, null_mut());
    let host = [1u8; 64];
    // SAFETY: local out-parameters, live allocations.
    unsafe {
        ok((c.stream_create)(&mut s, 1));
        ok((c.mem_alloc)(&mut d, 64));
        inject(c"cuMemcpyHtoDAsync_v2", 1, ILLEGAL_ADDRESS);
        // The faulting work is enqueued; the call itself succeeds.
        ok((c.memcpy_htod_async)(d, host.as_ptr().cast(), 64, s));
        assert_eq!((c.stream_synchronize)(s), ILLEGAL_ADDRESS);
        let mut p = 0u64;
        assert_eq!(
            (c.mem_alloc)(&mut p, 64),
            ILLEGAL_ADDRESS,
            "the context stays broken"
        );
        // Another device is unaffected.
        std::thread::spawn(move || {
            bind(1);
            let mut q = 0u64;
            ok((c.mem_alloc)(&mut q, 64));
        })
        .join()
        .unwrap();
        // Resetting the primary context frees what was in it but does not clear the error:
        // "the process must be terminated and relaunched".
        ok((c.primary_ctx_reset)(0));
        assert_eq!(live().device_allocations, 1, "device 1's");
        assert_eq!(
            (c.mem_alloc)(&mut p, 64),
            ILLEGAL_ADDRESS,
            "a reset does not recover a broken context"
        );
    }
}

#[test]
fn an_ecc_error_loses_the_whole_device() {
    if ran_as_child("an_ecc_error_loses_the_whole_device", "ecc", &[]) {
        return;
    }
    let c = init();
    bind(0);
    let mut p = 0u64;
    let mut ctx: *mut c_void = null_mut();
    // SAFETY: local out-parameters.
    unsafe {
        inject(c"cuMemAlloc_v2", 1, ECC_UNCORRECTABLE);
        assert_eq!((c.mem_alloc)(&mut p, 64), ECC_UNCORRECTABLE);
        assert_eq!((c.primary_ctx_reset)(0), 0);
        assert_eq!(
            (c.mem_alloc)(&mut p, 64),
            ECC_UNCORRECTABLE,
            "a reset does not bring back a lost device"
        );
        assert_eq!((c.primary_ctx_retain)(&mut ctx, 0), ECC_UNCORRECTABLE);
    }
}

/// `CUDA_ERROR_LAUNCH_OUT_OF_RESOURCES`: "a launch did not occur because it did not have
/// appropriate resources"; `CUDA_ERROR_DEVICE_UNAVAILABLE`: a device "unavailable at the
/// current time", "often … due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or
/// CU_COMPUTEMODE_PROHIBITED". Neither breaks anything beyond its call; a prohibited device
/// refuses every context and leaves the others usable (docs/cuda.md, rows 10 and 12).
#[test]
fn a_refused_launch_and_a_busy_device_fail_only_their_call() {
    const PROHIBITED: &str = r#"{"devices": [
      {"uuid": "GPU-11111111-2222-4333-8444-555555555550", "compute_mode": "prohibited"},
      {"uuid": "GPU-11111111-2222-4333-8444-555555555551"}]}"#;
    if ran_as_child(
        "a_refused_launch_and_a_busy_device_fail_only_their_call",
        "busy",
        &[("STOKER_EMU_CONFIG", PROHIBITED)],
    ) {
        return;
    }
    const DEVICE_UNAVAILABLE: R = 46;
    const LAUNCH_OUT_OF_RESOURCES: R = 701;
    const ATTR_COMPUTE_MODE: i32 = 20;
    let c = init();
    let mut ctx: *mut c_void = null_mut();
    let (mut mode0, mut mode1) = (-1, -1);
    // SAFETY: local out-parameters.
    unsafe {
        ok((c.device_get_attribute)(&mut mode0, ATTR_COMPUTE_MODE, 0));
        ok((c.device_get_attribute)(&mut mode1, ATTR_COMPUTE_MODE, 1));
        assert_eq!((mode0, mode1), (2, 0), "CU_COMPUTEMODE_PROHIBITED, DEFAULT");
        assert_eq!((c.primary_ctx_retain)(&mut ctx, 0), DEVICE_UNAVAILABLE);
        assert_eq!((c.primary_ctx_retain)(&mut ctx, 0), DEVICE_UNAVAILABLE);
    }
    bind(1);
    let mut p = 0u64;
    // SAFETY: local out-parameters.
    unsafe {
        for status in [LAUNCH_OUT_OF_RESOURCES, DEVICE_UNAVAILABLE] {
            inject(c"cuMemAlloc_v2", 1, status);
            assert_eq!((c.mem_alloc)(&mut p, 64), status);
            ok((c.mem_alloc)(&mut p, 64));
            ok((c.mem_free)(p));
        }
    }
}
