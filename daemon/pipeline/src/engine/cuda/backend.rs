//! Filling one batch on a GPU: read, probe, draw crops, route each image (hardware / hybrid /
//! CPU), decode, one fused augment launch into the slot, an event (see the parent module).
//! Uploads go from pinned host memory (`staging`).

mod mix;
mod ops;
mod pool;
mod slots;
mod split;
mod staging;
mod views;

use crate::sync::lock;
pub use pool::{DEFAULT_HYBRID_THREADS, MAX_HYBRID_THREADS};
use slots::InFlight;
use staging::HostStaging;
use std::cell::RefCell;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use stoker_kernels::augment::{AugmentBatch, AugmentSample};
use stoker_nvidia::cuda::{CudaError, DeviceBuffer, Stream};
use stoker_nvidia::nvjpeg::{DeviceImage, NvjpegDecoder, NvjpegError, Roi};
use stoker_wire::ring::SlotLayout;

use super::pending::{EventPool, EventSet, Failed, PendingBatch};
use super::{breaks_context, Gpu, BATCHES_IN_FLIGHT_PER_WORKER};
use crate::engine::backend::{
    Backend, BackendFault, BackendKind, Completion, SampleOutcome, SampleWork, SlotImages, UnitWork,
};
use crate::engine::cpu::{too_large, CpuBackend, Sample};
use crate::engine::{EngineConfig, PipelineError};
use crate::ratelimit::{Admit, RateLimit};
use crate::transform::augment::{sample_params, CropBox};
use crate::transform::badsample::BadSample;
use crate::transform::decode::probe_image;
use crate::transform::decode::routing::{route_image, Route, Routed};

/// Device allocations are aligned to this within the scratch.
const SCRATCH_ALIGN: usize = 256;

/// Bound of one batch's scratch for decoded images (one per batch in flight, two workers per
/// GPU): 1 GiB holds a batch of 256 whole 1.3-megapixel images (random-resized crops decode
/// only their region); images past it in a batch take the CPU path, so a batch of huge photos
/// costs CPU time, never the rank.
const MAX_SCRATCH_BYTES: usize = 1 << 30;

/// nvJPEG failures in a row on the hardware engines (not bad images, not CUDA errors) after
/// which a worker stops sending them images: a failing engine costs a failed call per image
/// before its image reaches the CPU path, so repeated failures switch it off for good.
const HARDWARE_FAILURES_BEFORE_OFF: u32 = 4;

/// One image of a batch, planned: its route (the decoder [`route`] chose, or the reason it
/// is a bad sample), its crop and the region nvJPEG decodes.
#[derive(Debug, Clone)]
struct Planned {
    route: Result<Route, BadSample>,
    crop: CropBox,
    flip: bool,
    /// Decoded region in image pixels (the whole image when `None`).
    roi: Option<Roi>,
    /// A progressive file (the decoupled decoder that takes it).
    progressive: bool,
    /// The whole image's pixels (its decoupled decoder: `pool`).
    pixels: u64,
    width: u32,
    height: u32,
    /// Offset of the decoded region in the scratch.
    offset: usize,
    /// Place of a CPU-path image in `host_images` (set by `decode_cpu`).
    host: usize,
}

