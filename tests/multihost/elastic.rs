//! A checkpoint taken at one world size resumes at others.

use super::*;

/// A world-size-4 checkpoint taken mid-epoch resumes at world size 2 and at 8: that epoch's
/// samples are each delivered exactly once (before and after the checkpoint together), every
/// new rank gets as many batches, and the next epoch is the usual partition at the new size.
#[test]
fn a_world_4_checkpoint_resumes_at_world_2_and_8() {
    let tmp = tempfile::tempdir().unwrap();
    let (classes, per_class) = (4, 10);
    let len = u64::from(classes * per_class);
    let mut host = Host::new(tmp.path(), "host", classes, per_class);
    host.start(None);
    let socket = host.socket();

    // World 4: every rank takes 2 batches of 2, then checkpoints.
    let before: Vec<RankProcess> = (0..4)
        .map(|r| {
            let mut o = orders(tmp.path(), &socket, "w4", r, 4);
            o.epochs = 2;
            o.stop_after = Some(2);
            RankProcess::spawn(&o)
        })
        .collect();
    let before: Vec<Vec<String>> = before.into_iter().map(RankProcess::finish).collect();
    let point = EpochOffset {
        epoch: 0,
        consumed: 2 * 2 * 4,
    };
    for log in &before {
        assert_eq!(log.last().unwrap(), &format!("C 0 {}", point.consumed));
    }
    let mut first: BTreeMap<u64, u32> = BTreeMap::new();
    for i in before
        .iter()
        .flat_map(|l| delivered(l))
        .flat_map(|d| d.indices)
    {
        *first.entry(i).or_default() += 1;
    }
    assert_eq!(first.len() as u64, point.consumed);

    for world in [2u32, 8] {
        let job = format!("w{world}");
        let ranks: Vec<RankProcess> = (0..world)
            .map(|r| {
                let mut o = orders(tmp.path(), &socket, &job, r, world);
                o.epochs = 2;
                (o.start, o.offset) = point.resume();
                RankProcess::spawn(&o)
            })
            .collect();
        let got: Vec<Vec<Delivered>> = ranks.into_iter().map(|p| delivered(&p.finish())).collect();
        // Epoch 0: the rest, split evenly, each sample once; with what came before: all once.
        let rest_steps = got[0].iter().filter(|d| d.epoch == 0).count();
        let mut count = first.clone();
        for (r, rank) in got.iter().enumerate() {
            let mine: Vec<&Delivered> = rank.iter().filter(|d| d.epoch == 0).collect();
            assert_eq!(mine.len(), rest_steps, "world {world} rank {r}");
            for i in mine.iter().flat_map(|d| &d.indices) {
                *count.entry(*i).or_default() += 1;
            }
        }
        assert_eq!(count.len() as u64, len, "world {world}: samples missed");
        assert!(
            count.values().all(|&c| c == 1),
            "world {world}: samples repeated: {count:?}"
        );
        // The sampler is the oracle for which batch is which; epoch 1 is the usual partition.
        let steps = len.div_ceil(u64::from(world)).div_ceil(2);
        assert_eq!(assert_exact_partition(&got, 1, len) as u64, steps);
        for (r, rank) in got.iter().enumerate() {
            let plain = Sampler::new(len, SEED, r as u64, u64::from(world), 2, false).unwrap();
            let mut resumed = plain.clone().with_offset(point).unwrap();
            let mut plain = plain;
            for d in rank {
                let want = if d.epoch == 0 {
                    resumed.batch_indices(d.epoch, d.step)
                } else {
                    plain.batch_indices(d.epoch, d.step)
                };
                assert_eq!(d.indices, want, "world {world} rank {r} at {d:?}");
            }
        }
    }
}

/// The Rust client's view of an elastic resume: its position keeps the offset (so a reconnect
/// resumes the same job), its checkpoint counts from the epoch's start, and the resumed epoch
/// is as long as the daemon said.
#[test]
fn a_resumed_client_knows_its_epoch_length_and_checkpoints_from_the_epoch_start() {
    let tmp = tempfile::tempdir().unwrap();
    let mut host = Host::new(tmp.path(), "host", 4, 10);
    host.start(None);
    let point = EpochOffset {
        epoch: 0,
        consumed: 16,
    };
    let mut o = orders(tmp.path(), &host.socket(), "one", 0, 2);
    (o.start, o.offset) = point.resume();
    let mut client = Client::attach(&host.socket(), o.options()).unwrap();
    assert_eq!(client.attached().offset_epoch_steps, Some(6)); // 24 left: 12 per rank
    assert_eq!(client.steps_in(0), 6);
    assert_eq!(client.steps_in(1), 10);
    for _ in 0..2 {
        client.next_batch().unwrap().unwrap();
    }
    assert_eq!(client.position(), Position::at(0, 2));
    assert_eq!(client.offset(), Some(point));
    let at = EpochOffset {
        epoch: 0,
        consumed: 16 + 2 * 2 * 2,
    };
    assert_eq!(client.checkpoint(), at);
    for _ in 2..6 {
        client.next_batch().unwrap().unwrap();
    }
    assert_eq!(client.position(), Position::at(1, 0));
    assert_eq!(client.offset(), Some(point));
    assert_eq!(
        client.checkpoint(),
        EpochOffset {
            epoch: 1,
            consumed: 0
        }
    );
    let b = client.next_batch().unwrap().unwrap();
    assert_eq!((b.epoch(), b.step()), (1, 0));

    // Another rank of the job without the offset is refused, naming it.
    let plain = orders(tmp.path(), &host.socket(), "one", 1, 2);
    let err = Client::attach(&host.socket(), plain.options()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::SpecMismatch), "{err}");
    assert!(
        err.to_string()
            .contains("elastic offset (none) differs from the job's (epoch 0 after 16 samples)"),
        "{err}"
    );
    // An offset past the end of the epoch is refused, naming the numbers.
    let mut past = orders(tmp.path(), &host.socket(), "past", 0, 2);
    (past.start, past.offset) = EpochOffset {
        epoch: 0,
        consumed: 41,
    }
    .resume();
    let err = Client::attach(&host.socket(), past.options()).unwrap_err();
    assert_eq!(err.code(), Some(ErrorCode::InvalidSpec), "{err}");
    assert!(
        err.to_string().contains("41 samples consumed of epoch 0"),
        "{err}"
    );
    assert!(err.to_string().contains("only 40"), "{err}");
}
