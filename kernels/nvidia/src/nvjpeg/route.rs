//! The one rule saying which decoder takes a JPEG: nvJPEG's hardware engines, its GPU-hybrid
//! decoder, or the CPU. The CUDA engine and the tools (`stoker selftest --gpu`, `stoker bench
//! --backend cuda`) all call [`route`]; nothing else decides.
//!
//! # Design
//! - The caller's limits come first: an image they refuse (over `max_pixels`) goes to the CPU,
//!   whose decoder refuses it with the reason, and nvJPEG is not asked about it.
//! - Then nvJPEG is asked, in order and only as far as needed: the hardware engines
//!   (`nvjpegDecodeBatchedSupportedEx`, with the region), the GPU-hybrid decoder
//!   (`nvjpegDecoderJpegSupported`, with the region), else the CPU. A query that fails counts as
//!   a refusal: the image is not lost, the CPU decodes it or says why it cannot.
//! - The two questions are a trait ([`RouteQuery`]) so the rule's table is tested without a
//!   GPU; [`NvjpegDecoder`] answers them for real.
//!
//! # Limitations
//! The rule trusts nvJPEG's own answers; it does not second-guess them with what is known of
//! the hardware decoder's limits (sizes, sampling).

use super::{NvjpegDecoder, NvjpegError, Roi};

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
    if !within_limits {
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

    #[test]
    fn route_names_are_the_metrics_labels() {
        let names: Vec<&str> = [Route::Hardware, Route::Hybrid, Route::Cpu]
            .into_iter()
            .map(Route::name)
            .collect();
        assert_eq!(names, ["hardware", "hybrid", "cpu"]);
    }
}
