//! Whether this host can really serve from a GPU: more than "the libraries load".
//!
//! # Design
//! [`check_device`] does on one GPU the two things that fail when a library is newer than the
//! driver, or the driver cannot run the device: it compiles a trivial kernel with the NVRTC in
//! use and loads the cubin into the GPU's primary context (`cuModuleLoadData` refuses a cubin
//! of a newer CUDA than the driver's), and it creates an nvJPEG handle there (nvJPEG's runtime
//! refuses an older driver). Each failure names the library versions and the driver's.
//!
//! # Limitations
//! It proves the libraries and the driver agree, not that decoding gives the right pixels
//! (`stoker selftest --gpu` does).

use crate::compat::CudaVersion;
use crate::cuda::{CudaError, Device, DeviceInfo};
use crate::nvjpeg::{NvjpegError, NvjpegLib};
use crate::nvrtc::{Nvrtc, NvrtcError};

/// The trivial kernel compiled and loaded to prove NVRTC and the driver agree.
const PROBE_SOURCE: &str = "extern \"C\" __global__ void stoker_probe(int *out) { \
                            if (out) { *out = 1; } }";

/// Why a GPU cannot serve here, naming the versions involved.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UsabilityError {
    /// The GPU could not be opened or its context bound.
    #[error("opening {gpu}: {source}")]
    Open {
        /// The GPU as `UUID (name)`.
        gpu: String,
        /// The driver's error.
        source: CudaError,
    },
    /// No NVRTC loads, or it cannot compile for the GPU.
    #[error("NVRTC: {0}")]
    Nvrtc(NvrtcError),
    /// No libnvjpeg loads.
    #[error("nvJPEG: {0}")]
    Nvjpeg(NvjpegError),
    /// The driver refuses the cubin NVRTC built (NVRTC newer than the driver).
    #[error(
        "the driver (CUDA {driver}) does not load a cubin built by NVRTC {nvrtc} for {gpu}: \
         {source}"
    )]
    Cubin {
        /// The GPU as `UUID (name)`.
        gpu: String,
        /// The CUDA version the driver runs.
        driver: CudaVersion,
        /// NVRTC's version, `major.minor`.
        nvrtc: String,
        /// The driver's error loading the cubin or finding its kernel.
        source: CudaError,
    },
    /// nvJPEG cannot create a handle on the GPU (nvJPEG newer than the driver).
    #[error("the driver (CUDA {driver}) cannot run nvJPEG {nvjpeg} on {gpu}: {source}")]
    Handle {
        /// The GPU as `UUID (name)`.
        gpu: String,
        /// The CUDA version the driver runs.
        driver: CudaVersion,
        /// nvJPEG's version, `major.minor.patch`.
        nvjpeg: String,
        /// nvJPEG's error creating the handle.
        source: NvjpegError,
    },
}

/// Compiles and loads a trivial cubin and creates an nvJPEG handle on `info`'s GPU.
pub fn check_device(info: &DeviceInfo, driver: CudaVersion) -> Result<(), Box<UsabilityError>> {
    let gpu = format!("{} ({})", info.uuid, info.name);
    let nvrtc = Nvrtc::global().map_err(|e| Box::new(UsabilityError::Nvrtc(e)))?;
    let nvjpeg = NvjpegLib::global().map_err(|e| Box::new(UsabilityError::Nvjpeg(e)))?;
    let device = Device::open(info.uuid).map_err(|source| UsabilityError::Open {
        gpu: gpu.clone(),
        source,
    })?;
    let (major, minor) = info.compute_capability;
    let cubin = nvrtc
        .compile_str("stoker_probe.cu", PROBE_SOURCE, major * 10 + minor)
        .map_err(|e| Box::new(UsabilityError::Nvrtc(e)))?;
    let (v0, v1) = nvrtc.version();
    device
        .load_module(&cubin)
        .and_then(|m| m.function("stoker_probe").map(drop))
        .map_err(|source| UsabilityError::Cubin {
            gpu: gpu.clone(),
            driver,
            nvrtc: format!("{v0}.{v1}"),
            source,
        })?;
    device.bind().map_err(|source| UsabilityError::Open {
        gpu: gpu.clone(),
        source,
    })?;
    let (j0, j1, j2) = nvjpeg.version();
    nvjpeg.try_create_handle(false).map_err(|source| {
        Box::new(UsabilityError::Handle {
            gpu,
            driver,
            nvjpeg: format!("{j0}.{j1}.{j2}"),
            source,
        })
    })
}
