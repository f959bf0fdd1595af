//! Every file of `shared/data/edge/MANIFEST.tsv` gets the manifest's outcome from the CPU
//! decoder: "decode OK" files decode with PSNR >= 40 dB against libjpeg-turbo's `djpeg -ppm`
//! (a separate build and program: the system's libjpeg-turbo-progs), "must be rejected" files are
//! rejected with a sensible reason, "may be rejected" files do either; none panics or hangs.
//! `stoker check`'s core reports exactly the rejected files. PNG files (which the manifest's
//! reader expects to decode) are not compared with djpeg, which reads JPEG only.

// Test code: its casts are of small sizes, counts and pixel values chosen by the test, not
// worth a checked conversion each (the workspace's cast lints are for shipped code).
#![allow(
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    clippy::cast_possible_wrap
)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::mpsc;
use std::time::Duration;

use stoker_kernels::reference::{psnr, CropBox, RgbImage};
use stoker_pipeline::transform::decode::{CpuDecoder, DecodeError, ImageFormat, Limits};
use stoker_tool::cli::check::{check_samples, sample_files, CheckOptions};

use stoker_testkit::edge_manifest as manifest;

use manifest::Expected;

const PER_FILE_TIMEOUT: Duration = Duration::from_secs(60);

fn edge_dir() -> Option<PathBuf> {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../../shared/data/edge");
    if dir.join("MANIFEST.tsv").is_file() {
        Some(dir)
    } else {
        eprintln!(
            "SKIP edge_manifest: no edge corpus at {} (clone the repo with shared/ beside it)",
            dir.display()
        );
        None
    }
}

/// Decodes with `djpeg -ppm`; `None` when djpeg is missing or fails.
fn djpeg(path: &Path) -> Option<RgbImage> {
    let out = Command::new("djpeg").arg("-ppm").arg(path).output().ok()?;
    if !out.status.success() {
        return None;
    }
    parse_pnm(&out.stdout)
}

/// Parses binary PGM (P5) or PPM (P6), maxval 255, into RGB.
fn parse_pnm(b: &[u8]) -> Option<RgbImage> {
    let mut fields = Vec::new();
    let mut pos = 0;
    while fields.len() < 4 {
        while b.get(pos)?.is_ascii_whitespace() {
            pos += 1;
        }
        if b[pos] == b'#' {
            while b.get(pos)? != &b'\n' {
                pos += 1;
            }
            continue;
        }
        let start = pos;
        while !b.get(pos)?.is_ascii_whitespace() {
            pos += 1;
        }
        fields.push(std::str::from_utf8(&b[start..pos]).ok()?.to_owned());
    }
    pos += 1;
    let (w, h): (u32, u32) = (fields[1].parse().ok()?, fields[2].parse().ok()?);
    let n = w as usize * h as usize;
    let data = match fields[0].as_str() {
        "P6" => b.get(pos..pos + n * 3)?.to_vec(),
        "P5" => b
            .get(pos..pos + n)?
            .iter()
            .flat_map(|&g| [g, g, g])
            .collect(),
        _ => return None,
    };
    Some(RgbImage {
        width: w,
        height: h,
        data,
    })
}

/// The reasons that make sense for a "must be rejected" file, by its category prefix.
fn sensible_reasons(name: &str) -> &'static [&'static str] {
    let category = name.split("__").next().unwrap_or("");
    match category {
        "notjpeg" => &["unknown_format"],
        "12bit" | "lossless" => &["unsupported"],
        "huge" => &["too_large"],
        "trunc" => &["truncated", "corrupt_warning", "corrupt"],
        _ => &["corrupt", "corrupt_warning", "truncated", "unsupported"],
    }
}

struct Outcome {
    full: Result<RgbImage, DecodeError>,
    /// decode_for_crop of an off-centre box at scale 1 and at the smallest scale that covers a
    /// third of it: (output, returned box, wanted box) each.
    crops: Vec<Result<(RgbImage, CropBox, CropBox), DecodeError>>,
}

