//! Contract 1: `cuInit` first and only with `STOKER_GPU_EMULATOR=1`; devices from the
//! configuration; `CUDA_VISIBLE_DEVICES`; primary contexts and the current context.

mod support;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use support::*;

#[test]
fn the_emulator_refuses_to_initialise_without_the_gate() {
    if child_role().as_deref() == Some("no-gate") {
        let c = cuda();
        // SAFETY: plain calls with local out-parameters.
        unsafe {
            assert_eq!((c.init)(0), STUB_LIBRARY);
            let mut n = -1;
            assert_eq!((c.device_get_count)(&mut n), NOT_INITIALIZED);
        }
        return;
    }
    for gate in ["", "0", "yes"] {
        let err = passed_child_stderr(
            "the_emulator_refuses_to_initialise_without_the_gate",
            "no-gate",
            &[("STOKER_GPU_EMULATOR", gate)],
        );
        assert!(err.contains("STOKER_GPU_EMULATOR=1 is not set"), "{err}");
    }
}

#[test]
fn every_call_before_cu_init_is_not_initialized() {
    if child_role().as_deref() == Some("before-init") {
        let c = cuda();
        let (mut n, mut p) = (0, 0u64);
        // SAFETY: plain calls with local out-parameters.
        unsafe {
            assert_eq!((c.device_get_count)(&mut n), NOT_INITIALIZED);
            assert_eq!((c.mem_alloc)(&mut p, 4096), NOT_INITIALIZED);
            ok((c.init)(0));
            ok((c.device_get_count)(&mut n));
        }
        assert_eq!(n, 3);
        return;
    }
    child_ok(&child(
        "every_call_before_cu_init_is_not_initialized",
        "before-init",
        &[],
    ));
}