/// One worker's GPU tools: a stream, an nvJPEG decoder, the CPU backend (reads, the CPU
/// path, replacements), scratch for decoded images and the kernel's sample array.
pub struct CudaBackend {
    gpu: Arc<Gpu>,
    // Field order: everything using the stream's work goes before the stream; the decoder
    // and the states made from it before the device (they bind the context on drop). The
    // pool first: its threads end (their streams' work done) before what they write goes.
    /// The batched non-engine decode's threads, started at the first image for them.
    pool: Option<pool::HybridPool>,
    /// Used in turn, one per batch this worker has in flight (`slots`).
    in_flight: Vec<InFlight>,
    next: usize,
    decoder: NvjpegDecoder,
    /// The scratch of the batch being filled (its slot's, swapped in for the batch).
    scratch: Option<DeviceBuffer>,
    samples_dev: Option<DeviceBuffer>,
    ops: ops::OpsState,
    events: EventPool,
    stream: Stream,
    cpu: CpuBackend,
    plan: Vec<Planned>,
    samples: Vec<AugmentSample>,
    /// Host images of the CPU path, `image_bytes` each, uploaded after the launch.
    host_images: Vec<u8>,
    zeros: Vec<u8>,
    /// Pinned memory of the replacements' and cleared samples' uploads (`put_sample`).
    sample_staging: RefCell<HostStaging>,
    /// nvJPEG failures in a row on the hardware engines ([`HARDWARE_FAILURES_BEFORE_OFF`]).
    hardware_failures: u32,
    /// `cuda.pinned_inputs`: the engines read the bitstreams from the slot's pinned copy.
    pinned_inputs: bool,
    /// `cuda.hw_decode_share` (`split`).
    hw_share: f64,
    /// `cuda.hybrid_threads` and `cuda.hybrid_huffman_threshold` (`pool`).
    hybrid_threads: usize,
    huffman_threshold: u64,
    /// The log of nvJPEG failing on images (a few lines a second, then a count).
    failure_log: RateLimit,
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("gpu", &self.gpu.label)
            .field("in_flight", &self.in_flight.len())
            .field("hardware_failures", &self.hardware_failures)
            .finish_non_exhaustive()
    }
}

impl CudaBackend {
    /// One worker's backend on `gpu`: its stream, decoder and buffers.
    pub fn new(gpu: Arc<Gpu>, config: &EngineConfig) -> Result<CudaBackend, PipelineError> {
        let fault = |what: &str, e: &dyn std::fmt::Display| gpu.fault(what, e, false);
        let stream = gpu
            .device()
            .stream()
            .map_err(|e| PipelineError::Backend(fault("cannot create a stream", &e)))?;
        let max_batch = stoker_wire::spec::MAX_BATCH_SIZE as usize;
        let nvjpeg = |e: NvjpegError| PipelineError::Backend(fault("cannot set up nvJPEG", &e));
        let pinned = |e: CudaError| PipelineError::Backend(fault("cannot set up staging", &e));
        let decoder =
            NvjpegDecoder::new(gpu.device(), gpu.nvjpeg.clone(), max_batch).map_err(nvjpeg)?;
        let in_flight = (0..BATCHES_IN_FLIGHT_PER_WORKER)
            .map(|_| {
                let hardware = decoder.hardware_batch_state().map_err(nvjpeg)?;
                InFlight::new(gpu.device(), hardware).map_err(pinned)
            })
            .collect::<Result<_, PipelineError>>()?;
        let sample_staging = RefCell::new(HostStaging::new(gpu.device()).map_err(pinned)?);
        Ok(CudaBackend {
            pool: None,
            in_flight,
            next: 0,
            decoder,
            scratch: None,
            samples_dev: None,
            ops: ops::OpsState::default(),
            events: Arc::new(Mutex::new(Vec::new())),
            stream,
            cpu: CpuBackend::new(config)?,
            plan: Vec::new(),
            samples: Vec::new(),
            host_images: Vec::new(),
            zeros: Vec::new(),
            sample_staging,
            hardware_failures: 0,
            pinned_inputs: config.cuda.pinned_inputs,
            hw_share: config.cuda.hw_decode_share,
            hybrid_threads: config.cuda.hybrid_threads,
            huffman_threshold: config.cuda.hybrid_huffman_threshold,
            failure_log: RateLimit::new(2),
            gpu,
        })
    }

    fn fault(&self, what: &str, e: &CudaError) -> BackendFault {
        self.gpu.fault(what, e, breaks_context(e))
    }

    /// A failure of nvJPEG itself (not of an image) as the batch's fault.
    fn nvjpeg_fault(&self, e: NvjpegError) -> BackendFault {
        match e {
            NvjpegError::Cuda(c) => self.fault("nvJPEG decode", &c),
            other => self.gpu.fault("nvJPEG decode", &other, false),
        }
    }

