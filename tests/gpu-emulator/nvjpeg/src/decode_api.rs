//! nvJPEG's decode calls: batched (the hardware engines) and decoupled (the GPU-hybrid path:
//! host, transfer, device phases).
//!
//! # Design
//! - Batched decodes are asynchronous to the host, as NVIDIA documents them: the decode runs
//!   on the caller's CUDA stream (a host function of the emulated driver) and reads the input
//!   bitstreams when the stream reaches it, so bytes the caller changes before then are what
//!   gets decoded. The bitstreams are also decoded during the call, so corrupt or unsupported
//!   input is reported by the call with nvJPEG's statuses.
//! - A JPEG state takes no batched call (`nvjpegDecodeBatchedInitialize`, `...PreAllocate`, a
//!   decode) while its last batched decode is still pending on a stream
//!   (`NVJPEG_STATUS_INVALID_PARAMETER` and a line on stderr), and a failed batched decode
//!   leaves it needing Initialize again.
//! - The decoupled path's device phase writes the pixels on the caller's stream; its host
//!   phase decodes during the call. Its transfer reads the state's attached pinned buffer when
//!   the caller's stream gets there, so a host phase that writes that buffer before then is
//!   refused (`INVALID_PARAMETER` and a line on stderr, rule 79).
//! - Each decoded image is recorded with its path (`stoker_emu_nvjpeg_path`).

use std::ffi::{c_int, c_uchar, c_void};
use std::sync::atomic::Ordering;

use crate::api::{bytes, call};
use crate::cuda::{enqueue, enqueue_job, write, Write};
use crate::decode::{decode, Mode, OutputFormat, Planes};
use crate::header::{self, Path, Stage};
use crate::objects::*;
use crate::status::{self, Status};

/// `nvjpegImage_t`: where a decode writes each output plane.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct NvjpegImage {
    /// Each plane's device address (`channel`); planes the output format does not use may be
    /// null.
    pub channel: [*mut u8; 4],
    /// Each plane's row pitch in bytes (`pitch`).
    pub pitch: [usize; 4],
}

/// Whether `img` can take `p`: a non-null channel and a wide enough pitch per plane.
fn fits(p: &Planes, img: &NvjpegImage) -> Result<(), Status> {
    for (i, (_, row_bytes)) in p.planes.iter().enumerate() {
        if img.channel[i].is_null() || img.pitch[i] < *row_bytes {
            return Err(status::INVALID_PARAMETER);
        }
    }
    Ok(())
}

fn writes(p: Planes, img: &NvjpegImage) -> Result<Vec<Write>, Status> {
    fits(&p, img)?;
    let rows = p.rows;
    Ok((p.planes.into_iter().enumerate())
        .map(|(i, (data, row_bytes))| {
            debug_assert_eq!(data.len(), row_bytes * rows);
            Write {
                dst: img.channel[i] as u64,
                pitch: img.pitch[i],
                row_bytes,
                data,
            }
        })
        .collect())
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

/// Refuses a batched call on a state whose last batched decode has not run on its stream yet.
fn idle(s: &StateObj, call: &str) -> Result<(), Status> {
    if s.busy() {
        eprintln!(
            "stoker nvJPEG emulator: {call} on a JPEG state whose batched decode is still \
             pending on its stream (wait for that decode before re-using the state)"
        );
        return Err(status::INVALID_PARAMETER);
    }
    Ok(())
}

/// `nvjpegDecodeBatchedInitialize`: the batch size and output format of the state's next
/// batched decodes (the CPU thread count changes nothing).
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
        r.bound(h, state, "nvjpegDecodeBatchedInitialize")?;
        if batch <= 0 {
            return Err(status::INVALID_PARAMETER);
        }
        let s = r.state(state)?;
        idle(s, "nvjpegDecodeBatchedInitialize")?;
        s.batch = Some((batch as usize, f));
        Ok(())
    })
}

