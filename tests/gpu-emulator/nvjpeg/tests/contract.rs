//! The nvJPEG stand-in's own contract, through `dlopen` as stoker loads it: the gate; nvJPEG's
//! "0 for supported"; the statuses of corrupt and unsupported input; output that reaches
//! device memory only on the CUDA stream; ROI; engines from the emulator's configuration.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

mod support;

use std::ffi::{c_int, c_uint, c_void};
use std::ptr::null_mut;

use libloading::Library;

use support::*;

#[test]
fn corrupt_streams_decode_leniently_unless_the_handle_is_strict() {
    let baseline = jpeg(false);
    // The entropy data cut short before the EOI: libjpeg warns ("premature end"), the real
    // library without NVJPEG_FLAGS_BITSTREAM_STRICT decoded such files on an H200.
    let cut = &baseline[..baseline.len() - 8];
    assert_eq!(decode_with_flags(0, cut), 0, "lenient: decoded");
    assert_eq!(decode_with_flags(4, cut), 3, "strict: BAD_JPEG");
    assert_eq!(
        decode_with_flags(4, &baseline),
        0,
        "strict: a sound stream decodes"
    );
    setup(3);
    let create: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        *mut c_void,
        c_uint,
        *mut *mut c_void,
    ) -> R = sym(true, "nvjpegCreateEx");
    let mut h = null_mut();
    // SAFETY: a local out-parameter.
    let rc = unsafe { create(3, null_mut(), null_mut(), 64, &mut h) };
    assert_eq!(rc, 2, "a flag nvjpeg.h does not define: INVALID_PARAMETER");
}

/// nvJPEG's major and whether it makes a handle on device 0, for the library at `lib`.
fn major_and_handle(lib: &Library) -> (c_int, R) {
    // SAFETY: the types are nvjpeg.h's.
    let (prop, create) = unsafe {
        (
            *lib.get::<unsafe extern "C" fn(c_int, *mut c_int) -> R>(b"nvjpegGetProperty")
                .unwrap(),
            *lib.get::<unsafe extern "C" fn(
                c_int,
                *mut c_void,
                *mut c_void,
                c_uint,
                *mut *mut c_void,
            ) -> R>(b"nvjpegCreateEx")
                .unwrap(),
        )
    };
    let (mut major, mut h) = (0, null_mut());
    // SAFETY: local out-parameters; the context is current (`setup`).
    unsafe {
        ok(prop(0, &mut major));
        (major, create(0, null_mut(), null_mut(), 0, &mut h))
    }
}

