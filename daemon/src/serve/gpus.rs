//! Where an attached rank is served from: the CPU engine, or the engine of the GPU its ATTACH
//! names (created at the first attach on that GPU), and the ring each makes: a sealed memfd,
//! or device images in one VMM allocation exported as a POSIX fd beside a host memfd.
//!
//! # Design
//! - One engine per backend: the CPU engine made at start, one CUDA engine per GPU UUID made
//!   when the first rank on it attaches ([`STREAMS_PER_GPU`] workers, each with its stream).
//! - A GPU whose context broke (a launch failure, an illegal address, a lost device) fails its
//!   ranks; a later attach rebuilds its engine once no rank holds the old one (a fresh primary
//!   context), and is refused with the cause while one does or when the rebuild fails.
//! - Rings are planned first (quotas count the memfd and the device memory), then made; a
//!   device allocation the GPU cannot hold is refused with the sizes.
//!
//! # Limitations
//! - GPU engines are kept for the daemon's life once made (their threads idle between jobs).

use std::collections::BTreeMap;
use std::ffi::CString;
use std::os::fd::{AsFd, OwnedFd};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use stoker_nvidia::cuda::vmm::{ring_granularity, DeviceRing};
use stoker_nvidia::cuda::GpuUuid;
use stoker_wire::protocol::{CudaDevice, Device, ErrorCode, GpuStatus};
use stoker_wire::ring::memfd::{page_size, MemfdRing};
use stoker_wire::ring::RingLayout;
use stoker_wire::spec::PipelineSpec;
use stoker_wire::VmmPlan;

use stoker_pipeline::engine::backend::BackendKind;
use stoker_pipeline::engine::cuda::GpuError;
use stoker_pipeline::engine::cuda::STREAMS_PER_GPU;
use stoker_pipeline::engine::{
    CudaBackendFactory, Engine, EngineConfig, Gpu, PipelineError, SlotImages, SlotMemory,
    StageHistograms, StageTotals,
};
use stoker_pipeline::metrics::HistogramSnapshot;

use super::refusal::{refuse, Refusal};

/// A served rank's ring: a sealed memfd holding images and host part.
pub(super) struct ServedRing(pub(super) MemfdRing);

// SAFETY: `MemfdRing::host_ptr(i)` and `image_ptr(i)` point inside a mapping that covers
// both parts of every slot, lives as long as the ring, and holds them without overlap
// (`RingLayout`); host-image rings only.
unsafe impl SlotMemory for ServedRing {
    fn layout(&self) -> &RingLayout {
        self.0.layout()
    }
    fn images(&self, slot: usize) -> SlotImages {
        SlotImages::Host(
            self.0
                .image_ptr(slot)
                .expect("served rings hold host images"),
        )
    }
    fn host_ptr(&self, slot: usize) -> *mut u8 {
        self.0.host_ptr(slot)
    }
}

/// A rank's ring on a GPU: images in a VMM allocation, the host part in a sealed memfd.
pub(super) struct DeviceServedRing {
    host: MemfdRing,
    images: DeviceRing,
    gpu: Arc<Gpu>,
}

// SAFETY: the host part is the memfd's mapping (`RingLayout::with_device_images`, host offset
// 0), slot images are disjoint `image_slot_bytes` ranges of the mapped device allocation of
// `image_ring_bytes`; both live as long as `self`.
unsafe impl SlotMemory for DeviceServedRing {
    fn layout(&self) -> &RingLayout {
        self.host.layout()
    }
    fn images(&self, slot: usize) -> SlotImages {
        SlotImages::Device(self.images.ptr() + self.host.layout().image_offset(slot) as u64)
    }
    fn host_ptr(&self, slot: usize) -> *mut u8 {
        self.host.host_ptr(slot)
    }
}

impl Drop for DeviceServedRing {
    fn drop(&mut self) {
        let bytes = self.images.len() as u64;
        self.gpu
            .stats
            .ring_bytes
            .fetch_sub(bytes, Ordering::Relaxed);
    }
}

/// Which engine serves a rank, and the GPU when it is one.
pub(super) struct Target {
    pub(super) engine: Arc<Engine>,
    pub(super) gpu: Option<Arc<Gpu>>,
}

/// A ring made for a rank: what the engine writes, and the fds ATTACHED carries.
pub(super) struct MadeRing {
    pub(super) memory: Arc<dyn SlotMemory>,
    pub(super) fds: Vec<OwnedFd>,
}

