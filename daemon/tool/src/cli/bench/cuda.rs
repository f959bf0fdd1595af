//! `stoker bench --backend cuda`: the GPU path's two figures on the user's data and GPU.
//!
//! - **decode only**: nvJPEG's batched decode on the hardware JPEG engines, whole images held
//!   in memory, one `--batch` at a time: the ceiling the serving path can approach. Images the
//!   engines refuse are counted in the decode mix (hybrid / cpu) and left out of the rate.
//! - **the engines with batches in flight** (`decode_streams.rs`): `--decode-streams` threads x
//!   states, whole images and the crops' regions, with the NVJPG engines' utilisation and the
//!   CPU-seconds per 1000 images per thread.
//! - **end to end**: a real `stokerd --backend cuda` serving one real client process
//!   (`stoker bench-client --device ...`) over a device ring; the client reads every byte of
//!   every batch with a kernel on its own stream and releases after it, as training would.
//!   Where the daemon cannot serve from CUDA the row says it is not available and why (the
//!   daemon's own refusal), and the run still reports the ceiling.
//!
//! CPU seconds per 1000 images count this process for decode only, and the daemon plus the
//! client for end to end. The report goes to stdout and, as JSON, to `--json`.
//!
//! # Design
//! - The device is resolved as a client resolves it (`stoker_wire::Device::resolve`: `cuda`,
//!   `cuda:N` or a UUID) and the daemon is given nothing GPU-specific: it serves the GPU the
//!   client names in ATTACH.
//! - Device buffers for decode only are allocated once per image (up to a quarter of the GPU's
//!   memory) and reused across passes: the timed loop allocates nothing.
//!
//! # Limitations
//! - Decode only waits for each batch before the next (one decoder state, one stream): a
//!   floor of the engines' rate with several batches in flight.
//! - End to end runs as many epochs as last `--min-seconds` at the ceiling's rate (the client
//!   must know its epochs before it starts): where end to end is much slower than the ceiling
//!   (the emulator, tiny images), it runs longer than that.
//! - On the emulated GPU the figures measure libjpeg-turbo and a CPU core, not a GPU; the
//!   output says so.

#![forbid(unsafe_code)]

use crate::cli::Exit;
use serde::Serialize;
use stoker_nvidia::cuda::{Device, DeviceBuffer};
use stoker_nvidia::nvjpeg::{NvjpegDecoder, NvjpegLib, Roi};
use stoker_pipeline::transform::decode::routing::Route;

use super::decode_streams::{time_streams, EngineImage, StreamsRow};
use super::*;
use crate::cli::gpu::{decode_sync, emulated_banner, route, DecodeMix, GpuImage};
use stoker_pipeline::transform::decode::{CpuDecoder, Limits};

/// One measured row, or why it was not measured.
#[derive(Debug, Clone, Default, Serialize)]
pub(super) struct CudaRow {
    pub available: bool,
    /// Why the row is not available.
    pub reason: Option<String>,
    pub images: u64,
    pub seconds: f64,
    pub images_per_s: Option<f64>,
    /// Compressed bytes consumed (decode only) or image bytes delivered (end to end), per s.
    pub mb_per_s: Option<f64>,
    pub cpu_s_per_1000: Option<f64>,
    /// End to end: the client's wait for a batch, p50 and p99, in ms.
    pub wait_p50_ms: Option<f64>,
    pub wait_p99_ms: Option<f64>,
    /// End to end: what the daemon decoded on each path, from its status.
    pub mix: Option<DecodeMix>,
    /// End to end: the daemon's mean host time in decode and device time in the kernel, per
    /// batch, in ms.
    pub decode_ms_per_batch: Option<f64>,
    pub kernel_ms_per_batch: Option<f64>,
}

impl CudaRow {
    fn unavailable(reason: String) -> CudaRow {
        CudaRow {
            reason: Some(reason),
            ..CudaRow::default()
        }
    }
}