    /// Routes and crops every sample of the unit (after the read).
    fn plan_unit(&mut self, unit: &UnitWork<'_>) {
        let reads = self.cpu.read_unit(unit);
        let spec = &unit.job.spec;
        let clamp = matches!(spec.crop, stoker_wire::spec::Crop::RandomResized { .. });
        let max_file_bytes = unit.config.limits.max_file_bytes;
        self.plan.clear();
        for (k, read) in reads.into_iter().enumerate() {
            let index = unit.indices[k];
            let data = &self.cpu.bufs[k];
            let header = match (too_large(&unit.job.dataset, index, max_file_bytes), read) {
                (Some(bad), _) => Err(bad),
                (None, Err(e)) => Err(BadSample::from(&e)),
                (None, Ok(())) => probe_image(data).map_err(BadSample::from),
            };
            let header = match header {
                Ok(h) => h,
                Err(bad) => {
                    self.plan.push(Planned::bad(bad));
                    continue;
                }
            };
            let (w, h) = (header.width, header.height);
            let (crop, flip) = sample_params(spec, w, h, unit.job.seed, unit.pos.epoch, index);
            let roi = clamp.then(|| crop_region(crop, w, h));
            // Over the limits: the CPU decoder refuses it with the CPU backend's reason. The
            // region decoded may be the whole image (the engines refused the crop's).
            let routed = if spec.exif_orientation && header.orientation != 1 {
                // nvJPEG's output is not turned: the CPU route turns the region it decodes.
                Routed {
                    route: Route::Cpu,
                    roi,
                    progressive: false,
                }
            } else {
                route_image(&mut self.decoder, data, roi, &unit.config.limits)
            };
            let roi = routed.roi;
            let (rw, rh) = roi.map_or((w, h), |r| (r.width, r.height));
            self.plan.push(Planned {
                route: Ok(routed.route),
                crop,
                flip,
                roi,
                progressive: routed.progressive,
                pixels: u64::from(w) * u64::from(h),
                width: rw,
                height: rh,
                offset: 0,
                host: 0,
            });
        }
        self.split_hardware();
    }

    /// Lays the decoded regions out in the scratch, growing it (after the stream's work on
    /// the old one is done) when the batch needs more.
    fn place(&mut self) -> Result<(), CudaError> {
        let mut at = 0usize;
        for p in self.plan.iter_mut() {
            if matches!(p.route, Ok(Route::Hardware | Route::Hybrid)) {
                let bytes = p.width as usize * p.height as usize * 3;
                let bytes = bytes.div_ceil(SCRATCH_ALIGN) * SCRATCH_ALIGN;
                if at + bytes > MAX_SCRATCH_BYTES {
                    // The scratch is bounded: what does not fit takes the CPU path.
                    p.route = Ok(Route::Cpu);
                    continue;
                }
                p.offset = at;
                at += bytes;
            }
        }
        self.gpu.grow(&self.stream, &mut self.scratch, at)
    }

    /// Where image `k` of the plan is decoded to.
    fn out(&self, k: usize) -> DeviceImage {
        let p = &self.plan[k];
        let base = self.scratch.as_ref().map_or(0, |b| b.ptr());
        DeviceImage {
            ptr: base + p.offset as u64,
            pitch: p.width as usize * 3,
        }
    }

