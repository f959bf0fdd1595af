//! Initialisation, devices and primary contexts.
//!
//! # Design
//! `cuInit` reads the configuration once ([`crate::config`]) and refuses (as a stub libcuda
//! does, `CUDA_ERROR_STUB_LIBRARY`) unless `STOKER_GPU_EMULATOR=1`. Device handles are the
//! ordinals of the visible devices. Only primary contexts exist, as stoker uses them.
//!
//! # Limitations
//! No `cuCtxCreate`/`cuCtxPushCurrent`: non-primary contexts are not emulated.

use std::cell::Cell;
use std::ffi::{c_char, c_int, c_void, CStr};

use super::{api, Api};
use crate::boundary::{ctx_handle, out};
use crate::config::ComputeMode;
use crate::state::{initialize, Emu, CURRENT};
use crate::status::{self, CUresult};

const ATTR_MAX_THREADS_PER_BLOCK: c_int = 1;
const ATTR_MAX_BLOCK_DIM_X: c_int = 2;
const ATTR_MAX_BLOCK_DIM_Z: c_int = 4;
const ATTR_MAX_GRID_DIM_X: c_int = 5;
const ATTR_MAX_GRID_DIM_YZ: [c_int; 2] = [6, 7];
const ATTR_WARP_SIZE: c_int = 10;
const ATTR_MULTIPROCESSOR_COUNT: c_int = 16;
const ATTR_INTEGRATED: c_int = 18;
const ATTR_COMPUTE_MODE: c_int = 20;
const ATTR_CAN_MAP_HOST_MEMORY: c_int = 19;
const ATTR_PCI_BUS_ID: c_int = 33;
const ATTR_PCI_DEVICE_ID: c_int = 34;
const ATTR_UNIFIED_ADDRESSING: c_int = 41;
const ATTR_PCI_DOMAIN_ID: c_int = 50;
const ATTR_CC_MAJOR: c_int = 75;
const ATTR_CC_MINOR: c_int = 76;
const ATTR_VMM_SUPPORTED: c_int = 102;
const ATTR_POSIX_FD_SUPPORTED: c_int = 103;

fn device(e: &Emu, dev: c_int) -> Result<usize, CUresult> {
    usize::try_from(dev)
        .ok()
        .filter(|&d| d < e.devices.len())
        .ok_or(status::INVALID_DEVICE)
}

fn on_device<T>(a: &Api, dev: c_int, f: impl FnOnce(&Emu, usize) -> T) -> Result<T, CUresult> {
    let e = a.lock();
    let d = device(&e, dev)?;
    Ok(f(&e, d))
}

/// Initialises the driver (flags must be 0); refuses with `CUDA_ERROR_STUB_LIBRARY` unless
/// `STOKER_GPU_EMULATOR=1`.
#[no_mangle]
pub extern "C" fn cuInit(flags: u32) -> CUresult {
    if flags != 0 {
        return status::INVALID_VALUE;
    }
    initialize()
}

/// Writes the configured driver version (1000 × major + 10 × minor); works before `cuInit`.
#[no_mangle]
pub extern "C" fn cuDriverGetVersion(v: *mut c_int) -> CUresult {
    // Works before cuInit, as the driver's does: the configuration is read here.
    let version = match crate::config::load() {
        Ok(m) => m.driver_version,
        Err(e) => {
            eprintln!("stoker GPU emulator: cuDriverGetVersion: {e}");
            return status::INVALID_VALUE;
        }
    };
    // SAFETY: out-parameter from the caller.
    status_of(unsafe { out(v, version) })
}

/// Points `*s` at a status's `CUDA_ERROR_*` name; an unknown status is
/// `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuGetErrorName(code: CUresult, s: *mut *const c_char) -> CUresult {
    static_string(status::name(code), s)
}

/// Points `*s` at a status's message, as cuda.h words it; an unknown status is
/// `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuGetErrorString(code: CUresult, s: *mut *const c_char) -> CUresult {
    static_string(status::message(code), s)
}

