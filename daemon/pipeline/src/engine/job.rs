//! A job: one training run's dataset, spec, seed and world size, shared by its ranks, and the
//! sampler each rank draws its batches from.
//!
//! # Design
//! - The job is immutable once made; ranks hold an `Arc` of it, and the scheduler groups feeds
//!   by its identity for fair share.
//!
//! # Limitations
//! - The spec and world size are fixed for the job's life.

#![forbid(unsafe_code)]

use std::sync::Arc;

use stoker_wire::spec::PipelineSpec;

use stoker_wire::protocol::{EpochOffset, EpochSteps};

use super::{PipelineError, Position};
use crate::source::index::Dataset;
use crate::source::local::fsopen::{OpenPolicy, OpenRules};
use crate::transform::badsample::BadNames;
use crate::transform::decode::EntryHold;
use crate::transform::sampler::Sampler;

/// A training run's data: a dataset, a spec, a seed and a world size. Shared by its ranks.
pub struct Job {
    /// The dataset's index (every rank samples the same one).
    pub dataset: Arc<Dataset>,
    /// What a batch is (size, crop, dtype, layout, epochs, ...).
    pub spec: PipelineSpec,
    /// The seed of the shuffle and of every sample's crop and flip.
    pub seed: u64,
    /// Ranks the dataset is split over (at least 1).
    pub world_size: u32,
    /// Batches per rank of each epoch (fewer in the offset's epoch).
    pub(super) steps: EpochSteps,
    /// The elastic resume point every rank of the job shares, if any (see [`crate::transform::sampler`]).
    offset: Option<EpochOffset>,
    /// How the job's files are opened (credentials, symlinks, shard identities).
    pub(super) rules: Arc<OpenRules>,
    /// The uid that created the job: the scheduler shares the workers between users first.
    pub owner: u32,
    /// Each view's own spec (`spec.view_spec(v)`), made once: one entry for a one-view job.
    pub(super) view_specs: Vec<PipelineSpec>,
    /// Per view with operations, the spec its 8-bit pixels are cropped to before them (the
    /// view's crop and flip, `u8`, NHWC; see [`crate::transform::ops`]); `None` for a view
    /// without, which keeps the fused path.
    pub(super) pixel_specs: Vec<Option<PipelineSpec>>,
    /// The job's bad samples, counted and the first few named, for its clients.
    pub bad: BadNames,
    /// The owner's JPEG entry points, held while the job lives: dropped with the job's last
    /// `Arc`, after its last decode, so the owner's entries go with its last job.
    _entries: EntryHold,
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
    /// A job with the default open policy, owner uid 0 and no elastic offset (tests,
    /// benchmarks, in-process use); fails on an invalid spec or a world size the sampler
    /// refuses.
    pub fn new(
        dataset: Arc<Dataset>,
        spec: PipelineSpec,
        seed: u64,
        world_size: u32,
    ) -> Result<Arc<Job>, PipelineError> {
        Job::with_policy(
            dataset,
            spec,
            seed,
            world_size,
            None,
            OpenPolicy::default(),
            0,
        )
    }

    /// A job whose files are opened under `policy` (a client's credentials, no symlinks;
    /// its tar shards must stay the files indexed, see [`crate::source::local::fsopen`]), and whose epoch
    /// `offset.epoch` serves only what is left after an elastic checkpoint, if any.
    pub fn with_policy(
        dataset: Arc<Dataset>,
        spec: PipelineSpec,
        seed: u64,
        world_size: u32,
        offset: Option<EpochOffset>,
        policy: OpenPolicy,
        owner: u32,
    ) -> Result<Arc<Job>, PipelineError> {
        spec.validate()?;
        if let Some(num_classes) = spec.soft_labels() {
            check_labels(&dataset, num_classes)?;
        }
        let offset = offset.filter(|o| o.consumed > 0);
        let sampler = Self::make_sampler(&dataset, &spec, seed, 0, world_size, offset)?;
        let rules = Arc::new(OpenRules::new(policy, dataset.file_identities()));
        let view_specs: Vec<PipelineSpec> =
            (0..spec.view_count()).map(|v| spec.view_spec(v)).collect();
        let pixel_specs = view_specs.iter().map(pixel_spec).collect();
        Ok(Arc::new(Job {
            view_specs,
            pixel_specs,
            steps: EpochSteps {
                per_epoch: sampler.steps_per_epoch(),
                resumed: sampler.resumed_epoch(),
            },
            offset,
            dataset,
            spec,
            seed,
            world_size,
            rules,
            owner,
            bad: BadNames::default(),
            _entries: EntryHold::new(owner),
        }))
    }

