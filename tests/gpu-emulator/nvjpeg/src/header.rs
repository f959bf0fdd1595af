//! What nvJPEG decides from a JPEG's header (read by the parser shared with stoker's router,
//! `stoker_pipeline::transform::decode::routing::header`): which decoder takes it, which ones the real library fails on
//! while decoding, and which ones it decodes to wrong colours.
//!
//! # Design
//! The rules are nvJPEG's documented ones: the hardware engines take baseline (SOF0) Huffman
//! 8-bit JPEGs in a single scan (nvjpeg.h: "NVJPEG_BACKEND_HARDWARE : supports baseline JPEG
//! bitstream with single scan") with 4:4:4, 4:2:2, 4:2:0, 4:4:0 or grayscale sampling; the
//! decoupled decoders take Huffman 8-bit JPEGs (baseline, extended or progressive) with 1 or 3
//! components and any sampling where the first component is full size, except that a decoder
//! made for `NVJPEG_BACKEND_GPU_HYBRID` refuses progressive files ([`backend_takes`]: as
//! nvImageCodec and DALI never give it one); nothing here takes arithmetic coding,
//! lossless, 12-bit or 4-component (CMYK) JPEGs, nor chroma sampled finer than luma (whose
//! first component, reported first by `nvjpegGetImageInfo`, is smaller than the image). A
//! header that cannot be read is `NVJPEG_STATUS_BAD_JPEG`.
//!
//! What the real library did on an H200 (nvJPEG 13.0.1, docs/results/gpu-check-2026-11-26/
//! selftest.txt), emulated as observed:
//! - [`hybrid_failure`]: the GPU-hybrid decoder accepts, then fails on, a sampling factor of
//!   3 (`EXECUTION_FAILED` from `nvjpegDecodeJpegTransferToDevice`) and on two chroma
//!   components sampled differently (`INVALID_PARAMETER` from `nvjpegDecodeJpegDevice`).
//! - [`wrong_colours`]: RGB files (Adobe transform 0) and one-component files whose frame
//!   declares sampling other than 1x1 are reported supported and decoded to wrong colours.

pub(crate) use stoker_pipeline::transform::decode::routing::header::{
    parse, Coding, ColourSpace, Header, Subsampling,
};

use crate::status::{self, Status};

/// nvJPEG's backends (`nvjpegBackend_t`, nvjpeg.h).
pub(crate) const BACKEND_DEFAULT: std::ffi::c_int = 0;
pub(crate) const BACKEND_HYBRID: std::ffi::c_int = 1;
pub(crate) const BACKEND_GPU_HYBRID: std::ffi::c_int = 2;
pub(crate) const BACKEND_HARDWARE: std::ffi::c_int = 3;

/// Which decoder takes an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Path {
    Hardware = 1,
    Hybrid = 2,
}

/// The decoupled phase at which the real GPU-hybrid decoder failed on an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Stage {
    /// `nvjpegDecodeJpegTransferToDevice`.
    Transfer,
    /// `nvjpegDecodeJpegDevice`.
    Device,
}

/// Whether component 0 has the largest sampling factors, so its size (what
/// `nvjpegGetImageInfo` reports first, and what callers size outputs by) is the image's.
fn luma_is_full_size(h: &Header) -> bool {
    let (h0, v0) = h.sampling[0];
    h.sampling.iter().all(|&(h, v)| h <= h0 && v <= v0)
}

fn huffman_8bit(h: &Header) -> bool {
    h.precision == 8
        && matches!(
            h.coding,
            Coding::Baseline | Coding::Extended | Coding::Progressive
        )
}

/// Where and how the real GPU-hybrid decoder failed on images with this header (observed,
/// docs/results/gpu-check-2026-11-26/selftest.txt): a sampling factor of 3 (`subsamp__1x3`,
/// `corrupt__fuzz_8x8192_weird_sampling`): `EXECUTION_FAILED` at the transfer; chroma
/// components sampled differently (`subsamp__2x2-2x1-1x1`, `2x2-2x1-1x2`, `4x1-2x1-2x2`,
/// `prog__2x2-2x2-1x1`): `INVALID_PARAMETER` at the device phase.
pub(crate) fn hybrid_failure(h: &Header) -> Option<(Stage, Status)> {
    let s = &h.sampling;
    if s.iter().any(|&(x, y)| x == 3 || y == 3) {
        Some((Stage::Transfer, status::EXECUTION_FAILED))
    } else if s.len() == 3 && s[1] != s[2] {
        Some((Stage::Device, status::INVALID_PARAMETER))
    } else {
        None
    }
}

/// Whether the real library decodes this image to wrong colours while saying it supports it
/// (observed: `rgb__adobe0_*` at 7-12 dB, `gray__blank_800x280` and
/// `gray__sampling_2x2_factor` at 10-25 dB against libjpeg).
pub(crate) fn wrong_colours(h: &Header) -> bool {
    h.colour_space() == ColourSpace::Rgb || h.gray_with_sampling()
}

