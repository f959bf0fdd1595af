//! `stoker bench-client` (hidden): one real client process for `stoker bench`. Attaches with
//! the Rust client, consumes every batch of the job reading every byte of every image (as a
//! training step would copy it to the GPU), and prints its figures as one JSON line on stdout.

use std::path::PathBuf;
use std::time::Instant;

use clap::Args;
use serde::Serialize;
use stoker::client::{AttachOptions, Client, ClientError, ConsumerStream, DeviceSlice};
use stoker_kernels::augment::AugmentKernels;
use stoker_nvidia::cuda::{Device, DeviceBuffer, Stream};
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc};
use stoker_wire::spec::PipelineSpec;

use super::bench::SpecArgs;
use super::Exit;

/// Arguments of `stoker bench-client`, which `stoker bench` passes to each client process.
#[derive(Debug, Args)]
pub struct BenchClientArgs {
    #[arg(long)]
    pub(crate) socket: PathBuf,
    /// Dataset path, as the daemon should open it.
    #[arg(long)]
    pub(crate) data: String,
    #[arg(long)]
    pub(crate) job: String,
    #[arg(long, default_value_t = 0)]
    pub(crate) rank: u32,
    #[arg(long, default_value_t = 1)]
    pub(crate) world: u32,
    #[arg(long, default_value_t = 0)]
    pub(crate) seed: u64,
    /// Epochs consumed before timing starts.
    #[arg(long, default_value_t = 1)]
    pub(crate) warmup: u64,
    #[arg(long, default_value_t = 2)]
    pub(crate) epochs: u64,
    /// Where the batches go: `cpu` (host memory, every byte read here), or `cuda`, `cuda:N`, a
    /// GPU UUID (device memory, every byte read by a kernel on this process's stream).
    #[arg(long, default_value = "cpu")]
    pub(crate) device: stoker_wire::Device,
    #[command(flatten)]
    pub(crate) spec: SpecArgs,
    /// The whole spec as JSON, in place of the spec flags (`stoker bench --recipe` passes its
    /// views and operations this way).
    #[arg(long, hide = true)]
    pub(crate) spec_json: Option<String>,
}

/// What one client measured (printed as JSON).
#[derive(Debug, Clone, Serialize, serde::Deserialize)]
pub(crate) struct ClientStats {
    pub rank: u32,
    /// Every image received, warm-up included.
    pub images_all: u64,
    /// Images and bytes received in the timed epochs.
    pub images: u64,
    pub bytes: u64,
    pub seconds: f64,
    /// Time blocked in `next_batch` for each timed batch, in ms.
    pub waits_ms: Vec<f64>,
    pub cpu_s: f64,
    pub peak_rss_mb: f64,
    /// Sum of every delivered byte, so that no read can be optimised away.
    pub checksum: u64,
}

/// Runs one client process of `stoker bench`: consumes the job and prints its
/// measurements as one JSON line; returns the exit code.
pub fn run(args: &BenchClientArgs) -> Exit {
    match consume(args) {
        Ok(stats) => {
            println!(
                "{}",
                serde_json::to_string(&stats).expect("stats serialise")
            );
            Exit::Ok
        }
        Err(e) => {
            eprintln!("stoker bench-client rank {}: {e}", args.rank);
            Exit::Failure
        }
    }
}

/// The spec this client attaches with: `--spec-json` if given, else the spec flags, for
/// the warm-up and timed epochs.
pub(crate) fn client_spec(args: &BenchClientArgs) -> Result<PipelineSpec, ClientError> {
    let base = match &args.spec_json {
        Some(json) => serde_json::from_str(json)
            .map_err(|e| ClientError::Invalid(format!("--spec-json: {e}")))?,
        None => args.spec.spec(),
    };
    Ok(PipelineSpec {
        // More epochs than a u32 holds never end: saturate rather than wrap.
        epochs: Some(u32::try_from(args.warmup + args.epochs).unwrap_or(u32::MAX)),
        ..base
    })
}

