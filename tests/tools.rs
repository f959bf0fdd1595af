//! `stoker bench`, `stoker synth --shards` and `stoker pack` as a user runs them: real
//! processes, a real stokerd and real client processes, on generated JPEGs.

use std::path::{Path, PathBuf};
use std::process::Command;

/// The `stoker` binary beside the test's `stokerd`, built if missing. `scripts/test` builds
/// the binaries before the tests: building from inside a test run rewrites the ipc crate's
/// unhashed rlib (it is also a cdylib) under the tests still to link against it.
fn stoker() -> PathBuf {
    static BUILT: std::sync::Once = std::sync::Once::new();
    let path = stoker_testkit::stokerd_path().with_file_name("stoker");
    BUILT.call_once(|| {
        if path.exists() {
            return;
        }
        let cargo = std::env::var_os("CARGO").unwrap_or_else(|| "cargo".into());
        let status = Command::new(cargo)
            .args(["build", "-p", "stoker-tool", "--bin", "stoker"])
            .status()
            .expect("run cargo build");
        assert!(
            status.success(),
            "cargo build -p stoker-tool --bin stoker failed"
        );
    });
    path
}

fn run(args: &[&str]) -> String {
    run_in(Path::new("."), args)
}

/// Runs stoker in the folder `cwd`.
fn run_in(cwd: &Path, args: &[&str]) -> String {
    let out = Command::new(stoker())
        .args(args)
        .current_dir(cwd)
        .output()
        .expect("run stoker");
    assert!(
        out.status.success(),
        "stoker {args:?} failed: {}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn json(path: &Path) -> serde_json::Value {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

/// `field` of every object in the JSON array `list`, as strings.
fn strings<'a>(list: &'a serde_json::Value, field: &str) -> Vec<&'a str> {
    list.as_array()
        .unwrap()
        .iter()
        .map(|o| o[field].as_str().unwrap())
        .collect()
}

#[test]
fn bench_measures_every_stage_and_two_client_processes_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let d = data.to_str().unwrap();
    run(&[
        "synth",
        d,
        "--images",
        "40",
        "--classes",
        "2",
        "--scale",
        "0.2",
    ]);
    let (j, svg) = (dir.path().join("r.json"), dir.path().join("r.svg"));
    let table = run(&[
        "bench",
        d,
        "--threads",
        "2",
        "--batch",
        "8",
        "--size",
        "64",
        "--epochs",
        "1",
        "--min-seconds",
        "0",
        "--clients",
        "2",
        "--no-scaling",
        "--json",
        j.to_str().unwrap(),
        "--svg",
        svg.to_str().unwrap(),
    ]);
    assert!(table.contains("verdict: "), "{table}");
    // Issue 24 item 11: the verdict says what to do, and the MB/s column which bytes.
    assert!(table.contains("; to go faster: "), "{table}");
    assert!(
        table.contains("MB/s: stage rows count the compressed file bytes")
            && table.contains("end-to-end rows count the output bytes"),
        "{table}"
    );
    let r = json(&j);
    assert_eq!(r["timed_epochs"], 1, "--min-seconds 0 keeps --epochs");
    let stages = strings(&r["stages"], "stage");
    assert_eq!(
        stages,
        [
            "storage",
            "entropy decode (ceiling)",
            "decode",
            "decode+augment",
            "pipeline (in-process)"
        ]
    );
    // Issue 25 item 1: stoker's rate per core as a fraction of the entropy-decode ceiling.
    let ceiling = &r["ceiling"];
    let (entropy, ours) = (
        ceiling["entropy_per_core"].as_f64().unwrap(),
        ceiling["stoker_per_core"].as_f64().unwrap(),
    );
    assert!(entropy > 0.0 && ours > 0.0, "{ceiling}");
    assert!(
        (ceiling["fraction"].as_f64().unwrap() - ours / entropy).abs() < 1e-9,
        "{ceiling}"
    );
    assert!(table.contains("of the entropy-decode ceiling"), "{table}");
    let e2e = &r["end_to_end"][0];
    assert_eq!(e2e["clients"], 2);
    // Two ranks share one epoch of 40 samples.
    assert_eq!(e2e["images"], 40);
    assert!(e2e["images_per_s"].as_f64().unwrap() > 0.0);
    assert!(e2e["daemon_peak_rss_mb"].as_f64().unwrap() > 1.0);
    assert!(e2e["wait_p99_ms"].as_f64().unwrap() >= e2e["wait_p50_ms"].as_f64().unwrap());
    let bound = r["verdict"]["bottleneck"].as_str().unwrap();
    assert!(
        ["storage", "decode", "augment", "delivery"].contains(&bound),
        "{bound}"
    );
    let svg = std::fs::read_to_string(&svg).unwrap();
    assert!(svg.starts_with("<svg") && svg.contains("end to end"));
}

