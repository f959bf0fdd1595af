//! The CUDA driver API, loaded at run time: devices chosen by UUID, primary contexts, streams,
//! events, modules and launches, device buffers, and VMM rings shared across processes.
//!
//! # Design
//! Three layers, as in cudarc: `sys` (raw symbols through `libloading`), `result` (one function
//! per call returning `Result<_, CudaError>` with named statuses) and the safe types here.
//! `sys` is a [`crate::symbol_table!`]; `result` makes every call; this module's unsafe code is
//! where raw handles become owning types (`Send`/`Sync`, `Drop`) and the kernel launch, whose
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

pub mod result;
pub mod sys;
pub mod vmm;

use std::ffi::c_void;
use std::fmt;
use std::str::FromStr;
use std::sync::{Arc, OnceLock};

use result::CuStatus;
use sys::Driver;

/// What can go wrong with the driver.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The library, one of its symbols, or a usable device is missing.
    #[error("{library} unavailable: {reason}")]
    Unavailable { library: String, reason: String },
    /// A driver call returned an error status.
    #[error("{call} failed: {status}")]
    Driver {
        call: &'static str,
        status: CuStatus,
    },
    /// No visible device has this UUID.
    #[error("no CUDA device with UUID {0} (visible: {1})")]
    NoSuchDevice(GpuUuid, String),
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

/// A GPU's UUID, the only way stoker names a device (`CUDA_VISIBLE_DEVICES` renumbers ordinals).
/// Formats as nvidia-smi does: `GPU-` and lowercase 8-4-4-4-12 hex.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct GpuUuid(pub [u8; 16]);

impl fmt::Display for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let b = &self.0;
        write!(f, "GPU-")?;
        for (i, byte) in b.iter().enumerate() {
            if matches!(i, 4 | 6 | 8 | 10) {
                write!(f, "-")?;
            }
            write!(f, "{byte:02x}")?;
        }
        Ok(())
    }
}

impl fmt::Debug for GpuUuid {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for GpuUuid {
    type Err = CudaError;

    /// Accepts `GPU-` + 8-4-4-4-12 hex digits, either case; the `GPU-` prefix is required so a
    /// MIG UUID or an ordinal is never taken for a GPU.
    fn from_str(s: &str) -> Result<GpuUuid, CudaError> {
        let bad = || CudaError::BadUuid(s.to_string());
        let rest = s
            .strip_prefix("GPU-")
            .or_else(|| s.strip_prefix("gpu-"))
            .ok_or_else(bad)?;
        let groups: Vec<&str> = rest.split('-').collect();
        if groups.iter().map(|g| g.len()).collect::<Vec<_>>() != [8, 4, 4, 4, 12] {
            return Err(bad());
        }
        let hex: String = groups.concat();
        let mut out = [0u8; 16];
        for (i, o) in out.iter_mut().enumerate() {
            *o = u8::from_str_radix(hex.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(GpuUuid(out))
    }
}

/// One visible device, as [`probe`] reports it.
#[derive(Debug, Clone, PartialEq)]
pub struct DeviceInfo {
    pub uuid: GpuUuid,
    pub name: String,
    /// Compute capability (major, minor): (9, 0) for H100/H200.
    pub compute_capability: (u32, u32),
    pub total_memory: u64,
    /// Whether the device can share VMM allocations as POSIX file descriptors.
    pub posix_fd_sharing: bool,
}

/// What the driver reports: its version and the visible devices.
#[derive(Debug, Clone, PartialEq)]
pub struct CudaInfo {
    /// `cuDriverGetVersion`: 1000 * major + 10 * minor (12080 for 12.8).
    pub driver_version: i32,
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
            reason,
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
    let d = Driver::load(loaded).map_err(|r| unavailable(format!("{origin}: {r}")))?;
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
                attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR)? as u32,
                attr(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR)? as u32,
            ),
            total_memory: result::device_total_mem(d, dev)? as u64,
            posix_fd_sharing: attr(
                sys::CU_DEVICE_ATTRIBUTE_HANDLE_TYPE_POSIX_FILE_DESCRIPTOR_SUPPORTED,
            )? != 0,
        });
    }
    Ok(CudaInfo {
        driver_version,
        devices,
    })
}

/// Logs a failure from a destructor, ignoring the driver shutting down at process exit.
fn log_drop_error(what: &str, r: Result<(), CudaError>) {
    match r {
        Ok(()) => {}
        Err(CudaError::Driver { status, .. }) if status == CuStatus::DEINITIALIZED => {}
        Err(e) => tracing::warn!(error = %e, "releasing {what} failed"),
    }
}