/// The GPU an ATTACH's device names, `None` for `cpu`. An ordinal is refused: it numbers a GPU
/// only in the client's own process (under its `CUDA_VISIBLE_DEVICES`), and the client
/// resolves it to the UUID before it attaches.
pub(super) fn attached_gpu(device: &Device) -> Result<Option<GpuUuid>, Refusal> {
    match *device {
        Device::Cpu => Ok(None),
        Device::Cuda(CudaDevice::Uuid(uuid)) => Ok(Some(uuid)),
        Device::Cuda(CudaDevice::Ordinal(_)) => Err(refuse(
            ErrorCode::UnsupportedDevice,
            format!(
                "device {device}: an ordinal numbers a GPU only in the client's own process; \
                 ATTACH carries \"cpu\" or the GPU's UUID"
            ),
        )),
    }
}

/// One GPU's engine.
struct GpuEngine {
    gpu: Arc<Gpu>,
    engine: Arc<Engine>,
}

/// The CPU engine and the GPU engines made so far.
pub(super) struct Engines {
    pub(super) cpu: Arc<Engine>,
    pub(super) backend: BackendKind,
    config: EngineConfig,
    gpus: Mutex<BTreeMap<GpuUuid, GpuEngine>>,
}

impl Engines {
    pub(super) fn new(cpu: Arc<Engine>, backend: BackendKind, config: EngineConfig) -> Engines {
        Engines {
            cpu,
            backend,
            config,
            gpus: Mutex::new(BTreeMap::new()),
        }
    }

    /// The engine for an ATTACH's `device`: `cpu`, or a GPU by UUID when the daemon serves
    /// from CUDA.
    pub(super) fn target(&self, device: &Device) -> Result<Target, Refusal> {
        let Some(uuid) = attached_gpu(device)? else {
            return Ok(Target {
                engine: self.cpu.clone(),
                gpu: None,
            });
        };
        let unsupported = |why: String| refuse(ErrorCode::UnsupportedDevice, why);
        if self.backend != BackendKind::Cuda {
            return Err(unsupported(format!(
                "device {device}: this daemon serves from the CPU only (started with \
                 --backend {}); start it with --backend cuda or auto on a GPU host",
                self.backend.name()
            )));
        }
        let mut gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(g) = gpus.get(&uuid) {
            match g.gpu.broken() {
                None => {
                    return Ok(Target {
                        engine: g.engine.clone(),
                        gpu: Some(g.gpu.clone()),
                    })
                }
                // The map and each worker's backend hold the GPU; rings and batches add to that.
                Some(cause) if Arc::strong_count(&g.gpu) > 1 + STREAMS_PER_GPU => {
                    return Err(unsupported(format!(
                        "GPU {} is broken ({cause}); the daemon restarts to recover it",
                        g.gpu.label
                    )));
                }
                Some(cause) => {
                    tracing::warn!(gpu = %g.gpu.label, %cause, "rebuilding a broken GPU's engine");
                    gpus.remove(&uuid);
                }
            }
        }
        // Opening compiles the kernel on a cold cache: status and other attaches go on
        // meanwhile. Two first attaches on one GPU both open it; the first one in is kept.
        drop(gpus);
        let opened = self
            .open_gpu(uuid)
            .map_err(|e| unsupported(e.to_string()))?;
        let mut gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        let g = gpus.entry(uuid).or_insert(opened);
        Ok(Target {
            engine: g.engine.clone(),
            gpu: Some(g.gpu.clone()),
        })
    }

    fn open_gpu(&self, uuid: GpuUuid) -> Result<GpuEngine, GpuOpenError> {
        let gpu = Gpu::open(uuid).map_err(|source| GpuOpenError::Open { uuid, source })?;
        let config = EngineConfig {
            threads: STREAMS_PER_GPU,
            ..self.config.clone()
        };
        let engine = Engine::with_backend(config, &CudaBackendFactory::new(gpu.clone())).map_err(
            |source| GpuOpenError::Engine {
                label: gpu.label.clone(),
                source,
            },
        )?;
        Ok(GpuEngine { gpu, engine })
    }

    /// Every GPU engine's state, for status and metrics.
    pub(super) fn gpu_status(&self) -> Vec<GpuStatus> {
        let gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        gpus.values().map(|g| g.gpu.snapshot()).collect()
    }

    /// The stage figures of every engine (the CPU's and each GPU's), added up.
    pub(super) fn stage_figures(&self) -> StageFigures {
        let mut all = StageFigures::of(&self.cpu);
        let gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        for g in gpus.values() {
            let one = StageFigures::of(&g.engine);
            all.totals.add(&one.totals);
            all.histograms.add(&one.histograms);
            for (reason, n) in one.bad_by_reason {
                *all.bad_by_reason.entry(reason).or_default() += n;
            }
        }
        all
    }

