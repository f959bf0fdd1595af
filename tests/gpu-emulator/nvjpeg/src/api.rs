//! nvJPEG's library, handle, state, stream, parameter, decoder and buffer calls.

use std::ffi::{c_int, c_uchar, c_uint, c_void};

use crate::decode::{OutputFormat, Roi};
use crate::header::{self, Path};
use crate::objects::*;
use crate::status::{self, Status};

/// Environment variable that must be `1` for the emulator to do anything.
pub const GATE_ENV: &str = "STOKER_GPU_EMULATOR";

/// Runs one exported call: the gate, then `f`, with panics caught.
pub fn call(name: &str, f: impl FnOnce() -> Result<(), Status>) -> Status {
    if std::env::var(GATE_ENV).as_deref() != Ok("1") {
        eprintln!("stoker nvJPEG emulator: refusing {name}: {GATE_ENV}=1 is not set (this library is a stand-in for libnvjpeg, for tests only)");
        return status::NOT_INITIALIZED;
    }
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(Ok(())) => status::SUCCESS,
        Ok(Err(s)) => s,
        Err(_) => {
            eprintln!("stoker nvJPEG emulator: internal panic in {name}");
            status::INTERNAL_ERROR
        }
    }
}

/// Writes through an out-parameter; null is `NVJPEG_STATUS_INVALID_PARAMETER`.
///
/// # Safety
/// `p` must be null or valid for a write of `T`.
pub unsafe fn out<T>(p: *mut T, v: T) -> Result<(), Status> {
    if p.is_null() {
        return Err(status::INVALID_PARAMETER);
    }
    // SAFETY: non-null and valid by the caller's promise.
    unsafe { p.write(v) };
    Ok(())
}

/// The bytes of a bitstream argument.
///
/// # Safety
/// `data` must be null or point at `len` readable bytes.
pub unsafe fn bytes<'a>(data: *const c_uchar, len: usize) -> Result<&'a [u8], Status> {
    if data.is_null() || len == 0 {
        return Err(status::INVALID_PARAMETER);
    }
    // SAFETY: the caller's promise.
    Ok(unsafe { std::slice::from_raw_parts(data, len) })
}

