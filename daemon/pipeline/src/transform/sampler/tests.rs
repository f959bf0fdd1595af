#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use super::*;
use proptest::prelude::*;
use stoker_wire::protocol::Position;

#[test]
fn the_rest_of_an_epoch_is_the_rank_s_next_batches() {
    let mut s = Sampler::new(103, 7, 1, 4, 5, false).unwrap();
    let all = epoch_of(&mut s.clone(), 2);
    let mut rest = Vec::new();
    s.rest_of_epoch_into(2, 0, &mut rest);
    assert_eq!(rest, all);
    s.rest_of_epoch_into(2, 3, &mut rest);
    assert_eq!(rest, all[15..]);
}

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
        s.check_position(0, 3).unwrap_err(),
        SamplerError::StepOutOfRange {
            epoch: 0,
            step: 3,
            steps: 3
        }
    );
}

/// Every batch of `epoch` for every rank of a world of `world` ranks, by rank.
fn world_epoch(
    len: u64,
    world: u64,
    batch: u64,
    drop_last: bool,
    offset: Option<EpochOffset>,
    epoch: u64,
) -> Vec<Vec<Vec<u64>>> {
    (0..world)
        .map(|r| {
            let mut s = Sampler::new(len, 7, r, world, batch, drop_last).unwrap();
            if let Some(o) = offset {
                s = s.with_offset(o).unwrap();
            }
            (0..s.steps_in(epoch))
                .map(|step| s.batch_indices(epoch, step))
                .collect()
        })
        .collect()
}