/// The status of a call that works before `cuInit` (it does not go through [`api`]).
fn status_of(r: Result<(), CUresult>) -> CUresult {
    r.err().unwrap_or(status::SUCCESS)
}

/// Hands out a static string (a status's name or message); an unknown status is
/// `CUDA_ERROR_INVALID_VALUE`.
fn static_string(found: Option<&'static CStr>, s: *mut *const c_char) -> CUresult {
    let Some(text) = found else {
        return status::INVALID_VALUE;
    };
    // SAFETY: out-parameter from the caller; the string is static.
    status_of(unsafe { out(s, text.as_ptr()) })
}

/// Writes the number of visible devices (those the configuration lists).
#[no_mangle]
pub extern "C" fn cuDeviceGetCount(n: *mut c_int) -> CUresult {
    api("cuDeviceGetCount", |a| {
        let count = a.lock().devices.len() as c_int;
        // SAFETY: out-parameter from the caller.
        unsafe { out(n, count) }
    })
}

/// Writes the device handle (`CUdevice`, its ordinal) of ordinal `ordinal`.
#[no_mangle]
pub extern "C" fn cuDeviceGet(d: *mut c_int, ordinal: c_int) -> CUresult {
    api("cuDeviceGet", |a| {
        let dev = device(&a.lock(), ordinal)?;
        // SAFETY: out-parameter from the caller.
        unsafe { out(d, dev as c_int) }
    })
}

/// Writes the device's 16-byte `CUuuid`, the one its configuration gives.
#[no_mangle]
pub extern "C" fn cuDeviceGetUuid_v2(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    api("cuDeviceGetUuid_v2", |a| {
        let u = on_device(a, dev, |e, d| e.machine.devices[d].uuid)?;
        // SAFETY: out-parameter from the caller (a 16-byte CUuuid).
        unsafe { out(uuid, u) }
    })
}

/// The older name of `cuDeviceGetUuid_v2`, for callers linked against it.
#[no_mangle]
pub extern "C" fn cuDeviceGetUuid(uuid: *mut [u8; 16], dev: c_int) -> CUresult {
    cuDeviceGetUuid_v2(uuid, dev)
}

/// Writes the device's name, NUL-terminated and cut to `len` bytes.
#[no_mangle]
pub extern "C" fn cuDeviceGetName(name: *mut c_char, len: c_int, dev: c_int) -> CUresult {
    api("cuDeviceGetName", |a| {
        let n = on_device(a, dev, |e, d| e.machine.devices[d].config.name.clone())?;
        if name.is_null() || len <= 0 {
            return Err(status::INVALID_VALUE);
        }
        let bytes = n.as_bytes();
        let k = bytes.len().min(len as usize - 1);
        // SAFETY: the caller gives `len` writable bytes; we write k + 1 <= len.
        unsafe {
            std::ptr::copy_nonoverlapping(bytes.as_ptr(), name.cast::<u8>(), k);
            *name.add(k) = 0;
        }
        Ok(())
    })
}

/// Writes the device's memory in bytes (its configured MiB).
#[no_mangle]
pub extern "C" fn cuDeviceTotalMem_v2(bytes: *mut usize, dev: c_int) -> CUresult {
    api("cuDeviceTotalMem_v2", |a| {
        let m = on_device(a, dev, |e, d| e.machine.devices[d].config.memory_mib << 20)?;
        // SAFETY: out-parameter from the caller.
        unsafe { out(bytes, m as usize) }
    })
}

