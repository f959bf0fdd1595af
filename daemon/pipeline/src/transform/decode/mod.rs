//! CPU JPEG decoding with libjpeg-turbo (TurboJPEG 3 API): whole images, or only the region a
//! crop needs at the smallest DCT scale that still covers the output size.
//!
//! # Design
//! - One [`CpuDecoder`] per decode thread; it owns a TurboJPEG instance (RAII, in the private
//!   `sys` module, the only unsafe code here) and a scratch buffer, so steady-state decoding does
//!   not allocate once `out` has grown to the largest image.
//! - The format is recognised by its first bytes ([`ImageFormat::detect`]), never by the file
//!   name. PNG, WebP, BMP, TIFF and PPM/PGM are decoded whole by pure-Rust decoders (`image`);
//!   other formats are named in [`DecodeError::UnknownFormat`].
//! - Output is always packed 8-bit RGB. Grayscale is expanded by libjpeg; CMYK and YCCK are
//!   decoded to CMYK and converted here with the Adobe (inverted) convention, the same formula
//!   as libjpeg-turbo's `djpeg`: `R = C * K / 255` on the stored values.
//! - Any libjpeg warning is an error (`TJPARAM_STOPONWARNING`): corrupt or truncated data is
//!   rejected, never passed on as a grey-padded image.
//! - Limits: files over [`Limits::max_file_bytes`] and images over [`Limits::max_pixels`] are
//!   rejected before any pixel is decoded (checked here and by `TJPARAM_MAXPIXELS`); progressive
//!   files with more than [`MAX_SCANS`] scans are rejected (`TJPARAM_SCANLIMIT`).
//! - [`CpuDecoder::decode_for_crop`] uses only the scaling factors 1, 1/2, 1/4 and 1/8: the
//!   others (3/8, 5/8, 3/4, 7/8, ...) use libjpeg-turbo's plain C IDCT and measured no faster
//!   than the next power of two up (see `docs/decode.md`).
//!
//! # Limitations
//! - 12-bit and 16-bit samples, lossless (SOF3), hierarchical and JPEG-LS files are rejected as
//!   [`DecodeError::Unsupported`].
//! - Pixels come out in stored order, as torchvision's `decode_jpeg` and DALI give them;
//!   [`probe_image`] reads the EXIF orientation, which the engine applies in the crop geometry
//!   when the spec asks (`transform::orient`).
//! - ICC profiles are ignored (no colour management): APP2 markers are not saved
//!   (`TJPARAM_SAVEMARKERS = 0`), so a malformed or duplicated ICC sequence cannot fail a
//!   decode.

mod encode;
mod entropy;
mod entry;
mod error;
mod exif;
mod format;
mod header;
mod image;
mod markers;
mod png;
mod raster;
mod restart;
pub mod routing;
mod sniff;
mod sys;
mod views;
mod webp;

use std::cell::RefCell;

use stoker_kernels::image::{CropBox, RgbImage};

pub use encode::{EncodeOptions, JpegEncoder};
pub use entropy::EntropyDecoder;
pub use entry::{
    entry_table_bytes, set_entry_budget, set_entry_grace, EntryHold, DEFAULT_ENTRY_BYTES_PER_SCOPE,
    DEFAULT_ENTRY_GRACE,
};
pub use error::DecodeError;
pub use format::ImageFormat;
pub use header::{ColorSpace, JpegHeader, Subsampling};
pub use image::{probe_image, ImageHeader};
pub use restart::{add_restart_markers, NotRewritten, RESTART_COLUMNS};
use sys::{Param, PixelFormat, ScalingFactor, TjHandle};
pub use views::DecodedRegion;

/// Default [`Limits::max_pixels`]: 100 megapixels (a 10000 x 10000 image). Larger images are
/// almost always decompression bombs in a training set; RGB output alone would be 300 MB.
pub const DEFAULT_MAX_PIXELS: u64 = 100_000_000;

/// Default [`Limits::max_file_bytes`]: 64 MiB, far above any real photo.
pub const DEFAULT_MAX_FILE_BYTES: u64 = 64 << 20;

/// The most scans a progressive JPEG may have (`TJPARAM_SCANLIMIT`), against files made of
/// thousands of tiny scans that each re-walk the whole coefficient buffer. libjpeg-turbo's own
/// tools use the same figure; a real encoder writes at most a few dozen.
pub const MAX_SCANS: u32 = 500;