/// Whether a decoder made for `backend` takes this image, beyond its path's rule
/// ([`supported_by`]): `NVJPEG_BACKEND_GPU_HYBRID` refuses progressive files. nvImageCodec
/// (`extensions/nvjpeg/cuda_decoder.cpp`: "gpu hybrid is not supported for progressive") asks
/// the GPU-hybrid decoder about baseline files only and DALI
/// (`dali/operators/decoder/nvjpeg/nvjpeg_decoder_decoupled_api.h`) sends progressive files to
/// `NVJPEG_BACKEND_HYBRID`; the H200 with nvJPEG 13.0.1 did decode progressive files on
/// `GPU_HYBRID`, so this is the safe reading, not the observed one.
pub(crate) fn backend_takes(h: &Header, backend: std::ffi::c_int) -> bool {
    backend != BACKEND_GPU_HYBRID || h.coding != Coding::Progressive
}

/// Whether `path` can decode this image.
pub(crate) fn supported_by(h: &Header, path: Path) -> bool {
    let colour = matches!(h.sampling.len(), 1 | 3);
    match path {
        Path::Hardware => {
            h.coding == Coding::Baseline
                && !h.multi_scan_sequential()
                && h.precision == 8
                && matches!(
                    h.subsampling(),
                    Subsampling::Css444
                        | Subsampling::Css422
                        | Subsampling::Css420
                        | Subsampling::Css440
                        | Subsampling::Gray
                )
        }
        Path::Hybrid => {
            huffman_8bit(h) && colour && (luma_is_full_size(h) || hybrid_failure(h).is_some())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn jpeg(sof: u8, precision: u8, comps: &[(u8, u8)]) -> Vec<u8> {
        let mut seg = vec![precision, 0, 16, 0, 24, comps.len() as u8];
        for (i, &(h, v)) in comps.iter().enumerate() {
            seg.extend([i as u8 + 1, (h << 4) | v, 0]);
        }
        let mut b = vec![0xff, 0xd8, 0xff, 0xe0, 0, 4, 0, 0, 0xff, sof];
        b.extend(((seg.len() + 2) as u16).to_be_bytes());
        b.extend(seg);
        b
    }

    fn takes(b: &[u8], path: Path) -> bool {
        supported_by(&parse(b).unwrap(), path)
    }

    #[test]
    fn the_hardware_takes_baseline_8bit_common_sampling_only() {
        let j420 = jpeg(0xc0, 8, &[(2, 2), (1, 1), (1, 1)]);
        assert!(takes(&j420, Path::Hardware) && takes(&j420, Path::Hybrid));
        let p = jpeg(0xc2, 8, &[(1, 1), (1, 1), (1, 1)]);
        assert!(!takes(&p, Path::Hardware) && takes(&p, Path::Hybrid));
        let taller = jpeg(0xc0, 8, &[(1, 1), (1, 2), (1, 2)]);
        assert!(!takes(&taller, Path::Hybrid), "chroma taller than luma");
        let s411 = jpeg(0xc0, 8, &[(4, 1), (1, 1), (1, 1)]);
        assert!(!takes(&s411, Path::Hardware) && takes(&s411, Path::Hybrid));
        let cmyk = jpeg(0xc0, 8, &[(1, 1); 4]);
        assert!(!takes(&cmyk, Path::Hardware) && !takes(&cmyk, Path::Hybrid));
        assert!(!takes(&jpeg(0xc1, 12, &[(1, 1)]), Path::Hybrid));
        assert!(!takes(&jpeg(0xc9, 8, &[(1, 1)]), Path::Hybrid));
    }

    #[test]
    fn the_hybrid_decoder_takes_then_fails_on_what_the_real_one_failed_on() {
        let odd = parse(&jpeg(0xc0, 8, &[(4, 1), (2, 1), (2, 2)])).unwrap();
        assert!(supported_by(&odd, Path::Hybrid) && !supported_by(&odd, Path::Hardware));
        let device = Some((Stage::Device, status::INVALID_PARAMETER));
        assert_eq!(hybrid_failure(&odd), device);
        let three = parse(&jpeg(0xc0, 8, &[(1, 3), (1, 1), (1, 1)])).unwrap();
        let transfer = Some((Stage::Transfer, status::EXECUTION_FAILED));
        assert_eq!(hybrid_failure(&three), transfer);
        let j420 = parse(&jpeg(0xc0, 8, &[(2, 2), (1, 1), (1, 1)])).unwrap();
        assert_eq!(hybrid_failure(&j420), None);
        assert!(!wrong_colours(&j420));
        assert!(wrong_colours(&parse(&jpeg(0xc0, 8, &[(2, 2)])).unwrap()));
        assert!(!wrong_colours(&parse(&jpeg(0xc0, 8, &[(1, 1)])).unwrap()));
    }
}
