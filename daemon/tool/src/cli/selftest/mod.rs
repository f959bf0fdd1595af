//! `stoker selftest --gpu`: proof, on this machine, that every GPU stoker would serve from
//! decodes and augments as the CPU does and shares rings across processes.
//!
//! For each visible GPU (by UUID): nvJPEG against the CPU decoder on `--photos` (PSNR >= 40 dB
//! for every image nvJPEG takes, every other one with a region of interest) and on `--edge`
//! files (their `MANIFEST.tsv` says which must decode and which must be refused); the fused
//! `stoker_augment` kernel against `kernels::reference` for u8/f16/bf16/f32 in NCHW and NHWC;
//! and a VMM ring exported as a POSIX fd, filled here with `stoker_fill_pattern`, checked by a
//! second process (this binary again, `stoker selftest-ring-reader`) with
//! `stoker_check_pattern` and a byte-for-byte read. Prints one table row per check, writes the
//! report as JSON with `--json`, exits 1 if any check failed.
//!
//! # Design
//! - A check that cannot run (no NVRTC, no nvJPEG, a GPU that does not open) is a failed check
//!   naming the reason, never a skipped one: the self-test passes only when everything ran.
//! - On the emulated GPU (tests/gpu-emulator) the output says so first and the JSON carries
//!   `emulated`: it proves the code paths, not a GPU.
//! - Kernels are compiled by NVRTC once per architecture and cached on disk
//!   (`KernelCache::default_dir()`), so the second process does not compile again.
//!
//! # Limitations
//! - Decodes one batch at a time, synchronously: this measures correctness, not speed
//!   (`stoker bench --backend cuda` measures speed).
//! - Failing images are named in the report; their pixels are written out (as PPM) only
//!   with `--save-failures DIR`.

mod decode;
mod kernels;
mod ring;

use std::path::PathBuf;

use clap::Args;
use serde::Serialize;
use stoker_kernels::augment::AugmentKernels;
use stoker_nvidia::cuda::{self, Device, DeviceInfo, Stream};
use stoker_nvidia::nvjpeg::{NvjpegDecoder, NvjpegLib};
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc};

use super::gpu::emulated_banner;
use super::Exit;

pub use ring::{run_reader, RingReaderArgs};

/// Arguments of `stoker selftest`.
#[derive(Debug, Clone, Args)]
pub struct SelftestArgs {
    /// Check the GPUs (the only self-test so far; required).
    #[arg(long)]
    pub(crate) gpu: bool,
    /// JPEGs to decode with nvJPEG and with the CPU decoder (a folder, searched recursively).
    #[arg(long)]
    pub(crate) photos: Option<PathBuf>,
    /// Edge-case JPEGs with a MANIFEST.tsv (columns `file` and `expected`: "decode OK",
    /// "must be rejected with a clear error", "may be rejected").
    #[arg(long)]
    pub(crate) edge: Option<PathBuf>,
    /// Only these GPUs (UUIDs, comma-separated); default every visible one.
    #[arg(long, value_delimiter = ',')]
    pub(crate) device: Vec<String>,
    /// At most this many photos (0: all).
    #[arg(long, default_value_t = 0)]
    pub(crate) max_photos: usize,
    /// Output side of the kernel checks.
    #[arg(long, default_value_t = 224)]
    pub(crate) kernel_size: u32,
    /// Write the pixels of every photo below 40 dB here, as PPM: NAME.nvjpeg.ppm and
    /// NAME.cpu.ppm (created if missing).
    #[arg(long)]
    pub(crate) save_failures: Option<PathBuf>,
    /// Write the report as JSON to this file.
    #[arg(long)]
    pub(crate) json: Option<PathBuf>,
}

/// The largest batch the self-test decodes at once.
pub(crate) const MAX_BATCH: usize = 64;

/// One check's outcome.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct Check {
    /// The GPU's UUID ("" for checks before any GPU).
    pub gpu: String,
    pub name: String,
    pub pass: bool,
    pub detail: String,
}

/// A GPU as the report names it.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct GpuEntry {
    pub uuid: String,
    pub name: String,
    pub compute_capability: String,
    pub memory_mib: u64,
    pub posix_fd_sharing: bool,
}

