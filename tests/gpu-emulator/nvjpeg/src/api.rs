//! nvJPEG's library, handle, state, stream, parameter, decoder and buffer calls.

use std::ffi::{c_int, c_uchar, c_uint, c_void};

use crate::decode::{OutputFormat, Roi};
use crate::header::{self, Path};
use crate::objects::*;
use stoker_emu_ffi::Boundary;

use crate::status::{self, Status};

/// Environment variable that must be `1` for the emulator to do anything.
const GATE_ENV: &str = "STOKER_GPU_EMULATOR";

/// nvJPEG's statuses at the C boundary (a panic is `NVJPEG_STATUS_INTERNAL_ERROR`).
const BOUNDARY: Boundary<Status> = Boundary {
    library: "stoker nvJPEG emulator",
    success: status::SUCCESS,
    null_pointer: status::INVALID_PARAMETER,
    panicked: status::INTERNAL_ERROR,
};

/// Runs one exported call: the gate, then `f`, with panics caught.
pub(crate) fn call(name: &str, f: impl FnOnce() -> Result<(), Status>) -> Status {
    if std::env::var(GATE_ENV).as_deref() != Ok("1") {
        eprintln!("stoker nvJPEG emulator: refusing {name}: {GATE_ENV}=1 is not set (this library is a stand-in for libnvjpeg, for tests only)");
        return status::NOT_INITIALIZED;
    }
    BOUNDARY.guarded(name, f)
}

/// Writes through an out-parameter; null is `NVJPEG_STATUS_INVALID_PARAMETER`.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
pub(crate) unsafe fn out<T>(p: *mut T, v: T) -> Result<(), Status> {
    // SAFETY: the caller's promise.
    unsafe { BOUNDARY.write_out(p, v) }
}

/// Makes `object` under the library handle `h` and hands it out through `made`.
fn create(h: *mut c_void, object: Object, made: *mut *mut c_void) -> Result<(), Status> {
    let mut r = reg();
    r.handle(h)?;
    let p = r.insert(object);
    // SAFETY: out-parameter from the caller.
    unsafe { out(made, p) }
}

/// Exports `nvjpeg*Destroy` calls: each removes one object of its own kind.
macro_rules! destroy {
    ($($call:ident: $kind:pat),* $(,)?) => {$(
        #[doc = concat!("`", stringify!($call), "`: destroys one object of its own kind; another kind, or one \
                         already destroyed, is `NVJPEG_STATUS_INVALID_PARAMETER`.")]
        #[no_mangle]
        pub extern "C" fn $call(object: *mut c_void) -> Status {
            call(stringify!($call), || reg().remove(object, |o| matches!(o, $kind)))
        }
    )*};
}

destroy! {
    nvjpegDestroy: Object::Handle(_),
    nvjpegJpegStateDestroy: Object::State(_),
    nvjpegJpegStreamDestroy: Object::Stream(_),
    nvjpegDecodeParamsDestroy: Object::Params(_),
    nvjpegDecoderDestroy: Object::Decoder(_),
    nvjpegBufferPinnedDestroy: Object::Pinned(_),
    nvjpegBufferDeviceDestroy: Object::Device,
}

