//! Rings in shared host memory: one sealed memfd per ring, mapped once.
//!
//! The daemon creates the memfd ([`MemfdRing::create`]), sizes it to the ring, seals its size
//! and the seals themselves, maps it, and passes the fd to one client over the socket. The
//! client ([`MemfdRing::from_fd`]) checks the seals and the size against the layout it computed
//! itself from the spec before mapping: a peer cannot make it map less than it will read.
//!
//! # Design
//! - `memfd_create(MFD_CLOEXEC | MFD_ALLOW_SEALING)`, `ftruncate(ring_bytes)`, then seals
//!   `F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL`. Nothing touches /dev/shm.
//! - Both sides map `MAP_SHARED`, read-write (the client may normalise in place; a client can
//!   only ever scribble on its own ring).
//! - Field order is drop order: the mapping is unmapped before the fd is closed.
//!
//! # Limitations
//! - The memory is shared with another process. Which slots each side may touch is the
//!   protocol's business (a slot is written by the daemon only while no client holds it);
//!   this type hands out raw pointers and, for leased slots, byte slices.

use std::ffi::CStr;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::ptr::NonNull;

use rustix::fs::{MemfdFlags, SealFlags};
use rustix::io::Errno;
use rustix::mm::{MapFlags, ProtFlags};

use crate::ring::RingLayout;

/// Seals every ring carries.
const RING_SEALS: SealFlags = SealFlags::SHRINK
    .union(SealFlags::GROW)
    .union(SealFlags::SEAL);

/// Why a ring cannot be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MemfdError {
    /// A syscall on the memfd failed.
    #[error("{op} failed: {source}")]
    Io {
        /// The call that failed (`memfd_create`, `ftruncate`, `mmap`, ...).
        op: &'static str,
        /// The kernel's error.
        #[source]
        source: std::io::Error,
    },
    /// The memfd's size is not the layout's `ring_bytes`.
    #[error("ring memfd is {got} bytes, the layout needs {want}")]
    Size {
        /// Bytes the memfd has.
        got: u64,
        /// Bytes the layout needs.
        want: u64,
    },
    /// A received memfd lacks the seals against resizing.
    #[error(
        "ring memfd seals are {:#x}, must include {:#x} (shrink, grow, seal)",
        .got.bits(),
        .want.bits()
    )]
    Seals {
        /// The seals the memfd carries.
        got: SealFlags,
        /// The seals every ring must carry.
        want: SealFlags,
    },
    /// The layout is of zero bytes.
    #[error("a ring of zero bytes cannot be mapped")]
    Empty,
}

impl MemfdError {
    fn os(op: &'static str) -> impl FnOnce(Errno) -> MemfdError {
        move |errno| MemfdError::Io {
            op,
            source: errno.into(),
        }
    }
}

/// One ring's memory: a sealed memfd mapped `MAP_SHARED`.
#[derive(Debug)]
pub struct MemfdRing {
    // Drop order is field order: `map` is unmapped before `fd` closes.
    map: Mapping,
    fd: OwnedFd,
    layout: RingLayout,
}

#[derive(Debug)]
struct Mapping {
    ptr: NonNull<u8>,
    len: usize,
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // SAFETY: `ptr`/`len` are exactly what mmap returned; nothing borrows the mapping past
        // the owning ring's lifetime (slices handed out borrow the ring). A failed unmap
        // leaks the mapping; there is nothing better to do in a drop.
        let _ = unsafe { rustix::mm::munmap(self.ptr.as_ptr().cast(), self.len) };
    }
}

// SAFETY: the mapping is plain shared memory owned by this value; moving it between threads
// is fine, and all access through `&self` is via raw pointers or slices whose aliasing the
// protocol governs (see the module's Limitations).
unsafe impl Send for MemfdRing {}
// SAFETY: as above; `&MemfdRing` only exposes pointers and read-only metadata.
unsafe impl Sync for MemfdRing {}

