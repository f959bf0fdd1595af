//! The decode stages of `stoker bench`: decode only, and decode + augment, from bytes in
//! memory, each image through the pipeline's own format door.
//!
//! # Design
//! - Every sample goes where the pipeline sends it: `probe_image` reads its header by its
//!   content (JPEG, PNG, WebP) and `CpuDecoder::decode_for_crop` decodes it (a JPEG's region
//!   at the smallest DCT scale covering the crop; PNG and WebP whole), so the rate is the one
//!   the pipeline can reach on these files.
//! - A sample that fails (corrupt, or of no format stoker decodes) is counted in `failed`, not
//!   in `images`: a failure costs almost nothing, and counting it as decoded made a PNG folder
//!   look thousands of times faster than its pipeline (issue 43).
//!
//! # Limitations
//! - Samples are decoded with the first epoch's crop of each; later epochs draw other crops,
//!   which changes a JPEG's region decode a little.

#![forbid(unsafe_code)]

use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
use std::sync::PoisonError;
use std::time::Instant;

use stoker_pipeline::engine::EngineConfig;
use stoker_pipeline::sync::lock;
use stoker_pipeline::transform::augment::{sample_params, Augmenter};
use stoker_pipeline::transform::decode::{probe_image, CpuDecoder, DecodeError};
use stoker_wire::spec::PipelineSpec;

use super::{
    effective_threads, timed_threads, AtLeast, BenchError, CacheState, Stage, StageResult,
};

/// Decode only (`augment == false`) or decode + augment, from bytes in memory, on `threads`
/// threads, each image decoded as the pipeline decodes it. Repeats the set until `at_least` is
/// reached; failures are counted apart (`StageResult::failed`).
pub(crate) fn decode_stage(
    samples: &[(u64, Vec<u8>)],
    spec: &PipelineSpec,
    engine: &EngineConfig,
    seed: u64,
    augment: bool,
    at_least: AtLeast,
) -> Result<StageResult, BenchError> {
    let threads = effective_threads(engine.threads);
    let total = at_least.whole_passes(samples.len());
    let image_bytes = stoker_wire::ring::SlotLayout::new(spec).image_bytes;
    let (next, done, failures) = (AtomicUsize::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let bytes = AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let t0 = Instant::now();
    let (secs, cpu) = timed_threads(threads, |_| {
        let mut decoder = match CpuDecoder::new(engine.limits) {
            Ok(d) => d,
            Err(e) => {
                *lock(&failed) = Some(e);
                return;
            }
        };
        let mut augmenter = Augmenter::new();
        let mut image = stoker_kernels::image::RgbImage::default();
        let mut out = vec![0u8; image_bytes];
        loop {
            let k = next.fetch_add(1, Relaxed);
            if samples.is_empty() || (k >= total && t0.elapsed().as_secs_f64() >= at_least.seconds)
            {
                return;
            }
            let (index, data) = &samples[k % samples.len()];
            if let Some(t) = engine.throttle {
                std::thread::sleep(t.decode_delay);
            }
            let ok = (|| -> Result<(), DecodeError> {
                let h = probe_image(data)?;
                let (crop, flip) = sample_params(spec, h.width, h.height, seed, 0, *index);
                let within =
                    decoder.decode_for_crop(data, crop, spec.crop.output_size(), &mut image)?;
                if augment {
                    augmenter.augment_into(&image, within, flip, spec, &mut out);
                }
                Ok(())
            })();
            if ok.is_ok() {
                bytes.fetch_add(data.len() as u64, Relaxed);
                done.fetch_add(1, Relaxed);
            } else {
                failures.fetch_add(1, Relaxed);
            }
        }
    });
    // The lock policy (stoker_pipeline::sync): a panicked thread leaves the value as is.
    if let Some(e) = failed.into_inner().unwrap_or_else(PoisonError::into_inner) {
        return Err(BenchError::Decoder(e));
    }
    let name = if augment {
        Stage::DecodeAugment
    } else {
        Stage::Decode
    };
    let mut row = StageResult::new(
        name,
        threads,
        done.into_inner(),
        bytes.into_inner(),
        secs,
        cpu,
        CacheState::Memory,
    );
    row.failed = failures.into_inner();
    Ok(row)
}