/// `nvjpegDecodeBatchedPreAllocate` (hardware backend only). Resources are not modelled: the
/// arguments are checked, the state must be idle.
#[no_mangle]
pub extern "C" fn nvjpegDecodeBatchedPreAllocate(
    h: *mut c_void,
    state: *mut c_void,
    batch: c_int,
    width: c_int,
    height: c_int,
    _chroma_subsampling: c_int,
    format: c_int,
) -> Status {
    call("nvjpegDecodeBatchedPreAllocate", || {
        OutputFormat::from_raw(format)?;
        let mut r = reg();
        if r.handle(h)?.backend != BACKEND_HARDWARE {
            return Err(status::INVALID_PARAMETER);
        }
        if batch <= 0 || width <= 0 || height <= 0 {
            return Err(status::INVALID_PARAMETER);
        }
        r.on_device(h, "nvjpegDecodeBatchedPreAllocate")?;
        idle(r.state(state)?, "nvjpegDecodeBatchedPreAllocate")
    })
}

/// One image of a batched decode as the call left it: the caller's bitstream (read again when
/// the stream runs the decode), what it decoded to at the call, and where the pixels go.
struct Queued {
    data: *const u8,
    len: usize,
    digest: u64,
    planes: Planes,
    path: Path,
    params: ParamsObj,
    strict: bool,
    image: NvjpegImage,
}

// SAFETY: the pointers are the caller's bitstream and device memory, which nvJPEG's contract
// keeps valid until the stream has run the decode; the stream's worker is the only reader.
unsafe impl Send for Queued {}

impl Queued {
    /// The pixels as the stream's decode finds the bitstream now: the call's when the bytes
    /// are unchanged; else the changed bytes decoded (the image in the buffer now, as a GPU
    /// would read it), or grey where they no longer decode to the same geometry.
    fn pixels(self, at: usize) -> Result<Vec<Write>, Status> {
        // SAFETY: the caller promised the bitstream until the decode has run (see `Send`).
        let now = unsafe { std::slice::from_raw_parts(self.data, self.len) };
        if fnv1a(now) == self.digest {
            return writes(self.planes, &self.image);
        }
        eprintln!(
            "stoker nvJPEG emulator: image {at} of a batched decode changed between the call \
             and the decode on the stream; decoding the bytes found now"
        );
        let same_shape = |p: &Planes| {
            p.rows == self.planes.rows
                && p.planes
                    .iter()
                    .map(|x| x.1)
                    .eq(self.planes.planes.iter().map(|x| x.1))
        };
        let planes = match decode_on(now, self.path, self.params, self.strict) {
            Ok(p) if same_shape(&p) => p,
            _ => Planes {
                planes: (self.planes.planes.iter())
                    .map(|(d, row)| (vec![0x80; d.len()], *row))
                    .collect(),
                rows: self.planes.rows,
            },
        };
        writes(planes, &self.image)
    }
}

/// What one image of a batched call names: its bitstream and its output.
///
/// # Safety
/// `data`, `lengths` and `images` must hold more than `i` entries.
unsafe fn nth(
    data: *const *const c_uchar,
    lengths: *const usize,
    images: *mut NvjpegImage,
    i: usize,
) -> Result<(&'static [u8], NvjpegImage), Status> {
    // SAFETY: the caller's promise.
    unsafe { Ok((bytes(*data.add(i), *lengths.add(i))?, *images.add(i))) }
}

