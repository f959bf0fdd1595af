//! Device memory (`cuMemAlloc`), pinned host memory (`cuMemHostAlloc`), and copies: the calls,
//! on the bookkeeping of [`crate::memory`].
//!
//! # Design
//! Allocations count against the device's configured size (`CUDA_ERROR_OUT_OF_MEMORY` past
//! it). Every copy checks that its device range lies inside one live allocation or an
//! accessible VMM mapping (`CUDA_ERROR_INVALID_VALUE` otherwise).
//!
//! Copies follow the driver's documented host-memory rules: an async copy from pageable host
//! memory stages the bytes before returning; from or to pinned memory (`cuMemHostAlloc`,
//! `cuMemAllocHost`) it reads or writes the host buffer when it runs on the stream; an async
//! copy to pageable memory returns only once done. Synchronous copies run on the null stream,
//! which does not wait for non-blocking streams: reading a result before synchronising its
//! stream reads stale bytes.

use std::ffi::c_void;

use super::{api, Api};
use crate::boundary::out;
use crate::memory::{map_anon, unmap, Region};
use crate::status::{self, CUresult};

/// Device allocations are aligned at least this much (the driver gives 256 or more).
const ALLOC_ALIGN: u64 = 256;

/// Allocates device memory (`CUdeviceptr`) in the current context, counted against its device's
/// memory.
#[no_mangle]
pub extern "C" fn cuMemAlloc_v2(dptr: *mut u64, bytes: usize) -> CUresult {
    api("cuMemAlloc_v2", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        if bytes == 0 {
            return Err(status::INVALID_VALUE);
        }
        let size = (bytes as u64).div_ceil(ALLOC_ALIGN) * ALLOC_ALIGN;
        e.account(dev, size)?;
        let p = match map_anon(size) {
            Ok(p) => p,
            Err(err) => {
                e.unaccount(dev, size);
                return Err(err);
            }
        };
        // SAFETY: out-parameter from the caller.
        if let Err(err) = unsafe { out(dptr, p) } {
            e.unaccount(dev, size);
            // SAFETY: mapped just now; the caller never got it.
            unsafe { unmap(p, size) };
            return Err(err);
        }
        e.mem.device.insert(p, Region { size, dev });
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Frees device memory from `cuMemAlloc_v2`; any other pointer is `CUDA_ERROR_INVALID_VALUE`.
#[no_mangle]
pub extern "C" fn cuMemFree_v2(dptr: u64) -> CUresult {
    api("cuMemFree_v2", |a| {
        let mut e = a.lock();
        e.current()?;
        let r = e.mem.device.remove(&dptr).ok_or(status::INVALID_VALUE)?;
        e.unaccount(r.dev, r.size);
        // SAFETY: an allocation of ours, off the books now; the caller gave it up.
        unsafe { unmap(dptr, r.size) };
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Writes the free and total memory of the current context's device, in bytes.
#[no_mangle]
pub extern "C" fn cuMemGetInfo_v2(free: *mut usize, total: *mut usize) -> CUresult {
    api("cuMemGetInfo_v2", |a| {
        let e = a.lock();
        let dev = e.current()?;
        let t = e.machine.devices[dev].config.memory_mib << 20;
        // SAFETY: out-parameters from the caller.
        unsafe {
            out(free, (t - e.devices[dev].used.min(t)) as usize)?;
            out(total, t as usize)
        }
    })
}

fn host_alloc(a: &Api, pp: *mut *mut c_void, bytes: usize) -> Result<(), CUresult> {
    let mut e = a.lock();
    let dev = e.current()?;
    if bytes == 0 {
        return Err(status::INVALID_VALUE);
    }
    let size = bytes as u64;
    let p = map_anon(size)?;
    // SAFETY: out-parameter from the caller.
    if let Err(err) = unsafe { out(pp, p as *mut c_void) } {
        // SAFETY: mapped just now; the caller never got it.
        unsafe { unmap(p, size) };
        return Err(err);
    }
    e.mem.pinned.insert(p, Region { size, dev });
    crate::stats::changed(&e);
    Ok(())
}

/// Allocates pinned host memory (the four `CU_MEMHOSTALLOC_*` flags are accepted and change
/// nothing).
#[no_mangle]
pub extern "C" fn cuMemHostAlloc(pp: *mut *mut c_void, bytes: usize, flags: u32) -> CUresult {
    api("cuMemHostAlloc", |a| {
        if flags & !0xf != 0 {
            return Err(status::INVALID_VALUE);
        }
        host_alloc(a, pp, bytes)
    })
}

/// Allocates pinned host memory, as `cuMemHostAlloc` with no flags.
#[no_mangle]
pub extern "C" fn cuMemAllocHost_v2(pp: *mut *mut c_void, bytes: usize) -> CUresult {
    api("cuMemAllocHost_v2", |a| host_alloc(a, pp, bytes))
}

/// Frees pinned host memory from `cuMemHostAlloc` or `cuMemAllocHost_v2`.
#[no_mangle]
pub extern "C" fn cuMemFreeHost(p: *mut c_void) -> CUresult {
    api("cuMemFreeHost", |a| {
        let mut e = a.lock();
        e.current()?;
        let r = e
            .mem
            .pinned
            .remove(&(p as u64))
            .ok_or(status::INVALID_VALUE)?;
        // SAFETY: an allocation of ours, off the books now; the caller gave it up.
        unsafe { unmap(p as u64, r.size) };
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Pins an existing host range (`cuMemHostRegister`): async copies from and to it then run
/// when the stream reaches them, as with `cuMemHostAlloc` memory.
#[no_mangle]
pub extern "C" fn cuMemHostRegister_v2(p: *mut c_void, bytes: usize, flags: u32) -> CUresult {
    api("cuMemHostRegister_v2", |a| {
        let mut e = a.lock();
        let dev = e.current()?;
        if p.is_null() || bytes == 0 || flags & !0xf != 0 {
            return Err(status::INVALID_VALUE);
        }
        let (start, size) = (p as u64, bytes as u64);
        let overlaps = e
            .mem
            .registered
            .iter()
            .chain(&e.mem.pinned)
            .any(|(&q, r)| q < start + size && start < q + r.size);
        if overlaps {
            return Err(status::HOST_MEMORY_ALREADY_REGISTERED);
        }
        e.mem.registered.insert(start, Region { size, dev });
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Unpins a range `cuMemHostRegister_v2` pinned; any other pointer is
/// `CUDA_ERROR_HOST_MEMORY_NOT_REGISTERED`.
#[no_mangle]
pub extern "C" fn cuMemHostUnregister(p: *mut c_void) -> CUresult {
    api("cuMemHostUnregister", |a| {
        let mut e = a.lock();
        e.current()?;
        match e.mem.registered.remove(&(p as u64)) {
            Some(_) => Ok(()),
            None => Err(status::HOST_MEMORY_NOT_REGISTERED),
        }
    })
}

/// With unified addressing a pinned host pointer is also its device pointer.
#[no_mangle]
pub extern "C" fn cuMemHostGetDevicePointer_v2(
    dptr: *mut u64,
    p: *mut c_void,
    flags: u32,
) -> CUresult {
    api("cuMemHostGetDevicePointer_v2", |a| {
        let e = a.lock();
        e.current()?;
        if flags != 0 || !e.mem.is_pinned(p as u64, 1) {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: out-parameter from the caller.
        unsafe { out(dptr, p as u64) }
    })
}

/// A copy between two addresses, run on a stream worker.
fn copy_op(dst: u64, src: u64, n: usize, fault: Option<CUresult>) -> crate::stream::Op {
    Box::new(move || {
        if let Some(code) = fault {
            return Err(code);
        }
        // SAFETY: the call that enqueued this checked both ranges; the caller keeps them alive
        // until the stream passes this point (the driver's contract).
        unsafe { std::ptr::copy(src as *const u8, dst as *mut u8, n) };
        Ok(())
    })
}

/// Which way a copy goes.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Direction {
    HostToDevice,
    DeviceToHost,
    DeviceToDevice,
}

/// Enqueues a copy of `n` bytes on `stream`; `sync` waits for it (so does a copy into
/// pageable host memory, as the driver's does).
fn copy(
    a: &Api,
    dir: Direction,
    dst: u64,
    src: u64,
    n: usize,
    stream: u64,
    sync: bool,
) -> Result<(), CUresult> {
    let fault = a.take_async_fault();
    let (worker, ticket, wait) = {
        let mut e = a.lock();
        let dev = e.current()?;
        if n == 0 {
            return Ok(());
        }
        if dst == 0 || src == 0 {
            return Err(status::INVALID_VALUE);
        }
        let len = n as u64;
        if dir != Direction::HostToDevice {
            e.mem.device_range(dev, src, len)?;
        }
        if dir != Direction::DeviceToHost {
            e.mem.device_range(dev, dst, len)?;
        }
        let w = e.stream(stream, dev)?;
        let pageable_in = dir == Direction::HostToDevice && !e.mem.is_pinned(src, len);
        if dir == Direction::HostToDevice && !sync {
            let counts = &mut e.mem.async_uploads;
            *(if pageable_in {
                &mut counts.0
            } else {
                &mut counts.1
            }) += 1;
            crate::stats::changed(&e);
        }
        let op = match dir {
            Direction::HostToDevice if pageable_in => {
                // Pageable source: staged, and the call returns once the stream ran it (the
                // driver "may synchronize with the stream and stage the copy").
                // SAFETY: the caller promises `n` readable bytes at `src` for the call.
                let staged = unsafe { std::slice::from_raw_parts(src as *const u8, n) }.to_vec();
                Box::new(move || {
                    if let Some(code) = fault {
                        return Err(code);
                    }
                    // SAFETY: the destination range was checked; the staging buffer is ours.
                    unsafe { std::ptr::copy(staged.as_ptr(), dst as *mut u8, n) };
                    Ok(())
                })
            }
            _ => copy_op(dst, src, n, fault),
        };
        let pageable_out = dir == Direction::DeviceToHost && !e.mem.is_pinned(dst, len);
        let ticket = w.submit(op);
        (w, ticket, sync || pageable_out || pageable_in)
    };
    if wait {
        worker.wait(ticket);
    }
    Ok(())
}

/// Copies host to device on the null stream and waits for it.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoD_v2(dst: u64, src: *const c_void, n: usize) -> CUresult {
    api("cuMemcpyHtoD_v2", |a| {
        copy(a, Direction::HostToDevice, dst, src as u64, n, 0, true)
    })
}

/// Enqueues a host-to-device copy on `stream`; from pageable memory the bytes are staged before
/// it returns.
#[no_mangle]
pub extern "C" fn cuMemcpyHtoDAsync_v2(
    dst: u64,
    src: *const c_void,
    n: usize,
    stream: *mut c_void,
) -> CUresult {
    api("cuMemcpyHtoDAsync_v2", |a| {
        copy(
            a,
            Direction::HostToDevice,
            dst,
            src as u64,
            n,
            stream as u64,
            false,
        )
    })
}

/// Copies device to host on the null stream and waits for it.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoH_v2(dst: *mut c_void, src: u64, n: usize) -> CUresult {
    api("cuMemcpyDtoH_v2", |a| {
        copy(a, Direction::DeviceToHost, dst as u64, src, n, 0, true)
    })
}

/// Enqueues a device-to-host copy on `stream`; into pageable memory it waits, as the driver's
/// does.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoHAsync_v2(
    dst: *mut c_void,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> CUresult {
    api("cuMemcpyDtoHAsync_v2", |a| {
        copy(
            a,
            Direction::DeviceToHost,
            dst as u64,
            src,
            n,
            stream as u64,
            false,
        )
    })
}

/// Enqueues a device-to-device copy on `stream`.
#[no_mangle]
pub extern "C" fn cuMemcpyDtoDAsync_v2(
    dst: u64,
    src: u64,
    n: usize,
    stream: *mut c_void,
) -> CUresult {
    api("cuMemcpyDtoDAsync_v2", |a| {
        copy(
            a,
            Direction::DeviceToDevice,
            dst,
            src,
            n,
            stream as u64,
            false,
        )
    })
}

/// Enqueues setting `n` bytes of device memory to `value` on `stream`.
#[no_mangle]
pub extern "C" fn cuMemsetD8Async(dst: u64, value: u8, n: usize, stream: *mut c_void) -> CUresult {
    api("cuMemsetD8Async", |a| {
        let fault = a.take_async_fault();
        let mut e = a.lock();
        let dev = e.current()?;
        e.mem.device_range(dev, dst, n as u64)?;
        let w = e.stream(stream as u64, dev)?;
        w.submit(Box::new(move || {
            if let Some(code) = fault {
                return Err(code);
            }
            // SAFETY: the range was checked when the call was made.
            unsafe { std::ptr::write_bytes(dst as *mut u8, value, n) };
            Ok(())
        }));
        Ok(())
    })
}
