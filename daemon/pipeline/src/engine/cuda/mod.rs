//! The CUDA backend: one [`Gpu`] per device (by UUID), whose engine's workers each own a
//! [`CudaBackend`] with its own stream, so at least [`STREAMS_PER_GPU`] batches are in flight
//! per GPU while decode, the kernel and host-side work overlap.
//!
//! Files: `mod` (the GPU, its health and counters, the factory), `backend` (filling one
//! batch), `pending` (a batch's completion), `sticky` (a sticky CUDA error restarts the
//! process).
//!
//! # Design
//! - A unit is a whole batch ([`UnitSize::Batch`]). Per batch: the samples are read (the CPU
//!   backend's reader and buffers), headers probed, crops drawn with the CPU backend's
//!   [`crate::transform::augment::sample_params`], then each image goes down the path
//!   [`route_image`] gives it (the decode stage's routing, shared with the tools): the hardware
//!   engines (one `nvjpegDecodeBatchedEx` for all of the batch's, the crop as ROI, or the
//!   whole image where the engines refuse the ROI, the kernel cropping it), nvJPEG's
//!   decoupled decoders (ROI; the hybrid one for progressive files), or the CPU (what nvJPEG refuses or fails on: the CPU
//!   backend's decode and augment, uploaded into the slot). One fused `stoker_augment` launch
//!   writes every nvJPEG-decoded image straight into the slot's device memory; an event
//!   recorded after it is the batch's [`Completion::Pending`](super::Completion).
//! - Bad samples: an image nvJPEG refuses goes to the CPU path, so the reasons and the
//!   deterministic replacements are the CPU backend's. Replacements (`fill_sample`) run the
//!   CPU backend and upload synchronously, ordered after the batch's kernel on the stream.
//! - Faults: a driver error in a batch fails that batch's rank with a [`BackendFault`] naming
//!   the GPU and the cause. Errors that break the context or the device (illegal address,
//!   launch failure, ECC, device lost) mark the [`Gpu`] broken: every later batch on it fails
//!   at once with the same cause, and the daemon restarts (`sticky`: the ranks on it are told,
//!   the others drained, and it exits with 75 for systemd or the clients to start it again).
//!
//! - A worker keeps [`BATCHES_IN_FLIGHT_PER_WORKER`] batches in flight, each with its own read
//!   buffers, nvJPEG hardware state and scratch for decoded images, used in turn
//!   (`backend/slots.rs`): nvJPEG's batched decode reads its bitstreams asynchronously, so a
//!   batch's buffers are read into again only after its decode has run on the stream (the
//!   state's event), and the engines decode into a scratch only after the kernels of its last
//!   batch have read it (its slot's event), while the other batch stays queued.
//!
//! # Limitations
//! - Uploads (per-sample parameters, CPU-path images, replacements) go from pinned host memory,
//!   one staging buffer per batch in flight (`backend/staging.rs`).
//! - Read buffers are the CPU reader's pageable buffers, not pinned: nvJPEG copies the
//!   bitstreams into its own pinned staging, so only that copy is slower.
//! - A hybrid decode synchronises the stream before the next one (its pinned buffer is
//!   reused); progressive images are the rare case.
//! - Each batch in flight's scratch for decoded images grows to the largest batch it saw
//!   (synchronising first), at most 1 GiB each (images past it take the CPU path); it never
//!   shrinks, and quotas count ring memory, not scratch.
//! - Images over the pixel limit go to the CPU path, whose decoder refuses them with the CPU
//!   backend's reason.

mod backend;
mod pending;
pub mod sticky;

pub use crate::transform::decode::routing::route_image;

use crate::sync::lock;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use stoker_kernels::augment::{AugmentKernels, KernelError};
use stoker_nvidia::cuda::result::CuStatus;
use stoker_nvidia::cuda::{CudaError, Device, DeviceBuffer, GpuUuid, Stream};
use stoker_nvidia::nvjpeg::{NvjpegError, NvjpegLib};
use stoker_nvidia::nvrtc::{KernelCache, Nvrtc, NvrtcError};
use stoker_wire::protocol::GpuStatus;
use stoker_wire::ring::ImageMemory;