#[test]
fn an_nvjpeg_of_a_newer_cuda_major_than_the_driver_makes_no_handle() {
    let test = "an_nvjpeg_of_a_newer_cuda_major_than_the_driver_makes_no_handle";
    if std::env::var_os("STOKER_NVJPEG_TEST_CHILD").is_some() {
        // The stand-in takes its major from the soname it is loaded by, as a real one has it.
        let dir = std::env::temp_dir().join(format!("stoker-nvjpeg-12-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let twelve = dir.join("libnvjpeg.so.12");
        std::fs::copy(built("stoker_emu_nvjpeg"), &twelve).unwrap();
        libs();
        let init: unsafe extern "C" fn(c_uint) -> R = sym(false, "cuInit");
        let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> R =
            sym(false, "cuDevicePrimaryCtxRetain");
        let set: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuCtxSetCurrent");
        let mut ctx = null_mut();
        // SAFETY: local out-parameters.
        unsafe {
            ok(init(0));
            ok(retain(&mut ctx, 0));
            ok(set(ctx));
        }
        assert_eq!(
            major_and_handle(&libs().nvjpeg),
            (13, 6),
            "EXECUTION_FAILED"
        );
        // SAFETY: a copy of the stand-in.
        let lib12 = unsafe { Library::new(&twelve) }.unwrap();
        assert_eq!(major_and_handle(&lib12), (12, 0));
        std::fs::remove_dir_all(&dir).unwrap();
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args(["--exact", test, "--nocapture"])
        .env("STOKER_NVJPEG_TEST_CHILD", "1")
        .env("STOKER_EMU_CONFIG_CHILD", r#"{"driver_version": 12080}"#)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(out.status.success() && ran, "{stderr}");
    assert!(
        stderr.contains("nvJPEG 13.0 needs a driver that runs CUDA 13; this one runs CUDA 12.8"),
        "{stderr}"
    );
}

#[test]
fn without_the_gate_every_call_refuses() {
    if std::env::var_os("STOKER_NVJPEG_TEST_CHILD").is_some() {
        let prop: unsafe extern "C" fn(c_int, *mut c_int) -> R = sym(true, "nvjpegGetProperty");
        let mut v = 0;
        // SAFETY: a local out-parameter.
        let rc = unsafe { prop(0, &mut v) };
        assert_eq!(rc, 1, "NVJPEG_STATUS_NOT_INITIALIZED");
        return;
    }
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "without_the_gate_every_call_refuses",
            "--nocapture",
        ])
        .env("STOKER_NVJPEG_TEST_CHILD", "1")
        .env_remove("STOKER_GPU_EMULATOR")
        .output()
        .unwrap();
    // A name that matched no test would run nothing and succeed.
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(
        out.status.success() && ran,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("STOKER_GPU_EMULATOR=1 is not set"));
}

#[test]
fn batched_decode_follows_nvjpegs_rules_and_the_stream() {
    let (h, s) = setup(3);
    let info: unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_uint) -> R =
        sym(true, "nvjpegGetHardwareDecoderInfo");
    let (mut engines, mut cores) = (0, 0);
    // SAFETY: a live handle, local out-parameters.
    unsafe { ok(info(h, &mut engines, &mut cores)) };
    assert_eq!((engines, cores), (7, 1), "the emulator's default devices");
    let baseline = jpeg(false);
    let progressive = jpeg(true);
    assert_eq!(supported_flag(h, &baseline), 0, "0 means supported");
    assert_eq!(
        supported_flag(h, &progressive),
        1,
        "the engines take no progressive JPEG"
    );

    let state_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegJpegStateCreate");
    let init: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, c_int, c_int) -> R =
        sym(true, "nvjpegDecodeBatchedInitialize");
    type Batched = unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        *const *const u8,
        *const usize,
        *mut [usize; 8],
        *mut c_void,
    ) -> R;
    let batched: Batched = sym(true, "nvjpegDecodeBatched");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> R = sym(false, "cuMemAlloc_v2");
    let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> R = sym(false, "cuMemcpyDtoH_v2");
    let sync: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuStreamSynchronize");
    let (mut st, mut dev) = (null_mut(), 0u64);
    let n = 16 * 8 * 3;
    // SAFETY: (whole block) live handles; `dev` holds one 16 x 8 RGBI image (pitch 48) and is
    // read only after the stream is synchronised, except for the deliberate early read.
    unsafe {
        ok(state_create(h, &mut st));
        ok(init(h, st, 1, 1, 5));
        ok(alloc(&mut dev, n));
        let mut image = [0usize; 8];
        image[0] = dev as usize;
        image[4] = 48;
        let bad = &baseline[..baseline.len() / 3];
        let corrupt = [bad.as_ptr()];
        let lens = [bad.len()];
        assert_eq!(
            batched(h, st, corrupt.as_ptr(), lens.as_ptr(), &mut image, s),
            3,
            "BAD_JPEG"
        );
        let prog = [progressive.as_ptr()];
        let plen = [progressive.len()];
        let data = [baseline.as_ptr()];
        let lens = [baseline.len()];
        // A failed batch leaves the state to be initialised again (nvJPEG's single-phase
        // rule), even for a good batch of the same size.
        assert_eq!(
            batched(h, st, data.as_ptr(), lens.as_ptr(), &mut image, s),
            2,
            "INVALID_PARAMETER: not initialised since the failure"
        );
        ok(init(h, st, 1, 1, 5));
        assert_eq!(
            batched(h, st, prog.as_ptr(), plen.as_ptr(), &mut image, s),
            4,
            "JPEG_NOT_SUPPORTED"
        );
        ok(init(h, st, 1, 1, 5));
        ok(batched(h, st, data.as_ptr(), lens.as_ptr(), &mut image, s));
        // The hardware engines may write before the (delayed) stream gets there (rule 76):
        // the pixels are only promised once the stream is synchronised.
        ok(sync(s));
        let mut got = vec![0u8; n];
        ok(dtoh(got.as_mut_ptr().cast(), dev, n));
        // Close to the source pattern (quality 95).
        let err: f64 = got
            .chunks_exact(3)
            .enumerate()
            .map(|(i, p)| {
                (f64::from(p[1]) - 100.0).abs() + (f64::from(p[0]) - (i * 2) as f64).abs()
            })
            .sum::<f64>()
            / (16.0 * 8.0);
        assert!(err < 6.0, "mean error {err}");
    }
    let path: unsafe extern "C" fn(*const u8, usize) -> c_int = sym(true, "stoker_emu_nvjpeg_path");
    // SAFETY: plain byte slices.
    unsafe {
        assert_eq!(
            path(baseline.as_ptr(), baseline.len()),
            1,
            "recorded as hardware"
        );
        assert_eq!(
            path(progressive.as_ptr(), progressive.len()),
            0,
            "never decoded"
        );
    }
}

