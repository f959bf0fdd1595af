//! The entropy-decode ceiling in `stoker bench` (issue 25): the rate of Huffman decoding alone
//! on the user's data, and stoker's rate per core as a fraction of it.
//!
//! # Design
//! - The same harness as the decode stages (`timed_threads`, samples in memory, repeated until
//!   `AtLeast`), with `transform::decode::EntropyDecoder` as the work.
//! - The fraction compares images per CPU-second, so other load on a shared machine cancels.
//!
//! # Limitations
//! - The ceiling decodes whole files; the pipeline stops at the crop's last row and can pass
//!   it (see `docs/benchmarks.md`).

#![forbid(unsafe_code)]

use std::sync::PoisonError;
use std::time::Instant;

use serde::Serialize;
use stoker_pipeline::engine::EngineConfig;
use stoker_pipeline::sync::lock;

use super::{
    effective_threads, timed_threads, AtLeast, BenchError, CacheState, Stage, StageResult,
};

/// Entropy decoding alone (`EntropyDecoder`: every coefficient of every JPEG, no IDCT, no
/// colour, no output), from bytes in memory, on `threads` threads: the ceiling of the CPU
/// path. Samples that are not JPEGs, or that fail, are counted in `failed`, not in `images`,
/// as in [`super::decode_stage`]. Repeats the set until `at_least` is reached.
pub(crate) fn entropy_stage(
    samples: &[(u64, Vec<u8>)],
    engine: &EngineConfig,
    at_least: AtLeast,
) -> Result<StageResult, BenchError> {
    use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering::Relaxed};
    let threads = effective_threads(engine.threads);
    let total = at_least.whole_passes(samples.len());
    let (next, done, bytes) = (AtomicUsize::new(0), AtomicU64::new(0), AtomicU64::new(0));
    let failures = AtomicU64::new(0);
    let failed = std::sync::Mutex::new(None);
    let t0 = Instant::now();
    let (secs, cpu) = timed_threads(threads, |_| {
        let mut decoder =
            match stoker_pipeline::transform::decode::EntropyDecoder::new(engine.limits) {
                Ok(d) => d,
                Err(e) => {
                    *lock(&failed) = Some(e);
                    return;
                }
            };
        loop {
            let k = next.fetch_add(1, Relaxed);
            if samples.is_empty() || (k >= total && t0.elapsed().as_secs_f64() >= at_least.seconds)
            {
                return;
            }
            let data = &samples[k % samples.len()].1;
            if decoder.decode(data).is_ok() {
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
    let mut row = StageResult::new(
        Stage::Entropy,
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

/// More failures than this share of the entropy row's samples and the ceiling is not shown:
/// the row then measures only the JPEGs (and the corrupt files cost nothing), while the
/// pipeline decodes every format, so their ratio would compare different work.
pub(crate) const CEILING_MAX_FAILED_SHARE: f64 = 0.01;

/// How close stoker comes to the entropy-decode ceiling, per core: images per CPU-second
/// (user + system) of the entropy row and of the in-process pipeline (reader, decode,
/// augment, engine). Per CPU-second, not per wall second, so that other load on a shared
/// machine cancels out.
#[derive(Debug, Clone, Copy, Serialize)]
pub(crate) struct Ceiling {
    /// Images per CPU-second, entropy decoding alone.
    pub entropy_per_core: f64,
    /// Images per CPU-second, the whole pipeline in process.
    pub stoker_per_core: f64,
    /// `stoker_per_core / entropy_per_core`.
    pub fraction: f64,
}

impl Ceiling {
    /// From the warm entropy and pipeline rows of `stages`; `None` without both, or where
    /// the entropy row failed on more than [`CEILING_MAX_FAILED_SHARE`] of its samples (PNG,
    /// WebP or corrupt files: see [`Ceiling::not_shown`]).
    pub(crate) fn of(stages: &[StageResult]) -> Option<Ceiling> {
        if Self::not_shown(stages).is_some() {
            return None;
        }
        let per_core = |stage: Stage| {
            stages
                .iter()
                .find(|s| s.stage == stage && s.cache != CacheState::Cold)
                .filter(|s| s.cpu_s_per_1000 > 0.0)
                .map(|s| 1000.0 / s.cpu_s_per_1000)
        };
        let (entropy_per_core, stoker_per_core) =
            (per_core(Stage::Entropy)?, per_core(Stage::Pipeline)?);
        Some(Ceiling {
            entropy_per_core,
            stoker_per_core,
            fraction: stoker_per_core / entropy_per_core,
        })
    }

    /// Why the table shows no ceiling although the entropy row ran: its failed share.
    pub(crate) fn not_shown(stages: &[StageResult]) -> Option<String> {
        let row = stages.iter().find(|s| s.stage == Stage::Entropy)?;
        let tried = row.images + row.failed;
        (row.failed as f64 > CEILING_MAX_FAILED_SHARE * tried as f64).then(|| {
            format!(
                "entropy-decode ceiling: not shown: {} of {tried} samples are not JPEGs the \
                 entropy decoder reads (other formats or corrupt files), so the ceiling would \
                 measure other work than the pipeline's\n",
                row.failed
            )
        })
    }

    /// One line for the table.
    pub(crate) fn line(&self) -> String {
        format!(
            "per core: stoker {:.1} img/s per CPU-second = {:.0}% of the entropy-decode ceiling \
             ({:.1} img/s per CPU-second, coefficients only)\n",
            self.stoker_per_core,
            self.fraction * 100.0,
            self.entropy_per_core
        )
    }
}
