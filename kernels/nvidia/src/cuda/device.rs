//! A GPU with its primary context retained ([`Device`]), and restoring a thread's context
//! ([`ContextRestore`]). What a device makes (streams and events, modules, buffers) is made by
//! methods of [`Device`] that sit beside each type, in `stream`, `module` and `buffer`, so
//! that this file knows none of them.

use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use super::sys::{self, Driver};
use super::{driver, log_drop_error, probe, result, CudaError, DeviceInfo, GpuUuid};

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

/// `CU_CTX_SCHED_BLOCKING_SYNC` (cuda.h): "Instruct CUDA to block the CPU thread on a
/// synchronization primitive when waiting for the GPU to finish work."
pub const CU_CTX_SCHED_BLOCKING_SYNC: u32 = 0x04;

/// Whether [`Device::open`] sets [`CU_CTX_SCHED_BLOCKING_SYNC`] on a primary context before it
/// retains it ([`set_blocking_sync`]).
static BLOCKING_SYNC: AtomicBool = AtomicBool::new(false);

/// Makes every later [`Device::open`] in this process set `CU_CTX_SCHED_BLOCKING_SYNC` on the
/// primary context before retaining it (`cuDevicePrimaryCtxSetFlags_v2`), so the driver's own
/// waits (nvJPEG's, a stream synchronise) sleep instead of spinning. The primary context is the
/// process's: only a process that shares it with no framework (the daemon, the bench) should
/// ask; a process-wide setting because the driver's is.
pub fn set_blocking_sync(on: bool) {
    BLOCKING_SYNC.store(on, Ordering::Relaxed);
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
    /// The driver this device's context belongs to.
    pub(super) fn driver_api(&self) -> &'static Driver {
        self.inner.d
    }

    /// Opens the device with this UUID, wherever `CUDA_VISIBLE_DEVICES` put it.
    pub fn open(uuid: GpuUuid) -> Result<Device, CudaError> {
        let d = driver()?;
        let info = probe()?;
        let ordinal = info.devices.iter().position(|x| x.uuid == uuid);
        let Some(ordinal) = ordinal else {
            let visible: Vec<String> = info.devices.iter().map(|x| x.uuid.to_string()).collect();
            return Err(CudaError::NoSuchDevice(uuid, visible.join(", ")));
        };
        if let Some(why) = info.devices[ordinal].unsupported_reason() {
            return Err(CudaError::Unsupported(uuid, why));
        }
        // The ordinal indexes the devices `probe` listed from the driver's `c_int` count.
        #[allow(clippy::cast_possible_truncation, clippy::cast_possible_wrap)]
        let dev = result::device_get(d, ordinal as i32)?;
        if BLOCKING_SYNC.load(Ordering::Relaxed) {
            result::primary_ctx_set_flags(d, dev, CU_CTX_SCHED_BLOCKING_SYNC)?;
        }
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

    /// The primary context's flags (`cuDevicePrimaryCtxGetState`): its scheduling.
    pub fn context_flags(&self) -> Result<u32, CudaError> {
        Ok(result::primary_ctx_get_state(self.inner.d, self.inner.dev)?.0)
    }

    /// The device as [`probe`] described it when it was opened.
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

    /// This device's stream priorities, (least, greatest): lower numbers are higher priorities.
    pub fn stream_priority_range(&self) -> Result<(i32, i32), CudaError> {
        self.bind()?;
        result::stream_priority_range(self.inner.d)
    }
}

/// Restores the calling thread's current context when dropped: for code that runs on threads
/// it does not own (a framework's thread deleting a tensor), where binding our context and
/// leaving it bound would change that thread's current device under its owner.
#[derive(Debug)]
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
