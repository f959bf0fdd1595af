//! The only unsafe code of the decoder: an owning handle to a TurboJPEG 3 instance and one safe
//! method per TurboJPEG call. Every call returns `Result<_, TjError>` carrying libjpeg's message.

use std::ffi::CStr;
use std::ptr::NonNull;

use turbojpeg_sys as tj;

/// A TurboJPEG failure: the message libjpeg-turbo recorded and whether it was only a warning
/// (`TJERR_WARNING`, raised as an error because `TJPARAM_STOPONWARNING` is set).
#[derive(Debug, Clone)]
pub(crate) struct TjError {
    pub(crate) message: String,
    pub(crate) warning: bool,
}

/// A TurboJPEG 3 pixel format understood by [`TjHandle::decompress8`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum PixelFormat {
    Rgb,
    Gray,
    Cmyk,
}

impl PixelFormat {
    pub(crate) fn bytes_per_pixel(self) -> usize {
        match self {
            PixelFormat::Rgb => 3,
            PixelFormat::Gray => 1,
            PixelFormat::Cmyk => 4,
        }
    }

    fn raw(self) -> libc::c_int {
        match self {
            PixelFormat::Rgb => tj::TJPF_TJPF_RGB,
            PixelFormat::Gray => tj::TJPF_TJPF_GRAY,
            PixelFormat::Cmyk => tj::TJPF_TJPF_CMYK,
        }
    }
}

/// A TurboJPEG parameter this crate reads or writes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Param {
    StopOnWarning,
    JpegWidth,
    JpegHeight,
    Subsamp,
    Precision,
    Colorspace,
    Progressive,
    Arithmetic,
    Lossless,
    ScanLimit,
    MaxPixels,
    Quality,
    RestartRows,
    RestartBlocks,
    SaveMarkers,
    FastUpsample,
}

impl Param {
    // TJPARAM values are small enum constants.
    #[allow(clippy::cast_possible_wrap)]
    fn raw(self) -> libc::c_int {
        let p = match self {
            Param::StopOnWarning => tj::TJPARAM_TJPARAM_STOPONWARNING,
            Param::JpegWidth => tj::TJPARAM_TJPARAM_JPEGWIDTH,
            Param::JpegHeight => tj::TJPARAM_TJPARAM_JPEGHEIGHT,
            Param::Subsamp => tj::TJPARAM_TJPARAM_SUBSAMP,
            Param::Precision => tj::TJPARAM_TJPARAM_PRECISION,
            Param::Colorspace => tj::TJPARAM_TJPARAM_COLORSPACE,
            Param::Progressive => tj::TJPARAM_TJPARAM_PROGRESSIVE,
            Param::Arithmetic => tj::TJPARAM_TJPARAM_ARITHMETIC,
            Param::Lossless => tj::TJPARAM_TJPARAM_LOSSLESS,
            Param::ScanLimit => tj::TJPARAM_TJPARAM_SCANLIMIT,
            Param::MaxPixels => tj::TJPARAM_TJPARAM_MAXPIXELS,
            Param::Quality => tj::TJPARAM_TJPARAM_QUALITY,
            Param::RestartRows => tj::TJPARAM_TJPARAM_RESTARTROWS,
            Param::RestartBlocks => tj::TJPARAM_TJPARAM_RESTARTBLOCKS,
            Param::SaveMarkers => tj::TJPARAM_TJPARAM_SAVEMARKERS,
            Param::FastUpsample => tj::TJPARAM_TJPARAM_FASTUPSAMPLE,
        };
        p as libc::c_int
    }
}

/// An image dimension as TurboJPEG takes it; one past `c_int` becomes -1, which it rejects.
fn c_dim(v: u32) -> libc::c_int {
    libc::c_int::try_from(v).unwrap_or(-1)
}

/// A scaling factor `num / denom` that libjpeg-turbo's IDCT supports.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ScalingFactor {
    pub(crate) num: u32,
    pub(crate) denom: u32,
}