#[test]
fn a_batched_decode_reads_its_bitstreams_on_the_stream_and_holds_its_state_until_then() {
    let (h, s) = setup(3);
    let state_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegJpegStateCreate");
    let init: unsafe extern "C" fn(*mut c_void, *mut c_void, c_int, c_int, c_int) -> R =
        sym(true, "nvjpegDecodeBatchedInitialize");
    let prealloc: unsafe extern "C" fn(
        *mut c_void,
        *mut c_void,
        c_int,
        c_int,
        c_int,
        c_int,
        c_int,
    ) -> R = sym(true, "nvjpegDecodeBatchedPreAllocate");
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
    let params_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecodeParamsCreate");
    let alloc: unsafe extern "C" fn(*mut u64, usize) -> R = sym(false, "cuMemAlloc_v2");
    let dtoh: unsafe extern "C" fn(*mut c_void, u64, usize) -> R = sym(false, "cuMemcpyDtoH_v2");
    let sync: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuStreamSynchronize");
    // The caller's buffer holds a patterned image at the call, a flat one (shorter: padded
    // with zeros past its end of image) once the call has returned.
    let first = jpeg(false);
    let flat = encode(false, |_| [200, 40, 90]);
    assert!(flat.len() < first.len());
    let mut buffer = first.clone();
    let n = 16 * 8 * 3;
    let (mut st, mut p, mut dev) = (null_mut(), null_mut(), 0u64);
    // SAFETY: (whole block) live handles; `buffer` outlives the stream's work (synchronised
    // below); `dev` holds one 16 x 8 RGBI image (pitch 48).
    unsafe {
        ok(state_create(h, &mut st));
        ok(prealloc(h, st, 1, 16, 8, 0, 5));
        ok(init(h, st, 1, 1, 5));
        ok(params_create(h, &mut p));
        ok(alloc(&mut dev, n));
        let mut image = [0usize; 8];
        image[0] = dev as usize;
        image[4] = 48;
        let data = [buffer.as_ptr()];
        let lens = [buffer.len()];
        let mut params = [p];
        ok(batched(
            h,
            st,
            data.as_ptr(),
            lens.as_ptr(),
            &mut image,
            params.as_mut_ptr(),
            s,
        ));
        // The state is busy until the stream has run the decode: no Initialize, no decode.
        assert_eq!(
            init(h, st, 1, 1, 5),
            2,
            "Initialize while a decode is pending"
        );
        assert_eq!(
            batched(
                h,
                st,
                data.as_ptr(),
                lens.as_ptr(),
                &mut image,
                params.as_mut_ptr(),
                s
            ),
            2,
            "a second decode on a busy state"
        );
        assert_eq!(
            prealloc(h, st, 1, 16, 8, 0, 5),
            2,
            "PreAllocate on a busy state"
        );
        std::ptr::write_bytes(buffer.as_mut_ptr(), 0, buffer.len());
        std::ptr::copy_nonoverlapping(flat.as_ptr(), buffer.as_mut_ptr(), flat.len());
        ok(sync(s));
        let mut got = vec![0u8; n];
        ok(dtoh(got.as_mut_ptr().cast(), dev, n));
        let err: f64 = got
            .chunks_exact(3)
            .map(|px| {
                (f64::from(px[0]) - 200.0).abs()
                    + (f64::from(px[1]) - 40.0).abs()
                    + (f64::from(px[2]) - 90.0).abs()
            })
            .sum::<f64>()
            / (16.0 * 8.0);
        assert!(
            err < 9.0,
            "the bytes found when the stream ran are decoded: error {err}"
        );
        // Idle again once the stream has run it.
        ok(init(h, st, 1, 1, 5));
    }
}

/// SOI, a frame of 16 x 8 with three components (Y 2x2, Cb, Cr) coded as `sof`, and a first
/// scan header of `scan` components: enough for the support queries, which read headers only.
fn header_with_scan(sof: u8, scan: u8) -> Vec<u8> {
    let mut b = vec![0xff, 0xd8, 0xff, sof, 0, 17, 8, 0, 8, 0, 16, 3];
    b.extend([1, 0x22, 0, 2, 0x11, 0, 3, 0x11, 0]);
    b.extend([0xff, 0xda, 0, 6 + 2 * scan, scan]);
    b
}

/// `nvjpegDecoderJpegSupported` of a decoder made for `backend` on `data` (no ROI).
fn decoder_flag(h: *mut c_void, backend: c_int, data: &[u8]) -> c_int {
    let decoder_create: unsafe extern "C" fn(*mut c_void, c_int, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecoderCreate");
    let check: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut c_int) -> R =
        sym(true, "nvjpegDecoderJpegSupported");
    let (mut d, mut flag) = (null_mut(), -1);
    // SAFETY: a live handle and local out-parameters.
    unsafe { ok(decoder_create(h, backend, &mut d)) };
    let (js, p) = parsed_with_params(h, data);
    // SAFETY: live handles and a local out-parameter.
    unsafe { ok(check(d, js, p, &mut flag)) };
    flag
}

