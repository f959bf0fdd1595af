//! Why an image could not be decoded: one enum for every format, each variant with a stable
//! reason code for counting (`badsample::REASONS`).

use stoker_kernels::image::CropBox;

use super::sys::TjError;
use super::{ImageFormat, Limits, MAX_SCANS};

/// Why an image could not be decoded. Each variant has a stable [`DecodeError::reason`] code.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DecodeError {
    /// The data is no format stoker decodes (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM).
    #[error(
        "not an image format stoker decodes (JPEG, PNG, WebP, BMP, TIFF, PPM/PGM): looks like \
         {what}"
    )]
    UnknownFormat {
        /// What the first bytes look like (a name, or the bytes in hex).
        what: String,
    },
    /// A file of another format than JPEG that ends before its image does.
    #[error("truncated {format} data: {detail}")]
    TruncatedImage {
        /// The file's format.
        format: ImageFormat,
        /// The format decoder's message.
        detail: String,
    },
    /// A file of another format than JPEG its decoder found invalid.
    #[error("corrupt {format} data: {detail}")]
    CorruptImage {
        /// The file's format.
        format: ImageFormat,
        /// The format decoder's message.
        detail: String,
    },
    /// The data ends before the image does.
    #[error("truncated JPEG data: {detail}")]
    Truncated {
        /// libjpeg's message.
        detail: String,
    },
    /// libjpeg found the data invalid and stopped.
    #[error("corrupt JPEG data: {detail}")]
    Corrupt {
        /// libjpeg's message.
        detail: String,
    },
    /// libjpeg found damaged data it would have patched over (a warning); treated as an error.
    #[error("corrupt JPEG data (libjpeg warning, treated as an error): {detail}")]
    Warning {
        /// libjpeg's warning.
        detail: String,
    },
    /// A valid image of another format than JPEG of a kind stoker does not decode (a TIFF of
    /// floating-point samples, ...).
    #[error("unsupported {format}: {what}")]
    UnsupportedImage {
        /// The image's format.
        format: ImageFormat,
        /// What kind of image it is.
        what: String,
    },
    /// A valid JPEG of a kind stoker does not decode (12-bit, lossless, ...).
    #[error("unsupported JPEG: {what}")]
    Unsupported {
        /// What kind of JPEG it is.
        what: String,
    },
    /// More pixels than [`Limits::max_pixels`].
    #[error("image too large: {w}x{h} is over the limit of {limit} pixels")]
    TooLarge {
        /// Width in pixels.
        w: u32,
        /// Height in pixels.
        h: u32,
        /// The limit in pixels.
        limit: u64,
    },
    /// A larger file than [`Limits::max_file_bytes`].
    #[error("file too large: {len} bytes is over the limit of {limit} bytes")]
    FileTooLarge {
        /// The file's length in bytes.
        len: u64,
        /// The limit in bytes.
        limit: u64,
    },
    /// A progressive file with more than [`MAX_SCANS`] scans.
    #[error("too many progressive scans (limit {limit})")]
    TooManyScans {
        /// Scans allowed.
        limit: u32,
    },
    /// `decode_for_crop` was given a box that does not overlap the image.
    #[error("crop box {want:?} does not overlap the {w}x{h} image")]
    BadCrop {
        /// The box asked for, in full-image pixels.
        want: CropBox,
        /// The image's width in pixels.
        w: u32,
        /// The image's height in pixels.
        h: u32,
    },
    /// TurboJPEG failed for a reason unrelated to the data (for example out of memory).
    #[error("internal decoder error: {detail}")]
    Internal {
        /// TurboJPEG's message, or the call that failed.
        detail: String,
    },
}

impl DecodeError {
    /// A short, stable snake_case code for counting failures by reason.
    pub fn reason(&self) -> &'static str {
        match self {
            DecodeError::UnknownFormat { .. } => "unknown_format",
            DecodeError::Truncated { .. } | DecodeError::TruncatedImage { .. } => "truncated",
            DecodeError::Corrupt { .. } | DecodeError::CorruptImage { .. } => "corrupt",
            DecodeError::Warning { .. } => "corrupt_warning",
            DecodeError::Unsupported { .. } | DecodeError::UnsupportedImage { .. } => "unsupported",
            DecodeError::TooLarge { .. } => "too_large",
            DecodeError::FileTooLarge { .. } => "file_too_large",
            DecodeError::TooManyScans { .. } => "too_many_scans",
            DecodeError::BadCrop { .. } => "bad_crop",
            DecodeError::Internal { .. } => "internal",
        }
    }

    /// Maps a TurboJPEG failure to the variant its message describes.
    pub(super) fn from_tj(e: TjError) -> DecodeError {
        // TurboJPEG's own errors are prefixed with the function name ("tj3Decompress8(): ...").
        let detail = match e.message.split_once("(): ") {
            Some((prefix, rest)) if prefix.starts_with("tj") => rest.to_owned(),
            _ => e.message.clone(),
        };
        let m = detail.as_str();
        if m.contains("Premature end of JPEG file") {
            DecodeError::Truncated { detail }
        } else if m.contains("exceeds maximum scans")
            || m.contains("Progressive JPEG image has more than")
        {
            DecodeError::TooManyScans { limit: MAX_SCANS }
        } else if m.contains("Unsupported JPEG process")
            || m.contains("Unsupported JPEG data precision")
            || m.contains("Requested features are incompatible")
        {
            DecodeError::Unsupported { what: detail }
        } else if m.contains("Memory allocation failure") || m.contains("Insufficient memory") {
            DecodeError::Internal { detail }
        } else if e.warning {
            DecodeError::Warning { detail }
        } else {
            DecodeError::Corrupt { detail }
        }
    }
}

/// `width` x `height` is neither empty nor over `limits.max_pixels`.
pub(super) fn check_size(
    format: ImageFormat,
    width: u32,
    height: u32,
    limits: &Limits,
) -> Result<(), DecodeError> {
    if width == 0 || height == 0 {
        return Err(DecodeError::CorruptImage {
            format,
            detail: format!("empty image {width}x{height}"),
        });
    }
    if !limits.admits(width, height) {
        return Err(DecodeError::TooLarge {
            w: width,
            h: height,
            limit: limits.max_pixels,
        });
    }
    Ok(())
}
