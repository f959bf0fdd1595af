//! `getsockopt(SO_PEERGROUPS)`: the supplementary groups the kernel recorded for a Unix
//! socket's peer when it connected (rustix has no call for it, so this is the one `libc` use
//! of the socket room).
//!
//! # Design
//! - The groups are the socket's, as fixed at connect time, like SO_PEERCRED's uid and gid:
//!   reading them never consults the peer's pid, which a process that exited may have handed
//!   to another.
//!
//! # Limitations
//! - Linux 4.13 or later; an older kernel's `ENOPROTOOPT` is returned as an error.

use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};

/// The peer's supplementary groups, as recorded when it connected.
pub(super) fn peer_groups(fd: BorrowedFd<'_>) -> io::Result<Vec<u32>> {
    // NGROUPS_MAX is 65536; start small and grow to what the kernel says it needs.
    let mut groups: Vec<libc::gid_t> = vec![0; 64];
    loop {
        let capacity = groups.len() * std::mem::size_of::<libc::gid_t>();
        let mut len = libc::socklen_t::try_from(capacity)
            .map_err(|_| io::Error::from_raw_os_error(libc::ERANGE))?;
        // SAFETY: `groups` is a live buffer of `len` bytes for the kernel to fill, and `len`
        // a live socklen_t it writes the used (or, on ERANGE, needed) size to; `fd` is open.
        let r = unsafe {
            libc::getsockopt(
                fd.as_raw_fd(),
                libc::SOL_SOCKET,
                libc::SO_PEERGROUPS,
                groups.as_mut_ptr().cast(),
                &mut len,
            )
        };
        let used = usize::try_from(len).unwrap_or(usize::MAX) / std::mem::size_of::<libc::gid_t>();
        if r == 0 {
            groups.truncate(used.min(groups.len()));
            return Ok(groups);
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ERANGE) || used <= groups.len() {
            return Err(e);
        }
        groups.resize(used, 0);
    }
}