#[test]
fn synth_shards_and_pack_give_the_same_samples_and_the_bench_reads_both() {
    let dir = tempfile::tempdir().unwrap();
    let (folder, packed, shards) = (
        dir.path().join("folder"),
        dir.path().join("packed"),
        dir.path().join("shards"),
    );
    let s = |p: &Path| p.to_str().unwrap().to_string();
    // The same 30 images of 3 classes, as a folder and as 2 shards.
    let synth = |out: &Path, layout: &[&str]| {
        let common = ["--images", "30", "--classes", "3", "--scale", "0.2"];
        run(&[&["synth", &s(out)], &common[..], layout].concat());
    };
    synth(&folder, &[]);
    synth(&shards, &["--shards", "2"]);
    let out = run(&["pack", &s(&folder), &s(&packed), "--shard-mb", "1"]);
    assert!(out.contains("packed 30 samples"), "{out}");
    for layout in [&folder, &packed, &shards] {
        // No --json or --svg: the report goes to stoker-bench-NAME.json and .svg here.
        run_in(
            dir.path(),
            &["bench", &s(layout), "--storage-only", "--cold"],
        );
        let name = layout.file_name().unwrap().to_str().unwrap();
        let j = dir.path().join(format!("stoker-bench-{name}.json"));
        let svg = std::fs::read_to_string(dir.path().join(format!("stoker-bench-{name}.svg")));
        assert!(svg.unwrap().starts_with("<svg"), "{name}");
        let r = json(&j);
        assert_eq!(r["index"]["samples"], 30, "{}", layout.display());
        let caches = strings(&r["stages"], "cache");
        assert_eq!(caches, ["warm", "cold"]);
        assert!(r["index"]["walk_s"].as_f64().unwrap() > 0.0);
        assert!(r["index"]["walk_cold_s"].as_f64().unwrap() > 0.0);
    }
    // An output folder that is not there is refused before anything runs.
    let out = Command::new(stoker())
        .args(["bench", &s(&folder), "--json", "/nonexistent-stoker/r.json"])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(
        err.contains("/nonexistent-stoker/r.json: no such folder"),
        "{err}"
    );
}

/// Runs `stoker <args>` and returns (exit code, stdout + stderr); fails the test when it has
/// not ended within 60 s (it hangs), killing it.
fn run_bounded(args: &[&str]) -> (Option<i32>, String) {
    let out = stoker_testkit::child::output_within(
        Command::new(stoker()).args(args),
        std::time::Duration::from_secs(60),
        &format!("stoker {args:?}"),
    );
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    (out.status.code(), text)
}

#[test]
fn the_tools_refuse_a_fifo_naming_it_instead_of_hanging() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    run(&[
        "synth",
        &s(&data),
        "--images",
        "6",
        "--classes",
        "2",
        "--scale",
        "0.2",
    ]);
    // One image becomes a FIFO that nobody writes to: opening it without O_NONBLOCK blocks.
    let fifo = data.join("class_0000/img_00000000.jpg");
    std::fs::remove_file(&fifo).unwrap();
    assert!(Command::new("mkfifo")
        .arg(&fifo)
        .status()
        .unwrap()
        .success());
    let list = dir.path().join("list.tsv");
    std::fs::write(&list, format!("{}\t0\n", fifo.display())).unwrap();
    let named = |text: &str| text.contains(&s(&fifo)) && text.contains("FIFO");
    for target in [&data, &list] {
        let (code, text) = run_bounded(&["check", &s(target)]);
        assert_eq!(code, Some(1), "check {}: {text}", target.display());
        assert!(named(&text), "check {}: {text}", target.display());
    }
    let (code, text) = run_bounded(&["pack", &s(&data), &s(&dir.path().join("packed"))]);
    assert_ne!(code, Some(0), "{text}");
    assert!(named(&text), "pack: {text}");
    let ppm = s(&dir.path().join("out.ppm"));
    let (code, text) = run_bounded(&["decode", "--output", &ppm, &s(&fifo)]);
    assert_ne!(code, Some(0), "{text}");
    assert!(named(&text), "decode: {text}");
    // The bench's decode stages load the samples into memory: the FIFO is left out.
    let json = dir.path().join("bench.json");
    let (code, text) = run_bounded(&[
        "bench",
        &s(&data),
        "--in-process",
        "--no-scaling",
        "--epochs",
        "1",
        "--warmup",
        "0",
        "--min-seconds",
        "0.2",
        "--json",
        &s(&json),
    ]);
    assert_eq!(code, Some(0), "bench: {text}");
}

