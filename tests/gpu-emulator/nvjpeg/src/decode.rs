//! Decoding with libjpeg-turbo and laying the pixels out as nvJPEG's output formats do.
//!
//! # Design
//! - The whole image is decoded, the region of interest is cut out, and the result is
//!   arranged for the output format into host memory; the write into the caller's device
//!   memory happens later, on the CUDA stream ([`crate::cuda`]).
//! - Lenient unless strict ([`Mode`]): "nvJPEG library will try to decode a bitstream even if
//!   it doesn't strictly follow the JPEG specification. Using this flag will return an error in
//!   such cases." (`NVJPEG_FLAGS_BITSTREAM_STRICT`, NVJPEG#nvjpeg-flags). Without the flag a
//!   stream libjpeg only warns about (corrupt entropy data, a file cut short) is decoded to
//!   whatever libjpeg makes of it, as the real library decoded the corrupt and truncated edge
//!   files on an H200 (docs/results/gpu-check-2026-11-26/selftest.txt); with it, `BAD_JPEG`.
//! - Wrong colours where the real library gave them ([`crate::header::wrong_colours`]): the
//!   decoded RGB is converted once more as if it were YCbCr, the emulator's stand-in for a
//!   conversion applied to components that were not YCbCr.

use std::ffi::c_int;

use turbojpeg_sys as tj;

use crate::status::{self, Status};

/// `nvjpegOutputFormat_t` values the emulator produces.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OutputFormat {
    Y = 2,
    Rgb = 3,
    Bgr = 4,
    Rgbi = 5,
    Bgri = 6,
}

impl OutputFormat {
    /// `UNCHANGED` and `YUV` are not emulated: `NVJPEG_STATUS_IMPLEMENTATION_NOT_SUPPORTED`.
    pub(crate) fn from_raw(v: c_int) -> Result<OutputFormat, Status> {
        Ok(match v {
            2 => OutputFormat::Y,
            3 => OutputFormat::Rgb,
            4 => OutputFormat::Bgr,
            5 => OutputFormat::Rgbi,
            6 => OutputFormat::Bgri,
            0 | 1 => return Err(status::IMPLEMENTATION_NOT_SUPPORTED),
            _ => return Err(status::INVALID_PARAMETER),
        })
    }
}

/// A region of interest; `None` is the whole image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Roi {
    pub(crate) x: u32,
    pub(crate) y: u32,
    pub(crate) w: u32,
    pub(crate) h: u32,
}

/// Decoded planes ready to be written: (bytes, row length) for each output channel.
pub(crate) struct Planes {
    pub(crate) planes: Vec<(Vec<u8>, usize)>,
    pub(crate) rows: usize,
}

struct Turbo(tj::tjhandle);

impl Drop for Turbo {
    fn drop(&mut self) {
        // SAFETY: a live handle from tj3Init, destroyed once.
        unsafe { tj::tj3Destroy(self.0) };
    }
}

/// How a decode treats a stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub(crate) struct Mode {
    /// `NVJPEG_FLAGS_BITSTREAM_STRICT`: a libjpeg warning is `BAD_JPEG`.
    pub(crate) strict: bool,
    /// The real library's wrong colours for this image ([`crate::header::wrong_colours`]).
    pub(crate) wrong_colours: bool,
}

