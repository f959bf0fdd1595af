//! The VMM's bookkeeping: allocations (each a memfd, made here or imported from another
//! process), reserved address ranges and the mappings in them. The calls and their rules are
//! in [`crate::api::vmm`].
//!
//! # Design
//! Lifetimes follow the driver: a mapping keeps its allocation alive after `cuMemRelease`
//! ([`VmmState::release`] and [`VmmState::remove_mapping`] hand an allocation back only once
//! it is released and unmapped); the memory itself lives until the last process closed its
//! descriptors and mappings (the kernel's memfd semantics), so a ring outlives whichever side
//! dies first.
//!
//! # Limitations
//! - `cuMemSetAccess` records access per mapping; granting a part of a mapping grants it all
//!   for the copy checks (the page protections themselves are exact).

use std::collections::{BTreeMap, HashMap};
use std::ffi::c_int;
use std::os::fd::{AsRawFd, OwnedFd};

use crate::status::{self, CUresult};

pub(crate) struct VmmAlloc {
    fd: OwnedFd,
    pub(crate) size: u64,
    pub(crate) dev: usize,
    exportable: bool,
    pub(crate) imported: bool,
    /// `cuMemRelease` was called: the handle is gone, mappings may keep the memory.
    released: bool,
    mappings: u32,
}

impl VmmAlloc {
    /// An allocation of `size` bytes of `dev`, backed by the memfd `fd`, neither released nor
    /// mapped yet.
    pub(crate) fn new(
        fd: OwnedFd,
        size: u64,
        dev: usize,
        exportable: bool,
        imported: bool,
    ) -> VmmAlloc {
        VmmAlloc {
            fd,
            size,
            dev,
            exportable,
            imported,
            released: false,
            mappings: 0,
        }
    }

    /// The memfd behind the allocation.
    pub(crate) fn raw_fd(&self) -> c_int {
        self.fd.as_raw_fd()
    }

    /// Whether it was created for export (the POSIX-fd handle type), or imported.
    pub(crate) fn exportable(&self) -> bool {
        self.exportable
    }
}

#[derive(Debug, Clone, Copy)]
pub(crate) struct Mapping {
    pub(crate) size: u64,
    pub(crate) handle: u64,
    /// Granted `PROT_*` (0 until `cuMemSetAccess`).
    pub(crate) prot: c_int,
}

pub(crate) struct Reservation {
    pub(crate) size: u64,
    /// Mappings by address.
    pub(crate) mappings: BTreeMap<u64, Mapping>,
}

#[derive(Default)]
pub(crate) struct VmmState {
    pub(crate) allocs: HashMap<u64, VmmAlloc>,
    pub(crate) reservations: BTreeMap<u64, Reservation>,
}

impl VmmState {
    fn reservation_of(&self, p: u64, len: u64) -> Option<(u64, &Reservation)> {
        let (&base, r) = self.reservations.range(..=p).next_back()?;
        (p.checked_add(len)? <= base + r.size).then_some((base, r))
    }

    /// Whether `p..p+len` lies inside one mapping that was granted access.
    pub(crate) fn accessible(&self, p: u64, len: u64) -> bool {
        let Some((_, r)) = self.reservation_of(p, len) else {
            return false;
        };
        match r.mappings.range(..=p).next_back() {
            Some((&m, map)) => p + len <= m + map.size && map.prot != libc::PROT_NONE,
            None => false,
        }
    }

    /// Live allocations (not released, or still mapped).
    pub(crate) fn live(&self) -> impl Iterator<Item = &VmmAlloc> {
        self.allocs.values()
    }

    /// The reservation holding `ptr..ptr+size` (its base; `CUDA_ERROR_INVALID_VALUE` if none
    /// does) and the mappings in it that overlap the range.
    pub(crate) fn mapped_in(
        &self,
        ptr: u64,
        size: u64,
    ) -> Result<(u64, Vec<(u64, Mapping)>), CUresult> {
        let (base, r) = self
            .reservation_of(ptr, size)
            .ok_or(status::INVALID_VALUE)?;
        let hit = r
            .mappings
            .iter()
            .filter(|(&m, map)| m < ptr + size && ptr < m + map.size)
            .map(|(&m, map)| (m, *map))
            .collect();
        Ok((base, hit))
    }

    /// The mappings of the reservation at `base` (found by [`VmmState::mapped_in`]).
    fn mappings_mut(&mut self, base: u64) -> &mut BTreeMap<u64, Mapping> {
        &mut self
            .reservations
            .get_mut(&base)
            .expect("a reservation found before")
            .mappings
    }

    pub(crate) fn mapping_count(&self) -> usize {
        self.reservations.values().map(|r| r.mappings.len()).sum()
    }

    /// The allocation `h`, if it was not released (`CUDA_ERROR_INVALID_VALUE` otherwise).
    pub(crate) fn alloc(&self, h: u64) -> Result<&VmmAlloc, CUresult> {
        match self.allocs.get(&h) {
            Some(a) if !a.released => Ok(a),
            _ => Err(status::INVALID_VALUE),
        }
    }

    /// Records `mapping` at `ptr` in the reservation at `base`; its allocation counts one
    /// mapping more.
    pub(crate) fn add_mapping(&mut self, base: u64, ptr: u64, mapping: Mapping) {
        self.mappings_mut(base).insert(ptr, mapping);
        self.allocs.get_mut(&mapping.handle).expect("live").mappings += 1;
    }

    /// Grants `prot` on the mappings `hit` of the reservation at `base`.
    pub(crate) fn set_prot(&mut self, base: u64, hit: &[(u64, Mapping)], prot: c_int) {
        let mappings = self.mappings_mut(base);
        for (m, _) in hit {
            mappings.get_mut(m).expect("found above").prot = prot;
        }
    }

    /// Forgets the mapping `map` at `m` in the reservation at `base`; its allocation, if that
    /// was its last mapping and it was released.
    pub(crate) fn remove_mapping(&mut self, base: u64, m: u64, map: Mapping) -> Option<VmmAlloc> {
        self.mappings_mut(base).remove(&m);
        if let Some(alloc) = self.allocs.get_mut(&map.handle) {
            alloc.mappings -= 1;
        }
        self.take_if_unused(map.handle)
    }

    /// Releases the allocation `h` (`cuMemRelease`): the allocation, if no mapping keeps it.
    pub(crate) fn release(&mut self, h: u64) -> Result<Option<VmmAlloc>, CUresult> {
        self.alloc(h)?;
        self.allocs.get_mut(&h).expect("live").released = true;
        Ok(self.take_if_unused(h))
    }

    /// Drops the allocation `h` from the books once it is released and unmapped.
    fn take_if_unused(&mut self, h: u64) -> Option<VmmAlloc> {
        let done = matches!(self.allocs.get(&h), Some(a) if a.released && a.mappings == 0);
        done.then(|| self.allocs.remove(&h).expect("checked above"))
    }
}
