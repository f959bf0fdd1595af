//! The self-test's decode checks: nvJPEG against the CPU decoder on photos (PSNR >= 40 dB for
//! every image nvJPEG takes) and on edge files, judged by their manifest.
//!
//! # Design
//! - The reference is the CPU decoder upsampling chroma as nvJPEG's decoders do, by replication
//!   (`CpuDecoder::set_fast_upsample`): on a real H200 every nvJPEG image that differed from
//!   libjpeg-turbo's default output was bit-identical to `djpeg -nosmooth`
//!   (docs/results/gpu-check-2026-11-26). The PSNR against the CPU backend's own decode (the
//!   triangle filter) is reported beside it, for the difference a user sees between backends.
//! - An image goes down the route the CUDA engine would give it (`cli::gpu::route`); every
//!   other photo is decoded with a region of interest, as random crops are.
//! - Edge files are judged by what the CUDA engine would do with them as a whole: nvJPEG's
//!   pixels where it decodes, the CPU decoder's outcome where nvJPEG refuses (up front, or as a
//!   bad image while decoding). "decode OK" files must come out with pixels (at PSNR >= 40 dB
//!   against the CPU decoder's where both decode), "must be rejected" files must be refused by
//!   both, "may be rejected" files may go either way but, if nvJPEG and the CPU both decode
//!   them, must agree.
//!
//! # Limitations
//! - Output sizes come from the CPU decoder's header where it reads one (nvJPEG's
//!   `nvjpegGetImageInfo` reports component 0's size, which is not the image's for some
//!   sampling factors).

#![forbid(unsafe_code)]

use std::path::{Path, PathBuf};

use stoker_kernels::image::RgbImage;
use stoker_kernels::reference::psnr;
use stoker_nvidia::cuda::DeviceBuffer;
use stoker_nvidia::nvjpeg::Roi;
use stoker_pipeline::transform::decode::routing::Route;

use super::GpuUnderTest;
use crate::cli::decode_file::write_ppm;
use crate::cli::gpu::{cpu_reference, decode_sync, route, DecodeMix, GpuImage};
use crate::edge_manifest::{self, Expected};
use stoker_pipeline::transform::decode::{CpuDecoder, Limits};

/// PSNR every nvJPEG image must reach against the reference (the CPU decoder upsampling chroma as
/// nvJPEG does).
pub(super) const MIN_PSNR_DB: f64 = 40.0;

/// Failures named in a check's detail; the rest are counted. Every one is named: the first run on
/// a GPU showed that a report naming 8 of 30 cannot be acted on without another run.
const NAMED_FAILURES: usize = 256;

/// The JPEG files under `dir` (recursively), sorted, at most `max` (0: all).
pub(super) fn photo_files(dir: &Path, max: usize) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&d) else {
            continue;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                stack.push(p);
            } else if p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| matches!(x.to_ascii_lowercase().as_str(), "jpg" | "jpeg"))
            {
                out.push(p);
            }
        }
    }
    out.sort();
    if max > 0 {
        out.truncate(max);
    }
    out
}

/// One image read for a check.
struct Item {
    name: String,
    jpeg: Vec<u8>,
    roi: Option<Roi>,
    /// Whether the check asked for a region (`roi` is then the one the route decodes: `None`
    /// where the hardware engines refused the region and take the whole image).
    region_asked: bool,
    width: u32,
    height: u32,
    route: Route,
}

/// The worst PSNR seen and the failures, for a check's detail.
#[derive(Default)]
struct Tally {
    mix: DecodeMix,
    min_psnr: Option<(f64, String)>,
    /// Images compared, and those bit-identical to the reference.
    compared: usize,
    identical: usize,
    /// The worst PSNR against the CPU backend's decode (triangle-filtered chroma).
    min_backend: Option<(f64, String)>,
    failures: Vec<String>,
}

/// Keeps the lower of `slot` and `(p, name)`.
fn keep_min(slot: &mut Option<(f64, String)>, name: &str, p: f64) {
    if slot.as_ref().is_none_or(|(m, _)| p < *m) {
        *slot = Some((p, name.to_string()));
    }
}

impl Tally {
    /// Records nvJPEG's PSNR `p` against the reference, and `backend` against the CPU
    /// backend's decode where it decodes.
    fn psnr(&mut self, name: &str, p: f64, backend: Option<f64>) {
        keep_min(&mut self.min_psnr, name, p);
        if let Some(b) = backend {
            keep_min(&mut self.min_backend, name, b);
        }
        self.compared += 1;
        self.identical += usize::from(p.is_infinite());
        if p < MIN_PSNR_DB {
            self.failures.push(format!("{name}: PSNR {p:.1} dB"));
        }
    }

