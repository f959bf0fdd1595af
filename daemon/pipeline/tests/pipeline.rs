//! The in-process pipeline over real JPEG files generated here: order, determinism across
//! thread counts, exact pixels, bad samples, backpressure, partial batches, resume.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use stoker_kernels::reference::RgbImage;
use stoker_pipeline::engine::{
    BadSamplePolicy, Engine, EngineConfig, Feed, FeedEvent, HeapRing, Job, Position,
};
use stoker_pipeline::source::index::{Dataset, OpenOptions};
use stoker_pipeline::transform::augment::{sample_params, Augmenter};
use stoker_pipeline::transform::decode::{probe, CpuDecoder, Limits};
use stoker_tool::synth::{generate, SynthOptions};
use stoker_wire::ring::{SampleStatus, SlotLayout};
use stoker_wire::spec::{Crop, DType, Layout, PipelineSpec};

/// One received batch, copied out of its slot.
#[derive(Debug, Clone, PartialEq)]
struct Got {
    epoch: u64,
    step: u64,
    n: usize,
    images: Vec<u8>,
    labels: Vec<i64>,
    indices: Vec<u64>,
    status: Vec<u8>,
}

fn dataset(dir: &Path, images: usize) -> Arc<Dataset> {
    let opts = SynthOptions {
        images,
        classes: 3,
        size_scale: 0.3,
        threads: 2,
        ..SynthOptions::default()
    };
    generate(dir, &opts).unwrap();
    open(dir)
}

fn open(dir: &Path) -> Arc<Dataset> {
    let opts = OpenOptions {
        use_cache: false,
        ..OpenOptions::default()
    };
    Arc::new(Dataset::open(dir, &opts).unwrap())
}

fn spec(batch: u32, epochs: u32) -> PipelineSpec {
    PipelineSpec {
        epochs: Some(epochs),
        ..PipelineSpec::train(batch, 24)
    }
}

fn engine(threads: usize, policy: BadSamplePolicy) -> Arc<Engine> {
    Engine::new(EngineConfig {
        threads,
        policy,
        ..EngineConfig::default()
    })
    .unwrap()
}

fn copy_out(ring: &HeapRing, spec: &PipelineSpec, ready: stoker_pipeline::engine::Ready) -> Got {
    let l = SlotLayout::new(spec);
    let images = ring.images_of(ready.slot);
    let slot = ring.host_of(ready.slot);
    let b = l.batch_size;
    let words = |off: usize| -> Vec<[u8; 8]> {
        (0..b)
            .map(|i| slot[off + i * 8..off + i * 8 + 8].try_into().unwrap())
            .collect()
    };
    Got {
        epoch: ready.epoch,
        step: ready.step,
        n: ready.n,
        images: images[l.images..l.images + b * l.image_bytes].to_vec(),
        labels: words(l.labels)
            .into_iter()
            .map(i64::from_ne_bytes)
            .collect(),
        indices: words(l.indices)
            .into_iter()
            .map(u64::from_ne_bytes)
            .collect(),
        status: slot[l.status..l.status + b].to_vec(),
    }
}

/// Runs a feed to its end, releasing each batch after copying it out.
fn drain(feed: &Feed, ring: &HeapRing, spec: &PipelineSpec) -> Vec<Got> {
    let mut out = Vec::new();
    loop {
        match feed.recv().unwrap() {
            FeedEvent::Ready(r) => {
                out.push(copy_out(ring, spec, r));
                feed.release(r.slot, r.generation).unwrap();
            }
            FeedEvent::EndOfData => return out,
        }
    }
}

fn run(
    ds: &Arc<Dataset>,
    spec: &PipelineSpec,
    threads: usize,
    start: Position,
    policy: BadSamplePolicy,
) -> Vec<Got> {
    let engine = engine(threads, policy);
    let job = Job::new(ds.clone(), spec.clone(), 7, 1).unwrap();
    let ring = Arc::new(HeapRing::new(spec, 3));
    let feed = engine.start_feed(job, 0, ring.clone(), start).unwrap();
    drain(&feed, &ring, spec)
}

