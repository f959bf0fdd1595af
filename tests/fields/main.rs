//! Per-sample fields (issue 26 item 3): a WebDataset shard set with `jpg`, `txt`, `json` and
//! `cls` members, made here, served by a real daemon to real clients (this process's Rust
//! client, the C client `tests/c/fields.c`): every caption and JSON record byte-exact beside
//! its image, the fields of the sample actually served where a bad one was replaced, the same
//! after a resume, and a caption over its bound reported for that sample only.

// Test code: its casts are of small counts and indices chosen by the test.
#![allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]

use std::path::Path;
use std::process::Command;

use stoker::ring::{FieldStatus, SampleStatus};
use stoker::{Batch, Client, FieldError, PipelineSpec, Position};
use stoker_testkit::attach::{rank_options, u8_spec};
use stoker_testkit::daemon::build_c_client;
use stoker_testkit::shards::{write_caption_shards, CaptionShards, LONG_CAPTION};
use stoker_testkit::Daemon;

/// Room for a field in the tests' spec: the long caption does not fit, the others do.
const MAX: u32 = 256;
/// 2 shards of 6 keys: 12 samples, batches of 4, 2 epochs.
const SHARDS: usize = 2;
const PER_SHARD: usize = 6;
const BAD: usize = 3;
const LONG: usize = 8;
const SEED: u64 = 7;

/// One served sample as a client sees it.
#[derive(Debug, Clone, PartialEq)]
struct Served {
    epoch: u64,
    step: u64,
    index: u64,
    status: SampleStatus,
    label: i64,
    caption: Result<Vec<u8>, FieldError>,
    json: Result<Vec<u8>, FieldError>,
}

fn spec() -> PipelineSpec {
    PipelineSpec {
        fields: vec!["txt".into(), "json".into()],
        field_max_bytes: MAX,
        ..u8_spec(4, 16, Some(2))
    }
}

fn served(b: &Batch) -> Vec<Served> {
    assert_eq!(b.field_names(), ["txt", "json"]);
    (0..b.n())
        .map(|i| Served {
            epoch: b.epoch(),
            step: b.step(),
            index: b.indices()[i],
            status: b.sample_status(i),
            label: b.labels()[i],
            caption: b.field(0, i).map(<[u8]>::to_vec),
            json: b.field(1, i).map(<[u8]>::to_vec),
        })
        .collect()
}

fn drain(c: &mut Client) -> Vec<Served> {
    let mut out = Vec::new();
    while let Some(b) = c.next_batch().unwrap() {
        out.extend(served(&b));
    }
    out
}

fn attach(daemon: &Daemon, data: &Path, job: &str, start: Position) -> Client {
    let mut o = rank_options(data.to_str().unwrap(), job, (0, 1), SEED, spec());
    o.start = start;
    Client::attach(daemon.socket(), o).unwrap()
}

/// Every sample's fields are its own (by the index served), byte-exact; the bad sample is
/// never served (replaced, with the replacement's fields); the long caption is refused for
/// its sample alone, naming it.
fn check(shards: &CaptionShards, got: &[Served]) {
    let mut replaced = 0;
    for s in got {
        let i = s.index as usize;
        assert_ne!(i, shards.bad, "the bad sample was served: {s:?}");
        replaced += usize::from(s.status == SampleStatus::Replaced);
        assert!(
            s.status == SampleStatus::Ok || s.status == SampleStatus::Replaced,
            "{s:?}"
        );
        assert_eq!(s.label, (i % 3) as i64, "{s:?}");
        assert_eq!(s.json.as_deref(), Ok(&shards.jsons[i][..]), "sample {i}");
        if i == shards.long {
            let e = s.caption.as_ref().unwrap_err();
            assert_eq!(
                (e.sample, e.status, e.len),
                (s.index, FieldStatus::TooLarge, LONG_CAPTION as u32)
            );
            let text = e.to_string();
            assert!(
                text.contains(&format!("field \"txt\" of sample {i}")),
                "{text}"
            );
            assert!(
                text.contains(&format!(
                    "{LONG_CAPTION} bytes, over the spec's field_max_bytes of {MAX}"
                )),
                "{text}"
            );
        } else {
            assert_eq!(
                s.caption.as_deref(),
                Ok(&shards.captions[i][..]),
                "sample {i}"
            );
        }
    }
    // Once an epoch the bad sample's place is taken by a replacement.
    assert_eq!(replaced, 2, "{got:?}");
    // The long caption's sample is served (its image and JSON), once an epoch at least.
    let long = got.iter().filter(|s| s.index as usize == shards.long);
    assert!(long.count() >= 2, "{got:?}");
}