    fn summary(&self) -> String {
        let psnr = match &self.min_psnr {
            Some((p, name)) if p.is_finite() => format!(
                "{} of {} nvJPEG images identical to the CPU decoder's (upsampling as nvJPEG), \
                 min PSNR {p:.1} dB ({name})",
                self.identical, self.compared
            ),
            Some(_) => {
                "every nvJPEG image identical to the CPU decoder's (upsampling as nvJPEG)".into()
            }
            None => "nvJPEG decoded none".into(),
        };
        let backend = match &self.min_backend {
            Some((p, name)) if p.is_finite() => {
                format!("; against the CPU backend's decode min {p:.1} dB ({name})")
            }
            _ => String::new(),
        };
        format!("{}; {psnr}{backend}", self.mix)
    }

    // String error: a failed check is one line of the selftest report, composed here from the
    // failing call and printed as is.
    fn outcome(self, what: String) -> Result<String, String> {
        let summary = format!("{what}; {}", self.summary());
        if self.failures.is_empty() {
            return Ok(summary);
        }
        let n = self.failures.len();
        let named: Vec<&str> = self
            .failures
            .iter()
            .take(NAMED_FAILURES)
            .map(String::as_str)
            .collect();
        let more = if n > NAMED_FAILURES {
            format!("; and {} more", n - NAMED_FAILURES)
        } else {
            String::new()
        };
        Err(format!("{summary}; {n} FAILED: {}{more}", named.join("; ")))
    }
}

/// Reads `path` and routes it; `with_roi` cuts a region off the centre.
fn item(gpu: &mut GpuUnderTest, cpu: &mut CpuDecoder, path: &Path, with_roi: bool) -> Item {
    let name = path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into(),
    );
    let jpeg = std::fs::read(path).unwrap_or_default();
    // The CPU decoder's header where it reads one, else nvJPEG's.
    let (w, h) = match cpu.probe(&jpeg) {
        Ok(hdr) => (hdr.width, hdr.height),
        Err(_) => gpu
            .decoder
            .info(&jpeg)
            .map_or((0, 0), |i| (i.width, i.height)),
    };
    let roi = (with_roi && w > 8 && h > 8).then_some(Roi {
        x: w / 5,
        y: h / 7,
        width: w / 2,
        height: h / 2,
    });
    // The engine's route, and the region it decodes (the whole image where the hardware
    // engines refuse the region).
    let (route, roi) = if w == 0 || h == 0 {
        (Route::Cpu, roi)
    } else {
        let r = route(&mut gpu.decoder, &jpeg, roi, &cpu.limits());
        (r.route, r.roi)
    };
    let (width, height) = roi.map_or((w, h), |r| (r.width, r.height));
    Item {
        name,
        jpeg,
        region_asked: with_roi && w > 8 && h > 8,
        roi,
        width,
        height,
        route,
    }
}

/// Decodes `items` (all on `route`) in one go; on an error, one at a time, so the error
/// names its image. Returns one outcome per item.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn decode_items(
    gpu: &mut GpuUnderTest,
    items: &[&Item],
    bufs: &[&DeviceBuffer],
    route: Route,
) -> Vec<Result<(), String>> {
    let images = |range: std::ops::Range<usize>| -> Vec<GpuImage<'_>> {
        range
            .map(|i| GpuImage {
                jpeg: &items[i].jpeg,
                roi: items[i].roi,
                width: items[i].width,
                height: items[i].height,
                out: bufs[i],
            })
            .collect()
    };
    let max = items.len();
    let all = decode_sync(
        &mut gpu.decoder,
        &gpu.stream,
        route,
        &images(0..items.len()),
        max,
    );
    if all.is_ok() || items.len() == 1 {
        return vec![all.map_err(|e| e.to_string()); items.len()];
    }
    (0..items.len())
        .map(|i| {
            decode_sync(&mut gpu.decoder, &gpu.stream, route, &images(i..i + 1), 1)
                .map_err(|e| e.to_string())
        })
        .collect()
}