#[test]
fn batches_come_in_order_and_cover_each_epoch_once() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 21);
    let spec = spec(4, 2);
    let got = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Skip);
    // 21 samples, batch 4, drop_last false: 6 steps per epoch, the last with 1 sample.
    let positions: Vec<(u64, u64, usize)> = got.iter().map(|g| (g.epoch, g.step, g.n)).collect();
    let mut want = Vec::new();
    for e in 0..2 {
        for s in 0..6 {
            want.push((e, s, if s == 5 { 1 } else { 4 }));
        }
    }
    assert_eq!(positions, want);
    for epoch in 0..2 {
        let mut seen: Vec<u64> = got
            .iter()
            .filter(|g| g.epoch == epoch)
            .flat_map(|g| g.indices[..g.n].to_vec())
            .collect();
        seen.sort_unstable();
        assert_eq!(seen, (0..21).collect::<Vec<u64>>(), "epoch {epoch}");
    }
    let last = &got[5];
    assert_eq!(last.status[0], SampleStatus::Ok as u8);
    assert!(last.status[1..]
        .iter()
        .all(|&s| s == SampleStatus::Empty as u8));
    for g in &got {
        for i in 0..g.n {
            assert_eq!(g.labels[i], ds.sample(g.indices[i] as usize).label);
            assert!(
                g.images[i * spec.image_bytes()..(i + 1) * spec.image_bytes()]
                    .iter()
                    .any(|&b| b != 0)
            );
        }
    }
    // Epochs are shuffled differently.
    assert_ne!(got[0].indices, got[6].indices);
}

#[test]
fn output_is_bit_identical_with_1_2_and_8_threads() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 18);
    let spec = spec(5, 1);
    let one = run(&ds, &spec, 1, Position::default(), BadSamplePolicy::Skip);
    let two = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Skip);
    let eight = run(&ds, &spec, 8, Position::default(), BadSamplePolicy::Skip);
    assert_eq!(one.len(), 4);
    assert!(one == two, "1 vs 2 threads differ");
    assert!(one == eight, "1 vs 8 threads differ");
}

#[test]
fn pixels_equal_decode_then_augment_of_the_same_sample() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 6);
    for (crop, dtype, layout) in [
        (Crop::random_resized(24), DType::F32, Layout::Nchw),
        (Crop::center(24), DType::U8, Layout::Nhwc),
        (Crop::random_resized(24), DType::Bf16, Layout::Nhwc),
    ] {
        let spec = PipelineSpec {
            crop,
            dtype,
            layout,
            ..spec(3, 1)
        };
        let got = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Skip);
        let mut decoder = CpuDecoder::new(Limits::default()).unwrap();
        let mut augmenter = Augmenter::new();
        let mut img = RgbImage::default();
        for g in &got {
            for i in 0..g.n {
                let index = g.indices[i];
                let bytes = std::fs::read(ds.sample(index as usize).path).unwrap();
                let h = probe(&bytes).unwrap();
                let (crop, flip) = sample_params(&spec, h.width, h.height, 7, g.epoch, index);
                let within = decoder
                    .decode_for_crop(&bytes, crop, spec.crop.output_size(), &mut img)
                    .unwrap();
                let mut want = vec![0u8; spec.image_bytes()];
                augmenter.augment_into(&img, within, flip, &spec, &mut want);
                let have = &g.images[i * spec.image_bytes()..(i + 1) * spec.image_bytes()];
                assert!(have == want.as_slice(), "sample {index} ({crop:?}) differs");
            }
        }
    }
}

#[test]
fn resuming_at_a_step_gives_the_same_batches_as_an_uninterrupted_run() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 16);
    let spec = spec(4, 2);
    let all = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Skip);
    let start = Position { epoch: 1, step: 2 };
    let resumed = run(&ds, &spec, 2, start, BadSamplePolicy::Skip);
    let tail: Vec<Got> = all
        .into_iter()
        .filter(|g| (g.epoch, g.step) >= (1, 2))
        .collect();
    assert_eq!(resumed.len(), 2);
    assert!(resumed == tail);
    // A step past the epoch's end is refused with a reason.
    let engine = engine(1, BadSamplePolicy::Skip);
    let job = Job::new(ds.clone(), spec.clone(), 7, 1).unwrap();
    let ring = Arc::new(HeapRing::new(&spec, 2));
    let err = engine
        .start_feed(job, 0, ring, Position { epoch: 0, step: 99 })
        .expect_err("step 99 of 4 refused")
        .to_string();
    assert!(err.contains("step 99"), "{err}");
}

