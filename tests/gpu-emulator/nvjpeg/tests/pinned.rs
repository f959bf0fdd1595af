//! The decoupled transfer reads the state's attached pinned buffer on the CUDA stream (rule
//! 79): a host phase that writes that buffer before the stream got there is refused, while a
//! second pinned buffer attached in turn (nvImageCodec's double buffering) is taken, and the
//! first is free again once the stream has run the transfer.

mod support;

use std::ffi::{c_int, c_void};
use std::ptr::null_mut;
use std::sync::atomic::{AtomicBool, Ordering};

use support::*;

const HYBRID: c_int = 1;
const INVALID_PARAMETER: R = 2;

type Phase5 =
    unsafe extern "C" fn(*mut c_void, *mut c_void, *mut c_void, *mut c_void, *mut c_void) -> R;
type Attach = unsafe extern "C" fn(*mut c_void, *mut c_void) -> R;
type Create = unsafe extern "C" fn(*mut c_void, *mut c_void, *mut *mut c_void) -> R;

/// Held shut by the test: the stream's work behind it waits (no timing involved).
static OPEN: AtomicBool = AtomicBool::new(false);

extern "C" fn gate(_: *mut c_void) {
    while !OPEN.load(Ordering::Acquire) {
        std::thread::sleep(std::time::Duration::from_millis(1));
    }
}

/// A hybrid decoder's state with a device buffer, and two pinned buffers.
struct Decoupled {
    decoder: *mut c_void,
    state: *mut c_void,
    pinned: [*mut c_void; 2],
}

fn decoupled(h: *mut c_void) -> Decoupled {
    let decoder_create: unsafe extern "C" fn(*mut c_void, c_int, *mut *mut c_void) -> R =
        sym(true, "nvjpegDecoderCreate");
    let decoder_state: Create = sym(true, "nvjpegDecoderStateCreate");
    let pinned_create: Create = sym(true, "nvjpegBufferPinnedCreate");
    let device_create: Create = sym(true, "nvjpegBufferDeviceCreate");
    let attach_device: Attach = sym(true, "nvjpegStateAttachDeviceBuffer");
    let (mut decoder, mut state, mut device) = (null_mut(), null_mut(), null_mut());
    let mut pinned = [null_mut(); 2];
    // SAFETY: a live handle and local out-parameters.
    unsafe {
        ok(decoder_create(h, HYBRID, &mut decoder));
        ok(decoder_state(h, decoder, &mut state));
        for p in &mut pinned {
            ok(pinned_create(h, null_mut(), p));
        }
        ok(device_create(h, null_mut(), &mut device));
        ok(attach_device(state, device));
    }
    Decoupled {
        decoder,
        state,
        pinned,
    }
}

#[test]
fn a_pinned_buffer_is_written_again_only_after_its_transfer_ran() {
    let (h, s) = setup(HYBRID);
    let d = decoupled(h);
    let data = jpeg(false);
    let launch: unsafe extern "C" fn(*mut c_void, extern "C" fn(*mut c_void), *mut c_void) -> R =
        sym(false, "cuLaunchHostFunc");
    let sync: unsafe extern "C" fn(*mut c_void) -> R = sym(false, "cuStreamSynchronize");
    let transfer: Phase5 = sym(true, "nvjpegDecodeJpegTransferToDevice");
    // The stream waits at the gate: every transfer enqueued behind it stays pending.
    // SAFETY: a live stream and a host function that takes no data.
    ok(unsafe { launch(s, gate, null_mut()) });
    // Attaches pinned buffer `b`, parses, runs the host phase and (if it ran) the transfer on
    // `s`: the host phase's status.
    let with_stream = |b: usize| {
        let attach: Attach = sym(true, "nvjpegStateAttachPinnedBuffer");
        let parse: unsafe extern "C" fn(
            *mut c_void,
            *const u8,
            usize,
            c_int,
            c_int,
            *mut c_void,
        ) -> R = sym(true, "nvjpegJpegStreamParse");
        let host: Phase5 = sym(true, "nvjpegDecodeJpegHost");
        let (js, p) = parsed_with_params(h, &data);
        // SAFETY: live handles; `data` outlives the calls (the stream is synchronised below).
        unsafe {
            ok(attach(d.state, d.pinned[b]));
            ok(parse(h, data.as_ptr(), data.len(), 0, 0, js));
            let rc = host(h, d.decoder, d.state, p, js);
            if rc == 0 {
                ok(transfer(h, d.decoder, d.state, js, s));
            }
            rc
        }
    };
    ok(with_stream(0));
    assert_eq!(
        with_stream(0),
        INVALID_PARAMETER,
        "buffer 0 written while its transfer is pending"
    );
    ok(with_stream(1));
    OPEN.store(true, Ordering::Release);
    // SAFETY: a live stream.
    ok(unsafe { sync(s) });
    ok(with_stream(0));
    // SAFETY: a live stream.
    ok(unsafe { sync(s) });
}