/// Decodes `jpeg` to packed RGB (3 bytes a pixel) or gray; `BAD_JPEG` on any error, and on a
/// warning when `strict`.
fn decode_packed(jpeg: &[u8], gray: bool, strict: bool) -> Result<(Vec<u8>, u32, u32), Status> {
    // SAFETY: tj3Init has no preconditions; the handle is owned by `Turbo` at once.
    let t = Turbo(unsafe { tj::tj3Init(tj::TJINIT_TJINIT_DECOMPRESS as c_int) });
    if t.0.is_null() {
        return Err(status::INTERNAL_ERROR);
    }
    // SAFETY: (whole block) a live handle; `jpeg` is read for its length; the output buffer
    // is exactly width * height * channels bytes, what tj3Decompress8 writes with that pitch.
    unsafe {
        tj::tj3Set(
            t.0,
            tj::TJPARAM_TJPARAM_STOPONWARNING as c_int,
            c_int::from(strict),
        );
        // Chroma upsampled by replication, never libjpeg's triangle filter: on a real H200 every
        // nvJPEG hardware and hybrid decode that differed from libjpeg-turbo's was bit-identical
        // to `djpeg -nosmooth` (docs/results/gpu-check-2026-11-26, docs/cuda.md).
        tj::tj3Set(t.0, tj::TJPARAM_TJPARAM_FASTUPSAMPLE as c_int, 1);
        if tj::tj3DecompressHeader(t.0, jpeg.as_ptr(), jpeg.len() as tj::size_t) != 0 {
            return Err(status::BAD_JPEG);
        }
        let w = tj::tj3Get(t.0, tj::TJPARAM_TJPARAM_JPEGWIDTH as c_int);
        let h = tj::tj3Get(t.0, tj::TJPARAM_TJPARAM_JPEGHEIGHT as c_int);
        if w <= 0 || h <= 0 {
            return Err(status::BAD_JPEG);
        }
        let (pf, ch) = if gray {
            (tj::TJPF_TJPF_GRAY, 1)
        } else {
            (tj::TJPF_TJPF_RGB, 3)
        };
        let pitch = w as usize * ch;
        let mut out = vec![0u8; pitch * h as usize];
        let rc = tj::tj3Decompress8(
            t.0,
            jpeg.as_ptr(),
            jpeg.len() as tj::size_t,
            out.as_mut_ptr(),
            pitch as c_int,
            pf,
        );
        // Not strict: a warning leaves the pixels libjpeg made of the stream.
        let warned = tj::tj3GetErrorCode(t.0) == tj::TJERR_TJERR_WARNING as c_int;
        if rc != 0 && (strict || !warned) {
            return Err(status::BAD_JPEG);
        }
        Ok((out, w as u32, h as u32))
    }
}

/// Decodes `jpeg`, whose header says `size`, cuts `roi` out and arranges it as `format`. A
/// decoded size other than the header's (a DNL marker, a second frame) is `BAD_JPEG`: the
/// caller sized its output from the header.
pub(crate) fn decode(
    jpeg: &[u8],
    size: (u32, u32),
    roi: Option<Roi>,
    format: OutputFormat,
    mode: Mode,
) -> Result<Planes, Status> {
    let gray = format == OutputFormat::Y;
    let (mut px, w, h) = decode_packed(jpeg, gray, mode.strict)?;
    if mode.wrong_colours && !gray {
        convert_again(&mut px);
    }
    if (w, h) != size {
        return Err(status::BAD_JPEG);
    }
    let r = roi.unwrap_or(Roi { x: 0, y: 0, w, h });
    if r.w == 0 || r.h == 0 || r.x + r.w > w || r.y + r.h > h {
        return Err(status::INVALID_PARAMETER);
    }
    let ch = if gray { 1 } else { 3 };
    let (rw, rh) = (r.w as usize, r.h as usize);
    let row = |y: usize| {
        let start = ((r.y as usize + y) * w as usize + r.x as usize) * ch;
        &px[start..start + rw * ch]
    };
    let interleaved = |order: [usize; 3]| {
        let mut out = Vec::with_capacity(rw * rh * 3);
        for y in 0..rh {
            for p in row(y).chunks_exact(3) {
                out.extend(order.map(|c| p[c]));
            }
        }
        vec![(out, rw * 3)]
    };
    let planar = |order: [usize; 3]| {
        order
            .iter()
            .map(|&c| {
                let plane: Vec<u8> = (0..rh)
                    .flat_map(|y| row(y).chunks_exact(3).map(move |p| p[c]))
                    .collect();
                (plane, rw)
            })
            .collect()
    };
    let planes = match format {
        OutputFormat::Y => vec![((0..rh).flat_map(|y| row(y).to_vec()).collect(), rw)],
        OutputFormat::Rgbi => interleaved([0, 1, 2]),
        OutputFormat::Bgri => interleaved([2, 1, 0]),
        OutputFormat::Rgb => planar([0, 1, 2]),
        OutputFormat::Bgr => planar([2, 1, 0]),
    };
    Ok(Planes { planes, rows: rh })
}

/// Converts packed RGB as if each pixel were (Y, Cb, Cr), JFIF's equations.
fn convert_again(px: &mut [u8]) {
    let clamp = |v: f32| v.round().clamp(0.0, 255.0) as u8;
    for p in px.chunks_exact_mut(3) {
        let (y, cb, cr) = (
            f32::from(p[0]),
            f32::from(p[1]) - 128.0,
            f32::from(p[2]) - 128.0,
        );
        p[0] = clamp(y + 1.402 * cr);
        p[1] = clamp(y - 0.344_136 * cb - 0.714_136 * cr);
        p[2] = clamp(y + 1.772 * cb);
    }
}