#[test]
fn an_offset_at_the_end_of_the_epoch_leaves_nothing_and_past_it_is_refused() {
    let s = Sampler::new(10, 0, 0, 2, 2, false).unwrap();
    let end = EpochOffset {
        epoch: 4,
        consumed: 10,
    };
    let s = s.with_offset(end).unwrap();
    assert_eq!(s.steps_in(4), 0);
    assert_eq!(s.steps_in(5), 3);
    assert_eq!(s.resumed_epoch(), Some(ResumedEpoch { epoch: 4, steps: 0 }));
    let past = EpochOffset {
        epoch: 4,
        consumed: 11,
    };
    assert_eq!(
        s.with_offset(past).unwrap_err(),
        SamplerError::OffsetBeyondEpoch {
            epoch: 4,
            consumed: 11,
            len: 10
        }
    );
    // drop_last: 3 left over 2 ranks in batches of 2 is no batch at all.
    let s = Sampler::new(10, 0, 1, 2, 2, true).unwrap();
    let s = s
        .with_offset(EpochOffset {
            epoch: 0,
            consumed: 7,
        })
        .unwrap();
    assert_eq!(s.steps_in(0), 0);
    // An offset of 0 is no offset.
    let s = Sampler::new(10, 0, 1, 2, 2, true).unwrap();
    let s = s.with_offset(EpochOffset::default()).unwrap();
    assert_eq!(s.resumed_epoch(), None);
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn an_offset_at_the_same_world_size_is_the_rest_of_the_uninterrupted_epoch(
        len in 1u64..400, world in 1u64..9, batch in 1u64..17, drop_last in any::<bool>(),
        epoch in 0u64..100, at in any::<u64>(),
    ) {
        let Ok(s) = Sampler::new(len, 7, 0, world, batch, drop_last) else {
            return Ok(());
        };
        let steps = s.steps_per_epoch();
        let step = at % steps;
        let offset = Position::at(epoch, step).consumed(None, world as u32, batch as u32);
        let full = world_epoch(len, world, batch, drop_last, None, epoch);
        let rest = world_epoch(len, world, batch, drop_last, Some(offset), epoch);
        for r in 0..world as usize {
            prop_assert_eq!(&full[r][step as usize..], &rest[r][..]);
        }
    }

    #[test]
    fn the_rest_of_an_epoch_is_served_once_at_another_world_size(
        len in 1u64..400, world in 1u64..9, batch in 1u64..17, drop_last in any::<bool>(),
        new_world in 1u64..13, new_batch in 1u64..17, epoch in 0u64..100, at in any::<u64>(),
    ) {
        let Ok(s) = Sampler::new(len, 7, 0, world, batch, drop_last) else {
            return Ok(());
        };
        let step = at % s.steps_per_epoch();
        let offset = Position::at(epoch, step).consumed(None, world as u32, batch as u32);
        let mut perm = Vec::new();
        permutation_into(len, 7, epoch, &mut perm);
        // Before the checkpoint: exactly the first `consumed` positions, once each.
        let before: Vec<u64> = world_epoch(len, world, batch, drop_last, None, epoch)
            .iter()
            .flat_map(|rank| rank[..step as usize].iter().flatten().copied())
            .collect();
        let mut sorted_before = before.clone();
        sorted_before.sort_unstable();
        let mut want_before = perm[..offset.consumed as usize].to_vec();
        want_before.sort_unstable();
        prop_assert_eq!(sorted_before, want_before);
        // After: the rest over the new world, equal batch counts and batch sizes per step.
        if Sampler::new(len, 7, 0, new_world, new_batch, drop_last).is_err() {
            return Ok(()); // drop_last leaves the new world no batch in any epoch
        }
        let after = world_epoch(len, new_world, new_batch, drop_last, Some(offset), epoch);
        let steps = after[0].len();
        for rank in &after {
            prop_assert_eq!(rank.len(), steps);
            for (k, b) in rank.iter().enumerate() {
                prop_assert_eq!(b.len(), after[0][k].len());
                if drop_last {
                    prop_assert_eq!(b.len() as u64, new_batch);
                }
            }
        }
        let mut count = vec![0u32; len as usize];
        for i in after.iter().flatten().flatten() {
            count[*i as usize] += 1;
        }
        let rest = &perm[offset.consumed as usize..];
        let served: u64 = count.iter().map(|&c| u64::from(c)).sum();
        if drop_last {
            // A prefix of the rest, once each; the tail (less than one batch per rank and
            // the remainder of the division by the world size) is dropped.
            prop_assert!(count.iter().all(|&c| c <= 1));
            prop_assert_eq!(served, steps as u64 * new_batch * new_world);
            let dropped = rest.len() as u64 - served;
            prop_assert!(dropped < new_world * new_batch + new_world);
            prop_assert!(rest[..served as usize].iter().all(|&i| count[i as usize] == 1));
        } else {
            // Every sample of the rest once, then padding wrapped to the epoch's start
            // (fewer than one sample per new rank): samples served before the checkpoint,
            // unless fewer than the padding were.
            let padding = served - rest.len() as u64;
            prop_assert!(padding < new_world);
            for (p, &i) in perm.iter().enumerate().skip(offset.consumed as usize) {
                let pads = (0..padding).filter(|q| q % len == p as u64).count() as u32;
                prop_assert_eq!(count[i as usize], 1 + pads);
            }
            if !rest.is_empty() {
                prop_assert_eq!(padding, (rest.len() as u64).div_ceil(new_world) * new_world
                    - rest.len() as u64);
            }
        }
        // The next epoch is the usual partition at the new world size.
        let next = world_epoch(len, new_world, new_batch, drop_last, Some(offset), epoch + 1);
        prop_assert_eq!(next, world_epoch(len, new_world, new_batch, drop_last, None, epoch + 1));
    }

    #[test]
    fn a_resume_of_a_resume_still_serves_the_epoch_once(
        len in 1u64..300, worlds in proptest::collection::vec(1u64..9, 3),
        batch in 1u64..9, at in proptest::collection::vec(any::<u64>(), 2),
    ) {
        let epoch = 5;
        let mut offset: Option<EpochOffset> = None;
        let mut count = vec![0u32; len as usize];
        for (phase, &world) in worlds.iter().enumerate() {
            let all = world_epoch(len, world, batch, false, offset, epoch);
            let steps = all[0].len() as u64;
            // The last phase runs to the end of the epoch; the others stop part-way.
            let stop = match at.get(phase) {
                Some(a) if steps > 0 => a % steps,
                _ => steps,
            };
            for i in all.iter().flat_map(|r| r[..stop as usize].iter().flatten()) {
                count[*i as usize] += 1;
            }
            let pos = Position::at(epoch, stop);
            offset = Some(pos.consumed(offset, world as u32, batch as u32));
        }
        prop_assert!(count.iter().all(|&c| c >= 1));
        let extra: u64 = count.iter().map(|&c| u64::from(c) - 1).sum();
        prop_assert!(extra < worlds[2]);
    }
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

#[test]
fn without_shuffle_ranks_interleave_the_dataset_order() {
    let mut r1 = Sampler::new(10, 7, 1, 2, 2, false).unwrap().shuffled(false);
    assert_eq!(r1.batch_indices(0, 0), [1, 3]);
    assert_eq!(r1.batch_indices(3, 2), [9]);
    let mut again = Sampler::new(10, 7, 1, 2, 2, false)
        .unwrap()
        .shuffled(false)
        .shuffled(true);
    let mut shuffled = Sampler::new(10, 7, 1, 2, 2, false).unwrap();
    assert_eq!(again.batch_indices(0, 0), shuffled.batch_indices(0, 0));
}
