//! What the tests attach with: u8 batches (small rings) of a square training crop, and the
//! options of one rank of a job.

#![forbid(unsafe_code)]

use std::time::Duration;

use stoker::{AttachOptions, DType, PipelineSpec};

/// A training spec with u8 output (small rings): `batch` images of `side` x `side`, for
/// `epochs` (`None`: without end).
pub fn u8_spec(batch: u32, side: u32, epochs: Option<u32>) -> PipelineSpec {
    PipelineSpec {
        dtype: DType::U8,
        epochs,
        ..PipelineSpec::train(batch, side)
    }
}

/// Rank `rank` of `world` of job `job` on `dataset` (a registered name or a path), with
/// `seed`; attaching fails at once when no daemon answers.
pub fn rank_options(
    dataset: &str,
    job: &str,
    (rank, world): (u32, u32),
    seed: u64,
    spec: PipelineSpec,
) -> AttachOptions {
    AttachOptions {
        rank,
        world_size: world,
        seed,
        connect_timeout: Duration::ZERO,
        ..AttachOptions::new(job, dataset, spec)
    }
}
