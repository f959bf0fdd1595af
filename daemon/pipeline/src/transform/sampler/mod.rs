//! The sampler: which global sample indices make up batch `step` of `epoch` for one rank.
//!
//! A pure function of (dataset length, seed, rank, world size, batch size, drop_last, epoch,
//! step), and of an optional elastic [`EpochOffset`]. The epoch's permutation of `0..len` is a
//! Fisher-Yates shuffle drawn from `KeyedRng::new(seed, epoch, 0, Stream::Permutation)`, or
//! `0..len` itself when the spec says `shuffle = false` ([`Sampler::shuffled`]); ranks
//! then take the `torch.utils.data.DistributedSampler` share of it, and the share is cut into
//! batches.
//!
//! # Design
//! - `drop_last = false`: the permutation is padded to a multiple of `world_size` by wrapping
//!   around from its start (`padded[k] = perm[k % len]`, the same as DistributedSampler, even
//!   when the padding is longer than the dataset). The last batch of a rank may be short.
//! - `drop_last = true`: the permutation is truncated to a multiple of `world_size`, and the
//!   final incomplete batch of each rank is dropped.
//! - Rank `r` gets `padded[r], padded[r + W], padded[r + 2W], ...`.
//! - Elastic resume (`docs/multi-host.md`): after `s` steps of every rank at world size `W`
//!   and batch size `B`, the samples consumed are exactly positions `[0, s*B*W)` of the
//!   epoch's permutation (padding only ever falls in an epoch's last step, so no mid-epoch
//!   position is a duplicate). An [`EpochOffset`] `(epoch, consumed)` makes that epoch's
//!   partition cover only the rest, positions `[consumed, len)`, split the same way over the
//!   *current* world size: rank `r`'s `j`-th sample is `perm[(consumed + r + j*W) % len]`, so
//!   the padding wraps to the epoch's first samples (already served before the checkpoint) and
//!   every sample of the rest is served exactly once. With drop_last the rest is truncated to
//!   a multiple of `W`, then each rank's short batch is dropped. Other epochs are the usual
//!   partition. At an unchanged world size an offset of `s*B*W` gives exactly steps `s..` of
//!   the uninterrupted epoch (renumbered from 0).
//! - Resuming at any (epoch, step) costs one permutation (O(len)); the last epoch's permutation
//!   is kept, so consecutive steps of one epoch cost O(batch_size).
//!
//! # Limitations
//! - The permutation of a dataset of `len` samples holds `8 * len` bytes while cached.
//! - Only one epoch (the offset's) can be partial; a checkpoint taken inside it carries its
//!   own offset (`consumed` counts from the epoch's start), so chains of resumes stay exact.

#![forbid(unsafe_code)]

use stoker_wire::protocol::EpochOffset;

use crate::transform::rng::{KeyedRng, Stream};

/// Why a sampler cannot be built, or a position is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    /// A dataset with no sample.
    #[error("the dataset is empty: there is nothing to sample")]
    EmptyDataset,
    /// A world size of 0.
    #[error("world_size must be at least 1")]
    ZeroWorldSize,
    /// A rank at or past the world size.
    #[error("rank {rank} is out of range for world_size {world_size}")]
    RankOutOfRange {
        /// The rank asked for.
        rank: u64,
        /// The job's world size.
        world_size: u64,
    },
    /// A batch size of 0.
    #[error("batch_size must be at least 1")]
    ZeroBatchSize,
    /// With `drop_last`, a rank's share of an epoch is less than one batch.
    #[error(
        "{len} samples over {world_size} ranks in batches of {batch_size} with drop_last \
         leave no batch for a rank"
    )]
    NoBatches {
        /// Samples in the dataset.
        len: u64,
        /// Ranks sharing them.
        world_size: u64,
        /// The batch size.
        batch_size: u64,
    },
    /// A step past the end of its epoch.
    #[error("step {step} is out of range: epoch {epoch} has {steps} steps")]
    StepOutOfRange {
        /// The epoch.
        epoch: u64,
        /// The step asked for.
        step: u64,
        /// The epoch's steps per rank.
        steps: u64,
    },
    /// An elastic offset that consumed more samples than an epoch has.
    #[error(
        "elastic offset: {consumed} samples consumed of epoch {epoch}, but an epoch has only \
         {len}"
    )]
    OffsetBeyondEpoch {
        /// The offset's epoch.
        epoch: u64,
        /// Samples consumed before the offset.
        consumed: u64,
        /// Samples in an epoch (the dataset's size).
        len: u64,
    },
}