/// Reads an image's pixels back from the device.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn read_back(buf: &DeviceBuffer, item: &Item) -> Result<Vec<u8>, String> {
    let mut got = vec![0u8; item.width as usize * item.height as usize * 3];
    buf.read(&mut got).map_err(|e| e.to_string())?;
    Ok(got)
}

/// Device buffers for `items`.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn alloc(gpu: &GpuUnderTest, items: &[&Item]) -> Result<Vec<DeviceBuffer>, String> {
    items
        .iter()
        .map(|i| {
            let bytes = (i.width as usize * i.height as usize * 3).max(1);
            gpu.device
                .alloc(bytes)
                .map_err(|e| format!("{}: {e}", i.name))
        })
        .collect()
}

/// nvJPEG on every photo it takes, at PSNR >= 40 dB against the CPU decoder.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
pub(super) fn photos(
    gpu: &mut GpuUnderTest,
    files: &[PathBuf],
    save: Option<&Path>,
) -> Result<String, String> {
    let mut cpu = CpuDecoder::new(Limits::default()).map_err(|e| e.to_string())?;
    let mut plain = plain_decoder()?;
    let mut tally = Tally::default();
    // Regions asked: (on the engines, decoded whole on the engines, elsewhere).
    let mut regions = (0usize, 0usize, 0usize);
    // Batches as the engines take them, within the decoder's maximum.
    let chunk = gpu.decoder.hardware_batch().clamp(8, super::MAX_BATCH);
    for (c, paths) in files.chunks(chunk).enumerate() {
        let items: Vec<Item> = paths
            .iter()
            .enumerate()
            .map(|(i, p)| item(gpu, &mut cpu, p, (c * chunk + i) % 2 == 1))
            .collect();
        for it in items.iter().filter(|i| i.region_asked) {
            match (it.route, it.roi) {
                (Route::Hardware, Some(_)) => regions.0 += 1,
                (Route::Hardware, None) => regions.1 += 1,
                _ => regions.2 += 1,
            }
        }
        for route in [Route::Hardware, Route::Hybrid] {
            let these: Vec<&Item> = items.iter().filter(|i| i.route == route).collect();
            if these.is_empty() {
                continue;
            }
            let bufs = alloc(gpu, &these)?;
            let buf_refs: Vec<&DeviceBuffer> = bufs.iter().collect();
            let outcomes = decode_items(gpu, &these, &buf_refs, route);
            for ((it, buf), outcome) in these.iter().zip(&bufs).zip(outcomes) {
                tally.mix.add(route);
                let compared = outcome.and_then(|()| {
                    let got = read_back(buf, it)?;
                    let want = cpu_reference(&mut plain, &it.jpeg, it.roi)
                        .map_err(|e| format!("the CPU decoder refused what nvJPEG took: {e}"))?;
                    let backend = cpu_reference(&mut cpu, &it.jpeg, it.roi)
                        .ok()
                        .map(|b| psnr(&got, &b));
                    let p = psnr(&got, &want);
                    if p < MIN_PSNR_DB {
                        if let Some(dir) = save {
                            save_pair(dir, it, got, want)?;
                        }
                    }
                    Ok((p, backend))
                });
                match compared {
                    Ok((p, backend)) => tally.psnr(&it.name, p, backend),
                    Err(e) => tally.failures.push(format!("{}: {e}", it.name)),
                }
            }
        }
        for it in items.iter().filter(|i| i.route == Route::Cpu) {
            tally.mix.add(Route::Cpu);
            if let Err(e) = cpu_reference(&mut cpu, &it.jpeg, None) {
                tally
                    .failures
                    .push(format!("{}: refused by nvJPEG and the CPU: {e}", it.name));
            }
        }
    }
    if files.is_empty() {
        return Err("no JPEG files in the photos folder".into());
    }
    let (on, whole, elsewhere) = regions;
    tally.outcome(format!(
        "{} photos; regions: {} asked, {on} on the hardware engines, {whole} refused there and \
         decoded whole on them, {elsewhere} on another decoder",
        files.len(),
        on + whole + elsewhere
    ))
}

/// The reference decoder: the CPU decoder upsampling chroma as nvJPEG does.
// String error: see `photos`.
fn plain_decoder() -> Result<CpuDecoder, String> {
    let mut plain = CpuDecoder::new(Limits::default()).map_err(|e| e.to_string())?;
    plain.set_fast_upsample(true).map_err(|e| e.to_string())?;
    Ok(plain)
}

