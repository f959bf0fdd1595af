//! The entropy-decode ceiling: how fast this machine can Huffman-decode a JPEG's coefficients
//! with nothing else (no IDCT, no upsampling, no colour conversion, no output). Every decode of
//! a baseline JPEG without restart markers must at least entropy-decode the file from its top
//! to the crop's last row, so this rate is the physical limit the CPU path is judged against
//! (`stoker bench` prints stoker's rate as a fraction of it).
//!
//! # Design
//! - libjpeg's `jpeg_read_coefficients`, reached through TurboJPEG's lossless transform with
//!   its output switched off (`sys::TjHandle::read_coefficients`): the vendored library, the
//!   same Huffman decoder `CpuDecoder` runs, no second JPEG implementation.
//! - Same refusals as [`CpuDecoder`]: file size and pixel limits, libjpeg warnings are errors,
//!   at most [`MAX_SCANS`](super::MAX_SCANS) progressive scans.
//!
//! # Limitations
//! - The whole file is entropy-decoded, while `CpuDecoder::decode_for_crop` stops at the crop's
//!   last row: on crops that end high in the image stoker can exceed this "ceiling".
//! - JPEG only (PNG and WebP have no entropy stage to compare with): other data is an error.
//! - The coefficient buffer of the whole image is allocated per call (libjpeg's virtual
//!   arrays), as `jpegtran` does; a measurement tool, not a serving path.

#![forbid(unsafe_code)]

use super::sys::{Param, TjHandle};
use super::{read_header, DecodeError, JpegHeader, Limits};

/// Entropy-decodes JPEGs and throws the coefficients away: one per thread.
pub struct EntropyDecoder {
    // No field borrows another: drop order does not matter.
    /// Reads headers (the same checks as `CpuDecoder`).
    header: TjHandle,
    transform: TjHandle,
    limits: Limits,
}

impl std::fmt::Debug for EntropyDecoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EntropyDecoder")
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

impl EntropyDecoder {
    /// A decoder refusing what `limits` refuses.
    pub fn new(limits: Limits) -> Result<EntropyDecoder, DecodeError> {
        Ok(EntropyDecoder {
            header: super::new_handle()?,
            transform: Self::new_transform(&limits)?,
            limits,
        })
    }

    fn new_transform(limits: &Limits) -> Result<TjHandle, DecodeError> {
        let mut tj = TjHandle::new_transformer().ok_or_else(|| DecodeError::Internal {
            detail: String::from("tj3Init(TJINIT_TRANSFORM) failed"),
        })?;
        super::set_strict(&mut tj)?;
        tj.set(
            Param::MaxPixels,
            i32::try_from(limits.max_pixels).unwrap_or(0),
        )
        .map_err(DecodeError::from_tj)?;
        Ok(tj)
    }

    /// Entropy-decodes every coefficient of the JPEG in `bytes`; returns its header.
    pub fn decode(&mut self, bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
        let result = self.decode_inner(bytes);
        if result.is_err() {
            // Either instance may be left mid-stream after an error: start afresh.
            if let (Ok(h), Ok(t)) = (super::new_handle(), Self::new_transform(&self.limits)) {
                self.header = h;
                self.transform = t;
            }
        }
        result
    }

    fn decode_inner(&mut self, bytes: &[u8]) -> Result<JpegHeader, DecodeError> {
        if bytes.len() as u64 > self.limits.max_file_bytes {
            return Err(DecodeError::FileTooLarge {
                len: bytes.len() as u64,
                limit: self.limits.max_file_bytes,
            });
        }
        let header = read_header(&mut self.header, bytes, self.limits.max_pixels)?;
        header.check_limits(&self.limits)?;
        self.transform
            .read_coefficients(bytes)
            .map_err(DecodeError::from_tj)?;
        Ok(header)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::decode::{CpuDecoder, EncodeOptions, JpegEncoder};
    use stoker_kernels::image::RgbImage;

    fn jpeg(w: u32, h: u32) -> Vec<u8> {
        // A pattern with real coefficients to decode.
        let rgb: Vec<u8> = (0..w as usize * h as usize * 3)
            .map(|i| u8::try_from(i * 7 % 251).unwrap())
            .collect();
        JpegEncoder::new()
            .unwrap()
            .encode_rgb(&rgb, w, h, &EncodeOptions::default())
            .unwrap()
    }

    #[test]
    fn decodes_what_the_pixel_decoder_decodes_and_refuses_what_it_refuses() {
        let good = jpeg(96, 64);
        let mut entropy = EntropyDecoder::new(Limits::default()).unwrap();
        let header = entropy.decode(&good).unwrap();
        assert_eq!((header.width, header.height), (96, 64));

        // Cut inside the scan: libjpeg's "premature end" warning is an error, as in CpuDecoder.
        let cut = &good[..good.len() * 2 / 3];
        let err = entropy.decode(cut).unwrap_err();
        let mut pixels = CpuDecoder::new(Limits::default()).unwrap();
        let mut out = RgbImage::default();
        let pixel_err = pixels.decode_full(cut, &mut out).unwrap_err();
        assert_eq!(err.reason(), pixel_err.reason(), "{err} vs {pixel_err}");

        // Not a JPEG, and over the pixel limit.
        assert_eq!(
            entropy.decode(b"GIF89a....").unwrap_err().reason(),
            "unknown_format"
        );
        let mut small = EntropyDecoder::new(Limits {
            max_pixels: 1000,
            ..Limits::default()
        })
        .unwrap();
        assert_eq!(small.decode(&good).unwrap_err().reason(), "too_large");
        // The instance recovers after errors.
        assert_eq!(entropy.decode(&good).unwrap().width, 96);
    }
}
