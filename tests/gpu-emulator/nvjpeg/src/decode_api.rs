//! nvJPEG's decode calls: batched (the hardware engines) and decoupled (the GPU-hybrid path:
//! host, transfer, device phases).
//!
//! # Design
//! The bitstream is decoded during the call (so corrupt or unsupported input is reported by
//! the call, with nvJPEG's statuses), and the pixels reach the caller's device memory through
//! a host function on the caller's CUDA stream: before that stream is synchronised the output
//! is not there. Each decoded image is recorded with its path (`stoker_emu_nvjpeg_path`).

use std::ffi::{c_int, c_uchar, c_void};

use crate::api::{bytes, call};
use crate::cuda::{enqueue, Write};
use crate::decode::{decode, Mode, OutputFormat, Planes};
use crate::header::{self, Path, Stage};
use crate::objects::*;
use crate::status::{self, Status};

/// `nvjpegImage_t`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct NvjpegImage {
    pub channel: [*mut u8; 4],
    pub pitch: [usize; 4],
}

fn writes(p: Planes, img: &NvjpegImage) -> Result<Vec<Write>, Status> {
    let mut out = Vec::new();
    for (i, (data, row_bytes)) in p.planes.into_iter().enumerate() {
        let (dst, pitch) = (img.channel[i] as u64, img.pitch[i]);
        if dst == 0 || pitch < row_bytes {
            return Err(status::INVALID_PARAMETER);
        }
        debug_assert_eq!(data.len(), row_bytes * p.rows);
        out.push(Write {
            dst,
            pitch,
            row_bytes,
            data,
        });
    }
    Ok(out)
}