/// Everything the self-test found.
#[derive(Debug, Clone, Serialize)]
pub(crate) struct SelftestReport {
    /// "pass" or "fail".
    pub result: &'static str,
    /// The emulator's path when the GPU is the stoker GPU emulator.
    pub emulated: Option<String>,
    pub driver_version: Option<String>,
    pub nvjpeg_version: Option<String>,
    pub nvrtc_version: Option<String>,
    pub gpus: Vec<GpuEntry>,
    pub checks: Vec<Check>,
}

impl SelftestReport {
    fn failed(&self) -> usize {
        self.checks.iter().filter(|c| !c.pass).count()
    }
}

/// What every check of one GPU uses.
pub(crate) struct GpuUnderTest {
    pub device: Device,
    pub stream: Stream,
    pub kernels: AugmentKernels,
    pub decoder: NvjpegDecoder,
}

/// Runs `stoker selftest`: the GPU checks, a line each; returns the exit code (failure if a
/// check failed).
pub fn run(args: &SelftestArgs) -> Exit {
    if !args.gpu {
        eprintln!("stoker selftest: only the GPU self-test exists so far; give --gpu");
        return Exit::Usage;
    }
    for dir in [&args.photos, &args.edge].into_iter().flatten() {
        if !dir.is_dir() {
            eprintln!("stoker selftest: {}: no such folder", dir.display());
            return Exit::Usage;
        }
    }
    if let Some(banner) = emulated_banner() {
        println!("{banner}");
    }
    let report = selftest(args);
    println!("{}", table(&report));
    if let Some(path) = &args.json {
        let text = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
        if let Err(e) = std::fs::write(path, text) {
            eprintln!("stoker selftest: cannot write {}: {e}", path.display());
            return Exit::Failure;
        }
    }
    if report.failed() == 0 {
        Exit::Ok
    } else {
        Exit::Failure
    }
}

fn selftest(args: &SelftestArgs) -> SelftestReport {
    let mut report = SelftestReport {
        result: "fail",
        emulated: stoker_nvidia::emulator::emulated_driver().map(|p| p.display().to_string()),
        driver_version: None,
        nvjpeg_version: None,
        nvrtc_version: None,
        gpus: Vec::new(),
        checks: Vec::new(),
    };
    let fail = |report: &mut SelftestReport, name: &str, detail: String| {
        report.checks.push(Check {
            gpu: String::new(),
            name: name.into(),
            pass: false,
            detail,
        });
    };
    let info = match cuda::probe() {
        Ok(i) => i,
        Err(e) => {
            fail(&mut report, "CUDA driver", e.to_string());
            return report;
        }
    };
    let v = info.driver_version;
    report.driver_version = Some(format!("{}.{}", v / 1000, (v % 1000) / 10));
    let lib = NvjpegLib::global();
    match &lib {
        Ok(l) => {
            let (a, b, c) = l.version();
            report.nvjpeg_version = Some(format!("{a}.{b}.{c}"));
        }
        Err(e) => fail(&mut report, "nvJPEG", e.to_string()),
    }
    let nvrtc = Nvrtc::global();
    match &nvrtc {
        Ok(n) => report.nvrtc_version = Some(format!("{}.{}", n.version().0, n.version().1)),
        Err(e) => fail(&mut report, "NVRTC", e.to_string()),
    }
    let wanted: Vec<&DeviceInfo> = info
        .devices
        .iter()
        .filter(|d| args.device.is_empty() || args.device.contains(&d.uuid.to_string()))
        .collect();
    if wanted.is_empty() {
        let seen: Vec<String> = info.devices.iter().map(|d| d.uuid.to_string()).collect();
        let detail = format!("none of {:?} is visible (visible: {seen:?})", args.device);
        fail(&mut report, "GPU selection", detail);
    }
    for dev in wanted {
        report.gpus.push(GpuEntry {
            uuid: dev.uuid.to_string(),
            name: dev.name.clone(),
            compute_capability: format!(
                "{}.{}",
                dev.compute_capability.0, dev.compute_capability.1
            ),
            memory_mib: dev.total_memory >> 20,
            posix_fd_sharing: dev.posix_fd_sharing,
        });
        if let (Ok(lib), Ok(nvrtc)) = (&lib, &nvrtc) {
            report
                .checks
                .extend(check_gpu(args, dev, lib.clone(), nvrtc));
        }
    }
    if report.failed() == 0 && !report.checks.is_empty() {
        report.result = "pass";
    }
    report
}