/// The bytes of a bitstream argument.
///
/// # Safety
/// `data` must be null or point at `len` readable bytes.
pub(crate) unsafe fn bytes<'a>(data: *const c_uchar, len: usize) -> Result<&'a [u8], Status> {
    if data.is_null() || len == 0 {
        return Err(status::INVALID_PARAMETER);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

/// `nvjpegGetProperty`: this stand-in's major (its soname's, else 13), minor or patch (0).
#[no_mangle]
pub extern "C" fn nvjpegGetProperty(kind: c_int, value: *mut c_int) -> Status {
    call("nvjpegGetProperty", || {
        let (major, minor, patch) = crate::version::version();
        let v = match kind {
            0 => major,
            1 => minor,
            2 => patch,
            _ => return Err(status::INVALID_PARAMETER),
        };
        // SAFETY: out-parameter from the caller.
        unsafe { out(value, v) }
    })
}

/// `NVJPEG_FLAGS_BITSTREAM_STRICT` (nvjpeg.h: `1<<2`).
const FLAGS_BITSTREAM_STRICT: c_uint = 4;

/// The flags nvjpeg.h defines (`NVJPEG_FLAGS_DEFAULT` 0 to
/// `NVJPEG_FLAGS_UPSAMPLING_WITH_INTERPOLATION` 32); only the strict one changes what the
/// emulator does.
const FLAGS_KNOWN: c_uint = 63;

/// `nvjpegCreateEx`: a library handle for `backend` on the current device (allocators accepted,
/// not used); `NVJPEG_FLAGS_BITSTREAM_STRICT` makes its decodes strict, a driver of an older
/// CUDA major is `NVJPEG_STATUS_EXECUTION_FAILED`, hardware on a device without engines
/// `NVJPEG_STATUS_ARCH_MISMATCH`.
#[no_mangle]
pub extern "C" fn nvjpegCreateEx(
    backend: c_int,
    _dev_alloc: *mut c_void,
    _pinned_alloc: *mut c_void,
    flags: c_uint,
    handle: *mut *mut c_void,
) -> Status {
    call("nvjpegCreateEx", || {
        if flags & !FLAGS_KNOWN != 0 || !(0..=6).contains(&backend) {
            return Err(status::INVALID_PARAMETER);
        }
        crate::version::check_driver()?;
        let (device, engines, cores) = crate::cuda::current_device()?;
        if backend == BACKEND_HARDWARE && engines == 0 {
            return Err(status::ARCH_MISMATCH);
        }
        let h = reg().insert(Object::Handle(HandleObj {
            backend,
            device,
            strict: flags & FLAGS_BITSTREAM_STRICT != 0,
            engines,
            cores,
        }));
        // SAFETY: out-parameter from the caller.
        unsafe { out(handle, h) }
    })
}

/// `nvjpegGetHardwareDecoderInfo`: the hardware engines of the handle's device and the cores of
/// each (the emulator's configuration), for a handle of any backend.
#[no_mangle]
pub extern "C" fn nvjpegGetHardwareDecoderInfo(
    h: *mut c_void,
    engines: *mut c_uint,
    cores: *mut c_uint,
) -> Status {
    call("nvjpegGetHardwareDecoderInfo", || {
        let mut r = reg();
        // Any handle reports the device's engines: a real nvJPEG 13.0.1 did for HYBRID and
        // GPU_HYBRID handles (docs/results/gpu-check-2026-11-26-h100/probe.json).
        let x = r.handle(h)?;
        // SAFETY: out-parameters from the caller.
        unsafe {
            out(engines, x.engines)?;
            out(cores, x.cores)
        }
    })
}

/// `nvjpegGetImageInfo`: the components, the chroma subsampling (`nvjpegChromaSubsampling_t`)
/// and the width and height of each of 4 components (0 past the last), from the header.
#[no_mangle]
pub extern "C" fn nvjpegGetImageInfo(
    h: *mut c_void,
    data: *const c_uchar,
    len: usize,
    ncomp: *mut c_int,
    subsampling: *mut c_int,
    widths: *mut c_int,
    heights: *mut c_int,
) -> Status {
    call("nvjpegGetImageInfo", || {
        reg().handle(h)?;
        // SAFETY: the caller passes `len` bytes.
        let b = unsafe { bytes(data, len) }?;
        let hd = header::parse(b).ok_or(status::BAD_JPEG)?;
        if widths.is_null() || heights.is_null() {
            return Err(status::INVALID_PARAMETER);
        }
        // SAFETY: out-parameters from the caller; widths and heights hold 4 ints each.
        unsafe {
            out(ncomp, hd.sampling.len() as c_int)?;
            out(subsampling, hd.subsampling() as c_int)?;
            for c in 0..4 {
                let (w, ht) = if c < hd.sampling.len() {
                    hd.component_size(c)
                } else {
                    (0, 0)
                };
                *widths.add(c) = w as c_int;
                *heights.add(c) = ht as c_int;
            }
        }
        Ok(())
    })
}

fn new_state() -> Object {
    Object::State(StateObj {
        batch: None,
        pending: Default::default(),
        pinned: None,
        device: false,
        phase: Phase::Idle,
        doomed: None,
        thread: None,
    })
}

/// `nvjpegJpegStateCreate`: a JPEG state (`nvjpegJpegState_t`) for the batched calls.
#[no_mangle]
pub extern "C" fn nvjpegJpegStateCreate(h: *mut c_void, state: *mut *mut c_void) -> Status {
    call("nvjpegJpegStateCreate", || create(h, new_state(), state))
}

/// `nvjpegDecoderStateCreate`: a JPEG state for one decoupled decoder's phases.
#[no_mangle]
pub extern "C" fn nvjpegDecoderStateCreate(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut *mut c_void,
) -> Status {
    call("nvjpegDecoderStateCreate", || {
        reg().decoder(decoder)?;
        create(h, new_state(), state)
    })
}

/// `nvjpegJpegStreamCreate`: a bitstream object (`nvjpegJpegStream_t`), usable once parsed.
#[no_mangle]
pub extern "C" fn nvjpegJpegStreamCreate(h: *mut c_void, stream: *mut *mut c_void) -> Status {
    call("nvjpegJpegStreamCreate", || {
        create(h, Object::Stream(None), stream)
    })
}

fn parse_into(
    h: *mut c_void,
    data: *const c_uchar,
    len: usize,
    stream: *mut c_void,
) -> Result<(), Status> {
    let mut r = reg();
    r.handle(h)?;
    // SAFETY: the caller passes `len` bytes.
    let b = unsafe { bytes(data, len) }?;
    let header = header::parse(b).ok_or(status::BAD_JPEG)?;
    match r.get(stream)? {
        Object::Stream(s) => {
            *s = Some(StreamObj {
                data: b.to_vec(),
                header,
            });
            Ok(())
        }
        _ => Err(status::INVALID_PARAMETER),
    }
}

/// `nvjpegJpegStreamParse`: keeps a copy of the bitstream and its header (the metadata and
/// stream flags change nothing).
#[no_mangle]
pub extern "C" fn nvjpegJpegStreamParse(
    h: *mut c_void,
    data: *const c_uchar,
    len: usize,
    _save_metadata: c_int,
    _save_stream: c_int,
    stream: *mut c_void,
) -> Status {
    call("nvjpegJpegStreamParse", || parse_into(h, data, len, stream))
}

/// `nvjpegJpegStreamParseHeader`: as `nvjpegJpegStreamParse`; the whole bitstream is kept.
#[no_mangle]
pub extern "C" fn nvjpegJpegStreamParseHeader(
    h: *mut c_void,
    data: *const c_uchar,
    len: usize,
    stream: *mut c_void,
) -> Status {
    call("nvjpegJpegStreamParseHeader", || {
        parse_into(h, data, len, stream)
    })
}

/// `nvjpegDecodeParamsCreate`: decode parameters (`nvjpegDecodeParams_t`): interleaved RGB and
/// the whole image until set.
#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsCreate(h: *mut c_void, params: *mut *mut c_void) -> Status {
    let defaults = ParamsObj {
        format: OutputFormat::Rgbi,
        roi: None,
    };
    call("nvjpegDecodeParamsCreate", || {
        create(h, Object::Params(defaults), params)
    })
}

/// `nvjpegDecodeParamsSetOutputFormat`: the `nvjpegOutputFormat_t` written; `UNCHANGED` and
/// `YUV` are `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED`.
#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsSetOutputFormat(params: *mut c_void, format: c_int) -> Status {
    call("nvjpegDecodeParamsSetOutputFormat", || {
        let f = OutputFormat::from_raw(format)?;
        reg().params(params)?.format = f;
        Ok(())
    })
}

