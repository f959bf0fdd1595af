//! The sampler: which global sample indices make up batch `step` of `epoch` for one rank.
//!
//! A pure function of (dataset length, seed, rank, world size, batch size, drop_last, epoch,
//! step). The epoch's permutation of `0..len` is a Fisher-Yates shuffle drawn from
//! `KeyedRng::new(seed, epoch, 0, Stream::Permutation)`; ranks then take the
//! `torch.utils.data.DistributedSampler` share of it, and the share is cut into batches.
//!
//! # Design
//! - `drop_last = false`: the permutation is padded to a multiple of `world_size` by wrapping
//!   around from its start (`padded[k] = perm[k % len]`, the same as DistributedSampler, even
//!   when the padding is longer than the dataset). The last batch of a rank may be short.
//! - `drop_last = true`: the permutation is truncated to a multiple of `world_size`, and the
//!   final incomplete batch of each rank is dropped.
//! - Rank `r` gets `padded[r], padded[r + W], padded[r + 2W], ...`.
//! - Resuming at any (epoch, step) costs one permutation (O(len)); the last epoch's permutation
//!   is kept, so consecutive steps of one epoch cost O(batch_size).
//!
//! # Limitations
//! - The permutation of a dataset of `len` samples holds `8 * len` bytes while cached.

use crate::rng::{KeyedRng, Stream};

/// Why a sampler cannot be built, or a position is out of range.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SamplerError {
    #[error("the dataset is empty: there is nothing to sample")]
    EmptyDataset,
    #[error("world_size must be at least 1")]
    ZeroWorldSize,
    #[error("rank {rank} is out of range for world_size {world_size}")]
    RankOutOfRange { rank: u64, world_size: u64 },
    #[error("batch_size must be at least 1")]
    ZeroBatchSize,
    #[error(
        "{len} samples over {world_size} ranks in batches of {batch_size} with drop_last \
         leave no batch for a rank"
    )]
    NoBatches {
        len: u64,
        world_size: u64,
        batch_size: u64,
    },
    #[error("step {step} is out of range: an epoch has {steps_per_epoch} steps")]
    StepOutOfRange { step: u64, steps_per_epoch: u64 },
}

