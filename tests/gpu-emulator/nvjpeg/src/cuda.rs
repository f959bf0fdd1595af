//! The emulated libcuda this library works with: found as the process loaded it
//! (`STOKER_LIBCUDA`), reached only through documented driver calls (`cuCtxGetDevice`,
//! `cuLaunchHostFunc`) plus the emulator's own `stoker_emu_device_jpeg`.
//!
//! # Design
//! Output is written by a host function enqueued on the caller's CUDA stream, so it lands in
//! stream order and is visible only after the stream is synchronised, as a GPU decode's is.

use std::ffi::{c_int, c_void};
use std::sync::OnceLock;

use libloading::Library;

use crate::status::{self, Status};

type HostFn = unsafe extern "C" fn(*mut c_void);

struct Driver {
    ctx_get_device: unsafe extern "C" fn(*mut c_int) -> c_int,
    launch_host_func: unsafe extern "C" fn(*mut c_void, HostFn, *mut c_void) -> c_int,
    device_jpeg: unsafe extern "C" fn(c_int, *mut u32, *mut u32) -> c_int,
    driver_get_version: unsafe extern "C" fn(*mut c_int) -> c_int,
    _lib: Library,
}

fn open() -> Result<Driver, String> {
    let path = std::env::var_os("STOKER_LIBCUDA").ok_or(
        "STOKER_LIBCUDA is not set: the nvJPEG emulator runs only on the emulated libcuda",
    )?;
    // SAFETY: the emulated libcuda, normally already loaded by the process (same handle).
    let lib = unsafe { Library::new(&path) }.map_err(|e| e.to_string())?;
    // SAFETY: the signatures are cuda.h's and the emulator's.
    unsafe {
        Ok(Driver {
            ctx_get_device: *lib.get(b"cuCtxGetDevice").map_err(|e| e.to_string())?,
            launch_host_func: *lib.get(b"cuLaunchHostFunc").map_err(|e| e.to_string())?,
            driver_get_version: *lib.get(b"cuDriverGetVersion").map_err(|e| e.to_string())?,
            device_jpeg: *lib
                .get(b"stoker_emu_device_jpeg")
                .map_err(|e| format!("not the emulated libcuda: {e}"))?,
            _lib: lib,
        })
    }
}

fn driver() -> Result<&'static Driver, Status> {
    static D: OnceLock<Result<Driver, String>> = OnceLock::new();
    D.get_or_init(open).as_ref().map_err(|e| {
        eprintln!("stoker nvJPEG emulator: {e}");
        status::EXECUTION_FAILED
    })
}

/// The current context's device and its (engines, cores per engine).
pub(crate) fn current_device() -> Result<(c_int, u32, u32), Status> {
    let d = driver()?;
    let mut dev = -1;
    let (mut engines, mut cores) = (0u32, 0u32);
    // SAFETY: out-parameters are locals.
    unsafe {
        if (d.ctx_get_device)(&mut dev) != 0 || (d.device_jpeg)(dev, &mut engines, &mut cores) != 0
        {
            return Err(status::EXECUTION_FAILED);
        }
    }
    Ok((dev, engines, cores))
}

/// The driver's `cuDriverGetVersion` (1000 * major + 10 * minor).
pub(crate) fn driver_version() -> Result<c_int, Status> {
    let d = driver()?;
    let mut v = 0;
    // SAFETY: out-parameter is a local.
    if unsafe { (d.driver_get_version)(&mut v) } != 0 {
        return Err(status::EXECUTION_FAILED);
    }
    Ok(v)
}

/// Bytes to write at a device address, row by row.
pub(crate) struct Write {
    pub(crate) dst: u64,
    pub(crate) pitch: usize,
    pub(crate) row_bytes: usize,
    pub(crate) data: Vec<u8>,
}

/// Writes `w`'s rows at its device address.
pub(crate) fn write(w: &Write) {
    for (i, row) in w.data.chunks_exact(w.row_bytes).enumerate() {
        // SAFETY: the caller of the decode promised `rows * pitch` writable device bytes at
        // `dst` until the stream passes this point (nvJPEG's contract); device memory of the
        // emulated GPU is host memory at the same address.
        unsafe {
            std::ptr::copy_nonoverlapping(
                row.as_ptr(),
                (w.dst + (i * w.pitch) as u64) as *mut u8,
                w.row_bytes,
            )
        };
    }
}

/// Work a stream runs when it reaches it.
type Job = Box<dyn FnOnce() + Send>;

unsafe extern "C" fn run(data: *mut c_void) {
    // SAFETY: `data` is the Box made in `enqueue_job`, passed back exactly once.
    let job = unsafe { Box::from_raw(data.cast::<Job>()) };
    job();
}

/// Enqueues `job` on `stream`: it runs in stream order, on the stream's worker.
pub(crate) fn enqueue_job(stream: *mut c_void, job: Job) -> Result<(), Status> {
    let d = driver()?;
    let data = Box::into_raw(Box::new(job));
    // SAFETY: `run` takes back the box when the stream reaches it.
    let rc = unsafe { (d.launch_host_func)(stream, run, data.cast()) };
    if rc != 0 {
        // SAFETY: the driver refused it, so the box is still ours.
        drop(unsafe { Box::from_raw(data) });
        return Err(status::EXECUTION_FAILED);
    }
    Ok(())
}

/// Enqueues `writes` on `stream`.
pub(crate) fn enqueue(stream: *mut c_void, writes: Vec<Write>) -> Result<(), Status> {
    enqueue_job(stream, Box::new(move || writes.iter().for_each(write)))
}