/// Everything `stoker bench --backend cuda` measured.
#[derive(Debug, Clone, Serialize)]
pub(super) struct CudaBenchReport {
    pub dataset: String,
    pub backend: &'static str,
    /// The emulator's path when the GPU is the stoker GPU emulator.
    pub emulated: Option<String>,
    pub gpu_uuid: String,
    pub gpu_name: String,
    /// nvJPEG hardware engines x cores per engine.
    pub jpeg_engines: String,
    pub spec: PipelineSpec,
    /// Samples held in memory for decode only, and the route each took.
    pub samples: usize,
    pub mix: DecodeMix,
    pub decode_only: CudaRow,
    /// The engines with `--decode-streams` threads x batches in flight, whole and regions.
    pub decode_streams: Vec<StreamsRow>,
    /// `--blocking-sync` / `--pinned-inputs` (here and in the daemon), and the primary
    /// context's flags as the driver reports them.
    pub blocking_sync: bool,
    pub pinned_inputs: bool,
    pub context_flags: Option<u32>,
    pub end_to_end: CudaRow,
    /// End to end over decode only.
    pub fraction_of_ceiling: Option<f64>,
    /// `--hw-shares`: end to end at each share (`split.rs`).
    pub split: Option<super::split::SplitReport>,
}

pub(super) fn run(args: &BenchArgs, spec: PipelineSpec, json_path: &Path) -> Exit {
    if let Some(banner) = emulated_banner() {
        println!("{banner}");
    }
    let report = match bench_cuda(args, spec) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("stoker bench --backend cuda: {e}");
            return Exit::Failure;
        }
    };
    println!("{}", cuda_table(&report));
    let text = serde_json::to_string_pretty(&report).expect("report serialises") + "\n";
    if let Err(e) = std::fs::write(json_path, text) {
        eprintln!("stoker bench: cannot write {}: {e}", json_path.display());
        return Exit::Failure;
    }
    eprintln!("stoker bench: wrote {}", json_path.display());
    if report.decode_only.available {
        Exit::Ok
    } else {
        Exit::Failure
    }
}

// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn bench_cuda(args: &BenchArgs, spec: PipelineSpec) -> Result<CudaBenchReport, String> {
    let data =
        std::fs::canonicalize(&args.data).map_err(|e| format!("{}: {e}", args.data.display()))?;
    let resolved = stoker::client::resolve_device(args.device).map_err(|e| e.to_string())?;
    let Some(uuid) = resolved.gpu_uuid() else {
        return Err("--device cpu with --backend cuda: name a GPU".into());
    };
    super::split::check(&args.hw_shares)?;
    stoker_nvidia::cuda::set_blocking_sync(args.blocking_sync);
    let device = Device::open(uuid).map_err(|e| format!("{uuid}: {e}"))?;
    let lib = NvjpegLib::global().map_err(|e| e.to_string())?;
    let mut decoder =
        NvjpegDecoder::new(&device, lib, args.spec.batch as usize).map_err(|e| e.to_string())?;
    progress("indexing");
    let objects = stoker_pipeline::source::object::ObjectStore::from_environment();
    let (_, ds) = index_timing(&data, false, &objects).map_err(|e| e.to_string())?;
    progress(&format!(
        "decode only: nvJPEG hardware engines, batches of {}",
        args.spec.batch
    ));
    let (decode_only, decode_streams, mix, samples) =
        decode_ceiling(args, &spec, &ds, &device, &mut decoder);
    let (engines, cores) = decoder.hardware_info();
    drop(decoder);
    let end_to_end = if args.decode_only || args.in_process {
        CudaRow::unavailable("not asked for (--decode-only or --in-process)".into())
    } else {
        progress("end to end: stokerd --backend cuda + 1 client process");
        served_row(
            args,
            &resolved.to_string(),
            &data,
            &ds,
            decode_only.images_per_s,
        )
    };
    let split = super::split::run(args, |at| {
        let row = served_row(
            at,
            &resolved.to_string(),
            &data,
            &ds,
            decode_only.images_per_s,
        );
        super::split::ShareRow {
            images_per_s: row.images_per_s,
            reason: row.reason,
            mix: row.mix,
            ..Default::default()
        }
    });
    let fraction_of_ceiling = end_to_end
        .images_per_s
        .zip(decode_only.images_per_s)
        .map(|(e, d)| e / d.max(1e-9));
    Ok(CudaBenchReport {
        dataset: data.display().to_string(),
        backend: "cuda",
        emulated: stoker_nvidia::emulator::emulated_driver().map(|p| p.display().to_string()),
        gpu_uuid: uuid.to_string(),
        gpu_name: device.info().name.clone(),
        jpeg_engines: format!("{engines} x {cores}"),
        spec,
        samples,
        mix,
        decode_only,
        decode_streams,
        blocking_sync: args.blocking_sync,
        pinned_inputs: args.pinned_inputs,
        context_flags: device.context_flags().ok(),
        end_to_end,
        fraction_of_ceiling,
        split,
    })
}

