//! JPEG encoding with the same libjpeg-turbo: fixtures for tests and `stoker synth`'s
//! generated datasets. Not on any hot path.

#![forbid(unsafe_code)]

use super::sys::{Param, PixelFormat, TjHandle};
use super::{DecodeError, Subsampling};

/// How to encode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EncodeOptions {
    /// 1..=100.
    pub quality: u8,
    /// S444, S422, S420, S440 or Gray (the RGB input is converted to luma).
    pub subsampling: Subsampling,
    /// Progressive (several scans) instead of baseline.
    pub progressive: bool,
    /// Restart marker every this many MCU rows; 0 for none.
    pub restart_rows: u32,
    /// Arithmetic entropy coding instead of Huffman (nvJPEG decodes none: the CPU path's).
    pub arithmetic: bool,
}

impl Default for EncodeOptions {
    fn default() -> Self {
        EncodeOptions {
            quality: 90,
            subsampling: Subsampling::S420,
            progressive: false,
            restart_rows: 0,
            arithmetic: false,
        }
    }
}

/// A reusable TurboJPEG compressor.
pub struct JpegEncoder {
    tj: TjHandle,
}

impl std::fmt::Debug for JpegEncoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("JpegEncoder").finish_non_exhaustive()
    }
}

impl JpegEncoder {
    /// A compressor; fails only where TurboJPEG cannot allocate one.
    pub fn new() -> Result<JpegEncoder, DecodeError> {
        let tj = TjHandle::new_compressor().ok_or_else(|| DecodeError::Internal {
            detail: "tj3Init(compress) failed".into(),
        })?;
        Ok(JpegEncoder { tj })
    }

    /// Encodes packed RGB (`width * height * 3` bytes).
    pub fn encode_rgb(
        &mut self,
        rgb: &[u8],
        width: u32,
        height: u32,
        opts: &EncodeOptions,
    ) -> Result<Vec<u8>, DecodeError> {
        if rgb.len() != width as usize * height as usize * 3 || width == 0 || height == 0 {
            return Err(DecodeError::Internal {
                detail: format!(
                    "encode: {} bytes is not a {width}x{height} RGB image",
                    rgb.len()
                ),
            });
        }
        let subsamp = match opts.subsampling {
            Subsampling::S444 => 0,
            Subsampling::S422 => 1,
            Subsampling::S420 => 2,
            Subsampling::Gray => 3,
            Subsampling::S440 => 4,
            other => {
                return Err(DecodeError::Internal {
                    detail: format!("encode: subsampling {other:?} is not offered"),
                })
            }
        };
        let internal = |e: super::sys::TjError| DecodeError::Internal {
            detail: format!("encode: {}", e.message),
        };
        self.tj
            .set(Param::Quality, i32::from(opts.quality.clamp(1, 100)))
            .map_err(internal)?;
        self.tj.set(Param::Subsamp, subsamp).map_err(internal)?;
        self.tj
            .set(Param::Progressive, i32::from(opts.progressive))
            .map_err(internal)?;
        self.tj
            .set(
                Param::RestartRows,
                i32::try_from(opts.restart_rows).unwrap_or(i32::MAX),
            )
            .map_err(internal)?;
        self.tj
            .set(Param::Arithmetic, i32::from(opts.arithmetic))
            .map_err(internal)?;
        if opts.subsampling == Subsampling::Gray {
            let gray: Vec<u8> = rgb
                .chunks_exact(3)
                // A weighted mean of three u8s, rounded: within 0..=255.
                .map(|p| {
                    #[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
                    let v = (0.299 * f64::from(p[0])
                        + 0.587 * f64::from(p[1])
                        + 0.114 * f64::from(p[2]))
                    .round() as u8;
                    v
                })
                .collect();
            self.tj
                .compress8(&gray, width, height, PixelFormat::Gray)
                .map_err(internal)
        } else {
            self.tj
                .compress8(rgb, width, height, PixelFormat::Rgb)
                .map_err(internal)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transform::decode::{probe, CpuDecoder, Limits};
    use stoker_kernels::image::RgbImage;

    #[test]
    fn encoded_images_decode_with_the_asked_properties() {
        let (w, h) = (64u32, 48u32);
        let rgb: Vec<u8> = (0..w * h * 3).map(|i| (i % 200) as u8).collect();
        let mut enc = JpegEncoder::new().unwrap();
        for (sub, progressive) in [
            (Subsampling::S444, false),
            (Subsampling::S420, true),
            (Subsampling::Gray, false),
        ] {
            let opts = EncodeOptions {
                quality: 95,
                subsampling: sub,
                progressive,
                restart_rows: 1,
                arithmetic: sub == Subsampling::S444,
            };
            let jpeg = enc.encode_rgb(&rgb, w, h, &opts).unwrap();
            let header = probe(&jpeg).unwrap();
            assert_eq!((header.width, header.height), (w, h));
            assert_eq!(header.subsampling, sub);
            assert_eq!(header.progressive, progressive);
            let mut img = RgbImage::default();
            CpuDecoder::new(Limits::default())
                .unwrap()
                .decode_full(&jpeg, &mut img)
                .unwrap();
            assert_eq!((img.width, img.height), (w, h));
        }
        assert!(enc
            .encode_rgb(&rgb, w + 1, h, &EncodeOptions::default())
            .is_err());
    }
}