/// Writes one `CUdevice_attribute`: an H100's fixed limits, and the compute capability, compute
/// mode, VMM and POSIX-fd support the configuration gives; any other is
/// `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuDeviceGetAttribute(v: *mut c_int, attr: c_int, dev: c_int) -> CUresult {
    api("cuDeviceGetAttribute", |a| {
        let (config, ordinal) = on_device(a, dev, |e, d| {
            (e.machine.devices[d].config.clone(), d as c_int)
        })?;
        let cc = config.compute_capability;
        let value = match attr {
            ATTR_MAX_THREADS_PER_BLOCK => 1024,
            ATTR_MAX_BLOCK_DIM_X..=3 => 1024,
            ATTR_MAX_BLOCK_DIM_Z => 64,
            ATTR_MAX_GRID_DIM_X => i32::MAX,
            x if ATTR_MAX_GRID_DIM_YZ.contains(&x) => 65_535,
            ATTR_WARP_SIZE => 32,
            ATTR_MULTIPROCESSOR_COUNT => 132,
            ATTR_INTEGRATED => 0,
            ATTR_COMPUTE_MODE => config.compute_mode.value(),
            ATTR_CAN_MAP_HOST_MEMORY | ATTR_UNIFIED_ADDRESSING => 1,
            ATTR_PCI_BUS_ID => 0x10 + ordinal,
            ATTR_PCI_DEVICE_ID | ATTR_PCI_DOMAIN_ID => 0,
            ATTR_CC_MAJOR => cc[0] as c_int,
            ATTR_CC_MINOR => cc[1] as c_int,
            ATTR_VMM_SUPPORTED => c_int::from(config.vmm),
            ATTR_POSIX_FD_SUPPORTED => c_int::from(config.posix_fd),
            _ => return Err(status::INVALID_VALUE),
        };
        // SAFETY: out-parameter from the caller.
        unsafe { out(v, value) }
    })
}

/// Retains the device's primary context and writes its `CUcontext`; a broken device returns its
/// sticky status, a prohibited one `CUDA_ERROR_DEVICE_UNAVAILABLE`.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRetain(ctx: *mut *mut c_void, dev: c_int) -> CUresult {
    api("cuDevicePrimaryCtxRetain", |a| {
        let mut e = a.lock();
        let d = device(&e, dev)?;
        if let Some(s) = e.devices[d].broken {
            return Err(s);
        }
        // "Devices are often unavailable due to use of CU_COMPUTEMODE_EXCLUSIVE_PROCESS or
        // CU_COMPUTEMODE_PROHIBITED" (CUDA_ERROR_DEVICE_UNAVAILABLE); not sticky.
        if e.machine.devices[d].config.compute_mode == ComputeMode::Prohibited {
            return Err(status::DEVICE_UNAVAILABLE);
        }
        // SAFETY: out-parameter from the caller.
        unsafe { out(ctx, ctx_handle(d) as *mut c_void) }?;
        e.devices[d].ctx.refs += 1;
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Destroys everything made in `d`'s primary context (its last reference went).
fn destroy_context(e: &mut Emu, d: usize) {
    e.streams.retain(|_, s| {
        if s.dev == d {
            s.worker.close();
        }
        s.dev != d
    });
    if let Some(w) = e.devices[d].null_stream.take() {
        w.close();
    }
    e.events.retain(|_, (dev, _)| *dev != d);
    let mut unloaded = Vec::new();
    e.modules.retain(|h, m| {
        if m.dev == d {
            unloaded.push(*h);
        }
        m.dev != d
    });
    e.functions
        .retain(|_, (module, _)| !unloaded.contains(module));
    let device_bytes = e.mem.free_context(d);
    e.unaccount(d, device_bytes);
    // A context-sticky error is not cleared: NVIDIA says "To continue using CUDA, the process
    // must be terminated and relaunched" (docs/cuda.md, row 8).
}

fn release(a: &Api, dev: c_int, reset: bool) -> Result<(), CUresult> {
    let mut e = a.lock();
    let d = device(&e, dev)?;
    let refs = e.devices[d].ctx.refs;
    if refs == 0 && !reset {
        return Err(status::INVALID_CONTEXT);
    }
    if reset {
        destroy_context(&mut e, d);
    } else {
        e.devices[d].ctx.refs = refs - 1;
        if refs == 1 {
            destroy_context(&mut e, d);
        }
    }
    crate::stats::changed(&e);
    Ok(())
}

/// Drops one reference to the primary context; the last one destroys what was made in it.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxRelease_v2(dev: c_int) -> CUresult {
    api("cuDevicePrimaryCtxRelease_v2", |a| release(a, dev, false))
}

/// Destroys the primary context's resources now (the retain count stays); a sticky error
/// stays, as it does for the life of a real process.
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxReset_v2(dev: c_int) -> CUresult {
    api("cuDevicePrimaryCtxReset_v2", |a| release(a, dev, true))
}

/// Writes the primary context's flags (as last set, else 0) and whether it is active
/// (retained).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxGetState(
    dev: c_int,
    flags: *mut u32,
    active: *mut c_int,
) -> CUresult {
    api("cuDevicePrimaryCtxGetState", |a| {
        let (refs, set) = on_device(a, dev, |e, d| {
            (e.devices[d].ctx.refs, e.devices[d].ctx.flags)
        })?;
        // SAFETY: out-parameters from the caller.
        unsafe {
            out(flags, set)?;
            out(active, c_int::from(refs > 0))
        }
    })
}

