//! What the nvJPEG stand-in's tests share: both libraries opened as stoker opens them, a
//! handle and stream on device 0, small JPEGs and the queries several tests make.

// Test code: its casts are of small sizes chosen by the test (see contract.rs); each test
// binary uses some of these helpers.
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap,
    dead_code
)]

use std::ffi::{c_int, c_uint, c_void};
use std::path::PathBuf;
use std::ptr::null_mut;
use std::sync::OnceLock;

use libloading::Library;

pub(crate) type R = c_int;

pub(crate) fn built(name: &str) -> PathBuf {
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    [deps, deps.parent().unwrap()]
        .iter()
        .map(|d| d.join(format!("lib{name}.so")))
        .find(|p| p.is_file())
        .unwrap_or_else(|| panic!("lib{name}.so not built"))
}

pub(crate) struct Libs {
    pub(crate) cuda: Library,
    pub(crate) nvjpeg: Library,
}

/// Both stand-ins, with the environment a test process needs; a 200 ms delay per stream
/// operation so output that arrives before synchronisation would be seen.
pub(crate) fn libs() -> &'static Libs {
    static L: OnceLock<Libs> = OnceLock::new();
    L.get_or_init(|| {
        let cuda = built("stoker_emu_cuda");
        if std::env::var_os("STOKER_NVJPEG_TEST_CHILD").is_none() {
            std::env::set_var("STOKER_GPU_EMULATOR", "1");
        }
        std::env::set_var("STOKER_LIBCUDA", &cuda);
        std::env::set_var("STOKER_EMU_OP_DELAY_US", "200000");
        // A child process may be given a configuration of its own.
        match std::env::var_os("STOKER_EMU_CONFIG_CHILD") {
            Some(c) => std::env::set_var("STOKER_EMU_CONFIG", c),
            None => std::env::remove_var("STOKER_EMU_CONFIG"),
        }
        // SAFETY: the emulator libraries have no initialisers with preconditions.
        unsafe {
            Libs {
                cuda: Library::new(&cuda).unwrap(),
                nvjpeg: Library::new(built("stoker_emu_nvjpeg")).unwrap(),
            }
        }
    })
}

/// A symbol of the nvJPEG stand-in (`nv`) or of the driver.
pub(crate) fn sym<T: Copy>(nv: bool, name: &str) -> T {
    let l = libs();
    let lib = if nv { &l.nvjpeg } else { &l.cuda };
    // SAFETY: each use names the type nvjpeg.h / cuda.h declare.
    unsafe { *lib.get::<T>(name.as_bytes()).unwrap() }
}

#[track_caller]
pub(crate) fn ok(rc: R) {
    assert_eq!(rc, 0);
}

/// A handle on device 0 with `backend`, the context current on this thread, and a stream.
pub(crate) fn setup(backend: c_int) -> (*mut c_void, *mut c_void) {
    let init: unsafe extern "C" fn(c_uint) -> R = sym(false, "cuInit");
    let retain: unsafe extern "C" fn(*mut *mut c_void, c_int) -> R =
        sym(false, "cuDevicePrimaryCtxRetain");
    let set: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuCtxSetCurrent");
    let stream_create: unsafe extern "C" fn(*mut *mut c_void, c_uint) -> R =
        sym(false, "cuStreamCreate");
    let create: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        *mut c_void,
        c_uint,
        *mut *mut c_void,
    ) -> R = sym(true, "nvjpegCreateEx");
    let (mut ctx, mut s, mut h) = (null_mut(), null_mut(), null_mut());
    // SAFETY: local out-parameters.
    unsafe {
        ok(init(0));
        ok(retain(&mut ctx, 0));
        ok(set(ctx));
        ok(stream_create(&mut s, 1));
        ok(create(backend, null_mut(), null_mut(), 0, &mut h));
    }
    (h, s)
}

/// A small baseline JPEG: 16 x 8, 4:4:4, smooth colours (hand-made with libjpeg-turbo).
pub(crate) fn jpeg(progressive: bool) -> Vec<u8> {
    encode(progressive, |i| [(i * 2) as u8, 100, (255 - i) as u8])
}