use super::backend::{Backend, BackendFactory, BackendFault, UnitSize};
use super::{EngineConfig, PipelineError};
use crate::engine::backend::BackendKind;
use crate::metrics::LatencyHistogram;
pub use backend::{crop_region, CudaBackend, DEFAULT_HYBRID_THREADS, MAX_HYBRID_THREADS};

/// Worker threads (each with its own stream) of one GPU's engine: batches in flight at once.
pub const STREAMS_PER_GPU: usize = 2;
/// Batches one worker may have in flight on its stream, each with its own read buffers and
/// nvJPEG state (the next batch is read and decoded while the last one's decode runs).
pub const BATCHES_IN_FLIGHT_PER_WORKER: usize = 2;

/// `[cuda]` of the daemon's configuration: how it uses its GPUs' contexts and nvJPEG
/// (docs/operations.md; measured by `stoker bench --backend cuda --blocking-sync` and
/// `--pinned-inputs`, docs/cuda.md "Host CPU").
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize, serde::Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct CudaOptions {
    /// Sets `CU_CTX_SCHED_BLOCKING_SYNC` on each GPU's primary context before the daemon first
    /// retains it, so the driver's and nvJPEG's own waits sleep instead of spinning. The daemon
    /// shares its primary context with no framework (clients run in their own processes).
    pub blocking_sync: bool,
    /// nvJPEG reads the hardware engines' bitstreams from pinned memory (each batch's are
    /// copied there) instead of the reader's pageable buffers.
    pub pinned_inputs: bool,
    /// The share of each batch's engine-decodable images the hardware engines decode; the
    /// rest go to nvJPEG's GPU-hybrid decoder (`backend/split.rs`). 0 to 1.
    pub hw_decode_share: f64,
    /// Threads per worker of the batched non-engine decode (`backend/pool.rs`), each with its
    /// own nvJPEG decoupled decoders, pinned buffers and stream. 1 to 64.
    pub hybrid_threads: usize,
    /// Images of more pixels than this take nvJPEG's GPU Huffman decoder (GPU-hybrid) in the
    /// non-engine decode; others (and progressive files) the host's (hybrid), as DALI's and
    /// nvImageCodec's `hybrid_huffman_threshold`.
    pub hybrid_huffman_threshold: u64,
}

/// `cuda.hw_decode_share`'s default: every engine-decodable image to the engines, until a GPU
/// measures that a split pays (docs/decisions.md).
pub const DEFAULT_HW_DECODE_SHARE: f64 = 1.0;

impl Default for CudaOptions {
    fn default() -> Self {
        CudaOptions {
            blocking_sync: false,
            pinned_inputs: false,
            hw_decode_share: DEFAULT_HW_DECODE_SHARE,
            hybrid_threads: DEFAULT_HYBRID_THREADS,
            hybrid_huffman_threshold: stoker_nvidia::nvjpeg::DEFAULT_HYBRID_HUFFMAN_THRESHOLD,
        }
    }
}