/// `nvjpegDecodeParamsSetROI`: the region decoded (x, y, width, height in pixels); (0, 0, -1, -1)
/// is the whole image.
#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsSetROI(
    params: *mut c_void,
    x: c_int,
    y: c_int,
    w: c_int,
    h: c_int,
) -> Status {
    call("nvjpegDecodeParamsSetROI", || {
        let roi = match (x, y, w, h) {
            (0, 0, -1, -1) => None,
            _ if x < 0 || y < 0 || w <= 0 || h <= 0 => return Err(status::INVALID_PARAMETER),
            _ => Some(Roi {
                x: x as u32,
                y: y as u32,
                w: w as u32,
                h: h as u32,
            }),
        };
        reg().params(params)?.roi = roi;
        Ok(())
    })
}

/// `nvjpegDecoderCreate`: a decoupled decoder (`nvjpegJpegDecoder_t`) for `backend`; the default
/// is the hybrid decoder, hardware on a device without engines `NVJPEG_STATUS_ARCH_MISMATCH`.
#[no_mangle]
pub extern "C" fn nvjpegDecoderCreate(
    h: *mut c_void,
    backend: c_int,
    decoder: *mut *mut c_void,
) -> Status {
    call("nvjpegDecoderCreate", || {
        let mut r = reg();
        let engines = r.handle(h)?.engines;
        let backend = match backend {
            // The default decoupled decoder is the hybrid one (torchvision decodes progressive
            // files with it).
            BACKEND_DEFAULT | BACKEND_HYBRID => BACKEND_HYBRID,
            BACKEND_GPU_HYBRID => BACKEND_GPU_HYBRID,
            BACKEND_HARDWARE if engines > 0 => BACKEND_HARDWARE,
            BACKEND_HARDWARE => return Err(status::ARCH_MISMATCH),
            _ => return Err(status::INVALID_PARAMETER),
        };
        let d = r.insert(Object::Decoder(backend));
        // SAFETY: out-parameter from the caller.
        unsafe { out(decoder, d) }
    })
}

