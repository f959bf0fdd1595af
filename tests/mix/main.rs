//! Batch mixes (issue 39: torchvision's MixUp and CutMix) served by a real daemon to this
//! process's Rust client: the soft labels' rows sum to 1 and are the mix of the one-hot
//! labels; the images are the mix of what the same job without the mix serves (same seed),
//! by the lam the soft labels carry, bit for bit in torch's arithmetic; a short last batch
//! rolls over its own samples only; two daemons of different thread counts serve the same
//! bytes; a dataset whose labels do not fit `num_classes` is refused by name; the C client
//! (`tests/c/mix.c`) reads the same soft labels as a DLPack tensor.

// Test code: its casts are of small counts and labels (0..3) chosen by the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]

use std::path::Path;
use std::process::Command;

use stoker::spec::BatchMix;
use stoker::{Client, PipelineSpec};
use stoker_pipeline::transform::mix::{draw, MixKind};
use stoker_testkit::attach::rank_options;
use stoker_testkit::daemon::build_c_client;
use stoker_testkit::images::write_image_folder;
use stoker_testkit::Daemon;

const SEED: u64 = 23;
const BATCH: u32 = 4;
const SIDE: u32 = 16;
const CLASSES: u32 = 3;

/// One served batch: step, labels, soft labels, view 0's images as f32.
#[derive(Debug, PartialEq)]
struct Served {
    step: u64,
    labels: Vec<i64>,
    soft: Option<Vec<f32>>,
    images: Vec<f32>,
}

fn spec(mix: Option<BatchMix>) -> PipelineSpec {
    PipelineSpec {
        epochs: Some(1),
        batch_mix: mix,
        ..PipelineSpec::train(BATCH, SIDE)
    }
}

fn drain(daemon: &Daemon, data: &Path, job: &str, spec: PipelineSpec) -> Vec<Served> {
    let o = rank_options(data.to_str().unwrap(), job, (0, 1), SEED, spec);
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        assert!(b.status().iter().all(|&s| s == 0), "a sample was not ok");
        out.push(Served {
            step: b.step(),
            labels: b.labels().to_vec(),
            soft: b.soft_labels().map(<[f32]>::to_vec),
            images: b
                .images()
                .chunks_exact(4)
                .map(|c| f32::from_ne_bytes(c.try_into().unwrap()))
                .collect(),
        });
    }
    out
}

/// torch's `x.roll(1, 0).mul_(1 - lam).add_(x.mul(lam))` over f32 images, written here
/// independently of the daemon's code; `cut` pastes a box instead.
fn expected_images(plain: &[f32], n: usize, lam: f64, cut: Option<[usize; 4]>) -> Vec<f32> {
    let per = plain.len() / n;
    let (own, other) = (lam as f32, (1.0 - lam) as f32);
    let side = SIDE as usize;
    let mut out = Vec::with_capacity(plain.len());
    for i in 0..n {
        let prev = (i + n - 1) % n;
        for e in 0..per {
            let (x, r) = (plain[i * per + e], plain[prev * per + e]);
            out.push(match cut {
                None => r * other + x * own,
                Some([x1, y1, x2, y2]) => {
                    // NCHW: e = (c * H + y) * W + x.
                    let (y, xx) = ((e / side) % side, e % side);
                    if (x1..x2).contains(&xx) && (y1..y2).contains(&y) {
                        r
                    } else {
                        x
                    }
                }
            });
        }
    }
    out
}

/// Checks one mixed run against the plain one, batch by batch; returns the mixes drawn.
fn check(mix: &BatchMix, plain: &[Served], mixed: &[Served]) -> Vec<MixKind> {
    assert_eq!(plain.len(), mixed.len());
    let mut kinds = Vec::new();
    for (p, m) in plain.iter().zip(mixed) {
        let n = p.labels.len();
        assert_eq!((p.step, &p.labels), (m.step, &m.labels));
        let soft = m.soft.as_ref().expect("soft labels");
        assert_eq!(soft.len(), n * CLASSES as usize);
        let d = draw(mix, SEED, 0, m.step, SIDE, SIDE);
        kinds.push(d.kind);
        let (own, other) = (d.label_lam as f32, (1.0 - d.label_lam) as f32);
        for i in 0..n {
            let row = &soft[i * 3..(i + 1) * 3];
            let sum: f32 = row.iter().sum();
            assert!(
                (sum - 1.0).abs() < 1e-6,
                "step {} row {i} sums to {sum}",
                m.step
            );
            let mut want = [0f32; 3];
            want[m.labels[(i + n - 1) % n] as usize] = other;
            want[m.labels[i] as usize] += own;
            assert_eq!(row, want, "step {} row {i}", m.step);
        }
        let cut = d.cut.map(|c| [c.x1, c.y1, c.x2, c.y2]);
        let want = expected_images(&p.images, n, d.label_lam, cut);
        assert!(want == m.images, "step {}: images are not the mix", m.step);
        if d.kind == MixKind::MixUp && d.lam < 0.999 {
            assert_ne!(m.images, p.images, "step {}", m.step);
        }
    }
    kinds
}

