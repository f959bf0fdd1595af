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
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::ptr::NonNull;

use crate::ring::RingLayout;

/// Seals every ring carries.
pub const RING_SEALS: i32 = libc::F_SEAL_SHRINK | libc::F_SEAL_GROW | libc::F_SEAL_SEAL;

/// Why a ring cannot be created or mapped.
#[derive(Debug, thiserror::Error)]
pub enum MemfdError {
    #[error("{op} failed: {source}")]
    Io {
        op: &'static str,
        #[source]
        source: std::io::Error,
    },
    #[error("ring memfd is {got} bytes, the layout needs {want}")]
    Size { got: u64, want: u64 },
    #[error("ring memfd seals are {got:#x}, must include {want:#x} (shrink, grow, seal)")]
    Seals { got: i32, want: i32 },
    #[error("a ring of zero bytes cannot be mapped")]
    Empty,
}

impl MemfdError {
    fn last(op: &'static str) -> MemfdError {
        MemfdError::Io {
            op,
            source: std::io::Error::last_os_error(),
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
        // the owning ring's lifetime (slices handed out borrow the ring).
        unsafe { libc::munmap(self.ptr.as_ptr().cast(), self.len) };
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
        // SAFETY: `name` is a valid NUL-terminated string for the duration of the call.
        let raw = unsafe {
            libc::memfd_create(name.as_ptr(), libc::MFD_CLOEXEC | libc::MFD_ALLOW_SEALING)
        };
        if raw < 0 {
            return Err(MemfdError::last("memfd_create"));
        }
        // SAFETY: `raw` was just returned by memfd_create and nothing else owns it.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let size = libc::off_t::try_from(layout.ring_bytes).map_err(|_| MemfdError::Size {
            got: 0,
            want: layout.ring_bytes as u64,
        })?;
        // SAFETY: plain syscall on an fd we own.
        if unsafe { libc::ftruncate(fd.as_raw_fd(), size) } != 0 {
            return Err(MemfdError::last("ftruncate"));
        }
        // SAFETY: plain fcntl on an fd we own.
        if unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_ADD_SEALS, RING_SEALS) } != 0 {
            return Err(MemfdError::last("fcntl(F_ADD_SEALS)"));
        }
        let map = map(fd.as_fd(), layout.ring_bytes)?;
        Ok(MemfdRing { map, fd, layout })
    }

    /// Maps a ring received from the daemon, after checking that it is sealed against
    /// resizing and exactly as large as `layout` (which the caller computed from the spec).
    pub fn from_fd(fd: OwnedFd, layout: RingLayout) -> Result<MemfdRing, MemfdError> {
        if layout.ring_bytes == 0 {
            return Err(MemfdError::Empty);
        }
        // SAFETY: plain fcntl on an fd we own.
        let seals = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_GET_SEALS) };
        if seals < 0 {
            return Err(MemfdError::last("fcntl(F_GET_SEALS)"));
        }
        if seals & RING_SEALS != RING_SEALS {
            return Err(MemfdError::Seals {
                got: seals,
                want: RING_SEALS,
            });
        }
        // SAFETY: libc::stat is plain old data; zeroes are a valid value for fstat to fill.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: `st` is valid for writes; `fd` is ours.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 {
            return Err(MemfdError::last("fstat"));
        }
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
    // SAFETY: a fresh shared mapping of a file we hold open; the kernel picks the address.
    let ptr = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ | libc::PROT_WRITE,
            libc::MAP_SHARED,
            fd.as_raw_fd(),
            0,
        )
    };
    if ptr == libc::MAP_FAILED {
        return Err(MemfdError::last("mmap"));
    }
    let ptr = NonNull::new(ptr.cast::<u8>()).ok_or(MemfdError::Empty)?;
    Ok(Mapping { ptr, len })
}

/// The page size, the granularity of memfd rings.
pub fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(libc::_SC_PAGESIZE) };
    usize::try_from(v).ok().filter(|&v| v > 0).unwrap_or(4096)
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
        // SAFETY: F_GET_SEALS on our fd.
        let seals = unsafe { libc::fcntl(ring.as_fd().as_raw_fd(), libc::F_GET_SEALS) };
        assert_eq!(seals & RING_SEALS, RING_SEALS);
        // Resizing is refused by the seals.
        // SAFETY: plain syscall on our fd; expected to fail.
        let rc = unsafe { libc::ftruncate(ring.as_fd().as_raw_fd(), 4096) };
        assert_eq!(rc, -1);
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