#[test]
fn a_bad_configuration_is_refused_with_the_input_named() {
    if child_role().as_deref() == Some("bad-config") {
        // SAFETY: cuInit takes flags only.
        assert_eq!(unsafe { (cuda().init)(0) }, INVALID_VALUE);
        return;
    }
    for (config, named) in [
        (r#"{"devices": [{"uuid": "GPU-nope"}]}"#, "GPU-nope"),
        (r#"{"devices": [], "colour": 1}"#, "colour"),
        ("/nonexistent/emu.json", "/nonexistent/emu.json"),
    ] {
        let err = passed_child_stderr(
            "a_bad_configuration_is_refused_with_the_input_named",
            "bad-config",
            &[("STOKER_EMU_CONFIG", config)],
        );
        assert!(
            err.contains("STOKER_EMU_CONFIG") && err.contains(named),
            "{err}"
        );
    }
}

fn name(dev: c_int) -> String {
    let mut buf = [0 as std::ffi::c_char; 64];
    // SAFETY: 64 writable bytes.
    ok(unsafe { (cuda().device_get_name)(buf.as_mut_ptr(), 64, dev) });
    // SAFETY: the driver wrote a NUL-terminated string.
    unsafe { std::ffi::CStr::from_ptr(buf.as_ptr()) }
        .to_string_lossy()
        .into_owned()
}

fn uuid(dev: c_int) -> [u8; 16] {
    let mut u = [0u8; 16];
    // SAFETY: 16 writable bytes.
    ok(unsafe { (cuda().device_get_uuid)(&mut u, dev) });
    u
}

#[test]
fn devices_come_from_the_configuration() {
    let c = init();
    let mut n = 0;
    // SAFETY: every out-parameter below is a local.
    unsafe {
        ok((c.device_get_count)(&mut n));
        assert_eq!(n, 3);
        assert_eq!(name(0), "Emu Alpha");
        assert_eq!(name(2), "Emu Gamma");
        assert_eq!(uuid(1)[15], 0x51);
        assert_eq!(uuid(1)[0], 0x11);
        let mut bytes = 0usize;
        ok((c.device_total_mem)(&mut bytes, 2));
        assert_eq!(bytes, 16 * MIB);
        let attr = |a, d| {
            let mut v = -1;
            ok((c.device_get_attribute)(&mut v, a, d));
            v
        };
        assert_eq!((attr(75, 0), attr(76, 0)), (9, 0));
        assert_eq!((attr(75, 2), attr(76, 2)), (8, 6));
        assert_eq!(attr(103, 1), 1, "POSIX-fd sharing");
        let (mut engines, mut cores) = (0, 0);
        ok((c.device_jpeg)(0, &mut engines, &mut cores));
        assert_eq!((engines, cores), (7, 2));
        ok((c.device_jpeg)(2, &mut engines, &mut cores));
        assert_eq!(engines, 0);
        let mut d = -1;
        assert_eq!(
            (c.device_get)(&mut d, 3),
            101,
            "ordinal past the last device"
        );
        let mut v = 0;
        assert_eq!((c.device_get_attribute)(&mut v, 99_999, 0), INVALID_VALUE);
    }
}

#[test]
fn cuda_visible_devices_picks_and_renumbers_devices() {
    if child_role().as_deref() == Some("visible") {
        let c = init();
        let mut n = 0;
        // SAFETY: a local out-parameter.
        ok(unsafe { (c.device_get_count)(&mut n) });
        assert_eq!(n, 2);
        assert_eq!(name(0), "Emu Gamma");
        assert_eq!(name(1), "Emu Alpha");
        return;
    }
    let out = child(
        "cuda_visible_devices_picks_and_renumbers_devices",
        "visible",
        &[(
            "CUDA_VISIBLE_DEVICES",
            "GPU-11111111-2222-4333-8444-555555555552,0",
        )],
    );
    child_ok(&out);
}

#[test]
fn calls_needing_a_context_fail_without_one() {
    let c = init();
    // A thread of its own: no context is current on it.
    on_own_thread(move || {
        let mut p = 0u64;
        let mut s = null_mut();
        // SAFETY: local out-parameters.
        unsafe {
            assert_eq!((c.mem_alloc)(&mut p, 4096), INVALID_CONTEXT);
            assert_eq!((c.stream_create)(&mut s, 1), INVALID_CONTEXT);
            assert_eq!((c.ctx_set_current)(0x1234 as *mut c_void), INVALID_CONTEXT);
        }
    });
}

#[test]
fn primary_contexts_are_reference_counted() {
    let c = init();
    // Device 1 is used by no other test of this binary.
    on_own_thread(move || {
        let a = bind(1);
        let b = bind(1);
        assert_eq!(a, b, "one primary context per device");
        let mut p = 0u64;
        // SAFETY: local out-parameters; `p` is freed by the context's destruction.
        unsafe {
            ok((c.primary_ctx_release)(1));
            ok((c.mem_alloc)(&mut p, 4096));
            assert!(live().device_allocations >= 1);
            ok((c.primary_ctx_release)(1));
            // The last release destroyed the context and everything in it.
            assert_eq!((c.mem_alloc)(&mut p, 4096), CONTEXT_IS_DESTROYED);
            assert_eq!((c.ctx_set_current)(a), CONTEXT_IS_DESTROYED);
            assert_eq!(
                (c.primary_ctx_release)(1),
                INVALID_CONTEXT,
                "one release too many"
            );
        }
        // Retained again: the same handle, usable, empty.
        assert_eq!(bind(1), a);
        // SAFETY: as above.
        unsafe {
            ok((c.mem_alloc)(&mut p, 4096));
            ok((c.mem_free)(p));
            ok((c.primary_ctx_release)(1));
        }
    });
}

#[test]
fn the_primary_context_keeps_one_scheduling_flag_as_set() {
    let c = init();
    let (mut flags, mut active): (c_uint, c_int) = (0, 0);
    // SAFETY: local out-parameters.
    unsafe {
        // "Only one of the scheduling flags can be set": SPIN | BLOCKING_SYNC is refused.
        assert_eq!((c.primary_ctx_set_flags)(0, 0x01 | 0x04), INVALID_VALUE);
        // CU_CTX_SCHED_BLOCKING_SYNC is what GetState then says (other tests of this binary
        // may hold device 0's context: only their waits change, from spinning to sleeping).
        ok((c.primary_ctx_set_flags)(0, 0x04));
        ok((c.primary_ctx_get_state)(0, &mut flags, &mut active));
        assert_eq!(flags, 0x04);
        // "overwriting previously set ones".
        ok((c.primary_ctx_set_flags)(0, 0));
        ok((c.primary_ctx_get_state)(0, &mut flags, &mut active));
        assert_eq!(flags, 0);
    }
}