impl MemfdRing {
    /// Creates, sizes, seals and maps a ring for `layout`. `name` shows in /proc/<pid>/fd.
    pub fn create(name: &CStr, layout: RingLayout) -> Result<MemfdRing, MemfdError> {
        if layout.ring_bytes == 0 {
            return Err(MemfdError::Empty);
        }
        let flags = MemfdFlags::CLOEXEC | MemfdFlags::ALLOW_SEALING;
        let fd = rustix::fs::memfd_create(name, flags).map_err(MemfdError::os("memfd_create"))?;
        let size = i64::try_from(layout.ring_bytes).map_err(|_| MemfdError::Size {
            got: 0,
            want: layout.ring_bytes as u64,
        })?;
        rustix::fs::ftruncate(&fd, size.unsigned_abs()).map_err(MemfdError::os("ftruncate"))?;
        rustix::fs::fcntl_add_seals(&fd, RING_SEALS)
            .map_err(MemfdError::os("fcntl(F_ADD_SEALS)"))?;
        let map = map(fd.as_fd(), layout.ring_bytes)?;
        Ok(MemfdRing { map, fd, layout })
    }

    /// Maps a ring received from the daemon, after checking that it is sealed against
    /// resizing and exactly as large as `layout` (which the caller computed from the spec).
    pub fn from_fd(fd: OwnedFd, layout: RingLayout) -> Result<MemfdRing, MemfdError> {
        if layout.ring_bytes == 0 {
            return Err(MemfdError::Empty);
        }
        let seals =
            rustix::fs::fcntl_get_seals(&fd).map_err(MemfdError::os("fcntl(F_GET_SEALS)"))?;
        if !seals.contains(RING_SEALS) {
            return Err(MemfdError::Seals {
                got: seals,
                want: RING_SEALS,
            });
        }
        let st = rustix::fs::fstat(&fd).map_err(MemfdError::os("fstat"))?;
        let got = u64::try_from(st.st_size).unwrap_or(0);
        if got != layout.ring_bytes as u64 {
            return Err(MemfdError::Size {
                got,
                want: layout.ring_bytes as u64,
            });
        }
        let map = map(fd.as_fd(), layout.ring_bytes)?;
        Ok(MemfdRing { map, fd, layout })
    }

    /// The layout the ring was created or checked for.
    pub fn layout(&self) -> &RingLayout {
        &self.layout
    }

    /// Start of slot `slot`'s host part (labels, indices, status). Valid for
    /// `layout().slot.host_slot_bytes` bytes while `self` lives.
    ///
    /// # Panics
    /// If `slot >= layout().slots`.
    pub fn host_ptr(&self, slot: usize) -> *mut u8 {
        let off = self.layout.host_offset(slot);
        // SAFETY: `host_offset` asserts `slot < slots`, and the host part's slots end within
        // `ring_bytes == map.len` (RingLayout), so the offset stays inside the mapping.
        unsafe { self.map.ptr.as_ptr().add(off) }
    }

    /// Start of slot `slot`'s images when they are host memory (in this memfd); `None` when
    /// the ring's images are device memory. Valid for `layout().slot.image_slot_bytes` bytes
    /// while `self` lives.
    ///
    /// # Panics
    /// If `slot >= layout().slots`.
    pub fn image_ptr(&self, slot: usize) -> Option<*mut u8> {
        let off = self.layout.image_offset(slot);
        if !self.layout.image_memory.is_host() {
            return None;
        }
        // SAFETY: `image_offset` asserts `slot < slots`; host images lie at the start of the
        // memfd, within `ring_bytes == map.len` (RingLayout).
        Some(unsafe { self.map.ptr.as_ptr().add(off) })
    }

    /// Start of the mapping.
    pub fn as_ptr(&self) -> *mut u8 {
        self.map.ptr.as_ptr()
    }

    /// The bytes of slot `slot`'s host part.
    ///
    /// # Safety
    /// No one may write the slot while the slice lives: on the client, hold the slot's lease
    /// (the daemon does not write a leased slot); on the daemon, only while no feed writes it.
    pub unsafe fn host_bytes(&self, slot: usize) -> &[u8] {
        // SAFETY: the pointer is valid for host_slot_bytes bytes (see `host_ptr`); the caller
        // guarantees there is no concurrent writer.
        unsafe { std::slice::from_raw_parts(self.host_ptr(slot), self.layout.slot.host_slot_bytes) }
    }

