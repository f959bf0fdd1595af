//! The one rule saying which decoder takes an image on the CUDA engine: nvJPEG's hardware
//! engines, its decoupled (hybrid) decoders, or the CPU. The CUDA engine and the tools
//! (`stoker selftest --gpu`, `stoker bench --backend cuda`) all call [`route_image`]; nothing
//! else decides. It sits in the decode stage beside the CPU decoders and reads headers with
//! the stage's one marker walk ([`header`]); `stoker_nvidia::nvjpeg` only answers the
//! questions it asks.
//!
//! # Design
//! - PNG and WebP go to the CPU (nvJPEG decodes JPEG only). Then the caller's limits: an
//!   image they refuse (over `max_pixels`; its size is the CPU decoder's reading of the header,
//!   else nvJPEG's) goes to the CPU, whose decoder refuses it with the reason, and nvJPEG is
//!   not asked about it.
//! - Then the header ([`header`]): what a real nvJPEG said it supports and then
//!   decoded to wrong colours or failed on ([`header_refusal`]; NVIDIA H200, nvJPEG 13.0.1,
//!   docs/results/gpu-check-2026-11-26/selftest.txt) goes to the CPU without asking.
//! - Then nvJPEG is asked, in order and only as far as needed: the hardware engines
//!   (`nvjpegDecodeBatchedSupportedEx`, with the region); where they refuse the region, the
//!   hardware engines for the whole image (the augment kernel then crops it: the engines are
//!   the fast path, and `nvjpegDecodeBatchedSupportedEx` is asked with the ROI set because an
//!   ROI can make an image unsupported); the decoupled decoder for the file
//!   (`nvjpegDecoderJpegSupported`, with the region: hybrid for progressive files, GPU-hybrid
//!   otherwise), else the CPU. A query that fails counts as a refusal: the image is not lost,
//!   the CPU decodes it or says why it cannot.
//! - The answer is a [`Routed`]: the decoder, the region it decodes (the caller's region or
//!   the whole image), and whether the file is progressive (which decoupled decoder takes it).
//! - The two questions are a trait ([`RouteQuery`]) so the rule's table is tested without a
//!   GPU; [`NvjpegDecoder`] answers them for real.
//!
//! # Limitations
//! Beyond [`header_refusal`]'s observed cases the rule trusts nvJPEG's own answers; a header
//! the shared parser cannot read is left to nvJPEG (and then to the CPU decoder's reason).

pub mod header;

use stoker_nvidia::nvjpeg::{NvjpegDecoder, NvjpegError, Roi};

use super::{probe, ImageFormat, Limits};
use header::{Coding, ColourSpace, Header};

/// Where the CUDA engine decodes `jpeg` cut to `roi` under `limits` (see the module).
pub fn route_image(
    decoder: &mut NvjpegDecoder,
    jpeg: &[u8],
    roi: Option<Roi>,
    limits: &Limits,
) -> Routed {
    if matches!(
        ImageFormat::detect(jpeg),
        Some(f) if f != ImageFormat::Jpeg
    ) {
        return Routed {
            route: Route::Cpu,
            roi,
            progressive: false,
        };
    }
    let size = match probe(jpeg) {
        Ok(h) => Some((h.width, h.height)),
        Err(_) => decoder.info(jpeg).ok().map(|i| (i.width, i.height)),
    };
    let within_limits = size.is_some_and(|(w, h)| limits.admits(w, h));
    route(decoder, jpeg, roi, within_limits)
}

/// Whether `jpeg`'s frame is progressive: its decoupled decoder is nvJPEG's hybrid one, not
/// the GPU-hybrid one (a header that cannot be read counts as not progressive: the GPU-hybrid
/// decoder then says why it cannot take it).
pub fn is_progressive(jpeg: &[u8]) -> bool {
    header::parse(jpeg).is_some_and(|h| h.coding == Coding::Progressive)
}

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

/// Where [`route`] sends an image: the decoder, and the region it decodes (`None`: the whole
/// image; the caller's region otherwise).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Routed {
    /// The decoder that takes the image.
    pub route: Route,
    /// The region that decoder decodes; `None` for the whole image.
    pub roi: Option<Roi>,
    /// A progressive file ([`is_progressive`]): what `NvjpegDecoder::decode_hybrid` is told.
    pub progressive: bool,
}

/// The questions [`route`] asks a decoder about one image cut to a region.
pub trait RouteQuery {
    /// Whether the hardware engines decode `jpeg` (with `roi`).
    fn hardware_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError>;
    /// Whether the decoupled decoder for the file (hybrid when `progressive`, else
    /// GPU-hybrid) decodes `jpeg` (with `roi`).
    fn hybrid_supports(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
        progressive: bool,
    ) -> Result<bool, NvjpegError>;
}

