//! The one rule saying which decoder takes a JPEG: nvJPEG's hardware engines, its GPU-hybrid
//! decoder, or the CPU. The CUDA engine and the tools (`stoker selftest --gpu`, `stoker bench
//! --backend cuda`) all call [`route`]; nothing else decides.
//!
//! # Design
//! - The caller's limits come first: an image they refuse (over `max_pixels`) goes to the CPU,
//!   whose decoder refuses it with the reason, and nvJPEG is not asked about it.
//! - Then the header ([`crate::jpeg_header`]): what a real nvJPEG said it supports and then
//!   decoded to wrong colours or failed on ([`header_refusal`]; NVIDIA H200, nvJPEG 13.0.1,
//!   docs/results/gpu-check-2026-11-26/selftest.txt) goes to the CPU without asking.
//! - Then nvJPEG is asked, in order and only as far as needed: the hardware engines
//!   (`nvjpegDecodeBatchedSupportedEx`, with the region), the GPU-hybrid decoder
//!   (`nvjpegDecoderJpegSupported`, with the region), else the CPU. A query that fails counts as
//!   a refusal: the image is not lost, the CPU decodes it or says why it cannot.
//! - The two questions are a trait ([`RouteQuery`]) so the rule's table is tested without a
//!   GPU; [`NvjpegDecoder`] answers them for real.
//!
//! # Limitations
//! Beyond [`header_refusal`]'s observed cases the rule trusts nvJPEG's own answers; a header
//! the shared parser cannot read is left to nvJPEG (and then to the CPU decoder's reason).

use super::{NvjpegDecoder, NvjpegError, Roi};
use crate::jpeg_header::{self, ColourSpace, Header};

/// Why the CPU decodes an image nvJPEG says it supports: the cases a real nvJPEG got wrong
/// (NVIDIA H200, nvJPEG 13.0.1, docs/results/gpu-check-2026-11-26/selftest.txt). `None`: ask
/// nvJPEG.
pub fn header_refusal(h: &Header) -> Option<&'static str> {
    if h.colour_space() == ColourSpace::Rgb {
        // rgb__adobe0_500x333 at 11.9 dB, rgb__adobe0_subsampled_go at 7.2 dB.
        Some("RGB components (not YCbCr): nvJPEG decodes them to wrong colours")
    } else if h.gray_with_sampling() {
        // gray__blank_800x280 at 24.6 dB, gray__sampling_2x2_factor at 9.7 dB.
        Some("one component with sampling other than 1x1: nvJPEG decodes it to wrong values")
    } else if h.unusual_sampling() {
        // subsamp__1x3 (EXECUTION_FAILED), subsamp__2x2-2x1-1x1 and three others
        // (INVALID_PARAMETER): the hardware refused them, the hybrid decoder failed on them.
        Some("unequal chroma sampling or a sampling factor of 3: nvJPEG fails on it")
    } else {
        None
    }
}

/// Which decoder takes an image.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Route {
    /// nvJPEG's hardware engines (batched).
    Hardware,
    /// nvJPEG's GPU-hybrid decoupled decoder (progressive, unusual sampling).
    Hybrid,
    /// Refused by nvJPEG or by the caller's limits: the CPU decoder, then uploaded.
    Cpu,
}

impl Route {
    /// The name used in metrics labels and reports.
    pub fn name(self) -> &'static str {
        match self {
            Route::Hardware => "hardware",
            Route::Hybrid => "hybrid",
            Route::Cpu => "cpu",
        }
    }
}

/// The questions [`route`] asks a decoder about one image cut to a region.
pub trait RouteQuery {
    /// Whether the hardware engines decode `jpeg` (with `roi`).
    fn hardware_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError>;
    /// Whether the GPU-hybrid decoder decodes `jpeg` (with `roi`).
    fn hybrid_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError>;
}

impl RouteQuery for NvjpegDecoder {
    fn hardware_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError> {
        NvjpegDecoder::hardware_supports(self, jpeg, roi)
    }

    fn hybrid_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError> {
        NvjpegDecoder::hybrid_supports(self, jpeg, roi)
    }
}