    /// Each GPU's UUID and its decode and kernel latency histograms, for the metrics.
    pub(super) fn gpu_histograms(&self) -> Vec<(String, HistogramSnapshot, HistogramSnapshot)> {
        let gpus = self.gpus.lock().unwrap_or_else(|e| e.into_inner());
        gpus.values()
            .map(|g| {
                let s = &g.gpu.stats;
                (
                    g.gpu.uuid.to_string(),
                    s.decode.snapshot(),
                    s.kernel.snapshot(),
                )
            })
            .collect()
    }
}

/// What the engines recorded per stage (the one record the metrics and status read).
pub(super) struct StageFigures {
    pub(super) totals: StageTotals,
    pub(super) histograms: StageHistograms,
    pub(super) bad_by_reason: BTreeMap<&'static str, u64>,
}

impl StageFigures {
    fn of(engine: &Engine) -> StageFigures {
        StageFigures {
            totals: engine.stats(),
            histograms: engine.histograms(),
            bad_by_reason: engine.bad_by_reason(),
        }
    }
}

/// Why a GPU named by an ATTACH cannot serve.
#[derive(Debug, thiserror::Error)]
enum GpuOpenError {
    #[error("GPU {uuid} cannot serve: {source}")]
    Open { uuid: GpuUuid, source: GpuError },
    #[error("GPU {label} cannot start its engine: {source}")]
    Engine {
        label: String,
        source: PipelineError,
    },
}

impl Target {
    /// The ring's layout for `spec` on this target (device images on a GPU).
    pub(super) fn layout(&self, spec: &PipelineSpec, slots: usize) -> Result<RingLayout, Refusal> {
        let Some(gpu) = &self.gpu else {
            return Ok(RingLayout::new(spec, slots, page_size()));
        };
        let internal = |e: &dyn std::fmt::Display| {
            refuse(ErrorCode::Internal, format!("GPU {}: {e}", gpu.label))
        };
        let granularity = ring_granularity(gpu.device()).map_err(|e| internal(&e))?;
        let plan = VmmPlan::new(spec, slots, granularity).map_err(|e| internal(&e))?;
        Ok(plan.layout)
    }

    /// Makes the ring for `rank` with `layout` (from [`Target::layout`]).
    pub(super) fn make_ring(
        &self,
        spec: &PipelineSpec,
        rank: u32,
        layout: RingLayout,
    ) -> Result<MadeRing, Refusal> {
        let name = CString::new(format!("stoker-ring-rank{rank}")).expect("no NUL");
        let host = MemfdRing::create(&name, layout)
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot create the ring: {e}")))?;
        let host_fd = host
            .as_fd()
            .try_clone_to_owned()
            .map_err(|e| refuse(ErrorCode::Internal, format!("cannot pass the ring: {e}")))?;
        let Some(gpu) = &self.gpu else {
            return Ok(MadeRing {
                memory: Arc::new(ServedRing(host)),
                fds: vec![host_fd],
            });
        };
        let slots = layout.slots;
        let internal = |e: &dyn std::fmt::Display| {
            refuse(ErrorCode::Internal, format!("GPU {}: {e}", gpu.label))
        };
        let granularity = ring_granularity(gpu.device()).map_err(|e| internal(&e))?;
        let plan = VmmPlan::new(spec, slots, granularity).map_err(|e| internal(&e))?;
        let images = DeviceRing::create(gpu.device(), plan.bytes).map_err(|e| {
            // Only a full device is a quota matter; any other failure is the GPU's.
            let out_of_memory = matches!(
                e,
                stoker_nvidia::cuda::CudaError::Driver { status, .. }
                    if status == stoker_nvidia::cuda::result::CuStatus::OUT_OF_MEMORY
            );
            refuse(
                if out_of_memory {
                    ErrorCode::Quota
                } else {
                    ErrorCode::Internal
                },
                format!(
                    "GPU {} cannot hold the ring: {} bytes of device memory ({slots} slots of \
                     {} bytes of {}x{} {:?} images, batch {}) on a device of {} bytes: {e}",
                    gpu.label,
                    plan.bytes,
                    layout.slot.image_slot_bytes,
                    spec.crop.output_size().1,
                    spec.crop.output_size().0,
                    spec.dtype,
                    spec.batch_size,
                    gpu.device().info().total_memory,
                ),
            )
        })?;
        let vmm_fd = images.export_fd().map_err(|e| internal(&e))?;
        gpu.stats
            .ring_bytes
            .fetch_add(images.len() as u64, Ordering::Relaxed);
        Ok(MadeRing {
            memory: Arc::new(DeviceServedRing {
                host,
                images,
                gpu: gpu.clone(),
            }),
            fds: vec![host_fd, vmm_fd],
        })
    }
}