/// Every check of one GPU; a GPU that cannot be set up is one failed check.
fn check_gpu(
    args: &SelftestArgs,
    info: &DeviceInfo,
    lib: std::sync::Arc<NvjpegLib>,
    nvrtc: &Nvrtc,
) -> Vec<Check> {
    let uuid = info.uuid.to_string();
    eprintln!("stoker selftest: {uuid} ({})", info.name);
    // String error: a failed check is one line of the selftest report, composed here from the
    // failing call and printed as is.
    let setup = || -> Result<GpuUnderTest, String> {
        let device = Device::open(info.uuid).map_err(|e| e.to_string())?;
        let cache = KernelCache::default_dir().map(KernelCache::new);
        let kernels = AugmentKernels::load(&device, nvrtc, cache.as_ref())
            .map_err(|e| format!("augment.cu: {e}"))?;
        let decoder =
            NvjpegDecoder::new(&device, lib, MAX_BATCH).map_err(|e| format!("nvJPEG: {e}"))?;
        let stream = device.stream().map_err(|e| e.to_string())?;
        Ok(GpuUnderTest {
            device,
            stream,
            kernels,
            decoder,
        })
    };
    // String error: a failed check is one line of the selftest report, composed here from the
    // failing call and printed as is.
    let check = |name: &str, outcome: Result<String, String>| Check {
        gpu: uuid.clone(),
        name: name.into(),
        pass: outcome.is_ok(),
        detail: outcome.unwrap_or_else(|e| e),
    };
    let mut gpu = match setup() {
        Ok(g) => g,
        Err(e) => return vec![check("setup (context, NVRTC, nvJPEG)", Err(e))],
    };
    let (engines, cores) = gpu.decoder.hardware_info();
    let mut checks = vec![check(
        "setup (context, NVRTC, nvJPEG)",
        Ok(format!(
            "augment.cu loaded; nvJPEG hardware engines {engines} x {cores} cores{}",
            if gpu.decoder.has_hardware() {
                ""
            } else {
                " (none: GPU cores decode)"
            }
        )),
    )];
    let mut photos = Vec::new();
    if let Some(dir) = &args.photos {
        photos = decode::photo_files(dir, args.max_photos);
        checks.push(check(
            &format!("nvJPEG vs CPU decoder: {} photos", photos.len()),
            decode::photos(&mut gpu, &photos, args.save_failures.as_deref()),
        ));
    }
    if let Some(dir) = &args.edge {
        checks.push(check(
            "nvJPEG vs CPU decoder: edge files",
            decode::edge(&mut gpu, dir),
        ));
    }
    for (name, outcome) in kernels::augment(&gpu, &photos, args.kernel_size) {
        checks.push(check(&name, outcome));
    }
    checks.push(check(
        "ring: VMM fd read by a second process",
        ring::check(&gpu),
    ));
    checks
}

fn table(report: &SelftestReport) -> String {
    let mut out = String::new();
    let versions = format!(
        "driver {}, nvJPEG {}, NVRTC {}",
        report.driver_version.as_deref().unwrap_or("-"),
        report.nvjpeg_version.as_deref().unwrap_or("-"),
        report.nvrtc_version.as_deref().unwrap_or("-"),
    );
    out += &format!(
        "stoker selftest --gpu: {} GPU(s); {versions}\n",
        report.gpus.len()
    );
    for g in &report.gpus {
        out += &format!(
            "  {}  {}  sm {}  {} MiB  POSIX-fd sharing {}\n",
            g.uuid,
            g.name,
            g.compute_capability,
            g.memory_mib,
            if g.posix_fd_sharing { "yes" } else { "no" }
        );
    }
    out += &format!("\n{:<42} {:<46} {:<6} detail\n", "GPU", "check", "result");
    for c in &report.checks {
        let gpu = if c.gpu.is_empty() { "-" } else { &c.gpu };
        let result = if c.pass { "pass" } else { "FAIL" };
        out += &format!("{gpu:<42} {:<46} {result:<6} {}\n", c.name, c.detail);
    }
    let failed = report.failed();
    out += &if failed == 0 && report.result == "pass" {
        format!("\nselftest: PASS ({} checks)", report.checks.len())
    } else {
        format!(
            "\nselftest: FAIL ({failed} of {} checks failed)",
            report.checks.len()
        )
    };
    if report.emulated.is_some() {
        out += " on the EMULATED GPU";
    }
    out
}