impl ScalingFactor {
    pub(crate) const ONE: ScalingFactor = ScalingFactor { num: 1, denom: 1 };

    /// `TJSCALED`: the size of a `dim`-pixel dimension after scaling (rounded up).
    // JPEG dimensions are at most 65,535 and libjpeg-turbo's factors at most 2: it fits a u32.
    #[allow(clippy::cast_possible_truncation)]
    pub(crate) fn scale(self, dim: u32) -> u32 {
        ((dim as u64 * self.num as u64).div_ceil(self.denom as u64)) as u32
    }

    pub(crate) fn as_f64(self) -> f64 {
        self.num as f64 / self.denom as f64
    }
}

/// Every scaling factor libjpeg-turbo supports (`tj3GetScalingFactors`), largest first.
pub(crate) fn scaling_factors() -> Vec<ScalingFactor> {
    let mut n: libc::c_int = 0;
    // SAFETY: `n` is a valid out-pointer; the returned pointer is either null or points to a
    // static array of `n` factors owned by the library for the life of the process.
    let ptr = unsafe { tj::tj3GetScalingFactors(&mut n) };
    if ptr.is_null() || n <= 0 {
        return vec![ScalingFactor::ONE];
    }
    // SAFETY: see above: `ptr` points to `n` initialised, immutable `tjscalingfactor`s.
    let raw = unsafe { std::slice::from_raw_parts(ptr, usize::try_from(n).unwrap_or(0)) };
    let mut out: Vec<ScalingFactor> = raw
        .iter()
        .filter(|f| f.num > 0 && f.denom > 0)
        .map(|f| ScalingFactor {
            num: f.num.unsigned_abs(),
            denom: f.denom.unsigned_abs(),
        })
        .collect();
    out.sort_by(|a, b| b.as_f64().total_cmp(&a.as_f64()));
    out
}

/// An owning handle to one TurboJPEG instance, destroyed on drop.
pub(crate) struct TjHandle {
    raw: NonNull<libc::c_void>,
}

// SAFETY: a TurboJPEG instance has no thread affinity (no thread-local state, no TLS-bound
// allocations); it only must not be used from two threads at once, which `&mut self` on every
// method that touches it guarantees. It is therefore `Send` but deliberately not `Sync`.
unsafe impl Send for TjHandle {}

impl TjHandle {
    /// A decompressor instance, or `None` when TurboJPEG cannot allocate one.
    pub(crate) fn new_decompressor() -> Option<TjHandle> {
        Self::init(tj::TJINIT_TJINIT_DECOMPRESS)
    }

    pub(crate) fn new_compressor() -> Option<TjHandle> {
        Self::init(tj::TJINIT_TJINIT_COMPRESS)
    }

    /// A lossless-transform instance (decompresses coefficients, compresses them again; or
    /// only decompresses them, [`TjHandle::read_coefficients`]).
    pub(crate) fn new_transformer() -> Option<TjHandle> {
        Self::init(tj::TJINIT_TJINIT_TRANSFORM)
    }

    fn init(kind: tj::TJINIT) -> Option<TjHandle> {
        // TJINIT values are small enum constants.
        #[allow(clippy::cast_possible_wrap)]
        let kind = kind as libc::c_int;
        // SAFETY: tj3Init has no preconditions; it returns an owned instance or null.
        let raw = unsafe { tj::tj3Init(kind) };
        NonNull::new(raw).map(|raw| TjHandle { raw })
    }