/// What a decoder refuses before decoding.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Largest `width * height` decoded; larger images are [`DecodeError::TooLarge`].
    pub max_pixels: u64,
    /// Largest encoded file accepted; larger ones are [`DecodeError::FileTooLarge`].
    pub max_file_bytes: u64,
}

impl Limits {
    /// Whether an image of `width` x `height` is within [`Limits::max_pixels`] (the CUDA
    /// engine and the tools route an image it refuses to the CPU, which says why).
    pub fn admits(&self, width: u32, height: u32) -> bool {
        u64::from(width) * u64::from(height) <= self.max_pixels
    }
}

impl Limits {
    /// No limit: for reading headers, where the decoder applies the real limits later.
    pub(super) fn unlimited() -> Limits {
        Limits {
            max_pixels: u64::MAX,
            max_file_bytes: u64::MAX,
        }
    }
}

impl Default for Limits {
    fn default() -> Limits {
        Limits {
            max_pixels: DEFAULT_MAX_PIXELS,
            max_file_bytes: DEFAULT_MAX_FILE_BYTES,
        }
    }
}

/// Reads and checks the header of `bytes` with `tj`, leaving `tj` ready to decompress them.
/// `max_pixels` only names the limit when libjpeg's own size limit trips.
fn read_header(
    tj: &mut TjHandle,
    bytes: &[u8],
    max_pixels: u64,
) -> Result<JpegHeader, DecodeError> {
    if !bytes.starts_with(&format::JPEG_MAGIC) {
        if bytes.starts_with(&format::JPEG_MAGIC[..2]) && bytes.len() > 2 {
            return Err(DecodeError::Corrupt {
                detail: String::from("no marker after the start-of-image marker"),
            });
        }
        return Err(DecodeError::UnknownFormat {
            what: sniff::describe_unknown(bytes),
        });
    }
    let frame = sniff::check_frame(bytes)?;
    if let Err(e) = tj.decompress_header(bytes) {
        return Err(match frame {
            // libjpeg's own limit (65500 pixels a side) on a frame larger than ours.
            Some((w, h)) if e.message.contains("Maximum supported image dimension") => {
                DecodeError::TooLarge {
                    w,
                    h,
                    limit: max_pixels.min(65500 * 65500),
                }
            }
            _ => DecodeError::from_tj(e),
        });
    }
    let colorspace_raw = tj.get(Param::Colorspace);
    let header = JpegHeader {
        width: u32::try_from(tj.get(Param::JpegWidth)).unwrap_or(0),
        height: u32::try_from(tj.get(Param::JpegHeight)).unwrap_or(0),
        subsampling: Subsampling::from_raw(tj.get(Param::Subsamp)),
        colorspace: ColorSpace::from_raw(colorspace_raw).ok_or_else(|| {
            DecodeError::Unsupported {
                what: format!("colour space {colorspace_raw}"),
            }
        })?,
        progressive: tj.get(Param::Progressive) == 1,
        arithmetic: tj.get(Param::Arithmetic) == 1,
        lossless: tj.get(Param::Lossless) == 1,
        precision: u8::try_from(tj.get(Param::Precision)).unwrap_or(0),
    };
    header.check_supported()?;
    Ok(header)
}

/// Reads the header of `bytes` (no pixel is decoded) and checks that stoker can decode it
/// (8-bit, not lossless). Size limits are applied by the decoder, not here.
pub fn probe(bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
    thread_local! {
        static PROBE: RefCell<Option<TjHandle>> = const { RefCell::new(None) };
    }
    PROBE.with(|cell| {
        let mut slot = cell.borrow_mut();
        if slot.is_none() {
            *slot = Some(new_handle()?);
        }
        let tj = slot.as_mut().expect("just created");
        let result = read_header(tj, bytes, u64::MAX);
        if result.is_err() {
            // libjpeg may be left mid-header after an error: start afresh next time.
            *slot = None;
        }
        result
    })
}