/// A sample the engines take: its bytes, output size, device buffer, and the region of its
/// crop the serving path decodes where the engines take it.
struct HwImage {
    jpeg: Vec<u8>,
    width: u32,
    height: u32,
    out: DeviceBuffer,
    roi: Option<Roi>,
}

/// The samples routed, and the ones the hardware engines take in buffers of their own (up to
/// a quarter of the GPU's memory).
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn hardware_images(
    samples: Vec<(u64, Vec<u8>)>,
    (spec, seed): (&PipelineSpec, u64),
    device: &Device,
    decoder: &mut NvjpegDecoder,
) -> Result<(Vec<HwImage>, DecodeMix), String> {
    let mut cpu = CpuDecoder::new(Limits::default()).map_err(|e| e.to_string())?;
    let budget = device.info().total_memory / 4;
    let (mut used, mut mix, mut out) = (0u64, DecodeMix::default(), Vec::new());
    for (index, jpeg) in samples {
        let r = route(decoder, &jpeg, None, &cpu.limits()).route;
        mix.add(r);
        let Ok(h) = cpu.probe(&jpeg) else { continue };
        let bytes = u64::from(h.width) * u64::from(h.height) * 3;
        if r != Route::Hardware || used + bytes > budget {
            continue;
        }
        used += bytes;
        let bytes = usize::try_from(bytes).map_err(|_| format!("{bytes} bytes"))?;
        let buf = device.alloc(bytes).map_err(|e| e.to_string())?;
        let (crop, _) = stoker_pipeline::transform::augment::sample_params(
            spec, h.width, h.height, seed, 0, index,
        );
        let region = stoker_pipeline::engine::cuda::crop_region(crop, h.width, h.height);
        let roi = route(decoder, &jpeg, Some(region), &cpu.limits()).roi;
        out.push(HwImage {
            jpeg,
            width: h.width,
            height: h.height,
            out: buf,
            roi,
        });
    }
    Ok((out, mix))
}

/// The decode-only row, the rows with batches in flight, the decode mix of the samples, and
/// how many samples were loaded.
fn decode_ceiling(
    args: &BenchArgs,
    spec: &PipelineSpec,
    ds: &stoker_pipeline::source::index::Dataset,
    device: &Device,
    decoder: &mut NvjpegDecoder,
) -> (CudaRow, Vec<StreamsRow>, DecodeMix, usize) {
    let samples = load_samples(ds, args.decode_sample, args.seed);
    let n = samples.len();
    let (images, mix) = match hardware_images(samples, (spec, args.seed), device, decoder) {
        Ok(x) => x,
        Err(e) => return (CudaRow::unavailable(e), Vec::new(), DecodeMix::default(), n),
    };
    if images.is_empty() {
        let why = if decoder.has_hardware() {
            format!("no sample takes the hardware path ({mix})")
        } else {
            "this GPU has no hardware JPEG decoder (nvjpegCreateEx(HARDWARE) failed)".into()
        };
        return (CudaRow::unavailable(why), Vec::new(), mix, n);
    }
    let row = match time_decodes(args, device, decoder, &images) {
        Ok(row) => row,
        Err(e) => CudaRow::unavailable(format!("nvJPEG: {e}")),
    };
    let streams = match streams_rows(args, device, &images) {
        Ok(rows) => rows,
        Err(e) => {
            eprintln!("stoker bench: decode streams: {e}");
            Vec::new()
        }
    };
    (row, streams, mix, n)
}

