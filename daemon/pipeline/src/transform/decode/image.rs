//! Every format behind one door: [`probe_image`] (the size the engines draw crops from, with
//! the format routing the image) and the CPU decode of the formats other than JPEG.
//!
//! # Design
//! - The format comes from the content ([`ImageFormat::detect`]), never from the name.
//! - PNG and WebP have no DCT to scale and no region decode: they are decoded whole at full
//!   size, and the augmenter cuts the crop from that, as from a JPEG decoded at scale 1. Both
//!   backends decode them here (the CUDA engine sends them to its CPU route).
//! - The file-size and pixel limits apply before any pixel buffer is allocated, as for JPEG:
//!   a PNG claiming 100000 x 100000 pixels in a few hundred bytes is `too_large`.
//!
//! # Limitations
//! - No colour management (ICC profiles, gAMA, cHRM are ignored), as for JPEG.

#![forbid(unsafe_code)]

use stoker_kernels::image::{CropBox, RgbImage};

use super::error::check_size;
use super::{exif, png, probe, raster, webp, CpuDecoder, DecodeError, ImageFormat, Limits};

/// What any image's header says, read without decoding a pixel.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ImageHeader {
    /// The format, by the file's content.
    pub format: ImageFormat,
    /// Width in pixels, as stored (before the EXIF orientation).
    pub width: u32,
    /// Height in pixels, as stored.
    pub height: u32,
    /// The EXIF orientation, 1 (stored order) to 8; 1 where the file has none (and for PNG and
    /// WebP, whose EXIF is not read).
    pub orientation: u8,
}

/// Reads the header of an image of any format stoker decodes, and checks it is not empty.
/// JPEGs are also checked to be of a kind stoker decodes ([`probe`]). Size limits are applied
/// by the decoder, not here.
pub fn probe_image(bytes: &[u8]) -> Result<ImageHeader, DecodeError> {
    let (format, (width, height), orientation) = match ImageFormat::detect(bytes) {
        Some(ImageFormat::Png) => (ImageFormat::Png, png::size(bytes)?, 1),
        Some(ImageFormat::WebP) => (ImageFormat::WebP, webp::size(bytes)?, 1),
        Some(f @ (ImageFormat::Bmp | ImageFormat::Tiff | ImageFormat::Pnm)) => {
            (f, raster::size(f, bytes)?, 1)
        }
        // JPEG, and the error naming what anything else looks like.
        Some(ImageFormat::Jpeg) | None => {
            let h = probe(bytes)?;
            let orientation = exif::jpeg_orientation(bytes);
            (ImageFormat::Jpeg, (h.width, h.height), orientation)
        }
    };
    check_size(format, width, height, &Limits::unlimited())?;
    Ok(ImageHeader {
        format,
        width,
        height,
        orientation,
    })
}

impl CpuDecoder {
    /// Decodes an image of another format than JPEG whole into `out` (packed RGB), within the
    /// limits.
    pub(super) fn decode_other(
        &mut self,
        format: ImageFormat,
        bytes: &[u8],
        out: &mut RgbImage,
    ) -> Result<(), DecodeError> {
        self.check_file_size(bytes)?;
        match format {
            ImageFormat::Png => png::decode(bytes, &self.limits, out, &mut self.pixels),
            ImageFormat::WebP => webp::decode(bytes, &self.limits, out, &mut self.pixels),
            ImageFormat::Bmp | ImageFormat::Tiff | ImageFormat::Pnm => {
                raster::decode(format, bytes, &self.limits, out, &mut self.pixels)
            }
            ImageFormat::Jpeg => Err(DecodeError::Internal {
                detail: String::from("a JPEG sent to the decoders of the other formats"),
            }),
        }
    }