/// How one epoch is cut over the ranks: the part of the permutation it covers and the batch
/// counts (equal for every rank).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Partition {
    /// Permutation positions consumed before this partition (0 unless elastic).
    offset: u64,
    /// Samples each rank sees, before batching (padding included).
    samples_per_rank: u64,
    /// Batches per rank.
    steps: u64,
}

impl Partition {
    fn new(len: u64, world_size: u64, batch_size: u64, drop_last: bool, offset: u64) -> Self {
        let rest = len - offset;
        let (samples_per_rank, steps) = if drop_last {
            let per_rank = rest / world_size;
            (per_rank, per_rank / batch_size)
        } else {
            let per_rank = rest.div_ceil(world_size);
            (per_rank, per_rank.div_ceil(batch_size))
        };
        Partition {
            offset,
            samples_per_rank,
            steps,
        }
    }
}

/// The epoch an elastic offset resumes, and how many batches each rank gets in it (the
/// position type's, shared with the client).
pub use stoker_wire::protocol::ResumedEpoch;

/// One rank's view of a job's sample order. Cheap to build; holds the last permutation.
#[derive(Debug, Clone)]
pub struct Sampler {
    len: u64,
    seed: u64,
    rank: u64,
    world_size: u64,
    batch_size: u64,
    drop_last: bool,
    /// Whether each epoch's order is a permutation (training) or `0..len` (evaluation).
    shuffle: bool,
    /// Every epoch's partition but the elastic one.
    regular: Partition,
    /// The epoch an [`EpochOffset`] resumes, and its partition.
    resumed: Option<(u64, Partition)>,
    /// The epoch whose permutation `perm` holds, if any.
    perm_epoch: Option<u64>,
    perm: Vec<u64>,
}

/// The epoch's permutation of `0..len`, written into `out` (its capacity is reused).
pub fn permutation_into(len: u64, seed: u64, epoch: u64, out: &mut Vec<u64>) {
    out.clear();
    out.extend(0..len);
    let mut rng = KeyedRng::new(seed, epoch, 0, Stream::Permutation);
    // Fisher-Yates: for i from the end, swap i with a uniform j in [0, i].
    for i in (1..out.len()).rev() {
        // `j <= i`, an index of `out`.
        #[allow(clippy::cast_possible_truncation)]
        let j = rng.below(i as u64 + 1) as usize;
        out.swap(i, j);
    }
}

impl Sampler {
    /// A sampler for `rank` of `world_size` over a dataset of `len` samples.
    pub fn new(
        len: u64,
        seed: u64,
        rank: u64,
        world_size: u64,
        batch_size: u64,
        drop_last: bool,
    ) -> Result<Sampler, SamplerError> {
        if len == 0 {
            return Err(SamplerError::EmptyDataset);
        }
        if world_size == 0 {
            return Err(SamplerError::ZeroWorldSize);
        }
        if rank >= world_size {
            return Err(SamplerError::RankOutOfRange { rank, world_size });
        }
        if batch_size == 0 {
            return Err(SamplerError::ZeroBatchSize);
        }
        let regular = Partition::new(len, world_size, batch_size, drop_last, 0);
        if regular.steps == 0 {
            return Err(SamplerError::NoBatches {
                len,
                world_size,
                batch_size,
            });
        }
        Ok(Sampler {
            len,
            seed,
            rank,
            world_size,
            batch_size,
            drop_last,
            shuffle: true,
            regular,
            resumed: None,
            perm_epoch: None,
            perm: Vec::new(),
        })
    }

    /// This sampler with every epoch in dataset order (`shuffle = false`: evaluation, as
    /// DistributedSampler(shuffle=False)) or permuted (the default).
    pub fn shuffled(mut self, shuffle: bool) -> Sampler {
        self.shuffle = shuffle;
        self.perm_epoch = None;
        self
    }

    /// This sampler with epoch `offset.epoch` covering only the samples after the first
    /// `offset.consumed` of its permutation (an elastic resume). An offset of 0 changes
    /// nothing; the resumed epoch may have no step left (see [`Sampler::steps_in`]).
    pub fn with_offset(mut self, offset: EpochOffset) -> Result<Sampler, SamplerError> {
        if offset.consumed > self.len {
            return Err(SamplerError::OffsetBeyondEpoch {
                epoch: offset.epoch,
                consumed: offset.consumed,
                len: self.len,
            });
        }
        self.resumed = (offset.consumed > 0).then(|| {
            let p = Partition::new(
                self.len,
                self.world_size,
                self.batch_size,
                self.drop_last,
                offset.consumed,
            );
            (offset.epoch, p)
        });
        Ok(self)
    }