#[test]
fn captions_are_served_byte_exact_across_a_replacement_and_a_resume() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_caption_shards(&dir.path().join("data"), SHARDS, PER_SHARD, BAD, LONG);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let whole = drain(&mut attach(
        &daemon,
        &shards.root,
        "fields",
        Position::default(),
    ));
    assert_eq!(whole.len(), 2 * SHARDS * PER_SHARD);
    check(&shards, &whole);

    // A resume in the second epoch serves what the uninterrupted run did from there on.
    let resumed = drain(&mut attach(
        &daemon,
        &shards.root,
        "fields-resumed",
        Position::at(1, 1),
    ));
    let from = whole
        .iter()
        .position(|s| (s.epoch, s.step) == (1, 1))
        .unwrap();
    assert_eq!(resumed, whole[from..]);
}

/// The C client reads the same fields through `stoker_batch_field` as (pointer, length), from
/// the start and resumed, with the long caption refused for its sample alone.
#[test]
fn the_c_client_reads_the_same_fields_as_the_rust_client() {
    const TEST: &str = "the_c_client_reads_the_same_fields_as_the_rust_client";
    let dir = tempfile::tempdir().unwrap();
    let Some(exe) = build_c_client(dir.path(), "fields.c", TEST) else {
        return;
    };
    let shards = write_caption_shards(&dir.path().join("data"), SHARDS, PER_SHARD, BAD, LONG);
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let rust = drain(&mut attach(
        &daemon,
        &shards.root,
        "fields-rust",
        Position::default(),
    ));
    check(&shards, &rust);
    let expected = |from: (u64, u64)| -> Vec<String> {
        rust.iter()
            .filter(|s| (s.epoch, s.step) >= from)
            .map(c_line)
            .collect()
    };
    for (epoch, step) in [(0, 0), (1, 1)] {
        let out = Command::new(&exe)
            .args([
                daemon.socket().to_str().unwrap(),
                shards.root.to_str().unwrap(),
            ])
            .args([
                "4",
                "2",
                &MAX.to_string(),
                &epoch.to_string(),
                &step.to_string(),
            ])
            .args(["txt", "json"])
            .env("STOKER_CONNECT_TIMEOUT", "0")
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "C client failed: {stderr}");
        let lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
            .lines()
            .map(str::to_owned)
            .collect();
        assert_eq!(lines, expected((epoch, step)), "from ({epoch}, {step})");
    }
}

/// The line `tests/c/fields.c` prints for `s`.
fn c_line(s: &Served) -> String {
    let field = |f: &Result<Vec<u8>, FieldError>| match f {
        Ok(b) if b.is_empty() => " -".to_owned(),
        Ok(b) => format!(
            " {}",
            b.iter().map(|x| format!("{x:02x}")).collect::<String>()
        ),
        Err(e) => format!(" !{}:{}", e.status as u8, e.len),
    };
    format!(
        "sample {} {} {} {} {}{}{}",
        s.epoch,
        s.step,
        s.index,
        s.status as u8,
        s.label,
        field(&s.caption),
        field(&s.json)
    )
}

/// An ImageFolder whose images have sidecar captions (`img000.txt` beside `img000.jpg`) serves
/// them as field `txt`; an image without one reports it missing, for that sample only.
#[test]
fn a_folders_sidecar_captions_are_served_as_fields() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let n = stoker_testkit::write_image_folder(&data, 2, 3, 24);
    let caption = |c: usize, i: usize| format!("class {c}, image {i}: caf\u{e9}\n").into_bytes();
    for c in 0..2 {
        for i in 0..3 {
            if (c, i) != (1, 2) {
                std::fs::write(data.join(format!("c{c}/img{i:03}.txt")), caption(c, i)).unwrap();
            }
        }
    }
    let daemon = Daemon::start(dir.path(), &["--threads", "2"]);
    let spec = PipelineSpec {
        fields: vec!["txt".into()],
        ..u8_spec(3, 16, Some(1))
    };
    let o = rank_options(data.to_str().unwrap(), "sidecars", (0, 1), SEED, spec);
    let mut c = Client::attach(daemon.socket(), o).unwrap();
    let mut seen = 0;
    while let Some(b) = c.next_batch().unwrap() {
        for i in 0..b.n() {
            // Samples are class-major in sorted order: index = class * 3 + image.
            let index = b.indices()[i] as usize;
            let (class, image) = (index / 3, index % 3);
            match b.field(0, i) {
                Ok(bytes) => assert_eq!(bytes, caption(class, image), "sample {index}"),
                Err(e) => {
                    assert_eq!((class, image), (1, 2), "{e}");
                    assert_eq!((e.sample, e.status), (index as u64, FieldStatus::Missing));
                    assert!(e.to_string().contains("has none"), "{e}");
                }
            }
            seen += 1;
        }
    }
    assert_eq!(seen, n);
}