/// A decompressor with the settings every decode uses. After a failed call TurboJPEG can be
/// left mid-header (`tj3DecompressHeader` does not abort on error), so a decoder replaces its
/// instance after every error: a few microseconds, on the error path only.
fn new_handle() -> Result<TjHandle, DecodeError> {
    let mut tj = TjHandle::new_decompressor().ok_or_else(|| DecodeError::Internal {
        detail: String::from("tj3Init failed"),
    })?;
    set_strict(&mut tj)?;
    // TurboJPEG 3 saves APP2 markers and extracts the ICC profile by default
    // (TJPARAM_SAVEMARKERS = 2); an ICC sequence it finds inconsistent (a second profile, parts
    // around the frame header) raises "bad ICC marker", a warning, fatal under
    // STOPONWARNING. ICC profiles are ignored, so no marker is saved: APP2 is skipped unread,
    // as djpeg does without -icc.
    tj.set(Param::SaveMarkers, 0)
        .map_err(DecodeError::from_tj)?;
    Ok(tj)
}

/// What every TurboJPEG instance that reads a JPEG is set to: a warning is an error, and at
/// most [`MAX_SCANS`] scans.
fn set_strict(tj: &mut TjHandle) -> Result<(), DecodeError> {
    tj.set(Param::StopOnWarning, 1)
        .map_err(DecodeError::from_tj)?;
    tj.set(
        Param::ScanLimit,
        i32::try_from(MAX_SCANS).unwrap_or(i32::MAX),
    )
    .map_err(DecodeError::from_tj)
}

/// Scaled pixels decoded around a wanted box (see `plan_region`).
pub const REGION_MARGIN: u32 = 2;

/// Which part of the image a decode produces, at which scale (all in scaled pixels).
#[derive(Debug, Clone, Copy, PartialEq)]
struct RegionPlan {
    factor: ScalingFactor,
    /// The cropping region; `None` for the whole scaled image.
    crop: Option<(u32, u32, u32, u32)>,
    /// Output size.
    width: u32,
    height: u32,
    /// Where the wanted box lies in the output.
    box_out: CropBox,
}

/// The part of `want` inside the image, `(x0, y0, x1, y1)`; a box that is not finite, empty
/// or outside the image is a bad crop.
fn inside(header: &JpegHeader, want: CropBox) -> Result<(f64, f64, f64, f64), DecodeError> {
    let (iw, ih) = (header.width as f64, header.height as f64);
    let bad = || DecodeError::BadCrop {
        want,
        w: header.width,
        h: header.height,
    };
    let finite =
        want.x.is_finite() && want.y.is_finite() && want.w.is_finite() && want.h.is_finite();
    if !finite || want.w <= 0.0 || want.h <= 0.0 {
        return Err(bad());
    }
    // The part of the box inside the image.
    let x0 = want.x.max(0.0);
    let y0 = want.y.max(0.0);
    let x1 = (want.x + want.w).min(iw);
    let y1 = (want.y + want.h).min(ih);
    if x1 <= x0 || y1 <= y0 {
        return Err(bad());
    }
    Ok((x0, y0, x1, y1))
}

/// Plans a region decode: the smallest allowed factor (`factors` sorted largest first, all
/// <= 1) keeping `want` at least `out_size` (h, w) big, the scaled region covering `want` with
/// its left edge aligned down to the scaled iMCU width.
fn plan_region(
    header: &JpegHeader,
    want: CropBox,
    out_size: (u32, u32),
    factors: &[ScalingFactor],
) -> Result<RegionPlan, DecodeError> {
    let (x0, y0, x1, y1) = inside(header, want)?;
    let (out_h, out_w) = (out_size.0 as f64, out_size.1 as f64);
    let factor = smallest_factor(factors, |s| want.w * s >= out_w && want.h * s >= out_h);
    plan_region_at(header, want, (x0, y0, x1, y1), factor)
}

/// The smallest of `factors` (sorted largest first) for which `covers` holds; 1 if none.
fn smallest_factor(factors: &[ScalingFactor], covers: impl Fn(f64) -> bool) -> ScalingFactor {
    factors
        .iter()
        .rev()
        .copied()
        .find(|f| covers(f.as_f64()))
        .unwrap_or(ScalingFactor::ONE)
}