/// MixUp and CutMix (a choice of both) against the unmixed job, then the same bytes from a
/// daemon of another thread count; the last batch (3 of 15 samples) is short.
#[test]
fn mixed_batches_are_the_mix_of_the_plain_ones_whatever_the_threads() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let images = write_image_folder(&data, CLASSES, 5, SIDE);
    assert_eq!(images, 15);
    let two = Daemon::start(&dir.path().join("two"), &["--threads", "2"]);
    let plain = drain(&two, &data, "plain", spec(None));
    assert!(plain.iter().all(|b| b.soft.is_none()));
    assert_eq!(plain.last().unwrap().labels.len(), 3, "a short last batch");

    let mixup = BatchMix::MixUp {
        alpha: 0.4,
        num_classes: CLASSES,
    };
    let mixed = drain(&two, &data, "mixup", spec(Some(mixup.clone())));
    let kinds = check(&mixup, &plain, &mixed);
    assert!(kinds.iter().all(|&k| k == MixKind::MixUp));

    let choice = BatchMix::Choice {
        mixes: vec![
            mixup,
            BatchMix::CutMix {
                alpha: 1.0,
                num_classes: CLASSES,
            },
        ],
        p: Some(vec![0.5, 0.5]),
    };
    let chosen = drain(&two, &data, "choice", spec(Some(choice.clone())));
    check(&choice, &plain, &chosen);
    let cuts = (0..200)
        .filter(|&b| draw(&choice, SEED, 0, b, SIDE, SIDE).kind == MixKind::CutMix)
        .count();
    assert!((70..130).contains(&cuts), "{cuts} CutMix of 200");

    drop(two);
    let one = Daemon::start(&dir.path().join("one"), &["--threads", "1"]);
    assert!(drain(&one, &data, "choice", spec(Some(choice))) == chosen);
}

/// CutMix alone, for every batch: the pasted box of each is the draw's.
#[test]
fn cutmix_pastes_the_drawn_box() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, CLASSES, 4, SIDE);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let plain = drain(&daemon, &data, "plain", spec(None));
    let cutmix = BatchMix::CutMix {
        alpha: 1.0,
        num_classes: CLASSES,
    };
    let mixed = drain(&daemon, &data, "cutmix", spec(Some(cutmix.clone())));
    let kinds = check(&cutmix, &plain, &mixed);
    assert!(kinds.iter().all(|&k| k == MixKind::CutMix));
}

/// Labels 0..3 cannot be spread over 2 classes: the attach is refused, naming a sample and
/// its label.
#[test]
fn labels_past_num_classes_are_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, CLASSES, 2, SIDE);
    let daemon = Daemon::start(dir.path(), &[]);
    let mix = BatchMix::MixUp {
        alpha: 1.0,
        num_classes: 2,
    };
    let o = rank_options(
        data.to_str().unwrap(),
        "narrow",
        (0, 1),
        SEED,
        spec(Some(mix)),
    );
    let e = Client::attach(daemon.socket(), o).unwrap_err().to_string();
    assert!(
        e.contains("batch_mix spreads labels over 2 classes") && e.contains("has label 2"),
        "{e}"
    );
}

/// FNV-1a of `bytes`, as `tests/c/mix.c` hashes the soft labels.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The C client's lines for `spec` (see `tests/c/mix.c`).
fn c_lines(exe: &Path, daemon: &Daemon, data: &Path, spec: &PipelineSpec) -> Vec<String> {
    let out = Command::new(exe)
        .arg(daemon.socket())
        .arg(data)
        .arg(serde_json::to_string(spec).unwrap())
        .arg(SEED.to_string())
        .env("STOKER_CONNECT_TIMEOUT", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "C client failed: {stderr}");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect()
}

/// The C client reads the soft labels through `stoker_batch_soft_labels` and the header with
/// the Rust client's shape and bytes; without a mix it has none (an argument error).
#[test]
fn the_c_client_reads_the_same_soft_labels_as_the_rust_client() {
    const TEST: &str = "the_c_client_reads_the_same_soft_labels_as_the_rust_client";
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_c_client(dir.path(), "mix.c", TEST) else {
        return;
    };
    let data = dir.path().join("data");
    write_image_folder(&data, CLASSES, 4, SIDE);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let mixed = spec(Some(BatchMix::CutMix {
        alpha: 1.0,
        num_classes: CLASSES,
    }));
    let rust = drain(&daemon, &data, "rust-mix", mixed.clone());
    let expected: Vec<String> = rust
        .iter()
        .map(|b| {
            let soft = b.soft.as_ref().unwrap();
            let bytes: Vec<u8> = soft.iter().flat_map(|f| f.to_ne_bytes()).collect();
            let n = b.labels.len();
            format!("soft 0 {} {n} {CLASSES} {:016x}", b.step, fnv1a(&bytes))
        })
        .collect();
    assert_eq!(expected.len(), 3);
    assert_eq!(c_lines(&exe, &daemon, &data, &mixed), expected);
    let plain = c_lines(&exe, &daemon, &data, &spec(None));
    assert_eq!(plain, ["nosoft 0 0 4", "nosoft 0 1 4", "nosoft 0 2 4"]);
}