/// `STOKER_EMU_NVJPEG_HARDWARE_ROI=0`: the hardware engines refuse every region of interest
/// (a GPU or an nvJPEG without hardware ROI decode: nvImageCodec's `hw_decoder.cpp` reports
/// `ROI_UNSUPPORTED` where `nvjpegDecodeBatchedEx` is missing).
pub(crate) fn hardware_takes_roi() -> bool {
    std::env::var("STOKER_EMU_NVJPEG_HARDWARE_ROI").as_deref() != Ok("0")
}

/// Whether a decoder made for `backend` can decode the parsed `stream` with `params`' ROI:
/// 0 yes (nvJPEG's convention), 1 no. `cores`: the hardware cores behind the handle (a
/// hardware handle reporting 0 has no decoder: "Return value of 0 indicates that hardware
/// decoder is not available", `nvjpegGetHardwareDecoderInfo`).
fn supported(
    stream: *mut c_void,
    params: *mut c_void,
    backend: c_int,
    cores: u32,
    flag: *mut c_int,
) -> Result<(), Status> {
    let mut r = reg();
    let roi = r.params(params)?.roi;
    let s = r.stream(stream)?;
    let fits = roi.is_none_or(|q| q.x + q.w <= s.header.width && q.y + q.h <= s.header.height);
    let path = decode_path(backend);
    let hardware_ok =
        path != Path::Hardware || (cores > 0 && (roi.is_none() || hardware_takes_roi()));
    let ok = header::supported_by(&s.header, path)
        && header::backend_takes(&s.header, backend)
        && fits
        && hardware_ok;
    // SAFETY: out-parameter from the caller.
    unsafe { out(flag, c_int::from(!ok)) }
}

