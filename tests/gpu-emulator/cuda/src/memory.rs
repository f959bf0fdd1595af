//! The memory the driver hands out: device memory (`cuMemAlloc`), pinned host memory
//! (`cuMemHostAlloc`, `cuMemAllocHost`), host ranges pinned with `cuMemHostRegister`, and the
//! VMM's ([`crate::vmm`]). The calls, copies among them, are in [`crate::api::memory`].
//!
//! # Design
//! Device memory is host memory: an allocation is fresh anonymous pages ([`map_anon`]) whose
//! address is the device pointer, so the host build of a kernel dereferences device pointers
//! as the GPU would. A copy may touch a device range only inside one live allocation of its
//! device or an accessible VMM mapping ([`MemState::device_range`]).
//!
//! # Limitations
//! - Kernels are not checked: a host kernel touching memory it should not faults the process
//!   (SIGSEGV) instead of returning `CUDA_ERROR_ILLEGAL_ADDRESS`.

use std::collections::BTreeMap;
use std::ffi::c_void;

use crate::status::{self, CUresult};
use crate::vmm::VmmState;

#[derive(Debug, Clone, Copy)]
pub(crate) struct Region {
    pub(crate) size: u64,
    pub(crate) dev: usize,
}

#[derive(Default)]
pub(crate) struct MemState {
    /// `cuMemAlloc` allocations by address.
    pub(crate) device: BTreeMap<u64, Region>,
    /// Pinned host allocations by address.
    pub(crate) pinned: BTreeMap<u64, Region>,
    /// Host ranges pinned with `cuMemHostRegister` (owned by the caller, never unmapped here).
    pub(crate) registered: BTreeMap<u64, Region>,
    pub(crate) vmm: VmmState,
    /// Asynchronous host-to-device copies so far, by their source's memory:
    /// (pageable, pinned). Reported in the stats file (rule 24).
    pub(crate) async_uploads: (u64, u64),
}

/// Maps `size` bytes of fresh read-write anonymous memory.
pub(crate) fn map_anon(size: u64) -> Result<u64, CUresult> {
    // SAFETY: a new private anonymous mapping chosen by the kernel; it aliases nothing.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            size as usize,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_NORESERVE,
            -1,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        return Err(status::OUT_OF_MEMORY);
    }
    Ok(p as u64)
}

/// Unmaps what [`map_anon`] mapped.
///
/// # Safety
/// `p..p+size` must be a mapping [`map_anon`] made, which nothing uses any more.
pub(crate) unsafe fn unmap(p: u64, size: u64) {
    // SAFETY: the caller's promise.
    unsafe { libc::munmap(p as *mut c_void, size as usize) };
}

/// The region of `map` holding `p..p+len`, if one does.
fn find(map: &BTreeMap<u64, Region>, p: u64, len: u64) -> Option<(u64, Region)> {
    let (&base, &r) = map.range(..=p).next_back()?;
    let end = p.checked_add(len)?;
    (end <= base + r.size).then_some((base, r))
}

impl MemState {
    /// Checks that `p..p+len` is device memory of `dev` a copy may touch.
    pub(crate) fn device_range(&self, dev: usize, p: u64, len: u64) -> Result<(), CUresult> {
        if let Some((_, r)) = find(&self.device, p, len) {
            return if r.dev == dev {
                Ok(())
            } else {
                Err(status::INVALID_VALUE)
            };
        }
        if self.vmm.accessible(p, len) {
            return Ok(());
        }
        Err(status::INVALID_VALUE)
    }

    pub(crate) fn is_pinned(&self, p: u64, len: u64) -> bool {
        find(&self.pinned, p, len).is_some() || find(&self.registered, p, len).is_some()
    }

    /// Frees the memory of `dev`'s context (its last reference went); returns the bytes of
    /// device memory that were in use, for the device's count.
    pub(crate) fn free_context(&mut self, dev: usize) -> u64 {
        let mut device_bytes = 0;
        for (map, counts) in [(&mut self.device, true), (&mut self.pinned, false)] {
            let gone: Vec<(u64, Region)> = map
                .iter()
                .filter(|(_, r)| r.dev == dev)
                .map(|(p, r)| (*p, *r))
                .collect();
            for (p, r) in gone {
                map.remove(&p);
                // SAFETY: an allocation of the context, off the books now; its memory goes
                // with the context (the driver's contract).
                unsafe { unmap(p, r.size) };
                if counts {
                    device_bytes += r.size;
                }
            }
        }
        self.registered.retain(|_, r| r.dev != dev);
        device_bytes
    }
}
