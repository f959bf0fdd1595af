//! Modules and launches: `cuModuleLoadData` takes only a real cubin the device can run (same
//! major architecture, minor not above the device's); `cuLaunchKernel` runs the host build of the same `.cu` source on the stream.
//!
//! The cubin's kernels and the host build they run are [`crate::module`]'s.
//!
//! # Limitations
//! - Only kernels the host build knows run (`stoker_augment`, the operations' `stoker_op_*`,
//!   `stoker_fill_pattern`, `stoker_check_pattern`); another entry point loads but its launch is
//!   `CUDA_ERROR_NOT_SUPPORTED`.
//! - PTX (JIT) images and fat binaries are refused as `CUDA_ERROR_INVALID_IMAGE`; stoker loads
//!   NVRTC cubins only. A PTX or cubin of a CUDA major newer than the configured driver
//!   version is `CUDA_ERROR_UNSUPPORTED_PTX_VERSION` first (docs/cuda.md, row 3). `extra` launch arguments and shared memory are not supported.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr, CString};

use super::api;
use crate::boundary::{out, HandleKind};
use crate::elf;
use crate::module::{pack, stoker_emu_host_kernel_params, stoker_emu_run_host_kernel, ModuleEntry};
use crate::status::{self, CUresult};

/// Loads a module (`CUmodule`) from a cubin into the current context; its kernels run as their
/// host build. PTX is refused (`refuse_ptx`).
#[no_mangle]
pub extern "C" fn cuModuleLoadData(module: *mut *mut c_void, image: *const c_void) -> CUresult {
    api("cuModuleLoadData", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        if image.is_null() {
            return Err(status::INVALID_VALUE);
        }
        let driver = e.machine.driver_version;
        // SAFETY: the caller passes a whole image (the driver's contract): an ELF, or PTX as a
        // NUL-terminated string.
        if unsafe { *image.cast::<u8>() } != 0x7f {
            // SAFETY: not an ELF, so a C string by the same contract.
            let text = unsafe { CStr::from_ptr(image.cast()) }.to_bytes();
            return Err(refuse_ptx(elf::ptx_isa(text), driver));
        }
        // SAFETY: the caller passes a whole image (the driver's contract); `image_len` reads
        // only its headers to find its end.
        let len = unsafe { elf::image_len(image.cast()) }?;
        // SAFETY: the image is `len` bytes long (from its own headers).
        let bytes = unsafe { std::slice::from_raw_parts(image.cast::<u8>(), len) };
        let cubin = elf::parse(bytes)?;
        if let Some((major, minor)) = cubin.toolkit {
            if i64::from(major) > i64::from(driver / 1000) {
                eprintln!(
                    "stoker GPU emulator: a cubin built by CUDA {major}.{minor} refused by a driver \
                     that runs CUDA {}.{} (CUDA {major} needs a newer driver)",
                    driver / 1000,
                    driver % 1000 / 10
                );
                return Err(status::UNSUPPORTED_PTX_VERSION);
            }
        }
        let [major, minor] = e.machine.devices[dev].config.compute_capability;
        // SASS runs on the architecture it was built for and on later minor revisions of the
        // same major one (sm_80 on sm_86), never across majors (sm_80 on sm_90).
        if cubin.arch / 10 != major || cubin.arch % 10 > minor {
            eprintln!(
                "stoker GPU emulator: cubin for sm_{} refused by a sm_{major}{minor} device",
                cubin.arch
            );
            return Err(status::NO_BINARY_FOR_GPU);
        }
        let h = e.new_handle(HandleKind::Module);
        // SAFETY: out-parameter from the caller.
        unsafe { out(module, h as *mut c_void) }?;
        e.modules.insert(
            h,
            ModuleEntry {
                dev,
                kernels: cubin.kernels,
            },
        );
        crate::stats::changed(&e);
        Ok(())
    })
}

/// What a PTX image gets: `UNSUPPORTED_PTX_VERSION` when its ISA belongs to a CUDA major
/// newer than the driver's (PTX ISA 9.x is CUDA 13, 8.x CUDA 12, 7.x CUDA 11), else
/// `INVALID_IMAGE` (PTX is not emulated).
fn refuse_ptx(isa: Option<(u32, u32)>, driver: c_int) -> CUresult {
    match isa {
        Some((major, minor)) if i64::from(major) + 4 > i64::from(driver / 1000) => {
            eprintln!(
                "stoker GPU emulator: PTX ISA {major}.{minor} refused by a driver that runs CUDA \
                 {}.{}",
                driver / 1000,
                driver % 1000 / 10
            );
            status::UNSUPPORTED_PTX_VERSION
        }
        _ => status::INVALID_IMAGE,
    }
}

