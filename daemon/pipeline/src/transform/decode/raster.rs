//! BMP, TIFF and PPM/PGM to packed 8-bit RGB with the `image` crate's decoders (image-rs, pure
//! Rust): the formats torchvision's ImageFolder takes beside JPEG, PNG and WebP.
//!
//! # Design
//! - As Pillow's `convert("RGB")`: gray is repeated into the three channels, a palette is
//!   expanded, alpha is dropped (not composited); 16-bit samples keep their high byte, as for
//!   PNG (`png.rs`).
//! - The size comes from the header first and is checked against the limits before any pixel
//!   buffer is allocated; the decoder's own allocation limit is set just above what that size
//!   needs, so a file whose strips or rows claim more cannot make it allocate more.
//!
//! # Limitations
//! - Floating-point and 32-bit integer samples (TIFF) and CMYK TIFFs are `unsupported`.
//! - A multi-page TIFF gives its first page; EXIF orientation is not read (stored order).

#![forbid(unsafe_code)]

use std::io::{self, Cursor};

use ::image::error::{ImageError, LimitErrorKind};
use ::image::{DynamicImage, ImageReader};
use stoker_kernels::image::RgbImage;

use super::error::check_size;
use super::png::to_rgb;
use super::{DecodeError, ImageFormat, Limits};

/// The `image` crate's name for `format`; `None` for the formats other modules decode.
fn crate_format(format: ImageFormat) -> Option<::image::ImageFormat> {
    match format {
        ImageFormat::Bmp => Some(::image::ImageFormat::Bmp),
        ImageFormat::Tiff => Some(::image::ImageFormat::Tiff),
        ImageFormat::Pnm => Some(::image::ImageFormat::Pnm),
        ImageFormat::Jpeg | ImageFormat::Png | ImageFormat::WebP => None,
    }
}

fn reader(format: ImageFormat, bytes: &[u8]) -> Result<ImageReader<Cursor<&[u8]>>, DecodeError> {
    let f = crate_format(format).ok_or_else(|| DecodeError::Internal {
        detail: format!("a {format} image sent to the BMP/TIFF/PPM decoder"),
    })?;
    Ok(ImageReader::with_format(Cursor::new(bytes), f))
}

/// The (width, height) of a BMP, TIFF or PPM/PGM image, from its header.
pub(super) fn size(format: ImageFormat, bytes: &[u8]) -> Result<(u32, u32), DecodeError> {
    reader(format, bytes)?
        .into_dimensions()
        .map_err(|e| error(format, e))
}

/// Decodes the whole image into `out`; `scratch` holds 16-bit samples cut to 8 bits before
/// the conversion to RGB. The size is checked against `limits` before decoding.
pub(super) fn decode(
    format: ImageFormat,
    bytes: &[u8],
    limits: &Limits,
    out: &mut RgbImage,
    scratch: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    let (width, height) = size(format, bytes)?;
    check_size(format, width, height, limits)?;
    let mut r = reader(format, bytes)?;
    let mut crate_limits = ::image::Limits::default();
    crate_limits.max_image_width = Some(width);
    crate_limits.max_image_height = Some(height);
    // The decoded buffer at its widest (4 channels of 16 bits) and room for the decoder's
    // own rows and strips.
    crate_limits.max_alloc = Some(u64::from(width) * u64::from(height) * 8 + (16 << 20));
    r.limits(crate_limits);
    let img = r.decode().map_err(|e| error(format, e))?;
    out.reset(width, height);
    let (data, channels): (&[u8], usize) = match &img {
        DynamicImage::ImageRgb8(b) => (b.as_raw(), 3),
        DynamicImage::ImageRgba8(b) => (b.as_raw(), 4),
        DynamicImage::ImageLuma8(b) => (b.as_raw(), 1),
        DynamicImage::ImageLumaA8(b) => (b.as_raw(), 2),
        DynamicImage::ImageRgb16(b) => (high_bytes(b.as_raw(), scratch), 3),
        DynamicImage::ImageRgba16(b) => (high_bytes(b.as_raw(), scratch), 4),
        DynamicImage::ImageLuma16(b) => (high_bytes(b.as_raw(), scratch), 1),
        DynamicImage::ImageLumaA16(b) => (high_bytes(b.as_raw(), scratch), 2),
        other => {
            return Err(DecodeError::UnsupportedImage {
                format,
                what: format!("{:?} samples", other.color()),
            })
        }
    };
    to_rgb(data, channels, &mut out.data);
    Ok(())
}

