//! The system's group database (`getgrnam_r` / `getgrgid_r`): a group named in the daemon's
//! config (`access.allowed_gids`, `server.socket_group`) becomes its gid, and a refusal on a
//! socket names the socket's group by name. rustix has no group database (it is NSS, libc's
//! own), so this is the socket room's second `libc` use.
//!
//! # Design
//! - One lookup per call, with a buffer grown on `ERANGE` up to [`MAX_BUFFER`] (a group with
//!   thousands of members needs more than the usual 16 KiB).
//!
//! # Limitations
//! - Whatever NSS serves (files, LDAP, sssd): a lookup may block while that service answers.

use std::ffi::{CStr, CString};

/// The largest buffer a lookup grows to (a group listing this many bytes of members).
const MAX_BUFFER: usize = 1 << 22;

/// The gid of the group `name`, or `None` when the system has no such group. A number is
/// taken as the gid it spells.
pub fn gid_of(name: &str) -> Option<u32> {
    if let Ok(gid) = name.parse::<u32>() {
        return Some(gid);
    }
    let cname = CString::new(name).ok()?;
    lookup(|grp, buf, found| {
        // SAFETY: every pointer refers to live memory of the stated size for the call's
        // duration; the result only points into `grp` and `buf`.
        unsafe {
            libc::getgrnam_r(
                cname.as_ptr(),
                grp,
                buf.as_mut_ptr().cast(),
                buf.len(),
                found,
            )
        }
    })
    .map(|(gid, _)| gid)
}

/// The name of the group `gid`, or `None` when the system has no such group.
pub fn name_of(gid: u32) -> Option<String> {
    lookup(|grp, buf, found| {
        // SAFETY: as in `gid_of`.
        unsafe { libc::getgrgid_r(gid, grp, buf.as_mut_ptr().cast(), buf.len(), found) }
    })
    .map(|(_, name)| name)
}

/// Runs one `getgr*_r` call, growing the buffer while it says `ERANGE`; the group's gid and
/// name when found.
fn lookup(
    mut call: impl FnMut(&mut libc::group, &mut [u8], &mut *mut libc::group) -> libc::c_int,
) -> Option<(u32, String)> {
    let mut buf = vec![0u8; 16 * 1024];
    loop {
        // SAFETY: a zeroed libc::group is a valid out-parameter for getgr*_r.
        let mut grp: libc::group = unsafe { std::mem::zeroed() };
        let mut found: *mut libc::group = std::ptr::null_mut();
        let rc = call(&mut grp, &mut buf, &mut found);
        if rc == libc::ERANGE && buf.len() < MAX_BUFFER {
            buf.resize(buf.len() * 2, 0);
            continue;
        }
        if rc != 0 || found.is_null() || grp.gr_name.is_null() {
            return None;
        }
        // SAFETY: on success gr_name points to a NUL-terminated string inside `buf`, alive
        // until this function returns; it is copied out here.
        let name = unsafe { CStr::from_ptr(grp.gr_name) };
        return Some((grp.gr_gid, name.to_string_lossy().into_owned()));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn root_is_group_0_both_ways_and_a_missing_group_is_none() {
        assert_eq!(gid_of("root"), Some(0));
        assert_eq!(name_of(0).as_deref(), Some("root"));
        assert_eq!(gid_of("4242"), Some(4242));
        assert_eq!(gid_of("no-such-group-of-stoker"), None);
        assert_eq!(gid_of("nul\0inside"), None);
    }
}