/// Decodes one image on `path` (strictly with a strict handle): `JPEG_NOT_SUPPORTED` if that
/// path cannot take it.
fn decode_on(jpeg: &[u8], path: Path, params: ParamsObj, strict: bool) -> Result<Planes, Status> {
    let hd = header::parse(jpeg).ok_or(status::BAD_JPEG)?;
    if !header::supported_by(&hd, path) {
        return Err(status::JPEG_NOT_SUPPORTED);
    }
    let mode = Mode {
        strict,
        wrong_colours: header::wrong_colours(&hd),
    };
    decode(jpeg, (hd.width, hd.height), params.roi, params.format, mode)
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeBatchedInitialize(
    h: *mut c_void,
    state: *mut c_void,
    batch: c_int,
    _max_cpu_threads: c_int,
    format: c_int,
) -> Status {
    call("nvjpegDecodeBatchedInitialize", || {
        let f = OutputFormat::from_raw(format)?;
        let mut r = reg();
        r.handle(h)?;
        if batch <= 0 {
            return Err(status::INVALID_PARAMETER);
        }
        r.state(state)?.batch = Some((batch as usize, f));
        Ok(())
    })
}

/// The batched decode shared by `nvjpegDecodeBatched` and `nvjpegDecodeBatchedEx`.
fn batched(
    h: *mut c_void,
    state: *mut c_void,
    data: *const *const c_uchar,
    lengths: *const usize,
    images: *mut NvjpegImage,
    params: Option<*mut *mut c_void>,
    stream: *mut c_void,
) -> Result<(), Status> {
    let (path, n, per_image, strict) = {
        let mut r = reg();
        let (backend, strict) = {
            let x = r.handle(h)?;
            (x.backend, x.strict)
        };
        let (n, format) = r.state(state)?.batch.ok_or(status::INVALID_PARAMETER)?;
        let path = decode_path(backend);
        let mut per_image = vec![ParamsObj { format, roi: None }; n];
        if let Some(p) = params {
            if p.is_null() {
                return Err(status::INVALID_PARAMETER);
            }
            for (i, slot) in per_image.iter_mut().enumerate() {
                // SAFETY: the caller passes `n` parameter handles.
                *slot = *r.params(unsafe { *p.add(i) })?;
            }
        }
        (path, n, per_image, strict)
    };
    if data.is_null() || lengths.is_null() || images.is_null() {
        return Err(status::INVALID_PARAMETER);
    }
    let mut all = Vec::new();
    let mut decoded = Vec::new();
    for (i, params) in per_image.into_iter().enumerate().take(n) {
        // SAFETY: the caller passes `n` bitstreams, lengths and images.
        let (jpeg, img) = unsafe { (bytes(*data.add(i), *lengths.add(i))?, *images.add(i)) };
        all.extend(writes(decode_on(jpeg, path, params, strict)?, &img)?);
        decoded.push(jpeg);
    }
    enqueue(stream, all)?;
    let mut r = reg();
    for jpeg in decoded {
        r.record(jpeg, path);
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeBatched(
    h: *mut c_void,
    state: *mut c_void,
    data: *const *const c_uchar,
    lengths: *const usize,
    images: *mut NvjpegImage,
    stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeBatched", || {
        batched(h, state, data, lengths, images, None, stream)
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeBatchedEx(
    h: *mut c_void,
    state: *mut c_void,
    data: *const *const c_uchar,
    lengths: *const usize,
    images: *mut NvjpegImage,
    params: *mut *mut c_void,
    stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeBatchedEx", || {
        batched(h, state, data, lengths, images, Some(params), stream)
    })
}

/// The real decoder's failure at `stage` for the image in progress, if it fails there (the
/// state is then idle, as after any failed phase).
fn fail_at(s: &mut StateObj, stage: Stage) -> Result<(), Status> {
    match s.doomed {
        Some((at, status)) if at == stage => {
            (s.phase, s.doomed) = (Phase::Idle, None);
            Err(status)
        }
        _ => Ok(()),
    }
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeJpegHost(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut c_void,
    params: *mut c_void,
    stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeJpegHost", || {
        let (path, p, jpeg, strict, doomed) = {
            let mut r = reg();
            let strict = r.handle(h)?.strict;
            let backend = r.decoder(decoder)?;
            let p = *r.params(params)?;
            if !r.state(state)?.pinned {
                return Err(status::INVALID_PARAMETER);
            }
            let s = r.stream(stream)?;
            let doomed = header::hybrid_failure(&s.header);
            (decode_path(backend), p, s.data.clone(), strict, doomed)
        };
        // An image the real decoder failed on later passes this phase undecoded.
        let planes = match doomed {
            Some(_) => Planes {
                planes: Vec::new(),
                rows: 0,
            },
            None => decode_on(&jpeg, path, p, strict)?,
        };
        let mut r = reg();
        let s = r.state(state)?;
        (s.phase, s.doomed) = (Phase::Host(planes), doomed);
        if doomed.is_none() {
            r.record(&jpeg, path);
        }
        Ok(())
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeJpegTransferToDevice(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut c_void,
    stream: *mut c_void,
    _cuda_stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeJpegTransferToDevice", || {
        let mut r = reg();
        r.handle(h)?;
        r.decoder(decoder)?;
        r.stream(stream)?;
        let s = r.state(state)?;
        if !s.device {
            return Err(status::INVALID_PARAMETER);
        }
        fail_at(s, Stage::Transfer)?;
        match std::mem::replace(&mut s.phase, Phase::Idle) {
            Phase::Host(p) => {
                s.phase = Phase::Transferred(p);
                Ok(())
            }
            other => {
                s.phase = other;
                Err(status::INVALID_PARAMETER)
            }
        }
    })
}

#[no_mangle]
pub extern "C" fn nvjpegDecodeJpegDevice(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut c_void,
    image: *mut NvjpegImage,
    cuda_stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeJpegDevice", || {
        if image.is_null() {
            return Err(status::INVALID_PARAMETER);
        }
        let planes = {
            let mut r = reg();
            r.handle(h)?;
            r.decoder(decoder)?;
            let s = r.state(state)?;
            fail_at(s, Stage::Device)?;
            match std::mem::replace(&mut s.phase, Phase::Idle) {
                Phase::Transferred(p) => p,
                other => {
                    s.phase = other;
                    return Err(status::INVALID_PARAMETER);
                }
            }
        };
        // SAFETY: checked non-null; the caller passes an nvjpegImage_t.
        let img = unsafe { *image };
        enqueue(cuda_stream, writes(planes, &img)?)
    })
}