/// What a batched decode puts on its stream: the decode (for the hardware engines, only the
/// wait for it), then the state's release. The hardware engines start on the batch at the
/// call, without waiting for work queued earlier on the stream; only work queued later waits
/// for them. On a real H200 a kernel still reading the previous batch's decoded images saw the
/// next batch's rows written over them, top first (docs/cuda.md; emulator rule 76).
fn stream_job(
    path: Path,
    decode: impl FnOnce() + Send + 'static,
    pending: std::sync::Arc<std::sync::atomic::AtomicUsize>,
    stream: usize,
) -> Box<dyn FnOnce() + Send> {
    let done = move || {
        pending.fetch_sub(1, Ordering::AcqRel);
        crate::overlap::ran(stream);
    };
    if path == Path::Hardware {
        // The engines take as long as one stream operation (`STOKER_EMU_OP_DELAY_US`) before
        // they read the bitstreams: a caller that reuses them too early is still caught.
        let delay = std::env::var("STOKER_EMU_OP_DELAY_US")
            .ok()
            .and_then(|v| v.parse().ok())
            .map_or(std::time::Duration::ZERO, std::time::Duration::from_micros);
        let engine = std::thread::spawn(move || {
            std::thread::sleep(delay);
            decode();
        });
        Box::new(move || {
            let _ = engine.join();
            done();
        })
    } else {
        Box::new(move || {
            decode();
            done();
        })
    }
}

/// The batched decode shared by `nvjpegDecodeBatched` and `nvjpegDecodeBatchedEx`: the
/// bitstreams are checked and decoded at the call (errors come back from it), and the decode
/// runs again on `stream` when the stream reaches it, reading the bitstreams then.
fn batched(
    h: *mut c_void,
    state: *mut c_void,
    data: *const *const c_uchar,
    lengths: *const usize,
    images: *mut NvjpegImage,
    params: Option<*mut *mut c_void>,
    stream: *mut c_void,
) -> Result<(), Status> {
    let (path, n, per_image, strict, pending) = {
        let mut r = reg();
        let (backend, strict) = {
            let x = r.handle(h)?;
            (x.backend, x.strict)
        };
        // BatchedEx: hardware (or lossless) handles only (docs/cuda.md, row 63).
        if params.is_some() && backend != BACKEND_HARDWARE {
            return Err(status::IMPLEMENTATION_NOT_SUPPORTED);
        }
        let s = r.bound(h, state, "a batched decode")?;
        idle(s, "a batched decode")?;
        let (n, format) = s.batch.ok_or(status::INVALID_PARAMETER)?;
        let pending = s.pending.clone();
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
        (path, n, per_image, strict, pending)
    };
    if data.is_null() || lengths.is_null() || images.is_null() {
        return Err(status::INVALID_PARAMETER);
    }
    let mut queued = Vec::with_capacity(n);
    for (i, params) in per_image.into_iter().enumerate() {
        // SAFETY: the caller passes `n` bitstreams, lengths and images.
        let (jpeg, image) = unsafe { nth(data, lengths, images, i) }?;
        if path == Path::Hardware && params.roi.is_some() && !crate::api::hardware_takes_roi() {
            return Err(status::JPEG_NOT_SUPPORTED);
        }
        let planes = decode_on(jpeg, path, params, strict)?;
        fits(&planes, &image)?;
        queued.push(Queued {
            data: jpeg.as_ptr(),
            len: jpeg.len(),
            digest: fnv1a(jpeg),
            planes,
            path,
            params,
            strict,
            image,
        });
    }
    let digests: Vec<u64> = queued.iter().map(|q| q.digest).collect();
    let decode = move || {
        for (i, q) in queued.into_iter().enumerate() {
            // Outputs were checked at the call: the same planes' shapes cannot fail here.
            if let Ok(w) = q.pixels(i) {
                w.iter().for_each(write);
            }
        }
    };
    enqueue_counted(stream, path, decode, pending)?;
    let mut r = reg();
    for d in digests {
        r.paths.insert(d, path);
    }
    Ok(())
}

/// Enqueues a batched decode on `stream`, counted pending on its state (and on the stream,
/// `overlap`) until the stream has run it; a failed enqueue counts nothing.
fn enqueue_counted(
    stream: *mut c_void,
    path: Path,
    decode: impl FnOnce() + Send + 'static,
    pending: std::sync::Arc<std::sync::atomic::AtomicUsize>,
) -> Result<(), Status> {
    pending.fetch_add(1, Ordering::AcqRel);
    crate::overlap::enqueued(stream as usize);
    let on_stream = pending.clone();
    let r = enqueue_job(stream, stream_job(path, decode, on_stream, stream as usize));
    if r.is_err() {
        pending.fetch_sub(1, Ordering::AcqRel);
        crate::overlap::ran(stream as usize);
    }
    r
}