/// Each 16-bit sample's high byte, into `scratch`.
fn high_bytes<'a>(samples: &[u16], scratch: &'a mut Vec<u8>) -> &'a [u8] {
    scratch.clear();
    scratch.extend(samples.iter().map(|s| s.to_be_bytes()[0]));
    scratch
}

fn error(format: ImageFormat, e: ImageError) -> DecodeError {
    match e {
        ImageError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            DecodeError::TruncatedImage {
                format,
                detail: e.to_string(),
            }
        }
        ImageError::Unsupported(e) => DecodeError::UnsupportedImage {
            format,
            what: e.to_string(),
        },
        ImageError::Limits(l) if matches!(l.kind(), LimitErrorKind::InsufficientMemory) => {
            DecodeError::CorruptImage {
                format,
                detail: String::from("the file claims more memory than its size needs"),
            }
        }
        other => DecodeError::CorruptImage {
            format,
            detail: other.to_string(),
        },
    }
}

#[cfg(test)]
mod tests {
    use super::super::{probe_image, CpuDecoder};
    use super::*;

    /// A 24-bit BMP header claiming `width` x `height`, followed by `pixels`.
    fn bmp(width: i32, height: i32, pixels: &[u8]) -> Vec<u8> {
        let mut b = b"BM".to_vec();
        let len = u32::try_from(54 + pixels.len()).unwrap();
        for v in [len, 0, 54, 40] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&width.to_le_bytes());
        b.extend_from_slice(&height.to_le_bytes());
        b.extend_from_slice(&1u16.to_le_bytes());
        b.extend_from_slice(&24u16.to_le_bytes());
        b.extend_from_slice(&[0; 24]);
        b.extend_from_slice(pixels);
        b
    }

    fn decode(bytes: &[u8]) -> Result<RgbImage, DecodeError> {
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut out = RgbImage::default();
        d.decode_full(bytes, &mut out).map(|()| out)
    }

    #[test]
    fn a_bmp_decodes_bottom_up_rows_to_rgb() {
        // 2 x 2, bottom row first, BGR, rows padded to 4 bytes.
        let rows = [[1, 2, 3, 4, 5, 6, 0, 0], [7, 8, 9, 10, 11, 12, 0, 0]].concat();
        let img = decode(&bmp(2, 2, &rows)).unwrap();
        assert_eq!((img.width, img.height), (2, 2));
        assert_eq!(img.data, [9, 8, 7, 12, 11, 10, 3, 2, 1, 6, 5, 4]);
    }

    #[test]
    fn a_bmp_bomb_is_too_large_before_decoding_and_a_cut_one_is_an_error() {
        let bomb = bmp(60_000, 60_000, &[]);
        let h = probe_image(&bomb).unwrap();
        assert_eq!(
            (h.format, h.width, h.height),
            (ImageFormat::Bmp, 60_000, 60_000)
        );
        assert_eq!(decode(&bomb).unwrap_err().reason(), "too_large");
        let cut = bmp(2, 2, &[1, 2, 3]);
        let err = decode(&cut).unwrap_err();
        assert!(["truncated", "corrupt"].contains(&err.reason()), "{err}");
        assert!(err.to_string().contains("BMP"), "{err}");
    }

    #[test]
    fn a_16_bit_pgm_keeps_the_high_bytes_and_a_broken_tiff_is_corrupt() {
        let mut pgm = b"P5\n2 1\n65535\n".to_vec();
        pgm.extend_from_slice(&[0x12, 0x34, 0xAB, 0xCD]);
        let img = decode(&pgm).unwrap();
        assert_eq!(img.data, [0x12, 0x12, 0x12, 0xAB, 0xAB, 0xAB]);
        let err = decode(b"II*\0\xff\xff\xff\x7fjunk").unwrap_err();
        assert!(err.to_string().contains("TIFF"), "{err}");
    }
}