/// A 16 x 8 4:4:4 JPEG of the pixels `rgb` gives for each index.
pub(crate) fn encode(progressive: bool, rgb: impl Fn(usize) -> [u8; 3]) -> Vec<u8> {
    use turbojpeg_sys as tj;
    let (w, h) = (16usize, 8usize);
    let rgb: Vec<u8> = (0..w * h).flat_map(rgb).collect();
    // SAFETY: (whole block) a fresh compressor; `rgb` is w * h * 3 bytes; the output buffer
    // is allocated by TurboJPEG and freed with tj3Free after copying.
    unsafe {
        let t = tj::tj3Init(tj::TJINIT_TJINIT_COMPRESS as c_int);
        tj::tj3Set(
            t,
            tj::TJPARAM_TJPARAM_SUBSAMP as c_int,
            tj::TJSAMP_TJSAMP_444 as c_int,
        );
        tj::tj3Set(t, tj::TJPARAM_TJPARAM_QUALITY as c_int, 95);
        tj::tj3Set(
            t,
            tj::TJPARAM_TJPARAM_PROGRESSIVE as c_int,
            c_int::from(progressive),
        );
        let mut out: *mut u8 = null_mut();
        let mut len: tj::size_t = 0;
        let rc = tj::tj3Compress8(
            t,
            rgb.as_ptr(),
            w as c_int,
            0,
            h as c_int,
            tj::TJPF_TJPF_RGB,
            &mut out,
            &mut len,
        );
        assert_eq!(rc, 0);
        let v = std::slice::from_raw_parts(out, len as usize).to_vec();
        tj::tj3Free(out.cast());
        tj::tj3Destroy(t);
        v
    }
}

/// A JPEG stream of `data`, its header parsed, and fresh decode parameters (no ROI): what a
/// "supported" query takes.
pub(crate) fn parsed_with_params(h: *mut c_void, data: &[u8]) -> (*mut c_void, *mut c_void) {
    let stream_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegJpegStreamCreate");
    let parse: unsafe extern "C" fn(*mut c_void, *const u8, usize, *mut c_void) -> R =
        sym(true, "nvjpegJpegStreamParseHeader");
    let params_create: unsafe extern "C" fn(*mut c_void, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecodeParamsCreate");
    let (mut js, mut p) = (null_mut(), null_mut());
    // SAFETY: a live handle and local out-parameters.
    unsafe {
        ok(stream_create(h, &mut js));
        ok(parse(h, data.as_ptr(), data.len(), js));
        ok(params_create(h, &mut p));
    }
    (js, p)
}

/// `nvjpegDecodeBatchedSupportedEx` on `data` with no ROI: nvJPEG's flag (0 = supported).
pub(crate) fn supported_flag(h: *mut c_void, data: &[u8]) -> c_int {
    let check: unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut c_int) -> R =
        sym(true, "nvjpegDecodeBatchedSupportedEx");
    let (js, p) = parsed_with_params(h, data);
    let mut flag = -1;
    // SAFETY: live handles and a local out-parameter.
    unsafe { ok(check(h, js, p, &mut flag)) };
    flag
}

/// Decodes `data` with one batched call on a hardware handle made with `flags`, into a fresh
/// 16 x 8 RGBI image; the call's status, then the stream's.
pub(crate) fn decode_with_flags(flags: c_uint, data: &[u8]) -> R {
    let (_, s) = setup(3);
    let create: unsafe extern "C" fn(
        c_int,
        *mut c_void,
        *mut c_void,
        c_uint,
        *mut *mut c_void,
    ) -> R = sym(true, "nvjpegCreateEx");
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
    let sync: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuStreamSynchronize");
    let (mut h, mut st, mut dev) = (null_mut(), null_mut(), 0u64);
    // SAFETY: (whole block) local out-parameters; `dev` holds one 16 x 8 RGBI image.
    unsafe {
        ok(create(3, null_mut(), null_mut(), flags, &mut h));
        ok(state_create(h, &mut st));
        ok(init(h, st, 1, 1, 5));
        ok(alloc(&mut dev, 16 * 8 * 3));
        let mut image = [0usize; 8];
        (image[0], image[4]) = (dev as usize, 48);
        let (ptrs, lens) = ([data.as_ptr()], [data.len()]);
        let rc = batched(h, st, ptrs.as_ptr(), lens.as_ptr(), &mut image, s);
        ok(sync(s));
        rc
    }
}