struct DeviceInner {
    d: &'static Driver,
    dev: sys::CUdevice,
    ctx: sys::CUcontext,
    info: DeviceInfo,
}

// SAFETY: a primary context handle may be used from any thread (each thread binds it with
// cuCtxSetCurrent before use); the driver synchronises access internally.
unsafe impl Send for DeviceInner {}
// SAFETY: as above; `DeviceInner` has no interior mutability on our side.
unsafe impl Sync for DeviceInner {}

impl Drop for DeviceInner {
    fn drop(&mut self) {
        // SAFETY: balances the retain in `Device::open`.
        log_drop_error("primary context", unsafe {
            result::primary_ctx_release(self.d, self.dev)
        });
    }
}

/// A GPU with its primary context retained. Cheap to clone; the context is released when the
/// last clone and everything made from it are gone.
#[derive(Clone)]
pub struct Device {
    inner: Arc<DeviceInner>,
}

impl fmt::Debug for Device {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Device")
            .field("uuid", &self.inner.info.uuid)
            .field("name", &self.inner.info.name)
            .finish()
    }
}

impl Device {
    /// Opens the device with this UUID, wherever `CUDA_VISIBLE_DEVICES` put it.
    pub fn open(uuid: GpuUuid) -> Result<Device, CudaError> {
        let d = driver()?;
        let info = probe()?;
        let ordinal = info.devices.iter().position(|x| x.uuid == uuid);
        let Some(ordinal) = ordinal else {
            let visible: Vec<String> = info.devices.iter().map(|x| x.uuid.to_string()).collect();
            return Err(CudaError::NoSuchDevice(uuid, visible.join(", ")));
        };
        let dev = result::device_get(d, ordinal as i32)?;
        let ctx = result::primary_ctx_retain(d, dev)?;
        let device = Device {
            inner: Arc::new(DeviceInner {
                d,
                dev,
                ctx,
                info: info.devices[ordinal].clone(),
            }),
        };
        device.bind()?;
        Ok(device)
    }

    pub fn info(&self) -> &DeviceInfo {
        &self.inner.info
    }

    /// Makes this device's context current on the calling thread. Every safe call below does it.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: the context is retained for as long as `self` lives.
        unsafe { result::ctx_set_current(self.inner.d, self.inner.ctx) }
    }

    pub(crate) fn driver(&self) -> &'static Driver {
        self.inner.d
    }

    pub(crate) fn raw(&self) -> sys::CUdevice {
        self.inner.dev
    }

    /// A new non-blocking stream.
    pub fn stream(&self) -> Result<Stream, CudaError> {
        self.bind()?;
        let raw = result::stream_create(self.inner.d)?;
        Ok(Stream {
            raw,
            device: self.clone(),
        })
    }

    /// A new event; `timing` events can measure elapsed time, others are cheaper.
    pub fn event(&self, timing: bool) -> Result<Event, CudaError> {
        self.bind()?;
        let raw = result::event_create(self.inner.d, timing)?;
        Ok(Event {
            raw,
            device: self.clone(),
        })
    }

    /// Loads a cubin (from `stoker_nvidia::nvrtc`) into this device's context.
    pub fn load_module(&self, cubin: &[u8]) -> Result<Module, CudaError> {
        self.bind()?;
        let raw = result::module_load_data(self.inner.d, cubin)?;
        Ok(Module {
            raw,
            device: self.clone(),
        })
    }

    /// `bytes` of uninitialised device memory.
    pub fn alloc(&self, bytes: usize) -> Result<DeviceBuffer, CudaError> {
        if bytes == 0 {
            return Err(CudaError::Invalid("a device buffer of 0 bytes".into()));
        }
        self.bind()?;
        let ptr = result::mem_alloc(self.inner.d, bytes)?;
        Ok(DeviceBuffer {
            ptr,
            bytes,
            device: self.clone(),
        })
    }
}

/// Restores the calling thread's current context when dropped: for code that runs on threads
/// it does not own (a framework's thread deleting a tensor), where binding our context and
/// leaving it bound would change that thread's current device under its owner.
pub struct ContextRestore {
    d: &'static Driver,
    previous: sys::CUcontext,
}