/// A failed batched decode leaves its state needing `nvjpegDecodeBatchedInitialize` again.
fn reset_on_failure(state: *mut c_void, r: Result<(), Status>) -> Result<(), Status> {
    if r.is_err() {
        if let Ok(s) = reg().state(state) {
            s.batch = None;
        }
    }
    r
}

/// `nvjpegDecodeBatched`: decodes the state's batch into `images`, checked at the call and
/// written when `stream` reaches it; a failure leaves the state needing Initialize again.
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
        let r = batched(h, state, data, lengths, images, None, stream);
        reset_on_failure(state, r)
    })
}

/// `nvjpegDecodeBatchedEx`: as `nvjpegDecodeBatched`, with decode parameters (a region of
/// interest) per image; hardware backend only.
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
        let r = batched(h, state, data, lengths, images, Some(params), stream);
        reset_on_failure(state, r)
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

/// `nvjpegDecodeJpegHost`: the decoupled host phase, decoding the parsed stream during the call
/// (an image the real GPU-hybrid decoder failed on later passes it undecoded).
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
            // No pinned buffer attached is allowed: "the state will use heap host memory".
            let s = r.bound(h, state, "nvjpegDecodeJpegHost")?;
            // The host phase writes the attached pinned buffer, which a transfer still pending
            // on its stream reads (rule 79).
            if s.pinned
                .as_ref()
                .is_some_and(|t| t.load(Ordering::Acquire) > 0)
            {
                undefined(
                    "nvjpegDecodeJpegHost",
                    "a pinned buffer written while a transfer that reads it is still pending \
                     on its stream (wait for an event recorded after that transfer)",
                )?;
            }
            let s = r.stream(stream)?;
            if !header::backend_takes(&s.header, backend) {
                return Err(status::JPEG_NOT_SUPPORTED);
            }
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

/// `nvjpegDecodeJpegTransferToDevice`: the decoupled transfer phase; the state needs a device
/// buffer, and the CUDA stream is not used.
#[no_mangle]
pub extern "C" fn nvjpegDecodeJpegTransferToDevice(
    h: *mut c_void,
    decoder: *mut c_void,
    state: *mut c_void,
    stream: *mut c_void,
    cuda_stream: *mut c_void,
) -> Status {
    call("nvjpegDecodeJpegTransferToDevice", || {
        let transfers = {
            let mut r = reg();
            r.bound(h, state, "nvjpegDecodeJpegTransferToDevice")?;
            r.decoder(decoder)?;
            r.stream(stream)?;
            let s = r.state(state)?;
            if !s.device {
                return Err(status::INVALID_PARAMETER);
            }
            fail_at(s, Stage::Transfer)?;
            match std::mem::replace(&mut s.phase, Phase::Idle) {
                Phase::Host(p) => s.phase = Phase::Transferred(p),
                other => {
                    s.phase = other;
                    return Err(status::INVALID_PARAMETER);
                }
            }
            s.pinned.clone()
        };
        // The copy out of the attached pinned buffer runs when `cuda_stream` gets there: until
        // then the buffer is busy (rule 79).
        let Some(transfers) = transfers else {
            return Ok(());
        };
        transfers.fetch_add(1, Ordering::AcqRel);
        let on_stream = transfers.clone();
        let copied = move || {
            on_stream.fetch_sub(1, Ordering::AcqRel);
        };
        enqueue_job(cuda_stream, Box::new(copied)).inspect_err(|_| {
            transfers.fetch_sub(1, Ordering::AcqRel);
        })
    })
}

/// `nvjpegDecodeJpegDevice`: the decoupled device phase, writing the decoded planes into
/// `image` when `cuda_stream` reaches it.
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
            r.bound(h, state, "nvjpegDecodeJpegDevice")?;
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
