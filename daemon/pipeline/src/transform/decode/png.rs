//! PNG to packed 8-bit RGB with the `png` crate (pure Rust, `forbid(unsafe_code)`): palette and
//! low-depth gray expanded, 16-bit samples cut to their high byte, alpha dropped.

#![forbid(unsafe_code)]

use std::io::{self, Cursor};

use ::png::{BitDepth, ColorType, Decoder, DecodingError, Transformations};
use stoker_kernels::image::RgbImage;

use super::error::check_size;
use super::{DecodeError, ImageFormat, Limits};

/// The (width, height) of a PNG, from its IHDR chunk (no pixel is decoded).
pub(super) fn size(bytes: &[u8]) -> Result<(u32, u32), DecodeError> {
    let mut decoder = Decoder::new(Cursor::new(bytes));
    let info = decoder.read_header_info().map_err(error)?;
    Ok((info.width, info.height))
}

/// Decodes the whole PNG into `out`; `scratch` holds the decoder's output before conversion.
/// The size is checked against `limits` before any pixel buffer is allocated, and the file must
/// run to its IEND chunk.
pub(super) fn decode(
    bytes: &[u8],
    limits: &Limits,
    out: &mut RgbImage,
    scratch: &mut Vec<u8>,
) -> Result<(), DecodeError> {
    let mut decoder = Decoder::new(Cursor::new(bytes));
    // EXPAND: palette to RGB(A), gray under 8 bits to 8 bits (scaled to 0..255), tRNS to
    // alpha. STRIP_16: 16-bit samples to their high byte, as libpng's png_set_strip_16.
    decoder.set_transformations(Transformations::EXPAND | Transformations::STRIP_16);
    decoder.set_ignore_text_chunk(true);
    decoder.set_ignore_iccp_chunk(true);
    let info = decoder.read_header_info().map_err(error)?;
    let (width, height) = (info.width, info.height);
    check_size(ImageFormat::Png, width, height, limits)?;
    let mut reader = decoder.read_info().map_err(error)?;
    let (color, depth) = reader.output_color_type();
    let channels = match (color, depth) {
        (ColorType::Grayscale, BitDepth::Eight) => 1,
        (ColorType::GrayscaleAlpha, BitDepth::Eight) => 2,
        (ColorType::Rgb, BitDepth::Eight) => 3,
        (ColorType::Rgba, BitDepth::Eight) => 4,
        other => {
            return Err(DecodeError::Internal {
                detail: format!("PNG decoder gave {other:?} after expansion to 8 bits"),
            })
        }
    };
    let len = reader.output_buffer_size().ok_or(DecodeError::TooLarge {
        w: width,
        h: height,
        limit: limits.max_pixels,
    })?;
    scratch.resize(len, 0);
    let frame = reader.next_frame(scratch).map_err(error)?;
    reader.finish().map_err(error)?;
    out.reset(width, height);
    let row_out = width as usize * 3;
    let rows = scratch
        .chunks(frame.line_size)
        .zip(out.data.chunks_exact_mut(row_out));
    for (src, dst) in rows {
        to_rgb(&src[..width as usize * channels], channels, dst);
    }
    Ok(())
}

/// One row of 1 (gray), 2 (gray, alpha), 3 (RGB) or 4 (RGBA) channels to RGB, alpha dropped.
pub(super) fn to_rgb(src: &[u8], channels: usize, dst: &mut [u8]) {
    match channels {
        3 => dst.copy_from_slice(src),
        1 | 2 => {
            for (s, d) in src.chunks_exact(channels).zip(dst.chunks_exact_mut(3)) {
                d.fill(s[0]);
            }
        }
        _ => {
            for (s, d) in src.chunks_exact(channels).zip(dst.chunks_exact_mut(3)) {
                d.copy_from_slice(&s[..3]);
            }
        }
    }
}

fn error(e: DecodingError) -> DecodeError {
    let format = ImageFormat::Png;
    match e {
        DecodingError::IoError(e) if e.kind() == io::ErrorKind::UnexpectedEof => {
            DecodeError::TruncatedImage {
                format,
                detail: e.to_string(),
            }
        }
        DecodingError::LimitsExceeded => DecodeError::Internal {
            detail: String::from("the PNG decoder's memory limit was exceeded"),
        },
        DecodingError::Parameter(e) => DecodeError::Internal {
            detail: e.to_string(),
        },
        other => DecodeError::CorruptImage {
            format,
            detail: other.to_string(),
        },
    }
}