/// Plans the decode of `want` (whose part inside the image is `(x0, y0, x1, y1)`) at `factor`.
fn plan_region_at(
    header: &JpegHeader,
    want: CropBox,
    (x0, y0, x1, y1): (f64, f64, f64, f64),
    factor: ScalingFactor,
) -> Result<RegionPlan, DecodeError> {
    let s = factor.as_f64();
    let sw = factor.scale(header.width);
    let sh = factor.scale(header.height);
    // Not negative, then clamped to `hi` (`as` saturates above u32::MAX).
    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
    let clamp = |v: f64, hi: u32| (v.max(0.0) as u32).min(hi);
    // A margin of REGION_MARGIN scaled pixels on every side keeps the box's own pixels away
    // from the region's edges, where libjpeg's chroma upsampling lacks its neighbours and
    // differs slightly from a full decode.
    let mut rx0 = clamp((x0 * s).floor(), sw).saturating_sub(REGION_MARGIN);
    let ry0 = clamp((y0 * s).floor(), sh).saturating_sub(REGION_MARGIN);
    let rx1 = (clamp((x1 * s).ceil(), sw) + REGION_MARGIN).min(sw);
    let ry1 = (clamp((y1 * s).ceil(), sh) + REGION_MARGIN).min(sh);
    let crop = match header.subsampling.mcu_width() {
        // TurboJPEG cannot crop an image whose subsampling it cannot name: decode it whole.
        None => None,
        Some(mcu) => {
            let step = factor.scale(mcu);
            rx0 -= rx0 % step;
            if rx0 == 0 && ry0 == 0 && rx1 == sw && ry1 == sh {
                None
            } else {
                Some((rx0, ry0, rx1 - rx0, ry1 - ry0))
            }
        }
    };
    let (ox, oy, width, height) = crop.unwrap_or((0, 0, sw, sh));
    Ok(RegionPlan {
        factor,
        crop,
        width,
        height,
        box_out: CropBox::new(
            want.x * s - ox as f64,
            want.y * s - oy as f64,
            want.w * s,
            want.h * s,
        ),
    })
}

/// A JPEG decoder for one thread: owns its TurboJPEG instance and scratch memory.
pub struct CpuDecoder {
    // No field borrows another: drop order does not matter.
    tj: TjHandle,
    limits: Limits,
    /// The scaling factors `decode_for_crop` may use, largest first, all <= 1.
    factors: Vec<ScalingFactor>,
    /// CMYK pixels before conversion to RGB.
    cmyk: Vec<u8>,
    /// PNG and WebP pixels before conversion to RGB.
    pixels: Vec<u8>,
    /// Chroma upsampled by replication instead of libjpeg's "fancy" (triangle) filter.
    fast_upsample: bool,
    /// The restart intervals a crop touches, for restart-indexed files (`restart`).
    partial: restart::PartialStream,
    /// Whose entry points (`entry`) decodes use and keep: the job owner's uid.
    entry_scope: u32,
    /// Whether the job decoding reads each file once (`entry`: no walk at a first sight).
    entry_reads_once: bool,
}

impl std::fmt::Debug for CpuDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CpuDecoder")
            .field("limits", &self.limits)
            .field("fast_upsample", &self.fast_upsample)
            .field("entry_scope", &self.entry_scope)
            .field("entry_reads_once", &self.entry_reads_once)
            .finish_non_exhaustive()
    }
}

impl CpuDecoder {
    /// A decoder that refuses images over `limits` before decoding them.
    pub fn new(limits: Limits) -> Result<CpuDecoder, DecodeError> {
        Ok(CpuDecoder {
            tj: Self::new_limited_handle(&limits, false)?,
            limits,
            factors: Self::allowed_factors(false),
            cmyk: Vec::new(),
            pixels: Vec::new(),
            fast_upsample: false,
            partial: restart::PartialStream::default(),
            entry_scope: 0,
            entry_reads_once: false,
        })
    }

    /// Sets whose entry points the next decodes use and keep (the job owner's uid): one user's
    /// decodes never read, nor time, what another's learnt.
    pub fn set_entry_scope(&mut self, owner: u32) {
        self.entry_scope = owner;
    }

    /// Sets whether the next decodes' job reads each file once (one epoch): a file's first
    /// sight then decodes plainly and leaves a mark instead of walking for entry points,
    /// which would pay off only from a second read (`entry`).
    pub fn set_entry_reads_once(&mut self, once: bool) {
        self.entry_reads_once = once;
    }