    /// Decodes the hardware images with one batched call on `state`, then the hybrid ones on
    /// the pool (`pool`); an image nvJPEG fails on goes to the CPU path.
    fn decode_gpu(&mut self, mine: &mut InFlight) -> Result<(), BackendFault> {
        let hw: Vec<usize> = self.routed(Route::Hardware);
        if !hw.is_empty() && !self.decoder.has_hardware() {
            // Switched off after repeated failures: they take the CPU path.
            hw.iter().for_each(|&k| self.plan[k].route = Ok(Route::Cpu));
        } else if !hw.is_empty() {
            match self.decode_hardware(mine, &hw) {
                // One image the engines fail on (a bad image, or nvJPEG failing while it
                // decodes): decode the others one by one, so only that one goes to the CPU
                // path.
                Err(e) if e.sends_image_to_cpu() && hw.len() > 1 => {
                    self.nvjpeg_failure(&e, &hw, Route::Hardware)?;
                    for &k in &hw {
                        if !self.decoder.has_hardware() {
                            self.plan[k].route = Ok(Route::Cpu);
                            continue;
                        }
                        let r = self.decode_hardware(mine, &[k]);
                        self.settle_nvjpeg(r, &[k], Route::Hardware)?;
                    }
                }
                r => self.settle_nvjpeg(r, &hw, Route::Hardware)?,
            }
        }
        // The engines' batch is enqueued: the pool decodes the rest meanwhile.
        self.decode_on_pool()
    }

    /// Enqueues images `ks` of the plan on the hardware engines with the slot's state.
    fn decode_hardware(&mut self, mine: &mut InFlight, ks: &[usize]) -> Result<(), NvjpegError> {
        let InFlight {
            hardware, inputs, ..
        } = mine;
        let Some(state) = hardware.as_mut() else {
            return Err(NvjpegError::Invalid("no hardware decoder".into()));
        };
        let mut jpegs: Vec<&[u8]> = ks.iter().map(|&k| self.cpu.bufs[k].as_slice()).collect();
        if self.pinned_inputs {
            jpegs = slots::pin_inputs(self.gpu.device(), state, inputs, &jpegs)?;
        }
        let rois: Vec<Option<Roi>> = ks.iter().map(|&k| self.plan[k].roi).collect();
        let outs: Vec<DeviceImage> = ks.iter().map(|&k| self.out(k)).collect();
        // SAFETY: each output is a region of the batch's scratch sized height * pitch (`place`),
        // which lives until the stream's work on it is done (it is only replaced after a
        // synchronise) and which the kernels of its slot's last batch have read (`slots`); the
        // bitstreams are this batch's read buffers (or their pinned copies), which `fill` keeps
        // with `state` and writes again only after `state`'s decode has run; each image was
        // accepted by `hardware_supports` with its ROI.
        unsafe {
            self.decoder
                .decode_hardware_batch_in(state, &self.stream, &jpegs, &rois, &outs)
        }
    }

    fn routed(&self, route: Route) -> Vec<usize> {
        (0..self.plan.len())
            .filter(|&k| self.plan[k].route == Ok(route))
            .collect()
    }

    /// An nvJPEG call's outcome for images `ks` on `path`: images it refused or failed on go
    /// to the CPU path (which decodes them or says why not); a CUDA error is a fault.
    fn settle_nvjpeg(
        &mut self,
        r: Result<(), NvjpegError>,
        ks: &[usize],
        path: Route,
    ) -> Result<(), BackendFault> {
        let e = match r {
            Ok(()) => {
                if path == Route::Hardware {
                    self.hardware_failures = 0;
                }
                return Ok(());
            }
            Err(NvjpegError::Cuda(e)) => return Err(self.fault("nvJPEG decode", &e)),
            Err(e) if !e.sends_image_to_cpu() => {
                return Err(self.gpu.fault("nvJPEG decode", &e, false))
            }
            Err(e) => e,
        };
        self.nvjpeg_failure(&e, ks, path)?;
        for &k in ks {
            self.plan[k].route = Ok(Route::Cpu);
        }
        Ok(())
    }

    /// nvJPEG's own failure on images `ks` (EXECUTION_FAILED, INTERNAL_ERROR,
    /// INVALID_PARAMETER, as a real H200 gave on unusual files; a bad image is not one) may
    /// hide a dead context: the stream tells, and a sticky error marks the GPU broken.
    /// Otherwise it is logged and counted, and the images are not lost.
    fn nvjpeg_failure(
        &mut self,
        e: &NvjpegError,
        ks: &[usize],
        path: Route,
    ) -> Result<(), BackendFault> {
        if e.is_bad_image() {
            return Ok(());
        }
        if let Err(c) = self.stream.synchronize() {
            return Err(self.fault("nvJPEG decode", &c));
        }
        self.nvjpeg_failed(e, ks, path);
        Ok(())
    }