/// Every `--decode-streams` configuration on whole images, then on the crops' regions (where
/// any image has one), from pinned copies of the bitstreams with `--pinned-inputs`.
// String error: one message for the user, composed at the CLI edge.
fn streams_rows(
    args: &BenchArgs,
    device: &Device,
    images: &[HwImage],
) -> Result<Vec<StreamsRow>, String> {
    let lib = NvjpegLib::global().map_err(|e| e.to_string())?;
    let pinned = if args.pinned_inputs {
        let total: usize = images.iter().map(|i| i.jpeg.len()).sum();
        let mut buf = stoker_nvidia::cuda::PinnedHostBuffer::new(device, total.max(1))
            .map_err(|e| e.to_string())?;
        let mut at = 0;
        for i in images {
            buf.as_mut_slice()[at..at + i.jpeg.len()].copy_from_slice(&i.jpeg);
            at += i.jpeg.len();
        }
        Some(buf)
    } else {
        None
    };
    let mut at = 0;
    let mut whole = Vec::with_capacity(images.len());
    for i in images {
        let jpeg = match &pinned {
            Some(p) => &p.as_slice()[at..at + i.jpeg.len()],
            None => i.jpeg.as_slice(),
        };
        at += i.jpeg.len();
        whole.push(EngineImage {
            jpeg,
            roi: None,
            width: i.width,
            out: &i.out,
        });
    }
    let regions: Vec<EngineImage<'_>> = (whole.iter().zip(images))
        .map(|(w, i)| EngineImage { roi: i.roi, ..*w })
        .collect();
    let mut sets = vec![("whole images", whole)];
    if images.iter().any(|i| i.roi.is_some()) {
        sets.push(("regions", regions));
    }
    let batch = (args.spec.batch as usize).max(1);
    let mut rows = Vec::new();
    for (what, set) in &sets {
        for &cfg in &args.decode_streams {
            progress(&format!(
                "decode only: {cfg} (threads x batches in flight), {what}"
            ));
            rows.push(time_streams(
                device,
                &lib,
                set,
                cfg,
                (batch, args.min_seconds),
            )?);
        }
    }
    Ok(rows)
}

/// Decodes `images` in batches until at least one pass and `--min-seconds` are done (after a
/// warm-up batch).
// String error: a failed run is one message for the user, composed at the CLI edge (which
// step, which file or process) and printed as is.
fn time_decodes(
    args: &BenchArgs,
    device: &Device,
    decoder: &mut NvjpegDecoder,
    images: &[HwImage],
) -> Result<CudaRow, String> {
    let stream = device.stream().map_err(|e| e.to_string())?;
    let batch = (args.spec.batch as usize).max(1);
    let gpu_images: Vec<GpuImage<'_>> = images
        .iter()
        .map(|i| GpuImage {
            jpeg: &i.jpeg,
            roi: None,
            width: i.width,
            height: i.height,
            out: &i.out,
        })
        .collect();
    let decode = |d: &mut NvjpegDecoder, chunk: &[GpuImage<'_>]| {
        decode_sync(d, &stream, Route::Hardware, chunk, batch).map_err(|e| e.to_string())
    };
    decode(decoder, &gpu_images[..batch.min(gpu_images.len())])?;
    let (cpu0, t0) = (crate::bench::process_cpu_seconds(), Instant::now());
    let (mut count, mut bytes, mut passes) = (0u64, 0u64, 0);
    while passes == 0 || t0.elapsed().as_secs_f64() < args.min_seconds {
        for chunk in gpu_images.chunks(batch) {
            decode(decoder, chunk)?;
            count += chunk.len() as u64;
            bytes += chunk.iter().map(|i| i.jpeg.len() as u64).sum::<u64>();
        }
        passes += 1;
    }
    let seconds = t0.elapsed().as_secs_f64();
    let cpu = crate::bench::process_cpu_seconds() - cpu0;
    Ok(CudaRow {
        available: true,
        reason: None,
        images: count,
        seconds,
        images_per_s: Some(count as f64 / seconds.max(1e-9)),
        mb_per_s: Some(bytes as f64 / 1e6 / seconds.max(1e-9)),
        cpu_s_per_1000: Some(cpu / count.max(1) as f64 * 1000.0),
        ..CudaRow::default()
    })
}