fn consume(args: &BenchClientArgs) -> Result<ClientStats, stoker::client::ClientError> {
    let spec = client_spec(args)?;
    let mut opts = AttachOptions::new(args.job.clone(), args.data.clone(), spec);
    opts.rank = args.rank;
    opts.world_size = args.world;
    opts.seed = args.seed;
    opts.device = args.device;
    let gpu = GpuReader::for_device(&args.device)?;
    let mut client = Client::attach(&args.socket, opts)?;
    let mut start = Instant::now();
    let mut timing = args.warmup == 0;
    let (mut images_all, mut images, mut bytes, mut checksum) = (0u64, 0u64, 0u64, 0u64);
    let mut waits_ms = Vec::new();
    loop {
        let t0 = Instant::now();
        let Some(batch) = client.next_batch()? else {
            break;
        };
        let waited = t0.elapsed().as_secs_f64() * 1e3;
        let len = match (&gpu, batch.device_images()) {
            (Some(g), Some(d)) => {
                g.read(&batch, d)?;
                d.bytes
            }
            _ => {
                checksum = checksum.wrapping_add(read_host(batch.images()));
                batch.images().len()
            }
        };
        images_all += batch.n() as u64;
        if batch.epoch() >= args.warmup {
            if !timing {
                // The first timed batch: time from when it was asked for.
                timing = true;
                start = t0;
            }
            images += batch.n() as u64;
            bytes += len as u64;
            waits_ms.push(waited);
        }
        batch.release()?;
    }
    if let Some(g) = &gpu {
        checksum = g.finish()?;
    }
    Ok(ClientStats {
        rank: args.rank,
        images_all,
        images,
        bytes,
        seconds: start.elapsed().as_secs_f64(),
        waits_ms,
        cpu_s: crate::bench::process_cpu_seconds(),
        peak_rss_mb: crate::bench::peak_rss_mb(None).unwrap_or(0.0),
        checksum,
    })
}

/// Reads every byte of host images (a training step copies the whole batch to the GPU);
/// returns their sum, so the reads cannot be optimised away.
fn read_host(data: &[u8]) -> u64 {
    let mut sum = 0u64;
    for c in data.chunks_exact(8) {
        sum = sum.wrapping_add(u64::from_ne_bytes(c.try_into().expect("8 bytes")));
    }
    for &b in data.chunks_exact(8).remainder() {
        sum = sum.wrapping_add(u64::from(b));
    }
    sum
}

/// Reads device batches on the GPU, as a training step would: `stoker_check_pattern` reads
/// every byte of the images on this process's stream, and the batch's release waits for it
/// (the client records an event on that stream and sends RELEASE once it completed).
struct GpuReader {
    device: Device,
    stream: Stream,
    kernels: AugmentKernels,
    /// The kernel's counter of bytes that differ from its pattern: a checksum of sorts.
    counter: DeviceBuffer,
}

impl GpuReader {
    /// `None` for `cpu`; else the GPU this process will attach with, ready to read.
    fn for_device(device: &stoker_wire::Device) -> Result<Option<GpuReader>, ClientError> {
        let Some(uuid) = stoker::client::resolve_device(*device)
            .map_err(ClientError::Device)?
            .gpu_uuid()
        else {
            return Ok(None);
        };
        let invalid = |e: &dyn std::fmt::Display| ClientError::Invalid(format!("{uuid}: {e}"));
        let device = Device::open(uuid).map_err(|e| invalid(&e))?;
        let nvrtc = Nvrtc::global().map_err(|e| invalid(&e))?;
        let cache = KernelCache::default_dir().map(KernelCache::new);
        let kernels =
            AugmentKernels::load(&device, nvrtc, cache.as_ref()).map_err(|e| invalid(&e))?;
        let stream = device.stream().map_err(|e| invalid(&e))?;
        let counter = device.alloc(4).map_err(|e| invalid(&e))?;
        stream
            .copy_to_device(&counter, 0, &[0; 4])
            .map_err(|e| invalid(&e))?;
        Ok(Some(GpuReader {
            device,
            stream,
            kernels,
            counter,
        }))
    }

    fn read(&self, batch: &stoker::client::Batch, d: DeviceSlice) -> Result<(), ClientError> {
        let invalid = |e: &dyn std::fmt::Display| ClientError::Invalid(e.to_string());
        self.device.bind().map_err(|e| invalid(&e))?;
        // SAFETY: the batch's images are `d.bytes` of the mapped ring, leased to us until the
        // release, which waits for the event recorded on this stream after the kernel; the
        // counter lives as long as `self`, whose stream is synchronised in `finish`.
        unsafe {
            self.kernels.check_pattern_raw(
                &self.stream,
                d.ptr,
                d.bytes as u64,
                0,
                self.counter.ptr(),
            )
        }
        .map_err(|e| invalid(&e))?;
        batch.record_stream(ConsumerStream(self.stream.raw() as usize));
        Ok(())
    }

    /// Waits for every read; returns the counter.
    fn finish(&self) -> Result<u64, ClientError> {
        let invalid = |e: &dyn std::fmt::Display| ClientError::Invalid(e.to_string());
        self.stream.synchronize().map_err(|e| invalid(&e))?;
        let mut n = [0u8; 4];
        self.counter.read(&mut n).map_err(|e| invalid(&e))?;
        Ok(u64::from(u32::from_ne_bytes(n)))
    }
}
