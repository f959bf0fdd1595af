//! WebP (lossy and lossless) to packed 8-bit RGB with the `image-webp` crate (pure Rust,
//! `forbid(unsafe_code)`): alpha dropped; an animation gives its first frame.

#![forbid(unsafe_code)]

use std::io::{self, Cursor};

use image_webp::{DecodingError, WebPDecoder};
use stoker_kernels::image::RgbImage;

use super::error::check_size;
use super::png::to_rgb;
use super::{DecodeError, ImageFormat, Limits};

/// The (width, height) of a WebP image, from its RIFF chunks (no pixel is decoded).
pub(super) fn size(bytes: &[u8]) -> Result<(u32, u32), DecodeError> {
    Ok(WebPDecoder::new(Cursor::new(bytes))
        .map_err(error)?
        .dimensions())
}

/// Decodes the whole image into `out`; `scratch` holds RGBA pixels before alpha is dropped.
/// The size is checked against `limits` before any pixel buffer is allocated.
pub(super) fn decode(
    bytes: &[u8],
    limits: &Limits,
    out: &mut RgbImage,
    scratch: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    let mut decoder = WebPDecoder::new(Cursor::new(bytes)).map_err(error)?;
    let (width, height) = decoder.dimensions();
    check_size(ImageFormat::WebP, width, height, limits)?;
    if decoder.has_alpha() {
        scratch.resize(width as usize * height as usize * 4, 0);
        decoder.read_image(scratch).map_err(error)?;
        out.reset(width, height);
        to_rgb(scratch, 4, &mut out.data);
    } else {
        out.reset(width, height);
        decoder.read_image(&mut out.data).map_err(error)?;
    }
    Ok(())
}

fn error(e: DecodingError) -> DecodeError {
    let format = ImageFormat::WebP;
    match e {
        DecodingError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            DecodeError::TruncatedImage {
                format,
                detail: e.to_string(),
            }
        }
        DecodingError::MemoryLimitExceeded => DecodeError::Internal {
            detail: String::from("the WebP decoder's memory limit was exceeded"),
        },
        other => DecodeError::CorruptImage {
            format,
            detail: other.to_string(),
        },
    }
}