    /// Logs (rate-limited) nvJPEG failing on images `ks`, and switches the hardware engines
    /// off after [`HARDWARE_FAILURES_BEFORE_OFF`] failures in a row there.
    fn nvjpeg_failed(&mut self, e: &NvjpegError, ks: &[usize], path: Route) {
        if let Admit::Log { suppressed } = self.failure_log.admit(Instant::now()) {
            tracing::warn!(gpu = %self.gpu.label, path = path.name(), images = ks.len(), error = %e,
                suppressed, "nvJPEG failed while decoding; the images go to the CPU decoder");
        }
        if path != Route::Hardware || !self.decoder.has_hardware() {
            return;
        }
        self.hardware_failures += 1;
        if self.hardware_failures >= HARDWARE_FAILURES_BEFORE_OFF {
            self.decoder.switch_hardware_off();
            tracing::error!(gpu = %self.gpu.label, failures = self.hardware_failures, error = %e,
                "switching nvJPEG's hardware decoder off for this worker after repeated \
                 failures; its images go to the GPU-hybrid decoder or the CPU");
        }
    }

    /// Decodes and augments the CPU path's images on the host, into `host_images`.
    fn decode_cpu(&mut self, unit: &UnitWork<'_>) {
        let image_bytes = unit.layout.image_bytes;
        let cpu_route = self.routed(Route::Cpu);
        self.host_images.resize(cpu_route.len() * image_bytes, 0);
        for (j, &k) in cpu_route.iter().enumerate() {
            let sample = Sample {
                job: unit.job,
                pos: unit.pos,
                index: unit.indices[k],
                config: unit.config,
                stats: unit.stats,
            };
            let data = std::mem::take(&mut self.cpu.bufs[k]);
            self.plan[k].host = j;
            let out = &mut self.host_images[j * image_bytes..(j + 1) * image_bytes];
            if let Err(bad) = self.cpu.process(sample, &data, out) {
                self.plan[k].route = Err(bad);
            }
            self.cpu.bufs[k] = data;
        }
    }

    /// The kernel's sample array: nvJPEG images with their crop (relative to the decoded
    /// region), zeros elsewhere (the CPU path's images are uploaded after the launch).
    fn kernel_samples(&mut self) -> usize {
        self.samples.clear();
        let base = self.scratch.as_ref().map_or(0, |b| b.ptr());
        for p in &self.plan {
            let s = match &p.route {
                Ok(Route::Hardware | Route::Hybrid) => {
                    let (x0, y0) = p.roi.map_or((0, 0), |r| (r.x, r.y));
                    let crop = CropBox::new(
                        p.crop.x - f64::from(x0),
                        p.crop.y - f64::from(y0),
                        p.crop.w,
                        p.crop.h,
                    );
                    let pitch = u64::from(p.width) * 3;
                    let src = base + p.offset as u64;
                    AugmentSample::new(src, pitch, p.width, p.height, crop, p.flip)
                }
                Ok(Route::Cpu) | Err(_) => AugmentSample::zeroed(),
            };
            self.samples.push(s);
        }
        std::mem::size_of_val(self.samples.as_slice())
    }