    fn last_error(&mut self) -> TjError {
        // SAFETY: the handle is live; tj3GetErrorStr returns a NUL-terminated string owned by
        // the instance, valid until the next call on it; we copy it out at once.
        let message = unsafe {
            let s = tj::tj3GetErrorStr(self.raw.as_ptr());
            if s.is_null() {
                String::from("unknown TurboJPEG error")
            } else {
                CStr::from_ptr(s).to_string_lossy().into_owned()
            }
        };
        // SAFETY: the handle is live.
        let code = unsafe { tj::tj3GetErrorCode(self.raw.as_ptr()) };
        TjError {
            message,
            // TJERR values are small enum constants.
            #[allow(clippy::cast_possible_wrap)]
            warning: code == tj::TJERR_TJERR_WARNING as libc::c_int,
        }
    }

    fn check(&mut self, rc: libc::c_int) -> Result<(), TjError> {
        if rc == 0 {
            Ok(())
        } else {
            Err(self.last_error())
        }
    }

    pub(crate) fn set(&mut self, param: Param, value: i32) -> Result<(), TjError> {
        // SAFETY: the handle is live; tj3Set validates `param` and `value`.
        let rc = unsafe { tj::tj3Set(self.raw.as_ptr(), param.raw(), value) };
        self.check(rc)
    }

    pub(crate) fn get(&mut self, param: Param) -> i32 {
        // SAFETY: the handle is live; tj3Get returns -1 for unknown parameters.
        unsafe { tj::tj3Get(self.raw.as_ptr(), param.raw()) }
    }

    /// Reads the JPEG header of `jpeg`; the parameters (width, height, subsampling, ...) can
    /// then be read with [`TjHandle::get`]. A following [`TjHandle::decompress8`] must be given
    /// the same buffer.
    pub(crate) fn decompress_header(&mut self, jpeg: &[u8]) -> Result<(), TjError> {
        // SAFETY: the handle is live; `jpeg` is valid for `jpeg.len()` bytes and is only read
        // during the call (TurboJPEG keeps no pointer into it past the call).
        let rc = unsafe {
            tj::tj3DecompressHeader(self.raw.as_ptr(), jpeg.as_ptr(), jpeg.len() as tj::size_t)
        };
        self.check(rc)
    }

    pub(crate) fn set_scaling_factor(&mut self, f: ScalingFactor) -> Result<(), TjError> {
        // Factors come from `scaling_factors`, positive c_ints.
        #[allow(clippy::cast_possible_wrap)]
        let raw = tj::tjscalingfactor {
            num: f.num as libc::c_int,
            denom: f.denom as libc::c_int,
        };
        // SAFETY: the handle is live; the factor is passed by value and validated.
        let rc = unsafe { tj::tj3SetScalingFactor(self.raw.as_ptr(), raw) };
        self.check(rc)
    }

    /// Sets the cropping region (in scaled pixels; all zero for none). Must follow
    /// [`TjHandle::decompress_header`] and [`TjHandle::set_scaling_factor`].
    pub(crate) fn set_cropping_region(
        &mut self,
        x: u32,
        y: u32,
        w: u32,
        h: u32,
    ) -> Result<(), TjError> {
        // Scaled pixels of a JPEG, whose dimensions are at most 65,535.
        #[allow(clippy::cast_possible_wrap)]
        let region = tj::tjregion {
            x: x as libc::c_int,
            y: y as libc::c_int,
            w: w as libc::c_int,
            h: h as libc::c_int,
        };
        // SAFETY: the handle is live; the region is passed by value and validated against the
        // header read before.
        let rc = unsafe { tj::tj3SetCroppingRegion(self.raw.as_ptr(), region) };
        self.check(rc)
    }