/// `nvjpegDecodeBatchedSupportedEx`: whether the handle's backend decodes the parsed stream with
/// the parameters' region of interest, as nvJPEG writes it: 0 supported, 1 not.
#[no_mangle]
pub extern "C" fn nvjpegDecodeBatchedSupportedEx(
    h: *mut c_void,
    stream: *mut c_void,
    params: *mut c_void,
    flag: *mut c_int,
) -> Status {
    call("nvjpegDecodeBatchedSupportedEx", || {
        let (backend, cores) = {
            let mut r = reg();
            let x = r.handle(h)?;
            (x.backend, x.engines * x.cores)
        };
        supported(stream, params, backend, cores, flag)
    })
}

/// `nvjpegDecoderJpegSupported`: whether the decoupled decoder takes the parsed stream with the
/// parameters' region of interest: 0 supported, 1 not.
#[no_mangle]
pub extern "C" fn nvjpegDecoderJpegSupported(
    decoder: *mut c_void,
    stream: *mut c_void,
    params: *mut c_void,
    flag: *mut c_int,
) -> Status {
    call("nvjpegDecoderJpegSupported", || {
        let backend = reg().decoder(decoder)?;
        supported(stream, params, backend, 1, flag)
    })
}

/// `nvjpegBufferPinnedCreate`: a pinned buffer (`nvjpegBufferPinned_t`) to attach to a state;
/// nothing is allocated.
#[no_mangle]
pub extern "C" fn nvjpegBufferPinnedCreate(
    h: *mut c_void,
    _alloc: *mut c_void,
    buf: *mut *mut c_void,
) -> Status {
    call("nvjpegBufferPinnedCreate", || {
        create(h, Object::Pinned(Default::default()), buf)
    })
}

/// `nvjpegBufferDeviceCreate`: a device buffer (`nvjpegBufferDevice_t`) to attach to a state;
/// nothing is allocated.
#[no_mangle]
pub extern "C" fn nvjpegBufferDeviceCreate(
    h: *mut c_void,
    _alloc: *mut c_void,
    buf: *mut *mut c_void,
) -> Status {
    call("nvjpegBufferDeviceCreate", || {
        create(h, Object::Device, buf)
    })
}

/// The kinds of buffer a state takes.
#[derive(Clone, Copy)]
enum Buffer {
    Pinned,
    Device,
}

/// Attaches `buf` to `state`, once `buf` is a buffer of the kind named.
fn attach(state: *mut c_void, buf: *mut c_void, kind: Buffer) -> Result<(), Status> {
    let mut r = reg();
    let pinned = match (r.get(buf)?, kind) {
        (Object::Pinned(transfers), Buffer::Pinned) => Some(transfers.clone()),
        (Object::Device, Buffer::Device) => None,
        _ => return Err(status::INVALID_PARAMETER),
    };
    let s = r.state(state)?;
    match kind {
        Buffer::Pinned => s.pinned = pinned,
        Buffer::Device => s.device = true,
    }
    Ok(())
}

/// `nvjpegStateAttachPinnedBuffer`: attaches a pinned buffer to a state (optional: without
/// one the host phase uses heap memory).
#[no_mangle]
pub extern "C" fn nvjpegStateAttachPinnedBuffer(state: *mut c_void, buf: *mut c_void) -> Status {
    call("nvjpegStateAttachPinnedBuffer", || {
        attach(state, buf, Buffer::Pinned)
    })
}

/// `nvjpegStateAttachDeviceBuffer`: attaches a device buffer to a state; the transfer phase
/// needs one.
#[no_mangle]
pub extern "C" fn nvjpegStateAttachDeviceBuffer(state: *mut c_void, buf: *mut c_void) -> Status {
    call("nvjpegStateAttachDeviceBuffer", || {
        attach(state, buf, Buffer::Device)
    })
}

/// Emulator only: which path last decoded these bytes: 0 none, 1 hardware, 2 hybrid.
#[no_mangle]
pub extern "C" fn stoker_emu_nvjpeg_path(data: *const c_uchar, len: usize) -> c_int {
    // SAFETY: the caller passes `len` bytes.
    let Ok(b) = (unsafe { bytes(data, len) }) else {
        return 0;
    };
    reg().paths.get(&fnv1a(b)).map_or(0, |p| *p as c_int)
}
