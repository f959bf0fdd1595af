//! torchvision's per-sample operations served by a real daemon to this process's Rust client
//! (issue 39): a view's operations and its RandomErasing give the same bytes whatever the
//! daemon's thread count; RandomInvert is exactly 255 minus the pixels the same job serves
//! without it (the operations run on the crop's own 8-bit pixels); RandomErasing writes its
//! value into one box of each image and nothing else; extra views carry their own operations.

// Test code: its casts are of small counts chosen by the test.
#![allow(clippy::cast_possible_truncation)]

use std::path::Path;

use stoker::spec::{Crop, DType, Erasing, ErasingValue, Interpolation, Op, RandomWord, View};
use stoker::{Client, PipelineSpec};
use stoker_testkit::attach::{rank_options, u8_spec};
use stoker_testkit::{write_image_folder, Daemon};

const SEED: u64 = 39;
const BATCH: u32 = 4;
const SIDE: u32 = 24;

/// Every batch of one epoch: (indices, each view's bytes).
fn serve(threads: &str, data: &Path, spec: PipelineSpec) -> Vec<(Vec<u64>, Vec<Vec<u8>>)> {
    let dir = tempfile::tempdir().unwrap();
    let daemon = Daemon::start(dir.path(), &["--threads", threads]);
    let o = rank_options(data.to_str().unwrap(), "recipe", (0, 1), SEED, spec);
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        assert!(b.status().iter().all(|&s| s == 0), "a sample was not ok");
        let views = (0..b.views()).map(|v| b.view_images(v).to_vec()).collect();
        out.push((b.indices().to_vec(), views));
    }
    out
}

fn recipe() -> Vec<Op> {
    vec![
        Op::ColorJitter {
            brightness: Some([0.6, 1.4]),
            contrast: Some([0.6, 1.4]),
            saturation: Some([0.6, 1.4]),
            hue: Some([-0.1, 0.1]),
        },
        Op::TrivialAugmentWide {
            num_magnitude_bins: 31,
            interpolation: Interpolation::Nearest,
            fill: [0.0; 3],
        },
        Op::RandomApply {
            ops: vec![Op::GaussianBlur {
                kernel_size: [5, 5],
                sigma: [0.1, 2.0],
            }],
            p: 0.5,
        },
        Op::RandomGrayscale { p: 0.2 },
    ]
}

#[test]
fn operations_and_erasing_serve_the_same_bytes_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 6, SIDE + 8);
    let mut local = View::new(Crop::random_resized(16), 0.5);
    local.ops = vec![Op::RandomSolarize {
        threshold: 128.0,
        p: 0.5,
    }];
    local.erasing = Some(Erasing {
        p: 1.0,
        scale: [0.02, 0.33],
        ratio: [0.3, 3.3],
        value: ErasingValue::Fill([0.0; 3]),
    });
    let spec = PipelineSpec {
        ops: recipe(),
        erasing: Some(Erasing {
            p: 0.5,
            scale: [0.02, 0.33],
            ratio: [0.3, 3.3],
            value: ErasingValue::Random(RandomWord::Random),
        }),
        extra_views: vec![local],
        epochs: Some(1),
        shuffle: false,
        ..PipelineSpec::train(BATCH, SIDE)
    };
    let one = serve("1", &data, spec.clone());
    let two = serve("2", &data, spec.clone());
    assert_eq!(one.len(), 3);
    assert!(one == two, "the bytes depend on the thread count");
    let plain = serve(
        "2",
        &data,
        PipelineSpec {
            ops: Vec::new(),
            erasing: None,
            extra_views: vec![View::new(Crop::random_resized(16), 0.5)],
            ..spec
        },
    );
    let image = (SIDE * SIDE * 3 * 4) as usize;
    let changed = one
        .iter()
        .zip(&plain)
        .flat_map(|(a, b)| a.1[0].chunks(image).zip(b.1[0].chunks(image)))
        .filter(|(a, b)| a != b)
        .count();
    assert!(
        changed >= 10,
        "only {changed} of 12 images changed by the operations"
    );
}

#[test]
fn invert_is_255_minus_the_crop_and_erasing_zeroes_one_box() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 4, SIDE + 8);
    let base = PipelineSpec {
        shuffle: false,
        ..u8_spec(BATCH, SIDE, Some(1))
    };
    let plain = serve("2", &data, base.clone());
    let inverted = serve(
        "2",
        &data,
        PipelineSpec {
            ops: vec![Op::RandomInvert { p: 1.0 }],
            ..base.clone()
        },
    );
    for (a, b) in plain.iter().zip(&inverted) {
        assert_eq!(a.0, b.0);
        let flipped: Vec<u8> = a.1[0].iter().map(|v| 255 - v).collect();
        assert!(flipped == b.1[0], "batch of {:?}", a.0);
    }
    // Erasing with value 0 on u8 output: each image differs from the plain one only inside
    // one box, where it is 0 in every channel.
    let erased = serve(
        "2",
        &data,
        PipelineSpec {
            erasing: Some(Erasing {
                p: 1.0,
                scale: [0.1, 0.2],
                ratio: [0.5, 2.0],
                value: ErasingValue::Fill([0.0; 3]),
            }),
            ..base
        },
    );
    let side = SIDE as usize;
    let plane = side * side;
    for (a, b) in plain.iter().zip(&erased) {
        for (pa, pb) in a.1[0].chunks(plane * 3).zip(b.1[0].chunks(plane * 3)) {
            // The box: rows and columns of the pixels that are zero in all three planes.
            let zero = |p: usize| (0..3).all(|c| pb[c * plane + p] == 0);
            let inside: Vec<usize> = (0..plane).filter(|&p| zero(p)).collect();
            let (rows, cols): (Vec<usize>, Vec<usize>) =
                inside.iter().map(|p| (p / side, p % side)).unzip();
            let (top, bottom) = (*rows.iter().min().unwrap(), *rows.iter().max().unwrap());
            let (left, right) = (*cols.iter().min().unwrap(), *cols.iter().max().unwrap());
            let area = (bottom - top + 1) * (right - left + 1);
            assert!(
                area * 20 >= plane && area * 4 <= plane,
                "box of {area} pixels"
            );
            for p in 0..plane {
                let in_box =
                    (top..=bottom).contains(&(p / side)) && (left..=right).contains(&(p % side));
                for c in 0..3 {
                    let (x, y) = (pa[c * plane + p], pb[c * plane + p]);
                    assert!(
                        if in_box { y == 0 } else { x == y },
                        "pixel {p} channel {c}"
                    );
                }
            }
        }
    }
}

#[test]
fn a_spec_with_an_unknown_operation_is_refused_naming_it() {
    let text = r#"{"batch_size": 4, "crop": {"kind": "center_crop", "resize": 32, "size": [24, 24]},
                   "ops": [{"kind": "elastic_transform", "alpha": 50}]}"#;
    let err = serde_json::from_str::<PipelineSpec>(text)
        .unwrap_err()
        .to_string();
    assert!(err.contains("elastic_transform"), "{err}");
    let bad = PipelineSpec {
        ops: vec![Op::RandomPosterize { bits: 9, p: 0.5 }],
        dtype: DType::U8,
        ..PipelineSpec::train(BATCH, SIDE)
    };
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 1, 2, SIDE);
    let daemon = Daemon::start(dir.path(), &["--threads", "1"]);
    let o = rank_options(data.to_str().unwrap(), "bad", (0, 1), SEED, bad);
    let err = Client::attach(daemon.socket(), o).unwrap_err().to_string();
    assert!(err.contains("ops[0] (RandomPosterize): bits"), "{err}");
}
