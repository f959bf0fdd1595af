//! CUDA virtual memory management: `cuMemCreate` allocations backed by memfds, shared with
//! other processes as POSIX file descriptors, mapped into reserved address ranges.
//!
//! # Design
//! - The allocation granularity is 2 MiB; sizes that are not multiples of it are
//!   `CUDA_ERROR_INVALID_VALUE`.
//! - `cuMemCreate` makes a memfd named `stoker-emu-vmm:<device UUID>` (counted against the
//!   device's memory). Only an allocation created with the POSIX-fd handle type can be
//!   exported; the export is a new descriptor of the same memfd.
//! - `cuMemImportFromShareableHandle` accepts only such a memfd (it reads the name through
//!   `/proc/self/fd`), finds the device by the UUID in the name, and keeps its own duplicate.
//! - `cuMemAddressReserve` reserves `PROT_NONE` address space (2 MiB aligned); `cuMemMap` maps
//!   the memfd there, still `PROT_NONE`: touching it faults (SIGSEGV) until `cuMemSetAccess`
//!   grants access, as on a GPU.
//! - A mapping keeps its allocation alive after `cuMemRelease` ([`crate::vmm`] keeps the
//!   books).
//!
//! # Limitations
//! - Imported allocations do not count against this process's view of device memory (the
//!   exporter's does).
//! - `cuMemSetAccess` records access per mapping (see [`crate::vmm`]).

use std::collections::BTreeMap;
use std::ffi::{c_int, c_void};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use super::api;
use crate::boundary::{out, HandleKind};
use crate::config::format_uuid;
use crate::state::Emu;
use crate::status::{self, CUresult};
use crate::vmm::{Mapping, Reservation, VmmAlloc};

/// `cuMemGetAllocationGranularity`, minimum and recommended alike.
pub(crate) const GRANULARITY: u64 = 2 << 20;

const ALLOCATION_TYPE_PINNED: u32 = 1;
const HANDLE_TYPE_POSIX_FD: u32 = 1;
const LOCATION_TYPE_DEVICE: u32 = 1;
const MEMFD_PREFIX: &str = "stoker-emu-vmm:";

/// `CUmemLocation`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct MemLocation {
    /// `CUmemLocationType`: only `CU_MEM_LOCATION_TYPE_DEVICE` (1) is accepted.
    pub type_: u32,
    /// The device ordinal, for a device location.
    pub id: c_int,
}

/// `CUmemAllocationProp`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AllocationProp {
    /// `CUmemAllocationType`: only `CU_MEM_ALLOCATION_TYPE_PINNED` (1) is accepted.
    pub type_: u32,
    /// `CUmemAllocationHandleType` bits the allocation may be exported as (POSIX fd is 1).
    pub requested_handle_types: u32,
    /// Where the memory lives: a device.
    pub location: MemLocation,
    /// Windows security attributes; unused on Linux.
    pub win32_handle_meta_data: *mut c_void,
    /// `allocFlags` (compression, GPUDirect RDMA, usage); not read.
    pub alloc_flags: [u8; 8],
}

/// `CUmemAccessDesc`.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct AccessDesc {
    /// The device given access.
    pub location: MemLocation,
    /// `CUmemAccess_flags`: 0 none, 1 read, 3 read and write.
    pub flags: u32,
}

fn granular(n: u64) -> Result<(), CUresult> {
    if n == 0 || !n.is_multiple_of(GRANULARITY) {
        return Err(status::INVALID_VALUE);
    }
    Ok(())
}

fn prop_device(e: &Emu, prop: *const AllocationProp) -> Result<(usize, AllocationProp), CUresult> {
    if prop.is_null() {
        return Err(status::INVALID_VALUE);
    }
    // SAFETY: the caller passes a CUmemAllocationProp.
    let p = unsafe { *prop };
    if p.type_ != ALLOCATION_TYPE_PINNED || p.location.type_ != LOCATION_TYPE_DEVICE {
        return Err(status::INVALID_VALUE);
    }
    let dev = usize::try_from(p.location.id)
        .ok()
        .filter(|&d| d < e.devices.len())
        .ok_or(status::INVALID_DEVICE)?;
    Ok((dev, p))
}

/// Gives back the device memory of an allocation just dropped from the books, unless it was
/// imported (the exporter counts it).
fn unaccount_freed(e: &mut Emu, freed: Option<VmmAlloc>) {
    if let Some(a) = freed {
        if !a.imported {
            e.unaccount(a.dev, a.size);
        }
    }
}