/// One rank's view of a job's sample order. Cheap to build; holds the last permutation.
#[derive(Debug, Clone)]
pub struct Sampler {
    len: u64,
    seed: u64,
    rank: u64,
    world_size: u64,
    batch_size: u64,
    drop_last: bool,
    samples_per_rank: u64,
    steps_per_epoch: u64,
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
        let samples_per_rank = if drop_last {
            len / world_size
        } else {
            len.div_ceil(world_size)
        };
        let steps_per_epoch = if drop_last {
            samples_per_rank / batch_size
        } else {
            samples_per_rank.div_ceil(batch_size)
        };
        if steps_per_epoch == 0 {
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
            samples_per_rank,
            steps_per_epoch,
            perm_epoch: None,
            perm: Vec::new(),
        })
    }

    /// Whether short batches and the tail of the permutation are dropped.
    pub fn drop_last(&self) -> bool {
        self.drop_last
    }

    /// Batches per epoch for this rank (the same for every rank).
    pub fn steps_per_epoch(&self) -> u64 {
        self.steps_per_epoch
    }

    /// Samples this rank sees per epoch, before batching (padding included).
    pub fn samples_per_rank(&self) -> u64 {
        self.samples_per_rank
    }

    /// The number of samples in batch `step` (`batch_size`, or less for the last batch
    /// without drop_last).
    pub fn batch_len(&self, step: u64) -> u64 {
        let start = step * self.batch_size;
        self.batch_size
            .min(self.samples_per_rank.saturating_sub(start))
    }

    /// Whether (epoch, step) is a position this sampler can produce.
    pub fn check_position(&self, step: u64) -> Result<(), SamplerError> {
        if step >= self.steps_per_epoch {
            return Err(SamplerError::StepOutOfRange {
                step,
                steps_per_epoch: self.steps_per_epoch,
            });
        }
        Ok(())
    }

    /// The global sample indices of batch `step` of `epoch` for this rank.
    ///
    /// # Panics
    /// If `step >= steps_per_epoch()` (see [`Sampler::check_position`]).
    pub fn batch_indices(&mut self, epoch: u64, step: u64) -> Vec<u64> {
        let mut out = Vec::with_capacity(self.batch_size as usize);
        self.batch_indices_into(epoch, step, &mut out);
        out
    }

    /// Like [`Sampler::batch_indices`], into `out` (cleared first; its capacity is reused).
    ///
    /// # Panics
    /// If `step >= steps_per_epoch()` (see [`Sampler::check_position`]).
    pub fn batch_indices_into(&mut self, epoch: u64, step: u64, out: &mut Vec<u64>) {
        if let Err(e) = self.check_position(step) {
            panic!("{e}");
        }
        if self.perm_epoch != Some(epoch) {
            permutation_into(self.len, self.seed, epoch, &mut self.perm);
            self.perm_epoch = Some(epoch);
        }
        out.clear();
        let start = step * self.batch_size;
        let end = (start + self.batch_size).min(self.samples_per_rank);
        for j in start..end {
            // Position in the padded permutation; wrap around for the padding.
            let k = self.rank + j * self.world_size;
            out.push(self.perm[(k % self.len) as usize]);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn epoch_of(s: &mut Sampler, epoch: u64) -> Vec<u64> {
        (0..s.steps_per_epoch())
            .flat_map(|step| s.batch_indices(epoch, step))
            .collect()
    }

    #[test]
    fn padding_wraps_from_the_start_like_distributed_sampler() {
        // 10 samples over 4 ranks: 12 slots, the last two are perm[0], perm[1].
        let mut perm = Vec::new();
        permutation_into(10, 3, 0, &mut perm);
        let shares: Vec<Vec<u64>> = (0..4)
            .map(|r| epoch_of(&mut Sampler::new(10, 3, r, 4, 2, false).unwrap(), 0))
            .collect();
        assert_eq!(shares[0], vec![perm[0], perm[4], perm[8]]);
        assert_eq!(shares[1], vec![perm[1], perm[5], perm[9]]);
        assert_eq!(shares[2], vec![perm[2], perm[6], perm[0]]);
        assert_eq!(shares[3], vec![perm[3], perm[7], perm[1]]);
        // Padding longer than the dataset: 2 samples over 5 ranks.
        let mut perm = Vec::new();
        permutation_into(2, 9, 1, &mut perm);
        for r in 0..5 {
            let mut s = Sampler::new(2, 9, r, 5, 1, false).unwrap();
            assert_eq!(s.batch_indices(1, 0), vec![perm[(r % 2) as usize]]);
        }
    }

    #[test]
    fn drop_last_truncates_and_drops_the_short_batch() {
        // 10 samples, 4 ranks: 8 used, 2 per rank; batch 3 drops everything -> error.
        assert!(matches!(
            Sampler::new(10, 0, 0, 4, 3, true),
            Err(SamplerError::NoBatches { .. })
        ));
        let mut s = Sampler::new(23, 0, 1, 4, 2, true).unwrap();
        assert_eq!(s.samples_per_rank(), 5);
        assert_eq!(s.steps_per_epoch(), 2);
        assert!(epoch_of(&mut s, 0).len() == 4);
        let s = Sampler::new(23, 0, 1, 4, 2, false).unwrap();
        assert_eq!(s.samples_per_rank(), 6);
        assert_eq!(s.steps_per_epoch(), 3);
        let mut s = Sampler::new(23, 0, 1, 4, 4, false).unwrap();
        assert_eq!(s.batch_len(1), 2);
        assert_eq!(s.batch_indices(0, 1).len(), 2);
    }

    #[test]
    fn constructor_rejects_bad_arguments() {
        assert_eq!(
            Sampler::new(0, 0, 0, 1, 1, false).unwrap_err(),
            SamplerError::EmptyDataset
        );
        assert_eq!(
            Sampler::new(5, 0, 0, 0, 1, false).unwrap_err(),
            SamplerError::ZeroWorldSize
        );
        assert_eq!(
            Sampler::new(5, 0, 2, 2, 1, false).unwrap_err(),
            SamplerError::RankOutOfRange {
                rank: 2,
                world_size: 2
            }
        );
        assert_eq!(
            Sampler::new(5, 0, 0, 1, 0, false).unwrap_err(),
            SamplerError::ZeroBatchSize
        );
        let s = Sampler::new(5, 0, 0, 1, 2, false).unwrap();
        assert_eq!(
            s.check_position(3).unwrap_err(),
            SamplerError::StepOutOfRange {
                step: 3,
                steps_per_epoch: 3
            }
        );
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(128))]

        #[test]
        fn every_index_once_per_epoch_across_disjoint_ranks(
            per_rank in 1u64..60, world in 1u64..9, batch in 1u64..17,
            seed in any::<u64>(), epoch in 0u64..1000, drop_last in any::<bool>(),
        ) {
            // len a multiple of world: no padding and no truncation.
            let len = per_rank * world;
            let mut seen = vec![0u32; len as usize];
            let mut total = 0u64;
            for r in 0..world {
                let Ok(mut s) = Sampler::new(len, seed, r, world, batch, drop_last) else {
                    prop_assert!(drop_last && per_rank < batch);
                    return Ok(());
                };
                let share = epoch_of(&mut s, epoch);
                let want = if drop_last { per_rank / batch * batch } else { per_rank };
                prop_assert_eq!(share.len() as u64, want);
                total += want;
                for i in share {
                    seen[i as usize] += 1;
                }
            }
            // Disjoint ranks: nothing seen twice; union covers all when nothing is dropped.
            prop_assert!(seen.iter().all(|&c| c <= 1));
            let covered = seen.iter().filter(|&&c| c == 1).count() as u64;
            prop_assert_eq!(covered, total);
            if !drop_last || per_rank % batch == 0 {
                prop_assert_eq!(covered, len);
            }
        }

        #[test]
        fn padding_and_drop_last_counts(
            len in 1u64..300, world in 1u64..9, batch in 1u64..17,
            seed in any::<u64>(), drop_last in any::<bool>(),
        ) {
            let mut counts = vec![0u32; len as usize];
            let mut total = 0u64;
            for r in 0..world {
                let Ok(mut s) = Sampler::new(len, seed, r, world, batch, drop_last) else {
                    prop_assert!(drop_last && len / world < batch);
                    return Ok(());
                };
                let per_rank = if drop_last { len / world } else { len.div_ceil(world) };
                prop_assert_eq!(s.samples_per_rank(), per_rank);
                let steps = if drop_last { per_rank / batch } else { per_rank.div_ceil(batch) };
                prop_assert_eq!(s.steps_per_epoch(), steps);
                for step in 0..steps {
                    let b = s.batch_indices(0, step);
                    prop_assert_eq!(b.len() as u64, s.batch_len(step));
                    if step + 1 < steps || drop_last {
                        prop_assert_eq!(b.len() as u64, batch);
                    }
                    total += b.len() as u64;
                    for i in b {
                        prop_assert!(i < len);
                        counts[i as usize] += 1;
                    }
                }
            }
            if drop_last {
                // Truncation: nothing twice.
                prop_assert!(counts.iter().all(|&c| c <= 1));
            } else {
                // Padding: every sample at least once, the padding wraps from the start.
                let padded = len.div_ceil(world) * world;
                prop_assert_eq!(total, padded);
                prop_assert!(counts.iter().all(|&c| c >= 1));
                let extra: u64 = counts.iter().map(|&c| u64::from(c) - 1).sum();
                prop_assert_eq!(extra, padded - len);
            }
        }

        #[test]
        fn same_inputs_same_output_and_resumable(
            len in 1u64..500, world in 1u64..5, batch in 1u64..33, seed in any::<u64>(),
            epoch in 0u64..50,
        ) {
            let rank = seed % world;
            let mut a = Sampler::new(len, seed, rank, world, batch, false).unwrap();
            let full = epoch_of(&mut a, epoch);
            // A fresh sampler resumed at the last step, after another epoch was cached.
            let mut b = Sampler::new(len, seed, rank, world, batch, false).unwrap();
            let _ = b.batch_indices(epoch + 1, 0);
            let last = b.steps_per_epoch() - 1;
            let tail = b.batch_indices(epoch, last);
            prop_assert_eq!(&full[(last * batch) as usize..], &tail[..]);
            prop_assert_eq!(epoch_of(&mut b, epoch), full);
        }

        #[test]
        fn different_epochs_give_different_permutations(
            len in 20u64..2000, seed in any::<u64>(), epoch in 0u64..1000,
        ) {
            let (mut a, mut b) = (Vec::new(), Vec::new());
            permutation_into(len, seed, epoch, &mut a);
            permutation_into(len, seed, epoch + 1, &mut b);
            prop_assert_ne!(&a, &b);
            a.sort_unstable();
            prop_assert_eq!(a, (0..len).collect::<Vec<_>>());
        }
    }
}