impl ContextRestore {
    /// Remembers the calling thread's current context.
    pub fn save() -> Result<ContextRestore, CudaError> {
        let d = driver()?;
        Ok(ContextRestore {
            d,
            previous: result::ctx_get_current(d)?,
        })
    }
}

impl Drop for ContextRestore {
    fn drop(&mut self) {
        // SAFETY: the context was current on this thread when saved (or null, which unbinds);
        // its owner keeps it alive while it is current.
        log_drop_error("current context", unsafe {
            result::ctx_set_current(self.d, self.previous)
        });
    }
}

/// A CUDA stream. Dropping it does not wait for its work (the driver finishes it).
pub struct Stream {
    raw: sys::CUstream,
    // Field order: the device (and its context) outlives the stream handle.
    device: Device,
}

// SAFETY: stream handles may be used from any thread that binds the context.
unsafe impl Send for Stream {}

impl Stream {
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the stream is live while `self` is.
        unsafe { result::stream_synchronize(self.device.driver(), self.raw) }
    }

    pub fn raw(&self) -> sys::CUstream {
        self.raw
    }

    /// Copies `src` into device memory at `dst + offset`; returns once `src` is staged
    /// (pageable host memory is copied before the call returns).
    pub fn copy_to_device(
        &self,
        dst: &DeviceBuffer,
        offset: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        let fits = matches!(offset.checked_add(src.len()), Some(end) if end <= dst.bytes);
        if !fits {
            return Err(CudaError::Invalid(format!(
                "copy of {} bytes at {offset} into a buffer of {}",
                src.len(),
                dst.bytes
            )));
        }
        self.device.bind()?;
        // SAFETY: the range is inside `dst` (checked above); `src` is pageable memory, which
        // the driver stages before returning.
        unsafe {
            result::memcpy_htod_async(self.device.driver(), dst.ptr + offset as u64, src, self.raw)
        }
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the stream.
            log_drop_error("stream", unsafe {
                result::stream_destroy(self.device.driver(), self.raw)
            });
        }
    }
}

/// A CUDA event: fences slots (a slot is reused only once its consumer's event completed).
pub struct Event {
    raw: sys::CUevent,
    device: Device,
}

// SAFETY: event handles may be used from any thread that binds the context.
unsafe impl Send for Event {}

impl Event {
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: both handles are live and of this device's context.
        unsafe { result::event_record(self.device.driver(), self.raw, stream.raw) }
    }

    /// Records the event on a stream this crate did not create: a consumer's (a framework's
    /// stream handed over as a raw `CUstream`), or the null stream (`0`, `CU_STREAM_LEGACY` = 1,
    /// `CU_STREAM_PER_THREAD` = 2).
    ///
    /// # Safety
    /// `stream` must be one of the null-stream handles or a live stream of this device's
    /// primary context.
    pub unsafe fn record_raw(&self, stream: sys::CUstream) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live; the caller vouches for the stream.
        unsafe { result::event_record(self.device.driver(), self.raw, stream) }
    }

    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live.
        unsafe { result::event_synchronize(self.device.driver(), self.raw) }
    }

    /// Whether the work recorded before the event has completed.
    pub fn is_complete(&self) -> Result<bool, CudaError> {
        self.device.bind()?;
        // SAFETY: the event is live.
        unsafe { result::event_query(self.device.driver(), self.raw) }
    }

    /// Milliseconds from `start` to `self`, both timing events already completed.
    pub fn elapsed_ms_since(&self, start: &Event) -> Result<f32, CudaError> {
        self.device.bind()?;
        // SAFETY: both events are live; the driver reports non-timing or unrecorded events as
        // an error status.
        unsafe { result::event_elapsed_ms(self.device.driver(), start.raw, self.raw) }
    }
}

impl Drop for Event {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the event.
            log_drop_error("event", unsafe {
                result::event_destroy(self.device.driver(), self.raw)
            });
        }
    }
}

/// A loaded cubin.
pub struct Module {
    raw: sys::CUmodule,
    device: Device,
}

// SAFETY: module handles may be used from any thread that binds the context.
unsafe impl Send for Module {}
// SAFETY: looking up functions is thread-safe in the driver.
unsafe impl Sync for Module {}

