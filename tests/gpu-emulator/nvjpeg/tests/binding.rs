//! Which handles and states the nvJPEG stand-in takes, as NVIDIA documents and a real nvJPEG
//! 13.0.1 answered on an H100 (docs/results/gpu-check-2026-11-26-h100/probe.json): hardware
//! info from any handle (row 49), `nvjpegDecodeBatchedEx` only on a hardware handle (row 63),
//! the host phase without a pinned buffer (row 66), and handles and states bound to their
//! device and to one thread (row 70).

mod support;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use support::*;

const HYBRID: c_int = 1;
const GPU_HYBRID: c_int = 2;
const HARDWARE: c_int = 3;
const INVALID_PARAMETER: R = 2;
const IMPLEMENTATION_NOT_SUPPORTED: R = 9;
const OUTPUT_RGBI: c_int = 5;

fn state(h: *mut c_void) -> *mut c_void {
    let create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegJpegStateCreate");
    let mut st = null_mut();
    // SAFETY: a live handle and a local out-parameter.
    ok(unsafe { create(h, &mut st) });
    st
}

fn initialize(h: *mut c_void, st: *mut c_void) -> R {
    let init: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, c_int, c_int) -> R =
        sym(true, "nvjpegDecodeBatchedInitialize");
    // SAFETY: live handle and state.
    unsafe { init(h, st, 1, 1, OUTPUT_RGBI) }
}

/// `nvjpegDecodeBatchedEx` of one 16 x 8 JPEG into fresh device memory on `s`: the call's
/// status (the stream synchronised after it).
fn batched_ex(h: *mut c_void, st: *mut c_void, s: *mut c_void) -> R {
    type BatchedEx = unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        *const *const u8,
        *const usize,
        *mut [usize; 8],
        *mut *mut c_void,
        *mut c_void,
    ) -> R;
    let batched: BatchedEx = sym(true, "nvjpegDecodeBatchedEx");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> R = sym(false, "cuMemAlloc_v2");
    let sync: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuStreamSynchronize");
    let data = jpeg(false);
    let (_, p) = parsed_with_params(h, &data);
    let mut dev = 0u64;
    // SAFETY: live handles; `dev` holds one 16 x 8 RGBI image (pitch 48); `data` outlives the
    // stream's work (synchronised before returning).
    unsafe {
        ok(alloc(&mut dev, 16 * 8 * 3));
        let mut image = [0usize; 8];
        (image[0], image[4]) = (usize::try_from(dev).unwrap(), 48);
        let (ptrs, lens, mut params) = ([data.as_ptr()], [data.len()], [p]);
        let rc = batched(
            h,
            st,
            ptrs.as_ptr(),
            lens.as_ptr(),
            &mut image,
            params.as_mut_ptr(),
            s,
        );
        ok(sync(s));
        rc
    }
}

#[test]
fn every_handle_reports_the_devices_hardware_decoder() {
    let info: unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_uint) -> R =
        sym(true, "nvjpegGetHardwareDecoderInfo");
    for backend in [HYBRID, GPU_HYBRID, HARDWARE] {
        let (h, _) = setup(backend);
        let (mut engines, mut cores) = (0, 0);
        // SAFETY: a live handle and local out-parameters.
        ok(unsafe { info(h, &mut engines, &mut cores) });
        assert_eq!((engines, cores), (7, 1), "backend {backend}");
    }
}

#[test]
fn batched_ex_takes_only_a_hardware_handle() {
    let (h, s) = setup(HYBRID);
    let st = state(h);
    ok(initialize(h, st));
    assert_eq!(batched_ex(h, st, s), IMPLEMENTATION_NOT_SUPPORTED);
    let (h, s) = setup(HARDWARE);
    let st = state(h);
    ok(initialize(h, st));
    ok(batched_ex(h, st, s));
}

#[test]
fn the_host_phase_needs_no_pinned_buffer() {
    let decoder_create: unsafe extern "C" fn(*mut c_void, c_int, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecoderCreate");
    let decoder_state: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecoderStateCreate");
    let host: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
        *mut c_void,
    ) -> R = sym(true, "nvjpegDecodeJpegHost");
    let parse: unsafe extern "C" fn(*mut c_void, *const u8, usize, c_int, c_int, *mut c_void) -> R =
        sym(true, "nvjpegJpegStreamParse");
    let (h, _) = setup(HYBRID);
    let data = jpeg(false);
    let (js, p) = parsed_with_params(h, &data);
    let (mut d, mut st) = (null_mut(), null_mut());
    // SAFETY: live handles and local out-parameters; `data` outlives the calls.
    unsafe {
        ok(decoder_create(h, HYBRID, &mut d));
        ok(decoder_state(h, d, &mut st));
        ok(parse(h, data.as_ptr(), data.len(), 0, 0, js));
        ok(host(h, d, st, p, js));
    }
}

/// "Using these states and handles with another device set as current is undefined", and a
/// state "should be instantiated separately for each thread": the stand-in refuses both.
#[test]
fn handles_and_states_stay_on_their_device_and_thread() {
    let (h, _) = setup(HARDWARE);
    let st = state(h);
    ok(initialize(h, st));
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> R =
        sym(false, "cuDevicePrimaryCtxRetain");
    let set: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuCtxSetCurrent");
    let (hs, sts) = (h as usize, st as usize);
    std::thread::spawn(move || {
        let (h, st) = (hs as *mut c_void, sts as *mut c_void);
        let mut ctx = null_mut();
        // SAFETY: local out-parameter; device 1's primary context.
        unsafe {
            ok(retain(&mut ctx, 1));
            ok(set(ctx));
        }
        assert_eq!(initialize(h, st), INVALID_PARAMETER, "a handle of device 0");
        let (h1, _) = setup(HARDWARE);
        let mine = state(h1);
        ok(initialize(h1, mine));
        assert_eq!(
            initialize(h1, st),
            INVALID_PARAMETER,
            "another thread's state"
        );
    })
    .join()
    .unwrap();
    ok(initialize(h, st));
}
