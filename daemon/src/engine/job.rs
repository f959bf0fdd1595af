//! A job: one training run's dataset, spec, seed and world size, shared by its ranks, and the
//! sampler each rank draws its batches from.
//!
//! # Design
//! - The job is immutable once made; ranks hold an `Arc` of it, and the scheduler groups feeds
//!   by its identity for fair share.
//!
//! # Limitations
//! - The spec and world size are fixed for the job's life.

use std::sync::Arc;

use stoker::spec::PipelineSpec;

use super::{PipelineError, Position};
use crate::dataset::Dataset;
use crate::sampler::Sampler;

/// A training run's data: a dataset, a spec, a seed and a world size. Shared by its ranks.
pub struct Job {
    pub dataset: Arc<Dataset>,
    pub spec: PipelineSpec,
    pub seed: u64,
    pub world_size: u32,
    pub(super) steps_per_epoch: u64,
}

impl std::fmt::Debug for Job {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Job")
            .field("samples", &self.dataset.len())
            .field("spec", &self.spec)
            .field("seed", &self.seed)
            .field("world_size", &self.world_size)
            .finish()
    }
}

impl Job {
    pub fn new(
        dataset: Arc<Dataset>,
        spec: PipelineSpec,
        seed: u64,
        world_size: u32,
    ) -> Result<Arc<Job>, PipelineError> {
        spec.validate()?;
        let sampler = Self::make_sampler(&dataset, &spec, seed, 0, world_size)?;
        Ok(Arc::new(Job {
            steps_per_epoch: sampler.steps_per_epoch(),
            dataset,
            spec,
            seed,
            world_size,
        }))
    }

    fn make_sampler(
        dataset: &Dataset,
        spec: &PipelineSpec,
        seed: u64,
        rank: u32,
        world_size: u32,
    ) -> Result<Sampler, PipelineError> {
        Sampler::new(
            dataset.len() as u64,
            seed,
            rank as u64,
            world_size as u64,
            spec.batch_size as u64,
            spec.drop_last,
        )
        .map_err(|e| PipelineError::Sampler(e.to_string()))
    }

    /// Batches each rank receives per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// The sampler of one rank of this job.
    pub fn sampler(&self, rank: u32) -> Result<Sampler, PipelineError> {
        if rank >= self.world_size {
            return Err(PipelineError::Rank {
                rank,
                world_size: self.world_size,
            });
        }
        Self::make_sampler(&self.dataset, &self.spec, self.seed, rank, self.world_size)
    }

    /// Whether `pos` lies past the job's last epoch.
    pub(super) fn is_past_end(&self, pos: Position) -> bool {
        matches!(self.spec.epochs, Some(e) if pos.epoch >= e as u64)
    }
}