impl Module {
    /// The `extern "C"` kernel called `name`.
    pub fn function(&self, name: &str) -> Result<Function<'_>, CudaError> {
        let cname =
            std::ffi::CString::new(name).map_err(|_| CudaError::NoSuchKernel(name.to_string()))?;
        self.device.bind()?;
        // SAFETY: the module is live while `self` is.
        let raw = unsafe { result::module_get_function(self.device.driver(), self.raw, &cname) }
            .map_err(|e| match e {
                CudaError::Driver { status, .. } if status == CuStatus::NOT_FOUND => {
                    CudaError::NoSuchKernel(name.to_string())
                }
                e => e,
            })?;
        Ok(Function { raw, module: self })
    }

    pub fn device(&self) -> &Device {
        &self.device
    }
}

impl Drop for Module {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the module and every `Function` borrowed it, so none is left.
            log_drop_error("module", unsafe {
                result::module_unload(self.device.driver(), self.raw)
            });
        }
    }
}

/// A kernel of a [`Module`].
pub struct Function<'m> {
    raw: sys::CUfunction,
    module: &'m Module,
}

impl Function<'_> {
    /// Launches the kernel.
    ///
    /// # Safety
    /// `params` must hold one pointer per kernel parameter, each to a value of exactly that
    /// parameter's type (see the `#[repr(C)]` mirrors in `stoker_kernels::augment`), and every device
    /// pointer the kernel dereferences must stay valid until the launch completes on `stream`.
    pub unsafe fn launch(
        &self,
        stream: &Stream,
        grid: (u32, u32, u32),
        block: (u32, u32, u32),
        params: &mut [*mut c_void],
    ) -> Result<(), CudaError> {
        let device = &self.module.device;
        device.bind()?;
        // SAFETY: the caller upholds the kernel's contract; handles are live.
        unsafe {
            result::launch_kernel(
                device.driver(),
                self.raw,
                grid,
                block,
                0,
                stream.raw,
                params,
            )
        }
    }
}

/// Device memory from `cuMemAlloc`, freed on drop. Drop does not wait for work on it: the
/// owner must have synchronised (the pipeline fences every use with an event).
pub struct DeviceBuffer {
    ptr: sys::CUdeviceptr,
    bytes: usize,
    device: Device,
}

// SAFETY: a device pointer is an address usable from any thread that binds the context.
unsafe impl Send for DeviceBuffer {}

impl DeviceBuffer {
    pub fn ptr(&self) -> u64 {
        self.ptr
    }

    pub fn len(&self) -> usize {
        self.bytes
    }

    pub fn is_empty(&self) -> bool {
        self.bytes == 0
    }

    /// Copies the whole buffer to the host, synchronously (self-test and debugging only).
    pub fn read(&self, out: &mut [u8]) -> Result<(), CudaError> {
        if out.len() > self.bytes {
            return Err(CudaError::Invalid(format!(
                "read of {} bytes from a buffer of {}",
                out.len(),
                self.bytes
            )));
        }
        self.device.bind()?;
        // SAFETY: the range is inside this buffer (checked above).
        unsafe { result::memcpy_dtoh(self.device.driver(), out, self.ptr) }
    }
}

impl Drop for DeviceBuffer {
    fn drop(&mut self) {
        if self.device.bind().is_ok() {
            // SAFETY: `self` owns the allocation; the owner synchronised (see the type's docs).
            log_drop_error("device buffer", unsafe {
                result::mem_free(self.device.driver(), self.ptr)
            });
        }
    }
}

/// Name of a status as libcuda spells it (for messages only).
pub fn status_name(status: CuStatus) -> String {
    driver()
        .ok()
        .and_then(|d| result::error_name(d, status))
        .unwrap_or_else(|| status.name().to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uuids_round_trip_in_nvidia_smi_form() {
        let s = "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6";
        let u: GpuUuid = s.parse().unwrap();
        assert_eq!(u.0[0], 0x5e);
        assert_eq!(u.0[15], 0xf6);
        assert_eq!(u.to_string(), s);
        let upper: GpuUuid = "GPU-5E2F0D8A-1B2C-4D3E-8F90-A1B2C3D4E5F6".parse().unwrap();
        assert_eq!(upper, u);
    }

    #[test]
    fn bad_uuids_are_rejected() {
        for s in [
            "0",
            "5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "MIG-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "GPU-5e2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f",
            "GPU-5e2f0d8a1b2c-4d3e-8f90-a1b2c3d4e5f6-",
            "GPU-zz2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
            "GPU-é2f0d8a-1b2c-4d3e-8f90-a1b2c3d4e5f6",
        ] {
            assert!(
                matches!(s.parse::<GpuUuid>(), Err(CudaError::BadUuid(_))),
                "{s}"
            );
        }
    }

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