/// Unloads a module of the current context, and its functions with it.
#[no_mangle]
pub extern "C" fn cuModuleUnload(module: *mut c_void) -> CUresult {
    api("cuModuleUnload", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        let h = module as u64;
        match e.modules.get(&h) {
            Some(m) if m.dev == dev => {}
            _ => return Err(status::INVALID_HANDLE),
        }
        e.modules.remove(&h);
        e.functions.retain(|_, (m, _)| *m != h);
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Writes the `CUfunction` of the kernel `name` in `module`; an unknown name is
/// `CUDA_ERROR_NOT_FOUND`.
#[no_mangle]
pub extern "C" fn cuModuleGetFunction(
    f: *mut *mut c_void,
    module: *mut c_void,
    name: *const c_char,
) -> CUresult {
    api("cuModuleGetFunction", |a| {
        let mut e = a.lock();
        e.current()?;
        if name.is_null() {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: the caller passes a C string.
        let name = unsafe { CStr::from_ptr(name) }
            .to_string_lossy()
            .into_owned();
        let m = e
            .modules
            .get(&(module as u64))
            .ok_or(status::INVALID_HANDLE)?;
        if !m.kernels.contains_key(&name) {
            return Err(status::NOT_FOUND);
        }
        let h = e.new_handle(HandleKind::Function);
        // SAFETY: out-parameter from the caller.
        unsafe { out(f, h as *mut c_void) }?;
        e.functions.insert(h, (module as u64, name));
        Ok(())
    })
}

fn check_dims(grid: [c_uint; 3], block: [c_uint; 3]) -> Result<(), CUresult> {
    let threads = block.iter().map(|&b| u64::from(b)).product::<u64>();
    let ok = grid.iter().chain(&block).all(|&d| d > 0)
        && grid[1] <= 65_535
        && grid[2] <= 65_535
        && block[2] <= 64
        && threads <= 1024;
    if ok {
        Ok(())
    } else {
        Err(status::INVALID_VALUE)
    }
}

/// Enqueues a kernel on `stream`: its host build runs over the grid, one thread after another,
/// with the parameters laid out as the cubin describes.
#[no_mangle]
pub extern "C" fn cuLaunchKernel(
    f: *mut c_void,
    gx: c_uint,
    gy: c_uint,
    gz: c_uint,
    bx: c_uint,
    by: c_uint,
    bz: c_uint,
    shared: c_uint,
    stream: *mut c_void,
    args: *mut *mut c_void,
    extra: *mut *mut c_void,
) -> CUresult {
    api("cuLaunchKernel", |a| {
        let fault = a.take_async_fault();
        let mut e = a.lock();
        let dev = e.current()?;
        let (module, name) = e
            .functions
            .get(&(f as u64))
            .cloned()
            .ok_or(status::INVALID_HANDLE)?;
        let m = e.modules.get(&module).ok_or(status::INVALID_HANDLE)?;
        if m.dev != dev {
            return Err(status::INVALID_HANDLE);
        }
        let (grid, block) = ([gx, gy, gz], [bx, by, bz]);
        check_dims(grid, block)?;
        if !extra.is_null() || shared != 0 {
            return Err(status::NOT_SUPPORTED);
        }
        let info = m.kernels[&name].clone();
        let cname = CString::new(name.clone()).map_err(|_| status::INVALID_VALUE)?;
        // SAFETY: a C string; the function only looks the name up.
        let host_bytes = unsafe { stoker_emu_host_kernel_params(cname.as_ptr()) };
        if host_bytes < 0 {
            eprintln!("stoker GPU emulator: no host build of kernel {name}");
            return Err(status::NOT_SUPPORTED);
        }
        if host_bytes as usize != info.param_bytes {
            eprintln!(
                "stoker GPU emulator: kernel {name}: the cubin takes {} parameter bytes, its host build {host_bytes}",
                info.param_bytes
            );
            return Err(status::INVALID_IMAGE);
        }
        // SAFETY: the caller passes one pointer per parameter (the driver's contract).
        let params = unsafe { pack(&info, args) }?;
        let w = e.stream(stream as u64, dev)?;
        w.submit(Box::new(move || {
            if let Some(code) = fault {
                return Err(code);
            }
            // SAFETY: the kernel reads its arguments from `params` (sized as it expects) and
            // dereferences the device pointers in them, which the caller keeps valid until
            // the stream passes this point (the driver's contract).
            let rc = unsafe {
                stoker_emu_run_host_kernel(
                    cname.as_ptr(),
                    params.as_ptr(),
                    grid.as_ptr(),
                    block.as_ptr(),
                )
            };
            if rc == 0 {
                Ok(())
            } else {
                Err(status::LAUNCH_FAILED)
            }
        }));
        Ok(())
    })
}