    /// Decompresses `jpeg` (the buffer whose header was read last) into `dst`, which must hold
    /// exactly `width * height * format.bytes_per_pixel()` bytes for the scaled, cropped size.
    pub(crate) fn decompress8(
        &mut self,
        jpeg: &[u8],
        dst: &mut [u8],
        width: u32,
        height: u32,
        format: PixelFormat,
    ) -> Result<(), TjError> {
        let pitch = width as usize * format.bytes_per_pixel();
        assert_eq!(
            dst.len(),
            pitch * height as usize,
            "destination buffer does not match the output size"
        );
        let pitch = libc::c_int::try_from(pitch).map_err(|_| TjError {
            message: String::from("row too wide"),
            warning: false,
        })?;
        // SAFETY: the handle is live; `jpeg` is readable for its length; `dst` is writable for
        // `pitch * height` bytes (asserted above), which is exactly what TurboJPEG writes for the
        // scaled, cropped output the caller computed from the same header and settings.
        let rc = unsafe {
            tj::tj3Decompress8(
                self.raw.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len() as tj::size_t,
                dst.as_mut_ptr(),
                pitch,
                format.raw(),
            )
        };
        self.check(rc)
    }

    /// Decompresses `jpeg` (the buffer whose header was read last) to planar YUV at the scaling
    /// factor set: the stored components, not upsampled, not colour converted. Only the
    /// measurement behind the decision to keep RGB decoding calls it (`docs/decisions.md`,
    /// "Colour at the output size").
    ///
    /// # Panics
    /// If `planes` does not hold three planes of at least `strides[i] * rows` bytes for the
    /// scaled image (one plane suffices for grayscale).
    #[cfg(test)]
    pub(crate) fn decompress_yuv8(
        &mut self,
        jpeg: &[u8],
        planes: &mut [Vec<u8>; 3],
        strides: [libc::c_int; 3],
        rows: [usize; 3],
    ) -> Result<(), TjError> {
        for ((p, &s), &r) in planes.iter().zip(&strides).zip(&rows) {
            assert!(
                p.len() >= usize::try_from(s).unwrap_or(usize::MAX) * r,
                "plane too small"
            );
        }
        let mut ptrs = planes.each_mut().map(|p| p.as_mut_ptr());
        let mut strides = strides;
        // SAFETY: the handle is live; `jpeg` is readable for its length; each plane pointer is
        // writable for `strides[i] * rows[i]` bytes (asserted), which the caller computed from
        // the header and scaling factor set on this handle, as tj3YUVPlaneHeight gives them.
        let rc = unsafe {
            tj::tj3DecompressToYUVPlanes8(
                self.raw.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len() as tj::size_t,
                ptrs.as_mut_ptr(),
                strides.as_mut_ptr(),
            )
        };
        self.check(rc)
    }

    /// Entropy-decodes every DCT coefficient of `jpeg` and nothing else: no IDCT, no
    /// upsampling, no colour conversion, no output. This is libjpeg's
    /// `jpeg_read_coefficients`, reached through `tj3Transform` with one `TJXOP_NONE` transform
    /// whose output is switched off (`TJXOPT_NOOUTPUT`, `TJXOPT_COPYNONE`). The handle must
    /// come from [`TjHandle::new_transformer`].
    pub(crate) fn read_coefficients(&mut self, jpeg: &[u8]) -> Result<(), TjError> {
        let options = tj::TJXOPT_NOOUTPUT | tj::TJXOPT_COPYNONE;
        // With TJXOPT_NOOUTPUT TurboJPEG writes no output: whatever came back is dropped.
        self.transform_none(jpeg, options).map(drop)
    }

    /// Compresses packed pixels (fixtures and `stoker synth`).
    pub(crate) fn compress8(
        &mut self,
        src: &[u8],
        width: u32,
        height: u32,
        format: PixelFormat,
    ) -> Result<Vec<u8>, TjError> {
        assert_eq!(
            src.len(),
            width as usize * height as usize * format.bytes_per_pixel()
        );
        let mut buf: *mut libc::c_uchar = std::ptr::null_mut();
        let mut size: tj::size_t = 0;
        // SAFETY: the handle is a live compressor; `src` holds `width * height` pixels of
        // `format` (asserted); with a null `buf` TurboJPEG allocates the output with tj3Alloc.
        let rc = unsafe {
            tj::tj3Compress8(
                self.raw.as_ptr(),
                src.as_ptr(),
                c_dim(width),
                0,
                c_dim(height),
                format.raw(),
                &mut buf,
                &mut size,
            )
        };
        let result = self.check(rc);
        // SAFETY: `buf` and `size` are what tj3Compress8 left: null, or its tj3Alloc'd output.
        let output = unsafe { take_output(buf, size) };
        result.map(|()| output)
    }
}