    /// Everything after the read and the routing: decode, the launch, the CPU uploads, the
    /// events. Returns the batch's pending work.
    fn enqueue(
        &mut self,
        unit: &UnitWork<'_>,
        mine: &mut InFlight,
    ) -> Result<PendingBatch, BackendFault> {
        let SlotImages::Device(dst) = unit.images else {
            panic!(
                "the CUDA backend writes device memory only, got {:?}",
                unit.images
            );
        };
        let t0 = Instant::now();
        self.place().map_err(|e| self.fault("decode scratch", &e))?;
        // The hardware engines write the decoded images without waiting for work queued
        // before them on the stream (seen on an H200: docs/cuda.md, "First GPU run"): the
        // kernels of this slot's last batch must have read its scratch first (`slots`).
        self.wait_for_scratch(mine)?;
        self.decode_gpu(mine)?;
        self.decode_cpu(unit);
        let events = self.take_events()?;
        let rec = |s: &CudaBackend, e: &stoker_nvidia::cuda::Event| {
            e.record(&s.stream).map_err(|e| s.fault("event record", &e))
        };
        rec(self, &events.decoded)?;
        let decode_ns = u64::try_from(t0.elapsed().as_nanos()).unwrap_or(u64::MAX);
        let bytes = self.kernel_samples();
        let ops_bytes = self.plan_ops(unit);
        self.gpu
            .grow(&self.stream, &mut self.samples_dev, bytes)
            .map_err(|e| self.fault("sample array", &e))?;
        let samples_dev = self.samples_dev.as_ref().expect("grown");
        let staging = mine.staging.as_mut().expect("made with the in-flight set");
        let cpu_images = self
            .plan
            .iter()
            .filter(|p| p.route == Ok(Route::Cpu))
            .count();
        let device = self.gpu.device();
        staging
            .begin(
                device,
                bytes + ops_bytes + cpu_images * unit.layout.image_bytes,
            )
            .and_then(|()| {
                let src = AugmentSample::as_bytes(&self.samples);
                staging.upload(device, &self.stream, samples_dev.ptr(), src)
            })
            .map_err(|e| self.fault("sample array upload", &e))?;
        let first = dst + (unit.layout.images + unit.start * unit.layout.image_bytes) as u64;
        // One unit's samples, at most the spec's u32 batch size.
        #[allow(clippy::cast_possible_truncation)]
        let n = self.samples.len() as u32;
        let batch = AugmentBatch::new(&unit.job.spec, first, samples_dev.ptr(), n);
        // `first` is the unit's first image in the slot's device memory, which holds
        // n * image_bytes from there (SlotMemory); the samples array and every decoded image
        // it names live in this backend's buffers, replaced only after a synchronise.
        self.launch_batch(unit, staging, batch)?;
        slots::record_read(&mine.read, &self.stream).map_err(|e| self.fault("event record", &e))?;
        self.upload_cpu(staging, first, unit.layout.image_bytes)?;
        staging
            .finish(&self.stream)
            .map_err(|e| self.fault("event record", &e))?;
        rec(self, &events.done)?;
        self.count(decode_ns);
        Ok(PendingBatch {
            gpu: self.gpu.clone(),
            events,
            pool: self.events.clone(),
        })
    }

    fn take_events(&self) -> Result<EventSet, BackendFault> {
        if let Some(set) = lock(&self.events).pop() {
            return Ok(set);
        }
        EventSet::new(self.gpu.device()).map_err(|e| self.fault("event create", &e))
    }

    fn count(&self, decode_ns: u64) {
        let s = &self.gpu.stats;
        for (route, counter) in [
            (Route::Hardware, &s.hardware),
            (Route::Hybrid, &s.hybrid),
            (Route::Cpu, &s.cpu),
        ] {
            let n = self.plan.iter().filter(|p| p.route == Ok(route)).count() as u64;
            counter.fetch_add(n, Ordering::Relaxed);
        }
        s.batches.fetch_add(1, Ordering::Relaxed);
        s.decode.record_ns(decode_ns);
        s.in_flight.fetch_add(1, Ordering::Relaxed);
    }
}

impl Planned {
    fn bad(bad: BadSample) -> Planned {
        Planned::unread(Err(bad))
    }

    /// A sample with no crop or region yet, going `route`.
    fn unread(route: Result<Route, BadSample>) -> Planned {
        Planned {
            route,
            crop: CropBox::new(0.0, 0.0, 0.0, 0.0),
            flip: false,
            roi: None,
            progressive: false,
            pixels: 0,
            width: 0,
            height: 0,
            offset: 0,
            host: 0,
        }
    }
}