    fn partition(&self, epoch: u64) -> &Partition {
        match &self.resumed {
            Some((e, p)) if *e == epoch => p,
            _ => &self.regular,
        }
    }

    /// Whether short batches and the tail of the permutation are dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Batches per epoch for this rank (the same for every rank), in every epoch but an
    /// elastic offset's (see [`Sampler::steps_in`]).
    pub fn steps_per_epoch(&self) -> u64 {
        self.regular.steps
    }

    /// Batches of `epoch` for this rank (the same for every rank). Never 0 except for an
    /// elastic offset's epoch with nothing left to serve.
    pub fn steps_in(&self, epoch: u64) -> u64 {
        self.partition(epoch).steps
    }

    /// The elastic offset's epoch and its batch count, if this sampler has one.
    pub fn resumed_epoch(&self) -> Option<ResumedEpoch> {
        self.resumed.map(|(epoch, p)| ResumedEpoch {
            epoch,
            steps: p.steps,
        })
    }

    /// Samples this rank sees per epoch, before batching (padding included).
    pub fn samples_per_rank(&self) -> u64 {
        self.regular.samples_per_rank
    }

    /// The number of samples in batch `step` of a regular epoch (`batch_size`, or less for the
    /// last batch without drop_last).
    pub fn batch_len(&self, step: u64) -> u64 {
        let start = step * self.batch_size;
        self.batch_size
            .min(self.regular.samples_per_rank.saturating_sub(start))
    }

    /// Whether (epoch, step) is a position this sampler can produce.
    pub fn check_position(&self, epoch: u64, step: u64) -> Result<(), SamplerError> {
        let steps = self.steps_in(epoch);
        if step >= steps {
            return Err(SamplerError::StepOutOfRange { epoch, step, steps });
        }
        Ok(())
    }

    /// The global sample indices of batch `step` of `epoch` for this rank.
    ///
    /// # Panics
    /// If `step >= steps_in(epoch)` (see [`Sampler::check_position`]).
    pub fn batch_indices(&mut self, epoch: u64, step: u64) -> Vec<u64> {
        // A capacity hint: a batch of this rank's samples, which are in memory.
        #[allow(clippy::cast_possible_truncation)]
        let mut out = Vec::with_capacity(self.batch_size as usize);
        self.batch_indices_into(epoch, step, &mut out);
        out
    }

    /// Like [`Sampler::batch_indices`], into `out` (cleared first; its capacity is reused).
    ///
    /// # Panics
    /// If `step >= steps_in(epoch)` (see [`Sampler::check_position`]).
    pub fn batch_indices_into(&mut self, epoch: u64, step: u64, out: &mut Vec<u64>) {
        if let Err(e) = self.check_position(epoch, step) {
            panic!("{e}");
        }
        let start = step * self.batch_size;
        self.share_into(epoch, start, start + self.batch_size, out);
    }

    /// This rank's samples of `epoch` from batch `step` to the epoch's end, in the order it
    /// reads them (what its storage is told to fetch ahead), into `out` (cleared first).
    ///
    /// # Panics
    /// If `step >= steps_in(epoch)` (see [`Sampler::check_position`]).
    pub fn rest_of_epoch_into(&mut self, epoch: u64, step: u64, out: &mut Vec<u64>) {
        if let Err(e) = self.check_position(epoch, step) {
            panic!("{e}");
        }
        self.share_into(epoch, step * self.batch_size, u64::MAX, out);
    }

    /// Positions `start..end` (capped at the rank's share) of this rank's share of `epoch`.
    fn share_into(&mut self, epoch: u64, start: u64, end: u64, out: &mut Vec<u64>) {
        let part = *self.partition(epoch);
        if self.perm_epoch != Some(epoch) {
            if self.shuffle {
                permutation_into(self.len, self.seed, epoch, &mut self.perm);
            } else {
                self.perm.clear();
                self.perm.extend(0..self.len);
            }
            self.perm_epoch = Some(epoch);
        }
        out.clear();
        for j in start..end.min(part.samples_per_rank) {
            // Position in the padded permutation; wrap around for the padding.
            let k = part.offset + self.rank + j * self.world_size;
            // Below `len`, the permutation's length.
            #[allow(clippy::cast_possible_truncation)]
            let at = (k % self.len) as usize;
            out.push(self.perm[at]);
        }
    }
}

#[cfg(test)]
mod tests;