#[test]
fn each_decoder_takes_what_nvjpeg_and_its_users_give_it() {
    let (h, _) = setup(3);
    let single = header_with_scan(0xc0, 3);
    let multi = header_with_scan(0xc0, 1);
    let progressive = header_with_scan(0xc2, 1);
    // nvjpeg.h: "NVJPEG_BACKEND_HARDWARE : supports baseline JPEG bitstream with single scan".
    assert_eq!(
        supported_flag(h, &single),
        0,
        "single-scan baseline: hardware"
    );
    assert_eq!(
        supported_flag(h, &multi),
        1,
        "one scan per component: not hardware"
    );
    assert_eq!(supported_flag(h, &progressive), 1);
    // GPU_HYBRID decoders take baseline files, multi-scan ones too, never progressive ones
    // (nvImageCodec, DALI); HYBRID and DEFAULT take progressive files.
    let (default, hybrid, gpu_hybrid) = (0, 1, 2);
    assert_eq!(decoder_flag(h, gpu_hybrid, &single), 0);
    assert_eq!(decoder_flag(h, gpu_hybrid, &multi), 0);
    assert_eq!(decoder_flag(h, gpu_hybrid, &progressive), 1);
    assert_eq!(decoder_flag(h, hybrid, &progressive), 0);
    assert_eq!(decoder_flag(h, default, &progressive), 0);
}

#[test]
fn the_hardware_refuses_regions_where_configured_to() {
    let child = std::env::var_os("STOKER_NVJPEG_TEST_CHILD").is_some();
    if !child {
        let out = std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--exact",
                "the_hardware_refuses_regions_where_configured_to",
                "--nocapture",
            ])
            .env("STOKER_NVJPEG_TEST_CHILD", "1")
            .env("STOKER_EMU_NVJPEG_HARDWARE_ROI", "0")
            .output()
            .unwrap();
        let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
        assert!(
            out.status.success() && ran,
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
    std::env::set_var("STOKER_GPU_EMULATOR", "1");
    let (h, _) = setup(3);
    let baseline = jpeg(false);
    let stream_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegJpegStreamCreate");
    let parse: unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut c_void) -> R =
        sym(true, "nvjpegJpegStreamParseHeader");
    let params_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecodeParamsCreate");
    let set_roi: unsafe extern "C" fn(*mut c_void, c_int, c_int, c_int, c_int) -> R =
        sym(true, "nvjpegDecodeParamsSetROI");
    let check: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut c_int) -> R =
        sym(true, "nvjpegDecodeBatchedSupportedEx");
    let (mut js, mut p) = (null_mut(), null_mut());
    let (mut whole, mut region) = (-1, -1);
    // SAFETY: live handles and local out-parameters.
    unsafe {
        ok(stream_create(h, &mut js));
        ok(parse(h, baseline.as_ptr(), baseline.len(), js));
        ok(params_create(h, &mut p));
        ok(check(h, js, p, &mut whole));
        ok(set_roi(p, 2, 2, 8, 4));
        ok(check(h, js, p, &mut region));
    }
    assert_eq!(whole, 0, "the whole image is taken");
    assert_eq!(
        region,
        i32::from(child),
        "a region is refused only where configured"
    );
}

#[test]
fn a_hardware_handle_without_cores_takes_nothing() {
    if std::env::var_os("STOKER_NVJPEG_TEST_CHILD").is_some() {
        std::env::set_var("STOKER_GPU_EMULATOR", "1");
        let (h, _) = setup(3);
        let info: unsafe extern "C" fn(*mut c_void, *mut c_uint, *mut c_uint) -> R =
            sym(true, "nvjpegGetHardwareDecoderInfo");
        let (mut engines, mut cores) = (9, 9);
        // SAFETY: a live handle, local out-parameters.
        unsafe { ok(info(h, &mut engines, &mut cores)) };
        assert_eq!((engines, cores), (2, 0));
        assert_eq!(supported_flag(h, &jpeg(false)), 1, "no hardware decoder");
        return;
    }
    let config = r#"{"devices": [{"uuid": "GPU-57e0e3c0-0000-4000-8000-000000000000",
        "jpeg_engines": 2, "jpeg_cores_per_engine": 0}]}"#;
    let out = std::process::Command::new(std::env::current_exe().unwrap())
        .args([
            "--exact",
            "a_hardware_handle_without_cores_takes_nothing",
            "--nocapture",
        ])
        .env("STOKER_NVJPEG_TEST_CHILD", "1")
        .env("STOKER_EMU_CONFIG_CHILD", config)
        .output()
        .unwrap();
    let ran = String::from_utf8_lossy(&out.stdout).contains("1 passed");
    assert!(
        out.status.success() && ran,
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