#[test]
fn a_full_ring_stops_the_producer_until_a_slot_is_released() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 20);
    let spec = spec(2, 1);
    let engine = engine(2, BadSamplePolicy::Skip);
    let job = Job::new(ds.clone(), spec.clone(), 7, 1).unwrap();
    let ring = Arc::new(HeapRing::new(&spec, 2));
    let feed = engine
        .start_feed(job, 0, ring, Position::default())
        .unwrap();
    let mut held = Vec::new();
    for _ in 0..2 {
        match feed.recv_timeout(Duration::from_secs(30)).unwrap() {
            Some(FeedEvent::Ready(r)) => held.push(r),
            other => panic!("expected a batch, got {other:?}"),
        }
    }
    assert_eq!(feed.leased(), 2);
    assert_eq!(feed.recv_timeout(Duration::from_millis(300)).unwrap(), None);
    assert_eq!(
        engine.stats().images,
        4,
        "nothing produced past the full ring"
    );
    // Releasing a slot twice, or a stale generation, is refused.
    feed.release(held[0].slot, held[0].generation).unwrap();
    assert!(feed.release(held[0].slot, held[0].generation).is_err());
    match feed.recv_timeout(Duration::from_secs(30)).unwrap() {
        Some(FeedEvent::Ready(r)) => assert_eq!((r.epoch, r.step), (0, 2)),
        other => panic!("expected step 2, got {other:?}"),
    }
}

#[test]
fn bad_samples_are_replaced_or_reported_and_lose_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let ds_dir = dir.path().join("ds");
    let _ = dataset(&ds_dir, 9);
    std::fs::write(
        ds_dir.join("class_0000/zz_corrupt.jpg"),
        b"\xff\xd8\xff\xe0garbage",
    )
    .unwrap();
    std::fs::write(
        ds_dir.join("class_0001/zz_png.jpg"),
        b"\x89PNG\r\n\x1a\n....",
    )
    .unwrap();
    let ds = open(&ds_dir);
    assert_eq!(ds.len(), 11);
    let bad: Vec<u64> = (0..ds.len() as u64)
        .filter(|&i| ds.display_name(i as usize).contains("zz_"))
        .collect();
    assert_eq!(bad.len(), 2);
    let spec = spec(4, 1);

    let skip = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Skip);
    let statuses: Vec<u8> = skip.iter().flat_map(|g| g.status[..g.n].to_vec()).collect();
    assert_eq!(
        statuses
            .iter()
            .filter(|&&s| s == SampleStatus::Replaced as u8)
            .count(),
        2
    );
    assert_eq!(
        statuses
            .iter()
            .filter(|&&s| s == SampleStatus::Ok as u8)
            .count(),
        9
    );
    for g in &skip {
        for i in 0..g.n {
            assert!(!bad.contains(&g.indices[i]), "a bad sample was delivered");
        }
    }
    let again = run(&ds, &spec, 1, Position::default(), BadSamplePolicy::Skip);
    assert!(skip == again, "replacements are deterministic");

    let fail = run(&ds, &spec, 2, Position::default(), BadSamplePolicy::Fail);
    let mut failed = Vec::new();
    for g in &fail {
        for i in 0..g.n {
            if g.status[i] == SampleStatus::Failed as u8 {
                failed.push(g.indices[i]);
                let img = &g.images[i * spec.image_bytes()..(i + 1) * spec.image_bytes()];
                assert!(img.iter().all(|&b| b == 0));
            }
        }
    }
    failed.sort_unstable();
    assert_eq!(failed, bad);
}

#[test]
fn two_feeds_of_different_jobs_both_progress() {
    let dir = tempfile::tempdir().unwrap();
    let ds = dataset(dir.path(), 12);
    let spec = spec(3, 1);
    let engine = engine(2, BadSamplePolicy::Skip);
    let a = Job::new(ds.clone(), spec.clone(), 1, 1).unwrap();
    let b = Job::new(ds.clone(), spec.clone(), 2, 1).unwrap();
    let ring_a = Arc::new(HeapRing::new(&spec, 2));
    let ring_b = Arc::new(HeapRing::new(&spec, 2));
    let fa = engine
        .start_feed(a, 0, ring_a.clone(), Position::default())
        .unwrap();
    let fb = engine
        .start_feed(b, 0, ring_b.clone(), Position::default())
        .unwrap();
    let (ga, gb) = std::thread::scope(|s| {
        let ha = s.spawn(|| drain(&fa, &ring_a, &spec));
        let hb = s.spawn(|| drain(&fb, &ring_b, &spec));
        (ha.join().unwrap(), hb.join().unwrap())
    });
    assert_eq!(ga.len(), 4);
    assert_eq!(gb.len(), 4);
    assert_ne!(
        ga[0].indices, gb[0].indices,
        "different seeds, different order"
    );
}