/// The pixels a crop's filter taps can reach when they stay inside the crop box: its
/// bounding box in whole pixels, within the image (the region nvJPEG decodes for it).
// Clamped into the image's u32 bounds (`as` saturates a negative to 0).
#[allow(clippy::cast_possible_truncation, clippy::cast_sign_loss)]
pub fn crop_region(crop: CropBox, width: u32, height: u32) -> Roi {
    let x0 = (crop.x.floor().max(0.0) as u32).min(width.saturating_sub(1));
    let y0 = (crop.y.floor().max(0.0) as u32).min(height.saturating_sub(1));
    let x1 = ((crop.x + crop.w).ceil() as u32).clamp(x0 + 1, width);
    let y1 = ((crop.y + crop.h).ceil() as u32).clamp(y0 + 1, height);
    Roi {
        x: x0,
        y: y0,
        width: x1 - x0,
        height: y1 - y0,
    }
}

impl Backend for CudaBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }

    fn fill(&mut self, unit: &UnitWork<'_>, outcomes: &mut Vec<SampleOutcome>) -> Completion {
        if let Some(fault) = self.gpu.broken_fault() {
            outcomes.extend(unit.indices.iter().map(|_| Ok(())));
            return Completion::Pending(Box::new(Failed(fault)));
        }
        if let Err(e) = self.gpu.device().bind() {
            outcomes.extend(unit.indices.iter().map(|_| Ok(())));
            let fault = self.fault("cannot bind the context", &e);
            return Completion::Pending(Box::new(Failed(fault)));
        }
        if unit.layout.views > 1 {
            return self.fill_views(unit, outcomes);
        }
        let pending = self.fill_in_flight(unit);
        outcomes.extend(self.plan.iter().map(|p| match &p.route {
            Err(bad) => Err(bad.clone()),
            Ok(_) => Ok(()),
        }));
        match pending {
            Ok(p) => Completion::Pending(Box::new(p)),
            Err(fault) => {
                // A kernel already launched may still write the slot: the unit is finished
                // (and its ring may go) only once the stream's work is done or dead.
                let _ = self.stream.synchronize();
                Completion::Pending(Box::new(Failed(fault)))
            }
        }
    }

    fn fill_sample(&mut self, work: &SampleWork<'_>) -> SampleOutcome {
        // Replacements are decoded on the CPU. A GPU that fails the upload is the batch's
        // completion's to report; the sample is not served.
        self.fill_sample_on_cpu(work).unwrap_or_else(|fault| {
            Err(BadSample {
                reason: "internal",
                detail: format!("the replacement could not be uploaded: {fault}"),
            })
        })
    }

    fn clear_sample(&mut self, images: SlotImages, layout: &SlotLayout, at: usize) {
        for view in 0..layout.views {
            self.zeros.resize(layout.view(view).image_bytes, 0);
            self.put_sample(images, layout, (view, at), &self.zeros);
        }
    }

    fn mix(&mut self, work: &crate::engine::MixWork<'_>, filled: Completion) -> Completion {
        self.mix_on_stream(work, filled)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_decoded_region_covers_the_crop_in_whole_pixels_within_the_image() {
        let r = crop_region(CropBox::new(10.5, 3.25, 20.0, 7.5), 100, 50);
        assert_eq!((r.x, r.y, r.width, r.height), (10, 3, 21, 8));
        // A crop reaching the image's edge stops there.
        let r = crop_region(CropBox::new(90.2, 40.0, 9.8, 10.0), 100, 50);
        assert_eq!((r.x, r.y, r.width, r.height), (90, 40, 10, 10));
        // A whole-image crop is the image; a degenerate one still covers a pixel.
        let r = crop_region(CropBox::full(64, 48), 64, 48);
        assert_eq!((r.x, r.y, r.width, r.height), (0, 0, 64, 48));
        let r = crop_region(CropBox::new(63.0, 47.0, 0.0, 0.0), 64, 48);
        assert_eq!((r.x, r.y, r.width, r.height), (63, 47, 1, 1));
    }
}