/// Writes the VMM granularity (2 MiB, minimum and recommended alike) for a device allocation's
/// properties.
#[no_mangle]
pub extern "C" fn cuMemGetAllocationGranularity(
    g: *mut usize,
    prop: *const AllocationProp,
    option: u32,
) -> CUresult {
    api("cuMemGetAllocationGranularity", |a| {
        prop_device(&a.lock(), prop)?;
        if option > 1 {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: out-parameter from the caller.
        unsafe { out(g, GRANULARITY as usize) }
    })
}

/// Creates a physical allocation (`CUmemGenericAllocationHandle`) on a memfd, exportable as a
/// POSIX fd when the properties ask.
#[no_mangle]
pub extern "C" fn cuMemCreate(
    handle: *mut u64,
    size: usize,
    prop: *const AllocationProp,
    flags: u64,
) -> CUresult {
    api("cuMemCreate", |a| {
        let mut e = a.lock();
        e.current()?;
        let (dev, p) = prop_device(&e, prop)?;
        // A device without VMM, or without POSIX-fd handles when they are asked for, has no
        // such allocation (the capabilities are device attributes 102 and 103).
        let caps = &e.machine.devices[dev].config;
        if !caps.vmm || (!caps.posix_fd && p.requested_handle_types & HANDLE_TYPE_POSIX_FD != 0) {
            return Err(status::NOT_SUPPORTED);
        }
        granular(size as u64)?;
        if flags != 0 || p.requested_handle_types & !HANDLE_TYPE_POSIX_FD != 0 {
            return Err(if flags != 0 {
                status::INVALID_VALUE
            } else {
                status::NOT_SUPPORTED
            });
        }
        let name = std::ffi::CString::new(format!(
            "{MEMFD_PREFIX}{}",
            format_uuid(&e.machine.devices[dev].uuid)
        ))
        .map_err(|_| status::UNKNOWN)?;
        e.account(dev, size as u64)?;
        // SAFETY: a NUL-terminated name; the new descriptor is owned on the next line.
        let fd = unsafe { libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC) };
        if fd < 0 {
            e.unaccount(dev, size as u64);
            return Err(status::OUT_OF_MEMORY);
        }
        // SAFETY: `fd` was just created and is owned by nothing else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: sizes a memfd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size as libc::off_t) } != 0 {
            e.unaccount(dev, size as u64);
            return Err(status::OUT_OF_MEMORY);
        }
        let h = e.new_handle(HandleKind::Vmm);
        // SAFETY: out-parameter from the caller.
        if let Err(err) = unsafe { out(handle, h) } {
            e.unaccount(dev, size as u64);
            return Err(err);
        }
        let exportable = p.requested_handle_types & HANDLE_TYPE_POSIX_FD != 0;
        let alloc = VmmAlloc::new(fd, size as u64, dev, exportable, false);
        e.mem.vmm.allocs.insert(h, alloc);
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Maps `size` bytes with no access (`PROT_NONE`): the memfd `fd` shared, or anonymous
/// address space (not backed until mapped over) when `fd` is `None`; at the fixed address
/// `at`, or where the kernel places it when `at` is `None`. Returns the address.
///
/// # Safety
/// A fixed `at..at+size` must lie inside one of our own reservations: what is there goes.
unsafe fn map_inaccessible(at: Option<u64>, size: u64, fd: Option<c_int>) -> Option<u64> {
    let (addr, fixed) = match at {
        Some(a) => (a as *mut c_void, libc::MAP_FIXED),
        None => (std::ptr::null_mut(), 0),
    };
    let (kind, fd) = match fd {
        Some(fd) => (libc::MAP_SHARED, fd),
        None => (
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
        ),
    };
    // SAFETY: the caller's promise for a fixed address; otherwise new space that aliases
    // nothing.
    let p = unsafe { libc::mmap(addr, size as usize, libc::PROT_NONE, kind | fixed, fd, 0) };
    (p != libc::MAP_FAILED).then_some(p as u64)
}

/// Writes a POSIX fd (a duplicate of the allocation's memfd) for an allocation created
/// exportable.
#[no_mangle]
pub extern "C" fn cuMemExportToShareableHandle(
    shareable: *mut c_void,
    h: u64,
    kind: u32,
    flags: u64,
) -> CUresult {
    api("cuMemExportToShareableHandle", |a| {
        let e = a.lock();
        let alloc = e.mem.vmm.alloc(h)?;
        if kind != HANDLE_TYPE_POSIX_FD || !alloc.exportable() || flags != 0 {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: duplicates a descriptor we own; the copy goes to the caller.
        let fd = unsafe { libc::fcntl(alloc.raw_fd(), libc::F_DUPFD_CLOEXEC, 0) };
        if fd < 0 {
            return Err(status::OUT_OF_MEMORY);
        }
        // SAFETY: for the POSIX-fd type the out-parameter is an int.
        unsafe { out(shareable.cast::<c_int>(), fd) }
    })
}

/// The device UUID in the name of one of our memfds, or `None` for any other descriptor.
fn memfd_device(fd: c_int) -> Option<[u8; 16]> {
    let target = std::fs::read_link(format!("/proc/self/fd/{fd}")).ok()?;
    let target = target.to_str()?;
    let rest = target.strip_prefix("/memfd:")?.strip_prefix(MEMFD_PREFIX)?;
    crate::config::parse_uuid(rest.split(' ').next()?)
}

/// Imports an allocation from a POSIX fd another process (or this one) exported.
#[no_mangle]
pub extern "C" fn cuMemImportFromShareableHandle(
    handle: *mut u64,
    os_handle: *mut c_void,
    kind: u32,
) -> CUresult {
    api("cuMemImportFromShareableHandle", |a| {
        let mut e = a.lock();
        e.current()?;
        if kind != HANDLE_TYPE_POSIX_FD {
            return Err(status::INVALID_VALUE);
        }
        let fd = os_handle as usize as c_int;
        let uuid = memfd_device(fd).ok_or(status::INVALID_VALUE)?;
        let dev = e
            .machine
            .devices
            .iter()
            .position(|d| d.uuid == uuid)
            .ok_or(status::INVALID_DEVICE)?;
        // SAFETY: `st` is written by fstat on a descriptor the caller passed.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: as above.
        if unsafe { libc::fstat(fd, &mut st) } != 0 {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: duplicates the caller's descriptor; we own the copy.
        let dup = unsafe { libc::fcntl(fd, libc::F_DUPFD_CLOEXEC, 0) };
        if dup < 0 {
            return Err(status::OUT_OF_MEMORY);
        }
        // SAFETY: `dup` was just created for us.
        let owned = unsafe { OwnedFd::from_raw_fd(dup) };
        let h = e.new_handle(HandleKind::Vmm);
        // SAFETY: out-parameter from the caller.
        unsafe { out(handle, h) }?;
        let alloc = VmmAlloc::new(owned, st.st_size as u64, dev, true, true);
        e.mem.vmm.allocs.insert(h, alloc);
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Reserves an address range (no access), a multiple of the granularity; the requested address
/// is ignored, as a hint may be.
#[no_mangle]
pub extern "C" fn cuMemAddressReserve(
    ptr: *mut u64,
    size: usize,
    align: usize,
    _addr: u64,
    flags: u64,
) -> CUresult {
    api("cuMemAddressReserve", |a| {
        let mut e = a.lock();
        e.current()?;
        let size = size as u64;
        granular(size)?;
        let align = (align as u64).max(GRANULARITY);
        if !align.is_power_of_two() || flags != 0 {
            return Err(status::INVALID_VALUE);
        }
        let span = size + align;
        // SAFETY: new anonymous address space, placed by the kernel; it aliases nothing.
        let raw = unsafe { map_inaccessible(None, span, None) }.ok_or(status::OUT_OF_MEMORY)?;
        let p = raw as *mut c_void;
        let start = raw.next_multiple_of(align);
        // SAFETY: trims the unaligned head and the tail of the mapping just made.
        unsafe {
            if start > raw {
                libc::munmap(p, (start - raw) as usize);
            }
            let tail = raw + span - (start + size);
            if tail > 0 {
                libc::munmap((start + size) as *mut c_void, tail as usize);
            }
        }
        // SAFETY: out-parameter from the caller.
        unsafe { out(ptr, start) }?;
        e.mem.vmm.reservations.insert(
            start,
            Reservation {
                size,
                mappings: BTreeMap::new(),
            },
        );
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Frees a whole reservation with nothing mapped in it.
#[no_mangle]
pub extern "C" fn cuMemAddressFree(ptr: u64, size: usize) -> CUresult {
    api("cuMemAddressFree", |a| {
        let mut e = a.lock();
        match e.mem.vmm.reservations.get(&ptr) {
            Some(r) if r.size == size as u64 && r.mappings.is_empty() => {}
            _ => return Err(status::INVALID_VALUE),
        }
        e.mem.vmm.reservations.remove(&ptr);
        // SAFETY: the reservation is ours and nothing is mapped in it.
        unsafe { libc::munmap(ptr as *mut c_void, size) };
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Maps an allocation at `ptr` in a reservation, with no access until `cuMemSetAccess`.
#[no_mangle]
pub extern "C" fn cuMemMap(ptr: u64, size: usize, offset: usize, h: u64, flags: u64) -> CUresult {
    api("cuMemMap", |a| {
        let mut e = a.lock();
        e.current()?;
        let size = size as u64;
        granular(size)?;
        if offset != 0 || flags != 0 {
            return Err(status::INVALID_VALUE);
        }
        let alloc = e.mem.vmm.alloc(h)?;
        if size > alloc.size {
            return Err(status::INVALID_VALUE);
        }
        let fd = alloc.raw_fd();
        let (base, hit) = e.mem.vmm.mapped_in(ptr, size)?;
        if !hit.is_empty() {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: replaces part of our own PROT_NONE reservation with the memfd, still
        // inaccessible until cuMemSetAccess.
        unsafe { map_inaccessible(Some(ptr), size, Some(fd)) }.ok_or(status::OUT_OF_MEMORY)?;
        let mapping = Mapping {
            size,
            handle: h,
            prot: libc::PROT_NONE,
        };
        e.mem.vmm.add_mapping(base, ptr, mapping);
        crate::stats::changed(&e);
        Ok(())
    })
}

fn prot_of(e: &Emu, desc: *const AccessDesc, count: usize) -> Result<c_int, CUresult> {
    if desc.is_null() || count == 0 {
        return Err(status::INVALID_VALUE);
    }
    // SAFETY: the caller passes `count` descriptors.
    let descs = unsafe { std::slice::from_raw_parts(desc, count) };
    let mut prot = libc::PROT_NONE;
    for d in descs {
        let known = usize::try_from(d.location.id).is_ok_and(|i| i < e.devices.len());
        if d.location.type_ != LOCATION_TYPE_DEVICE || !known {
            return Err(status::INVALID_DEVICE);
        }
        prot |= match d.flags {
            0 => libc::PROT_NONE,
            1 => libc::PROT_READ,
            3 => libc::PROT_READ | libc::PROT_WRITE,
            _ => return Err(status::INVALID_VALUE),
        };
    }
    Ok(prot)
}

/// Sets the access of mapped ranges (page protections: none, read, read and write).
#[no_mangle]
pub extern "C" fn cuMemSetAccess(
    ptr: u64,
    size: usize,
    desc: *const AccessDesc,
    count: usize,
) -> CUresult {
    api("cuMemSetAccess", |a| {
        let mut e = a.lock();
        e.current()?;
        let size = size as u64;
        granular(size)?;
        let prot = prot_of(&e, desc, count)?;
        let (base, hit) = e.mem.vmm.mapped_in(ptr, size)?;
        let covered: u64 = hit
            .iter()
            .map(|(m, map)| (m + map.size).min(ptr + size) - (*m).max(ptr))
            .sum();
        if covered != size {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: the range is our own mapping of a memfd (checked above).
        if unsafe { libc::mprotect(ptr as *mut c_void, size as usize, prot) } != 0 {
            return Err(status::INVALID_VALUE);
        }
        e.mem.vmm.set_prot(base, &hit, prot);
        Ok(())
    })
}

/// Unmaps whole mappings in `ptr..ptr+size`, leaving the range reserved.
#[no_mangle]
pub extern "C" fn cuMemUnmap(ptr: u64, size: usize) -> CUresult {
    api("cuMemUnmap", |a| {
        let mut e = a.lock();
        let size = size as u64;
        granular(size)?;
        let (base, hit) = e.mem.vmm.mapped_in(ptr, size)?;
        let whole = hit
            .iter()
            .all(|(m, map)| *m >= ptr && m + map.size <= ptr + size);
        if hit.is_empty() || !whole {
            return Err(status::INVALID_VALUE);
        }
        // SAFETY: puts our PROT_NONE reservation back over our own mappings.
        unsafe { map_inaccessible(Some(ptr), size, None) }.ok_or(status::UNKNOWN)?;
        for (m, map) in hit {
            let freed = e.mem.vmm.remove_mapping(base, m, map);
            unaccount_freed(&mut e, freed);
        }
        crate::stats::changed(&e);
        Ok(())
    })
}

/// Releases an allocation handle; its memory goes when its last mapping does.
#[no_mangle]
pub extern "C" fn cuMemRelease(h: u64) -> CUresult {
    api("cuMemRelease", |a| {
        let mut e = a.lock();
        let freed = e.mem.vmm.release(h)?;
        unaccount_freed(&mut e, freed);
        crate::stats::changed(&e);
        Ok(())
    })
}