/// Sets the primary context's flags, "overwriting previously set ones", active or not;
/// more than one scheduling flag is `CUDA_ERROR_INVALID_VALUE` ("Only one of the scheduling
/// flags can be set"). `CU_CTX_SCHED_BLOCKING_SYNC` makes the context's stream and context
/// synchronisations sleep instead of spin (docs/cuda.md, emulator rule 21).
#[no_mangle]
pub extern "C" fn cuDevicePrimaryCtxSetFlags_v2(dev: c_int, flags: u32) -> CUresult {
    api("cuDevicePrimaryCtxSetFlags_v2", |a| {
        // CU_CTX_SCHED_SPIN, _YIELD, _BLOCKING_SYNC: the scheduling flags (CU_CTX_SCHED_MASK).
        if (flags & 0x07).count_ones() > 1 {
            return Err(status::INVALID_VALUE);
        }
        let mut e = a.lock();
        let d = device(&e, dev)?;
        e.devices[d].ctx.flags = flags;
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Makes `ctx` this thread's current context (null unsets it); a released one is
/// `CUDA_ERROR_CONTEXT_IS_DESTROYED`.
#[no_mangle]
pub extern "C" fn cuCtxSetCurrent(ctx: *mut c_void) -> CUresult {
    api("cuCtxSetCurrent", |a| {
        let h = ctx as u64;
        if h != 0 {
            let e = a.lock();
            let d = e.ctx_device(h)?;
            if e.devices[d].ctx.refs == 0 {
                return Err(status::CONTEXT_IS_DESTROYED);
            }
        }
        CURRENT.with(|c| c.set(h));
        Ok(())
    })
}

/// Writes this thread's current context, or null.
#[no_mangle]
pub extern "C" fn cuCtxGetCurrent(ctx: *mut *mut c_void) -> CUresult {
    api("cuCtxGetCurrent", |_| {
        // SAFETY: out-parameter from the caller.
        unsafe { out(ctx, CURRENT.with(Cell::get) as *mut c_void) }
    })
}

/// Writes the device of this thread's current context.
#[no_mangle]
pub extern "C" fn cuCtxGetDevice(dev: *mut c_int) -> CUresult {
    api("cuCtxGetDevice", |a| {
        let d = a.lock().current()?;
        // SAFETY: out-parameter from the caller.
        unsafe { out(dev, d as c_int) }
    })
}

/// Emulator only: the hardware JPEG decoder of `dev` (the nvJPEG stand-in asks).
#[no_mangle]
pub extern "C" fn stoker_emu_device_jpeg(
    dev: c_int,
    engines: *mut u32,
    cores: *mut u32,
) -> CUresult {
    api("stoker_emu_device_jpeg", |a| {
        let (n, c) = on_device(a, dev, |e, d| {
            let cfg = &e.machine.devices[d].config;
            (cfg.jpeg_engines, cfg.jpeg_cores_per_engine)
        })?;
        // SAFETY: out-parameters from the caller.
        unsafe {
            out(engines, n)?;
            out(cores, c)
        }
    })
}

/// Emulator only: present in the stand-in and nowhere else, so a program can tell (and say)
/// that its GPU is emulated. Returns the emulator's interface version.
#[no_mangle]
pub extern "C" fn stoker_emu_version() -> c_int {
    1
}
