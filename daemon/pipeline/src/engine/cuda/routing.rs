//! The route of one image as the CUDA engine takes it, the one function both the engine and the
//! tools (`stoker selftest --gpu`, `stoker bench --backend cuda`) call: PNG and WebP to the CPU
//! (nvJPEG decodes JPEG only), then for a JPEG the engine's pixel limit on the image's size, then [`stoker_nvidia::nvjpeg::route`] (the header refusals, the hardware
//! engines with the region, then whole, the decoupled decoder, else the CPU).
//!
//! # Design
//! The size is the CPU decoder's reading of the header ([`probe`]), else nvJPEG's
//! ([`NvjpegDecoder::info`]) where the CPU cannot read one; an image of unknown size, or over
//! [`Limits::admits`], goes to the CPU, whose decoder refuses it with the CPU backend's reason.

use stoker_nvidia::nvjpeg::{self, NvjpegDecoder, Roi, Route, Routed};

use crate::transform::decode::{probe, ImageFormat, Limits};

/// Where the CUDA engine decodes `jpeg` cut to `roi` under `limits`, and the region it decodes.
pub fn route_image(
    decoder: &mut NvjpegDecoder,
    jpeg: &[u8],
    roi: Option<Roi>,
    limits: &Limits,
) -> Routed {
    if matches!(
        ImageFormat::detect(jpeg),
        Some(ImageFormat::Png | ImageFormat::WebP)
    ) {
        return Routed {
            route: Route::Cpu,
            roi,
        };
    }
    let size = match probe(jpeg) {
        Ok(h) => Some((h.width, h.height)),
        Err(_) => decoder.info(jpeg).ok().map(|i| (i.width, i.height)),
    };
    let within_limits = size.is_some_and(|(w, h)| limits.admits(w, h));
    nvjpeg::route(decoder, jpeg, roi, within_limits)
}