/// Issue 24 item 12: log lines into a pipe carry no colour codes (they used to, whatever the
/// output was: tracing-subscriber colours by default), and a stale `$STOKER_SOCKET` is named
/// as the cause when nothing answers there.
#[test]
fn the_tools_write_plain_text_into_pipes_and_name_a_stale_stoker_socket() {
    let dir = tempfile::tempdir().unwrap();
    let data = dir.path().join("data");
    let s = |p: &Path| p.to_str().unwrap().to_string();
    run(&["synth", &s(&data), "--images", "4", "--scale", "0.1"]);
    let out = Command::new(stoker())
        .args(["check", &s(&data)])
        .env("STOKER_LOG", "info")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    assert!(err.contains("INFO"), "no log line to look at: {err}");
    assert!(!err.contains('\u{1b}'), "colour codes in a pipe: {err:?}");

    let stale = dir.path().join("gone.sock");
    let out = Command::new(stoker())
        .arg("status")
        .env("STOKER_SOCKET", &stale)
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{err}");
    assert!(
        err.contains(&s(&stale)) && err.contains("named by $STOKER_SOCKET"),
        "{err}"
    );
}

/// Issue 24 item 9: files that are no supported image format are counted and named by
/// `stoker check` (text and JSON) instead of being left out silently.
#[test]
fn check_counts_and_names_the_files_it_skips() {
    let (dir, data, n) = stoker_testkit::temp_image_folder(2, 3);
    for name in ["c0/scan.jxl", "c1/anim.gif", "c1/raw.heic"] {
        std::fs::write(data.join(name), b"not a supported format").unwrap();
    }
    std::fs::write(data.join("c0/labels.txt"), b"metadata").unwrap();
    let s = data.to_str().unwrap();
    let text = run(&["check", s]);
    assert!(
        text.contains(&format!("checked {n} samples: {n} ok")),
        "{text}"
    );
    assert!(
        text.contains(
            "3 files skipped (not a supported image format): c0/scan.jxl, c1/anim.gif, \
             c1/raw.heic"
        ),
        "{text}"
    );
    let report: serde_json::Value = serde_json::from_str(&run(&["check", "--json", s])).unwrap();
    assert_eq!(report["skipped"]["count"], 3, "{report}");
    assert_eq!(report["skipped"]["first"][0], "c0/scan.jxl", "{report}");
    drop(dir);
}

/// A `width` x `height` RGB PNG of noise (noise so that it does not compress to nothing).
fn write_png(path: &Path, width: u32, height: u32, seed: u32) {
    let mut x = seed.wrapping_mul(2_654_435_761).max(1);
    let pixels: Vec<u8> = (0..width * height * 3)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x.to_le_bytes()[0]
        })
        .collect();
    let file = std::io::BufWriter::new(std::fs::File::create(path).unwrap());
    let mut enc = png::Encoder::new(file, width, height);
    enc.set_color(png::ColorType::Rgb);
    enc.set_depth(png::BitDepth::Eight);
    enc.write_header()
        .unwrap()
        .write_image_data(&pixels)
        .unwrap();
}