    fn new_limited_handle(limits: &Limits, fast_upsample: bool) -> Result<TjHandle, DecodeError> {
        let mut tj = new_handle()?;
        // TurboJPEG's own check (0 = none); ours in `check_limits` also covers larger limits.
        let tj_max = i32::try_from(limits.max_pixels).unwrap_or(0);
        tj.set(Param::MaxPixels, tj_max)
            .map_err(DecodeError::from_tj)?;
        tj.set(Param::FastUpsample, i32::from(fast_upsample))
            .map_err(DecodeError::from_tj)?;
        Ok(tj)
    }

    /// Passes `result` through, replacing the TurboJPEG instance if it is an error.
    fn recover<T>(&mut self, result: Result<T, DecodeError>) -> Result<T, DecodeError> {
        if result.is_err() {
            if let Ok(tj) = Self::new_limited_handle(&self.limits, self.fast_upsample) {
                self.tj = tj;
            }
        }
        result
    }

    /// Upsamples chroma by replication (`djpeg -nosmooth`, `TJPARAM_FASTUPSAMPLE`) instead of
    /// libjpeg's default triangle filter. nvJPEG's hardware and GPU-hybrid decoders upsample
    /// this way (bit-identical on a real H200: docs/results/gpu-check-2026-11-26), so `stoker
    /// selftest --gpu` compares them with a decoder set so; serving never sets it.
    pub fn set_fast_upsample(&mut self, fast: bool) -> Result<(), DecodeError> {
        self.tj
            .set(Param::FastUpsample, i32::from(fast))
            .map_err(DecodeError::from_tj)?;
        self.fast_upsample = fast;
        Ok(())
    }

    fn allowed_factors(all: bool) -> Vec<ScalingFactor> {
        sys::scaling_factors()
            .into_iter()
            .filter(|f| f.num <= f.denom)
            .filter(|f| all || (f.num == 1 && f.denom.is_power_of_two() && f.denom <= 8))
            .collect()
    }

    /// Lets `decode_for_crop` use every libjpeg-turbo factor <= 1, not only powers of two.
    /// For benchmarks only (see `docs/decode.md`).
    #[doc(hidden)]
    pub fn use_all_scaling_factors(&mut self, all: bool) {
        self.factors = Self::allowed_factors(all);
    }

    /// What this decoder refuses before decoding.
    pub fn limits(&self) -> Limits {
        self.limits
    }

    /// Reads the header of `bytes` with this decoder's instance and checks it against the
    /// limits.
    pub fn probe(&mut self, bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
        let result = self.begin(bytes);
        self.recover(result)
    }

    fn check_file_size(&self, bytes: &[u8]) -> Result<(), DecodeError> {
        if bytes.len() as u64 > self.limits.max_file_bytes {
            return Err(DecodeError::FileTooLarge {
                len: bytes.len() as u64,
                limit: self.limits.max_file_bytes,
            });
        }
        Ok(())
    }

    fn begin(&mut self, bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
        self.check_file_size(bytes)?;
        let header = read_header(&mut self.tj, bytes, self.limits.max_pixels)?;
        header.check_limits(&self.limits)?;
        Ok(header)
    }

    /// Decodes the whole image (of any format stoker decodes) at full size into `out` (packed
    /// RGB).
    pub fn decode_full(&mut self, bytes: &[u8], out: &mut RgbImage) -> Result<(), DecodeError> {
        if let Some(format) = other_format(bytes) {
            return self.decode_other(format, bytes, out);
        }
        let result = self.decode_full_inner(bytes, out);
        self.recover(result)
    }

    fn decode_full_inner(&mut self, bytes: &[u8], out: &mut RgbImage) -> Result<(), DecodeError> {
        let header = self.begin(bytes)?;
        let plan = RegionPlan {
            factor: ScalingFactor::ONE,
            crop: None,
            width: header.width,
            height: header.height,
            box_out: CropBox::full(header.width, header.height),
        };
        self.run(bytes, &header, &plan, out)
    }