#[no_mangle]
pub extern "C" fn nvjpegGetProperty(kind: c_int, value: *mut c_int) -> Status {
    call("nvjpegGetProperty", || {
        let v = match kind {
            0 => 13,
            1 | 2 => 0,
            _ => return Err(status::INVALID_PARAMETER),
        };
        // SAFETY: out-parameter from the caller.
        unsafe { out(value, v) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegCreateEx(
    backend: c_int,
    _dev_alloc: *mut c_void,
    _pinned_alloc: *mut c_void,
    flags: c_uint,
    handle: *mut *mut c_void,
) -> Status {
    call("nvjpegCreateEx", || {
        if flags != 0 || !(0..=6).contains(&backend) {
            return Err(status::INVALID_PARAMETER);
        }
        let (_, engines, cores) = crate::cuda::current_device()?;
        if backend == BACKEND_HARDWARE && engines == 0 {
            return Err(status::ARCH_MISMATCH);
        }
        let h = reg().insert(Object::Handle(HandleObj {
            backend,
            engines,
            cores,
        }));
        // SAFETY: out-parameter from the caller.
        unsafe { out(handle, h) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDestroy(h: *mut c_void) -> Status {
    call("nvjpegDestroy", || {
        reg().remove(h, |o| matches!(o, Object::Handle(_)))
    })
}

#[no_mangle]
pub extern "C" fn nvjpegGetHardwareDecoderInfo(
    h: *mut c_void,
    engines: *mut c_uint,
    cores: *mut c_uint,
) -> Status {
    call("nvjpegGetHardwareDecoderInfo", || {
        let mut r = reg();
        let x = r.handle(h)?;
        if x.backend != BACKEND_HARDWARE {
            return Err(status::INVALID_PARAMETER);
        }
        // SAFETY: out-parameters from the caller.
        unsafe {
            out(engines, x.engines)?;
            out(cores, x.cores)
        }
    })
}

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
        pinned: false,
        device: false,
        phase: Phase::Idle,
    })
}

#[no_mangle]
pub extern "C" fn nvjpegJpegStateCreate(h: *mut c_void, state: *mut *mut c_void) -> Status {
    call("nvjpegJpegStateCreate", || {
        let mut r = reg();
        r.handle(h)?;
        let s = r.insert(new_state());
        // SAFETY: out-parameter from the caller.
        unsafe { out(state, s) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecoderStateCreate(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut *mut c_void,
) -> Status {
    call("nvjpegDecoderStateCreate", || {
        let mut r = reg();
        r.handle(h)?;
        r.decoder(decoder)?;
        let s = r.insert(new_state());
        // SAFETY: out-parameter from the caller.
        unsafe { out(state, s) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegJpegStateDestroy(state: *mut c_void) -> Status {
    call("nvjpegJpegStateDestroy", || {
        reg().remove(state, |o| matches!(o, Object::State(_)))
    })
}

#[no_mangle]
pub extern "C" fn nvjpegJpegStreamCreate(h: *mut c_void, stream: *mut *mut c_void) -> Status {
    call("nvjpegJpegStreamCreate", || {
        let mut r = reg();
        r.handle(h)?;
        let s = r.insert(Object::Stream(None));
        // SAFETY: out-parameter from the caller.
        unsafe { out(stream, s) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegJpegStreamDestroy(stream: *mut c_void) -> Status {
    call("nvjpegJpegStreamDestroy", || {
        reg().remove(stream, |o| matches!(o, Object::Stream(_)))
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

#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsCreate(h: *mut c_void, params: *mut *mut c_void) -> Status {
    call("nvjpegDecodeParamsCreate", || {
        let mut r = reg();
        r.handle(h)?;
        let p = r.insert(Object::Params(ParamsObj {
            format: OutputFormat::Rgbi,
            roi: None,
        }));
        // SAFETY: out-parameter from the caller.
        unsafe { out(params, p) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsDestroy(params: *mut c_void) -> Status {
    call("nvjpegDecodeParamsDestroy", || {
        reg().remove(params, |o| matches!(o, Object::Params(_)))
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeParamsSetOutputFormat(params: *mut c_void, format: c_int) -> Status {
    call("nvjpegDecodeParamsSetOutputFormat", || {
        let f = OutputFormat::from_raw(format)?;
        reg().params(params)?.format = f;
        Ok(())
    })
}

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
            BACKEND_DEFAULT | BACKEND_HYBRID | BACKEND_GPU_HYBRID => BACKEND_GPU_HYBRID,
            BACKEND_HARDWARE if engines > 0 => BACKEND_HARDWARE,
            BACKEND_HARDWARE => return Err(status::ARCH_MISMATCH),
            _ => return Err(status::INVALID_PARAMETER),
        };
        let d = r.insert(Object::Decoder(backend));
        // SAFETY: out-parameter from the caller.
        unsafe { out(decoder, d) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecoderDestroy(decoder: *mut c_void) -> Status {
    call("nvjpegDecoderDestroy", || {
        reg().remove(decoder, |o| matches!(o, Object::Decoder(_)))
    })
}

/// Whether `path` can decode the parsed `stream` with `params`' ROI: 0 yes (nvJPEG's
/// convention), 1 no.
fn supported(
    stream: *mut c_void,
    params: *mut c_void,
    path: Path,
    flag: *mut c_int,
) -> Result<(), Status> {
    let mut r = reg();
    let roi = r.params(params)?.roi;
    let s = r.stream(stream)?;
    let fits = roi.is_none_or(|q| q.x + q.w <= s.header.width && q.y + q.h <= s.header.height);
    let ok = s.header.supported_by(path) && fits;
    // SAFETY: out-parameter from the caller.
    unsafe { out(flag, c_int::from(!ok)) }
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeBatchedSupportedEx(
    h: *mut c_void,
    stream: *mut c_void,
    params: *mut c_void,
    flag: *mut c_int,
) -> Status {
    call("nvjpegDecodeBatchedSupportedEx", || {
        let backend = reg().handle(h)?.backend;
        let path = if backend == BACKEND_HARDWARE {
            Path::Hardware
        } else {
            Path::Hybrid
        };
        supported(stream, params, path, flag)
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecoderJpegSupported(
    decoder: *mut c_void,
    stream: *mut c_void,
    params: *mut c_void,
    flag: *mut c_int,
) -> Status {
    call("nvjpegDecoderJpegSupported", || {
        let backend = reg().decoder(decoder)?;
        let path = if backend == BACKEND_HARDWARE {
            Path::Hardware
        } else {
            Path::Hybrid
        };
        supported(stream, params, path, flag)
    })
}

#[no_mangle]
pub extern "C" fn nvjpegBufferPinnedCreate(
    h: *mut c_void,
    _alloc: *mut c_void,
    buf: *mut *mut c_void,
) -> Status {
    call("nvjpegBufferPinnedCreate", || {
        let mut r = reg();
        r.handle(h)?;
        let b = r.insert(Object::Pinned);
        // SAFETY: out-parameter from the caller.
        unsafe { out(buf, b) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegBufferDeviceCreate(
    h: *mut c_void,
    _alloc: *mut c_void,
    buf: *mut *mut c_void,
) -> Status {
    call("nvjpegBufferDeviceCreate", || {
        let mut r = reg();
        r.handle(h)?;
        let b = r.insert(Object::Device);
        // SAFETY: out-parameter from the caller.
        unsafe { out(buf, b) }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegBufferPinnedDestroy(buf: *mut c_void) -> Status {
    call("nvjpegBufferPinnedDestroy", || {
        reg().remove(buf, |o| matches!(o, Object::Pinned))
    })
}

#[no_mangle]
pub extern "C" fn nvjpegBufferDeviceDestroy(buf: *mut c_void) -> Status {
    call("nvjpegBufferDeviceDestroy", || {
        reg().remove(buf, |o| matches!(o, Object::Device))
    })
}

#[no_mangle]
pub extern "C" fn nvjpegStateAttachPinnedBuffer(state: *mut c_void, buf: *mut c_void) -> Status {
    call("nvjpegStateAttachPinnedBuffer", || {
        let mut r = reg();
        if !matches!(r.get(buf)?, Object::Pinned) {
            return Err(status::INVALID_PARAMETER);
        }
        r.state(state)?.pinned = true;
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvjpegStateAttachDeviceBuffer(state: *mut c_void, buf: *mut c_void) -> Status {
    call("nvjpegStateAttachDeviceBuffer", || {
        let mut r = reg();
        if !matches!(r.get(buf)?, Object::Device) {
            return Err(status::INVALID_PARAMETER);
        }
        r.state(state)?.device = true;
        Ok(())
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
