//! The images nvJPEG is asked about and decodes into: a region to decode ([`Roi`]), where a
//! decoded image goes ([`DeviceImage`]) and what nvJPEG reads of a header ([`JpegInfo`]).

use std::ffi::c_int;

use super::{result, sys};

/// A region of an image to decode alone, in pixels of the full image (nvJPEG's ROI decode).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Roi {
    /// Left edge, pixels from the image's left.
    pub x: u32,
    /// Top edge, pixels from the image's top.
    pub y: u32,
    /// Width in pixels.
    pub width: u32,
    /// Height in pixels.
    pub height: u32,
}

/// Where one decoded image goes: interleaved RGB u8 at a device address, `pitch` bytes per row.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceImage {
    /// Device address of the image's first byte, in memory the caller owns.
    pub ptr: u64,
    /// Bytes from one row's start to the next (at least 3 * width).
    pub pitch: usize,
}

impl DeviceImage {
    pub(super) fn as_nvjpeg(self) -> sys::NvjpegImage {
        let mut img = sys::NvjpegImage::default();
        // CUDA runs only on 64-bit hosts, where a device address fits a pointer.
        #[allow(clippy::cast_possible_truncation)]
        let ptr = self.ptr as usize;
        img.channel[0] = ptr as *mut u8;
        img.pitch[0] = self.pitch;
        img
    }
}

/// Header facts of one JPEG, as nvJPEG reads them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct JpegInfo {
    /// Colour components in the file: 1 (gray), 3 (YCbCr) or 4 (CMYK/YCCK).
    pub components: u32,
    /// `nvjpegChromaSubsampling_t` (0 = 4:4:4, 2 = 4:2:0, 6 = gray, -1 = unknown).
    pub subsampling: i32,
    /// Image width in pixels (its largest component's).
    pub width: u32,
    /// Image height in pixels (its largest component's).
    pub height: u32,
}

impl JpegInfo {
    /// The image's size is its largest component's: nvJPEG lists component 0 first, which is
    /// smaller than the image when chroma is sampled finer than luma.
    pub(super) fn from_image_info(i: &result::ImageInfo) -> JpegInfo {
        let n = usize::try_from(i.components.max(1)).map_or(1, |c| c.min(sys::MAX_COMPONENT));
        let max =
            |v: &[c_int]| u32::try_from(v[..n].iter().copied().max().unwrap_or(0)).unwrap_or(0);
        JpegInfo {
            components: u32::try_from(i.components).unwrap_or(0),
            subsampling: i.subsampling,
            width: max(&i.widths),
            height: max(&i.heights),
        }
    }
}
