//! Several views of one image (issue 26 item 4), served by a real daemon to this process's
//! Rust client: a 2-global + 6-local spec gives 8 tensors a batch at their own sizes; each
//! view is bit for bit what a one-view job of that view's crop and seed
//! (`stoker::spec::view_seed`) serves; the same in a second run and after a resume; a replaced
//! sample brings every one of its views (policy `fail`: all zeroed); and the
//! daemon decodes each image once (its `stoker_images_total{stage="decode"}`); the C client
//! (`tests/c/views.c`) reads the same views as DLPack tensors.

// Test code: its casts are of small counts chosen by the test.
#![allow(clippy::cast_possible_truncation)]

use std::path::Path;
use std::process::Command;

use stoker::spec::{view_seed, Crop, View};
use stoker::{Batch, Client, PipelineSpec, Position};
use stoker_testkit::attach::{rank_options, u8_spec};
use stoker_testkit::batches::write_config;
use stoker_testkit::daemon::build_c_client;
use stoker_testkit::images::write_image_folder;
use stoker_testkit::prometheus::{http_get, sample};
use stoker_testkit::Daemon;

const SEED: u64 = 11;
const BATCH: u32 = 4;
/// Images of 20..38 x 20..36 pixels: no view's box is twice its output size, so every view
/// decodes at full scale in a one-view job too, and the pixels must agree bit for bit.
const SIDE: u32 = 20;
const GLOBAL: u32 = 24;
const LOCAL: u32 = 20;

fn rrc(side: u32, scale: [f32; 2]) -> Crop {
    Crop::RandomResized {
        size: [side, side],
        scale,
        ratio: [0.75, 4.0 / 3.0],
    }
}

/// DINO's views: 2 global (scale 0.4-1) and 6 local (scale 0.05-0.4), in dataset order.
fn dino_spec() -> PipelineSpec {
    let global = View {
        crop: rrc(GLOBAL, [0.4, 1.0]),
        flip_prob: 0.5,
        ops: Vec::new(),
        erasing: None,
    };
    let local = View {
        crop: rrc(LOCAL, [0.05, 0.4]),
        flip_prob: 0.5,
        ops: Vec::new(),
        erasing: None,
    };
    let crop = global.crop;
    let mut extra_views = vec![global];
    extra_views.extend(std::iter::repeat_n(local, 6));
    PipelineSpec {
        crop,
        shuffle: false,
        extra_views,
        ..u8_spec(BATCH, GLOBAL, Some(2))
    }
}

/// Every batch as (epoch, step, indices, one byte vector per view).
type Served = Vec<(u64, u64, Vec<u64>, Vec<Vec<u8>>)>;

fn views_of(b: &Batch) -> Vec<Vec<u8>> {
    (0..b.views()).map(|v| b.view_images(v).to_vec()).collect()
}

fn drain(daemon: &Daemon, data: &Path, job: &str, spec: PipelineSpec, seed: u64) -> Served {
    drain_from(daemon, data, job, spec, seed, Position::default())
}

/// A corrupt file's place is taken by a replacement, every view of it: each view of the
/// replaced position is that view of the replacement sample where it is served in its own
/// place the same epoch (views are keyed by the sample served, not the position).
#[test]
fn a_bad_sample_is_replaced_or_zeroed_in_every_view() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 5, SIDE);
    std::fs::write(
        data.join("c0/zz_corrupt.jpg"),
        b"\xff\xd8\xff\xe0 not really",
    )
    .unwrap();
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let mut o = rank_options(
        data.to_str().unwrap(),
        "replaced",
        (0, 1),
        SEED,
        dino_spec(),
    );
    o.start = Position::default();
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    // (epoch, index) -> (status, each view's bytes of that sample).
    let mut seen: Vec<(u64, u64, u8, Vec<Vec<u8>>)> = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        for i in 0..b.n() {
            let views = (0..b.views())
                .map(|v| {
                    let len = b.view_images(v).len() / b.n();
                    b.view_images(v)[i * len..(i + 1) * len].to_vec()
                })
                .collect();
            seen.push((b.epoch(), b.indices()[i], b.status()[i], views));
        }
    }
    let replaced: Vec<_> = seen.iter().filter(|s| s.2 == 1).collect();
    assert_eq!(replaced.len(), 2, "once an epoch");
    for r in replaced {
        let own = seen
            .iter()
            .find(|s| s.2 == 0 && (s.0, s.1) == (r.0, r.1))
            .expect("the replacement is served in its own place too");
        assert_eq!(own.3.len(), 8);
        assert!(own.3 == r.3, "sample {} in epoch {}", r.1, r.0);
    }
    drop(c);
    // Policy `fail`: the bad sample is reported and every one of its views zeroed (its slot
    // held other images before), the others served.
    let fail_dir = dir.path().join("fail");
    std::fs::create_dir_all(&fail_dir).unwrap();
    let config = write_config(&fail_dir, "[pipeline]\nbad_samples = \"fail\"\n");
    let daemon = Daemon::start_configured(&fail_dir, &config, &["--threads", "2"]);
    let mut o = rank_options(data.to_str().unwrap(), "failed", (0, 1), SEED, dino_spec());
    o.start = Position::default();
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let mut failed = 0;
    while let Some(b) = c.next_batch().unwrap() {
        for i in 0..b.n() {
            for v in 0..b.views() {
                let len = b.view_images(v).len() / b.n();
                let bytes = &b.view_images(v)[i * len..(i + 1) * len];
                let zero = bytes.iter().all(|&x| x == 0);
                assert_eq!(zero, b.status()[i] == 2, "view {v} of position {i}");
            }
            failed += usize::from(b.status()[i] == 2);
        }
    }
    assert_eq!(failed, 2, "once an epoch");
}

