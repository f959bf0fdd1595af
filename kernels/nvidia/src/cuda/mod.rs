//! The CUDA driver API, loaded at run time: devices chosen by UUID, primary contexts, streams,
//! events, modules and launches, device buffers, and VMM rings shared across processes.
//!
//! # Design
//! Three layers, as in cudarc: `sys` (raw symbols through `libloading`), `result` (one function
//! per call returning `Result<_, CudaError>` with named statuses) and the safe types, one room
//! each: `driver` (loading, [`probe`]), `uuid` ([`GpuUuid`]), `device` ([`Device`],
//! [`ContextRestore`]), `stream` ([`Stream`], [`Event`]), `module` ([`Module`], [`Function`]),
//! `buffer` ([`DeviceBuffer`]), `pinned` ([`PinnedHostBuffer`]) and `vmm` (rings shared across processes). `sys` is a
//! [`crate::symbol_table!`]; `result` makes every call; the safe rooms' unsafe code is where
//! raw handles become owning types (`Send`/`Sync`, `Drop`) and the kernel launch, whose
//! parameters only the caller can vouch for (docs/cuda.md lists every place).
//!
//! We bind the driver ourselves instead of using the `cudarc` crate: cudarc panics when libcuda
//! is missing (one must remember `is_culib_present()` before every first touch), pulls in far
//! more API than the ~40 calls stoker makes, and its dynamic-loading build still resolves every
//! symbol it knows, so an older driver missing one unrelated symbol fails the lot. This binding
//! is small enough to be reviewed whole and to go into the client library too.
//!
//! The driver is loaded and `cuInit` called once per process, on first use; the outcome (a
//! table or the reason there is none) is kept. Every failure to load is
//! [`CudaError::Unavailable`]; the daemon then serves from the CPU backend and logs the reason.
//!
//! # Limitations
//! - Devices are whole GPUs named by `GPU-` UUIDs; MIG instances (`MIG-` UUIDs) are not handled.
//! - Errors in `Drop` are logged, never raised; `CUDA_ERROR_DEINITIALIZED` at exit is ignored.

mod buffer;
mod device;
mod driver;
mod module;
mod pinned;
pub mod result;
mod stream;
pub mod sys;
mod uuid;
pub mod vmm;

pub use buffer::DeviceBuffer;
pub use device::{set_blocking_sync, ContextRestore, Device, CU_CTX_SCHED_BLOCKING_SYNC};
pub use driver::{driver, probe, try_driver_at, CudaInfo, DeviceInfo};
pub use module::{Function, Module};
pub use pinned::PinnedHostBuffer;
pub use stream::{Event, Stream};
pub use uuid::GpuUuid;

use result::CuStatus;

/// What can go wrong with the driver.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The library, one of its symbols, or a usable device is missing.
    #[error("{library} unavailable: {reason}")]
    Unavailable {
        /// The library's short name (`libcuda`).
        library: String,
        /// What was tried and why it failed, or what is missing.
        reason: String,
    },
    /// A driver call returned an error status.
    #[error("{call} failed: {status}")]
    Driver {
        /// The driver call as `cuda.h` names it (`cuMemCreate`).
        call: &'static str,
        /// The status it returned.
        status: CuStatus,
    },
    /// No visible device has this UUID.
    #[error("no CUDA device with UUID {0} (visible: {1})")]
    NoSuchDevice(GpuUuid, String),
    /// The device lacks a capability stoker needs (`DeviceInfo::unsupported_reason`).
    #[error("GPU {0} is not supported: {1}")]
    Unsupported(GpuUuid, String),
    /// A string that is not a `GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx` UUID.
    #[error("not a GPU UUID: {0:?} (expected GPU-xxxxxxxx-xxxx-xxxx-xxxx-xxxxxxxxxxxx)")]
    BadUuid(String),
    /// A kernel has no function of this name.
    #[error("kernel {0:?} not found in module")]
    NoSuchKernel(String),
    /// A size or count that the driver cannot take.
    #[error("invalid argument: {0}")]
    Invalid(String),
}

impl CudaError {
    /// True where the cause is a missing library, driver or device rather than a failure.
    pub fn is_unavailable(&self) -> bool {
        matches!(self, CudaError::Unavailable { .. })
    }
}

/// Logs a failure from a destructor, ignoring the driver shutting down at process exit.
fn log_drop_error(what: &str, r: Result<(), CudaError>) {
    match r {
        Ok(()) => {}
        Err(CudaError::Driver { status, .. }) if status == CuStatus::DEINITIALIZED => {}
        Err(e) => tracing::warn!(error = %e, "releasing {what} failed"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn statuses_have_names() {
        assert_eq!(CuStatus::NO_DEVICE.name(), "CUDA_ERROR_NO_DEVICE");
        assert_eq!(CuStatus(12345).name(), "CUDA_ERROR_(unnamed)");
        let e = CudaError::Driver {
            call: "cuMemCreate",
            status: CuStatus::OUT_OF_MEMORY,
        };
        assert_eq!(
            e.to_string(),
            "cuMemCreate failed: CUDA_ERROR_OUT_OF_MEMORY (2)"
        );
    }
}
