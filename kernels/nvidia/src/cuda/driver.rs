//! Loading libcuda once per process (`cuInit` on first use) and describing the visible
//! devices ([`probe`]).

use std::sync::OnceLock;

use super::result::CuStatus;
use super::sys::{self, Driver};
use super::{result, CudaError, GpuUuid};

/// One visible device, as [`probe`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    /// The device's `GPU-` UUID, the name stoker's config and messages use for it.
    pub uuid: GpuUuid,
    /// The marketing name the driver reports (`NVIDIA H100 80GB HBM3`).
    pub name: String,
    /// Compute capability (major, minor): (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    /// Device memory in bytes (`cuDeviceTotalMem`).
    pub total_memory: u64,
    /// Whether the device can share VMM allocations as POSIX file descriptors.
    pub posix_fd_sharing: bool,
    /// Whether the device has virtual memory management (`cuMemCreate`, `cuMemMap`, ...).
    pub vmm: bool,
}

impl DeviceInfo {
    /// Why stoker cannot serve from this device, if it cannot: its rings are VMM allocations
    /// shared as POSIX file descriptors, so a device without either is refused with the reason.
    pub fn unsupported_reason(&self) -> Option<String> {
        let missing: Vec<&str> = [
            (!self.vmm).then_some(
                "virtual memory management (CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)",
            ),
            (!self.posix_fd_sharing).then_some(
                "POSIX file descriptor handles \
                 (CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED)",
            ),
        ]
        .into_iter()
        .flatten()
        .collect();
        (!missing.is_empty()).then(|| {
            format!(
                "{} has no {}, which stoker's shared rings need",
                self.name,
                missing.join(" and no ")
            )
        })
    }
}

/// What the driver reports: its version and the visible devices.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaInfo {
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor (12080 for 12.8).
    pub driver_version: i32,
    /// Every device visible to this process (`CUDA_VISIBLE_DEVICES` applies), in driver order.
    pub devices: Vec<DeviceInfo>,
}

static DRIVER: OnceLock<Result<Driver, CudaError>> = OnceLock::new();

/// The process's driver table, loading libcuda and calling `cuInit` on first use.
pub fn driver() -> Result<&'static Driver, CudaError> {
    DRIVER
        .get_or_init(load_driver)
        .as_ref()
        .map_err(Clone::clone)
}

fn load_driver() -> Result<Driver, CudaError> {
    let loaded = sys::LIBCUDA
        .open()
        .map_err(|reason| CudaError::Unavailable {
            library: "libcuda".into(),
            reason: reason.to_string(),
        })?;
    init_driver(loaded)
}

/// Loads the file at `path` as libcuda and initialises it, without keeping it as the
/// process's driver: lets tests check that a wrong or incomplete library is an error value.
pub fn try_driver_at(path: &std::path::Path) -> Result<(), CudaError> {
    // SAFETY: see `loader::open_first`: loading runs only the library's own initialisers.
    let library =
        unsafe { libloading::Library::new(path) }.map_err(|e| CudaError::Unavailable {
            library: "libcuda".into(),
            reason: format!("{}: {e}", path.display()),
        })?;
    init_driver(crate::loader::Loaded {
        library,
        origin: path.to_path_buf(),
    })
    .map(drop)
}

fn init_driver(loaded: crate::loader::Loaded) -> Result<Driver, CudaError> {
    let unavailable = |reason: String| CudaError::Unavailable {
        library: "libcuda".into(),
        reason,
    };
    let origin = loaded.origin.display().to_string();
    let d = Driver::load(loaded).map_err(|e| unavailable(e.to_string()))?;
    if let Err(e) = result::init(&d) {
        let status = match &e {
            CudaError::Driver { status, .. } => *status,
            _ => CuStatus::UNKNOWN,
        };
        let name = result::error_name(&d, status).unwrap_or_else(|| status.to_string());
        return Err(unavailable(format!("cuInit failed: {name}")));
    }
    tracing::debug!(library = %origin, "loaded the CUDA driver");
    Ok(d)
}

/// Loads the driver and describes every visible device. Never panics: a machine without
/// libcuda, without a driver, or without a GPU gets [`CudaError::Unavailable`] and the reason.
pub fn probe() -> Result<CudaInfo, CudaError> {
    let d = driver()?;
    let driver_version = result::driver_version(d)?;
    let n = result::device_count(d)?;
    if n == 0 {
        return Err(CudaError::Unavailable {
            library: "libcuda".into(),
            reason: "the driver sees no CUDA device".into(),
        });
    }
    let mut devices = Vec::new();
    for i in 0..n {
        let dev = result::device_get(d, i)?;
        let attr = |a| result::device_attribute(d, dev, a);
        devices.push(DeviceInfo {
            uuid: GpuUuid(result::device_uuid(d, dev)?),
            name: result::device_name(d, dev)?,
            compute_capability: (
                u32::try_from(attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)?)
                    .unwrap_or(0),
                u32::try_from(attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)?)
                    .unwrap_or(0),
            ),
            total_memory: result::device_total_mem(d, dev)? as u64,
            posix_fd_sharing: attr(
                sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            )? != 0,
            vmm: attr(sys::CU_DEVICE_ATTRIBUTE_VIRTUAL_MEMORY_MANAGEMENT_SUPPORTED)? != 0,
        });
    }
    Ok(CudaInfo {
        driver_version,
        devices,
    })
}