/// `stokerd --backend cuda` into one client process, as many epochs as last `--min-seconds`
/// at the ceiling's rate.
fn served_row(
    args: &BenchArgs,
    uuid: &str,
    data: &Path,
    ds: &stoker_pipeline::source::index::Dataset,
    ceiling: Option<f64>,
) -> CudaRow {
    let epochs = timed_epochs(
        args.epochs,
        args.min_seconds,
        ceiling.unwrap_or(1000.0),
        ds.len(),
    );
    let args = BenchArgs {
        epochs,
        ..args.clone()
    };
    let threads = effective_threads(args.threads);
    match run_served(&args, data, 1, threads, CacheState::Warm, None) {
        Ok(r) => {
            let gpu = r.gpus.iter().find(|g| g.uuid == uuid);
            CudaRow {
                available: true,
                reason: None,
                images: r.images,
                seconds: r.seconds,
                images_per_s: Some(r.images_per_s),
                mb_per_s: Some(r.mb_per_s),
                cpu_s_per_1000: r.cpu_s_per_1000,
                wait_p50_ms: Some(r.wait_p50_ms),
                wait_p99_ms: Some(r.wait_p99_ms),
                mix: gpu.map(|g| DecodeMix {
                    hardware: g.decoded_hardware,
                    hybrid: g.decoded_hybrid,
                    cpu: g.decoded_cpu,
                }),
                decode_ms_per_batch: gpu.map(|g| g.decode_ms_per_batch),
                kernel_ms_per_batch: gpu.map(|g| g.kernel_ms_per_batch),
            }
        }
        Err(e) => CudaRow::unavailable(e),
    }
}

fn cuda_table(r: &CudaBenchReport) -> String {
    let mut s = format!(
        "stoker bench {}: backend cuda on {} ({}), nvJPEG hardware engines {}, batch {}, {}\n",
        r.dataset,
        r.gpu_uuid,
        r.gpu_name,
        r.jpeg_engines,
        r.spec.batch_size,
        super::report::transform(&r.spec),
    );
    s += &format!("decode mix of {} samples: {}\n\n", r.samples, r.mix);
    s += &format!(
        "{:<48} {:>10} {:>9} {:>12}\n",
        "row", "images/s", "MB/s", "CPU s/1000"
    );
    let rows = [
        (
            "decode only: nvJPEG hardware, batched (ceiling)",
            &r.decode_only,
        ),
        (
            "end to end: stokerd --backend cuda, 1 client",
            &r.end_to_end,
        ),
    ];
    for (name, row) in rows {
        s += &match (row.images_per_s, &row.reason) {
            (Some(rate), _) => format!(
                "{name:<48} {rate:>10.1} {:>9.1} {:>12}\n",
                row.mb_per_s.unwrap_or(0.0),
                row.cpu_s_per_1000
                    .map_or("-".to_string(), |c| format!("{c:.2}")),
            ),
            (None, reason) => format!(
                "{name:<48} not available: {}\n",
                reason.as_deref().unwrap_or("unknown")
            ),
        };
    }
    s += &super::decode_streams::table(&r.decode_streams);
    if let Some(mix) = r.end_to_end.mix {
        s += &format!(
            "end to end, the daemon's decode mix: {mix}; per batch: decode {:.2} ms (host), \
             kernel {:.2} ms (device)\n",
            r.end_to_end.decode_ms_per_batch.unwrap_or(0.0),
            r.end_to_end.kernel_ms_per_batch.unwrap_or(0.0)
        );
    }
    if let Some(f) = r.fraction_of_ceiling {
        s += &format!("\nend to end / hardware decode ceiling: {f:.2}\n");
    }
    if let Some(split) = &r.split {
        s += &super::split::table(split);
    }
    if r.emulated.is_some() {
        s += "\n(EMULATED GPU: these figures say nothing about a real GPU)\n";
    }
    s
}
