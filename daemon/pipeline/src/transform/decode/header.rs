//! What TurboJPEG reads of a JPEG's header ([`JpegHeader`]): size, chroma subsampling, colour
//! space and coding, before any pixel is decoded.

#![forbid(unsafe_code)]

use super::{DecodeError, Limits};

/// Chroma subsampling as TurboJPEG classifies it (`TJPARAM_SUBSAMP`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Subsampling {
    /// 4:4:4: chroma at full resolution.
    S444,
    /// 4:2:2: chroma at half the width.
    S422,
    /// 4:2:0: chroma at half the width and half the height.
    S420,
    /// One component: no chroma.
    Gray,
    /// 4:4:0: chroma at half the height.
    S440,
    /// 4:1:1: chroma at a quarter of the width.
    S411,
    /// 4:4:1: chroma at a quarter of the height.
    S441,
    /// Sampling factors outside the standard set (decodable, but not croppable by TurboJPEG).
    Unknown,
}

impl Subsampling {
    pub(super) fn from_raw(v: i32) -> Subsampling {
        match v {
            0 => Subsampling::S444,
            1 => Subsampling::S422,
            2 => Subsampling::S420,
            3 => Subsampling::Gray,
            4 => Subsampling::S440,
            5 => Subsampling::S411,
            6 => Subsampling::S441,
            _ => Subsampling::Unknown,
        }
    }

    /// Width in pixels of one iMCU (`tjMCUWidth`), `None` when unknown.
    pub(super) fn mcu_width(self) -> Option<u32> {
        match self {
            Subsampling::S444 | Subsampling::Gray | Subsampling::S440 | Subsampling::S441 => {
                Some(8)
            }
            Subsampling::S422 | Subsampling::S420 => Some(16),
            Subsampling::S411 => Some(32),
            Subsampling::Unknown => None,
        }
    }
}

/// The JPEG colour space (`TJPARAM_COLORSPACE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ColorSpace {
    /// Three components stored as RGB, not YCbCr (libjpeg's reading of the markers).
    Rgb,
    /// Luma and two chroma components: nearly every photo.
    YCbCr,
    /// One component.
    Gray,
    /// Four components, CMYK (Adobe, transform 0): converted to RGB here.
    Cmyk,
    /// Four components, YCCK (Adobe, transform 2): converted to RGB here.
    Ycck,
}

impl ColorSpace {
    pub(super) fn from_raw(v: i32) -> Option<ColorSpace> {
        Some(match v {
            0 => ColorSpace::Rgb,
            1 => ColorSpace::YCbCr,
            2 => ColorSpace::Gray,
            3 => ColorSpace::Cmyk,
            4 => ColorSpace::Ycck,
            _ => return None,
        })
    }
}

/// What the JPEG header says, read without decoding any pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegHeader {
    /// Pixels across, before any EXIF orientation.
    pub width: u32,
    /// Pixels down, before any EXIF orientation.
    pub height: u32,
    /// How the chroma is sampled.
    pub subsampling: Subsampling,
    /// How the components are to be read.
    pub colorspace: ColorSpace,
    /// Progressive coding (several scans).
    pub progressive: bool,
    /// Arithmetic entropy coding instead of Huffman.
    pub arithmetic: bool,
    /// Lossless coding (SOF3 and kin).
    pub lossless: bool,
    /// Bits per sample (8 for nearly every JPEG; 12 and 16 are rejected).
    pub precision: u8,
}

impl JpegHeader {
    /// Rejects what stoker does not decode: not 8-bit, lossless, empty.
    pub(super) fn check_supported(&self) -> Result<(), DecodeError> {
        if self.lossless {
            return Err(DecodeError::Unsupported {
                what: format!("lossless JPEG (SOF3), {}-bit", self.precision),
            });
        }
        if self.precision != 8 {
            return Err(DecodeError::Unsupported {
                what: format!(
                    "{}-bit samples (only 8-bit JPEG is decoded)",
                    self.precision
                ),
            });
        }
        if self.width == 0 || self.height == 0 {
            return Err(DecodeError::Corrupt {
                detail: format!("empty image {}x{}", self.width, self.height),
            });
        }
        Ok(())
    }

    pub(super) fn check_limits(&self, limits: &Limits) -> Result<(), DecodeError> {
        if !limits.admits(self.width, self.height) {
            return Err(DecodeError::TooLarge {
                w: self.width,
                h: self.height,
                limit: limits.max_pixels,
            });
        }
        Ok(())
    }
}