/// Writes nvJPEG's and the CPU decoder's pixels of `it` into `dir` as PPM.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn save_pair(dir: &Path, it: &Item, nvjpeg: Vec<u8>, cpu: Vec<u8>) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    for (which, data) in [("nvjpeg", nvjpeg), ("cpu", cpu)] {
        let path = dir.join(format!("{}.{which}.ppm", it.name));
        let img = RgbImage {
            width: it.width,
            height: it.height,
            data,
        };
        write_ppm(&path, &img).map_err(|e| format!("{}: {e}", path.display()))?;
    }
    Ok(())
}

/// What the CUDA engine makes of one edge file: its pixels came from nvJPEG (`Some((psnr,
/// backend))` against the reference and the CPU backend's decode, `None` where the CPU
/// refuses), from the CPU decoder, or it was refused with a reason.
enum EdgeOutcome {
    Nvjpeg(Option<(f64, f64)>),
    Cpu,
    Refused(String),
}

// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn edge_outcome(
    gpu: &mut GpuUnderTest,
    cpu: &mut CpuDecoder,
    plain: &mut CpuDecoder,
    it: &Item,
) -> Result<EdgeOutcome, String> {
    let on_cpu = |cpu: &mut CpuDecoder| match cpu_reference(cpu, &it.jpeg, None) {
        Ok(_) => EdgeOutcome::Cpu,
        Err(e) => EdgeOutcome::Refused(e.reason().to_string()),
    };
    if it.route == Route::Cpu {
        return Ok(on_cpu(cpu));
    }
    let buf = alloc(gpu, &[it])?.remove(0);
    let images = [GpuImage {
        jpeg: &it.jpeg,
        roi: None,
        width: it.width,
        height: it.height,
        out: &buf,
    }];
    match decode_sync(&mut gpu.decoder, &gpu.stream, it.route, &images, 1) {
        Ok(()) => {
            let got = read_back(&buf, it)?;
            let p = cpu_reference(plain, &it.jpeg, None)
                .ok()
                .zip(cpu_reference(cpu, &it.jpeg, None).ok())
                .map(|(want, backend)| (psnr(&got, &want), psnr(&got, &backend)));
            Ok(EdgeOutcome::Nvjpeg(p))
        }
        // The engine sends an image nvJPEG refuses or fails on to the CPU decoder (the one
        // rule: `NvjpegError::sends_image_to_cpu`).
        Err(e) if e.sends_image_to_cpu() => Ok(on_cpu(cpu)),
        Err(e) => Err(format!("nvJPEG failed (not the image's fault): {e}")),
    }
}

/// Every edge file routed as the engine would, judged by its manifest.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
pub(super) fn edge(gpu: &mut GpuUnderTest, dir: &Path) -> Result<String, String> {
    let rows = edge_manifest::read(dir).map_err(|e| e.to_string())?;
    let mut cpu = CpuDecoder::new(Limits::default()).map_err(|e| e.to_string())?;
    let mut plain = plain_decoder()?;
    let mut tally = Tally::default();
    let (mut decoded, mut refused) = (0, 0);
    for (file, expected) in &rows {
        let it = item(gpu, &mut cpu, &dir.join(file), false);
        tally.mix.add(it.route);
        let outcome = match edge_outcome(gpu, &mut cpu, &mut plain, &it) {
            Ok(o) => o,
            Err(e) => {
                tally.failures.push(format!("{file}: {e}"));
                continue;
            }
        };
        let failure = match (&outcome, expected) {
            (EdgeOutcome::Nvjpeg(Some((p, backend))), _) => {
                tally.psnr(file, *p, Some(*backend));
                None
            }
            (EdgeOutcome::Nvjpeg(None), Expected::MustReject) => Some(
                "nvJPEG decoded a file that must be rejected (the CPU decoder refuses it)".into(),
            ),
            (EdgeOutcome::Refused(why), Expected::DecodeOk) => Some(format!(
                "must decode, refused by nvJPEG and the CPU ({why})"
            )),
            (EdgeOutcome::Cpu, Expected::MustReject) => {
                Some("must be rejected, the CPU decoder decoded it".to_string())
            }
            _ => None,
        };
        match outcome {
            EdgeOutcome::Refused(_) => refused += 1,
            _ => decoded += 1,
        }
        if let Some(f) = failure {
            tally.failures.push(format!("{file}: {f}"));
        }
    }
    tally.outcome(format!(
        "{} files: {decoded} decoded, {refused} refused",
        rows.len()
    ))
}