    fn make_sampler(
        dataset: &Dataset,
        spec: &PipelineSpec,
        seed: u64,
        rank: u32,
        world_size: u32,
        offset: Option<EpochOffset>,
    ) -> Result<Sampler, PipelineError> {
        let sampler = Sampler::new(
            dataset.len() as u64,
            seed,
            rank as u64,
            world_size as u64,
            spec.batch_size as u64,
            spec.drop_last,
        )
        .map(|s| s.shuffled(spec.shuffle));
        match offset {
            Some(o) => sampler.and_then(|s| s.with_offset(o)),
            None => sampler,
        }
        .map_err(|e| PipelineError::Sampler(e.to_string()))
    }

    /// The elastic resume point of this job, if any.
    pub fn offset(&self) -> Option<EpochOffset> {
        self.offset
    }

    /// Batches each rank receives in `epoch` (the offset's epoch may have fewer, even none).
    pub fn steps_in(&self, epoch: u64) -> u64 {
        self.steps.steps_in(epoch)
    }

    /// The first batch at or after `pos` that exists: past the end of an epoch (or in an
    /// elastic epoch with nothing left) is the start of the next ([`Position::settle`], the
    /// rule the client follows too).
    pub fn settle(&self, pos: Position) -> Position {
        pos.settle(&self.steps)
    }

    /// How the job's files are opened.
    pub fn open_policy(&self) -> &OpenPolicy {
        &self.rules.policy
    }

    /// Batches each rank receives per epoch.
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps.per_epoch
    }

    /// The sampler of one rank of this job.
    pub fn sampler(&self, rank: u32) -> Result<Sampler, PipelineError> {
        if rank >= self.world_size {
            return Err(PipelineError::Rank {
                rank,
                world_size: self.world_size,
            });
        }
        Self::make_sampler(
            &self.dataset,
            &self.spec,
            self.seed,
            rank,
            self.world_size,
            self.offset,
        )
    }

    /// Whether `pos` lies past the job's last epoch.
    pub(super) fn is_past_end(&self, pos: Position) -> bool {
        matches!(self.spec.epochs, Some(e) if pos.epoch >= e as u64)
    }
}

/// The spec a view with operations is cropped to before them: its crop and flip into 8-bit
/// interleaved pixels, nothing else; `None` for a view without operations.
fn pixel_spec(view: &PipelineSpec) -> Option<PipelineSpec> {
    (!view.ops.is_empty()).then(|| PipelineSpec {
        dtype: stoker_wire::spec::DType::U8,
        layout: stoker_wire::spec::Layout::Nhwc,
        ops: Vec::new(),
        erasing: None,
        batch_mix: None,
        fields: Vec::new(),
        extra_views: Vec::new(),
        ..view.clone()
    })
}

/// Refuses a dataset with a label outside `0..num_classes` (a batch mix's one-hot rows).
fn check_labels(dataset: &Dataset, num_classes: u32) -> Result<(), PipelineError> {
    let bad = (0..dataset.len())
        .map(|i| (i, dataset.sample(i).label))
        .find(|&(_, l)| !(0..i64::from(num_classes)).contains(&l));
    match bad {
        None => Ok(()),
        Some((i, label)) => Err(PipelineError::MixLabel {
            sample: dataset.display_name(i),
            label,
            num_classes,
        }),
    }
}