impl RouteQuery for NvjpegDecoder {
    fn hardware_supports(&mut self, jpeg: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError> {
        NvjpegDecoder::hardware_supports(self, jpeg, roi)
    }

    fn hybrid_supports(
        &mut self,
        jpeg: &[u8],
        roi: Option<Roi>,
        progressive: bool,
    ) -> Result<bool, NvjpegError> {
        NvjpegDecoder::hybrid_supports(self, jpeg, roi, progressive)
    }
}

/// The decoder that takes `jpeg` cut to `roi`, and the region it decodes; `within_limits` is
/// false where the caller's limits refuse the image (it then goes to the CPU without asking
/// nvJPEG).
pub fn route(
    decoder: &mut impl RouteQuery,
    jpeg: &[u8],
    roi: Option<Roi>,
    within_limits: bool,
) -> Routed {
    let header = header::parse(jpeg);
    let refused = header.as_ref().is_some_and(|h| header_refusal(h).is_some());
    let progressive = header.is_some_and(|h| h.coding == Coding::Progressive);
    let to = |route, roi| Routed {
        route,
        roi,
        progressive,
    };
    if !within_limits || refused {
        to(Route::Cpu, roi)
    } else if decoder.hardware_supports(jpeg, roi).unwrap_or(false) {
        to(Route::Hardware, roi)
    } else if roi.is_some() && decoder.hardware_supports(jpeg, None).unwrap_or(false) {
        to(Route::Hardware, None)
    } else if decoder
        .hybrid_supports(jpeg, roi, progressive)
        .unwrap_or(false)
    {
        to(Route::Hybrid, roi)
    } else {
        to(Route::Cpu, roi)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Answers fixed in advance (the hardware's for the whole image and for a region), and
    /// the questions asked.
    struct Answers {
        hardware: Result<bool, NvjpegError>,
        hardware_region: Result<bool, NvjpegError>,
        hybrid: Result<bool, NvjpegError>,
        asked: Vec<&'static str>,
    }

    impl Answers {
        fn all(yes: bool) -> Answers {
            Answers {
                hardware: Ok(yes),
                hardware_region: Ok(yes),
                hybrid: Ok(yes),
                asked: Vec::new(),
            }
        }
    }

    impl RouteQuery for Answers {
        fn hardware_supports(&mut self, _: &[u8], roi: Option<Roi>) -> Result<bool, NvjpegError> {
            if roi.is_some() {
                self.asked.push("hardware region");
                self.hardware_region.clone()
            } else {
                self.asked.push("hardware whole");
                self.hardware.clone()
            }
        }

        fn hybrid_supports(
            &mut self,
            _: &[u8],
            _: Option<Roi>,
            _: bool,
        ) -> Result<bool, NvjpegError> {
            self.asked.push("hybrid");
            self.hybrid.clone()
        }
    }

    /// (within limits, hardware whole / region, hybrid, the route, whether the region is
    /// kept, the questions asked).
    type Case = (
        bool,
        [Result<bool, NvjpegError>; 2],
        Result<bool, NvjpegError>,
        Route,
        bool,
        &'static [&'static str],
    );

    fn failed() -> Result<bool, NvjpegError> {
        Err(NvjpegError::Invalid("query failed".into()))
    }

    #[test]
    fn the_routing_table() {
        use Route::*;
        const REGION: &str = "hardware region";
        const WHOLE: &str = "hardware whole";
        let table: Vec<Case> = vec![
            (false, [Ok(true), Ok(true)], Ok(true), Cpu, true, &[]),
            (
                true,
                [Ok(true), Ok(true)],
                Ok(true),
                Hardware,
                true,
                &[REGION],
            ),
            (
                true,
                [Ok(true), Ok(true)],
                Ok(false),
                Hardware,
                true,
                &[REGION],
            ),
            // The region refused, the whole image taken: the kernel crops it.
            (
                true,
                [Ok(true), Ok(false)],
                Ok(true),
                Hardware,
                false,
                &[REGION, WHOLE],
            ),
            (
                true,
                [Ok(true), failed()],
                Ok(true),
                Hardware,
                false,
                &[REGION, WHOLE],
            ),
            (
                true,
                [Ok(false), Ok(false)],
                Ok(true),
                Hybrid,
                true,
                &[REGION, WHOLE, "hybrid"],
            ),
            (
                true,
                [Ok(false), Ok(false)],
                Ok(false),
                Cpu,
                true,
                &[REGION, WHOLE, "hybrid"],
            ),
            (
                true,
                [failed(), failed()],
                Ok(true),
                Hybrid,
                true,
                &[REGION, WHOLE, "hybrid"],
            ),
            (
                true,
                [failed(), failed()],
                failed(),
                Cpu,
                true,
                &[REGION, WHOLE, "hybrid"],
            ),
        ];
        let roi = Some(Roi {
            x: 1,
            y: 2,
            width: 3,
            height: 4,
        });
        for (within, [hardware, hardware_region], hybrid, want, kept, asked) in table {
            let case = format!(
                "within {within}, hardware {hardware:?} / {hardware_region:?}, hybrid {hybrid:?}"
            );
            let mut d = Answers {
                hardware,
                hardware_region,
                hybrid,
                asked: Vec::new(),
            };
            let r = route(&mut d, b"jpeg", roi, within);
            assert_eq!(r.route, want, "{case}");
            assert_eq!(r.roi, if kept { roi } else { None }, "{case}");
            assert_eq!(d.asked, asked, "{case}");
        }
        // Without a region there is nothing to retry whole.
        let mut d = Answers::all(false);
        assert_eq!(route(&mut d, b"jpeg", None, true).route, Cpu);
        assert_eq!(d.asked, [WHOLE, "hybrid"]);
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
            let mut d = Answers::all(true);
            assert_eq!(route(&mut d, &jpeg, None, true).route, want, "{jpeg:02x?}");
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