/// Issue 43 item 1: on a folder of PNGs the decode stages decode them (they called the
/// JPEG-only probe: every PNG failed at once, counted as decoded, 0 MB/s), a broken file is
/// counted as a failure and shown, and no entropy-decode ceiling is claimed without JPEGs.
#[test]
fn bench_on_a_png_folder_decodes_the_pngs_and_shows_the_failures() {
    let dir = tempfile::tempdir().unwrap();
    let class = dir.path().join("data").join("a");
    std::fs::create_dir_all(&class).unwrap();
    for i in 0..24 {
        write_png(&class.join(format!("{i:02}.png")), 48, 40, i + 1);
    }
    // A PNG signature and then nothing a decoder can use.
    std::fs::write(
        class.join("broken.png"),
        b"\x89PNG\r\n\x1a\nnot a png at all",
    )
    .unwrap();
    let data = dir.path().join("data");
    let j = dir.path().join("r.json");
    let table = run(&[
        "bench",
        data.to_str().unwrap(),
        "--in-process",
        "--no-scaling",
        "--threads",
        "2",
        "--batch",
        "5",
        "--size",
        "32",
        "--epochs",
        "1",
        "--min-seconds",
        "0.5",
        "--json",
        j.to_str().unwrap(),
        "--svg",
        dir.path().join("r.svg").to_str().unwrap(),
    ]);
    let r = json(&j);
    for name in ["decode", "decode+augment"] {
        let row = r["stages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|s| s["stage"] == name)
            .unwrap();
        let (ok, failed) = (
            row["images"].as_u64().unwrap(),
            row["failed"].as_u64().unwrap_or(0),
        );
        // One sample in 25 is the broken one, on every pass over the set.
        assert!(ok >= 24 && failed >= 1, "{name}: {row}");
        assert!(
            failed * 24 <= ok + 48 && ok <= failed * 24 + 48,
            "{name}: {row}"
        );
        assert!(row["mb_per_s"].as_f64().unwrap() > 0.0, "{name}: {row}");
        let shown = format!("{name}: {failed} of {} failed", ok + failed);
        assert!(table.contains(&shown), "{shown:?} not in {table}");
    }
    assert!(
        r["bad_samples"].as_u64().unwrap() >= 1,
        "the pipeline's replaced sample"
    );
    assert!(
        r["ceiling"].is_null(),
        "no JPEG, no entropy ceiling: {}",
        r["ceiling"]
    );
    assert!(
        table.contains("entropy-decode ceiling: not shown"),
        "{table}"
    );
}

/// Issue 43 item 4: `stoker stop` stops the daemon at a socket (it had no way but its pid).
#[test]
fn stoker_stop_stops_the_daemon_at_the_socket() {
    let dir = tempfile::tempdir().unwrap();
    let mut daemon = stoker_testkit::Daemon::start(dir.path(), &[]);
    let socket = daemon.socket().to_str().unwrap().to_owned();
    let pid = daemon.pid();
    let out = Command::new(stoker())
        .args(["stop", "--socket", &socket])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "stoker stop: {}\n{err}", out.status);
    assert!(
        err.contains(&format!("stopped stokerd (pid {pid}) at {socket}")),
        "{err}"
    );
    // Gone by the time stop returned: nothing to wait for here.
    assert!(
        !daemon.is_running(),
        "the daemon still runs after stoker stop"
    );
    let again = Command::new(stoker())
        .args(["stop", "--socket", &socket])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&again.stderr);
    assert!(!again.status.success(), "stopping nothing succeeded: {err}");
    assert!(err.contains(&socket), "{err}");
}

/// Issue 43 item 8: `stoker decode --help` says it decodes every supported format (it said
/// "one JPEG"), and it does: a PNG comes out as the same pixels in a PPM.
#[test]
fn stoker_decode_says_and_does_every_format() {
    let help = run(&["decode", "--help"]);
    assert!(
        help.contains("any supported format") && !help.contains("one JPEG"),
        "{help}"
    );
    let dir = tempfile::tempdir().unwrap();
    let png = dir.path().join("a.png");
    write_png(&png, 6, 4, 9);
    let ppm = dir.path().join("a.ppm");
    run(&["decode", png.to_str().unwrap(), "-o", ppm.to_str().unwrap()]);
    let bytes = std::fs::read(&ppm).unwrap();
    assert!(bytes.starts_with(b"P6\n6 4\n255\n"), "{:?}", &bytes[..12]);
}

/// Issue 43 item 8: the bench's help names no path of a development machine (it named
/// /tmp/peer/bin/python and ../shared/peers).
#[test]
fn bench_help_names_no_development_path() {
    let help = run(&["bench", "--help"]);
    for dev in ["/tmp/peer", "shared/peers"] {
        assert!(!help.contains(dev), "{dev} in:\n{help}");
    }
    assert!(help.contains("--peer-python"), "{help}");
}