    /// Decodes only the part of the image covering `want` (full-image pixel coordinates), at
    /// the smallest DCT scale (1, 1/2, 1/4 or 1/8) that keeps `want` at least `out_size`
    /// (height, width) big, never upscaling. Returns where `want` lies in `out`'s pixels: `out`
    /// holds the box plus a margin of up to [`REGION_MARGIN`] scaled pixels on each side (so the
    /// box's pixels equal a full decode's), and its left edge is aligned down to the scaled iMCU
    /// width as TurboJPEG requires, so it may start up to one iMCU further left. Images whose
    /// subsampling TurboJPEG cannot name are decoded whole at the chosen scale. PNG and WebP
    /// images are decoded whole at full size (`want` is returned as it is).
    pub fn decode_for_crop(
        &mut self,
        bytes: &[u8],
        want: CropBox,
        out_size: (u32, u32),
        out: &mut RgbImage,
    ) -> Result<CropBox, DecodeError> {
        if let Some(format) = other_format(bytes) {
            return self.decode_other_for_crop(format, bytes, want, out);
        }
        let result = self.begin(bytes).and_then(|header| {
            // A region decode stops at the region's last row, so a file cut short below it
            // would pass (and pass or fail by crop box, epoch to epoch): require its end.
            if !sniff::has_end_after_scan(bytes) {
                return Err(DecodeError::Truncated {
                    detail: String::from("no end-of-image marker after the scan data"),
                });
            }
            let plan = plan_region(&header, want, out_size, &self.factors)?;
            self.run_region(bytes, &header, &plan, out)?;
            Ok(plan.box_out)
        });
        self.recover(result)
    }

    /// Runs `plan`, skipping the entropy decoding a region does not need where the file
    /// allows: its restart intervals (`restart`), else its entry points (`entry`).
    fn run_region(
        &mut self,
        bytes: &[u8],
        header: &JpegHeader,
        plan: &RegionPlan,
        out: &mut RgbImage,
    ) -> Result<(), DecodeError> {
        if let Some(region) = plan.crop {
            if self.run_restart_intervals(bytes, plan, region, out)?
                || self.run_from_entry(bytes, plan, region, out)?
            {
                return Ok(());
            }
        }
        self.run(bytes, header, plan, out)
    }

    fn run(
        &mut self,
        bytes: &[u8],
        header: &JpegHeader,
        plan: &RegionPlan,
        out: &mut RgbImage,
    ) -> Result<(), DecodeError> {
        let tj = &mut self.tj;
        tj.set_scaling_factor(plan.factor)
            .map_err(DecodeError::from_tj)?;
        let (x, y, w, h) = plan.crop.unwrap_or((0, 0, 0, 0));
        tj.set_cropping_region(x, y, w, h)
            .map_err(DecodeError::from_tj)?;
        out.reset(plan.width, plan.height);
        match header.colorspace {
            ColorSpace::Cmyk | ColorSpace::Ycck => {
                let n = plan.width as usize * plan.height as usize * 4;
                self.cmyk.resize(n, 0);
                tj.decompress8(
                    bytes,
                    &mut self.cmyk,
                    plan.width,
                    plan.height,
                    PixelFormat::Cmyk,
                )
                .map_err(DecodeError::from_tj)?;
                inverted_cmyk_to_rgb(&self.cmyk, &mut out.data);
            }
            _ => tj
                .decompress8(
                    bytes,
                    &mut out.data,
                    plan.width,
                    plan.height,
                    PixelFormat::Rgb,
                )
                .map_err(DecodeError::from_tj)?,
        }
        Ok(())
    }
}

/// The format of `bytes` when it is one decoded outside libjpeg-turbo (PNG, WebP).
fn other_format(bytes: &[u8]) -> Option<ImageFormat> {
    ImageFormat::detect(bytes).filter(|&f| f != ImageFormat::Jpeg)
}

/// Adobe-style CMYK (as stored by Photoshop and returned by libjpeg: 255 = no ink) to RGB:
/// `R = C * K / 255`, rounded, exactly as libjpeg-turbo's `djpeg` does.
// `(v * k + 127) / 255` with `v, k <= 255` is at most 255.
#[allow(clippy::cast_possible_truncation)]
fn inverted_cmyk_to_rgb(cmyk: &[u8], rgb: &mut [u8]) {
    debug_assert_eq!(cmyk.len() / 4 * 3, rgb.len());
    for (src, dst) in cmyk.chunks_exact(4).zip(rgb.chunks_exact_mut(3)) {
        let k = src[3] as u32;
        for i in 0..3 {
            dst[i] = ((src[i] as u32 * k + 127) / 255) as u8;
        }
    }
}

#[cfg(test)]
mod tests;