impl TjHandle {
    /// Losslessly rewrites `jpeg` (`tj3Transform`, no geometric operation): the DCT
    /// coefficients are copied untouched and entropy coded again with optimised Huffman tables
    /// and the restart interval set with [`Param::RestartBlocks`] / [`Param::RestartRows`].
    /// Extra markers (EXIF, ICC, comments) are copied as `TJPARAM_SAVEMARKERS` says.
    pub(crate) fn transform_recode(&mut self, jpeg: &[u8]) -> Result<Vec<u8>, TjError> {
        self.transform_none(jpeg, tj::TJXOPT_OPTIMIZE)
    }

    /// `tj3Transform` of `jpeg` with no geometric operation and the `TJXOPT_*` bits
    /// `options`; returns the output TurboJPEG wrote (empty with `TJXOPT_NOOUTPUT`). The
    /// handle must come from [`TjHandle::new_transformer`].
    fn transform_none(&mut self, jpeg: &[u8], options: u32) -> Result<Vec<u8>, TjError> {
        // TJXOP and TJXOPT values are small constants.
        #[allow(clippy::cast_possible_wrap)]
        let xform = tj::tjtransform {
            r: tj::tjregion {
                x: 0,
                y: 0,
                w: 0,
                h: 0,
            },
            op: tj::TJXOP_TJXOP_NONE as libc::c_int,
            options: options as libc::c_int,
            data: std::ptr::null_mut(),
            customFilter: None,
        };
        let mut buf: *mut libc::c_uchar = std::ptr::null_mut();
        let mut size: tj::size_t = 0;
        // SAFETY: the handle is a live transformer; `jpeg` is readable for its length during
        // the call; `buf`, `size` and `xform` are one valid element each (n = 1, no
        // callback); with a null `buf` TurboJPEG allocates any output with tj3Alloc and
        // stores its size in `size` (with TJXOPT_NOOUTPUT it writes none).
        let rc = unsafe {
            tj::tj3Transform(
                self.raw.as_ptr(),
                jpeg.as_ptr(),
                jpeg.len() as tj::size_t,
                1,
                &mut buf,
                &mut size,
                &xform,
            )
        };
        let result = self.check(rc);
        // SAFETY: `buf` and `size` are what tj3Transform left: null, or its tj3Alloc'd output.
        let output = unsafe { take_output(buf, size) };
        result.map(|()| output)
    }
}

/// Copies TurboJPEG's output out and frees it: empty for a null `buf`.
///
/// # Safety
/// `buf` is null or points to `size` readable bytes allocated by TurboJPEG (tj3Alloc) that
/// nothing else frees.
unsafe fn take_output(buf: *mut libc::c_uchar, size: tj::size_t) -> Vec<u8> {
    if buf.is_null() {
        return Vec::new();
    }
    // TurboJPEG's output lies in memory: its size fits a usize.
    #[allow(clippy::cast_possible_truncation)]
    let size = size as usize;
    // SAFETY: the caller's contract: `buf` points to `size` bytes TurboJPEG wrote.
    let output = unsafe { std::slice::from_raw_parts(buf, size) }.to_vec();
    // SAFETY: allocated by TurboJPEG (tj3Alloc) and freed once, here.
    unsafe { tj::tj3Free(buf.cast()) };
    output
}

impl Drop for TjHandle {
    fn drop(&mut self) {
        // SAFETY: the handle was created by tj3Init, is owned by `self`, and is destroyed
        // exactly once, here.
        unsafe { tj::tj3Destroy(self.raw.as_ptr()) }
    }
}