/// The decoder that takes `jpeg` cut to `roi`; `within_limits` is false where the caller's
/// limits refuse the image (it then goes to the CPU without asking nvJPEG).
pub fn route(
    decoder: &mut impl RouteQuery,
    jpeg: &[u8],
    roi: Option<Roi>,
    within_limits: bool,
) -> Route {
    let refused = || jpeg_header::parse(jpeg).is_some_and(|h| header_refusal(&h).is_some());
    if !within_limits || refused() {
        Route::Cpu
    } else if decoder.hardware_supports(jpeg, roi).unwrap_or(false) {
        Route::Hardware
    } else if decoder.hybrid_supports(jpeg, roi).unwrap_or(false) {
        Route::Hybrid
    } else {
        Route::Cpu
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers fixed in advance, and the questions asked.
    struct Answers {
        hardware: Result<bool, NvjpegError>,
        hybrid: Result<bool, NvjpegError>,
        asked: Vec<&'static str>,
    }

    impl RouteQuery for Answers {
        fn hardware_supports(&mut self, _: &[u8], _: Option<Roi>) -> Result<bool, NvjpegError> {
            self.asked.push("hardware");
            self.hardware.clone()
        }

        fn hybrid_supports(&mut self, _: &[u8], _: Option<Roi>) -> Result<bool, NvjpegError> {
            self.asked.push("hybrid");
            self.hybrid.clone()
        }
    }

    /// (within limits, hardware says, hybrid says, the route, the questions asked).
    type Case = (
        bool,
        Result<bool, NvjpegError>,
        Result<bool, NvjpegError>,
        Route,
        &'static [&'static str],
    );

    fn failed() -> Result<bool, NvjpegError> {
        Err(NvjpegError::Invalid("query failed".into()))
    }

    #[test]
    fn the_routing_table() {
        use Route::*;
        let table: Vec<Case> = vec![
            (false, Ok(true), Ok(true), Cpu, &[]),
            (false, Ok(false), Ok(false), Cpu, &[]),
            (true, Ok(true), Ok(true), Hardware, &["hardware"]),
            (true, Ok(true), Ok(false), Hardware, &["hardware"]),
            (true, Ok(false), Ok(true), Hybrid, &["hardware", "hybrid"]),
            (true, Ok(false), Ok(false), Cpu, &["hardware", "hybrid"]),
            (true, failed(), Ok(true), Hybrid, &["hardware", "hybrid"]),
            (true, failed(), failed(), Cpu, &["hardware", "hybrid"]),
            (true, Ok(false), failed(), Cpu, &["hardware", "hybrid"]),
        ];
        for (within, hardware, hybrid, want, asked) in table {
            let case = format!("within {within}, hardware {hardware:?}, hybrid {hybrid:?}");
            let mut d = Answers {
                hardware,
                hybrid,
                asked: Vec::new(),
            };
            let roi = Some(Roi {
                x: 1,
                y: 2,
                width: 3,
                height: 4,
            });
            assert_eq!(route(&mut d, b"jpeg", roi, within), want, "{case}");
            assert_eq!(d.asked, asked, "{case}");
        }
    }

    /// SOI, an optional Adobe APP14 segment with `transform`, and a baseline frame of 16x16
    /// with components (id, h, v).
    fn header(transform: Option<u8>, comps: &[(u8, u8, u8)]) -> Vec<u8> {
        let mut b = vec![0xff, 0xd8];
        if let Some(t) = transform {
            b.extend([0xff, 0xee, 0, 14]);
            b.extend(b"Adobe\0\x64\0\0\0\0");
            b.push(t);
        }
        let n = u8::try_from(comps.len()).unwrap();
        b.extend([0xff, 0xc0, 0, 8 + 3 * n, 8, 0, 16, 0, 16, n]);
        for &(id, h, v) in comps {
            b.extend([id, (h << 4) | v, 0]);
        }
        b
    }

    #[test]
    fn what_nvjpeg_gets_wrong_goes_to_the_cpu_without_asking() {
        let ycc = [(1, 2, 2), (2, 1, 1), (3, 1, 1)];
        let cases: [(Vec<u8>, Route); 7] = [
            (header(None, &ycc), Route::Hardware),
            (header(Some(1), &ycc), Route::Hardware),
            (header(Some(0), &ycc), Route::Cpu),
            (
                header(None, &[(b'R', 1, 1), (b'G', 1, 1), (b'B', 1, 1)]),
                Route::Cpu,
            ),
            (header(None, &[(1, 2, 2)]), Route::Cpu),
            (header(None, &[(1, 1, 1)]), Route::Hardware),
            (header(None, &[(1, 2, 2), (2, 2, 1), (3, 1, 1)]), Route::Cpu),
        ];
        for (jpeg, want) in cases {
            let mut d = Answers {
                hardware: Ok(true),
                hybrid: Ok(true),
                asked: Vec::new(),
            };
            assert_eq!(route(&mut d, &jpeg, None, true), want, "{jpeg:02x?}");
            assert_eq!(d.asked.is_empty(), want == Route::Cpu, "{jpeg:02x?}");
        }
    }

    #[test]
    fn route_names_are_the_metrics_labels() {
        let names: Vec<&str> = [Route::Hardware, Route::Hybrid, Route::Cpu]
            .into_iter()
            .map(Route::name)
            .collect();
        assert_eq!(names, ["hardware", "hybrid", "cpu"]);
    }
}