fn drain_from(
    daemon: &Daemon,
    data: &Path,
    job: &str,
    spec: PipelineSpec,
    seed: u64,
    start: Position,
) -> Served {
    let mut o = rank_options(data.to_str().unwrap(), job, (0, 1), seed, spec);
    o.start = start;
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        assert!(b.status().iter().all(|&s| s == 0), "a sample was not ok");
        out.push((b.epoch(), b.step(), b.indices().to_vec(), views_of(&b)));
    }
    out
}

#[test]
fn eight_views_are_each_a_one_view_jobs_pixels_decoded_once() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let images = write_image_folder(&data, 2, 6, SIDE);
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let metrics = format!("127.0.0.1:{port}");
    let daemon = Daemon::start(
        dir.path(),
        &["--threads", "2", "--metrics-listen", &metrics],
    );
    let spec = dino_spec();
    let views = drain(&daemon, &data, "dino", spec.clone(), SEED);
    let decoded = sample(
        &http_get(&metrics, "/metrics").1,
        "stoker_images_total{stage=\"decode\"}",
    );
    // 2 epochs of 12 images: one decode each, not one per view.
    assert_eq!(decoded, Some((2 * images) as f64));
    assert_eq!(views.len(), 2 * images / BATCH as usize);
    for (_, _, indices, tensors) in &views {
        assert_eq!(tensors.len(), 8);
        for (v, t) in tensors.iter().enumerate() {
            let side = if v < 2 { GLOBAL } else { LOCAL } as usize;
            assert_eq!(t.len(), indices.len() * side * side * 3, "view {v}");
        }
    }
    // Views of one image differ (their own boxes), and every view is a one-view job's.
    assert_ne!(views[0].3[2], views[0].3[3]);
    for v in 0..8 {
        let one = drain(
            &daemon,
            &data,
            &format!("one-view-{v}"),
            spec.view_spec(v),
            view_seed(SEED, v),
        );
        assert_eq!(one.len(), views.len());
        for (m, o) in views.iter().zip(&one) {
            assert_eq!((m.0, m.1, &m.2), (o.0, o.1, &o.2));
            assert_eq!(o.3.len(), 1);
            assert!(m.3[v] == o.3[0], "view {v} of batch {:?}", (m.0, m.1));
        }
    }
    // A second run and a resume serve the same bytes.
    assert_eq!(
        drain(&daemon, &data, "dino-again", spec.clone(), SEED),
        views
    );
    let resumed = drain_from(
        &daemon,
        &data,
        "dino-resumed",
        spec,
        SEED,
        Position::at(1, 1),
    );
    let from = views.iter().position(|b| (b.0, b.1) == (1, 1)).unwrap();
    assert_eq!(resumed, views[from..]);
}

/// FNV-1a of `bytes`, as `tests/c/views.c` hashes a view.
fn fnv1a(bytes: &[u8]) -> u64 {
    bytes.iter().fold(0xcbf2_9ce4_8422_2325, |h, &b| {
        (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3)
    })
}

/// The C client reads every view through `stoker_batch_view` with the Rust client's shapes and
/// bytes.
#[test]
fn the_c_client_reads_the_same_views_as_the_rust_client() {
    const TEST: &str = "the_c_client_reads_the_same_views_as_the_rust_client";
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_c_client(dir.path(), "views.c", TEST) else {
        return;
    };
    let data = dir.path().join("data");
    write_image_folder(&data, 2, 3, SIDE);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let spec = dino_spec();
    let rust = drain(&daemon, &data, "rust-views", spec.clone(), SEED);
    let mut expected = Vec::new();
    for (epoch, step, indices, views) in &rust {
        for (v, bytes) in views.iter().enumerate() {
            let side = if v < 2 { GLOBAL } else { LOCAL };
            let hash = fnv1a(bytes);
            expected.push(format!(
                "view {epoch} {step} {v} {} 3 {side} {side} {hash:016x}",
                indices.len()
            ));
        }
    }
    let out = Command::new(&exe)
        .arg(daemon.socket())
        .arg(&data)
        .arg(serde_json::to_string(&spec).unwrap())
        .arg(SEED.to_string())
        .env("STOKER_CONNECT_TIMEOUT", "0")
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "C client failed: {stderr}");
    let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .collect();
    assert_eq!((rust.len(), lines.len()), (4, 8 * 4));
    assert_eq!(lines, expected);
}
