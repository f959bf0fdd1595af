//! The self-test's cross-process ring check: a VMM ring made here (as the daemon makes a
//! rank's ring), filled with `stoker_fill_pattern`, exported as a POSIX fd and handed to a
//! second process, this binary again as `stoker selftest-ring-reader`, which imports and maps
//! it (as a client does) and counts the bytes that differ from the pattern twice: with
//! `stoker_check_pattern` on the device and byte for byte on the host.
//!
//! # Design
//! - The fd reaches the child by inheritance (close-on-exec cleared on our copy only for the
//!   spawn), the ring's shape by arguments; the child prints one JSON line.
//! - The pattern's seed changes with every run, so a stale ring cannot pass.
//!
//! # Limitations
//! - The ring is shaped like a small training ring (3 slots of 8 images of 64x64 f32), not
//!   the size a real job asks for.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::process::{Command, Stdio};

use clap::Args;
use serde::{Deserialize, Serialize};
use stoker_kernels::augment::{pattern_byte, AugmentKernels};
use stoker_nvidia::cuda::vmm::{ring_granularity, DeviceRing};
use stoker_nvidia::cuda::{self, Device, GpuUuid};
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc};
use stoker_wire::spec::PipelineSpec;
use stoker_wire::VmmPlan;

use super::GpuUnderTest;
use crate::cli::Exit;

/// The ring's shape: slots of a training batch.
const SLOTS: usize = 3;
const BATCH: u32 = 8;
const SIDE: u32 = 64;

// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn plan(device: &Device) -> Result<VmmPlan, String> {
    let granularity = ring_granularity(device).map_err(|e| e.to_string())?;
    VmmPlan::new(&PipelineSpec::train(BATCH, SIDE), SLOTS, granularity).map_err(|e| e.to_string())
}

/// `stoker selftest-ring-reader` (internal): the second process of the ring check.
#[derive(Debug, Clone, Args)]
pub struct RingReaderArgs {
    /// The GPU's UUID.
    #[arg(long)]
    pub(crate) device: String,
    /// The inherited POSIX fd of the ring's allocation.
    #[arg(long)]
    pub(crate) fd: i32,
    /// The pattern's seed.
    #[arg(long)]
    pub(crate) seed: u32,
}

/// What the reader found (one JSON line on its stdout).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub(super) struct ReaderResult {
    pub bytes: usize,
    /// Bytes `stoker_check_pattern` counted as different.
    pub kernel_mismatches: u32,
    /// Bytes different when read back to the host.
    pub host_mismatches: usize,
}

/// Runs the ring check's second process: imports the ring from the inherited fd, checks the
/// pattern and prints a [`ReaderResult`] as one JSON line; returns the exit code.
pub fn run_reader(args: &RingReaderArgs) -> Exit {
    match read_ring(args) {
        Ok(r) => {
            println!("{}", serde_json::to_string(&r).expect("result serialises"));
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker selftest-ring-reader: {e}");
            Exit::Failure
        }
    }
}

// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
fn read_ring(args: &RingReaderArgs) -> Result<ReaderResult, String> {
    if args.fd < 3 {
        return Err(format!("--fd {} is not an inherited descriptor", args.fd));
    }
    // SAFETY: the parent passed this descriptor to us by inheritance, for us alone; it is
    // owned here from now on and nothing else in this process names it.
    let fd = unsafe { OwnedFd::from_raw_fd(args.fd) };
    let uuid: GpuUuid = args.device.parse().map_err(|e| format!("--device: {e}"))?;
    let device = Device::open(uuid).map_err(|e| e.to_string())?;
    let nvrtc = Nvrtc::global().map_err(|e| e.to_string())?;
    let cache = KernelCache::default_dir().map(KernelCache::new);
    let kernels =
        AugmentKernels::load(&device, nvrtc, cache.as_ref()).map_err(|e| e.to_string())?;
    let plan = plan(&device)?;
    let ring = DeviceRing::import(&device, &fd, plan.bytes).map_err(|e| e.to_string())?;
    drop(fd);
    let stream = device.stream().map_err(|e| e.to_string())?;
    let counter = device.alloc(4).map_err(|e| e.to_string())?;
    stream
        .copy_to_device(&counter, 0, &[0; 4])
        .map_err(|e| e.to_string())?;
    // SAFETY: the ring (mapped above) and the counter are live device memory until the
    // stream is synchronised below.
    let launched = unsafe {
        kernels.check_pattern_raw(
            &stream,
            ring.ptr(),
            ring.len() as u64,
            args.seed,
            counter.ptr(),
        )
    };
    let synced = stream.synchronize();
    launched.map_err(|e| e.to_string())?;
    synced.map_err(|e| e.to_string())?;
    let mut n = [0u8; 4];
    counter.read(&mut n).map_err(|e| e.to_string())?;
    let mut bytes = vec![0u8; ring.len()];
    let driver = cuda::driver().map_err(|e| e.to_string())?;
    // SAFETY: the ring is `len` bytes of device memory mapped read-write on this device.
    unsafe { cuda::result::memcpy_dtoh(driver, &mut bytes, ring.ptr()) }
        .map_err(|e| e.to_string())?;
    let host_mismatches = bytes
        .iter()
        .enumerate()
        .filter(|(i, &b)| b != pattern_byte(*i as u64, args.seed))
        .count();
    Ok(ReaderResult {
        bytes: ring.len(),
        kernel_mismatches: u32::from_ne_bytes(n),
        host_mismatches,
    })
}

/// A seed that differs from run to run.
fn fresh_seed() -> u32 {
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos());
    t ^ std::process::id().rotate_left(16) | 1
}

/// Fills a ring on `gpu`, has a second process check it; `Ok` names what was checked.
// String error: a failed check is one line of the selftest report, composed here from the
// failing call and printed as is.
pub(super) fn check(gpu: &GpuUnderTest) -> Result<String, String> {
    let err = |e: &dyn std::fmt::Display| e.to_string();
    let plan = plan(&gpu.device)?;
    let ring = DeviceRing::create(&gpu.device, plan.bytes).map_err(|e| err(&e))?;
    let seed = fresh_seed();
    // SAFETY: the ring is mapped read-write until the end of this function; the stream is
    // synchronised before it is read or dropped.
    let launched = unsafe {
        gpu.kernels
            .fill_pattern_raw(&gpu.stream, ring.ptr(), ring.len() as u64, seed)
    };
    let synced = gpu.stream.synchronize();
    launched.map_err(|e| err(&e))?;
    synced.map_err(|e| err(&e))?;
    let fd = ring.export_fd().map_err(|e| err(&e))?;
    let raw = fd.as_raw_fd();
    // Clears close-on-exec so the child inherits the descriptor; `fd` stays open (and owned
    // here) until the child has exited.
    if let Err(e) = rustix::io::fcntl_setfd(&fd, rustix::io::FdFlags::empty()) {
        return Err(format!("fcntl: {}", std::io::Error::from(e)));
    }
    let exe = std::env::current_exe().map_err(|e| format!("current_exe: {e}"))?;
    let out = Command::new(exe)
        .arg("selftest-ring-reader")
        .args(["--device", &gpu.device.info().uuid.to_string()])
        .args(["--fd", &raw.to_string(), "--seed", &seed.to_string()])
        .stdin(Stdio::null())
        .output()
        .map_err(|e| format!("cannot start the reader process: {e}"))?;
    drop(fd);
    let stderr = String::from_utf8_lossy(&out.stderr);
    let stdout = String::from_utf8_lossy(&out.stdout);
    let result = stdout
        .lines()
        .last()
        .and_then(|l| serde_json::from_str::<ReaderResult>(l).ok());
    let Some(r) = result.filter(|_| out.status.success()) else {
        let why = stderr.lines().last().unwrap_or("no output");
        return Err(format!("the reader process failed ({}): {why}", out.status));
    };
    let detail = format!(
        "{} bytes ({SLOTS} slots) written here, read by a second process: {} bytes off on \
         the device, {} on the host",
        ring.len(),
        r.kernel_mismatches,
        r.host_mismatches
    );
    if r.bytes == ring.len() && r.kernel_mismatches == 0 && r.host_mismatches == 0 {
        Ok(detail)
    } else {
        Err(detail)
    }
}