fn decode_with_timeout(path: PathBuf) -> Outcome {
    let (tx, rx) = mpsc::channel();
    let name = path.display().to_string();
    std::thread::spawn(move || {
        let bytes = std::fs::read(&path).unwrap();
        let mut d = CpuDecoder::new(Limits::default()).unwrap();
        let mut img = RgbImage::default();
        let full = d.decode_full(&bytes, &mut img).map(|()| img.clone());
        let mut crops = Vec::new();
        if let Ok(f) = &full {
            let want = CropBox::new(
                (f.width as f64 * 0.2).round(),
                (f.height as f64 * 0.3).round(),
                (f.width as f64 * 0.7).round().max(1.0),
                (f.height as f64 * 0.6).round().max(1.0),
            );
            for div in [1.0, 3.0] {
                let mut out = RgbImage::default();
                let out_size = (
                    (want.h / div).max(1.0) as u32,
                    (want.w / div).max(1.0) as u32,
                );
                crops.push(
                    d.decode_for_crop(&bytes, want, out_size, &mut out)
                        .map(|b| (out, b, want)),
                );
            }
        }
        let _ = tx.send(Outcome { full, crops });
    });
    rx.recv_timeout(PER_FILE_TIMEOUT)
        .unwrap_or_else(|_| panic!("{name}: decoder panicked or hung"))
}

/// PSNR between the region decode `out` and the full decode averaged over each output pixel's
/// footprint (1/s x 1/s full pixels), over the output pixels inside the returned box `b`.
/// A box that maps to the wrong pixels scores far lower than the DCT-vs-box-filter difference.
fn crop_psnr(full: &RgbImage, out: &RgbImage, b: CropBox, want: CropBox) -> f64 {
    let s = b.w / want.w;
    let foot = (1.0 / s).round() as u32;
    let (mut got, mut exp) = (Vec::new(), Vec::new());
    let (x0, y0) = (b.x.ceil() as u32, b.y.ceil() as u32);
    let x1 = ((b.x + b.w).floor() as u32).min(out.width);
    let y1 = ((b.y + b.h).floor() as u32).min(out.height);
    for j in y0..y1 {
        for i in x0..x1 {
            let fx = (want.x + (i as f64 - b.x) / s).round() as u32;
            let fy = (want.y + (j as f64 - b.y) / s).round() as u32;
            let mut sum = [0u32; 3];
            let mut n = 0;
            for y in fy..(fy + foot).min(full.height) {
                for x in fx..(fx + foot).min(full.width) {
                    let p = full.pixel(x, y);
                    (0..3).for_each(|c| sum[c] += p[c] as u32);
                    n += 1;
                }
            }
            if n == 0 {
                continue;
            }
            exp.extend(sum.map(|v| ((v + n / 2) / n) as u8));
            got.extend(out.pixel(i, j));
        }
    }
    psnr(&got, &exp)
}