    /// `decode_for_crop` of a PNG or WebP: the whole image, in which `want` lies where it is.
    pub(super) fn decode_other_for_crop(
        &mut self,
        format: ImageFormat,
        bytes: &[u8],
        want: CropBox,
        out: &mut RgbImage,
    ) -> Result<CropBox, DecodeError> {
        self.decode_other(format, bytes, out)?;
        let (w, h) = (f64::from(out.width), f64::from(out.height));
        let finite =
            want.x.is_finite() && want.y.is_finite() && want.w.is_finite() && want.h.is_finite();
        let overlaps = want.x < w && want.y < h && want.x + want.w > 0.0 && want.y + want.h > 0.0;
        if !finite || want.w <= 0.0 || want.h <= 0.0 || !overlaps {
            return Err(DecodeError::BadCrop {
                want,
                w: out.width,
                h: out.height,
            });
        }
        Ok(want)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// CRC-32 (ISO 3309, as PNG chunks use), bit by bit.
    fn crc32(bytes: &[u8]) -> u32 {
        let mut crc = !0u32;
        for &b in bytes {
            crc ^= u32::from(b);
            for _ in 0..8 {
                crc = if crc & 1 == 1 {
                    (crc >> 1) ^ 0xEDB8_8320
                } else {
                    crc >> 1
                };
            }
        }
        !crc
    }

    fn chunk(kind: &[u8; 4], data: &[u8]) -> Vec<u8> {
        let mut c = u32::try_from(data.len()).unwrap().to_be_bytes().to_vec();
        c.extend_from_slice(kind);
        c.extend_from_slice(data);
        let crc = crc32(&[&kind[..], data].concat());
        c.extend_from_slice(&crc.to_be_bytes());
        c
    }

    /// A PNG header claiming `width` x `height` 8-bit RGB, with one tiny IDAT and IEND.
    fn png_claiming(width: u32, height: u32) -> Vec<u8> {
        let mut ihdr = width.to_be_bytes().to_vec();
        ihdr.extend_from_slice(&height.to_be_bytes());
        ihdr.extend_from_slice(&[8, 2, 0, 0, 0]);
        let mut png = b"\x89PNG\r\n\x1a\n".to_vec();
        png.extend(chunk(b"IHDR", &ihdr));
        // A zlib stream of nothing (stored, final, empty).
        png.extend(chunk(
            b"IDAT",
            &[0x78, 0x01, 0x01, 0, 0, 0xFF, 0xFF, 0, 0, 0, 1],
        ));
        png.extend(chunk(b"IEND", &[]));
        png
    }

    fn small_png() -> Vec<u8> {
        let mut bytes = Vec::new();
        let mut enc = ::png::Encoder::new(&mut bytes, 5, 3);
        enc.set_color(::png::ColorType::Rgb);
        enc.set_depth(::png::BitDepth::Eight);
        let mut w = enc.write_header().unwrap();
        w.write_image_data(&[7u8; 5 * 3 * 3]).unwrap();
        w.finish().unwrap();
        bytes
    }

    fn decode(bytes: &[u8], limits: Limits) -> Result<RgbImage, DecodeError> {
        let mut d = CpuDecoder::new(limits).unwrap();
        let mut out = RgbImage::default();
        d.decode_full(bytes, &mut out).map(|()| out)
    }

    #[test]
    fn a_decompression_bomb_png_is_too_large_before_any_pixel_is_allocated() {
        let bomb = png_claiming(100_000, 100_000);
        assert!(bomb.len() < 100);
        let h = probe_image(&bomb).unwrap();
        assert_eq!(
            (h.format, h.width, h.height),
            (ImageFormat::Png, 100_000, 100_000)
        );
        let err = decode(&bomb, Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "too_large", "{err}");
        assert!(err.to_string().contains("100000x100000"), "{err}");
    }

    #[test]
    fn the_file_limit_applies_to_png() {
        let png = small_png();
        let limits = Limits {
            max_file_bytes: 10,
            ..Limits::default()
        };
        assert_eq!(decode(&png, limits).unwrap_err().reason(), "file_too_large");
        let img = decode(&png, Limits::default()).unwrap();
        assert_eq!((img.width, img.height), (5, 3));
        assert!(img.data.iter().all(|&v| v == 7));
    }

    #[test]
    fn a_cut_or_damaged_png_is_a_clear_error() {
        let png = small_png();
        let cut = &png[..png.len() - 20];
        let err = decode(cut, Limits::default()).unwrap_err();
        assert_eq!(err.reason(), "truncated", "{err}");
        assert!(err.to_string().contains("PNG"), "{err}");
        let mut damaged = png.clone();
        let at = damaged.len() - 16;
        damaged[at] ^= 0x55;
        let err = decode(&damaged, Limits::default()).unwrap_err();
        assert!(["corrupt", "truncated"].contains(&err.reason()), "{err}");
        assert_eq!(
            decode(&png_claiming(0, 4), Limits::default())
                .unwrap_err()
                .reason(),
            "corrupt"
        );
    }

    #[test]
    fn a_webp_claiming_a_huge_canvas_is_too_large() {
        // VP8X: flags, then canvas width - 1 and height - 1 as 24-bit little-endian.
        let mut vp8x = vec![0u8; 4];
        vp8x.extend_from_slice(&[0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF]);
        let mut body = b"WEBPVP8X".to_vec();
        body.extend_from_slice(&10u32.to_le_bytes());
        body.extend(vp8x);
        let mut webp = b"RIFF".to_vec();
        webp.extend_from_slice(&u32::try_from(body.len()).unwrap().to_le_bytes());
        webp.extend(body);
        let err = decode(&webp, Limits::default()).unwrap_err();
        assert!(["too_large", "corrupt"].contains(&err.reason()), "{err}");
        let err = decode(&webp[..20], Limits::default()).unwrap_err();
        assert!(["truncated", "corrupt"].contains(&err.reason()), "{err}");
    }

    #[test]
    fn a_crop_box_outside_a_png_is_refused() {
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut out = RgbImage::default();
        let inside = CropBox::new(1.0, 1.0, 3.0, 2.0);
        let got = d.decode_for_crop(&small_png(), inside, (2, 2), &mut out);
        assert_eq!(got.unwrap(), inside, "the whole image, the box where it is");
        assert_eq!((out.width, out.height), (5, 3));
        let outside = CropBox::new(6.0, 0.0, 3.0, 2.0);
        let err = d
            .decode_for_crop(&small_png(), outside, (2, 2), &mut out)
            .unwrap_err();
        assert_eq!(err.reason(), "bad_crop");
    }
}