/// Why a GPU cannot serve.
#[derive(Debug, Clone, thiserror::Error)]
pub enum GpuError {
    /// A CUDA driver call failed.
    #[error("{0}")]
    Cuda(#[from] CudaError),
    /// NVRTC could not compile the kernels.
    #[error("NVRTC: {0}")]
    Nvrtc(#[from] NvrtcError),
    /// The augment kernel could not be loaded from its module.
    #[error("the augment kernel: {0}")]
    Kernel(#[from] KernelError),
    /// nvJPEG could not be set up on the GPU.
    #[error("nvJPEG: {0}")]
    Nvjpeg(#[from] NvjpegError),
}

/// Images decoded per path, and time per batch, on one GPU: the one record of these events,
/// read by `stoker status` and, at scrape time, the metrics.
#[derive(Debug, Default)]
pub struct GpuStats {
    /// Images decoded on the hardware JPEG engines.
    pub hardware: AtomicU64,
    /// Images decoded by nvJPEG's hybrid path (Huffman on the CPU, the rest on the GPU).
    pub hybrid: AtomicU64,
    /// Images decoded on the CPU path (formats or images nvJPEG does not take).
    pub cpu: AtomicU64,
    /// Batches launched.
    pub batches: AtomicU64,
    /// Host time from a batch's first decode call to its launch, per batch.
    pub decode: LatencyHistogram,
    /// Device time from the end of decode to the end of the kernel, per batch.
    pub kernel: LatencyHistogram,
    /// Batches launched and not yet complete.
    pub in_flight: AtomicI64,
    /// Device memory of the rings on this GPU.
    pub ring_bytes: AtomicU64,
}

/// One GPU: its context, kernels, nvJPEG, health and counters, shared by its engine's
/// backends and the server.
pub struct Gpu {
    /// The device's UUID, how clients and the config name it.
    pub uuid: GpuUuid,
    /// "GPU-... (name)": how errors and logs name it.
    pub label: String,
    /// Whether it is the emulated GPU of tests/gpu-emulator (status says so).
    pub emulated: bool,
    /// Its decode and batch counters.
    pub stats: GpuStats,
    broken: Mutex<Option<String>>,
    nvjpeg: Arc<NvjpegLib>,
    // Field order: the module unloads before the device's context is let go.
    kernels: AugmentKernels,
    device: Device,
}

impl std::fmt::Debug for Gpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Gpu").field("label", &self.label).finish()
    }
}

impl Gpu {
    /// Makes `buf` at least `bytes` long on this GPU; an old, smaller buffer is freed only
    /// after `stream`'s work on it is done.
    pub(super) fn grow(
        &self,
        stream: &Stream,
        buf: &mut Option<DeviceBuffer>,
        bytes: usize,
    ) -> Result<(), CudaError> {
        if buf.as_ref().is_some_and(|b| b.len() >= bytes) || bytes == 0 {
            return Ok(());
        }
        stream.synchronize()?;
        *buf = None;
        // Room to grow a little without reallocating at the next larger crop.
        *buf = Some(self.device().alloc(bytes + bytes / 4)?);
        Ok(())
    }

    /// Opens the GPU with this UUID: its primary context, augment.cu (NVRTC, cached) and
    /// libnvjpeg.
    pub fn open(uuid: GpuUuid) -> Result<Arc<Gpu>, GpuError> {
        let device = Device::open(uuid)?;
        let nvrtc = Nvrtc::global()?;
        let cache = KernelCache::default_dir().map(KernelCache::new);
        let kernels = AugmentKernels::load(&device, nvrtc, cache.as_ref())?;
        let nvjpeg = NvjpegLib::global()?;
        let label = format!("{uuid} ({})", device.info().name);
        let emulated = stoker_nvidia::emulator::emulated_driver().is_some();
        tracing::info!(gpu = %label, emulated, "GPU opened for serving");
        Ok(Arc::new(Gpu {
            uuid,
            label,
            emulated,
            stats: GpuStats::default(),
            broken: Mutex::new(None),
            nvjpeg,
            kernels,
            device,
        }))
    }

    /// Its CUDA device (context, memory, streams).
    pub fn device(&self) -> &Device {
        &self.device
    }

    /// Why the GPU cannot serve any more, if it is broken.
    pub fn broken(&self) -> Option<String> {
        lock(&self.broken).clone()
    }

    /// A fault naming this GPU; a cause that breaks the context or device marks it broken.
    pub fn fault(&self, what: &str, cause: &dyn std::fmt::Display, sticky: bool) -> BackendFault {
        let reason = format!("{what}: {cause}");
        if sticky {
            let mut broken = lock(&self.broken);
            if broken.is_none() {
                tracing::error!(gpu = %self.label, %reason, "GPU broken; its ranks fail");
                *broken = Some(reason.clone());
                sticky::record(&self.label, &reason);
            }
        }
        BackendFault {
            device: format!("GPU {}", self.label),
            reason,
        }
    }

    /// The fault every batch gets once the GPU is broken.
    fn broken_fault(&self) -> Option<BackendFault> {
        self.broken().map(|reason| BackendFault {
            device: format!("GPU {}", self.label),
            reason: format!("the GPU is broken ({reason})"),
        })
    }

    /// Its counters and health as `stoker status` reports them.
    pub fn snapshot(&self) -> GpuStatus {
        let s = &self.stats;
        let g = |a: &AtomicU64| a.load(Ordering::Relaxed);
        let batches = g(&s.batches);
        let per_batch = |ns: u64| ns as f64 * 1e-6 / batches.max(1) as f64;
        GpuStatus {
            uuid: self.uuid.to_string(),
            name: self.device.info().name.clone(),
            emulated: self.emulated,
            broken: self.broken(),
            decoded_hardware: g(&s.hardware),
            decoded_hybrid: g(&s.hybrid),
            decoded_cpu: g(&s.cpu),
            batches,
            batches_in_flight: s.in_flight.load(Ordering::Relaxed),
            ring_device_bytes: g(&s.ring_bytes),
            decode_ms_per_batch: per_batch(s.decode.sum_ns()),
            kernel_ms_per_batch: per_batch(s.kernel.sum_ns()),
        }
    }
}

/// Whether a CUDA error leaves the context (or the device) unusable.
pub fn breaks_context(e: &CudaError) -> bool {
    // The driver documents these as leaving the process's context unusable: every later
    // call on it fails, so the GPU is marked broken (rebuilt or refused), never half-working.
    // Not `CUDA_ERROR_DEVICE_UNAVAILABLE`: a device "unavailable at the current time" (its
    // compute mode), which fails only its call (docs/cuda.md, row 12).
    const STICKY: [CuStatus; 10] = [
        CuStatus::ILLEGAL_ADDRESS,
        CuStatus::LAUNCH_FAILED,
        CuStatus::ECC_UNCORRECTABLE,
        CuStatus(702), // CUDA_ERROR_LAUNCH_TIMEOUT
        CuStatus(710), // CUDA_ERROR_ASSERT
        CuStatus(714), // CUDA_ERROR_HARDWARE_STACK_ERROR
        CuStatus(715), // CUDA_ERROR_ILLEGAL_INSTRUCTION
        CuStatus(716), // CUDA_ERROR_MISALIGNED_ADDRESS
        CuStatus(718), // CUDA_ERROR_INVALID_PC
        CuStatus(999), // CUDA_ERROR_UNKNOWN (what a GPU fallen off the bus returns)
    ];
    matches!(e, CudaError::Driver { status, .. } if STICKY.contains(status))
}

/// Makes the [`CudaBackend`]s of one GPU's engine.
#[derive(Debug)]
pub struct CudaBackendFactory {
    gpu: Arc<Gpu>,
}

impl CudaBackendFactory {
    /// The factory of `gpu`'s backends.
    pub fn new(gpu: Arc<Gpu>) -> CudaBackendFactory {
        CudaBackendFactory { gpu }
    }
}

impl BackendFactory for CudaBackendFactory {
    fn kind(&self) -> BackendKind {
        BackendKind::Cuda
    }
    fn unit_size(&self) -> UnitSize {
        UnitSize::Batch
    }
    fn image_memory(&self) -> ImageMemory {
        ImageMemory::Device
    }
    fn make(&self, config: &EngineConfig) -> Result<Box<dyn Backend>, PipelineError> {
        let backend = CudaBackend::new(self.gpu.clone(), config).map_err(|e| {
            PipelineError::Backend(BackendFault {
                device: format!("GPU {}", self.gpu.label),
                reason: e.to_string(),
            })
        })?;
        Ok(Box::new(backend))
    }
}