#[test]
fn edge_files_get_the_manifest_outcome() {
    let Some(dir) = edge_dir() else { return };
    let have_djpeg = Command::new("djpeg").arg("-version").output().is_ok();
    if !have_djpeg {
        eprintln!("SKIP PSNR comparisons: djpeg not found (apt-get install libjpeg-turbo-progs)");
    }
    let mut problems = Vec::new();
    let mut table = Vec::new();
    let mut crop_scores = Vec::new();
    for (name, expected) in manifest::read(&dir) {
        let path = dir.join(&name);
        // djpeg reads JPEG only.
        let jpeg = ImageFormat::detect(&std::fs::read(&path).unwrap()) == Some(ImageFormat::Jpeg);
        let outcome = decode_with_timeout(path.clone());
        let verdict = match &outcome.full {
            Ok(img) => format!("decoded {}x{}", img.width, img.height),
            Err(e) => format!("rejected: {} ({e})", e.reason()),
        };
        table.push(format!("{name}\t{expected:?}\t{verdict}"));
        match (expected, &outcome.full) {
            (Expected::DecodeOk, Err(e)) => problems.push(format!("{name}: must decode, got {e}")),
            (Expected::DecodeOk, Ok(img)) if have_djpeg && jpeg => match djpeg(&path) {
                None => problems.push(format!("{name}: djpeg failed on a decode-OK file")),
                Some(r) if (r.width, r.height) != (img.width, img.height) => {
                    problems.push(format!(
                        "{name}: size {}x{} vs djpeg {}x{}",
                        img.width, img.height, r.width, r.height
                    ))
                }
                Some(r) => {
                    let p = psnr(&img.data, &r.data);
                    if p < 40.0 {
                        problems.push(format!("{name}: PSNR {p:.1} dB vs djpeg"));
                    }
                }
            },
            (Expected::MustReject, Ok(_)) => {
                problems.push(format!("{name}: must be rejected, decoded"))
            }
            (Expected::MustReject, Err(e))
                if !sensible_reasons(&name).contains(&e.reason()) || e.to_string().len() < 10 =>
            {
                problems.push(format!(
                    "{name}: rejected with an unexpected reason: {} ({e})",
                    e.reason()
                ));
            }
            _ => {}
        }
        // The ROI path must agree with the full decode wherever the full decode worked:
        // at scale 1 exactly but for block smoothing of incomplete progressive files (>= 45
        // dB), coarsely when scaled.
        if let Ok(full) = &outcome.full {
            for (k, crop) in outcome.crops.iter().enumerate() {
                match crop {
                    Err(e) => problems.push(format!("{name}: decode_for_crop failed: {e}")),
                    Ok((out, b, want)) => {
                        let p = crop_psnr(full, out, *b, *want);
                        // Scaled: a coarse check (DCT scaling is not a box filter, least of all with odd
                        // chroma sampling); the exact geometry is checked in the unit tests.
                        let min = if k == 0 { 45.0 } else { 20.0 };
                        crop_scores.push(format!("{name}\t{:.3}\t{p:.1}", b.w / want.w));
                        if p < min {
                            problems.push(format!(
                                "{name}: crop box {b:?} at scale {:.3} maps to other pixels (PSNR {p:.1})",
                                b.w / want.w
                            ));
                        }
                    }
                }
            }
        }
    }
    println!("{}", table.join("\n"));
    println!("{}", crop_scores.join("\n"));
    assert!(
        problems.is_empty(),
        "edge outcomes wrong:\n{}",
        problems.join("\n")
    );
}

#[test]
fn check_reports_exactly_the_rejected_files() {
    let Some(dir) = edge_dir() else { return };
    let files = sample_files(&dir).unwrap();
    let expected: BTreeMap<String, Expected> = manifest::read(&dir).into_iter().collect();
    assert_eq!(
        files.len(),
        expected.len(),
        "check walks exactly the manifest's files"
    );
    let samples = files.iter().map(|p| {
        let name = p.file_name().unwrap().to_string_lossy().into_owned();
        (name, std::fs::read(p))
    });
    let opts = CheckOptions {
        threads: 2,
        limits: Limits::default(),
    };
    let report = check_samples(samples, &opts);
    assert_eq!(report.total, expected.len());
    let failed: Vec<&str> = report.failures.iter().map(|f| f.name.as_str()).collect();
    for (name, exp) in &expected {
        match exp {
            Expected::DecodeOk => assert!(!failed.contains(&name.as_str()), "{name} listed"),
            Expected::MustReject => assert!(failed.contains(&name.as_str()), "{name} not listed"),
            Expected::MayReject => {}
        }
    }
    assert_eq!(report.ok + report.failures.len(), report.total);
    assert_eq!(
        report.by_reason.values().sum::<usize>(),
        report.failures.len()
    );
}