    /// The bytes of slot `slot`'s images, when they are host memory.
    ///
    /// # Safety
    /// As for [`MemfdRing::host_bytes`].
    pub unsafe fn image_bytes(&self, slot: usize) -> Option<&[u8]> {
        let ptr = self.image_ptr(slot)?;
        // SAFETY: the pointer is valid for image_slot_bytes bytes (see `image_ptr`); the
        // caller guarantees there is no concurrent writer.
        Some(unsafe { std::slice::from_raw_parts(ptr, self.layout.slot.image_slot_bytes) })
    }
}

impl AsFd for MemfdRing {
    fn as_fd(&self) -> BorrowedFd<'_> {
        self.fd.as_fd()
    }
}

fn map(fd: BorrowedFd<'_>, len: usize) -> Result<Mapping, MemfdError> {
    // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks the address, so
    // no existing memory is replaced.
    let ptr = unsafe {
        rustix::mm::mmap(
            std::ptr::null_mut(),
            len,
            ProtFlags::READ | ProtFlags::WRITE,
            MapFlags::SHARED,
            fd,
            0,
        )
    }
    .map_err(MemfdError::os("mmap"))?;
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(MemfdError::Empty)?;
    Ok(Mapping { ptr, len })
}

/// The page size, the granularity of memfd rings.
pub fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::spec::PipelineSpec;

    fn layout() -> RingLayout {
        RingLayout::new(&PipelineSpec::train(4, 32), 3, page_size())
    }

    #[test]
    fn ring_is_sealed_sized_and_shared() {
        let ring = MemfdRing::create(c"stoker-test", layout()).unwrap();
        let seals = rustix::fs::fcntl_get_seals(&ring).unwrap();
        assert!(seals.contains(RING_SEALS));
        // Resizing is refused by the seals.
        assert_eq!(rustix::fs::ftruncate(&ring, 4096), Err(Errno::PERM));
        // A second mapping through a duplicate fd sees the writes of the first.
        let other =
            MemfdRing::from_fd(ring.as_fd().try_clone_to_owned().unwrap(), layout()).unwrap();
        let s = layout().slot;
        // SAFETY: slot 2's parts are valid for their sizes; this test is their only user.
        unsafe {
            std::ptr::write_bytes(ring.image_ptr(2).unwrap(), 0xab, s.image_slot_bytes);
            std::ptr::write_bytes(ring.host_ptr(2), 0xcd, s.host_slot_bytes);
        }
        // SAFETY: nothing writes slot 2 any more.
        let (images, host) = unsafe { (other.image_bytes(2).unwrap(), other.host_bytes(2)) };
        assert!(images.iter().all(|&b| b == 0xab));
        assert!(host.iter().all(|&b| b == 0xcd));
        // SAFETY: as above, for slot 1 which nobody wrote.
        assert!(unsafe { other.image_bytes(1).unwrap() }
            .iter()
            .all(|&b| b == 0));
        // SAFETY: as above.
        assert!(unsafe { other.host_bytes(1) }.iter().all(|&b| b == 0));
    }

    #[test]
    fn from_fd_refuses_a_wrong_size_or_missing_seals() {
        let ring = MemfdRing::create(c"stoker-test", layout()).unwrap();
        let bigger = RingLayout::new(&PipelineSpec::train(64, 64), 3, page_size());
        let err =
            MemfdRing::from_fd(ring.as_fd().try_clone_to_owned().unwrap(), bigger).unwrap_err();
        assert!(matches!(err, MemfdError::Size { .. }), "{err}");

        // An unsealed file of the right size is refused.
        let f = tempfile::tempfile().unwrap();
        f.set_len(layout().ring_bytes as u64).unwrap();
        let err = MemfdRing::from_fd(OwnedFd::from(f), layout()).unwrap_err();
        assert!(
            matches!(err, MemfdError::Seals { .. } | MemfdError::Io { .. }),
            "{err}"
        );
    }
}
