//! What `stoker selftest --gpu` and `stoker bench --backend cuda` share: a GPU's nvJPEG
//! decoder, the path the CUDA engine sends each JPEG down (the hardware engines, the GPU-hybrid
//! decoder, or the CPU decoder for what nvJPEG refuses), synchronous decodes into device
//! buffers, and the loud line that says the GPU is the emulated one.
//!
//! # Design
//! - [`route`] is the engine's own function ([`stoker_pipeline::engine::cuda::route_image`]:
//!   the engine's limit on pixels, then nvJPEG's hardware engines with the region, then whole,
//!   then its decoupled decoders, else the CPU).
//! - [`decode_sync`] checks that every output buffer holds the image, enqueues the whole
//!   route's work on one stream and waits for it, so it is safe to call: the buffers outlive
//!   the work.
//!
//! # Limitations
//! - One batch at a time per decoder and stream, synchronised after each: these are tools,
//!   not the serving path; the decode-only rate is therefore a floor of what the engines can do
//!   with several batches in flight.

use serde::Serialize;
use stoker_kernels::image::RgbImage;
use stoker_nvidia::cuda::{DeviceBuffer, Stream};
use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegError, Roi};
use stoker_pipeline::transform::decode::routing::{is_progressive, Route, Routed};

use stoker_pipeline::transform::decode::{CpuDecoder, DecodeError, Limits};

/// How many images took each route.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
pub(super) struct DecodeMix {
    pub hardware: u64,
    pub hybrid: u64,
    pub cpu: u64,
}

impl DecodeMix {
    pub(super) fn add(&mut self, route: Route) {
        match route {
            Route::Hardware => self.hardware += 1,
            Route::Hybrid => self.hybrid += 1,
            Route::Cpu => self.cpu += 1,
        }
    }
}

impl std::fmt::Display for DecodeMix {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "hardware {} / hybrid {} / cpu {}",
            self.hardware, self.hybrid, self.cpu
        )
    }
}

/// The route the CUDA engine takes for `jpeg` cut to `roi`, and the region it decodes: the
/// engine's own function ([`stoker_pipeline::engine::cuda::route_image`]).
pub(super) fn route(
    d: &mut NvjpegDecoder,
    jpeg: &[u8],
    roi: Option<Roi>,
    limits: &Limits,
) -> Routed {
    stoker_pipeline::engine::cuda::route_image(d, jpeg, roi, limits)
}

/// One image for the GPU: its bytes, region, output size and where its RGB pixels go (packed,
/// `width * 3` bytes per row).
pub(super) struct GpuImage<'a> {
    pub jpeg: &'a [u8],
    pub roi: Option<Roi>,
    pub width: u32,
    pub height: u32,
    pub out: &'a DeviceBuffer,
}

impl GpuImage<'_> {
    fn target(&self) -> Result<DeviceImage, NvjpegError> {
        let pitch = self.width as usize * 3;
        let need = pitch * self.height as usize;
        if self.out.len() < need {
            return Err(NvjpegError::Invalid(format!(
                "output buffer of {} bytes for a {}x{} image",
                self.out.len(),
                self.width,
                self.height
            )));
        }
        Ok(DeviceImage {
            ptr: self.out.ptr(),
            pitch,
        })
    }
}

/// Decodes `images`, all of which [`route`] sent to `route` (not [`Route::Cpu`]), into their
/// buffers on `stream`, and waits until they are written. Hardware images go in batches of at
/// most `max_batch`.
pub(super) fn decode_sync(
    d: &mut NvjpegDecoder,
    stream: &Stream,
    route: Route,
    images: &[GpuImage<'_>],
    max_batch: usize,
) -> Result<(), NvjpegError> {
    let targets = images
        .iter()
        .map(GpuImage::target)
        .collect::<Result<Vec<_>, _>>()?;
    let enqueued = match route {
        Route::Cpu => Err(NvjpegError::Invalid("the CPU route is not nvJPEG's".into())),
        Route::Hardware => images
            .chunks(max_batch.max(1))
            .zip(targets.chunks(max_batch.max(1)))
            .try_for_each(|(batch, outs)| {
                let jpegs: Vec<&[u8]> = batch.iter().map(|i| i.jpeg).collect();
                let rois: Vec<Option<Roi>> = batch.iter().map(|i| i.roi).collect();
                // SAFETY: each output was checked to hold height * pitch bytes, the buffers
                // are borrowed for this whole call, and the stream is synchronised below
                // before it returns; `route` accepted each image with its ROI.
                unsafe { d.decode_hardware_batch(stream, &jpegs, &rois, outs) }
            }),
        Route::Hybrid => images.iter().zip(&targets).try_for_each(|(img, out)| {
            // SAFETY: as above.
            unsafe { d.decode_hybrid(stream, img.jpeg, img.roi, is_progressive(img.jpeg), *out) }
        }),
    };
    // Wait even after an error: work already enqueued must not outlive the buffers.
    let synced = stream.synchronize();
    enqueued?;
    Ok(synced?)
}

/// The CPU decoder's pixels of `jpeg`, cut to `roi` (packed RGB).
pub(super) fn cpu_reference(
    cpu: &mut CpuDecoder,
    jpeg: &[u8],
    roi: Option<Roi>,
) -> Result<Vec<u8>, DecodeError> {
    let mut img = RgbImage::default();
    cpu.decode_full(jpeg, &mut img)?;
    let r = roi.unwrap_or(Roi {
        x: 0,
        y: 0,
        width: img.width,
        height: img.height,
    });
    if r.x + r.width > img.width || r.y + r.height > img.height {
        return Err(DecodeError::Internal {
            detail: format!(
                "region {r:?} outside the {}x{} image",
                img.width, img.height
            ),
        });
    }
    let mut out = Vec::with_capacity((r.width * r.height * 3) as usize);
    for y in r.y..r.y + r.height {
        let start = ((y * img.width + r.x) * 3) as usize;
        out.extend_from_slice(&img.data[start..start + (r.width * 3) as usize]);
    }
    Ok(out)
}

/// The loud line printed whenever the CUDA driver loaded is the stoker GPU emulator.
pub(super) fn emulated_banner() -> Option<String> {
    stoker_nvidia::emulator::emulated_driver().map(|p| {
        format!(
            "THE GPU IS EMULATED (driver {}): this checks stoker's CUDA code paths, not a GPU; \
             no figure measured here says anything about a real GPU",
            p.display()
        )
    })
}
